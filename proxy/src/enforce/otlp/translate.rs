//! Which OTLP attribute names a receiver can turn into a given label: the
//! name translations of Prometheus 3.x's OTLP endpoint, mirrored erring
//! wide (a false match only removes an attribute that might have
//! collided).

/// Where an attribute sits, which decides the labels it can become.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Resource,
    Scope,
    DataPoint,
}

/// Whether an attribute named `key` can become the label `label` at the
/// receiver, under any of its name translations: kept as UTF-8, or
/// sanitised to `[a-zA-Z0-9_]` (each other character to `_`, `key_` before
/// a leading digit, `key` before a single leading `_`), with or without runs
/// of `_` collapsed; at resource level also `service.name` and
/// `service.namespace` (→ `job`) and `service.instance.id` (→ `instance`);
/// at scope level with the `otel_scope_` prefix.
pub fn translates_to(key: &str, level: Level, label: &str) -> bool {
    if !may_translate_to(key.as_bytes(), level, label) {
        return false;
    }
    match level {
        Level::Scope => return translates(&format!("otel_scope_{key}"), label),
        Level::Resource => {
            let derived = match key {
                "service.name" | "service.namespace" => Some("job"),
                "service.instance.id" => Some("instance"),
                _ => None,
            };
            if derived == Some(label) {
                return true;
            }
        }
        Level::DataPoint => {}
    }
    translates(key, label)
}

/// A test on bytes that rules out most names before any UTF-8 check or
/// translation: no translation changes the last character of a name but to
/// sanitise it (a prefix goes in front; collapsing keeps one `_` of a run),
/// and a non-ASCII last byte, valid or not, sanitises to `_`. This runs
/// for every attribute of every data point.
pub fn may_translate_to(key: &[u8], level: Level, label: &str) -> bool {
    if level == Level::Resource && key.starts_with(b"service.") {
        return true; // service.name and friends become job and instance
    }
    let Some(&last) = key.last() else {
        return true; // rare: left to the full comparison
    };
    let last = if last.is_ascii_alphanumeric() || last == b'_' {
        last
    } else {
        b'_'
    };
    key == label.as_bytes() || label.as_bytes().last() == Some(&last)
}

fn sanitise(c: char) -> char {
    if c.is_ascii_alphanumeric() || c == '_' {
        c
    } else {
        '_'
    }
}

fn translates(key: &str, label: &str) -> bool {
    if key == label {
        return true;
    }
    // Compared character by character, without allocating.
    let sanitised = || key.chars().map(sanitise);
    let mut head = sanitised();
    let prefix = match (head.next(), head.next()) {
        (Some(c), _) if c.is_ascii_digit() => "key_",
        (Some('_'), second) if second != Some('_') => "key",
        _ => "",
    };
    let full = || prefix.chars().chain(sanitised());
    if full().eq(label.chars()) {
        return true;
    }
    let mut previous = None;
    let collapsed = full().filter(move |&c| {
        let repeat = c == '_' && previous == Some('_');
        previous = Some(c);
        !repeat
    });
    collapsed.eq(label.chars())
}
