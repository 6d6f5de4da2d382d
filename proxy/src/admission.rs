//! Admission control: what protects the shared backends from one tenant,
//! and the proxy from everyone at once.
//!
//! - a global limit on requests in flight (503 with `Retry-After`: the
//!   gateway as a whole is saturated, any client may retry);
//! - per tenant and kind of request (query or push): a token bucket of
//!   requests, a limit on requests in flight, and for pushes a bucket of
//!   body bytes (429 with `Retry-After`: this tenant is over its share).
//!
//! Everything is off unless configured. Byte allowances are charged as the
//! body streams through, so a push without `Content-Length` is counted too;
//! a request may overdraw the bucket once and the tenant's next push waits
//! until the debt is paid back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{RequestLimits, TenantLimitsConfig};

/// The kind of request a tenant's limits distinguish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Query,
    Push,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Query => "query",
            Kind::Push => "push",
        }
    }
}

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The global limit on requests in flight.
    Overloaded,
    /// The tenant's request rate; retry after this long.
    Rate(Duration),
    /// The tenant's requests in flight.
    Concurrency,
    /// The tenant's push bytes; retry after this long.
    Bytes(Duration),
}

impl Refusal {
    /// For metrics: bounded, never user input.
    pub fn limit(self) -> &'static str {
        match self {
            Refusal::Overloaded => "global_concurrency",
            Refusal::Rate(_) => "rate",
            Refusal::Concurrency => "concurrency",
            Refusal::Bytes(_) => "bytes",
        }
    }

    pub fn retry_after(self) -> Duration {
        match self {
            Refusal::Rate(wait) | Refusal::Bytes(wait) => wait,
            Refusal::Overloaded | Refusal::Concurrency => Duration::from_secs(1),
        }
    }
}

/// Held for as long as a request counts as in flight.
#[derive(Debug, Default)]
pub struct Admitted {
    permits: Vec<OwnedSemaphorePermit>,
    /// Charged for the body bytes as they pass, if a byte limit applies.
    pub bytes: Option<ByteMeter>,
}

impl Admitted {
    /// Whether anything must be held until the response is sent.
    pub fn holds_anything(&self) -> bool {
        !self.permits.is_empty() || self.bytes.is_some()
    }
}

/// Charges body bytes to a tenant's push allowance.
#[derive(Clone, Debug)]
pub struct ByteMeter(Arc<Mutex<Bucket>>);

impl ByteMeter {
    pub fn charge(&self, bytes: usize) {
        lock(&self.0).charge(bytes as f64, Instant::now());
    }
}

#[derive(Debug)]
pub struct Admission {
    global: Option<Arc<Semaphore>>,
    config: TenantLimitsConfig,
    /// No tenant limit is configured: nothing to look up per request.
    unlimited: bool,
    tenants: Mutex<HashMap<Kind, HashMap<String, Arc<TenantState>>>>,
}

#[derive(Debug)]
struct TenantState {
    requests: Option<Mutex<Bucket>>,
    in_flight: Option<Arc<Semaphore>>,
    bytes: Option<Arc<Mutex<Bucket>>>,
}

impl Admission {
    pub fn new(max_concurrent_requests: usize, config: TenantLimitsConfig) -> Self {
        let no_limits = |l: &RequestLimits| *l == RequestLimits::default();
        let unlimited = no_limits(&config.default.query)
            && no_limits(&config.default.push)
            && config.overrides.values().all(|o| {
                o.query.as_ref().is_none_or(no_limits) && o.push.as_ref().is_none_or(no_limits)
            });
        Self {
            global: (max_concurrent_requests > 0)
                .then(|| Arc::new(Semaphore::new(max_concurrent_requests))),
            config,
            unlimited,
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// The global limit, before anything else is spent on the request.
    pub fn enter(&self) -> Result<Option<OwnedSemaphorePermit>, Refusal> {
        match &self.global {
            None => Ok(None),
            Some(global) => global
                .clone()
                .try_acquire_owned()
                .map(Some)
                .map_err(|_| Refusal::Overloaded),
        }
    }

    /// The tenant's limits for this kind of request.
    pub fn admit(&self, tenant: &str, kind: Kind) -> Result<Admitted, Refusal> {
        if self.unlimited {
            return Ok(Admitted::default());
        }
        let state = self.state(tenant, kind);
        let now = Instant::now();
        if let Some(bytes) = &state.bytes {
            lock(bytes).check(now).map_err(Refusal::Bytes)?;
        }
        let permit = match &state.in_flight {
            Some(in_flight) => Some(
                in_flight
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| Refusal::Concurrency)?,
            ),
            None => None,
        };
        // Last, so a request refused for another reason costs no token.
        if let Some(requests) = &state.requests {
            lock(requests).take(1.0, now).map_err(Refusal::Rate)?;
        }
        Ok(Admitted {
            permits: permit.into_iter().collect(),
            bytes: state.bytes.clone().map(ByteMeter),
        })
    }

    fn state(&self, tenant: &str, kind: Kind) -> Arc<TenantState> {
        let mut tenants = lock(&self.tenants);
        let tenants = tenants.entry(kind).or_default();
        if let Some(state) = tenants.get(tenant) {
            return state.clone();
        }
        let limits = self.config.for_tenant(tenant);
        let limits = match kind {
            Kind::Query => limits.query,
            Kind::Push => limits.push,
        };
        let state = Arc::new(TenantState::new(limits));
        tenants.insert(tenant.to_owned(), state.clone());
        state
    }
}

impl TenantState {
    fn new(limits: RequestLimits) -> Self {
        let rate = limits.requests_per_second;
        let burst = match limits.burst {
            0 => rate.max(1.0),
            burst => f64::from(burst),
        };
        let bytes = limits.bytes_per_second as f64;
        Self {
            requests: (rate > 0.0).then(|| Mutex::new(Bucket::new(rate, burst))),
            in_flight: (limits.concurrency > 0)
                .then(|| Arc::new(Semaphore::new(limits.concurrency as usize))),
            // One second's worth may be sent at once.
            bytes: (bytes > 0.0).then(|| Arc::new(Mutex::new(Bucket::new(bytes, bytes)))),
        }
    }
}

/// A token bucket whose balance may go negative (a debt) when charged after
/// the fact.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: f64, capacity: f64) -> Self {
        Self {
            rate,
            capacity,
            tokens: capacity,
            at: Instant::now(),
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.at = now;
    }

