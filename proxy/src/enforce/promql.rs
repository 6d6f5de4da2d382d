//! PromQL enforcement for label mode: every selector of a query, and every
//! `match[]` selector, gets the tenant's matcher. Pure functions over the
//! promql-parser AST; the request plumbing lives in `prometheus.rs`.
//!
//! Rules (see docs/promql-enforcement.md):
//! - the tenant matcher is added to every vector and matrix selector, wherever
//!   it sits (functions, aggregation parameters, binary operations,
//!   subqueries, `offset`/`@` forms). The walker below is ours, not the
//!   crate's, because the crate's skips aggregation parameters
//!   (`topk(scalar(x), y)`) and treats matrix selectors as leaves;
//! - a user's matchers on the tenant label are kept, so they are ANDed with
//!   ours and can only narrow the result;
//! - `or` groups inside a selector (a GreptimeDB extension the parser accepts
//!   and Prometheus does not) are refused: the printer would drop our matcher;
//! - `info()` reads series the query does not name: refused;
//! - queries that could overflow the stack are refused before parsing;
//! - the output is parsed again and every selector checked; a miss is a bug,
//!   reported as such (500), never forwarded.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{self, Expr, VectorSelector};

mod client_regex;
mod shape;

use shape::{Shape, Template};

/// Longest query accepted. Large regex alternations from dashboards fit.
pub const MAX_QUERY_BYTES: usize = 128 * 1024;

/// Most tokens that can deepen the syntax tree (brackets and operators
/// outside label matchers). The parser, printer and drop are recursive; a
/// debug build overflows a 2 MiB runtime thread at ~1,000 nested calls and a
/// release build at ~3,000, so 256 keeps a wide margin while staying far
/// above what dashboards write (tested below).
pub const MAX_NESTING_TOKENS: usize = 256;

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnforceError {
    #[error("query longer than {MAX_QUERY_BYTES} bytes")]
    TooLong,
    #[error("query too complex (more than {MAX_NESTING_TOKENS} operators and brackets)")]
    TooComplex,
    #[error("cannot parse query: {0}")]
    Parse(String),
    #[error("`or` inside a label selector is not PromQL")]
    OrInSelector,
    #[error("info() is not allowed: it reads series the query does not name")]
    InfoFunction,
    #[error("match[] must be a series selector, e.g. {{job=\"api\"}}")]
    NotASelector,
    #[error("this PromQL construct is not supported")]
    Unsupported,
    #[error("enforcement left a selector without the tenant matcher")]
    Unenforced,
}

impl EnforceError {
    /// Client errors are 400; `Unenforced` is our bug and a 500.
    pub fn is_client_error(&self) -> bool {
        !matches!(self, Self::Unenforced)
    }
}

// === impl TenantMatcher ===

/// The matcher a tenant's selectors must carry: `label="v"` for one value,
/// `label=~"v1|v2"` with every value regex-quoted for several.
#[derive(Clone, Debug)]
pub struct TenantMatcher {
    /// The tenant's label matcher first, then a credential's own selector's.
    matchers: Vec<Matcher>,
    /// The matchers as printed: identifies them by content (for the memo).
    printed: Arc<str>,
    /// For the verifying re-parse, when a matcher is a regex.
    stand_in: Option<StandIn>,
}

/// How the verifying re-parse avoids compiling the tenant's own regexes
/// (a three-namespace alternation costs ~190 µs per compile, per query):
/// each `=~`/`!~` matcher as printed is swapped, in a copy of the enforced text,
/// for an equality on a sentinel value, and selectors must carry the
/// sentinels. The printer writes string literals with `"` escaped, so a
/// printed matcher `label=~"..."` occurs in the text only as a matcher; and
/// a text that already holds a sentinel is verified the full way.
#[derive(Debug, Clone)]
struct StandIn {
    /// (the regex matcher as printed, its sentinel matcher as printed)
    swaps: Vec<client_regex::Swap>,
    /// The matchers with each regex one replaced by its sentinel.
    matchers: Vec<Matcher>,
}

