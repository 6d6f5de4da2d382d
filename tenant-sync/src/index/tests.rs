use super::*;
use base64::Engine;
use serde_json::json;

fn b64(s: &str) -> String {
    b64_bytes(s.as_bytes())
}

fn b64_bytes(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub(crate) fn conventions(tenant_label: Option<&str>) -> Conventions {
    Conventions {
        tenant_label: tenant_label.map(str::to_owned),
        scopes_annotation: "tenant-proxy/scopes".into(),
        usernames_name_their_tenant: false,
        default_grantable: None,
        max_credentials_per_tenant: None,
    }
}

fn namespace(name: &str, labels: serde_json::Value) -> Namespace {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

fn secret(
    ns: &str,
    name: &str,
    created: &str,
    data: serde_json::Value,
    annotations: serde_json::Value,
) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created, "annotations": annotations},
        "type": SECRET_TYPE,
        "data": data,
    }))
    .unwrap()
}

fn basic(ns: &str, name: &str, user: &str, password: &str) -> Secret {
    secret(
        ns,
        name,
        "2026-01-01T00:00:00Z",
        json!({"username": b64(user), "password": b64(password)}),
        json!({}),
    )
}

fn synced(index: &mut Index, namespaces: Vec<Namespace>, secrets: Vec<Secret>) {
    index.namespace_event(Event::Init);
    for ns in namespaces {
        index.namespace_event(Event::InitApply(ns));
    }
    index.namespace_event(Event::InitDone);
    index.secret_event("", Event::Init);
    for s in secrets {
        index.secret_event("", Event::InitApply(s));
    }
    index.secret_event("", Event::InitDone);
}

/// (Secret name, reason) of every skipped Secret.
fn skip_reasons(desired: &Desired) -> Vec<(&str, SkipReason)> {
    desired
        .skipped
        .iter()
        .map(|(k, r)| (k.1.as_str(), *r))
        .collect()
}

fn users(desired: &Desired, tenant: &str) -> Vec<String> {
    desired.tenants[&TenantId::parse(tenant).unwrap()]
        .users
        .iter()
        .map(|u| u.credential.username.clone())
        .collect()
}

#[test]
fn each_namespace_is_a_tenant_by_default_and_secrets_speak_for_their_own() {
    let mut index = Index::new(conventions(None), &[String::new()]);
    assert!(!index.is_synced());
    synced(
        &mut index,
        vec![
            namespace("team-a", json!({})),
            namespace("team-b", json!({})),
        ],
        vec![
            basic("team-a", "grafana", "grafana-a", "pa"),
            basic("team-b", "push", "push-b", "pb"),
        ],
    );
    assert!(index.is_synced());
    let desired = index.desired();
    assert_eq!(users(&desired, "team-a"), ["grafana-a"]);
    assert_eq!(users(&desired, "team-b"), ["push-b"]);
    assert!(desired.skipped.is_empty());
}

#[test]
fn tenant_label_groups_namespaces_and_ignores_unlabelled_ones() {
    let mut index = Index::new(conventions(Some("example.com/tenant")), &[String::new()]);
    synced(
        &mut index,
        vec![
            namespace("shop-prod", json!({"example.com/tenant": "shop"})),
            namespace("shop-dev", json!({"example.com/tenant": "shop"})),
            namespace("kube-system", json!({})),
        ],
        vec![
            basic("shop-dev", "s", "shop-user", "p"),
            basic("kube-system", "s", "sneaky", "p"),
        ],
    );
    let desired = index.desired();
    let shop = &desired.tenants[&TenantId::parse("shop").unwrap()];
    assert_eq!(
        shop.namespaces.iter().collect::<Vec<_>>(),
        ["shop-dev", "shop-prod"]
    );
    assert_eq!(users(&desired, "shop"), ["shop-user"]);
    assert_eq!(
        desired.skipped,
        [(
            ("kube-system".into(), "s".into()),
            SkipReason::NamespaceNotATenant
        )]
    );
}

