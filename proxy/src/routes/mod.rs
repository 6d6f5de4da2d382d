//! The endpoint policy: an explicit table of (method, normalised path) →
//! signal, operation and required scope. Deny by default: a path not in the
//! table is a 404, whatever the upstream would have done with it.
//!
//! Admin and global endpoints (Loki `/flush`, `/config`, `/ring`,
//! `/ingester/*`, `/distributor/*`, `/ruler/ring`, `/memberlist`, the
//! upstream's `/metrics`) are refused simply by not being listed.
//!
//! `route` is what a route is; `loki`, `metrics` and `alertmanager` hold
//! each backend's table; `table` builds the routes in force for one
//! configuration and finds a request's among them.

#[macro_use]
mod route;

mod alertmanager;
mod loki;
mod metrics;
mod table;
#[cfg(test)]
mod tests;

pub use alertmanager::{ALERTMANAGER_DATASOURCE_ROOT, ALERTMANAGER_PREFIXES};
pub use loki::LOKI_LABEL_NAMES;
pub use route::{AlertmanagerCall, Operation, Route, Signal};
pub use table::RouteTable;
