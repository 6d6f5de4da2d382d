//! OTLP metrics requests in label mode, rewritten on the wire or refused.
//!
//! Invariants (issue #16), for every decompressed body and both policies:
//! - the rewrite accepts it, or refuses it with an error;
//! - what it forwards decodes as an `ExportMetricsServiceRequest` whenever
//!   the body did, and then every resource and every data point carries
//!   exactly one attribute a Prometheus receiver can turn into the tenant
//!   label, named exactly like it, with an owned value, and no scope
//!   attribute can become it;
//! - what it forwards is a fixed point: rewritten again, it comes out byte
//!   for byte the same (so the proxy's own reading finds it scoped too, also
//!   where strings are not UTF-8 and the decoder above cannot look);
//! - what it forwards is what came in all else: decoded and passed through
//!   `without_label`, the two encode to the same bytes (no value,
//!   timestamp, bucket, exemplar or other attribute lost or changed, a NaN
//!   value's bits included);
//! - under `reject`, no value is relabelled.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use prost::Message;
use tenant_proxy::config::ForeignLabelPolicy;
use tenant_proxy::enforce::otlp::{check_scoped, rewrite, without_label};
use tenant_proxy::enforce::tenant_label::TenantLabel;

fuzz_target!(|data: &[u8]| {
    let owned = vec!["team-a".to_string(), "team-a-2".to_string()];
    let came = ExportMetricsServiceRequest::decode(data).ok();
    // `_ns` and `key_ns` reach the readings where translators part ways
    // (the `key` prefix before a leading `_`, runs of `_` collapsed first).
    for label in ["namespace", "k8s_namespace_name", "_ns", "key_ns"] {
        for policy in [ForeignLabelPolicy::Overwrite, ForeignLabelPolicy::Reject] {
            let tenant = TenantLabel {
                name: label,
                owned: &owned,
                owned_by: "team-a",
                policy,
            };
            let Ok((out, stats)) = rewrite(data, &tenant) else {
                continue;
            };
            match ExportMetricsServiceRequest::decode(out.as_slice()) {
                Ok(forwarded) => {
                    if let Err(escape) = check_scoped(&forwarded, label, &owned) {
                        panic!("{label}: forwarded an unscoped attribute: {escape}");
                    }
                    if let Some(came) = &came {
                        // Compared encoded, bit for bit: `==` on the
                        // messages calls a NaN value unequal to itself.
                        let sent = without_label(forwarded, label);
                        let came = without_label(came.clone(), label);
                        assert!(
                            sent.encode_to_vec() == came.encode_to_vec(),
                            "{label}: the rewrite changed more than the label:\n{sent:?}\n{came:?}"
                        );
                    }
                }
                Err(e) => assert!(came.is_none(), "the rewrite broke a decodable body: {e}"),
            }
            let (again, _) = rewrite(&out, &tenant).expect("a forwarded body is accepted again");
            assert_eq!(again, out, "{label}: a forwarded body is not a fixed point");
            if policy == ForeignLabelPolicy::Reject {
                assert_eq!(
                    stats.overwritten, 0,
                    "reject never relabels a foreign value"
                );
            }
        }
    }
});
