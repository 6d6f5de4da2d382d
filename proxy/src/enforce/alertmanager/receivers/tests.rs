use super::*;

/// A routing tree as Alertmanager 0.25 prints it in its status (the
/// `matchers` of each route in its own spelling; trimmed of the global
/// section and the receivers' settings).
const PRINTED: &str = r#"route:
  receiver: platform
  group_by:
  - namespace
  continue: false
  routes:
  - receiver: team-a-slack
    matchers:
    - namespace="team-a"
    - severity=~"crit|warn"
    continue: false
  - receiver: team-a-2-pager
    match:
      namespace: team-a-2
    continue: false
  - receiver: bc-shared
    match_re:
      namespace: team-b|team-c
    continue: false
    routes:
    - matchers:
      - severity="critical"
      continue: true
    - receiver: bc-pager
      matchers:
      - alertname="x\"y"
      continue: false
  - receiver: not-a
    matchers:
    - namespace!="team-a"
    - namespace!~"team-a-.*"
    continue: false
  - receiver: everyone-critical
    matchers:
    - severity="critical"
    continue: false
receivers:
- name: platform
- name: team-a-slack
  webhook_configs:
  - url: http://127.0.0.1:9/a
- name: team-a-2-pager
- name: bc-shared
- name: bc-pager
- name: not-a
- name: everyone-critical
templates: []
"#;

fn status(original: &str) -> Vec<u8> {
    serde_json::json!({"cluster": {"status": "ready"}, "config": {"original": original}})
        .to_string()
        .into_bytes()
}

fn listed(original: &str, owned: &[&str]) -> Vec<String> {
    let owned: Vec<String> = owned.iter().map(|v| (*v).to_owned()).collect();
    let tenant = TenantAlerts {
        label: "namespace",
        owned: &owned,
    };
    let answer = tenant_receivers(&status(original), &tenant).unwrap();
    let names: Vec<Value> = serde_json::from_slice(&answer).unwrap();
    names
        .iter()
        .map(|r| {
            assert_eq!(r.as_object().unwrap().len(), 1, "names only: {r}");
            r["name"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn a_tenant_is_shown_the_receivers_its_alerts_can_reach_in_the_configurations_order() {
    assert_eq!(
        listed(PRINTED, &["team-a", "team-a-2"]),
        [
            "platform",
            "team-a-slack",
            "team-a-2-pager",
            "everyone-critical"
        ]
    );
    // `bc-pager`'s matcher is on another label, which may take anything.
    assert_eq!(
        listed(PRINTED, &["team-b"]),
        [
            "platform",
            "bc-shared",
            "bc-pager",
            "not-a",
            "everyone-critical"
        ]
    );
    // A value no route names reaches the catch-alls only.
    assert_eq!(
        listed(PRINTED, &["team-z"]),
        ["platform", "not-a", "everyone-critical"]
    );
}

#[test]
fn a_route_is_closed_to_the_tenant_when_any_matcher_above_it_refuses_its_values() {
    let nested = r#"route:
  receiver: root
  routes:
  - receiver: team-b-router
    matchers:
    - namespace="team-b"
    routes:
    - receiver: under-b
      matchers:
      - namespace=~"team-.*"
"#;
    let with_receivers =
        format!("{nested}receivers:\n- name: root\n- name: team-b-router\n- name: under-b\n");
    // `under-b` alone would take team-a's alerts; its parent does not.
    assert_eq!(listed(&with_receivers, &["team-a"]), ["root"]);
    assert_eq!(
        listed(&with_receivers, &["team-b"]),
        ["root", "team-b-router", "under-b"]
    );
}

#[test]
fn a_matcher_not_read_here_closes_its_route_and_those_under_it() {
    let config = |matcher: &str| {
        format!(
            "route:\n  receiver: root\n  routes:\n  - receiver: odd\n    matchers:\n    - \
             '{matcher}'\n    routes:\n    - receiver: below\nreceivers:\n- name: root\n- \
             name: odd\n- name: below\n"
        )
    };
    // Read: a route open to team-a.
    assert_eq!(
        listed(&config(r#"namespace=~"team-a|x""#), &["team-a"]),
        ["root", "odd", "below"]
    );
    for unread in [
        // RE2's `\Q…\E`, which the regex crate does not have.
        r#"namespace=~"\\Qteam-a\\E""#,
        // Not Alertmanager's printing: unquoted, single-quoted, no operator.
        "namespace=team-a",
        r#"namespace="team-a"x"#,
        "namespace",
        r#"="team-a""#,
        r#""namespace="team-a""#,
    ] {
        assert_eq!(listed(&config(unread), &["team-a"]), ["root"], "{unread}");
    }
    // A `match_re` value the regex crate cannot compile closes it too.
    let match_re = "route:\n  receiver: root\n  routes:\n  - receiver: odd\n    match_re:\n      \
                    namespace: '(team-a'\nreceivers:\n- name: root\n- name: odd\n";
    assert_eq!(listed(match_re, &["team-a"]), ["root"]);
}

#[test]
fn matchers_are_read_as_alertmanager_prints_them() {
    let read = |text: &str| RouteMatcher::parse(text);
    let m = |name: &str, op, value: &str| {
        Some(RouteMatcher {
            name: name.into(),
            op,
            value: value.into(),
        })
    };
    assert_eq!(read(r#"namespace="a""#), m("namespace", Op::Equal, "a"));
    assert_eq!(read(r#"namespace!="a""#), m("namespace", Op::NotEqual, "a"));
    assert_eq!(
        read(r#"namespace=~"a|b""#),
        m("namespace", Op::Regex, "a|b")
    );
    assert_eq!(
        read(r#"namespace!~"a.*""#),
        m("namespace", Op::NotRegex, "a.*")
    );
    // OpenMetrics escapes (0.25's printing of every value).
    assert_eq!(
        read(r#"alertname="x\"y\\z\n""#),
        m("alertname", Op::Equal, "x\"y\\z\n")
    );
    // A name holding a reserved character is Go-quoted (0.27 and later).
    assert_eq!(
        read(r#""name with \"=\""="v""#),
        m("name with \"=\"", Op::Equal, "v")
    );
    assert_eq!(
        read(r#""k8s.namespace"!~"b""#),
        m("k8s.namespace", Op::NotRegex, "b")
    );
    assert_eq!(read(r#"namespace=="a""#), None);
    assert_eq!(read(r#"namespace="a"#), None);
    assert_eq!(read(r#""namespace"#), None);
}

#[test]
fn a_status_whose_configuration_cannot_be_read_is_refused() {
    let owned = vec!["team-a".to_owned()];
    let tenant = TenantAlerts {
        label: "namespace",
        owned: &owned,
    };
    for answer in [
        b"not json".to_vec(),
        br#"{"config": {}}"#.to_vec(),
        br#"{"config": {"original": ""}}"#.to_vec(),
        status("route: [not, a, route]\n"),
        status("receivers:\n- name: only\n"),
    ] {
        let refused = tenant_receivers(&answer, &tenant).unwrap_err();
        assert!(
            matches!(refused, ProxyError::UpstreamUnavailable(_)),
            "{refused:?}"
        );
    }
}
