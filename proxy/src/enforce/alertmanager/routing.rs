//! Alertmanager's routing tree as a tenant sees it: the routes its alerts
//! can take, and the receivers they name.
//!
//! A vanilla Alertmanager lists every receiver of its configuration, and
//! its status holds the whole configuration: receivers' names tell one
//! tenant of the others (`team-b-pager`), their settings hold URLs, keys
//! and passwords. Label mode reads the routing tree from the status
//! (`config.original`, as Alertmanager printed what it loaded) and keeps a
//! route only when it, and each route above it, can take an alert carrying
//! one of the tenant's values of the label: every matcher of theirs on the
//! label accepts that value. The root route has no matchers (Alertmanager
//! refuses them), so it is always kept.
//!
//! What a tenant is shown:
//! - the receivers the kept routes name, by name only, in the
//!   configuration's order (`GET …/receivers`);
//! - the kept routes as a configuration (`GET …/status`): grouping, timers,
//!   `continue` and the matchers on other labels as they are, the matchers
//!   on the tenant label replaced by one naming only the tenant's values
//!   that pass there (a shared `namespace=~"team-a|team-b"` would name
//!   another tenant), the receivers by name, the time intervals the routes
//!   name; no global settings, templates or inhibit rules. Routes the
//!   tenant's alerts cannot take only ever refused them, so the kept ones
//!   route the tenant's alerts as the whole tree does.
//!
//! Matchers on other labels are taken to accept anything, so a kept route
//! may be one the tenant's alerts never take in practice (a shared
//! `severity="critical"` route), never one on other tenants' values only.
//! A matcher that cannot be read here (a regex the `regex` crate does not
//! compile, a form Alertmanager does not print) closes its route and those
//! under it.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_yaml_ng::Value as Yaml;

use super::{alternation, printed_matcher, unfilterable, TenantAlerts};
use crate::http::error::ProxyError;

/// What of Alertmanager's configuration a tenant may be shown.
#[derive(Deserialize)]
struct Config {
    route: Route,
    #[serde(default)]
    receivers: Vec<Receiver>,
    #[serde(default)]
    time_intervals: Vec<Interval>,
    #[serde(default)]
    mute_time_intervals: Vec<Interval>,
}

#[derive(Deserialize)]
struct Receiver {
    name: String,
}

/// A named time interval: its times are shown as they are.
#[derive(Deserialize, Serialize)]
struct Interval {
    name: String,
    #[serde(default)]
    time_intervals: Yaml,
}

/// One node of the routing tree, with the fields shown to a tenant.
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
    #[serde(flatten)]
    settings: Settings,
    #[serde(default)]
    mute_time_intervals: Vec<String>,
    #[serde(default)]
    active_time_intervals: Vec<String>,
}

/// What a route does with the alerts it takes, shown as it is.
#[derive(Deserialize, Serialize)]
struct Settings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group_by: Option<Yaml>,
    #[serde(default, rename = "continue", skip_serializing_if = "Option::is_none")]
    continues: Option<Yaml>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group_wait: Option<Yaml>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group_interval: Option<Yaml>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    repeat_interval: Option<Yaml>,
}

/// A kept route as it is shown.
#[derive(Serialize)]
struct ShownRoute<'c> {
    #[serde(skip_serializing_if = "Option::is_none")]
    receiver: Option<&'c str>,
    #[serde(flatten)]
    settings: &'c Settings,
    #[serde(rename = "match", skip_serializing_if = "BTreeMap::is_empty")]
    equal: BTreeMap<&'c str, &'c str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    match_re: BTreeMap<&'c str, &'c str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    matchers: Vec<String>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    mute_time_intervals: &'c [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    active_time_intervals: &'c [String],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<ShownRoute<'c>>,
}

/// The configuration a tenant is shown.
#[derive(Serialize)]
struct ShownConfig<'c> {
    route: ShownRoute<'c>,
    receivers: Vec<ShownReceiver<'c>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    time_intervals: Vec<&'c Interval>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mute_time_intervals: Vec<&'c Interval>,
}

#[derive(Serialize)]
struct ShownReceiver<'c> {
    name: &'c str,
}

/// What the kept routes name.
#[derive(Default)]
struct Named<'c> {
    receivers: HashSet<&'c str>,
    intervals: HashSet<&'c str>,
}

impl Named<'_> {
    fn intervals_of<'l>(&self, list: &'l [Interval]) -> Vec<&'l Interval> {
        (list.iter())
            .filter(|i| self.intervals.contains(i.name.as_str()))
            .collect()
    }
}