impl StandIn {
    fn of(matchers: &[Matcher]) -> Option<Self> {
        let mut swaps = Vec::new();
        let stand_ins = matchers
            .iter()
            .enumerate()
            .map(|(i, m)| match m.op {
                MatchOp::Re(_) | MatchOp::NotRe(_) => {
                    let value = format!("tenant-proxy-verify-{i}");
                    let sentinel = Matcher::new(MatchOp::Equal, &m.name, &value);
                    swaps.push((m.to_string(), sentinel.to_string()));
                    sentinel
                }
                _ => m.clone(),
            })
            .collect();
        (!swaps.is_empty()).then_some(StandIn {
            swaps,
            matchers: stand_ins,
        })
    }

    /// The enforced text with the swaps made, unless it holds a sentinel.
    fn swapped(&self, enforced: &str) -> Option<String> {
        if self
            .swaps
            .iter()
            .any(|(_, s)| enforced.contains(s.as_str()))
        {
            return None;
        }
        client_regex::swap_for_verification(enforced, &self.swaps)
    }
}

impl TenantMatcher {
    /// The tenant's matcher narrowed by a credential's selector: both are
    /// added to every selector, so the credential sees the intersection.
    pub fn narrowed(&self, selector: &CredentialSelector) -> Self {
        let mut matchers = self.matchers.clone();
        matchers.extend(selector.matchers.iter().cloned());
        Self::from_matchers(matchers)
    }

    fn from_matchers(matchers: Vec<Matcher>) -> Self {
        let printed = matchers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
            .into();
        let stand_in = StandIn::of(&matchers);
        Self {
            matchers,
            printed,
            stand_in,
        }
    }

    /// Whether a label set (rules, alerts) passes every matcher; a label
    /// absent from the set reads as empty, as in PromQL.
    pub fn matches<'l>(&self, label: impl Fn(&str) -> Option<&'l str>) -> bool {
        self.matchers
            .iter()
            .all(|m| m.is_match(label(&m.name).unwrap_or("")))
    }

    pub fn new(label: &str, values: &[String]) -> Result<Self, String> {
        let matcher = match values {
            [] => return Err("a tenant without label values cannot be enforced".into()),
            [one] => Matcher::new(MatchOp::Equal, label, one),
            many => {
                let alternation = many
                    .iter()
                    .map(|v| quote_meta(v))
                    .collect::<Vec<_>>()
                    .join("|");
                let anchored = format!("^(?:{alternation})$");
                let regex = regex::Regex::new(&anchored).map_err(|e| e.to_string())?;
                Matcher::new(MatchOp::Re(regex), label, &alternation)
            }
        };
        Ok(Self::from_matchers(vec![matcher]))
    }

    /// A series selector selecting exactly the tenant's series, for
    /// endpoints called without `match[]`.
    pub fn selector(&self) -> String {
        format!("{{{}}}", self.printed)
    }

    #[cfg(test)]
    fn is_carried_by(&self, vs: &VectorSelector) -> bool {
        carries(vs, &self.matchers)
    }
}

/// A credential's own selector (`{app="payments"}`): the series or log
/// streams it may read within its tenant.
#[derive(Debug, Clone)]
pub struct CredentialSelector {
    matchers: Vec<Matcher>,
    /// Normalised: as the parser prints it.
    printed: String,
}