    /// How long until `n` tokens are there.
    fn wait_for(&self, n: f64) -> Duration {
        Duration::from_secs_f64(((n - self.tokens) / self.rate).max(0.0))
    }

    fn take(&mut self, n: f64, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= n {
            self.tokens -= n;
            Ok(())
        } else {
            Err(self.wait_for(n))
        }
    }

    /// Admits while the balance is positive.
    fn check(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens > 0.0 {
            Ok(())
        } else {
            Err(self.wait_for(f64::MIN_POSITIVE))
        }
    }

    fn charge(&mut self, n: f64, now: Instant) {
        self.refill(now);
        self.tokens -= n;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{TenantLimits, TenantLimitsOverride};

    fn admission(query: RequestLimits, push: RequestLimits) -> Admission {
        let mut config = TenantLimitsConfig {
            default: TenantLimits { query, push },
            ..Default::default()
        };
        config.overrides.insert(
            "big".into(),
            TenantLimitsOverride {
                query: Some(RequestLimits::default()),
                push: None,
            },
        );
        Admission::new(0, config)
    }

    #[test]
    fn the_request_rate_is_per_tenant_and_kind() {
        let limits = RequestLimits {
            requests_per_second: 1.0,
            burst: 3,
            ..Default::default()
        };
        let a = admission(limits, RequestLimits::default());
        for _ in 0..3 {
            assert!(a.admit("team-a", Kind::Query).is_ok());
        }
        let Err(Refusal::Rate(wait)) = a.admit("team-a", Kind::Query) else {
            panic!("the fourth query within a second is over the burst");
        };
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
        assert!(a.admit("team-b", Kind::Query).is_ok(), "another tenant");
        assert!(a.admit("team-a", Kind::Push).is_ok(), "another kind");
        for _ in 0..10 {
            assert!(a.admit("big", Kind::Query).is_ok(), "overridden: unlimited");
        }
    }

    #[test]
    fn concurrency_counts_requests_until_they_finish() {
        let limits = RequestLimits {
            concurrency: 2,
            ..Default::default()
        };
        let a = admission(limits, RequestLimits::default());
        let first = a.admit("team-a", Kind::Query).unwrap();
        let _second = a.admit("team-a", Kind::Query).unwrap();
        assert_eq!(
            a.admit("team-a", Kind::Query).unwrap_err(),
            Refusal::Concurrency
        );
        drop(first);
        assert!(a.admit("team-a", Kind::Query).is_ok());
    }

    #[test]
    fn push_bytes_may_overdraw_once_then_wait_for_the_debt() {
        let push = RequestLimits {
            bytes_per_second: 1000,
            ..Default::default()
        };
        let a = admission(RequestLimits::default(), push);
        let admitted = a.admit("team-a", Kind::Push).unwrap();
        admitted.bytes.as_ref().unwrap().charge(3000);
        let Err(Refusal::Bytes(wait)) = a.admit("team-a", Kind::Push) else {
            panic!("in debt: refused");
        };
        // 2,000 bytes of debt at 1,000 per second.
        assert!(wait > Duration::from_millis(1900) && wait <= Duration::from_secs(2));
        assert!(a.admit("team-b", Kind::Push).is_ok());
    }

    #[test]
    fn the_global_limit_counts_every_request() {
        let a = Admission::new(1, TenantLimitsConfig::default());
        let held = a.enter().unwrap();
        assert_eq!(a.enter().unwrap_err(), Refusal::Overloaded);
        drop(held);
        assert!(a.enter().is_ok());
    }
}
