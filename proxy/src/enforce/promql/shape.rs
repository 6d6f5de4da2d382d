//! Queries that differ only in matcher values, enforced once per shape.
//!
//! A dashboard sends one query with a variable's value swapped in
//! (`pod=~"web-1.*"`, then `pod=~"web-2.*"`): each string is new to the
//! memo, but its shape is not. The shape is the query with each plain
//! matcher value replaced by a numbered placeholder ([`Shape::of`]). The
//! shape is enforced once (parsed, injected, printed) and that text is
//! verified the full way, as every enforced text is (parsed again, every
//! selector checked): its [`Template`]. The client's values are then
//! written back into it ([`Shape::fill`]) in place of the placeholders'
//! literals, and that text is forwarded without a parse of its own. It
//! reads as the verified template does, but for the values in its
//! matchers:
//! - each value, between double quotes, is one literal to promql-parser's
//!   lexer (checked on every fill, on the bytes written): a string is
//!   lexed alike whatever it holds and wherever it stands, and the state
//!   after it does not depend on what it held (promql-parser's
//!   `accept_string`, Prometheus' `lexString`), so the filled text is the
//!   template's tokens with other literals in the placeholders' places;
//! - a parse's structure is decided by its tokens' kinds, and its actions
//!   read a matcher's value only to build and judge that matcher (a regex
//!   compiled, which the verifying parse does not do for a client's regex
//!   either, `client_regex`; a selector whose every matcher matches the
//!   empty string refused): a value can make the parse fail upstream,
//!   never change its tree. The filled text parses to the verified tree
//!   with the client's values in their matchers, and the tenant's
//!   matchers, never placeholders, as verified.
//!
//! A shape saves two parses and the printing; the check is the template's,
//! and each value's reading by the lexer.
//!
//! A value is plain, and stands for a placeholder, when neither the
//! reading of the text nor the enforcement can depend on it:
//! - printable ASCII without `"` or `\`: written back between double
//!   quotes it is one literal holding exactly it, as the printer writes it
//!   (promql-parser escapes `\`, `"`, newline, carriage return and tab
//!   only);
//! - not empty: the parser refuses a selector whose every matcher matches
//!   the empty string, and must judge the real value;
//! - not the value of one of the tenant's matchers: a client matcher equal
//!   to the tenant's is not added twice, so the shape must hold it as is.
//!
//! Only values right after a matcher operator (`=`, `!=`, `=~`, `!~`) are
//! replaced; everything else stays in the shape as written. A query or a
//! tenant matcher holding `tenant-proxy-` (every placeholder's and
//! sentinel's prefix) has no shape.

use lrpar::{Lexeme, Lexer};
use promql_parser::parser::lexer;
use promql_parser::parser::token::T_STRING;

use super::client_regex::{skip_comment, skip_literal};
use super::{Enforced, TenantMatcher};

/// What every placeholder value starts with: `tenant-proxy-shape-<n>`.
const PLACEHOLDER: &str = "tenant-proxy-shape-";

/// What no query or tenant matcher may hold for a shape to be taken.
const RESERVED: &str = "tenant-proxy-";

/// A query with its plain matcher values replaced by placeholders.
#[derive(Debug)]
pub(super) struct Shape<'q> {
    /// The query with placeholders: what is enforced, and the memo key.
    pub text: String,
    /// The values, in placeholder order, as they stood in the query.
    values: Vec<&'q str>,
}

