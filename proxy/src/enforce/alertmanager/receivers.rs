//! The receivers a tenant is shown: those its alerts can reach.
//!
//! A vanilla Alertmanager lists every receiver of its configuration, and
//! their names tell one tenant of the others (`team-b-pager`). Label mode
//! asks for the status instead, reads the routing tree from the
//! configuration in it (`config.original`, as Alertmanager printed what it
//! loaded) and lists a receiver only when a route naming it, and each route
//! above it, can take an alert carrying one of the tenant's values of the
//! label: every matcher of theirs on the label accepts that value. The root
//! route has no matchers (Alertmanager refuses them), so its receiver is
//! always listed.
//!
//! The list may name more than the tenant's alerts reach in practice, never
//! a receiver whose routes all refuse the tenant's values: matchers on other
//! labels are taken to accept anything, and neither `continue` nor the order
//! of sibling routes is followed (each could only take receivers away),
//! while a matcher that cannot be read here (a regex the `regex` crate does
//! not compile, a form Alertmanager does not print) closes its route and
//! everything under it.

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;
use serde_json::Value;

use super::{unfilterable, TenantAlerts};
use crate::http::error::ProxyError;

/// What of Alertmanager's configuration decides where an alert goes.
#[derive(Deserialize)]
struct Config {
    route: Route,
    #[serde(default)]
    receivers: Vec<Receiver>,
}

#[derive(Deserialize)]
struct Receiver {
    name: String,
}

/// One node of the routing tree: the fields that select alerts (timers and
/// grouping do not; `continue` is not followed, above).
#[derive(Deserialize)]
struct Route {
    #[serde(default)]
    receiver: Option<String>,
    /// Deprecated equality matchers, name to value.
    #[serde(default, rename = "match")]
    equal: BTreeMap<String, String>,
    /// Deprecated regex matchers, name to regex (anchored).
    #[serde(default)]
    match_re: BTreeMap<String, String>,
    /// Matchers as Alertmanager prints them: `name="value"`, `name=~"re"`.
    #[serde(default)]
    matchers: Vec<String>,
    #[serde(default)]
    routes: Vec<Route>,
}

/// Answers a `GET …/receivers` from Alertmanager's status: the receivers
/// the tenant's alerts can reach, in the configuration's order, in the
/// shape Alertmanager lists them (`[{"name": …}]`).
pub fn tenant_receivers(status: &[u8], tenant: &TenantAlerts<'_>) -> Result<Vec<u8>, ProxyError> {
    let status: Value = serde_json::from_slice(status).map_err(|e| unfilterable(e.to_string()))?;
    let original = status["config"]["original"]
        .as_str()
        .ok_or_else(|| unfilterable("a status without config.original".into()))?;
    let config: Config = serde_yaml_ng::from_str(original)
        .map_err(|e| unfilterable(format!("cannot read the configuration: {e}")))?;
    let values: Vec<&str> = tenant.owned.iter().map(String::as_str).collect();
    let mut reachable = HashSet::new();
    reach(&config.route, tenant.label, values, &mut reachable);
    let listed: Vec<Value> = config
        .receivers
        .iter()
        .filter(|r| reachable.contains(r.name.as_str()))
        .map(|r| serde_json::json!({ "name": r.name }))
        .collect();
    Ok(Value::from(listed).to_string().into_bytes())
}

/// Adds the receivers of `route` and of the routes under it that an alert
/// whose `label` is one of `values` can reach. (A route without a receiver
/// uses its parent's, which is in already: the parent took the alert.)
fn reach<'c>(
    route: &'c Route,
    label: &str,
    mut values: Vec<&str>,
    reachable: &mut HashSet<&'c str>,
) {
    let tests = route.tests_on(label);
    values.retain(|v| tests.iter().all(|t| t.accepts(v)));
    if values.is_empty() {
        return;
    }
    if let Some(name) = &route.receiver {
        reachable.insert(name);
    }
    for child in &route.routes {
        reach(child, label, values.clone(), reachable);
    }
}

