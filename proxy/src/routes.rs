//! The endpoint policy: an explicit table of (method, normalised path) →
//! signal, operation and required scope. Deny by default: a path not in the
//! table is a 404, whatever the upstream would have done with it.
//!
//! Admin and global endpoints (Loki `/flush`, `/config`, `/ring`,
//! `/ingester/*`, `/distributor/*`, the delete API, `/memberlist`, the
//! upstream's `/metrics`) are refused simply by not being listed.

use http::Method;

use crate::error::ProxyError;
use crate::tenants::Scope;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Logs,
    Metrics,
}

impl Signal {
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Logs => "logs",
            Signal::Metrics => "metrics",
        }
    }
}

/// What the proxy does with a matched request, beyond authentication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Body streamed through untouched, tenant header set.
    Push,
    /// Query parameters forwarded as sent, tenant header set.
    Read,
    /// WebSocket upgrade passed through, tenant header set.
    Tail,
}

#[derive(Debug)]
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
    pub fn surface(&self) -> &'static str {
        match (self.signal, self.operation) {
            (Signal::Logs, Operation::Push) => "logs_push",
            (Signal::Logs, Operation::Read) => "logs_query",
            (Signal::Logs, Operation::Tail) => "logs_tail",
            (Signal::Metrics, Operation::Push) => "metrics_push",
            (Signal::Metrics, _) => "metrics_query",
        }
    }

    fn matches_path(&self, path: &str) -> bool {
        let mut want = self.pattern.split('/');
        let mut got = path.split('/');
        loop {
            match (want.next(), got.next()) {
                (None, None) => return true,
                (Some("{}"), Some(seg)) if !seg.is_empty() => {}
                (Some(w), Some(g)) if w == g => {}
                _ => return false,
            }
        }
    }
}

const GET: &[Method] = &[Method::GET];
const POST: &[Method] = &[Method::POST];
const GET_POST: &[Method] = &[Method::GET, Method::POST];

const fn logs(methods: &'static [Method], pattern: &'static str, operation: Operation) -> Route {
    let scope = match operation {
        Operation::Push => Scope::LogsWrite,
        Operation::Read | Operation::Tail => Scope::LogsRead,
    };
    Route {
        methods,
        pattern,
        signal: Signal::Logs,
        operation,
        scope,
    }
}

/// Loki, header mode. Every route here is tenant-scoped by `X-Scope-OrgID`.
pub const LOKI_ROUTES: &[Route] = &[
    logs(POST, "/loki/api/v1/push", Operation::Push),
    logs(POST, "/api/prom/push", Operation::Push),
    logs(GET_POST, "/loki/api/v1/query", Operation::Read),
    logs(GET_POST, "/loki/api/v1/query_range", Operation::Read),
    logs(GET_POST, "/loki/api/v1/labels", Operation::Read),
    logs(GET_POST, "/loki/api/v1/label/{}/values", Operation::Read),
    logs(GET_POST, "/loki/api/v1/series", Operation::Read),
    logs(GET_POST, "/loki/api/v1/index/stats", Operation::Read),
    logs(GET_POST, "/loki/api/v1/index/volume", Operation::Read),
    logs(GET_POST, "/loki/api/v1/index/volume_range", Operation::Read),
    logs(GET_POST, "/loki/api/v1/patterns", Operation::Read),
    logs(GET_POST, "/loki/api/v1/detected_fields", Operation::Read),
    logs(
        GET_POST,
        "/loki/api/v1/detected_field/{}/values",
        Operation::Read,
    ),
    logs(GET_POST, "/loki/api/v1/detected_labels", Operation::Read),
    logs(GET_POST, "/loki/api/v1/format_query", Operation::Read),
    logs(GET, "/loki/api/v1/drilldown-limits", Operation::Read),
    logs(GET, "/loki/api/v1/status/buildinfo", Operation::Read),
    logs(GET, "/loki/api/v1/tail", Operation::Tail),
];

/// The routes in force for one configuration.
#[derive(Debug)]
pub struct RouteTable {
    routes: Vec<&'static Route>,
}

impl RouteTable {
    pub fn new(logs_enabled: bool) -> Self {
        let mut routes = Vec::new();
        if logs_enabled {
            routes.extend(LOKI_ROUTES);
        }
        Self { routes }
    }

    /// `path` must already be normalised (see `path::normalise`).
    pub fn classify(&self, method: &Method, path: &str) -> Result<&'static Route, ProxyError> {
        let mut path_matched = false;
        for route in &self.routes {
            if route.matches_path(path) {
                if route.methods.contains(method) {
                    return Ok(route);
                }
                path_matched = true;
            }
        }
        Err(if path_matched {
            ProxyError::MethodNotAllowed
        } else {
            ProxyError::RouteNotFound
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> RouteTable {
        RouteTable::new(true)
    }

    #[test]
    fn classifies_loki_routes_with_their_scope() {
        let push = table()
            .classify(&Method::POST, "/loki/api/v1/push")
            .unwrap();
        assert_eq!(
            (push.operation, push.scope),
            (Operation::Push, Scope::LogsWrite)
        );
        let values = table()
            .classify(&Method::GET, "/loki/api/v1/label/app/values")
            .unwrap();
        assert_eq!(values.scope, Scope::LogsRead);
        let tail = table().classify(&Method::GET, "/loki/api/v1/tail").unwrap();
        assert_eq!(tail.operation, Operation::Tail);
    }

    #[test]
    fn refuses_admin_and_unknown_paths() {
        for path in [
            "/flush",
            "/config",
            "/ring",
            "/ingester/shutdown",
            "/distributor/ring",
            "/loki/api/v1/delete",
            "/memberlist",
            "/metrics",
            "/loki/api/v1/index/shards",
            "/loki/api/v1/label/values",
            "/loki/api/v1/label/a/b/values",
            "/loki/api/v1/push/extra",
        ] {
            for method in [Method::GET, Method::POST] {
                assert!(
                    matches!(
                        table().classify(&method, path),
                        Err(ProxyError::RouteNotFound)
                    ),
                    "{method} {path}"
                );
            }
        }
    }

    #[test]
    fn wrong_method_is_405_not_forwarded() {
        assert!(matches!(
            table().classify(&Method::GET, "/loki/api/v1/push"),
            Err(ProxyError::MethodNotAllowed)
        ));
        assert!(matches!(
            table().classify(&Method::DELETE, "/loki/api/v1/query"),
            Err(ProxyError::MethodNotAllowed)
        ));
    }

    #[test]
    fn disabled_signal_has_no_routes() {
        assert!(RouteTable::new(false)
            .classify(&Method::POST, "/loki/api/v1/push")
            .is_err());
    }
}