impl CredentialSelector {
    /// A plain `{...}` selector with at least one matcher, none of them on
    /// `__name__` (a metric-name restriction means nothing to Loki). The
    /// parser insists on a matcher that cannot match the empty value, as
    /// Loki does of a stream selector (`validateMatchers`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let expr = parse(text).map_err(|e| format!("selector {text:?}: {e}"))?;
        let Expr::VectorSelector(vs) = expr else {
            return Err(format!("selector {text:?} is not a plain {{...}} selector"));
        };
        if vs.name.is_some() || vs.offset.is_some() || vs.at.is_some() {
            return Err(format!("selector {text:?}: only label matchers in {{...}}"));
        }
        if !vs.matchers.or_matchers.is_empty() {
            return Err(format!("selector {text:?}: `or` is not supported"));
        }
        let matchers = vs.matchers.matchers;
        if matchers.is_empty() {
            return Err(format!("selector {text:?} has no matcher"));
        }
        if matchers.iter().any(|m| m.name == "__name__") {
            return Err(format!("selector {text:?}: __name__ cannot be restricted"));
        }
        Ok(Self::from_matchers(matchers))
    }

    fn from_matchers(matchers: Vec<Matcher>) -> Self {
        let printed = format!(
            "{{{}}}",
            matchers
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        Self { matchers, printed }
    }

    /// One selector holding this one's matchers and then `other`'s: what
    /// both select.
    pub fn and(&self, other: &CredentialSelector) -> Self {
        let mut matchers = self.matchers.clone();
        matchers.extend(other.matchers.iter().cloned());
        Self::from_matchers(matchers)
    }

    pub fn as_str(&self) -> &str {
        &self.printed
    }
}

/// Go's `regexp.QuoteMeta`: Prometheus compiles matchers with RE2, so quote
/// exactly the characters RE2 treats as special.
fn quote_meta(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 2);
    for c in value.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

// === enforcement ===

/// What an input to enforce is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Input {
    /// A PromQL expression (the `query` parameter).
    Query,
    /// One series selector (a `match[]` value).
    Selector,
}

/// Enforces a PromQL expression (the `query` parameter).
pub fn enforce_query(query: &str, tenant: &TenantMatcher) -> Result<String, EnforceError> {
    enforce_verified(query, Input::Query, tenant)
}

/// Enforces one series selector (a `match[]` value).
pub fn enforce_selector(selector: &str, tenant: &TenantMatcher) -> Result<String, EnforceError> {
    enforce_verified(selector, Input::Selector, tenant)
}

/// The full way: parsed, injected, printed, and the print verified.
fn enforce_verified(
    text: &str,
    input: Input,
    tenant: &TenantMatcher,
) -> Result<String, EnforceError> {
    enforce_unverified(text, input, tenant).and_then(|enforced| enforced.verified(tenant))
}

fn enforce_unverified(
    text: &str,
    input: Input,
    tenant: &TenantMatcher,
) -> Result<Enforced, EnforceError> {
    match input {
        Input::Query => enforce(text, |expr, client_regexes| {
            for_each_selector(expr, &mut |vs| {
                client_regex::collect(vs, &tenant.matchers, client_regexes);
                inject(vs, tenant)
            })
        }),
        Input::Selector => enforce(text, |expr, client_regexes| match expr {
            Expr::VectorSelector(vs) if vs.offset.is_none() && vs.at.is_none() => {
                client_regex::collect(vs, &tenant.matchers, client_regexes);
                inject(vs, tenant)
            }
            _ => Err(EnforceError::NotASelector),
        }),
    }
}

/// An enforced text before its verification, with the client's regex
/// matchers as printed in it. For a shape (`shape`), its template.
#[derive(Debug)]
struct Enforced {
    text: String,
    client_regexes: Vec<client_regex::Swap>,
}

impl Enforced {
    fn verified(self, tenant: &TenantMatcher) -> Result<String, EnforceError> {
        verify(&self.text, tenant, &self.client_regexes)?;
        Ok(self.text)
    }
}

