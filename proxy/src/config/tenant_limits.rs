//! What one tenant may do on the shared backends: the config's default and
//! overrides, merged with the tenants file's, and a replica's share of them.

use serde::Deserialize;

/// What one tenant may do on the shared backends, per kind of request.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimitsConfig {
    /// Every tenant's limits, unless overridden.
    #[serde(default)]
    pub default: TenantLimits,
    /// By tenant id; a kind left out keeps the default's. These win over
    /// limits the tenants file carries (from Namespace annotations).
    #[serde(default)]
    pub overrides: std::collections::BTreeMap<String, TenantLimitsOverride>,
    /// Whether each replica enforces the limits whole, or its share of them.
    #[serde(default)]
    pub scope: LimitScope,
}

impl TenantLimitsConfig {
    /// A tenant's limits, in order of precedence: the config's override,
    /// then `from_file` (the tenants file's, set from Namespace
    /// annotations), then the config's default; per kind of request.
    pub fn for_tenant(
        &self,
        tenant: &str,
        from_file: Option<&TenantLimitsOverride>,
    ) -> TenantLimits {
        let mut limits = self.default;
        for o in from_file.into_iter().chain(self.overrides.get(tenant)) {
            limits.query = o.query.unwrap_or(limits.query);
            limits.push = o.push.unwrap_or(limits.push);
        }
        limits
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        self.default.validate("tenant_limits.default")?;
        for (tenant, o) in &self.overrides {
            o.validate(&format!("tenant_limits.overrides.{tenant}"))?;
        }
        Ok(())
    }
}

/// Where a tenant's limits hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitScope {
    /// Each replica enforces every limit whole: N replicas admit N times it.
    #[default]
    Replica,
    /// Each replica enforces every rate and concurrency limit divided by the
    /// number of ready replicas, as the tenants file's `replicas` says.
    Global,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimits {
    /// Queries, label and series calls, rules, tails.
    #[serde(default)]
    pub query: RequestLimits,
    /// Loki pushes and remote write.
    #[serde(default)]
    pub push: RequestLimits,
}

impl TenantLimits {
    fn validate(&self, at: &str) -> Result<(), String> {
        self.query.validate(&format!("{at}.query"), false)?;
        self.push.validate(&format!("{at}.push"), true)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimitsOverride {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query: Option<RequestLimits>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push: Option<RequestLimits>,
}

impl TenantLimitsOverride {
    /// The strictest of two: per kind and field, the smallest limit that
    /// is set (0 means unlimited, so it yields to any other value).
    pub fn strictest(self, other: Self) -> Self {
        let kind = |a: Option<RequestLimits>, b: Option<RequestLimits>| match (a, b) {
            (Some(a), Some(b)) => Some(a.strictest(b)),
            (a, b) => a.or(b),
        };
        Self {
            query: kind(self.query, other.query),
            push: kind(self.push, other.push),
        }
    }

    /// The checks the config's own limits get; `at` names the place.
    pub fn validate(&self, at: &str) -> Result<(), String> {
        if let Some(query) = &self.query {
            query.validate(&format!("{at}.query"), false)?;
        }
        if let Some(push) = &self.push {
            push.validate(&format!("{at}.push"), true)?;
        }
        Ok(())
    }
}

/// Zero means unlimited, for each field on its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RequestLimits {
    /// Sustained requests per second (a token bucket).
    #[serde(default)]
    pub requests_per_second: f64,
    /// Requests allowed at once above the rate; default: one second's worth.
    #[serde(default)]
    pub burst: u32,
    /// Requests in flight at once.
    #[serde(default)]
    pub concurrency: u32,
    /// Request body bytes per second (push only); a request may overdraw
    /// the allowance once, and the next waits until it is paid back.
    #[serde(default)]
    pub bytes_per_second: u64,
}

impl RequestLimits {
    fn strictest(self, other: Self) -> Self {
        fn min_set<T: PartialOrd + Default + Copy>(a: T, b: T) -> T {
            let unset = T::default();
            match (a == unset, b == unset) {
                (true, _) => b,
                (_, true) => a,
                _ if b < a => b,
                _ => a,
            }
        }
        Self {
            requests_per_second: min_set(self.requests_per_second, other.requests_per_second),
            burst: min_set(self.burst, other.burst),
            concurrency: min_set(self.concurrency, other.concurrency),
            bytes_per_second: min_set(self.bytes_per_second, other.bytes_per_second),
        }
    }

    /// `bytes`: whether a byte rate applies (pushes only).
    fn validate(&self, at: &str, bytes: bool) -> Result<(), String> {
        if !(self.requests_per_second.is_finite() && self.requests_per_second >= 0.0) {
            return Err(format!("{at}.requests_per_second must be 0 or more"));
        }
        if !bytes && self.bytes_per_second > 0 {
            return Err(format!("{at}.bytes_per_second applies to push only"));
        }
        Ok(())
    }

    /// This replica's share of a limit that holds across `replicas`: rates
    /// divided; a concurrency or burst rounded up, so a limit never
    /// becomes 0 (which means unlimited) on a replica.
    pub fn share(self, replicas: u32) -> Self {
        let n = replicas.max(1);
        let part = |v: u32| if v == 0 { 0 } else { v.div_ceil(n) };
        Self {
            requests_per_second: self.requests_per_second / f64::from(n),
            burst: part(self.burst),
            concurrency: part(self.concurrency),
            bytes_per_second: self.bytes_per_second.div_ceil(u64::from(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(requests_per_second: f64, burst: u32, concurrency: u32, bytes: u64) -> RequestLimits {
        RequestLimits {
            requests_per_second,
            burst,
            concurrency,
            bytes_per_second: bytes,
        }
    }

    #[test]
    fn the_strictest_takes_the_smallest_set_value_per_field_and_zero_yields() {
        let a = limits(5.0, 0, 3, 100);
        let b = limits(0.0, 8, 4, 50);
        let expected = limits(5.0, 8, 3, 50);
        assert_eq!(a.strictest(b), expected);
        assert_eq!(b.strictest(a), expected, "in either order");
        assert_eq!(a.strictest(a), a);
        let unlimited = RequestLimits::default();
        assert_eq!(a.strictest(unlimited), a, "0 sets nothing");
        assert_eq!(unlimited.strictest(a), a);
    }

    #[test]
    fn the_strictest_override_keeps_a_kind_only_one_side_sets() {
        let query = limits(5.0, 0, 0, 0);
        let push = limits(0.0, 0, 2, 10);
        let only_query = TenantLimitsOverride {
            query: Some(query),
            push: None,
        };
        let both = TenantLimitsOverride {
            query: Some(limits(1.0, 0, 0, 0)),
            push: Some(push),
        };
        let merged = only_query.strictest(both);
        assert_eq!(merged.query, Some(limits(1.0, 0, 0, 0)));
        assert_eq!(merged.push, Some(push), "set on one side only");
        assert_eq!(both.strictest(only_query), merged);
        let none = TenantLimitsOverride::default();
        assert_eq!(none.strictest(none), none);
        assert_eq!(none.strictest(only_query), only_query);
    }

    #[test]
    fn a_share_divides_rates_and_rounds_counts_up_without_reaching_zero() {
        let whole = limits(30.0, 10, 1, 1_000);
        assert_eq!(whole.share(4), limits(7.5, 3, 1, 250));
        assert_eq!(whole.share(3), limits(10.0, 4, 1, 334));
        assert_eq!(whole.share(0), whole, "an unknown count counts as one");
        assert_eq!(
            RequestLimits::default().share(3),
            RequestLimits::default(),
            "unlimited stays unlimited"
        );
    }
}