#[test]
fn a_secret_names_neither_its_tenant_nor_its_limits() {
    // Everything a Secret's author could write to claim another tenant or
    // loosen a limit: the tenant label on the Secret, the limits
    // annotation, and extra data keys. Only the Namespace decides.
    let mut index = Index::new(conventions(Some("example.com/tenant")), &[String::new()]);
    let claiming: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": "s", "namespace": "shop-prod", "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"example.com/tenant": "blog"},
            "annotations": {LIMITS_ANNOTATION: r#"{"push": {"bytes_per_second": 1}}"#},
        },
        "type": SECRET_TYPE,
        "data": {"username": b64("shop-user"), "password": b64("p"), "tenant": b64("blog")},
    }))
    .unwrap();
    synced(
        &mut index,
        vec![
            namespace("shop-prod", json!({"example.com/tenant": "shop"})),
            namespace("blog", json!({"example.com/tenant": "blog"})),
        ],
        vec![claiming],
    );
    let desired = index.desired();
    assert_eq!(users(&desired, "shop"), ["shop-user"]);
    let blog = TenantId::parse("blog").unwrap();
    assert!(desired
        .tenants
        .get(&blog)
        .is_none_or(|t| t.users.is_empty()));
    let shop = &desired.tenants[&TenantId::parse("shop").unwrap()];
    assert_eq!(shop.limits, None);
    assert!(desired.skipped.is_empty() && desired.invalid_limits.is_empty());
}

#[test]
fn a_relabelled_namespace_moves_its_secrets_to_the_new_tenant() {
    let mut index = Index::new(conventions(Some("t")), &[String::new()]);
    synced(
        &mut index,
        vec![namespace("ns", json!({"t": "one"}))],
        vec![basic("ns", "s", "u", "p")],
    );
    assert_eq!(users(&index.desired(), "one"), ["u"]);
    index.namespace_event(Event::Apply(namespace("ns", json!({"t": "two"}))));
    let desired = index.desired();
    assert!(!desired
        .tenants
        .contains_key(&TenantId::parse("one").unwrap()));
    assert_eq!(users(&desired, "two"), ["u"]);
}

#[test]
fn deletes_and_relists_remove_what_disappeared() {
    let mut index = Index::new(conventions(None), &[String::new()]);
    synced(
        &mut index,
        vec![namespace("a", json!({})), namespace("b", json!({}))],
        vec![
            basic("a", "s1", "u1", "p"),
            basic("a", "s2", "u2", "p"),
            basic("b", "s", "u3", "p"),
        ],
    );
    index.secret_event("", Event::Delete(basic("a", "s1", "u1", "p")));
    assert_eq!(users(&index.desired(), "a"), ["u2"]);
    // A re-list (say after 410 Gone) that no longer holds s2 or namespace b.
    index.namespace_event(Event::Init);
    index.namespace_event(Event::InitApply(namespace("a", json!({}))));
    index.secret_event("", Event::Init);
    index.secret_event("", Event::InitApply(basic("b", "s", "u3", "p")));
    // Until InitDone the old picture stays in force.
    assert_eq!(users(&index.desired(), "a"), ["u2"]);
    index.namespace_event(Event::InitDone);
    index.secret_event("", Event::InitDone);
    let desired = index.desired();
    assert!(desired.tenants.is_empty(), "{desired:?}");
    assert_eq!(
        desired.skipped,
        [(("b".into(), "s".into()), SkipReason::NamespaceNotATenant)]
    );
}

#[test]
fn duplicate_usernames_go_to_the_oldest_secret() {
    let mut index = Index::new(conventions(None), &[String::new()]);
    let older = secret(
        "b",
        "old",
        "2025-01-01T00:00:00Z",
        json!({"username": b64("dup"), "password": b64("x")}),
        json!({}),
    );
    let newer = secret(
        "a",
        "new",
        "2026-01-01T00:00:00Z",
        json!({"username": b64("dup"), "password": b64("y")}),
        json!({}),
    );
    synced(
        &mut index,
        vec![namespace("a", json!({})), namespace("b", json!({}))],
        vec![newer, older],
    );
    let desired = index.desired();
    assert_eq!(users(&desired, "b"), ["dup"]);
    assert!(!desired.tenants.contains_key(&TenantId::parse("a").unwrap()));
    assert_eq!(
        desired.skipped,
        [(("a".into(), "new".into()), SkipReason::DuplicateUsername)]
    );
}

