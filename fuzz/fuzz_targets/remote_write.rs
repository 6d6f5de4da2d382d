//! Remote-write bodies, 1.0 and 2.0: rewritten or refused, never a panic.
//!
//! Invariant (issue #13): for every body the rewrite accepts, declared as
//! either version, what it would forward decodes, under a 1.0 decoder AND
//! under a 2.0 decoder, to series that each carry exactly one tenant label
//! with an owned value (or to no series, or fails to decode). And a body a
//! generated 1.0 decoder accepts comes out of the 1.0 rewrite decodable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tenant_proxy::config::ForeignLabelPolicy;
use tenant_proxy::enforce::prompb::{readings, WriteRequest};
use tenant_proxy::enforce::remote_write::{rewrite, Version};
use tenant_proxy::enforce::tenant_label::TenantLabel;

fuzz_target!(|data: &[u8]| {
    let owned = vec!["team-a".to_string(), "team-a-2".to_string()];
    for policy in [ForeignLabelPolicy::Overwrite, ForeignLabelPolicy::Reject] {
        let tenant = TenantLabel {
            name: "namespace",
            owned: &owned,
            owned_by: "team-a",
            policy,
        };
        for version in [Version::V1, Version::V2] {
            let Ok((out, _)) = rewrite(version, data, &tenant) else {
                continue;
            };
            if let Err(escape) = readings::only_owned_series(&out, "namespace", &owned) {
                panic!("{version:?} forwarded a series the tenant does not own: {escape}");
            }
            if version == Version::V1 && WriteRequest::decode(data).is_ok() {
                WriteRequest::decode(out.as_slice()).expect("the rewrite decodes");
            }
        }
    }
});