/// Parses `query` (its regexes set aside when that is certain, see
/// `client_regex`), applies `inject_all`, prints the result.
fn enforce(
    query: &str,
    inject_all: impl Fn(&mut Expr, &mut Vec<client_regex::Swap>) -> Result<(), EnforceError>,
) -> Result<Enforced, EnforceError> {
    check_bounds(query)?;
    let mut client_regexes = Vec::new();
    if let Some(mut expr) = client_regex::SetAside::of(query).and_then(|s| s.parse()) {
        inject_all(&mut expr, &mut client_regexes)?;
        let text = expr.to_string();
        if !client_regex::holds_placeholder(&text) {
            return Ok(Enforced {
                text,
                client_regexes,
            });
        }
        client_regexes.clear();
    }
    let mut expr = parse(query).map_err(EnforceError::Parse)?;
    inject_all(&mut expr, &mut client_regexes)?;
    Ok(Enforced {
        text: expr.to_string(),
        client_regexes,
    })
}

fn inject(vs: &mut VectorSelector, tenant: &TenantMatcher) -> Result<(), EnforceError> {
    if !vs.matchers.or_matchers.is_empty() {
        return Err(EnforceError::OrInSelector);
    }
    // A user matcher identical to ours already enforces it.
    for matcher in &tenant.matchers {
        if !vs
            .matchers
            .matchers
            .iter()
            .any(|m| same_matcher(m, matcher))
        {
            vs.matchers.matchers.push(matcher.clone());
        }
    }
    Ok(())
}

/// Whether two matchers print alike: the same label, operator and value
/// (a client's regex matcher carries no compiled regex of its own, see
/// `client_regex`, so the regexes themselves are not compared).
fn same_matcher(a: &Matcher, b: &Matcher) -> bool {
    a.name == b.name
        && a.value == b.value
        && std::mem::discriminant(&a.op) == std::mem::discriminant(&b.op)
}

fn carries(vs: &VectorSelector, matchers: &[Matcher]) -> bool {
    vs.matchers.or_matchers.is_empty() && matchers.iter().all(|m| vs.matchers.matchers.contains(m))
}

/// Parses the enforced text again and checks every selector: the printer,
/// not our AST, is what the upstream will read. (No regex is compiled
/// again: the tenant's are swapped for sentinels, see `StandIn`, and so are
/// the client's, see `client_regex`.)
fn verify(
    enforced: &str,
    tenant: &TenantMatcher,
    client_regexes: &[client_regex::Swap],
) -> Result<(), EnforceError> {
    let stand_in = tenant.stand_in.as_ref();
    let (text, matchers) = match stand_in.and_then(|s| Some((s.swapped(enforced)?, s))) {
        Some((swapped, stand_in)) => (std::borrow::Cow::Owned(swapped), &stand_in.matchers),
        None => (std::borrow::Cow::Borrowed(enforced), &tenant.matchers),
    };
    let text = match client_regex::swap_for_verification(&text, client_regexes) {
        Some(swapped) => std::borrow::Cow::Owned(swapped),
        None => text,
    };
    let mut expr = parse(&text).map_err(|_| EnforceError::Unenforced)?;
    for_each_selector(&mut expr, &mut |vs| {
        if carries(vs, matchers) {
            Ok(())
        } else {
            Err(EnforceError::Unenforced)
        }
    })
}

fn check_bounds(query: &str) -> Result<(), EnforceError> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(EnforceError::TooLong);
    }
    if nesting_tokens(query) > MAX_NESTING_TOKENS {
        return Err(EnforceError::TooComplex);
    }
    Ok(())
}

/// promql-parser, with its panics turned into parse errors. Some inputs
/// make promql-parser 0.11 panic: a range of 99999999999999999999999 (plain
/// seconds) overflows `Duration::from_secs_f64` (found by fuzzing). Parsing
/// touches no shared state, so surviving the unwind leaves nothing broken;
/// the panic is logged as a warning, without its message (`ops/panics.rs`).
fn parse(text: &str) -> Result<Expr, String> {
    crate::ops::panics::survive(|| parser::parse(text))
        .unwrap_or_else(|| Err("the PromQL parser cannot handle this expression".into()))
}

