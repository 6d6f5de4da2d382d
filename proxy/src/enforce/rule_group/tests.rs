use super::*;
use crate::config::ForeignLabelPolicy;
use crate::enforce::tenant_label::team_a as tenant;

fn owned() -> Vec<String> {
    vec!["team-a".into(), "team-a2".into()]
}

/// What Loki would read from the forwarded text.
fn forwarded(body: &str, policy: ForeignLabelPolicy) -> RuleGroup {
    let owned = owned();
    let (text, _) = rewrite(body.as_bytes(), &tenant(&owned, policy)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

fn namespaces(group: &RuleGroup) -> Vec<Option<&str>> {
    group
        .rules
        .iter()
        .map(|r| r.labels.get("namespace").map(String::as_str))
        .collect()
}

const MIXED: &str = r#"
name: errors
interval: 1m
rules:
  - alert: HighErrors
    expr: sum by (namespace) (rate({app="x"} |= "error" [5m])) > 1
    for: 5m
    labels: {severity: page}
    annotations: {summary: "{{ $labels.namespace }} is failing"}
  - record: namespace:errors:rate5m
    expr: sum by (namespace) (rate({app="x"} | label_format namespace="team-b" [5m]))
  - alert: Owned
    expr: vector(1)
    labels: {namespace: team-a2}
  - alert: Foreign
    expr: vector(1)
    labels: {namespace: team-b}
  - alert: Templated
    expr: vector(1)
    labels: {namespace: "{{ $labels.namespace }}"}
"#;

#[test]
fn every_rule_pins_the_tenant_label_and_an_owned_literal_is_kept() {
    let group = forwarded(MIXED, ForeignLabelPolicy::Overwrite);
    assert_eq!(
        namespaces(&group),
        [
            Some("team-a"),
            Some("team-a"),
            Some("team-a2"),
            Some("team-a"),
            Some("team-a")
        ]
    );
    // Everything else comes through as it was.
    let first = &group.rules[0];
    assert_eq!(first.labels["severity"], "page");
    assert_eq!(first.for_duration.as_deref(), Some("5m"));
    assert_eq!(
        first.annotations["summary"],
        "{{ $labels.namespace }} is failing"
    );
    assert_eq!(group.interval.as_deref(), Some("1m"));
    assert_eq!(
        group.rules[1].expr,
        r#"sum by (namespace) (rate({app="x"} | label_format namespace="team-b" [5m]))"#
    );
}

#[test]
fn reject_refuses_a_foreign_or_templated_value_and_names_the_rule() {
    let owned = owned();
    let reject = tenant(&owned, ForeignLabelPolicy::Reject);
    let err = rewrite(MIXED.as_bytes(), &reject).unwrap_err();
    assert!(err.to_string().contains("\"Foreign\""), "{err}");
    let templated = "name: g\nrules:\n  - alert: T\n    expr: vector(1)\n    labels: {namespace: '{{ $labels.namespace }}'}\n";
    assert!(matches!(
        rewrite(templated.as_bytes(), &reject),
        Err(RuleGroupError::ForeignLabel(_))
    ));
    // Absent and owned are fine under reject too.
    let fine = "name: g\nrules:\n  - record: a\n    expr: vector(1)\n  - record: b\n    expr: vector(1)\n    labels: {namespace: team-a2}\n";
    let (text, pinned) = rewrite(fine.as_bytes(), &reject).unwrap();
    assert_eq!(
        pinned,
        Pinned {
            added: 1,
            overwritten: 0
        }
    );
    let group: RuleGroup = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(namespaces(&group), [Some("team-a"), Some("team-a2")]);
}

#[test]
fn group_labels_are_held_to_the_tenant_too() {
    let body = "name: g\nlabels: {namespace: team-b, team: x}\nrules:\n  - record: a\n    expr: vector(1)\n";
    let group = forwarded(body, ForeignLabelPolicy::Overwrite);
    assert_eq!(group.labels["namespace"], "team-a");
    assert_eq!(group.labels["team"], "x");
    // Absent at group level stays absent: the rules carry it.
    let group = forwarded(
        "name: g\nrules:\n  - record: a\n    expr: vector(1)\n",
        ForeignLabelPolicy::Overwrite,
    );
    assert!(group.labels.is_empty());
    // `labels:` left empty reads as none, as yaml.v3 reads it.
    let group = forwarded(
        "name: g\nrules:\n  - record: a\n    expr: vector(1)\n    labels:\n",
        ForeignLabelPolicy::Overwrite,
    );
    assert_eq!(namespaces(&group), [Some("team-a")]);
}

#[test]
fn aliases_are_resolved_before_the_check_and_never_forwarded() {
    let body = "name: g\nrules:\n  - record: a\n    expr: vector(1)\n    labels: &foreign {namespace: team-b}\n  - record: b\n    expr: vector(1)\n    labels: *foreign\n";
    let owned = owned();
    let (text, _) = rewrite(
        body.as_bytes(),
        &tenant(&owned, ForeignLabelPolicy::Overwrite),
    )
    .unwrap();
    assert!(!text.contains('&') && !text.contains('*'), "{text}");
    let group: RuleGroup = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(namespaces(&group), [Some("team-a"), Some("team-a")]);
}

#[test]
fn what_cannot_be_read_as_one_rule_group_is_refused() {
    let owned = owned();
    let overwrite = tenant(&owned, ForeignLabelPolicy::Overwrite);
    for body in [
        "",
        "not: a group",
        "name: g\nrules:\n  - record: a\n    expr: vector(1)\n    lables: {namespace: team-b}\n",
        "name: g\nsource_tenants: [team-b]\nrules: []\n",
        "groups:\n  - name: g\n    rules: []\n",
        "name: g\nrules:\n  - record: a\n    expr: vector(1)\n    labels: {<<: {namespace: team-b}}\n",
        "name: g\nrules:\n  - record: a\n    expr: vector(1)\n    labels: {namespace: team-a, namespace: team-b}\n",
        "name: g\nrules: [\n",
    ] {
        assert!(
            matches!(
                rewrite(body.as_bytes(), &overwrite),
                Err(RuleGroupError::Unreadable(_))
            ),
            "{body:?}"
        );
    }
}

/// The 400 says what was wrong, in the words of the rule group's format.
#[test]
fn a_refusal_names_what_it_expected() {
    let owned = owned();
    let overwrite = tenant(&owned, ForeignLabelPolicy::Overwrite);
    let refused = |body: &str| match rewrite(body.as_bytes(), &overwrite) {
        Err(RuleGroupError::Unreadable(why)) => why,
        other => panic!("{body:?}: {other:?}"),
    };
    let listed =
        refused("name: g\nrules:\n  - record: a\n    expr: vector(1)\n    labels: [namespace]\n");
    assert!(listed.contains("expected a map of strings"), "{listed}");
    let twice = refused("name: g\nrules:\n  - record: a\n    expr: vector(1)\n    labels: {namespace: team-a, namespace: team-b}\n");
    assert!(twice.contains(r#""namespace" is defined twice"#), "{twice}");
}

#[test]
fn json_is_yaml_and_is_answered_as_yaml() {
    let body = r#"{"name": "g", "rules": [{"alert": "A", "expr": "vector(1)", "labels": {"namespace": "team-b"}}]}"#;
    let group = forwarded(body, ForeignLabelPolicy::Overwrite);
    assert_eq!(namespaces(&group), [Some("team-a")]);
}

proptest::proptest! {
    /// Whatever value a rule's label comes with, what Loki reads pins it
    /// to an owned value, and nothing else about the rule changes.
    #[test]
    fn every_forwarded_rule_carries_an_owned_value(
        values in proptest::collection::vec(proptest::option::of("[a-z{}$. -]{0,12}"), 1..6),
    ) {
        let owned = owned();
        let group = RuleGroup {
            name: "g".into(),
            interval: None,
            query_offset: None,
            limit: None,
            labels: BTreeMap::new(),
            rules: values
                .iter()
                .enumerate()
                .map(|(i, value)| Rule {
                    record: Some(format!("r{i}")),
                    alert: None,
                    expr: "vector(1)".into(),
                    for_duration: None,
                    keep_firing_for: None,
                    labels: value
                        .iter()
                        .map(|v| ("namespace".to_owned(), v.clone()))
                        .chain([("other".to_owned(), format!("{i}"))])
                        .collect(),
                    annotations: BTreeMap::new(),
                })
                .collect(),
        };
        let body = serde_yaml_ng::to_string(&group).unwrap();
        let (text, pinned) = rewrite(body.as_bytes(), &tenant(&owned, ForeignLabelPolicy::Overwrite)).unwrap();
        // Counted as metrics: one per rule that did not carry an owned value.
        let absent = values.iter().filter(|v| v.is_none()).count() as u64;
        let foreign = values.iter().flatten().filter(|v| !owned.contains(v)).count() as u64;
        proptest::prop_assert_eq!(pinned, Pinned { added: absent, overwritten: foreign });
        let read: RuleGroup = serde_yaml_ng::from_str(&text).unwrap();
        for (i, (rule, value)) in read.rules.iter().zip(&values).enumerate() {
            let pinned = &rule.labels["namespace"];
            proptest::prop_assert!(owned.contains(pinned));
            if let Some(value) = value.as_ref().filter(|v| owned.contains(v)) {
                proptest::prop_assert_eq!(pinned, value);
            }
            proptest::prop_assert_eq!(&rule.labels["other"], &format!("{i}"));
            proptest::prop_assert_eq!(rule.record.clone(), Some(format!("r{i}")));
        }
    }
}

#[test]
fn a_federated_group_may_name_only_its_own_tenant() {
    let group =
        |sources: &str| format!("name: g\n{sources}rules:\n  - record: a\n    expr: sum(up)\n");
    for fine in [
        "",
        "source_tenants:\n",
        "source_tenants: []\n",
        "source_tenants: [team-a]\n",
        "source_tenants: [team-a, team-a]\n",
    ] {
        let body = group(fine);
        let sent: serde_yaml_ng::Value = serde_yaml_ng::from_str(&body).unwrap();
        let text = federated(body.as_bytes(), "team-a").unwrap();
        let forwarded: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(forwarded, sent, "{fine}");
    }
    for foreign in [
        "source_tenants: [team-b]\n",
        "source_tenants: [team-a, team-b]\n",
        "source_tenants: [\"team-a|team-b\"]\n",
        "source_tenants: [1]\n",
    ] {
        assert_eq!(
            federated(group(foreign).as_bytes(), "team-a"),
            Err(RuleGroupError::ForeignSourceTenant),
            "{foreign}"
        );
    }
    // What Go's decoder could read as another list than the one checked.
    for unreadable in [
        "<<: {source_tenants: [team-b]}\n",
        "base: &b {source_tenants: [team-b]}\n<<: *b\n",
        "source_tenants: !custom [team-b]\n",
        "source_tenants: team-b\n",
        "source_tenants: [\n",
        "source_tenants: [team-a]\nsource_tenants: [team-b]\n",
    ] {
        assert!(
            matches!(
                federated(group(unreadable).as_bytes(), "team-a"),
                Err(RuleGroupError::Unreadable(_))
            ),
            "{unreadable}"
        );
    }
    // Nor anywhere deeper: in a rule, or in a list.
    for nested in [
        "name: g\nrules:\n  - record: a\n    expr: !custom sum(up)\n",
        "name: !custom g\nrules: []\n",
        "name: g\nrules:\n  - <<: {record: a}\n    expr: sum(up)\n",
        "name: g\nrules:\n  - record: a\n    expr: sum(up)\n    labels: {<<: {namespace: team-b}}\n",
    ] {
        assert!(
            matches!(
                federated(nested.as_bytes(), "team-a"),
                Err(RuleGroupError::Unreadable(_))
            ),
            "{nested}"
        );
    }
    for not_a_group in ["", "- name: g\n", "just text\n"] {
        assert!(
            matches!(
                federated(not_a_group.as_bytes(), "team-a"),
                Err(RuleGroupError::Unreadable(_))
            ),
            "{not_a_group:?}"
        );
    }
}

/// The federated group leaves as the YAML written from what was checked:
/// aliases resolved, comments and the client's spelling gone, fields this
/// proxy does not know (Mimir's own) kept.
#[test]
fn a_federated_group_is_forwarded_as_written_from_what_was_checked() {
    let body = "# the client's comment\n\
        tenants: &mine [team-a]\n\
        name: g\n\
        source_tenants: *mine\n\
        evaluation_delay: 1m\n\
        rules:\n  - record: a\n    expr: |\n      sum(up)\n    labels: {severity: 1}\n";
    let text = federated(body.as_bytes(), "team-a").unwrap();
    assert!(!text.contains(['#', '&', '*']), "{text}");
    assert_eq!(
        text,
        "tenants:\n- team-a\nname: g\nsource_tenants:\n- team-a\nevaluation_delay: 1m\n\
         rules:\n- record: a\n  expr: |\n    sum(up)\n  labels:\n    severity: 1\n"
    );
    assert_eq!(federated(text.as_bytes(), "team-a").as_ref(), Ok(&text));
}

/// A group whose aliases copy one long scalar thousands of times, or
/// nest tenfold eight deep, is refused before it is read into values (it
/// read as 131 MB from 92 KB), in either mode; one that reuses a label
/// set across rules is read as before.
#[test]
fn aliases_that_expand_a_group_past_its_allowance_are_refused() {
    let mut copies = format!(
        "name: g\nrules:\n- record: r\n  expr: up\n  labels:\n    s: &s {}\n",
        "x".repeat(64 << 10)
    );
    for i in 0..2000 {
        copies += &format!("    l{i}: *s\n");
    }
    let mut nested = String::from(
        "name: g\nrules:\n- record: r\n  expr: up\n  labels:\n    a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n",
    );
    for i in 1..9 {
        let aliases = vec![format!("*a{}", i - 1); 10].join(", ");
        nested += &format!("    a{i}: &a{i} [{aliases}]\n");
    }
    for body in [copies, nested] {
        let allowance = (body.len() * 4).max(64 * 1024);
        let refused = rewrite(
            body.as_bytes(),
            &tenant(&owned(), ForeignLabelPolicy::Overwrite),
        )
        .unwrap_err();
        assert!(
            refused
                .to_string()
                .contains(&format!("past {allowance} bytes")),
            "{refused}"
        );
        let refused = federated(body.as_bytes(), "team-a").unwrap_err();
        assert!(
            refused
                .to_string()
                .contains(&format!("past {allowance} bytes")),
            "{refused}"
        );
    }
    let reused = "name: g\nrules:\n\
                  - {alert: A, expr: up == 0, labels: &common {severity: page, team: x}}\n\
                  - {alert: B, expr: up == 2, labels: *common}\n";
    let (yaml, _) = rewrite(
        reused.as_bytes(),
        &tenant(&owned(), ForeignLabelPolicy::Overwrite),
    )
    .unwrap();
    assert_eq!(yaml.matches("severity: page").count(), 2, "{yaml}");
    assert!(federated(reused.as_bytes(), "team-a").is_ok());
}
