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
//!
//! A tenant's limits come from the config and the tenants file (see
//! `TenantLimitsConfig::for_tenant`), divided by the file's `replicas` in
//! `global` scope. When a new tenants file is loaded, the state of each
//! tenant whose limits changed is rebuilt; requests in flight keep the
//! permits of the old state, and unchanged tenants keep their buckets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{LimitScope, RequestLimits, TenantLimitsConfig, TenantLimitsOverride};
use crate::ops::metrics::{Metrics, TenantLimitLabels};
use crate::tenants::TenantStore;

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
    /// The tenants-file generation the states are sized for (`u64::MAX`:
    /// none yet).
    generation: AtomicU64,
    /// No limit in the config nor the file: nothing to look up per request.
    unlimited: AtomicBool,
    tenants: Mutex<HashMap<Kind, HashMap<String, Arc<TenantState>>>>,
    /// Where the limits in force are shown, if anywhere.
    metrics: Option<Arc<Metrics>>,
}

#[derive(Debug)]
struct TenantState {
    /// What it was sized for, to tell on reload whether it must be rebuilt.
    limits: RequestLimits,
    requests: Option<Mutex<Bucket>>,
    in_flight: Option<Arc<Semaphore>>,
    bytes: Option<Arc<Mutex<Bucket>>>,
}

fn no_limits(l: &RequestLimits) -> bool {
    *l == RequestLimits::default()
}

fn override_is_empty(o: &TenantLimitsOverride) -> bool {
    o.query.as_ref().is_none_or(no_limits) && o.push.as_ref().is_none_or(no_limits)
}

impl Admission {
    pub fn new(max_concurrent_requests: usize, config: TenantLimitsConfig) -> Self {
        Self {
            global: (max_concurrent_requests > 0)
                .then(|| Arc::new(Semaphore::new(max_concurrent_requests))),
            config,
            generation: AtomicU64::new(u64::MAX),
            unlimited: AtomicBool::new(false),
            tenants: Mutex::new(HashMap::new()),
            metrics: None,
        }
    }

    /// Shows the limits in force and the replica divisor in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
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

