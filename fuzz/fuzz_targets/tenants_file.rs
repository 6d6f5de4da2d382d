//! Tenants files, YAML or JSON, either format. Invariant: what a file
//! loads as holds every rule the proxy relies on when it authenticates
//! and scopes a request: tenant ids valid and unique; every tenant owns a
//! namespace and no namespace has two owners; every credential is found
//! by its own name only, holds a scope, belongs to a tenant of the same
//! store, and is read-only when it carries a selector; an unknown username
//! is checked against a decoy costing what a credential of the file costs
//! (none without credentials).
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use tenant_proxy::tenants::TenantId;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok((store, _)) = tenant_proxy::tenants::file::parse(text, 1) else {
        return;
    };
    let mut ids = BTreeSet::new();
    let mut namespaces = BTreeSet::new();
    for tenant in store.tenants() {
        let id = tenant.id.as_str();
        assert!(TenantId::parse(id).is_ok(), "invalid id {id:?} loaded");
        assert!(ids.insert(id), "tenant {id:?} twice");
        assert!(!tenant.namespaces.is_empty(), "{id:?} owns no namespace");
        for namespace in &tenant.namespaces {
            assert!(namespaces.insert(namespace), "{namespace:?} has two owners");
        }
    }
    let credentials = store.credentials_sorted();
    assert_eq!(credentials.len(), store.credential_count());
    let costs: BTreeSet<_> = credentials.iter().map(|c| c.verifier.cost()).collect();
    for pick in [0, 1, 2, u64::MAX / 3, u64::MAX] {
        match store.decoy(pick) {
            None => assert!(costs.is_empty(), "credentials but no decoy"),
            Some(decoy) => assert!(
                costs.contains(decoy.cost()),
                "a decoy of a cost no credential has"
            ),
        }
    }
    for credential in credentials {
        let name = &credential.username;
        let found = store.credential(name).expect("found by its name");
        assert!(
            std::sync::Arc::ptr_eq(found, credential),
            "{name:?} names two"
        );
        assert!(
            credential.scopes.iter().next().is_some(),
            "{name:?} has no scope"
        );
        let tenant = store.tenant(credential.tenant.id.as_str());
        assert!(
            tenant.is_some_and(|t| std::sync::Arc::ptr_eq(t, &credential.tenant)),
            "{name:?} belongs to a tenant the store does not hold"
        );
        if credential.selector.is_some() {
            assert!(
                credential.scopes.iter().all(|s| s.is_read()),
                "{name:?} has a selector and a write scope"
            );
        }
    }
});
