//! A route: the methods and path pattern it serves, the signal and
//! operation it stands for and the scope it needs; and the helpers the
//! backends' tables are written with.

use http::Method;

use crate::enforce::alertmanager::AnswerFilter;
use crate::enforce::prometheus::{ResponseFilter, Selectors};
use crate::tenants::Scope;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Logs,
    Metrics,
    /// Alertmanager: alerts and silences on metrics.
    Alerts,
}

/// What label mode does with an Alertmanager API call
/// (`enforce::alertmanager`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlertmanagerCall {
    /// Forwarded, the answer filtered (status, alerts, groups, silences).
    Read(AnswerFilter),
    /// Alerts and groups: the tenant's `filter` added, the answer filtered.
    ReadFiltered(AnswerFilter),
    /// Receivers: answered from Alertmanager's status, only those the
    /// tenant's routes name (`enforce::alertmanager::routing`).
    Receivers,
    /// One silence: shown only if it is the tenant's.
    Silence,
    /// A silence created or updated: checked and written again.
    PostSilence,
    /// A silence expired: only the tenant's.
    DeleteSilence,
}

/// What the proxy does with a matched request, beyond authentication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Body streamed through untouched, tenant header set.
    Push,
    /// Query parameters forwarded as sent, tenant header set (under a
    /// Loki label policy, read and moved into the URL:
    /// `proxy/label_policy.rs`).
    Read,
    /// WebSocket upgrade passed through, tenant header set.
    Tail,
    /// Label mode: the request is rebuilt with its selectors enforced.
    Enforce(Selectors),
    /// Label mode: answered by the proxy with an empty success.
    EmptyMetadata,
    /// Label mode: forwarded, then the response filtered to the tenant.
    Filter(ResponseFilter),
    /// Label mode: remote-write body rewritten so every series carries the
    /// tenant label.
    RemoteWrite,
    /// OTLP/HTTP push streamed through untouched, tenant header set; its
    /// errors are OTLP `Status` messages.
    OtlpPush,
    /// Label mode: OTLP metrics decoded and every data point and resource
    /// given the tenant label.
    OtlpMetrics,
    /// Label mode: an Alertmanager API call scoped to the tenant.
    Alertmanager(AlertmanagerCall),
    /// Label mode: a rule group posted to Loki's ruler, every rule given
    /// the tenant label (what it records or raises reaches the metrics
    /// backend and the Alertmanager, which scope by that label).
    RuleGroup,
    /// Header mode: a rule group posted to Mimir's or Cortex's ruler,
    /// forwarded as written again once it is known to query no other
    /// tenant (`source_tenants`).
    FederatedRuleGroup,
}

impl Operation {
    /// Carries data in: an unreachable upstream must make the client retry.
    pub const fn is_push(self) -> bool {
        matches!(
            self,
            Operation::Push | Operation::RemoteWrite | Operation::OtlpPush | Operation::OtlpMetrics
        )
    }

    /// Speaks OTLP/HTTP: errors are answered as OTLP `Status` messages.
    pub const fn is_otlp(self) -> bool {
        matches!(self, Operation::OtlpPush | Operation::OtlpMetrics)
    }
}

#[derive(Clone, Debug)]
pub struct Route {
    pub methods: &'static [Method],
    /// Literal segments, or `{}` for exactly one arbitrary segment.
    pub pattern: &'static str,
    pub signal: Signal,
    pub operation: Operation,
    pub scope: Scope,
}