    /// The tenant's limits for this kind of request, as `store` (the
    /// tenants file in force) and the config set them.
    pub fn admit(
        &self,
        store: &TenantStore,
        tenant: &str,
        kind: Kind,
    ) -> Result<Admitted, Refusal> {
        if self.generation.load(Ordering::Acquire) != store.generation {
            self.refresh(store);
        }
        if self.unlimited.load(Ordering::Acquire) {
            return Ok(Admitted::default());
        }
        let state = self.state(store, tenant, kind);
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

    /// What `tenant` gets on this replica for `kind` under `store`.
    pub fn limits_in_force(&self, store: &TenantStore, tenant: &str, kind: Kind) -> RequestLimits {
        let from_file = store.tenant(tenant).and_then(|t| t.limits.as_ref());
        let limits = self.config.for_tenant(tenant, from_file);
        let limits = match kind {
            Kind::Query => limits.query,
            Kind::Push => limits.push,
        };
        match self.config.scope {
            LimitScope::Replica => limits,
            LimitScope::Global => limits.share(store.replicas),
        }
    }

    /// A new tenants file: rebuilds the state of every tenant whose limits
    /// changed, keeps the others'.
    fn refresh(&self, store: &TenantStore) {
        let mut states = lock(&self.tenants);
        if self.generation.load(Ordering::Acquire) == store.generation {
            return; // another request got here first
        }
        for (kind, states) in states.iter_mut() {
            states
                .retain(|tenant, state| state.limits == self.limits_in_force(store, tenant, *kind));
        }
        let config = &self.config;
        let unlimited = no_limits(&config.default.query)
            && no_limits(&config.default.push)
            && config.overrides.values().all(override_is_empty)
            && store
                .tenants()
                .iter()
                .all(|t| t.limits.as_ref().is_none_or(override_is_empty));
        self.unlimited.store(unlimited, Ordering::Release);
        if let Some(metrics) = &self.metrics {
            let divisor = match self.config.scope {
                LimitScope::Replica => 1,
                LimitScope::Global => store.replicas,
            };
            metrics.limit_replicas.set(i64::from(divisor));
        }
        self.generation.store(store.generation, Ordering::Release);
    }

    fn state(&self, store: &TenantStore, tenant: &str, kind: Kind) -> Arc<TenantState> {
        let mut states = lock(&self.tenants);
        let states = states.entry(kind).or_default();
        if let Some(state) = states.get(tenant) {
            return state.clone();
        }
        let limits = self.limits_in_force(store, tenant, kind);
        if let Some(metrics) = &self.metrics {
            show(metrics, tenant, kind, &limits);
        }
        let state = Arc::new(TenantState::new(limits));
        states.insert(tenant.to_owned(), state.clone());
        state
    }
}

fn show(metrics: &Metrics, tenant: &str, kind: Kind, limits: &RequestLimits) {
    let values = [
        ("requests_per_second", limits.requests_per_second),
        ("burst", f64::from(limits.burst)),
        ("concurrency", f64::from(limits.concurrency)),
        ("bytes_per_second", limits.bytes_per_second as f64),
    ];
    for (limit, value) in values {
        let labels = TenantLimitLabels {
            tenant: tenant.to_owned(),
            kind: kind.as_str(),
            limit,
        };
        metrics.tenant_limit.get_or_create(&labels).set(value);
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
            limits,
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

    /// How long until `n` tokens are there; at most `Duration::MAX`, which
    /// a rate of, say, `1e-300` per second (valid in a tenants file) would
    /// pass, and `from_secs_f64` would panic on.
    fn wait_for(&self, n: f64) -> Duration {
        Duration::try_from_secs_f64(((n - self.tokens) / self.rate).max(0.0))
            .unwrap_or(Duration::MAX)
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
    use crate::tenants::{Tenant, TenantId};

    fn empty() -> TenantStore {
        TenantStore::new(0, Vec::new(), Vec::new())
    }

    /// A tenants file of generation `generation` giving tenants limits.
    fn store(generation: u64, replicas: u32, limits: &[(&str, RequestLimits)]) -> TenantStore {
        let tenants = limits
            .iter()
            .map(|(id, query)| {
                let mut tenant = Tenant::new(TenantId::parse(id).unwrap(), vec![id.to_string()]);
                tenant.limits = Some(TenantLimitsOverride {
                    query: Some(*query),
                    push: None,
                });
                Arc::new(tenant)
            })
            .collect();
        let mut store = TenantStore::new(generation, tenants, Vec::new());
        store.replicas = replicas;
        store
    }

    fn rate(requests_per_second: f64, burst: u32) -> RequestLimits {
        RequestLimits {
            requests_per_second,
            burst,
            ..Default::default()
        }
    }

    /// How many of `n` queries at once are admitted.
    fn admitted(a: &Admission, store: &TenantStore, tenant: &str, n: usize) -> usize {
        (0..n)
            .filter(|_| a.admit(store, tenant, Kind::Query).is_ok())
            .count()
    }

    #[test]
    fn the_config_override_wins_over_the_file_which_wins_over_the_default() {
        let mut config = TenantLimitsConfig {
            default: TenantLimits {
                query: rate(1.0, 2),
                push: RequestLimits::default(),
            },
            ..Default::default()
        };
        config.overrides.insert(
            "pinned".into(),
            TenantLimitsOverride {
                query: Some(rate(1.0, 7)),
                push: None,
            },
        );
        let a = Admission::new(0, config);
        let file = store(
            1,
            1,
            &[("annotated", rate(1.0, 4)), ("pinned", rate(1.0, 1))],
        );
        assert_eq!(admitted(&a, &file, "plain", 10), 2, "the default");
        assert_eq!(admitted(&a, &file, "annotated", 10), 4, "the file");
        assert_eq!(
            admitted(&a, &file, "pinned", 10),
            7,
            "the config's override"
        );
    }

    #[test]
    fn global_scope_gives_each_replica_its_share() {
        let config = TenantLimitsConfig {
            scope: LimitScope::Global,
            ..Default::default()
        };
        let a = Admission::new(0, config);
        let concurrency = RequestLimits {
            requests_per_second: 30.0,
            burst: 30,
            concurrency: 5,
            ..Default::default()
        };
        for (replicas, burst, concurrency_share) in [(1, 30, 5), (2, 15, 3), (3, 10, 2), (0, 30, 5)]
        {
            let file = store(u64::from(replicas) + 10, replicas, &[("t", concurrency)]);
            let share = a.limits_in_force(&file, "t", Kind::Query);
            assert_eq!(share.burst, burst, "{replicas} replicas");
            assert_eq!(share.concurrency, concurrency_share, "{replicas} replicas");
            assert_eq!(share.requests_per_second, 30.0 / f64::from(replicas.max(1)));
        }
        let file = store(1, 3, &[("t", rate(30.0, 30))]);
        assert_eq!(admitted(&a, &file, "t", 100), 10);
    }

    #[test]
    fn a_reload_rebuilds_only_the_tenants_whose_limits_changed() {
        let a = Admission::new(0, TenantLimitsConfig::default());
        let limits = RequestLimits {
            concurrency: 1,
            ..rate(0.001, 3)
        };
        let first = store(1, 1, &[("kept", limits), ("changed", limits)]);
        let held = a.admit(&first, "kept", Kind::Query).unwrap();
        assert_eq!(admitted(&a, &first, "kept", 5), 0, "busy");
        let changed_held = a.admit(&first, "changed", Kind::Query).unwrap();
        assert_eq!(admitted(&a, &first, "changed", 5), 0, "busy");

        let bigger = RequestLimits {
            concurrency: 2,
            ..rate(0.001, 3)
        };
        let second = store(2, 1, &[("kept", limits), ("changed", bigger)]);
        // Unchanged: the same bucket (two tokens left) and the same
        // semaphore (still held).
        assert_eq!(admitted(&a, &second, "kept", 5), 0, "still busy");
        drop(held);
        assert_eq!(
            admitted(&a, &second, "kept", 5),
            2,
            "3 tokens, 1 spent before"
        );
        // Changed: a fresh state, sized anew; the request in flight keeps
        // its permit of the old one and is not disturbed.
        let fresh: Vec<_> = (0..5)
            .filter_map(|_| a.admit(&second, "changed", Kind::Query).ok())
            .collect();
        assert_eq!(fresh.len(), 2);
        drop(changed_held);
    }

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
            assert!(a.admit(&empty(), "team-a", Kind::Query).is_ok());
        }
        let Err(Refusal::Rate(wait)) = a.admit(&empty(), "team-a", Kind::Query) else {
            panic!("the fourth query within a second is over the burst");
        };
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
        assert!(
            a.admit(&empty(), "team-b", Kind::Query).is_ok(),
            "another tenant"
        );
        assert!(
            a.admit(&empty(), "team-a", Kind::Push).is_ok(),
            "another kind"
        );
        for _ in 0..10 {
            assert!(
                a.admit(&empty(), "big", Kind::Query).is_ok(),
                "overridden: unlimited"
            );
        }
    }

    #[test]
    fn a_vanishingly_small_rate_refuses_with_the_longest_wait_instead_of_panicking() {
        let a = admission(rate(1e-300, 1), RequestLimits::default());
        assert!(a.admit(&empty(), "team-a", Kind::Query).is_ok());
        let Err(Refusal::Rate(wait)) = a.admit(&empty(), "team-a", Kind::Query) else {
            panic!("the burst of one is spent");
        };
        assert_eq!(wait, Duration::MAX);
    }

    #[test]
    fn concurrency_counts_requests_until_they_finish() {
        let limits = RequestLimits {
            concurrency: 2,
            ..Default::default()
        };
        let a = admission(limits, RequestLimits::default());
        let first = a.admit(&empty(), "team-a", Kind::Query).unwrap();
        let _second = a.admit(&empty(), "team-a", Kind::Query).unwrap();
        assert_eq!(
            a.admit(&empty(), "team-a", Kind::Query).unwrap_err(),
            Refusal::Concurrency
        );
        drop(first);
        assert!(a.admit(&empty(), "team-a", Kind::Query).is_ok());
    }

    #[test]
    fn push_bytes_may_overdraw_once_then_wait_for_the_debt() {
        let push = RequestLimits {
            bytes_per_second: 1000,
            ..Default::default()
        };
        let a = admission(RequestLimits::default(), push);
        let admitted = a.admit(&empty(), "team-a", Kind::Push).unwrap();
        admitted.bytes.as_ref().unwrap().charge(3000);
        let Err(Refusal::Bytes(wait)) = a.admit(&empty(), "team-a", Kind::Push) else {
            panic!("in debt: refused");
        };
        // 2,000 bytes of debt at 1,000 per second.
        assert!(wait > Duration::from_millis(1900) && wait <= Duration::from_secs(2));
        assert!(a.admit(&empty(), "team-b", Kind::Push).is_ok());
    }

    /// With limits on both kinds and nothing else, the shortcut for a
    /// config without limits is not taken: each kind has its own.
    #[test]
    fn limits_on_both_kinds_are_both_enforced() {
        let config = TenantLimitsConfig {
            default: TenantLimits {
                query: rate(1.0, 1),
                push: rate(1.0, 1),
            },
            ..Default::default()
        };
        let a = Admission::new(0, config);
        for kind in [Kind::Query, Kind::Push] {
            assert!(a.admit(&empty(), "team-a", kind).is_ok(), "{kind:?}");
            assert!(
                matches!(a.admit(&empty(), "team-a", kind), Err(Refusal::Rate(_))),
                "{kind:?}"
            );
        }
    }

    /// Tokens come back at the rate, up to the capacity; a balance of
    /// exactly nothing admits no push.
    #[test]
    fn a_bucket_refills_at_its_rate_and_admits_only_a_positive_balance() {
        let mut bucket = Bucket::new(2.0, 4.0);
        let start = bucket.at;
        assert_eq!(bucket.take(4.0, start), Ok(()));
        assert_eq!(bucket.take(1.0, start), Err(Duration::from_millis(500)));
        let later = start + Duration::from_secs(1);
        assert_eq!(bucket.take(2.0, later), Ok(()), "two back after a second");
        assert!(bucket.take(1.0, later).is_err());
        bucket.refill(later + Duration::from_secs(60));
        assert_eq!(bucket.tokens, 4.0, "never past the capacity");

        let mut bytes = Bucket::new(1000.0, 1000.0);
        let start = bytes.at;
        bytes.charge(1000.0, start);
        assert!(bytes.check(start).is_err(), "nothing left");
        assert_eq!(bytes.check(start + Duration::from_millis(1)), Ok(()));
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
