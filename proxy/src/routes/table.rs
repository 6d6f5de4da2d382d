//! The routes in force for one configuration, and the lookup of a
//! request's method and path among them.

use http::Method;

use super::alertmanager::{ALERTMANAGER, MIMIR_ALERTMANAGER_DATASOURCE};
use super::loki::{LOKI_ROUTES, LOKI_RULER};
use super::metrics::{
    CORTEX_RULER, HEADER_MODE_EXTRA_ROUTES, MIMIR_RULER, PROMETHEUS_ROUTES,
    SCOPED_BY_A_QUERY_TENANT_HEADER, THANOS_RECEIVE,
};
use super::route::{posting_as, Operation, Route};
use crate::config::MetricsScoping;
use crate::http::error::ProxyError;

/// The routes in force for one configuration.
#[derive(Debug)]
pub struct RouteTable {
    pub(super) routes: Vec<Route>,
    /// At index `n`, the routes whose pattern has `n` slashes, in table
    /// order (the first match wins): a path is compared only with those.
    by_slashes: Vec<Vec<Candidate>>,
}

/// A route a path of the right number of slashes may match, and whether
/// its pattern is exact (has no `{}`).
#[derive(Clone, Copy, Debug)]
struct Candidate {
    route: usize,
    exact: bool,
}

fn slashes(path: &str) -> usize {
    path.bytes().filter(|&b| b == b'/').count()
}

impl RouteTable {
    pub fn new(logs_enabled: bool, metrics: Option<MetricsScoping>, alerts_enabled: bool) -> Self {
        let mut routes = Vec::new();
        if logs_enabled {
            routes.extend_from_slice(LOKI_ROUTES);
            let label_mode = metrics == Some(MetricsScoping::Label);
            routes.extend(LOKI_RULER.iter().flatten().map(|r| match label_mode {
                true => posting_as(r, Operation::RuleGroup),
                false => r.clone(),
            }));
        }
        // A route forwarded with the tenant header only.
        let by_header = |r: &Route| Route {
            operation: if r.operation.is_push() {
                Operation::Push
            } else {
                Operation::Read
            },
            ..r.clone()
        };
        match metrics {
            Some(MetricsScoping::Label) => routes.extend_from_slice(PROMETHEUS_ROUTES),
            // Mimir and Cortex scope every one of these by the tenant header.
            Some(MetricsScoping::HeaderScopesEveryApi) => {
                let label_mode_only = |r: &&Route| r.operation != Operation::OtlpMetrics;
                routes.extend(
                    PROMETHEUS_ROUTES
                        .iter()
                        .filter(label_mode_only)
                        .map(by_header),
                );
                routes.extend_from_slice(HEADER_MODE_EXTRA_ROUTES);
                let ruler = MIMIR_RULER.iter().chain(&CORTEX_RULER);
                routes.extend(ruler.map(|r| posting_as(r, Operation::FederatedRuleGroup)));
            }
            // Only what such an upstream scopes by the header; metadata is
            // answered empty, as in label mode; the rest is refused by
            // absence (rules, alerts and exemplars it would answer for
            // every tenant).
            Some(MetricsScoping::HeaderScopesQueries) => {
                routes.extend(PROMETHEUS_ROUTES.iter().filter_map(|r| match r.operation {
                    Operation::EmptyMetadata => Some(r.clone()),
                    _ if SCOPED_BY_A_QUERY_TENANT_HEADER.contains(&r.pattern) => Some(by_header(r)),
                    _ => None,
                }));
                routes.extend_from_slice(HEADER_MODE_EXTRA_ROUTES);
                routes.push(THANOS_RECEIVE);
            }
            None => {}
        }
        match metrics.filter(|_| alerts_enabled) {
            Some(MetricsScoping::Label) => routes.extend(ALERTMANAGER.iter().flatten().cloned()),
            // Mimir's Alertmanager, by the tenant header, at its own paths
            // and under the data-source root.
            Some(MetricsScoping::HeaderScopesEveryApi) => {
                let (api, config) = &MIMIR_ALERTMANAGER_DATASOURCE;
                routes.extend(ALERTMANAGER[1].iter().chain(api).map(|r| Route {
                    operation: Operation::Read,
                    ..r.clone()
                }));
                routes.push(config.clone());
            }
            // No Alertmanager scopes by such a header (the config refuses
            // `alerts` with it).
            Some(MetricsScoping::HeaderScopesQueries) | None => {}
        }
        let mut by_slashes: Vec<Vec<Candidate>> = Vec::new();
        for (index, route) in routes.iter().enumerate() {
            let n = slashes(route.pattern);
            if by_slashes.len() <= n {
                by_slashes.resize_with(n + 1, Vec::new);
            }
            by_slashes[n].push(Candidate {
                route: index,
                exact: !route.pattern.contains("{}"),
            });
        }
        Self { routes, by_slashes }
    }

    /// `path` must already be normalised (see `path::normalise`).
    pub fn classify(&self, method: &Method, path: &str) -> Result<&Route, ProxyError> {
        // The methods of every route on this path, for a 405's `Allow`.
        let mut allow: Vec<Method> = Vec::new();
        let candidates = self
            .by_slashes
            .get(slashes(path))
            .map_or(&[][..], Vec::as_slice);
        for candidate in candidates {
            let route = &self.routes[candidate.route];
            // No `{}`: the segments match exactly when the strings do.
            let matches = if candidate.exact {
                route.pattern == path
            } else {
                route.matches_path(path)
            };
            if matches {
                if route.methods.contains(method) {
                    return Ok(route);
                }
                for known in route.methods {
                    if !allow.contains(known) {
                        allow.push(known.clone());
                    }
                }
            }
        }
        Err(if allow.is_empty() {
            ProxyError::RouteNotFound
        } else {
            ProxyError::MethodNotAllowed { allow }
        })
    }
}