impl<'q> Shape<'q> {
    /// `None` when no value is plain, or the query is not lexed here with
    /// certainty (an escape the lexer does not know, an unclosed literal).
    pub fn of(query: &'q str, tenant: &TenantMatcher) -> Option<Self> {
        if query.contains(RESERVED) || tenant.printed.contains(RESERVED) {
            return None;
        }
        let mut text = String::with_capacity(query.len() + 64);
        let mut values = Vec::new();
        let mut copied = 0;
        // Whether the last token read is a matcher operator.
        let mut after_operator = false;
        let mut previous = ' ';
        let mut chars = query.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '#' => {
                    skip_comment(&mut chars);
                    after_operator = false;
                }
                '"' | '\'' | '`' => {
                    let end = skip_literal(c, &mut chars)?;
                    let value = &query[at + 1..end - 1];
                    if after_operator && is_plain(value, tenant) {
                        text.push_str(&query[copied..at]);
                        push_placeholder(&mut text, values.len());
                        copied = end;
                        values.push(value);
                    }
                    after_operator = false;
                }
                // `==` compares; `<=` and `>=` too; `=~`, `!=` and `=` match.
                '=' => {
                    after_operator = match chars.peek().map(|&(_, c)| c) {
                        Some('=') => {
                            chars.next();
                            false
                        }
                        Some('~') => {
                            chars.next();
                            true
                        }
                        _ => !matches!(previous, '<' | '>'),
                    };
                }
                '!' if chars.next_if(|&(_, c)| c == '~').is_some() => after_operator = true,
                c if c.is_whitespace() => {}
                _ => after_operator = false,
            }
            previous = c;
        }
        if values.is_empty() {
            return None;
        }
        text.push_str(&query[copied..]);
        Some(Self { text, values })
    }

    /// The template with the query's values written back; `None` unless
    /// every placeholder stands in the template exactly once, as a whole
    /// literal, none is left, and promql-parser's lexer reads each value
    /// between double quotes as one literal.
    pub fn fill(&self, template: &Template) -> Option<String> {
        let text = self.fill_text(&template.text)?;
        let none_left = !text.contains(RESERVED);
        (none_left && self.values.iter().all(|value| is_one_literal(value))).then_some(text)
    }

    /// `printed` with every `"<placeholder>"` replaced by its value between
    /// double quotes; `None` unless each placeholder stood there once.
    fn fill_text(&self, printed: &str) -> Option<String> {
        let mut seen = vec![0; self.values.len()];
        let mut out = String::with_capacity(printed.len() + 64);
        let mut copied = 0;
        let mut from = 0;
        while let Some(quote) = printed[from..].find('"').map(|at| from + at) {
            from = quote + 1;
            let Some(after) = printed[from..].strip_prefix(PLACEHOLDER) else {
                continue;
            };
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            let index: usize = after[..digits].parse().ok()?;
            if after.as_bytes().get(digits) != Some(&b'"') || index >= self.values.len() {
                return None;
            }
            out.push_str(&printed[copied..quote]);
            out.push('"');
            out.push_str(self.values[index]);
            out.push('"');
            seen[index] += 1;
            copied = printed.len() - after.len() + digits + 1;
            from = copied;
        }
        out.push_str(&printed[copied..]);
        seen.iter().all(|&n| n == 1).then_some(out)
    }
}

/// A shape enforced, and its text verified the full way.
#[derive(Debug)]
pub(super) struct Template {
    pub(super) text: String,
}

impl Template {
    /// `None` if the enforced shape fails its verification (its queries are
    /// then enforced the full way, each verified on its own).
    pub fn verified(enforced: Enforced, tenant: &TenantMatcher) -> Option<Self> {
        let text = enforced.verified(tenant).ok()?;
        Some(Self { text })
    }
}

/// Whether promql-parser's lexer reads `"<value>"` as one string literal,
/// the whole of it.
pub(super) fn is_one_literal(value: &str) -> bool {
    let literal = format!("\"{value}\"");
    let Ok(lexer) = lexer(&literal) else {
        return false;
    };
    let first = lexer.iter().next().and_then(Result::ok);
    first.is_some_and(|lexeme| {
        let span = lexeme.span();
        lexeme.tok_id() == T_STRING && span.start() == 0 && span.end() == literal.len()
    })
}

fn push_placeholder(text: &mut String, index: usize) {
    text.push('"');
    text.push_str(PLACEHOLDER);
    text.push_str(&index.to_string());
    text.push('"');
}

/// See the module's documentation.
fn is_plain(value: &str, tenant: &TenantMatcher) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\')
        && !tenant.matchers.iter().any(|m| m.value == value)
}
