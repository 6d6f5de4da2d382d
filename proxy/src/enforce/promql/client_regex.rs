//! The client's regex matchers, kept out of the regex compiler.
//!
//! promql-parser compiles every `=~`/`!~` value while parsing (Unicode `.*`
//! costs 100–200 µs), and enforcement parses twice: the query, then the
//! enforced text to verify it. The proxy never evaluates a client's regex:
//! the upstream compiles it (with RE2, the reading that counts). So:
//! - before the first parse, each regex matcher's literal is set aside and
//!   an equality on a placeholder parsed in its place
//!   ([`SetAside::of`]); after it, the placeholders are put back as regex
//!   matchers with the client's value ([`SetAside::restore`]). Anything
//!   unexpected (a placeholder not found exactly once as a matcher, a query
//!   already holding one) falls back to parsing the query as sent;
//! - before the verifying parse, each client regex matcher as printed is
//!   swapped for an equality on a sentinel ([`swap_for_verification`]).
//!   The verification checks the tenant's matchers, which the swaps never
//!   touch: the printer closes every literal it writes, checked here too.
//!
//! The forwarded text is printed from the AST and verified either way, so
//! the set-aside affects what the client's regexes say (restored byte for
//! byte), never whether the tenant's matchers are present.

use std::sync::OnceLock;

use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{Expr, VectorSelector};

/// What a placeholder's value starts with; a query that already holds it is
/// parsed as sent.
const PLACEHOLDER: &str = "tenant-proxy-regex-";

/// The value of the sentinel equality a client regex matcher becomes for
/// the verifying parse (never one of the tenant's sentinels).
const CLIENT_SENTINEL: &str = "tenant-proxy-verify-client";

/// The regex a restored matcher carries. promql-parser wants a compiled
/// regex in `MatchOp::Re`; the proxy never runs a client's (only prints its
/// value), so one empty-matching stand-in compiled once serves them all.
fn never_evaluated() -> regex::Regex {
    static REGEX: OnceLock<regex::Regex> = OnceLock::new();
    REGEX
        .get_or_init(|| regex::Regex::new("[a&&b]").expect("an empty character class"))
        .clone()
}

/// A query with its regex matchers' literals replaced by placeholders.
pub(super) struct SetAside {
    /// The query to parse.
    text: String,
    /// Per placeholder: negated (`!~`), and the literal's value.
    literals: Vec<(bool, String)>,
}

impl SetAside {
    /// `None` when there is nothing to set aside or the query is not lexed
    /// here with certainty (then it is parsed as sent).
    pub fn of(query: &str) -> Option<Self> {
        if query.contains(PLACEHOLDER) || !(query.contains("=~") || query.contains("!~")) {
            return None;
        }
        let mut text = String::with_capacity(query.len() + 32);
        let mut literals = Vec::new();
        let mut copied = 0;
        let mut chars = query.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '#' => skip_comment(&mut chars),
                '"' | '\'' | '`' => {
                    skip_literal(c, &mut chars)?;
                }
                '=' | '!' if chars.peek().map(|&(_, c)| c) == Some('~') => {
                    chars.next();
                    while chars.next_if(|&(_, c)| c.is_ascii_whitespace()).is_some() {}
                    let &(start, quote) = chars.peek()?;
                    if !matches!(quote, '"' | '\'' | '`') {
                        return None;
                    }
                    chars.next();
                    let end = skip_literal(quote, &mut chars)?;
                    let value = promql_parser::util::unquote_string(&query[start..end]).ok()?;
                    let negated = c == '!';
                    text.push_str(&query[copied..at]);
                    text.push_str(if negated { "!=" } else { "=" });
                    text.push('"');
                    text.push_str(PLACEHOLDER);
                    text.push_str(&literals.len().to_string());
                    text.push('"');
                    copied = end;
                    literals.push((negated, value));
                }
                _ => {}
            }
        }
        if literals.is_empty() {
            return None;
        }
        text.push_str(&query[copied..]);
        Some(Self { text, literals })
    }

    /// The query parsed with its placeholders, the client's regex matchers
    /// put back; `None` unless every placeholder was put back exactly once
    /// (then the query is parsed as sent).
    pub fn parse(self) -> Option<Expr> {
        let mut expr = super::parse(&self.text).ok()?;
        let mut restored = vec![0; self.literals.len()];
        super::for_each_selector(&mut expr, &mut |vs| {
            self.restore(vs, &mut restored);
            Ok(())
        })
        .ok()?;
        restored.iter().all(|&n| n == 1).then_some(expr)
    }

    /// Puts the client's regex matchers back into one selector, counting
    /// per placeholder how often it was put back (`restored`, one slot per
    /// placeholder). A placeholder found with another operator than it was
    /// written with stays as it is.
    fn restore(&self, vs: &mut VectorSelector, restored: &mut [usize]) {
        let matchers = vs
            .matchers
            .matchers
            .iter_mut()
            .chain(vs.matchers.or_matchers.iter_mut().flatten());
        for matcher in matchers {
            let Some(index) = matcher.value.strip_prefix(PLACEHOLDER) else {
                continue;
            };
            let Some(i) = index.parse::<usize>().ok().filter(|&i| i < restored.len()) else {
                continue;
            };
            let (negated, value) = &self.literals[i];
            let op = match (&matcher.op, negated) {
                (MatchOp::Equal, false) => MatchOp::Re(never_evaluated()),
                (MatchOp::NotEqual, true) => MatchOp::NotRe(never_evaluated()),
                _ => continue,
            };
            matcher.op = op;
            matcher.value.clone_from(value);
            restored[i] += 1;
        }
    }
}

