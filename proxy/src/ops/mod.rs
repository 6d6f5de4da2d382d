//! What the platform team watches: Prometheus metrics, OpenTelemetry spans,
//! the admin listener (`/metrics`, `/healthz`, `/readyz`), process
//! figures, and the process's own limits (`open_files`).

pub mod access_log;
pub mod admin;
pub mod metrics;
pub mod open_files;
pub mod otel;
pub mod panics;
pub mod process;
