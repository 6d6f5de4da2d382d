//! PromQL and series selectors. Invariants: enforced or refused, never a
//! panic (the parser is bounded first); an enforced query is a fixed point
//! (enforcing it again changes nothing); and, read by promql-parser on its
//! own (its regexes compiled, none of the proxy's shortcuts), every
//! selector of what would be forwarded carries the tenant's matcher.
//!
//! The memo, as the proxy serves queries, is driven too: an input holding
//! a NUL byte is two queries, sent one after the other, so the second may
//! be enforced from the shape of the first. What the memo answers obeys
//! the same invariant, and is the text the full way gives but for the
//! order of matchers within a selector (printed again, it is that text).
#![no_main]

use libfuzzer_sys::fuzz_target;
use promql_parser::label::Matcher;
use promql_parser::parser::{self, Expr, VectorSelector};
use tenant_proxy::enforce::promql::{enforce_query, enforce_selector, Memo, TenantMatcher};

fuzz_target!(|data: &[u8]| {
    // libfuzzer-sys's hook aborts on any panic, even one the proxy
    // survives: promql::parse turns promql-parser's panics into parse
    // errors on purpose. The default hook instead, left silent for those;
    // a panic that escapes the target still aborts (libfuzzer-sys's
    // catch_unwind), its message printed.
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        // The first take removes libfuzzer-sys's hook, leaving the
        // default, which the second takes.
        let _ = std::panic::take_hook();
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !tenant_proxy::ops::panics::surviving() {
                default(info);
            }
        }));
    });
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let tenants = [
        TenantMatcher::new("namespace", &["team-a".into()]).unwrap(),
        TenantMatcher::new("namespace", &["team-a".into(), "team.a+2".into()]).unwrap(),
    ];
    for tenant in &tenants {
        let ours = tenant_matcher(tenant);
        let memo = Memo::new(16);
        let (first, second) = text.split_once('\0').unwrap_or((text, text));
        for query in [first, second] {
            if let Ok(remembered) = memo.enforce_query(query, tenant) {
                assert_every_selector_carries(&remembered, &ours, query);
                // Unless promql-parser refuses it (see below).
                let printed = std::panic::catch_unwind(|| parser::parse(&remembered));
                if let (Ok(full), Ok(Ok(expr))) = (enforce_query(query, tenant), printed) {
                    assert_eq!(expr.to_string(), full, "{query:?}");
                }
            }
        }
        if let Ok(enforced) = enforce_query(text, tenant) {
            assert_eq!(
                enforce_query(&enforced, tenant).as_deref(),
                Ok(enforced.as_str()),
                "{text:?}"
            );
            assert_every_selector_carries(&enforced, &ours, text);
        }
        if let Ok(enforced) = enforce_selector(text, tenant) {
            assert_eq!(
                enforce_selector(&enforced, tenant).as_deref(),
                Ok(enforced.as_str()),
                "{text:?}"
            );
            assert_every_selector_carries(&enforced, &ours, text);
        }
    }
});

/// The tenant's matcher, as promql-parser reads the proxy's own selector.
fn tenant_matcher(tenant: &TenantMatcher) -> Matcher {
    match parser::parse(&tenant.selector()) {
        Ok(Expr::VectorSelector(vs)) => vs.matchers.matchers[0].clone(),
        other => panic!("the tenant's selector: {other:?}"),
    }
}

/// Unless promql-parser refuses the text (a client regex Rust's engine does
/// not take is forwarded for the upstream to judge), every selector in it
/// has a matcher with the tenant's label, operator and value.
fn assert_every_selector_carries(enforced: &str, ours: &Matcher, input: &str) {
    let Ok(Ok(expr)) = std::panic::catch_unwind(|| parser::parse(enforced)) else {
        return;
    };
    let mut selectors = Vec::new();
    collect(&expr, &mut selectors);
    for vs in selectors {
        let carried = vs.matchers.or_matchers.is_empty()
            && vs.matchers.matchers.iter().any(|m| {
                m.name == ours.name
                    && m.value == ours.value
                    && std::mem::discriminant(&m.op) == std::mem::discriminant(&ours.op)
            });
        assert!(carried, "{input:?} forwarded as {enforced:?}: {vs:?}");
    }
}

/// Every vector selector, wherever it sits (promql-parser's own visitor
/// skips aggregation parameters).
fn collect<'e>(expr: &'e Expr, out: &mut Vec<&'e VectorSelector>) {
    match expr {
        Expr::VectorSelector(vs) => out.push(vs),
        Expr::MatrixSelector(ms) => out.push(&ms.vs),
        Expr::Aggregate(a) => {
            if let Some(param) = &a.param {
                collect(param, out);
            }
            collect(&a.expr, out);
        }
        Expr::Unary(u) => collect(&u.expr, out),
        Expr::Binary(b) => {
            collect(&b.lhs, out);
            collect(&b.rhs, out);
        }
        Expr::Paren(p) => collect(&p.expr, out),
        Expr::Subquery(s) => collect(&s.expr, out),
        Expr::Call(c) => c.args.args.iter().for_each(|a| collect(a, out)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}
