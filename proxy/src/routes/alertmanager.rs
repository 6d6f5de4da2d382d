//! Alertmanager's API v2 as Grafana's Alertmanager data source calls it:
//! a vanilla Alertmanager's (label mode) and Mimir's (header mode).

use http::Method;

use super::route::{managed, AlertmanagerCall, Operation, Route, Signal, DELETE, GET, POST};
use crate::enforce::alertmanager::AnswerFilter;
use crate::tenants::Scope;

const fn alerts(
    methods: &'static [Method],
    pattern: &'static str,
    call: AlertmanagerCall,
) -> Route {
    let scope = match call {
        AlertmanagerCall::PostSilence | AlertmanagerCall::DeleteSilence => Scope::AlertsWrite,
        _ => Scope::AlertsRead,
    };
    Route {
        methods,
        pattern,
        signal: Signal::Alerts,
        operation: Operation::Alertmanager(call),
        scope,
    }
}

/// The Alertmanager API v2 at `$base`, as Grafana's Alertmanager data source
/// calls it. Everything else (posting alerts, `/-/reload`, the UI) is
/// refused by absence.
macro_rules! alertmanager_api {
    ($base:literal) => {
        [
            alerts(
                GET,
                concat!($base, "/status"),
                AlertmanagerCall::Read(AnswerFilter::Status),
            ),
            alerts(
                GET,
                concat!($base, "/receivers"),
                AlertmanagerCall::Receivers,
            ),
            alerts(
                GET,
                concat!($base, "/alerts"),
                AlertmanagerCall::ReadFiltered(AnswerFilter::Alerts),
            ),
            alerts(
                GET,
                concat!($base, "/alerts/groups"),
                AlertmanagerCall::ReadFiltered(AnswerFilter::AlertGroups),
            ),
            alerts(
                GET,
                concat!($base, "/silences"),
                AlertmanagerCall::Read(AnswerFilter::Silences),
            ),
            alerts(
                GET,
                concat!($base, "/silence/{}"),
                AlertmanagerCall::Silence,
            ),
            alerts(
                POST,
                concat!($base, "/silences"),
                AlertmanagerCall::PostSilence,
            ),
            alerts(
                DELETE,
                concat!($base, "/silence/{}"),
                AlertmanagerCall::DeleteSilence,
            ),
        ]
    };
}

/// Vanilla Alertmanager (label mode): at its own paths, under
/// `/alertmanager` like Mimir's, and under the data-source root `/am`, so
/// one data source URL fits both backends.
pub(super) const ALERTMANAGER: [[Route; 8]; 3] = [
    alertmanager_api!("/api/v2"),
    alertmanager_api!("/alertmanager/api/v2"),
    alertmanager_api!("/am/api/v2"),
];

/// The prefixes label mode strips before forwarding to a vanilla
/// Alertmanager (which serves at its root).
pub const ALERTMANAGER_PREFIXES: [&str; 2] = ["/alertmanager", ALERTMANAGER_DATASOURCE_ROOT];

/// The root Grafana's Alertmanager data source points at, whatever the
/// backend: `https://<proxy>/am`, stripped before forwarding. Needed
/// because for Mimir (header mode) Grafana reads the tenant's Alertmanager
/// configuration at `<url>/api/v1/alerts`, which at the proxy's root is the
/// Prometheus-compatible alerts list of the metrics data source.
pub const ALERTMANAGER_DATASOURCE_ROOT: &str = "/am";

/// Mimir's Alertmanager under [`ALERTMANAGER_DATASOURCE_ROOT`]: its API v2
/// and its configuration API. The configuration holds the tenant's receivers
/// with their credentials: reading it needs the scope that may replace it.
pub(super) const MIMIR_ALERTMANAGER_DATASOURCE: ([Route; 8], Route) = (
    alertmanager_api!("/am/alertmanager/api/v2"),
    managed(
        Signal::Alerts,
        &[Method::GET, Method::POST, Method::DELETE],
        "/am/api/v1/alerts",
        Scope::AlertsWrite,
    ),
);
