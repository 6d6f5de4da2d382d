//! Tenant enforcement for label mode (a vanilla Prometheus or Thanos): every
//! PromQL selector and `match[]` rewritten (`promql`, `params`,
//! `prometheus`), and every remote-write series relabelled (`remote_write`,
//! on the wire format of `protowire`, with the message types of `prompb`),
//! and every OTLP metrics data point and resource too (`otlp`), under the
//! one tenant-label policy of `tenant_label`.

pub mod otlp;
pub mod params;
pub mod prometheus;
pub mod prompb;
pub mod promql;
pub mod protowire;
pub mod remote_write;
pub mod tenant_label;
