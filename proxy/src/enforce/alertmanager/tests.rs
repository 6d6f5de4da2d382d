use super::*;
use proptest::prelude::*;

fn owned() -> Vec<String> {
    vec!["team-a".into(), "team-a-2".into()]
}

fn tenant(owned: &[String]) -> TenantAlerts<'_> {
    TenantAlerts {
        label: "namespace",
        owned,
    }
}

fn matcher(name: &str, value: &str, is_regex: bool, is_equal: bool) -> Matcher {
    Matcher {
        name: name.into(),
        value: value.into(),
        is_regex,
        is_equal,
    }
}

fn silence(matchers: Value) -> Vec<u8> {
    serde_json::json!({
        "matchers": matchers,
        "startsAt": "2026-11-30T00:00:00Z",
        "endsAt": "2026-11-30T01:00:00Z",
        "createdBy": "a",
        "comment": "c",
    })
    .to_string()
    .into_bytes()
}

#[test]
fn the_filter_pins_the_label_to_owned_values() {
    let owned = owned();
    assert_eq!(tenant(&owned).filter(), r#"namespace=~"team-a|team-a-2""#);
    let odd = vec![r#"a.b"c"#.to_string()];
    assert_eq!(tenant(&odd).filter(), r#"namespace=~"a\\.b\"c""#);
    let query = with_filter(
        Some("active=true&filter=alertname%3D%22X%22"),
        &tenant(&owned),
    );
    let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    assert_eq!(
        pairs,
        [
            ("active".into(), "true".into()),
            ("filter".into(), r#"alertname="X""#.into()),
            ("filter".into(), r#"namespace=~"team-a|team-a-2""#.into()),
        ]
    );
}

#[test]
fn a_silence_without_the_label_gets_the_pin_and_a_foreign_one_is_refused() {
    let owned = owned();
    let t = tenant(&owned);
    let added = rewrite_silence(
        &silence(serde_json::json!([
            {"name": "alertname", "value": "X", "isRegex": false}
        ])),
        &t,
    )
    .unwrap();
    assert_eq!(
        added.matchers,
        [
            matcher("alertname", "X", false, true),
            matcher("namespace", "team-a|team-a-2", true, true)
        ]
    );
    for kept in [
        serde_json::json!([{"name": "namespace", "value": "team-a", "isRegex": false}]),
        serde_json::json!([{"name": "namespace", "value": "team-a-2|team-a", "isRegex": true, "isEqual": true}]),
    ] {
        let out = rewrite_silence(&silence(kept.clone()), &t).unwrap();
        assert_eq!(out.matchers.len(), 1, "{kept}");
    }
    for refused in [
        serde_json::json!([{"name": "namespace", "value": "team-b", "isRegex": false}]),
        serde_json::json!([{"name": "namespace", "value": "team-a", "isRegex": false, "isEqual": false}]),
        serde_json::json!([{"name": "namespace", "value": "team-.*", "isRegex": true}]),
        serde_json::json!([{"name": "namespace", "value": "team-a|team-b", "isRegex": true}]),
        serde_json::json!([
            {"name": "namespace", "value": "team-a", "isRegex": false},
            {"name": "namespace", "value": "team-b", "isRegex": false}
        ]),
    ] {
        assert!(
            matches!(
                rewrite_silence(&silence(refused.clone()), &t),
                Err(ProxyError::Foreign(_))
            ),
            "{refused}"
        );
    }
}

/// One value is pinned as an equality (what Grafana's silence form shows
/// as `namespace = team-a`), several as an anchored alternation.
#[test]
fn a_single_value_is_pinned_as_an_equality() {
    let one = vec!["team-a".to_string()];
    let added = rewrite_silence(&silence(serde_json::json!([])), &tenant(&one)).unwrap();
    assert_eq!(
        added.matchers,
        [matcher("namespace", "team-a", false, true)]
    );
}

/// A regex pins only values written literally: an owned value holding a
/// metacharacter, written unescaped, matches more than that value.
#[test]
fn a_regex_pins_only_owned_values_written_literally() {
    let owned = vec!["team.a".to_string(), "team_b".to_string()];
    let t = tenant(&owned);
    let regex = |value: &str| matcher("namespace", value, true, true);
    for pinned in [r"team\.a|team_b", "team_b"] {
        assert!(t.pins(&regex(pinned)), "{pinned}");
    }
    // `team.a` also matches `teamXa`, another tenant's namespace perhaps.
    for loose in ["team.a", "team_b|team.a"] {
        assert!(!t.pins(&regex(loose)), "{loose}");
    }
    assert!(t.pins(&matcher("namespace", "team.a", false, true)));
}

/// A silence Alertmanager answers with is the tenant's only when one of
/// its matchers pins the label; an answer that cannot be read is refused
/// (an update or delete then never reaches Alertmanager).
#[test]
fn a_silence_read_back_is_owned_only_when_it_pins_the_label() {
    let owned = owned();
    let t = tenant(&owned);
    let gettable = |matchers: Value| {
        let mut body: Value = serde_json::from_slice(&silence(matchers)).unwrap();
        body["id"] = Value::from("6f1c2a9e-3b1d-4c8e-9a7f-0d2b5e8c1f34");
        body["status"] = serde_json::json!({"state": "active"});
        body.to_string().into_bytes()
    };
    let ours = gettable(serde_json::json!([
        {"name": "alertname", "value": "X", "isRegex": false, "isEqual": true},
        {"name": "namespace", "value": "team-a-2", "isRegex": false, "isEqual": true}
    ]));
    assert!(silence_is_owned(&ours, &t).unwrap());
    for theirs in [
        serde_json::json!([{"name": "namespace", "value": "team-b", "isRegex": false, "isEqual": true}]),
        serde_json::json!([{"name": "alertname", "value": "X", "isRegex": false, "isEqual": true}]),
        serde_json::json!([]),
        serde_json::json!("not matchers"),
    ] {
        assert!(
            !silence_is_owned(&gettable(theirs.clone()), &t).unwrap(),
            "{theirs}"
        );
    }
    assert!(matches!(
        silence_is_owned(b"<html>", &t),
        Err(ProxyError::UpstreamUnavailable(_))
    ));
}

#[test]
fn a_silence_id_is_only_ever_a_uuid_shaped_path_segment() {
    let owned = owned();
    let t = tenant(&owned);
    let with_id = |id: &str| {
        let mut body: Value = serde_json::from_slice(&silence(serde_json::json!([]))).unwrap();
        body["id"] = Value::from(id);
        rewrite_silence(body.to_string().as_bytes(), &t)
    };
    assert!(with_id("6f1c2a9e-3b1d-4c8e-9a7f-0d2b5e8c1f34").is_ok());
    for bad in ["../../-/reload", "a/b", "x?y=1", "x#y", "", "a b", "%2e%2e"] {
        assert!(
            matches!(with_id(bad), Err(ProxyError::BadData(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn a_silence_alertmanager_could_read_differently_is_refused() {
    let owned = owned();
    let t = tenant(&owned);
    // Go's decoder matches names case-insensitively and keeps the last of
    // two keys: neither shape may carry a second set of matchers past us.
    let pinned = r#"[{"name":"namespace","value":"team-a","isRegex":false}]"#;
    let foreign = r#"[{"name":"namespace","value":"team-b","isRegex":false}]"#;
    for body in [
        format!(
            r#"{{"matchers":{pinned},"Matchers":{foreign},"startsAt":"","endsAt":"","createdBy":"","comment":""}}"#
        ),
        format!(
            r#"{{"matchers":{pinned},"matchers":{foreign},"startsAt":"","endsAt":"","createdBy":"","comment":""}}"#
        ),
        r#"{"matchers":[{"name":"namespace","value":"team-a","isRegex":false,"Value":"team-b"}],"startsAt":"","endsAt":"","createdBy":"","comment":""}"#.to_string(),
    ] {
        let result = rewrite_silence(body.as_bytes(), &t);
        assert!(
            matches!(result, Err(ProxyError::BadData(_))),
            "{body}: {result:?}"
        );
    }
}

#[test]
fn answers_keep_only_the_tenants_alerts_silences_and_no_configuration() {
    let owned = owned();
    let t = tenant(&owned);
    let alerts =
        r#"[{"labels":{"namespace":"team-a"}},{"labels":{"namespace":"team-b"}},{"labels":{}}]"#;
    let out: Value = serde_json::from_slice(
        &filter_answer(alerts.as_bytes(), AnswerFilter::Alerts, &t).unwrap(),
    )
    .unwrap();
    assert_eq!(out.as_array().unwrap().len(), 1);

    let groups = r#"[{"labels":{},"alerts":[{"labels":{"namespace":"team-a"}},{"labels":{"namespace":"team-b"}}]},
                     {"labels":{},"alerts":[{"labels":{"namespace":"team-b"}}]}]"#;
    let out: Value = serde_json::from_slice(
        &filter_answer(groups.as_bytes(), AnswerFilter::AlertGroups, &t).unwrap(),
    )
    .unwrap();
    assert_eq!(out.as_array().unwrap().len(), 1);
    assert_eq!(out[0]["alerts"].as_array().unwrap().len(), 1);

    let silences = r#"[{"id":"1","matchers":[{"name":"namespace","value":"team-a","isRegex":false}]},
                       {"id":"2","matchers":[{"name":"namespace","value":"team-b","isRegex":false}]},
                       {"id":"3","matchers":[{"name":"alertname","value":"X","isRegex":false}]}]"#;
    let out: Value = serde_json::from_slice(
        &filter_answer(silences.as_bytes(), AnswerFilter::Silences, &t).unwrap(),
    )
    .unwrap();
    assert_eq!(out.as_array().unwrap().len(), 1);
    assert_eq!(out[0]["id"], "1");

    let status = r#"{"cluster":{"status":"ready"},"config":{"original":"receivers: [{webhook_configs: [{url: http://secret}]}]"}}"#;
    let out = filter_answer(status.as_bytes(), AnswerFilter::Status, &t).unwrap();
    assert!(!String::from_utf8_lossy(&out).contains("secret"));
    for odd in ["not json", "{}", r#"[{"labels":{}}]"#] {
        assert!(filter_answer(odd.as_bytes(), AnswerFilter::AlertGroups, &t).is_err());
    }
}

fn matcher_strategy() -> impl Strategy<Value = Matcher> {
    let name = prop::sample::select(vec!["namespace", "alertname", "Namespace"]);
    let value = prop::sample::select(vec![
        "team-a",
        "team-a-2",
        "team-b",
        "team-a|team-b",
        "team-a|team-a-2",
        ".*",
        "",
        "team-a.*",
    ]);
    (name, value, any::<bool>(), any::<bool>()).prop_map(|(n, v, r, e)| matcher(n, v, r, e))
}

/// The labels an alert could carry, for the escape property.
fn namespace_values() -> Vec<Option<&'static str>> {
    vec![
        Some("team-a"),
        Some("team-a-2"),
        Some("team-b"),
        Some(""),
        None,
    ]
}

/// Alertmanager's reading of one matcher on an alert's labels.
fn am_matches(m: &Matcher, labels: &std::collections::HashMap<&str, &str>) -> bool {
    let value = labels.get(m.name.as_str()).copied().unwrap_or("");
    let hit = if m.is_regex {
        regex::Regex::new(&format!("^(?:{})$", m.value)).is_ok_and(|r| r.is_match(value))
    } else {
        value == m.value
    };
    hit == m.is_equal
}

proptest! {
    /// Whatever matchers a tenant sends, a silence that is accepted only
    /// ever silences alerts whose tenant label is one of the tenant's
    /// values, under Alertmanager's own reading of the matchers; and the
    /// silence is listed back to its tenant.
    #[test]
    fn an_accepted_silence_silences_only_the_tenants_alerts(
        matchers in prop::collection::vec(matcher_strategy(), 0..4),
    ) {
        let owned = owned();
        let t = tenant(&owned);
        let body = silence(serde_json::to_value(&matchers).unwrap());
        if let Ok(accepted) = rewrite_silence(&body, &t) {
            prop_assert!(t.owns_silence(&accepted.matchers));
            for namespace in namespace_values() {
                let mut labels = std::collections::HashMap::from([("alertname", "X")]);
                if let Some(ns) = namespace {
                    labels.insert("namespace", ns);
                }
                let silenced = accepted.matchers.iter().all(|m| am_matches(m, &labels));
                prop_assert!(
                    !silenced || namespace.is_some_and(|ns| owned.iter().any(|o| o == ns)),
                    "{accepted:?} silences {labels:?}"
                );
            }
        }
    }
}