/// Counts what can deepen the tree: brackets and operator characters outside
/// string literals and label matchers (`{...}`), and the keyword operators.
/// An upper bound on the tree's depth.
fn nesting_tokens(query: &str) -> usize {
    let mut count = 0;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut in_matchers = false;
    // Where the word being read started (letters, digits, `_`).
    let mut word: Option<usize> = None;
    for (at, c) in query.char_indices() {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' if q != '`' => escaped = true,
                _ if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        if in_matchers {
            match c {
                '"' | '\'' | '`' => quote = Some(c),
                '}' => in_matchers = false,
                _ => {}
            }
            continue;
        }
        if c.is_alphanumeric() || c == '_' {
            word.get_or_insert(at);
            continue;
        }
        if let Some(start) = word.take() {
            count += keyword_operator(&query[start..at]);
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '{' => {
                in_matchers = true;
                count += 1;
            }
            '(' | '[' | '+' | '-' | '*' | '/' | '%' | '^' | '=' | '!' | '<' | '>' => count += 1,
            _ => {}
        }
    }
    count + word.map_or(0, |start| keyword_operator(&query[start..]))
}

fn keyword_operator(word: &str) -> usize {
    let keywords = ["and", "or", "unless", "atan2"];
    usize::from(keywords.iter().any(|k| word.eq_ignore_ascii_case(k)))
}

