//! What the platform team watches: Prometheus metrics, OpenTelemetry spans,
//! the admin listener (`/metrics`, `/healthz`, `/readyz`) and process
//! figures.

pub mod access_log;
pub mod admin;
pub mod metrics;
pub mod otel;
pub mod process;