/// A tenant holds at most the cap's credentials, its oldest Secrets'
/// across its namespaces: the newest are left out and hold no username
/// (another tenant's newer Secret takes it), a duplicate is told as such
/// and takes no place, other tenants count on their own, and a deleted
/// credential makes room for the next Secret in line.
#[test]
fn a_tenant_holds_at_most_the_cap_of_credentials_its_oldest_first() {
    let mut conventions = conventions(Some("team"));
    conventions.max_credentials_per_tenant = Some(2);
    let mut index = Index::new(conventions, &[String::new()]);
    let made = |ns: &str, name: &str, month: u32, user: &str| {
        secret(
            ns,
            name,
            &format!("2026-{month:02}-01T00:00:00Z"),
            json!({"username": b64(user), "password": b64("pw")}),
            json!({}),
        )
    };
    let first = made("a1", "first", 1, "u1");
    synced(
        &mut index,
        vec![
            namespace("a1", json!({"team": "a"})),
            namespace("a2", json!({"team": "a"})),
            namespace("b", json!({"team": "b"})),
        ],
        vec![
            made("a2", "newest", 5, "shared"),
            first.clone(),
            made("a1", "dup", 2, "u1"),
            made("a2", "second", 3, "u2"),
            made("b", "other", 6, "shared"),
            made("b", "b-own", 4, "u3"),
        ],
    );
    let desired = index.desired();
    assert_eq!(users(&desired, "a"), ["u1", "u2"]);
    assert_eq!(users(&desired, "b"), ["shared", "u3"]);
    assert_eq!(
        skip_reasons(&desired),
        [
            ("dup", SkipReason::DuplicateUsername),
            ("newest", SkipReason::TooManyCredentials)
        ]
    );

    index.secret_event("", Event::Delete(first));
    let desired = index.desired();
    // `dup` is next in line now that `u1` is free; `newest` still waits
    // and `shared` stays team b's.
    assert_eq!(users(&desired, "a"), ["u1", "u2"]);
    assert_eq!(
        desired.tenants[&TenantId::parse("a").unwrap()].users[0]
            .source
            .1,
        "dup"
    );
    assert_eq!(
        skip_reasons(&desired),
        [("newest", SkipReason::TooManyCredentials)]
    );
}

/// A Namespace's `tenant-proxy/max-credentials` sets its tenant's cap in
/// place of the command line's, raising or lowering it; several
/// Namespaces of one tenant give the strictest (`0`, no cap, yields to
/// any other); one that is not a count is left out with why, and its
/// tenant keeps the command line's cap; a Secret's own annotation sets
/// nothing.
#[test]
fn a_namespace_sets_its_tenants_credential_cap() {
    let mut conventions = conventions(Some("team"));
    conventions.max_credentials_per_tenant = Some(1);
    let mut index = Index::new(conventions, &[String::new()]);
    let capped = |name: &str, team: &str, cap: Option<&str>| {
        let annotations = match cap {
            Some(cap) => json!({MAX_CREDENTIALS_ANNOTATION: cap}),
            None => json!({}),
        };
        serde_json::from_value::<Namespace>(json!({"metadata": {
            "name": name, "labels": {"team": team}, "annotations": annotations,
        }}))
        .unwrap()
    };
    // Each Secret asks for no cap itself, which sets nothing: the cap is
    // the platform's, on Namespaces.
    let three = |ns: &str| -> Vec<Secret> {
        (1..=3)
            .map(|i| {
                let data = json!({"username": b64(&format!("{ns}-{i}")), "password": b64("pw")});
                let annotations = json!({MAX_CREDENTIALS_ANNOTATION: "0"});
                secret(
                    ns,
                    &format!("s{i}"),
                    "2026-01-01T00:00:00Z",
                    data,
                    annotations,
                )
            })
            .collect()
    };
    synced(
        &mut index,
        vec![
            capped("raised", "raised", Some("3")),
            capped("none", "none", Some("0")),
            // Three namespaces of one tenant: 2, 5 and 0 give 2.
            capped("two", "two", Some("2")),
            capped("two-again", "two", Some("5")),
            capped("two-more", "two", Some(" 0 ")),
            capped("typo", "typo", Some("3 credentials")),
            capped("default", "default", None),
        ],
        ["raised", "none", "two", "typo", "default"]
            .into_iter()
            .flat_map(three)
            .collect(),
    );
    let desired = index.desired();
    let held = |tenant| users(&desired, tenant).len();
    assert_eq!(held("raised"), 3);
    assert_eq!(held("none"), 3);
    assert_eq!(held("two"), 2);
    assert_eq!(held("typo"), 1);
    assert_eq!(held("default"), 1);
    let over = desired
        .skipped
        .iter()
        .filter(|(_, reason)| *reason == SkipReason::TooManyCredentials)
        .count();
    assert_eq!(over, 1 + 2 + 2);
    assert_eq!(
        desired.invalid_limits.len(),
        1,
        "{:?}",
        desired.invalid_limits
    );
    let (namespace, why) = &desired.invalid_limits[0];
    assert_eq!(namespace, "typo");
    assert!(why.contains(MAX_CREDENTIALS_ANNOTATION), "{why}");
}