/// Calls `f` on every vector selector, including those inside matrix
/// selectors. Exhaustive on purpose: a new node kind fails to compile here.
fn for_each_selector(
    expr: &mut Expr,
    f: &mut impl FnMut(&mut VectorSelector) -> Result<(), EnforceError>,
) -> Result<(), EnforceError> {
    match expr {
        Expr::VectorSelector(vs) => f(vs),
        Expr::MatrixSelector(ms) => f(&mut ms.vs),
        Expr::Aggregate(aggregate) => {
            if let Some(param) = &mut aggregate.param {
                for_each_selector(param, f)?;
            }
            for_each_selector(&mut aggregate.expr, f)
        }
        Expr::Unary(unary) => for_each_selector(&mut unary.expr, f),
        Expr::Binary(binary) => {
            for_each_selector(&mut binary.lhs, f)?;
            for_each_selector(&mut binary.rhs, f)
        }
        Expr::Paren(paren) => for_each_selector(&mut paren.expr, f),
        Expr::Subquery(subquery) => for_each_selector(&mut subquery.expr, f),
        Expr::Call(call) => {
            if call.func.name == "info" {
                return Err(EnforceError::InfoFunction);
            }
            for arg in &mut call.args.args {
                for_each_selector(arg, f)?;
            }
            Ok(())
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => Ok(()),
        Expr::Extension(_) => Err(EnforceError::Unsupported),
    }
}

// === impl Memo ===

/// Remembers enforcement results: dashboards send the same queries on every
/// refresh, and parsing dominates the query path. Keyed by the tenant
/// matcher's printed form, so a tenant whose namespaces change never gets a
/// stale rewrite. A query seen for the first time whose shape was seen
/// before (the same query with other matcher values, `shape`) is enforced
/// from the shape's verified template.
#[derive(Debug)]
pub struct Memo {
    entries: Cache<Result<Arc<str>, EnforceError>>,
    /// `None`: the shape could not be enforced as a template, or its
    /// template failed the verification.
    templates: Cache<Option<Arc<Template>>>,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct MemoKey {
    tenant: Arc<str>,
    input: Input,
    text: Box<str>,
}

impl MemoKey {
    fn new(tenant: &TenantMatcher, input: Input, text: &str) -> Self {
        Self {
            tenant: tenant.printed.clone(),
            input,
            text: text.into(),
        }
    }
}

/// A map that starts over when full instead of growing: at `capacity`
/// entries, or when the text it holds would pass `max_bytes` (what a
/// tenant sending long queries could otherwise make it hold).
#[derive(Debug)]
struct Cache<V> {
    entries: RwLock<Entries<V>>,
    capacity: usize,
    max_bytes: usize,
    /// The bytes of text a value holds.
    weigh: fn(&V) -> usize,
}

#[derive(Debug)]
struct Entries<V> {
    map: HashMap<MemoKey, V>,
    /// The text held: every key's and value's.
    bytes: usize,
}

/// The text one entry may hold on average before the memo starts over
/// sooner than its count says (dashboard queries hold a few hundred bytes).
const BYTES_PER_ENTRY: usize = 3 * 1024;

impl<V: Clone> Cache<V> {
    fn new(capacity: usize, weigh: fn(&V) -> usize) -> Self {
        Self {
            entries: RwLock::new(Entries {
                map: HashMap::new(),
                bytes: 0,
            }),
            capacity,
            max_bytes: capacity.saturating_mul(BYTES_PER_ENTRY),
            weigh,
        }
    }

    fn get(&self, key: &MemoKey) -> Option<V> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.map.get(key).cloned()
    }

    fn insert(&self, key: MemoKey, value: V) {
        // Inputs longer than this are rare and would crowd the memo out.
        if key.text.len() > 4096 || self.capacity == 0 {
            return;
        }
        let weight = key.text.len() + (self.weigh)(&value);
        let stale = {
            let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
            let full =
                entries.map.len() >= self.capacity || entries.bytes + weight > self.max_bytes;
            let stale = full.then(|| {
                entries.bytes = 0;
                let room = entries.map.capacity();
                std::mem::replace(&mut entries.map, HashMap::with_capacity(room))
            });
            if entries.map.insert(key, value).is_none() {
                entries.bytes += weight;
            }
            stale
        };
        // Freed once the lock is released: 10,000 entries take about half a
        // millisecond to free, and every query would wait for it.
        drop(stale);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.read().unwrap().map.len()
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.entries.read().unwrap().bytes
    }
}

impl Memo {
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: Cache::new(capacity, |result| {
                result.as_ref().map_or(0, |text| text.len())
            }),
            // Dashboards hold far fewer shapes than queries.
            templates: Cache::new(capacity / 4, |template| {
                template.as_ref().map_or(0, |t| t.text.len())
            }),
        }
    }

    pub fn enforce_query(
        &self,
        query: &str,
        tenant: &TenantMatcher,
    ) -> Result<Arc<str>, EnforceError> {
        self.enforce(query, Input::Query, tenant)
    }

    pub fn enforce_selector(
        &self,
        selector: &str,
        tenant: &TenantMatcher,
    ) -> Result<Arc<str>, EnforceError> {
        self.enforce(selector, Input::Selector, tenant)
    }

    fn enforce(
        &self,
        text: &str,
        input: Input,
        tenant: &TenantMatcher,
    ) -> Result<Arc<str>, EnforceError> {
        let key = MemoKey::new(tenant, input, text);
        if let Some(hit) = self.entries.get(&key) {
            return hit;
        }
        let result = match self.enforce_by_shape(text, input, tenant) {
            Some(enforced) => Ok(enforced),
            None => enforce_verified(text, input, tenant),
        }
        .map(Arc::from);
        self.entries.insert(key, result.clone());
        result
    }

    /// The text enforced from its shape's template, verified; `None` when
    /// it has no shape, or anything is unexpected (then it is enforced the
    /// full way, which also gives the error a client should see).
    fn enforce_by_shape(&self, text: &str, input: Input, tenant: &TenantMatcher) -> Option<String> {
        // A template not remembered is work beyond the full way's.
        if self.templates.capacity == 0 {
            return None;
        }
        check_bounds(text).ok()?;
        let shape = Shape::of(text, tenant)?;
        let key = MemoKey::new(tenant, input, &shape.text);
        let template = match self.templates.get(&key) {
            Some(template) => template,
            None => {
                let template = enforce_unverified(&shape.text, input, tenant)
                    .ok()
                    .and_then(|enforced| Template::verified(enforced, tenant))
                    .map(Arc::new);
                self.templates.insert(key, template.clone());
                template
            }
        }?;
        shape.fill(&template)
    }
}

#[cfg(test)]
mod tests;
