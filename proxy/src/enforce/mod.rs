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

/// Per-thread scratch buffers above this are released after use rather than
/// kept: one unusually large batch must not pin its size on every thread.
const KEEP_SCRATCH_BYTES: usize = 4 * 1024 * 1024;

/// Releases each buffer whose capacity is above [`KEEP_SCRATCH_BYTES`].
fn release_large_scratch<const N: usize>(buffers: [&mut Vec<u8>; N]) {
    for buffer in buffers {
        if buffer.capacity() > KEEP_SCRATCH_BYTES {
            *buffer = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn scratch_of_up_to_4_mib_is_kept_and_larger_is_released() {
        let mut kept = Vec::with_capacity(4 << 20);
        let mut released = Vec::with_capacity((4 << 20) + 1);
        let mut small = Vec::with_capacity(1);
        super::release_large_scratch([&mut kept, &mut released, &mut small]);
        assert_eq!(
            [kept.capacity(), released.capacity(), small.capacity()],
            [4 << 20, 0, 1]
        );
    }
}
