//! Tenants files, YAML or JSON, either format: loaded whole or refused,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = tenant_proxy::tenants::file::parse(text, 1);
    }
});
