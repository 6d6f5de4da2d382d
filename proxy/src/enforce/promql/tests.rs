use super::*;
use proptest::prelude::*;

fn one() -> TenantMatcher {
    TenantMatcher::new("namespace", &["team-a".into()]).unwrap()
}

fn two() -> TenantMatcher {
    TenantMatcher::new("namespace", &["team-a".into(), "team-a.prod".into()]).unwrap()
}

const A: &str = r#"namespace="team-a""#;

/// (query, expected output) for the single-value tenant.
const CASES: &[(&str, &str)] = &[
    ("up", r#"up{namespace="team-a"}"#),
    (r#"up{job="api"}"#, r#"up{job="api",namespace="team-a"}"#),
    (
        "rate(http_requests_total[5m])",
        r#"rate(http_requests_total{namespace="team-a"}[5m])"#,
    ),
    (
        "sum by (code) (rate(http_requests_total[5m]))",
        r#"sum by (code) (rate(http_requests_total{namespace="team-a"}[5m]))"#,
    ),
    (
        "a and b",
        r#"a{namespace="team-a"} and b{namespace="team-a"}"#,
    ),
    (
        "a or b",
        r#"a{namespace="team-a"} or b{namespace="team-a"}"#,
    ),
    (
        "a unless on(job) b",
        r#"a{namespace="team-a"} unless on (job) b{namespace="team-a"}"#,
    ),
    (
        "a * on(job) group_left(x) b",
        r#"a{namespace="team-a"} * on (job) group_left (x) b{namespace="team-a"}"#,
    ),
    ("-a", r#"-a{namespace="team-a"}"#),
    ("(a)", r#"(a{namespace="team-a"})"#),
    (
        "max_over_time(rate(a[1m])[1h:5m])",
        r#"max_over_time(rate(a{namespace="team-a"}[1m])[1h:5m])"#,
    ),
    ("a offset 5m", r#"a{namespace="team-a"} offset 5m"#),
    (
        "a @ 1700000000",
        r#"a{namespace="team-a"} @ 1700000000.000"#,
    ),
    ("a[5m] @ end()", r#"a{namespace="team-a"}[5m] @ end()"#),
    ("topk(5, a)", r#"topk(5, a{namespace="team-a"})"#),
    (
        "topk(scalar(count(b)), a)",
        r#"topk(scalar(count(b{namespace="team-a"})), a{namespace="team-a"})"#,
    ),
    (
        r#"count_values("v", a)"#,
        r#"count_values("v", a{namespace="team-a"})"#,
    ),
    (
        r#"label_replace(a, "x", "$1", "y", "(.*)")"#,
        r#"label_replace(a{namespace="team-a"}, "x", "$1", "y", "(.*)")"#,
    ),
    ("absent(a)", r#"absent(a{namespace="team-a"})"#),
    ("1 + 1", "1 + 1"),
    ("vector(1) + vector(1)", "vector(1) + vector(1)"),
    (r#"{__name__="a"}"#, r#"{__name__="a",namespace="team-a"}"#),
    (
        r#"{"my.metric"}"#,
        r#"{__name__="my.metric",namespace="team-a"}"#,
    ),
];

#[test]
fn injects_into_every_selector_kind() {
    for (query, want) in CASES {
        assert_eq!(
            enforce_query(query, &one()).as_deref(),
            Ok(*want),
            "{query}"
        );
    }
}

#[test]
fn user_matchers_on_the_tenant_label_are_kept_and_anded() {
    // Each keeps the user's matcher and adds ours: the result can only narrow.
    for user in [
        r#"namespace="team-b""#,
        r#"namespace!="team-a""#,
        r#"namespace=~".*""#,
        r#"namespace=~"team-.*""#,
        r#"namespace!~"x""#,
        r#"namespace="""#,
    ] {
        let out = enforce_query(&format!("up{{{user}}}"), &one()).unwrap();
        assert!(out.contains(user), "{out}");
        assert!(out.contains(A), "{out}");
    }
}

#[test]
fn an_identical_user_matcher_is_not_repeated() {
    assert_eq!(
        enforce_query(r#"up{namespace="team-a"}"#, &one()).as_deref(),
        Ok(r#"up{namespace="team-a"}"#)
    );
}

#[test]
fn several_values_become_one_quoted_alternation() {
    let out = enforce_query("up", &two()).unwrap();
    assert_eq!(out, r#"up{namespace=~"team-a|team-a\\.prod"}"#);
    assert_eq!(two().selector(), r#"{namespace=~"team-a|team-a\\.prod"}"#);
}

#[test]
fn values_with_quotes_backslashes_and_regex_characters_round_trip() {
    let odd = vec![
        r#"a"b"#.to_string(),
        r"c\d".to_string(),
        "e|f.g".to_string(),
    ];
    for values in [&odd[..1], &odd[1..2], &odd[..]] {
        let tenant = TenantMatcher::new("namespace", values).unwrap();
        let out = enforce_query("up", &tenant).unwrap();
        // The printed value parses back to exactly our matcher.
        let mut expr = parser::parse(&out).unwrap();
        let Expr::VectorSelector(vs) = &mut expr else {
            panic!("{out}")
        };
        assert!(tenant.is_carried_by(vs), "{out}");
    }
    let tenant = TenantMatcher::new("namespace", &odd).unwrap();
    let out = enforce_query("up", &tenant).unwrap();
    assert!(
        out.contains(r#"e\\|f\\.g"#),
        "a | in a value is quoted, not an alternation: {out}"
    );
}

#[test]
fn refuses_or_groups_inside_selectors() {
    assert_eq!(
        enforce_query(r#"up{a="1" or b="2"}"#, &one()),
        Err(EnforceError::OrInSelector)
    );
    assert_eq!(
        enforce_selector(r#"{a="1" or b="2"}"#, &one()),
        Err(EnforceError::OrInSelector)
    );
}

#[test]
fn refuses_info_and_unparseable_queries() {
    assert_eq!(
        enforce_query("info(up)", &one()),
        Err(EnforceError::InfoFunction)
    );
    assert!(matches!(
        enforce_query("up{", &one()),
        Err(EnforceError::Parse(_))
    ));
    assert!(matches!(
        enforce_query("rate(a[5m+1m])", &one()),
        Err(EnforceError::Parse(_))
    ));
    assert!(matches!(
        enforce_query("", &one()),
        Err(EnforceError::Parse(_))
    ));
}

/// A selector left without the tenant matcher is the proxy's bug: a 500
/// that pages the operator, not a 400 that blames the query.
#[test]
fn an_enforcement_miss_is_not_the_clients_error() {
    assert!(!EnforceError::Unenforced.is_client_error());
    assert!(EnforceError::TooComplex.is_client_error());
}

/// Found by coverage-guided fuzzing: promql-parser 0.11 panics on a range
/// too long for a `Duration`. A refusal (400), never a panic.
#[test]
fn inputs_that_make_the_parser_panic_are_refused() {
    let crash = include_str!("../../../../fuzz/corpus/promql/regression-range-overflows-duration");
    for query in [crash, "x[99999999999999999999999]", "rate(x[1e30])"] {
        let refused = enforce_query(query, &one()).unwrap_err();
        assert!(
            matches!(refused, EnforceError::Parse(_)) && refused.is_client_error(),
            "{query}: {refused:?}"
        );
        assert!(enforce_selector(query, &one()).is_err());
    }
    assert!(CredentialSelector::parse("{app=\"x\"}[99999999999999999999999]").is_err());
    // promql-parser 0.11's `unquote_string` panics on a `\` before a
    // character beyond ASCII; the regexes' set-aside calls it outside the
    // caught parse, after its lexer has let only known escapes through.
    for query in [r#"up{job=~"\é"}"#, r#"up{job!~'\日'}"#, r#"up{job="\é"}"#] {
        let refused = enforce_query(query, &one()).unwrap_err();
        assert!(refused.is_client_error(), "{query}: {refused:?}");
    }
}

#[test]
fn bounds_length_and_nesting_before_parsing() {
    let deep = format!("{}up{}", "(".repeat(20_000), ")".repeat(20_000));
    assert_eq!(enforce_query(&deep, &one()), Err(EnforceError::TooComplex));
    let chain = vec!["up"; 300].join(" + ");
    assert_eq!(enforce_query(&chain, &one()), Err(EnforceError::TooComplex));
    let long = format!(r#"up{{job="{}"}}"#, "x".repeat(MAX_QUERY_BYTES));
    assert_eq!(enforce_query(&long, &one()), Err(EnforceError::TooLong));
    // Brackets inside strings and matchers inside braces do not count.
    let in_string = format!(r#"up{{job="{}"}}"#, "(".repeat(5_000));
    assert!(enforce_query(&in_string, &one()).is_ok());
    let many_matchers = vec![r#"up{a="1",b!="2",c=~"3",d!~"4"}"#; 100].join(" or ");
    assert!(enforce_query(&many_matchers, &one()).is_ok());
}

/// `up{job="xx…"}`, exactly `n` bytes long.
fn query_of_length(n: usize) -> String {
    format!(r#"up{{job="{}"}}"#, "x".repeat(n - 10))
}

#[test]
fn the_bounds_are_inclusive() {
    let nested = |n: usize| format!("{}up{}", "(".repeat(n), ")".repeat(n));
    assert_eq!(
        nesting_tokens(&nested(MAX_NESTING_TOKENS)),
        MAX_NESTING_TOKENS
    );
    assert_eq!(check_bounds(&nested(MAX_NESTING_TOKENS)), Ok(()));
    assert_eq!(
        check_bounds(&nested(MAX_NESTING_TOKENS + 1)),
        Err(EnforceError::TooComplex)
    );
    assert_eq!(query_of_length(MAX_QUERY_BYTES).len(), MAX_QUERY_BYTES);
    assert_eq!(check_bounds(&query_of_length(MAX_QUERY_BYTES)), Ok(()));
    assert_eq!(
        check_bounds(&query_of_length(MAX_QUERY_BYTES + 1)),
        Err(EnforceError::TooLong)
    );
}

/// The count reads strings, matchers and words as the parser does: a bracket
/// taken for part of a string would let a deeper query past the bound, and
/// one counted inside a string would refuse a harmless query.
#[test]
fn nesting_tokens_read_the_query_as_promql_does() {
    for (query, tokens) in [
        (r#"f("a\"(((")"#, 1),                 // an escaped quote does not end a string
        (r#"f("a\\", ((x)))"#, 3),             // after an escaped backslash, the quote does
        (r#"f(`\`, ((x)))"#, 3),               // a raw string has no escapes
        (r#"f('"((', ((x)))"#, 3),             // another kind of quote does not end it
        (r#"up{a="}((("} + x"#, 2),            // nor does a `}` in a matcher's value
        (r#"up{} + ((x))"#, 4),                // a matcher list ends at its `}`
        ("a and b_or or c unless atan2_x", 3), // keywords are whole words
        ("x atan2", 1),                        // the last word too
    ] {
        assert_eq!(nesting_tokens(query), tokens, "{query}");
    }
}

#[test]
fn the_deepest_accepted_queries_fit_a_runtime_thread_stack() {
    let half = MAX_NESTING_TOKENS / 2;
    let cases = [
        format!(
            "{}up{}",
            "(".repeat(MAX_NESTING_TOKENS - 1),
            ")".repeat(MAX_NESTING_TOKENS - 1)
        ),
        vec!["up"; half].join(" + "),
        format!("{}up", "-".repeat(MAX_NESTING_TOKENS - 1)),
        format!(
            "{}up{}",
            "abs(".repeat(MAX_NESTING_TOKENS - 1),
            ")".repeat(MAX_NESTING_TOKENS - 1)
        ),
    ];
    // Tokio's worker threads have 2 MiB stacks.
    std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || {
            for query in cases {
                assert!(nesting_tokens(&query) <= MAX_NESTING_TOKENS);
                let _ = enforce_query(&query, &one());
            }
        })
        .unwrap()
        .join()
        .expect("no stack overflow at the nesting bound");
}

#[test]
fn match_selectors_are_enforced_and_must_be_selectors() {
    assert_eq!(
        enforce_selector(r#"{job="api"}"#, &one()).as_deref(),
        Ok(r#"{job="api",namespace="team-a"}"#)
    );
    assert_eq!(
        enforce_selector("up", &one()).as_deref(),
        Ok(r#"up{namespace="team-a"}"#)
    );
    for not_selector in ["rate(up[5m])", "up[5m]", "1", "up offset 1m", "a + b"] {
        assert_eq!(
            enforce_selector(not_selector, &one()),
            Err(EnforceError::NotASelector),
            "{not_selector}"
        );
    }
}

#[test]
fn enforcement_is_idempotent_in_effect() {
    for (query, _) in CASES {
        let once = enforce_query(query, &one()).unwrap();
        let twice = enforce_query(&once, &one()).unwrap();
        assert!(parser::parse(&twice).is_ok());
        assert!(twice.matches(A).count() >= once.matches(A).count());
    }
}

// === property: random PromQL always comes out enforced ===

fn selector() -> impl Strategy<Value = String> {
    let name = prop::sample::select(vec!["up", "http_requests_total", "node_cpu_seconds_total"]);
    let label = prop::sample::select(vec!["job", "namespace", "code", "instance"]);
    let op = prop::sample::select(vec!["=", "!=", "=~", "!~"]);
    let value = prop::sample::select(vec!["api", "team-a", "team-b", ".*", "", "a|b", r#"x\"y"#]);
    (name, prop::collection::vec((label, op, value), 0..3)).prop_map(|(name, matchers)| {
        let inner: Vec<String> = matchers
            .into_iter()
            .map(|(l, o, v)| format!("{l}{o}\"{v}\""))
            .collect();
        format!("{name}{{{}}}", inner.join(","))
    })
}

fn expression() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        selector(),
        selector().prop_map(|s| format!("rate({s}[5m])")),
        Just("1".to_string()),
    ];
    leaf.prop_recursive(4, 32, 3, |inner| {
        prop_oneof![
            (
                inner.clone(),
                inner.clone(),
                prop::sample::select(vec!["+", "and", "or", "unless", "/", ">"])
            )
                .prop_map(|(a, b, op)| format!("({a}) {op} ({b})")),
            inner.clone().prop_map(|e| format!("sum by (job) ({e})")),
            inner.clone().prop_map(|e| format!("topk(3, {e})")),
            inner.clone().prop_map(|e| format!("abs({e})")),
            selector().prop_map(|s| format!("max_over_time({s}[10m:1m])")),
            selector().prop_map(|s| format!("{s} offset 5m")),
        ]
    })
}

proptest! {
    #[test]
    fn enforced_output_parses_and_every_selector_carries_the_tenant(query in expression()) {
        // Some generated queries are invalid PromQL (e.g. an empty-matching
        // selector); those must be refused, never passed through.
        match enforce_query(&query, &two()) {
            Ok(out) => {
                let mut expr = parser::parse(&out).expect("output parses");
                let tenant = two();
                for_each_selector(&mut expr, &mut |vs| {
                    if tenant.is_carried_by(vs) { Ok(()) } else { Err(EnforceError::Unenforced) }
                }).expect("every selector enforced");
                let mut selectors = 0;
                for_each_selector(&mut parser::parse(&query).unwrap(), &mut |_| { selectors += 1; Ok(()) }).unwrap();
                prop_assert_eq!(out.matches("namespace=~\"team-a|team-a\\\\.prod\"").count(), selectors);
            }
            Err(e) => prop_assert!(e.is_client_error() && parser::parse(&query).is_err(), "{e}: {query}"),
        }
    }
}

#[test]
fn the_memo_answers_as_enforcement_does_and_keys_by_tenant() {
    let memo = Memo::new(100);
    for (query, want) in CASES {
        assert_eq!(memo.enforce_query(query, &one()).as_deref(), Ok(*want));
        assert_eq!(
            memo.enforce_query(query, &one()).as_deref(),
            Ok(*want),
            "from the memo"
        );
    }
    // The same query for another tenant is not served from the first's entry.
    let other = TenantMatcher::new("namespace", &["team-b".into()]).unwrap();
    assert_eq!(
        memo.enforce_query("up", &other).as_deref(),
        Ok(r#"up{namespace="team-b"}"#)
    );
    assert_eq!(
        memo.enforce_query("info(up)", &one()),
        Err(EnforceError::InfoFunction)
    );
    assert_eq!(
        memo.enforce_query("info(up)", &one()),
        Err(EnforceError::InfoFunction)
    );
    assert_eq!(
        memo.enforce_selector("up", &one()).as_deref(),
        Ok(r#"up{namespace="team-a"}"#)
    );
}

#[test]
fn a_full_memo_starts_over_instead_of_growing() {
    let memo = Memo::new(2);
    for i in 0..10 {
        memo.enforce_query(&format!("metric_{i}"), &one()).unwrap();
    }
    assert!(memo.entries.len() <= 2);
}

#[test]
fn a_full_cache_frees_its_entries_after_releasing_its_lock() {
    use std::sync::{LazyLock, Mutex};
    /// A value that notes, when freed, whether the cache's lock was free.
    #[derive(Clone)]
    struct Probe;
    static CACHE: LazyLock<Cache<Probe>> = LazyLock::new(|| Cache::new(2, |_| 0));
    static LOCK_FREE_AT_DROP: Mutex<Vec<bool>> = Mutex::new(Vec::new());
    impl Drop for Probe {
        fn drop(&mut self) {
            let free = CACHE.entries.try_write().is_ok();
            LOCK_FREE_AT_DROP.lock().unwrap().push(free);
        }
    }
    let key = |text: &str| MemoKey {
        tenant: "namespace=\"team-a\"".into(),
        input: Input::Query,
        text: text.into(),
    };
    CACHE.insert(key("a"), Probe);
    CACHE.insert(key("b"), Probe);
    assert!(LOCK_FREE_AT_DROP.lock().unwrap().is_empty());
    // Full: starts over, freeing both.
    CACHE.insert(key("c"), Probe);
    assert_eq!(*LOCK_FREE_AT_DROP.lock().unwrap(), [true, true]);
    assert_eq!(CACHE.len(), 1);
}

#[test]
fn a_memo_of_size_zero_remembers_nothing_and_still_enforces() {
    let memo = Memo::new(0);
    for _ in 0..2 {
        assert_eq!(
            memo.enforce_query(r#"up{job="a"}"#, &one()).as_deref(),
            Ok(r#"up{job="a",namespace="team-a"}"#)
        );
    }
    assert_eq!((memo.entries.len(), memo.templates.len()), (0, 0));
}

/// A memoised answer is served as held, only for the same tenant and the
/// same kind of input; texts up to 4 KiB are memoised, longer ones not.
#[test]
fn a_memo_answers_from_what_it_holds() {
    let memo = Memo::new(100);
    let query = r#"up{job="a"}"#;
    let key = MemoKey::new(&one(), Input::Query, query);
    memo.entries.insert(key, Ok(Arc::from("remembered")));
    assert_eq!(
        memo.enforce_query(query, &one()).as_deref(),
        Ok("remembered")
    );
    assert_eq!(
        memo.enforce_selector(query, &one()).as_deref(),
        enforce_selector(query, &one()).as_deref()
    );
    assert_eq!(
        memo.enforce_query(query, &two()).as_deref(),
        enforce_query(query, &two()).as_deref()
    );
    let held = memo.entries.len();
    memo.enforce_query(&query_of_length(4096), &one()).unwrap();
    assert_eq!(memo.entries.len(), held + 1, "4096 bytes are memoised");
    memo.enforce_query(&query_of_length(4097), &one()).unwrap();
    assert_eq!(memo.entries.len(), held + 1, "4097 bytes are not");
}

#[test]
fn a_memo_of_long_queries_starts_over_at_its_byte_bound() {
    let memo = Memo::new(100);
    let budget = 100 * BYTES_PER_ENTRY;
    // About 3 KiB in and out each: the count alone would keep 100 of them.
    let long = |i: usize| format!("metric_{i}{{job=\"{}\"}}", "x".repeat(3000));
    for i in 0..100 {
        let query = long(i);
        assert!(query.len() < 4096);
        memo.enforce_query(&query, &one()).unwrap();
        if i == 1 {
            assert_eq!(memo.entries.len(), 2, "two fit well within the bound");
        }
        assert!(
            memo.entries.bytes() <= budget,
            "{} bytes",
            memo.entries.bytes()
        );
    }
    let kept = memo.entries.len();
    assert!((1..100).contains(&kept), "{kept} entries");
    // What it keeps still answers.
    let last = long(99);
    assert_eq!(
        memo.enforce_query(&last, &one()).as_deref(),
        enforce_query(&last, &one()).as_deref()
    );
}

/// The verifying re-parse swaps the tenant's printed regex for a sentinel
/// equality instead of compiling it again; it must still refuse every text
/// in which a selector lacks the tenant's matcher, including texts built to
/// confuse the swap.
#[test]
fn verification_without_recompiling_the_tenants_regex_still_refuses_what_escapes() {
    let tenant = TenantMatcher::new(
        "namespace",
        &[
            "team-a".into(),
            "team-a-staging".into(),
            "team-a-jobs".into(),
        ],
    )
    .unwrap();
    let ours = r#"namespace=~"team-a|team-a-staging|team-a-jobs""#;
    let carried = format!("sum(rate(x{{job=\"a\",{ours}}}[5m])) / y{{{ours}}}");
    assert_eq!(verify(&carried, &tenant, &[]), Ok(()));
    for escaping in [
        // one selector without it
        format!("x{{{ours}}} / y"),
        // only under another label whose name ends like ours
        format!("x{{{ours}}} / y{{x{ours}}}"),
        // a sentinel written by the user, and a selector without ours
        r#"x{namespace="tenant-proxy-verify-0"}"#.to_string(),
        format!(r#"x{{{ours}}} / y{{namespace="tenant-proxy-verify-0"}}"#),
        // ours only inside a string literal
        format!(
            "label_replace(y, \"d\", \"{}\", \"s\", \"\")",
            ours.replace('"', "\\\"")
        ),
    ] {
        assert_eq!(
            verify(&escaping, &tenant, &[]),
            Err(EnforceError::Unenforced),
            "{escaping}"
        );
    }
    // Enforcing, end to end, still yields the real matcher in every selector.
    let out = enforce_query(
        r#"sum(rate(http_requests_total{pod=~"web-.*"}[5m])) / on() up"#,
        &tenant,
    )
    .unwrap();
    assert_eq!(out.matches(ours).count(), 2, "{out}");
    assert!(!out.contains("tenant-proxy-verify"), "{out}");
}

// === client regexes set aside (client_regex.rs) ===

/// Enforcement the long way: the query parsed as sent (its regexes
/// compiled), every selector injected, printed, verified the full way.
fn enforce_as_parsed(query: &str, tenant: &TenantMatcher) -> Result<String, EnforceError> {
    let mut expr = parse(query).map_err(EnforceError::Parse)?;
    for_each_selector(&mut expr, &mut |vs| inject(vs, tenant))?;
    let enforced = expr.to_string();
    verify(&enforced, tenant, &[])?;
    Ok(enforced)
}

/// Queries whose regex literals the set-aside must find exactly, next to
/// the same characters in comments, other strings and quoted names.
const TRICKY_REGEX_QUERIES: &[&str] = &[
    r#"sum(rate(x{route=~"/v1/.*", code!~"5.."}[5m]))"#,
    r#"x{route =~ '/v1/.*'} / y{pod=~`web-[0-9]+`}"#,
    r#"x{a=~"with \"quotes\" and \\ slash", b!~'it\'s'}"#,
    "x{a=~\n\"newline before\"} # a comment with b=~\"c\"\n + y{d=~\"e\"}",
    r#"label_replace(x{a=~"b.*"}, "dst", "=~\"not a matcher\"", "src", "(.*)")"#,
    r#"{"quoted.name"=~"v.+", __name__="m"}"#,
    r#"x{a=~"é|ü", namespace=~"team-a|other"}"#,
    r#"x{namespace=~"team-a|team-a\\.prod"}"#,
    r#"x{a=~"\x41\u00e9\101"}"#,
];

#[test]
fn regex_literals_set_aside_read_as_the_parser_reads_them() {
    for query in TRICKY_REGEX_QUERIES {
        let set_aside = client_regex::SetAside::of(query).expect(query);
        let expr = set_aside.parse().unwrap_or_else(|| panic!("{query}"));
        assert_eq!(
            expr.to_string(),
            parse(query).unwrap().to_string(),
            "{query}"
        );
        for tenant in [one(), two()] {
            assert_eq!(
                enforce_query(query, &tenant),
                enforce_as_parsed(query, &tenant),
                "{query}"
            );
        }
    }
}

#[test]
fn queries_not_lexed_with_certainty_are_parsed_as_sent() {
    for query in [
        // a placeholder written by the client
        r#"x{a=~"b", c="tenant-proxy-regex-0"}"#,
        // an operator the lexer refuses, a literal that never closes
        r#"x{a!=~"b"}"#,
        r#"x{a=~"b}"#,
        r#"x{a=~ b}"#,
        // an escape the lexer does not know
        r#"x{a=~"\q"}"#,
    ] {
        let set_aside = client_regex::SetAside::of(query).and_then(|s| s.parse());
        assert!(set_aside.is_none(), "{query}");
        if query.contains("tenant-proxy-regex-") {
            // Declined before anything is set aside, not only by the count
            // of placeholders put back.
            assert!(client_regex::SetAside::of(query).is_none(), "{query}");
        }
        assert_eq!(
            enforce_query(query, &one()),
            enforce_as_parsed(query, &one()),
            "{query}"
        );
    }
}

/// The verification's swaps turn client regex matchers into sentinel
/// equalities; a text that lacks the tenant's matcher somewhere is still
/// refused, even when a client matcher prints like the tenant's.
#[test]
fn swapping_client_regexes_never_lets_an_unenforced_text_pass() {
    let tenant = two();
    let ours = r#"namespace=~"team-a|team-a\\.prod""#;
    // The swaps `collect` finds in `selector`, with `tenant` as the
    // tenant's own matchers.
    let collect = |selector: &str, tenant: &[Matcher], swaps: &mut Vec<client_regex::Swap>| {
        let Expr::VectorSelector(vs) = parse(selector).unwrap() else {
            unreachable!()
        };
        client_regex::collect(&vs, tenant, swaps);
    };
    let swaps = |printed: &[&str]| -> Vec<client_regex::Swap> {
        let mut swaps = Vec::new();
        for p in printed {
            collect(&format!("x{{{p}}}"), &[], &mut swaps);
        }
        swaps
    };
    let client = swaps(&[
        r#"route=~"/v1/.*""#,
        ours,
        r#"space=~"team-a|team-a\\.prod""#,
    ]);
    let printed: Vec<&str> = client.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        printed,
        [
            r#"route=~"/v1/.*""#,
            ours,
            r#"space=~"team-a|team-a\\.prod""#
        ]
    );
    // Collected from a real selector: each client regex once; neither the
    // tenant's own matcher nor an equality.
    let mut collected = Vec::new();
    collect(
        &format!(r#"x{{route=~"/v1/.*", job="api", {ours}, route=~"/v1/.*", code!~"5.."}}"#),
        &tenant.matchers,
        &mut collected,
    );
    let printed: Vec<&str> = collected.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(printed, [r#"route=~"/v1/.*""#, r#"code!~"5..""#]);
    assert_eq!(
        verify(
            &format!(r#"x{{route=~"/v1/.*", {ours}}}"#),
            &tenant,
            &client
        ),
        Ok(())
    );
    for escaping in [
        r#"x{route=~"/v1/.*"}"#.to_string(),
        format!(r#"x{{{ours}}} / y{{route=~"/v1/.*"}}"#),
        format!(r#"x{{{ours}}} / y{{name{ours}}}"#),
        format!(r#"x{{{ours}}} / y{{namespace="tenant-proxy-verify-client"}}"#),
    ] {
        assert_eq!(
            verify(&escaping, &tenant, &client),
            Err(EnforceError::Unenforced),
            "{escaping}"
        );
    }
    // A printed matcher whose literal does not close at its end is not
    // swapped: the text is verified as it is.
    let swap = |printed: &str| vec![(printed.to_string(), r#"a="y""#.to_string())];
    assert_eq!(
        client_regex::swap_for_verification(r#"x{a=~"x",b="c"}"#, &swap(r#"a=~"x""#)).as_deref(),
        Some(r#"x{a="y",b="c"}"#)
    );
    // Each of these would end with a closed double-quoted literal if one
    // quote style, an escape outside a literal, or a literal left open
    // were overlooked.
    for unclosed in [
        r#"a=~"x"#,
        r#"a=~"x" b"#,
        r#"a=~"x"y""#,
        r#"a=~'x'"y""#,
        r#"a=~`x`"y""#,
        r#"a=~\"x""#,
    ] {
        assert_eq!(
            client_regex::swap_for_verification("text", &swap(unclosed)),
            None,
            "{unclosed}"
        );
    }
}

fn tricky_value() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "a", ".*", "|", "=~", "!~", "\"", "'", "`", "\\", "#", "}", "{1}", "é", "\n", " ",
        ]),
        0..5,
    )
    .prop_map(|parts| parts.concat())
}

/// A literal of `value` in one of PromQL's quote styles; `None` when the
/// style cannot hold it (backticks hold no backtick and no backslash).
fn quoted(value: &str, quote: char) -> Option<String> {
    if quote == '`' {
        return (!value.contains(['`', '\\'])).then(|| format!("`{value}`"));
    }
    let mut out = String::from(quote);
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    Some(out)
}

/// Literals of values that are valid regexes (an invalid one is refused
/// the long way and forwarded for the upstream to refuse the short way:
/// `an_invalid_client_regex_is_left_to_the_upstream`).
fn tricky_literal() -> impl Strategy<Value = String> {
    (tricky_value(), prop::sample::select(vec!['"', '\'', '`']))
        .prop_filter("a valid regex", |(v, _)| {
            regex::Regex::new(&format!("^(?:{v})$")).is_ok()
        })
        .prop_filter_map("the quote style holds the value", |(v, q)| quoted(&v, q))
}

fn tricky_selector() -> impl Strategy<Value = String> {
    let matcher = (
        prop::sample::select(vec!["job", "namespace", "\"a.b\""]),
        prop::sample::select(vec!["=", "!=", "=~", "!~"]),
        prop::sample::select(vec!["", " ", "\n"]),
        tricky_literal(),
    )
        .prop_map(|(l, o, s, v)| format!("{l}{s}{o}{s}{v}"));
    (
        prop::sample::select(vec!["up", "http_requests_total"]),
        prop::collection::vec(matcher, 1..4),
    )
        .prop_map(|(n, m)| format!("{n}{{{}}}", m.join(", ")))
}

/// Many tricky values are no valid regex or do not fit a quote style, so
/// about half the literals drawn are rejected: a run of many cases
/// (`PROPTEST_CASES=100000`) passes proptest's default budget of 65,536
/// rejects and would abort without a failure.
fn tricky_config() -> ProptestConfig {
    ProptestConfig {
        max_local_rejects: u32::MAX,
        ..ProptestConfig::default()
    }
}

fn tricky_query() -> impl Strategy<Value = String> {
    (
        tricky_selector(),
        tricky_selector(),
        tricky_literal(),
        prop::sample::select(vec!["", "# note =~ \"x\"\n", "# it's\n"]),
    )
        .prop_map(|(a, b, lit, comment)| {
            format!("sum(rate({a}[5m])) {comment}/ label_replace({b}, \"d\", {lit}, \"s\", \"\")")
        })
}

proptest! {
    #![proptest_config(tricky_config())]

    /// Setting regexes aside changes nothing: the enforced text, or the
    /// refusal, is the one the long way gives, byte for byte.
    #[test]
    fn regexes_set_aside_enforce_exactly_as_parsing_them_does(query in tricky_query()) {
        prop_assert_eq!(enforce_query(&query, &two()), enforce_as_parsed(&query, &two()));
    }
}

/// A regex Rust's engine refuses (RE2 may take it) is the upstream's to
/// judge now: the query is enforced and the regex forwarded as written.
#[test]
fn an_invalid_client_regex_is_left_to_the_upstream() {
    let query = r#"x{a=~"(unclosed"}"#;
    assert!(enforce_as_parsed(query, &one()).is_err());
    assert_eq!(
        enforce_query(query, &one()).as_deref(),
        Ok(r#"x{a=~"(unclosed",namespace="team-a"}"#)
    );
}

// === shapes (shape.rs) ===

/// The shape of `query` for `tenant`: the text with placeholders, and how
/// many there are. Filling the text alone gives the query back (with its
/// literals in double quotes).
fn shape_of(query: &str, tenant: &TenantMatcher) -> Option<(String, usize)> {
    let shape = shape::Shape::of(query, tenant)?;
    let itself = shape::Template {
        text: shape.text.clone(),
    };
    let filled = shape.fill(&itself).expect("the shape fills itself");
    assert_eq!(filled, query.replace(['\'', '`'], "\""));
    let placeholders = shape.text.matches("\"tenant-proxy-shape-").count();
    Some((shape.text, placeholders))
}

#[test]
fn a_shape_replaces_plain_matcher_values_only() {
    let tenant = one();
    let (text, placeholders) = shape_of(
        r#"sum by (code) (rate(http_requests_total{job="api", instance=~"web-1.*"}[5m]))"#,
        &tenant,
    )
    .unwrap();
    assert_eq!(
        text,
        r#"sum by (code) (rate(http_requests_total{job="tenant-proxy-shape-0", instance=~"tenant-proxy-shape-1"}[5m]))"#
    );
    assert_eq!(placeholders, 2);
    // Left as written: an empty value, an escape, non-ASCII, the tenant's
    // own value, a quoted label name, a function's string argument, a
    // string compared with `==`, a comment.
    let (text, _) = shape_of(
        "x{a=\"\", b=\"q\\\"\", c=\"é\", namespace=\"team-a\", \"d.e\"!='v', f!~`w.+`} # g=\"h\"\n\
         + label_replace(y{i=\"j\"}, \"k\", \"$1\", \"l\", \"(.*)\") == \"m\"",
        &tenant,
    )
    .unwrap();
    assert_eq!(
        text,
        "x{a=\"\", b=\"q\\\"\", c=\"é\", namespace=\"team-a\", \"d.e\"!=\"tenant-proxy-shape-0\", \
         f!~\"tenant-proxy-shape-1\"} # g=\"h\"\n\
         + label_replace(y{i=\"tenant-proxy-shape-2\"}, \"k\", \"$1\", \"l\", \"(.*)\") == \"m\""
    );
    // `<=` and `>=` compare.
    let (text, _) = shape_of(r#"x{a="b"} <= "c" >= "d""#, &tenant).unwrap();
    assert_eq!(text, r#"x{a="tenant-proxy-shape-0"} <= "c" >= "d""#);
    // Space may stand between a matcher operator and its value; after a
    // comparison `!=`, the next token ends it.
    let (text, _) = shape_of(
        "x{a= \"b\"} != 3 + label_replace(y, \"k\", \"$1\", \"l\", \"(.*)\")",
        &tenant,
    )
    .unwrap();
    assert_eq!(
        text,
        "x{a= \"tenant-proxy-shape-0\"} != 3 + label_replace(y, \"k\", \"$1\", \"l\", \"(.*)\")"
    );
}

#[test]
fn no_shape_where_the_query_is_not_lexed_with_certainty() {
    for query in [
        // nothing plain to replace
        "up",
        r#"up{namespace="team-a"}"#,
        // a placeholder or a sentinel written by the client
        r#"x{a="b", c="tenant-proxy-shape-0"}"#,
        r#"x{a="b"} # tenant-proxy-verify-0"#,
        // an escape the lexer does not know, a literal that never closes
        r#"x{a="b", c="\q"}"#,
        r#"x{a="b}"#,
    ] {
        assert!(shape::Shape::of(query, &one()).is_none(), "{query}");
    }
    // A tenant whose value holds the prefix: no shape either.
    let odd = TenantMatcher::new("namespace", &["tenant-proxy-shape-0".into()]).unwrap();
    assert!(shape::Shape::of(r#"x{a="b"}"#, &odd).is_none());
}

#[test]
fn a_template_is_filled_only_where_each_placeholder_stands_once() {
    let shape = shape::Shape::of(r#"x{a="b", c=~"d.*"}"#, &one()).unwrap();
    let template = |text: &str| shape::Template { text: text.into() };
    let filled = shape
        .fill(&template(
            r#"x{a="tenant-proxy-shape-0",c=~"tenant-proxy-shape-1",namespace="team-a"}"#,
        ))
        .unwrap();
    assert_eq!(filled, r#"x{a="b",c=~"d.*",namespace="team-a"}"#);
    for wrong in [
        // one missing, one twice, one unknown, one not a whole literal
        r#"x{a="tenant-proxy-shape-0"}"#,
        r#"x{a="tenant-proxy-shape-0",c=~"tenant-proxy-shape-1",d="tenant-proxy-shape-1"}"#,
        r#"x{a="tenant-proxy-shape-0",c=~"tenant-proxy-shape-1",d="tenant-proxy-shape-2"}"#,
        r#"x{a="tenant-proxy-shape-0",c=~"tenant-proxy-shape-1x"}"#,
        // one more, outside a literal
        r#"x{a="tenant-proxy-shape-0",c=~"tenant-proxy-shape-1"} # tenant-proxy-shape-0"#,
    ] {
        assert!(shape.fill(&template(wrong)).is_none(), "{wrong}");
    }
}

/// A value is written back only if promql-parser's lexer reads it,
/// between double quotes, as one literal: one that would close its
/// literal early, end in an escape, or add a token is not.
#[test]
fn a_value_is_filled_only_if_the_lexer_reads_it_as_one_literal() {
    for one in ["b", "web-1.*", "a'b", "a`b", "(a|b)+", " x "] {
        assert!(shape::is_one_literal(one), "{one}");
    }
    for not_one in [
        r#"a"b"#,
        r#"a\"#,
        r#"b",namespace="team-b"#,
        r#"b"} or up{a="c"#,
        r#"\q"#,
    ] {
        assert!(!shape::is_one_literal(not_one), "{not_one}");
    }
}

/// A template is verified like any enforced text before it is kept: one
/// that fails is not kept, and its queries are enforced the full way.
#[test]
fn a_template_is_kept_only_once_verified() {
    let tenant = one();
    let enforced = |text: &str| Enforced {
        text: text.into(),
        client_regexes: Vec::new(),
    };
    assert!(shape::Template::verified(
        enforced(r#"x{a="tenant-proxy-shape-0",namespace="team-a"}"#),
        &tenant
    )
    .is_some());
    for unverified in [
        r#"x{a="tenant-proxy-shape-0"}"#,
        r#"x{a="tenant-proxy-shape-0",namespace="team-a"} + y{b="tenant-proxy-shape-1"}"#,
        r#"x{a="tenant-proxy-shape-0",namespace="team-b"}"#,
    ] {
        assert!(
            shape::Template::verified(enforced(unverified), &tenant).is_none(),
            "{unverified}"
        );
    }
}

/// The shape memo's byte bound counts all a template holds: its key and
/// its enforced text.
#[test]
fn a_template_weighs_its_key_and_its_text() {
    let memo = Memo::new(100);
    memo.enforce_query(r#"sum(rate(x{pod=~"web-.*"}[5m]))"#, &two())
        .unwrap();
    let entries = memo.templates.entries.read().unwrap();
    let (key, template) = entries.map.iter().next().expect("one template");
    let template = template.as_ref().expect("enforced as a template");
    assert_eq!(entries.bytes, key.text.len() + template.text.len());
}

#[test]
fn queries_of_one_shape_share_a_template_and_enforce_as_the_full_way() {
    let memo = Memo::new(100);
    let tenant = two();
    for pod in ["web-1", "web-2", "api-7"] {
        let query = format!(
            r#"sum(rate(container_cpu_usage_seconds_total{{container!="", pod=~"{pod}-.*"}}[5m])) / sum(kube_pod_container_resource_requests{{resource="cpu", pod=~"{pod}-.*"}})"#
        );
        let shaped = memo.enforce_query(&query, &tenant).unwrap();
        assert_eq!(
            parser::parse(&shaped).unwrap().to_string(),
            enforce_query(&query, &tenant).unwrap(),
            "{query}"
        );
    }
    assert_eq!(memo.entries.len(), 3);
    assert_eq!(memo.templates.len(), 1, "one shape");
    // A selector (`match[]`) of one shape likewise, kept apart from queries.
    for job in ["api", "web"] {
        let selector = format!(r#"up{{job="{job}"}}"#);
        let shaped = memo.enforce_selector(&selector, &tenant).unwrap();
        assert_eq!(
            parser::parse(&shaped).unwrap().to_string(),
            enforce_selector(&selector, &tenant).unwrap()
        );
    }
    assert_eq!(memo.templates.len(), 2);
    // A shape the enforcement refuses is refused for every query of it,
    // with the error the full way gives.
    for job in ["api", "web"] {
        let query = format!(r#"info(up{{job="{job}"}})"#);
        assert_eq!(
            memo.enforce_query(&query, &tenant),
            Err(EnforceError::InfoFunction)
        );
    }
}

/// A shape's text, when there is one, is the one the full way gives, but
/// for the order of matchers within a selector: the printer sorts them as
/// printed, so a template's order follows its placeholders. Printed again
/// (sorted), it is the full way's byte for byte.
fn shaped_as_the_full_way(query: &str, tenant: &TenantMatcher) -> Result<(), TestCaseError> {
    let memo = Memo::new(100);
    if let Some(shaped) = memo.enforce_by_shape(query, Input::Query, tenant) {
        let sorted = parser::parse(&shaped).map(|expr| expr.to_string());
        prop_assert_eq!(
            sorted,
            enforce_query(query, tenant).map_err(|e| e.to_string()),
            "{}",
            query
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(tricky_config())]

    #[test]
    fn shaped_queries_enforce_exactly_as_the_full_way(query in expression()) {
        for tenant in [one(), two()] {
            shaped_as_the_full_way(&query, &tenant)?;
        }
    }

    #[test]
    fn shaped_tricky_queries_enforce_exactly_as_the_full_way(query in tricky_query()) {
        let narrowed = two().narrowed(&CredentialSelector::parse(r#"{app=~"pay.*", job="api"}"#).unwrap());
        for tenant in [one(), narrowed] {
            shaped_as_the_full_way(&query, &tenant)?;
        }
    }
}

/// A selector's text with one matcher per (name, op, value), values written
/// as Go string literals.
fn selector_text(matchers: &[(&str, &str, String)]) -> String {
    let written: Vec<String> = matchers
        .iter()
        .map(|(name, op, value)| {
            let escaped = value
                .replace('\\', r"\\")
                .replace('"', "\\\"")
                .replace('\n', r"\n");
            format!("{name}{op}\"{escaped}\"")
        })
        .collect();
    format!("{{{}}}", written.join(", "))
}

fn matchers() -> impl Strategy<Value = Vec<(&'static str, &'static str, String)>> {
    let literal = proptest::string::string_regex("[a-z\"\\\\\n é.]{0,6}").unwrap();
    let regex = proptest::string::string_regex("[a-z.*|]{0,6}").unwrap();
    let matcher = prop_oneof![
        (
            prop::sample::select(vec!["app", "env", "a_b"]),
            prop::sample::select(vec!["=", "!="]),
            literal
        ),
        (
            prop::sample::select(vec!["app", "env"]),
            prop::sample::select(vec!["=~", "!~"]),
            regex
        ),
    ];
    prop::collection::vec(matcher, 1..4)
}

proptest! {
    /// A client's selector joined to a credential's, as a Loki label-names
    /// request carries it in `query`: the printed text reads back as
    /// itself, holding the client's matchers and then every one of the
    /// credential's, values as written.
    #[test]
    fn a_joined_selector_reads_back_as_both(client in matchers(), own in matchers()) {
        let (Ok(a), Ok(b)) = (
            CredentialSelector::parse(&selector_text(&client)),
            CredentialSelector::parse(&selector_text(&own)),
        ) else {
            return Ok(()); // no matcher that selects streams, a bad regex
        };
        let joined = a.and(&b);
        let read = CredentialSelector::parse(joined.as_str()).unwrap();
        prop_assert_eq!(read.as_str(), joined.as_str());
        let printed = |s: &CredentialSelector| s.matchers.iter().map(ToString::to_string).collect::<Vec<_>>();
        let mut both = printed(&a);
        both.extend(printed(&b));
        prop_assert_eq!(printed(&read), both);
        for (name, _, value) in client.iter().chain(&own) {
            prop_assert!(read.matchers.iter().any(|m| m.name == *name && m.value == *value));
        }
    }
}