impl Route {
    /// The surface name used in metrics and logs: bounded, never a raw path.
    /// OTLP has surfaces of its own: other clients (Collector, SDKs, Alloy),
    /// another error format, and a rewrite with costs of its own.
    pub fn surface(&self) -> &'static str {
        match (self.signal, self.scope) {
            (Signal::Logs, Scope::RulesRead | Scope::RulesWrite) => return "logs_rules",
            (Signal::Metrics, Scope::RulesRead | Scope::RulesWrite) => return "metrics_rules",
            (_, Scope::AlertsRead | Scope::AlertsWrite) => return "alerts",
            (_, Scope::LogsDelete) => return "logs_delete",
            _ => {}
        }
        match (self.signal, self.operation) {
            (Signal::Logs, Operation::OtlpPush) => "logs_otlp",
            (Signal::Metrics, Operation::OtlpPush | Operation::OtlpMetrics) => "metrics_otlp",
            (Signal::Logs, Operation::Push) => "logs_push",
            (Signal::Logs, Operation::Tail) => "logs_tail",
            (Signal::Logs, _) => "logs_query",
            (Signal::Metrics, Operation::Push | Operation::RemoteWrite) => "metrics_push",
            (Signal::Metrics, _) => "metrics_query",
            (Signal::Alerts, _) => "alerts",
        }
    }

    /// Whether `path` fills this route's pattern (`{}`: one non-empty
    /// segment).
    pub fn matches_path(&self, path: &str) -> bool {
        // Split as bytes: `str::split` looks for each `/` with a searcher set
        // up per segment, which cost more than the comparison on paths this
        // short (callgrind, docs/benchmarks.md).
        let mut want = self.pattern.as_bytes().split(|&b| b == b'/');
        let mut got = path.as_bytes().split(|&b| b == b'/');
        loop {
            match (want.next(), got.next()) {
                (None, None) => return true,
                (Some(b"{}"), Some(seg)) if !seg.is_empty() => {}
                (Some(w), Some(g)) if w == g => {}
                _ => return false,
            }
        }
    }
}

pub(super) const GET: &[Method] = &[Method::GET];
pub(super) const POST: &[Method] = &[Method::POST];
pub(super) const DELETE: &[Method] = &[Method::DELETE];
pub(super) const GET_POST: &[Method] = &[Method::GET, Method::POST];

/// A tenant-scoped management API (ruler, delete requests): forwarded with
/// the tenant header, body bounded, under its own scope.
pub(super) const fn managed(
    signal: Signal,
    methods: &'static [Method],
    pattern: &'static str,
    scope: Scope,
) -> Route {
    Route {
        methods,
        pattern,
        signal,
        operation: Operation::Read,
        scope,
    }
}

pub(super) const fn logs(
    methods: &'static [Method],
    pattern: &'static str,
    operation: Operation,
) -> Route {
    let scope = match operation {
        Operation::Push | Operation::OtlpPush => Scope::LogsWrite,
        _ => Scope::LogsRead,
    };
    Route {
        methods,
        pattern,
        signal: Signal::Logs,
        operation,
        scope,
    }
}

pub(super) const fn metrics(
    methods: &'static [Method],
    pattern: &'static str,
    operation: Operation,
) -> Route {
    let scope = if operation.is_push() {
        Scope::MetricsWrite
    } else {
        Scope::MetricsRead
    };
    Route {
        methods,
        pattern,
        signal: Signal::Metrics,
        operation,
        scope,
    }
}

/// A ruler API at `$base`: the tenant's rule groups listed, by namespace,
/// one group (`rules:read`); a YAML group posted to a namespace, a namespace
/// or a group deleted (`rules:write`).
macro_rules! ruler_api {
    ($signal:expr, $base:literal) => {
        [
            managed($signal, GET, $base, Scope::RulesRead),
            managed($signal, GET, concat!($base, "/{}"), Scope::RulesRead),
            managed($signal, GET, concat!($base, "/{}/{}"), Scope::RulesRead),
            managed($signal, POST, concat!($base, "/{}"), Scope::RulesWrite),
            managed($signal, DELETE, concat!($base, "/{}"), Scope::RulesWrite),
            managed($signal, DELETE, concat!($base, "/{}/{}"), Scope::RulesWrite),
        ]
    };
}

/// A ruler route, a posted rule group handled by `operation` (the other
/// methods read or delete and pass as they are).
pub(super) fn posting_as(route: &Route, operation: Operation) -> Route {
    match route.methods {
        POST => Route {
            operation,
            ..route.clone()
        },
        _ => route.clone(),
    }
}