/// Answers a `GET …/receivers` from Alertmanager's status: the receivers
/// the tenant's routes name, in the shape Alertmanager lists them
/// (`[{"name": …}]`). A status whose configuration cannot be read is 502.
pub fn tenant_receivers(status: &[u8], tenant: &TenantAlerts<'_>) -> Result<Vec<u8>, ProxyError> {
    let status: Value = serde_json::from_slice(status).map_err(|e| unfilterable(e.to_string()))?;
    let original = status["config"]["original"]
        .as_str()
        .ok_or_else(|| unfilterable("a status without config.original".into()))?;
    let config = read(original).map_err(unfilterable)?;
    let receivers = config
        .shown(tenant)
        .map(|shown| shown.receivers)
        .unwrap_or_default();
    serde_json::to_vec(&receivers)
        .map_err(|e| ProxyError::Internal(format!("cannot write the receivers: {e}")))
}

/// The configuration the tenant is shown in place of `original` (the
/// status's `config.original`); empty when it cannot be read.
pub fn tenant_configuration(original: &str, tenant: &TenantAlerts<'_>) -> String {
    let Ok(config) = read(original) else {
        return String::new();
    };
    config
        .shown(tenant)
        .and_then(|shown| serde_yaml_ng::to_string(&shown).ok())
        .unwrap_or_default()
}

fn read(original: &str) -> Result<Config, String> {
    serde_yaml_ng::from_str(original).map_err(|e| format!("cannot read the configuration: {e}"))
}

impl Config {
    fn shown(&self, tenant: &TenantAlerts<'_>) -> Option<ShownConfig<'_>> {
        let values: Vec<&str> = tenant.owned.iter().map(String::as_str).collect();
        let mut named = Named::default();
        let route = self.route.shown(tenant.label, values, &mut named)?;
        let receivers = (self.receivers.iter())
            .filter(|r| named.receivers.contains(r.name.as_str()))
            .map(|r| ShownReceiver { name: &r.name })
            .collect();
        Some(ShownConfig {
            route,
            receivers,
            time_intervals: named.intervals_of(&self.time_intervals),
            mute_time_intervals: named.intervals_of(&self.mute_time_intervals),
        })
    }
}

impl Route {
    /// This route as the tenant is shown it, if an alert whose `label` is
    /// one of `values` can take it; what it and the routes under it name
    /// are added to `named`.
    fn shown<'c>(
        &'c self,
        label: &str,
        mut values: Vec<&str>,
        named: &mut Named<'c>,
    ) -> Option<ShownRoute<'c>> {
        let (tests, mut matchers) = self.read_matchers(label);
        values.retain(|v| tests.iter().all(|t| t.accepts(v)));
        if values.is_empty() {
            return None;
        }
        named.receivers.extend(self.receiver.as_deref());
        let intervals = self
            .mute_time_intervals
            .iter()
            .chain(&self.active_time_intervals);
        named.intervals.extend(intervals.map(String::as_str));
        let others = |map: &'c BTreeMap<String, String>| -> BTreeMap<&'c str, &'c str> {
            (map.iter())
                .filter(|(name, _)| *name != label)
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .collect()
        };
        if !tests.is_empty() {
            matchers.push(pin(label, &values));
        }
        let routes = (self.routes.iter())
            .filter_map(|child| child.shown(label, values.clone(), named))
            .collect();
        Some(ShownRoute {
            receiver: self.receiver.as_deref(),
            settings: &self.settings,
            equal: others(&self.equal),
            match_re: others(&self.match_re),
            matchers,
            mute_time_intervals: &self.mute_time_intervals,
            active_time_intervals: &self.active_time_intervals,
            routes,
        })
    }

    /// This route's matchers on `label` (the three forms), each compiled
    /// once, and the texts of its `matchers` on other labels, kept as they
    /// are. One that cannot be read is a test nothing passes.
    fn read_matchers(&self, label: &str) -> (Vec<Test>, Vec<String>) {
        let equal = self.equal.get(label).map(|v| Test::Equal(v.clone()));
        let regex = self.match_re.get(label).map(|re| Test::regex(re, true));
        let mut tests: Vec<Test> = equal.into_iter().chain(regex).collect();
        let mut others = Vec::new();
        for text in &self.matchers {
            match RouteMatcher::parse(text) {
                Some(m) if m.name != label => others.push(text.clone()),
                Some(m) => tests.push(m.test()),
                None => tests.push(Test::Never),
            }
        }
        (tests, others)
    }
}

/// The one matcher on `label` a kept route is shown with: the values that
/// pass there.
fn pin(label: &str, values: &[&str]) -> String {
    match values {
        [one] => printed_matcher(label, "=", one),
        many => printed_matcher(label, "=~", &alternation(many.iter().copied())),
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
pub fn go_unquote(quoted: &str) -> Option<String> {
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        if c == '\\' && !chars.next().is_some_and(|escaped| escaped.is_ascii()) {
            return None;
        }
    }
    promql_parser::util::unquote_string(quoted).ok()
}

/// The byte offset of the quote closing the Go-quoted string `text` opens.
pub fn closing_quote(text: &str) -> Option<usize> {
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