/// With the rule, a username names its tenant after `@`: a tenant's
/// Secret cannot hold a name that another tenant's Secrets could use, even
/// an older one, and the name a namespace's tenant is, with a tenant
/// label, is that label's value.
#[test]
fn usernames_that_must_name_their_tenant_cannot_be_taken_by_another() {
    let mut conventions = conventions(Some("team"));
    conventions.usernames_name_their_tenant = true;
    let mut index = Index::new(conventions, &[String::new()]);
    let made = |ns: &str, name: &str, created: &str, user: &str| {
        secret(
            ns,
            name,
            created,
            json!({"username": b64(user), "password": b64("pw")}),
            json!({}),
        )
    };
    synced(
        &mut index,
        vec![
            namespace("a-prod", json!({"team": "a"})),
            namespace("b-prod", json!({"team": "b"})),
        ],
        vec![
            // a's, older, squatting on a name of b's.
            made("a-prod", "squat", "2025-01-01T00:00:00Z", "grafana@b"),
            made("a-prod", "own", "2026-01-01T00:00:00Z", "grafana@a"),
            made("b-prod", "own", "2026-01-01T00:00:00Z", "grafana@b"),
            made("b-prod", "bare", "2026-01-01T00:00:00Z", "grafana"),
            made(
                "b-prod",
                "namespace",
                "2026-01-01T00:00:00Z",
                "grafana@b-prod",
            ),
            made("b-prod", "nameless", "2026-01-01T00:00:00Z", "@b"),
        ],
    );
    let desired = index.desired();
    assert_eq!(users(&desired, "a"), ["grafana@a"]);
    assert_eq!(users(&desired, "b"), ["grafana@b"]);
    let mut skipped = skip_reasons(&desired);
    skipped.sort();
    assert_eq!(
        skipped,
        [
            ("bare", SkipReason::UsernameNotOfTenant),
            ("nameless", SkipReason::UsernameNotOfTenant),
            ("namespace", SkipReason::UsernameNotOfTenant),
            ("squat", SkipReason::UsernameNotOfTenant),
        ]
    );
}

