use super::*;
use proptest::prelude::*;

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
    // An escape Go refuses, which promql-parser's unquoting panics on.
    assert_eq!(read("namespace=\"\\é\""), None);
    assert_eq!(read("\"\\日\"=\"v\""), None);
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

/// Alertmanager's `labels.Matcher.String`: a name holding a reserved
/// character (`isReserved`: white space or one of ``{}!=~,\"'` ``) and its
/// value Go-quoted (`strconv.Quote`); otherwise the name bare and the value
/// escaped the OpenMetrics way.
fn printed_by_alertmanager(name: &str, op: Op, value: &str) -> String {
    let op = match op {
        Op::Equal => "=",
        Op::NotEqual => "!=",
        Op::Regex => "=~",
        Op::NotRegex => "!~",
    };
    let reserved = |c: char| c.is_whitespace() || "{}!=~,\\\"'`".contains(c);
    if name.contains(reserved) {
        return format!("{}{op}{}", go_quote(name), go_quote(value));
    }
    let escaped = value
        .replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('"', "\\\"");
    format!("{name}{op}\"{escaped}\"")
}

/// Go's `strconv.Quote` for the characters the strategy below makes
/// (ASCII, and printable characters beyond it, which Go keeps as they are).
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if c.is_ascii_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Equal),
        Just(Op::NotEqual),
        Just(Op::Regex),
        Just(Op::NotRegex)
    ]
}

/// Text of the characters that matter to the printing: quotes, escapes,
/// operators, white space, control characters, and beyond ASCII.
fn text_strategy() -> impl Strategy<Value = String> {
    "[a-z_\"\\\\=!~{},'` \t\n\r\x01\x7féü日]{0,12}"
}

proptest! {
    /// Every matcher, however Alertmanager had to print it, reads back as
    /// the matcher it printed.
    #[test]
    fn a_matcher_reads_back_as_alertmanager_printed_it(
        name in text_strategy().prop_filter("a matcher has a name", |n| !n.is_empty()),
        op in op_strategy(),
        value in text_strategy(),
    ) {
        let printed = printed_by_alertmanager(&name, op, &value);
        prop_assert_eq!(
            RouteMatcher::parse(&printed),
            Some(RouteMatcher { name, op, value }),
            "{}", printed
        );
    }

    /// Reading any text at all gives a matcher or nothing, never a panic,
    /// and what it gives prints back as that text would have been printed.
    #[test]
    fn any_text_reads_as_a_matcher_or_none(text in "\\PC{0,24}|[a-z\"\\\\=!~]{0,12}") {
        if let Some(m) = RouteMatcher::parse(&text) {
            let again = printed_by_alertmanager(&m.name, m.op, &m.value);
            prop_assert_eq!(RouteMatcher::parse(&again), Some(m));
        }
    }
}
#[test]
fn a_tenant_is_shown_its_routes_with_only_its_own_values_on_the_label() {
    let config = r#"global:
  resolve_timeout: 5m
route:
  receiver: root
  group_by: [namespace]
  routes:
  - receiver: shared
    match:
      namespace: team-a
      severity: critical
    match_re:
      alertname: Disk.*
    group_interval: 10m
    continue: true
  - receiver: others
    matchers:
    - namespace!="team-a"
    - team="payments"
    active_time_intervals: [office]
  - receiver: b-only
    match_re:
      namespace: team-b|team-c
    mute_time_intervals: [b-nights]
receivers:
- name: root
- name: shared
  webhook_configs: [{url: "http://127.0.0.1:9/?token=t0ken"}]
- name: others
- name: b-only
time_intervals:
- name: office
  time_intervals: [{weekdays: [monday]}]
- name: b-nights
  time_intervals: [{times: [{start_time: "00:00", end_time: "06:00"}]}]
inhibit_rules:
- equal: [namespace]
templates: [x.tmpl]
"#;
    let owned = |values: &[&str]| values.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>();
    let shown = |values: &[String]| {
        let tenant = TenantAlerts {
            label: "namespace",
            owned: values,
        };
        let text = tenant_configuration(config, &tenant);
        serde_yaml_ng::from_str::<Yaml>(&text).unwrap()
    };
    let expected = |text: &str| serde_yaml_ng::from_str::<Yaml>(text).unwrap();
    // The label's matchers give way to one on the tenant's own values;
    // the other labels', grouping, timers and `continue` stay as they are.
    assert_eq!(
        shown(&owned(&["team-a", "team-d"])),
        expected(
            r#"route:
  receiver: root
  group_by: [namespace]
  routes:
  - receiver: shared
    continue: true
    group_interval: 10m
    match: {severity: critical}
    match_re: {alertname: Disk.*}
    matchers: ['namespace="team-a"']
  - receiver: others
    matchers: ['team="payments"', 'namespace="team-d"']
    active_time_intervals: [office]
receivers: [{name: root}, {name: shared}, {name: others}]
time_intervals:
- name: office
  time_intervals: [{weekdays: [monday]}]
"#
        )
    );
    assert_eq!(
        shown(&owned(&["team-b", "team-c"])),
        expected(
            r#"route:
  receiver: root
  group_by: [namespace]
  routes:
  - receiver: others
    matchers: ['team="payments"', 'namespace=~"team-b|team-c"']
    active_time_intervals: [office]
  - receiver: b-only
    matchers: ['namespace=~"team-b|team-c"']
    mute_time_intervals: [b-nights]
receivers: [{name: root}, {name: others}, {name: b-only}]
time_intervals:
- name: office
  time_intervals: [{weekdays: [monday]}]
- name: b-nights
  time_intervals: [{times: [{start_time: "00:00", end_time: "06:00"}]}]
"#
        )
    );
    // Nothing to show from a configuration not read: shown as empty.
    let owned_a = owned(&["team-a"]);
    let tenant = TenantAlerts {
        label: "namespace",
        owned: &owned_a,
    };
    assert_eq!(tenant_configuration("route: [not, a, route]", &tenant), "");
    assert_eq!(tenant_configuration("", &tenant), "");
}
