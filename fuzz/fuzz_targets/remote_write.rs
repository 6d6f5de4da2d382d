//! Remote-write bodies, 1.0 and 2.0: rewritten or refused, never a panic;
//! a rewritten 1.0 body decodes with every series carrying exactly one
//! tenant label of an owned value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tenant_proxy::config::ForeignLabelPolicy;
use tenant_proxy::prompb::WriteRequest;
use tenant_proxy::remote_write::{rewrite, TenantLabel, Version};

fuzz_target!(|data: &[u8]| {
    let owned = vec!["team-a".to_string(), "team-a-2".to_string()];
    let tenant = TenantLabel {
        name: "namespace",
        owned: &owned,
        owned_by: "team-a",
        policy: ForeignLabelPolicy::Overwrite,
    };
    let _ = rewrite(Version::V2, data, &tenant);
    let Ok((out, _)) = rewrite(Version::V1, data, &tenant) else {
        return;
    };
    // Input a generated decoder accepts must come out decodable, scoped.
    if WriteRequest::decode(data).is_err() {
        return;
    }
    let request = WriteRequest::decode(out.as_slice()).expect("the rewrite decodes");
    for series in &request.timeseries {
        let values: Vec<_> = series
            .labels
            .iter()
            .filter(|l| l.name == "namespace")
            .map(|l| l.value.as_str())
            .collect();
        assert!(matches!(values[..], [v] if owned.iter().any(|o| o == v)), "{values:?}");
    }
});