#[test]
fn invalid_secrets_are_skipped_with_a_reason_and_break_nothing_else() {
    let mut index = Index::new(conventions(None), &[String::new()]);
    let hash = tenant_proxy::auth::password::hash_password("pw").unwrap();
    let cases = vec![
        secret(
            "a",
            "no-user",
            "2026-01-01T00:00:00Z",
            json!({"password": b64("p")}),
            json!({}),
        ),
        secret(
            "a",
            "colon",
            "2026-01-01T00:00:00Z",
            json!({"username": b64("a:b"), "password": b64("p")}),
            json!({}),
        ),
        secret(
            "a",
            "long-user",
            "2026-01-01T00:00:00Z",
            json!({"username": b64(&"u".repeat(257)), "password": b64("p")}),
            json!({}),
        ),
        secret(
            "a",
            "no-pass",
            "2026-01-01T00:00:00Z",
            json!({"username": b64("x")}),
            json!({}),
        ),
        // Kubernetes keeps a key set to "": no password, as without one.
        secret(
            "a",
            "empty-pass",
            "2026-01-01T00:00:00Z",
            json!({"username": b64("v"), "password": ""}),
            json!({}),
        ),
        secret(
            "a",
            "latin1-pass",
            "2026-01-01T00:00:00Z",
            json!({"username": b64("w"), "password": b64_bytes(b"caf\xe9")}),
            json!({}),
        ),
        secret(
            "a",
            "bad-hash",
            "2026-01-01T00:00:00Z",
            json!({"username": b64("y"), "password-hash": b64("$2b$bcrypt")}),
            json!({}),
        ),
        secret(
            "a",
            "bad-scopes",
            "2026-01-01T00:00:00Z",
            json!({"username": b64("z"), "password": b64("p")}),
            json!({"tenant-proxy/scopes": "logs:admin"}),
        ),
        secret(
            "a",
            "hashed",
            "2026-01-01T00:00:00Z",
            json!({"username": b64("hashed-user"), "password-hash": b64(&hash)}),
            json!({"tenant-proxy/scopes": "logs:write, metrics:write"}),
        ),
    ];
    synced(&mut index, vec![namespace("a", json!({}))], cases);
    let desired = index.desired();
    let reasons = skip_reasons(&desired);
    assert_eq!(
        reasons,
        [
            ("bad-hash", SkipReason::InvalidPasswordHash),
            ("bad-scopes", SkipReason::InvalidScopes),
            ("colon", SkipReason::InvalidUsername),
            ("empty-pass", SkipReason::MissingPassword),
            ("latin1-pass", SkipReason::InvalidPassword),
            ("long-user", SkipReason::InvalidUsername),
            ("no-pass", SkipReason::MissingPassword),
            ("no-user", SkipReason::MissingUsername),
        ]
    );
    let user = &desired.tenants[&TenantId::parse("a").unwrap()].users[0];
    assert_eq!(user.credential.username, "hashed-user");
    assert_eq!(user.credential.password, Password::Hashed(hash));
    assert_eq!(
        user.credential.scopes,
        Some(vec![Scope::LogsWrite, Scope::MetricsWrite])
    );
}

