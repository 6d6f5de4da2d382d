//! Tenant enforcement for label mode (a vanilla Prometheus or Thanos): every
//! PromQL selector and `match[]` rewritten (`promql`, `params`,
//! `prometheus`), and every remote-write series relabelled (`remote_write`,
//! on the wire format of `protowire`, with the message types of `prompb`),
//! and every OTLP metrics data point and resource too (`otlp`), under the
//! one tenant-label policy of `tenant_label`.

pub mod alertmanager;
pub mod otlp;
pub mod params;
pub mod prometheus;
pub mod prompb;
pub mod promql;
pub mod protowire;
pub mod remote_write;
pub mod rule_group;
pub mod tenant_label;

/// What a push body became after its series were scoped to the tenant.
#[derive(Debug, PartialEq, Eq)]
pub enum Rewritten {
    /// Every series already carried exactly one owned tenant label, in
    /// place: the rewrite reproduced the decompressed body byte for byte,
    /// so the body goes upstream as it came. This is the usual case for
    /// senders that set the label already, and it saves the recompression,
    /// the costliest step.
    Unchanged,
    /// A new body, compressed as the request was.
    Body(Vec<u8>),
}