impl Route {
    /// This route's matchers on `label`, each compiled once.
    fn tests_on(&self, label: &str) -> Vec<Test> {
        let equal = self.equal.get(label).map(|v| Test::Equal(v.clone()));
        let regex = self.match_re.get(label).map(|re| Test::regex(re, true));
        let matchers = self
            .matchers
            .iter()
            .filter_map(|text| match RouteMatcher::parse(text) {
                Some(m) if m.name != label => None,
                Some(m) => Some(m.test()),
                None => Some(Test::Never),
            });
        equal.into_iter().chain(regex).chain(matchers).collect()
    }
}

/// A matcher on the tenant label, ready to be asked about each value.
enum Test {
    Equal(String),
    NotEqual(String),
    /// Anchored; `true` when a match passes (`=~`), `false` for `!~`.
    Regex(regex::Regex, bool),
    /// A matcher not read here: nothing passes.
    Never,
}

impl Test {
    /// Alertmanager anchors a matcher's regex (`^(?:re)$`) and compiles it
    /// with Go's RE2; one the `regex` crate does not read passes nothing.
    fn regex(regex: &str, passes_on_match: bool) -> Self {
        match regex::Regex::new(&format!("^(?:{regex})$")) {
            Ok(anchored) => Test::Regex(anchored, passes_on_match),
            Err(_) => Test::Never,
        }
    }

    fn accepts(&self, value: &str) -> bool {
        match self {
            Test::Equal(v) => v == value,
            Test::NotEqual(v) => v != value,
            Test::Regex(re, passes_on_match) => re.is_match(value) == *passes_on_match,
            Test::Never => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Equal,
    NotEqual,
    Regex,
    NotRegex,
}

/// One matcher of a route, read from Alertmanager's printing of it.
#[derive(Debug, PartialEq, Eq)]
struct RouteMatcher {
    name: String,
    op: Op,
    value: String,
}

impl RouteMatcher {
    /// Reads `name<op>"value"` as Alertmanager prints a matcher: the name
    /// bare, or Go-quoted when it holds a character the classic syntax
    /// reserves; the value always in double quotes, escaped the OpenMetrics
    /// way (a subset of Go's escapes) or Go's. `None` for anything else.
    fn parse(text: &str) -> Option<Self> {
        let (name, rest) = match text.strip_prefix('"') {
            Some(_) => {
                let end = closing_quote(text)?;
                let name = go_unquote(&text[..=end])?;
                (name, &text[end + 1..])
            }
            None => {
                let end = text.find(['=', '!'])?;
                (text[..end].to_owned(), &text[end..])
            }
        };
        let (op, quoted) = [
            ("=~", Op::Regex),
            ("!~", Op::NotRegex),
            ("!=", Op::NotEqual),
            ("=", Op::Equal),
        ]
        .into_iter()
        .find_map(|(spelling, op)| rest.strip_prefix(spelling).map(|v| (op, v)))?;
        if name.is_empty() || !quoted.starts_with('"') {
            return None;
        }
        let value = go_unquote(quoted)?;
        Some(Self { name, op, value })
    }

    fn test(self) -> Test {
        match self.op {
            Op::Equal => Test::Equal(self.value),
            Op::NotEqual => Test::NotEqual(self.value),
            Op::Regex => Test::regex(&self.value, true),
            Op::NotRegex => Test::regex(&self.value, false),
        }
    }
}

/// A Go-quoted string's text. promql-parser 0.11's `unquote_string` panics
/// on a `\` before a character beyond ASCII (it slices inside it), an
/// escape Go refuses too: refused here before it is called.
fn go_unquote(quoted: &str) -> Option<String> {
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        if c == '\\' && !chars.next().is_some_and(|escaped| escaped.is_ascii()) {
            return None;
        }
    }
    promql_parser::util::unquote_string(quoted).ok()
}

/// The byte offset of the quote closing the Go-quoted string `text` opens.
fn closing_quote(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (at, c) in text.char_indices().skip(1) {
        match (escaped, c) {
            (true, _) => escaped = false,
            (false, '\\') => escaped = true,
            (false, '"') => return Some(at),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests;