#[test]
fn a_selector_annotation_restricts_a_read_only_credential_and_is_refused_on_a_pusher() {
    let mut index = Index::new(conventions(None), &[String::new()]);
    let with = |name: &str, user: &str, annotations: serde_json::Value| {
        secret(
            "a",
            name,
            "2026-01-01T00:00:00Z",
            json!({"username": b64(user), "password": b64("p")}),
            annotations,
        )
    };
    let cases = vec![
        with(
            "narrow",
            "narrow",
            json!({"tenant-proxy/scopes": "logs:read", "tenant-proxy/selector": "{app = 'pay'}"}),
        ),
        with(
            "pusher",
            "pusher",
            json!({"tenant-proxy/selector": r#"{app="pay"}"#}),
        ),
        with(
            "garbage",
            "garbage",
            json!({"tenant-proxy/scopes": "logs:read", "tenant-proxy/selector": "rate(x[5m])"}),
        ),
    ];
    synced(&mut index, vec![namespace("a", json!({}))], cases);
    let desired = index.desired();
    let reasons = skip_reasons(&desired);
    assert_eq!(
        reasons,
        [
            ("garbage", SkipReason::InvalidSelector),
            ("pusher", SkipReason::InvalidSelector),
        ]
    );
    let user = &desired.tenants[&TenantId::parse("a").unwrap()].users[0];
    assert_eq!(
        user.credential.selector.as_deref(),
        Some(r#"{app="pay"}"#),
        "normalised"
    );
}

#[test]
fn secrets_of_another_type_are_skipped() {
    let mut s = basic("a", "opaque", "u", "p");
    s.type_ = Some("Opaque".into());
    assert_eq!(
        read_secret(&s, &conventions(None)).credential,
        Err(SkipReason::WrongType)
    );
}

#[test]
fn passwords_never_show_in_debug_output() {
    let entry = read_secret(&basic("a", "s", "u", "hunter2"), &conventions(None));
    let shown = format!("{entry:?}");
    assert!(!shown.contains("hunter2"));
    // Which kind of password it is still shows.
    assert!(shown.contains("password: Plain(**REDACTED**)"), "{shown}");
}

#[test]
fn per_namespace_secret_watches_must_all_finish_listing() {
    let scopes = vec!["a".to_string(), "b".to_string()];
    let mut index = Index::new(conventions(None), &scopes);
    index.namespace_event(Event::Init);
    index.namespace_event(Event::InitApply(namespace("a", json!({}))));
    index.namespace_event(Event::InitApply(namespace("b", json!({}))));
    index.namespace_event(Event::InitDone);
    index.secret_event("a", Event::Init);
    index.secret_event("a", Event::InitApply(basic("a", "s", "ua", "p")));
    index.secret_event("a", Event::InitDone);
    assert!(!index.is_synced(), "b has not listed yet");
    index.secret_event("b", Event::Init);
    index.secret_event("b", Event::InitApply(basic("b", "s", "ub", "p")));
    index.secret_event("b", Event::InitDone);
    assert!(index.is_synced());
    // A re-list of one namespace's watch leaves the other's Secrets alone.
    index.secret_event("a", Event::Init);
    index.secret_event("a", Event::InitDone);
    let desired = index.desired();
    assert_eq!(users(&desired, "b"), ["ub"]);
    assert!(!desired.tenants.contains_key(&TenantId::parse("a").unwrap()));
}

#[test]
fn write_scopes_for_rules_alerts_and_deletes_come_only_from_the_annotation() {
    use tenant_proxy::tenants::Scopes;
    let granted = parse_scopes("rules:read, rules:write,alerts:write,logs:delete").unwrap();
    assert_eq!(
        granted,
        [
            Scope::RulesRead,
            Scope::RulesWrite,
            Scope::AlertsWrite,
            Scope::LogsDelete
        ]
    );
    for write in [Scope::RulesWrite, Scope::AlertsWrite, Scope::LogsDelete] {
        assert!(
            !Scopes::default_set().contains(write),
            "{write} without an annotation"
        );
    }
    assert_eq!(
        parse_scopes("rules:admin"),
        None,
        "an unknown scope skips the Secret"
    );
}

/// A namespace of `tenant` with one annotation.
fn annotated_with(name: &str, tenant: &str, key: &str, value: &str) -> Namespace {
    serde_json::from_value(json!({"metadata": {
        "name": name,
        "labels": {"example.com/tenant": tenant},
        "annotations": {key: value},
    }}))
    .unwrap()
}

fn annotated(name: &str, tenant: &str, limits: &str) -> Namespace {
    annotated_with(name, tenant, LIMITS_ANNOTATION, limits)
}

#[test]
fn namespace_limits_take_the_strictest_value_per_field_and_skip_invalid_ones() {
    let mut index = Index::new(conventions(Some("example.com/tenant")), &[String::new()]);
    synced(
        &mut index,
        vec![
            annotated(
                "shop-prod",
                "shop",
                r#"{"push": {"bytes_per_second": 1048576}, "query": {"requests_per_second": 5, "concurrency": 2}}"#,
            ),
            annotated(
                "shop-dev",
                "shop",
                r#"{"query": {"requests_per_second": 20, "concurrency": 1}}"#,
            ),
            annotated(
                "blog",
                "blog",
                r#"{"query": {"requests_per_second": "fast"}}"#,
            ),
            annotated("wiki", "wiki", r#"{"query": {"bytes_per_second": 10}}"#),
            annotated("docs", "docs", r#"{"query": {"rps": 1}}"#),
        ],
        vec![
            basic("shop-dev", "s", "shop-user", "p"),
            basic("blog", "s", "blog-user", "p"),
            basic("wiki", "s", "wiki-user", "p"),
            basic("docs", "s", "docs-user", "p"),
        ],
    );
    let desired = index.desired();
    let shop = desired.tenants[&TenantId::parse("shop").unwrap()]
        .limits
        .unwrap();
    let query = shop.query.unwrap();
    assert_eq!((query.requests_per_second, query.concurrency), (5.0, 1));
    assert_eq!(shop.push.unwrap().bytes_per_second, 1_048_576);
    // Invalid annotations are left out, with why; their tenants keep the
    // config's defaults and their credentials.
    let invalid: Vec<&str> = desired
        .invalid_limits
        .iter()
        .map(|(ns, _)| ns.as_str())
        .collect();
    assert_eq!(invalid, ["blog", "docs", "wiki"]);
    assert!(
        desired.invalid_limits[2].1.contains("push only"),
        "{:?}",
        desired.invalid_limits
    );
    for tenant in ["blog", "docs", "wiki"] {
        assert_eq!(
            desired.tenants[&TenantId::parse(tenant).unwrap()].limits,
            None
        );
        assert_eq!(users(&desired, tenant).len(), 1);
    }
    // The file carries them; the proxy reads back what was meant.
    let hash = tenant_proxy::auth::password::hash_password("p").unwrap();
    let mut resolved = crate::hashes::Resolved {
        hashes: desired
            .tenants
            .values()
            .flat_map(|t| &t.users)
            .map(|u| (u.source.clone(), hash.clone()))
            .collect(),
        pending: Default::default(),
    };
    let text = crate::render::render(&desired, &resolved).unwrap();
    let (store, _) = tenant_proxy::tenants::file::parse(&text, 1).unwrap();
    assert_eq!(store.tenant("shop").unwrap().limits, Some(shop));
    assert_eq!(store.tenant("blog").unwrap().limits, None);

    // A user whose password is still to be hashed is left out, and so is a
    // tenant left without users; the others are as before.
    for user in &desired.tenants[&TenantId::parse("blog").unwrap()].users {
        resolved.hashes.remove(&user.source);
        resolved.pending.insert(user.source.clone());
    }
    let text = crate::render::render(&desired, &resolved).unwrap();
    let (store, _) = tenant_proxy::tenants::file::parse(&text, 1).unwrap();
    assert!(store.tenant("blog").is_none());
    assert_eq!(store.tenant("shop").unwrap().limits, Some(shop));
}

/// `--grantable-scopes`: the cap of every Namespace without an annotation
/// of its own; an annotation, narrower or wider, decides where present.
#[test]
fn grantable_scopes_cap_the_namespaces_that_set_none() {
    let mut conventions = conventions(Some("example.com/tenant"));
    conventions.default_grantable = Some([Scope::LogsRead, Scope::LogsWrite].into_iter().collect());
    let mut index = Index::new(conventions, &[String::new()]);
    let asks = |scopes: &str| json!({"tenant-proxy/scopes": scopes});
    synced(
        &mut index,
        vec![
            namespace("shop-prod", json!({"example.com/tenant": "shop"})),
            capped("shop-ops", "shop", "logs:read,logs:delete"),
        ],
        vec![
            scoped("shop-prod", "pusher", "prod-pusher", asks("logs:write")),
            scoped("shop-prod", "deleter", "prod-deleter", asks("logs:delete")),
            // The default set (metrics, rules and alerts reads) is beyond it.
            scoped("shop-prod", "default", "prod-default", json!({})),
            scoped("shop-ops", "deleter", "ops-deleter", asks("logs:delete")),
            scoped("shop-ops", "pusher", "ops-pusher", asks("logs:write")),
        ],
    );
    let desired = index.desired();
    assert_eq!(users(&desired, "shop"), ["ops-deleter", "prod-pusher"]);
    assert_eq!(
        skip_reasons(&desired),
        [
            ("pusher", SkipReason::ScopeNotGrantable),
            ("default", SkipReason::ScopeNotGrantable),
            ("deleter", SkipReason::ScopeNotGrantable),
        ]
    );
}

fn capped(name: &str, tenant: &str, grantable: &str) -> Namespace {
    annotated_with(name, tenant, GRANTABLE_SCOPES_ANNOTATION, grantable)
}

fn scoped(ns: &str, name: &str, user: &str, annotations: serde_json::Value) -> Secret {
    let data = json!({"username": b64(user), "password": b64("p")});
    secret(ns, name, "2026-01-01T00:00:00Z", data, annotations)
}

#[test]
fn a_namespace_caps_the_scopes_its_secrets_may_grant() {
    let mut index = Index::new(conventions(Some("example.com/tenant")), &[String::new()]);
    let asks = |scopes: &str| json!({"tenant-proxy/scopes": scopes});
    synced(
        &mut index,
        vec![
            capped("shop-dev", "shop", "logs:read, logs:write"),
            namespace("shop-prod", json!({"example.com/tenant": "shop"})),
            capped("blog", "blog", "logs:read,rules:admin"),
        ],
        vec![
            scoped("shop-dev", "pusher", "dev-pusher", asks("logs:write")),
            // The default set holds metrics:read and more: beyond the cap.
            scoped("shop-dev", "default", "dev-default", json!({})),
            // A Secret cannot lift its Namespace's cap by annotating itself.
            scoped(
                "shop-dev",
                "deleter",
                "dev-deleter",
                json!({"tenant-proxy/scopes": "logs:delete", GRANTABLE_SCOPES_ANNOTATION: "logs:delete"}),
            ),
            // Another namespace of the tenant, without a cap: any scope.
            scoped("shop-prod", "deleter", "prod-deleter", asks("logs:delete")),
            // A cap that cannot be read grants nothing.
            scoped("blog", "reader", "blog-reader", asks("logs:read")),
        ],
    );
    let desired = index.desired();
    assert_eq!(users(&desired, "shop"), ["dev-pusher", "prod-deleter"]);
    assert!(!desired
        .tenants
        .contains_key(&TenantId::parse("blog").unwrap()));
    // Reported once per Namespace, with the value that could not be read.
    assert_eq!(desired.invalid_caps.len(), 1);
    assert_eq!(desired.invalid_caps[0].0, "blog");
    assert!(desired.invalid_caps[0].1.contains("rules:admin"));
    assert_eq!(
        skip_reasons(&desired),
        [
            ("reader", SkipReason::ScopeNotGrantable),
            ("default", SkipReason::ScopeNotGrantable),
            ("deleter", SkipReason::ScopeNotGrantable),
        ]
    );
    // A refused Secret does not hold its username: a newer one may take it.
    let mut index = Index::new(conventions(Some("example.com/tenant")), &[String::new()]);
    let newer = secret(
        "shop-dev",
        "newer",
        "2026-02-01T00:00:00Z",
        json!({"username": b64("dev"), "password": b64("p")}),
        asks("logs:read"),
    );
    synced(
        &mut index,
        vec![capped("shop-dev", "shop", "logs:read")],
        vec![
            scoped("shop-dev", "older", "dev", asks("logs:delete")),
            newer,
        ],
    );
    let desired = index.desired();
    assert_eq!(users(&desired, "shop"), ["dev"]);
    assert_eq!(
        desired.tenants[&TenantId::parse("shop").unwrap()].users[0]
            .source
            .1,
        "newer"
    );
}

#[test]
fn the_first_ready_replica_by_pod_name_speaks_for_them_all() {
    let slice = |pods: serde_json::Value| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "tenant-proxy-x"},
            "addressType": "IPv4",
            "endpoints": pods,
        }))
        .unwrap()
    };
    let pod = |name: &str, ready: bool| {
        json!({"addresses": ["10.0.0.1"], "conditions": {"ready": ready},
               "targetRef": {"kind": "Pod", "name": name}})
    };
    let mut index = Index::new(conventions(None), &[String::new()]);
    // Replicas not counted: each speaks.
    assert!(index.speaks_for_replicas(Some("proxy-b")));
    index = index.counting_peers();
    // None ready yet, or an unknown pod name: each speaks.
    assert!(index.speaks_for_replicas(Some("proxy-b")));
    index.peers_event(Event::Apply(slice(json!([
        pod("proxy-b", true),
        pod("proxy-c", true),
        pod("proxy-a", false),
    ]))));
    assert!(index.speaks_for_replicas(None));
    assert!(index.speaks_for_replicas(Some("proxy-b")));
    assert!(!index.speaks_for_replicas(Some("proxy-c")));
    // Not ready itself, with a ready replica: that one speaks.
    assert!(!index.speaks_for_replicas(Some("proxy-a")));
}
