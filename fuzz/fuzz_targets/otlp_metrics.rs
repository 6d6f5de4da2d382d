//! OTLP metrics requests in label mode: rewritten or refused, never a panic.
//!
//! Invariant (issue #16): for every body the rewrite accepts, what it
//! forwards decodes as an `ExportMetricsServiceRequest` in which every
//! resource and every data point carries exactly one attribute a Prometheus
//! receiver can turn into the tenant label, named exactly like it, with an
//! owned value, and no scope attribute can become it; under `reject`, a
//! body is refused rather than relabelled.
#![no_main]

use libfuzzer_sys::fuzz_target;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use prost::Message;
use tenant_proxy::config::ForeignLabelPolicy;
use tenant_proxy::enforce::otlp::{check_scoped, rewrite_body, Encoding};
use tenant_proxy::enforce::tenant_label::TenantLabel;

fuzz_target!(|data: &[u8]| {
    let owned = vec!["team-a".to_string(), "team-a-2".to_string()];
    for label in ["namespace", "k8s_namespace_name"] {
        for policy in [ForeignLabelPolicy::Overwrite, ForeignLabelPolicy::Reject] {
            let tenant = TenantLabel {
                name: label,
                owned: &owned,
                owned_by: "team-a",
                policy,
            };
            let Ok((out, stats)) = rewrite_body(Encoding::Identity, data, &tenant, 1 << 20) else {
                continue;
            };
            let forwarded = ExportMetricsServiceRequest::decode(out.as_slice())
                .expect("what the proxy encodes decodes");
            if let Err(escape) = check_scoped(&forwarded, label, &owned) {
                panic!("{label}: forwarded an unscoped attribute: {escape}");
            }
            if policy == ForeignLabelPolicy::Reject {
                assert_eq!(stats.overwritten, 0, "reject never relabels a foreign value");
            }
        }
    }
});
