//! The load-test harness: a backend sink, scenario files, closed- and
//! open-loop load, and a report that puts the same scenario direct and
//! through the proxy side by side.

pub mod bodies;
pub mod faults;
pub mod load;
pub mod nginx;
pub mod proxy_process;
pub mod report;
pub mod scenario;
pub mod sink;