/// Whether a printed text still holds a placeholder (one the walk did not
/// reach, such as a metric name): then the query is parsed as sent.
pub(super) fn holds_placeholder(text: &str) -> bool {
    text.contains(PLACEHOLDER)
}

/// Skips a comment, which runs to the end of the line.
pub(super) fn skip_comment(chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>) {
    for (_, c) in chars.by_ref() {
        if c == '\n' {
            break;
        }
    }
}

/// What may follow `\` in a literal (promql-parser 0.11's lexer).
const ESCAPES: &str = r"abfnrtv\01234567xuU";

/// Skips a string literal as promql-parser's lexer reads it: `\` escapes the
/// next character (in every quote style), the quote ends it. Returns the
/// byte offset just past the closing quote; `None` if it never closes.
pub(super) fn skip_literal(
    quote: char,
    chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>,
) -> Option<usize> {
    while let Some((at, c)) = chars.next() {
        if c == '\\' {
            // Escapes the lexer knows; any other is its error.
            chars.next_if(|&(_, e)| e == quote || ESCAPES.contains(e))?;
        } else if c == quote {
            return Some(at + c.len_utf8());
        }
    }
    None
}

/// A regex matcher as printed, and the sentinel equality that stands in
/// for it when the enforced text is parsed again (the client's here, the
/// tenant's in `StandIn`).
pub(super) type Swap = (String, String);

/// Records each client regex matcher of a selector (one not among the
/// tenant's), as printed, for [`swap_for_verification`].
pub(super) fn collect(vs: &VectorSelector, tenant: &[Matcher], into: &mut Vec<Swap>) {
    for m in &vs.matchers.matchers {
        let is_regex = matches!(m.op, MatchOp::Re(_) | MatchOp::NotRe(_));
        if is_regex && !tenant.iter().any(|t| super::same_matcher(m, t)) {
            let printed = m.to_string();
            if !into.iter().any(|(p, _)| *p == printed) {
                let sentinel = Matcher::new(MatchOp::Equal, &m.name, CLIENT_SENTINEL);
                into.push((printed, sentinel.to_string()));
            }
        }
    }
}

/// The enforced text with every matcher of `swaps` swapped for its
/// sentinel equality; `None` (verify the text as it is) when one as printed
/// does not end with the literal it opened. A swap only ever turns a
/// matcher into another matcher on the same label; client swaps never
/// produce one of the tenant's sentinels.
pub(super) fn swap_for_verification(text: &str, swaps: &[Swap]) -> Option<String> {
    if !swaps.iter().all(|(printed, _)| closes_at_end(printed)) {
        return None;
    }
    let mut text = text.to_owned();
    for (printed, sentinel) in swaps {
        text = text.replace(printed.as_str(), sentinel);
    }
    Some(text)
}

/// Whether every string literal in `printed` (a quoted label name, the
/// value) closes, and the last one at the very end: then the text around a
/// swapped matcher reads the same with or without it.
fn closes_at_end(printed: &str) -> bool {
    let mut chars = printed.char_indices().peekable();
    let mut last_close = None;
    while let Some((_, c)) = chars.next() {
        if c == '"' {
            match skip_literal('"', &mut chars) {
                Some(end) => last_close = Some(end),
                None => return false,
            }
        } else if c == '\'' || c == '`' || c == '\\' {
            return false;
        }
    }
    last_close == Some(printed.len())
}
