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
/// a leading digit, `key` before a leading `_` or not), with or without runs
/// of `_` collapsed (throughout, or inside the `__` of a name wrapped in
/// them); at resource level also `service.name` and
/// `service.namespace` (→ `job`) and `service.instance.id` (→ `instance`);
/// at scope level behind the `otel_scope_` prefix, translated with the name
/// or added after it.
pub fn translates_to(key: &str, level: Level, label: &str) -> bool {
    if !may_translate_to(key.as_bytes(), level, label) {
        return false;
    }
    match level {
        Level::Scope => {
            return translates(&format!("otel_scope_{key}"), label)
                || label
                    .strip_prefix("otel_scope_")
                    .is_some_and(|rest| translates(key, rest))
        }
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
    // Compared character by character, without allocating. Translators
    // differ in whether runs of `_` collapse (newer ones do by default,
    // `label_name_preserve_multiple_underscores` keeps them): both
    // spellings are tried. A collapsing one keeps the `__` around a name
    // wrapped in them (`__a..b__` → `__a_b__`), and collapses inside.
    let sanitised = || key.chars().map(sanitise);
    let collapsed = || collapse(key);
    let wrapped = key.len() >= 4 && key.starts_with("__") && key.ends_with("__");
    let collapsed_inside = || {
        let inner = if wrapped { &key[2..key.len() - 2] } else { "" };
        "__".chars().chain(collapse(inner)).chain("__".chars())
    };
    spelled_as(sanitised, label)
        || spelled_as(collapsed, label)
        || (wrapped && spelled_as(collapsed_inside, label))
}

/// `name` sanitised, each run of `_` left as one.
fn collapse(name: &str) -> impl Iterator<Item = char> + '_ {
    let mut previous = None;
    name.chars().map(sanitise).filter(move |&c| {
        let repeat = c == '_' && previous == Some('_');
        previous = Some(c);
        !repeat
    })
}

/// Whether the sanitised `name` becomes `label`: as it is, or behind the
/// prefix a translator puts before a leading digit (`key_`, always) or a
/// leading `_` (`key`: before a single `_` in 3.0-3.5 and with
/// `label_name_underscore_sanitization`, before any in one later version,
/// never with that setting off). Every variant is a match, so whichever the
/// receiver runs is covered.
fn spelled_as<I: Iterator<Item = char>>(name: impl Fn() -> I, label: &str) -> bool {
    let prefix = match name().next() {
        Some(c) if c.is_ascii_digit() => "key_",
        Some('_') => "key",
        _ => return name().eq(label.chars()),
    };
    name().eq(label.chars())
        || label
            .strip_prefix(prefix)
            .is_some_and(|rest| name().eq(rest.chars()))
}

#[cfg(test)]
mod tests {
    //! The label-name translators a receiver may run, written out as their
    //! sources read (prometheus/otlptranslator and Prometheus 3.0-3.5's
    //! `NormalizeLabel`), allocating freely; `translates_to` must find
    //! every name any of them makes of an attribute.
    use super::*;
    use proptest::prelude::*;

    /// When a sanitised name gets `key` before a leading `_`.
    #[derive(Clone, Copy)]
    enum UnderscorePrefix {
        /// `label_name_underscore_sanitization: false`, or
        /// `PermissiveLabelSanitization`.
        Never,
        /// 3.0-3.5 and `UnderscoreLabelSanitization`: `_x`, not `__x`.
        Single,
        /// A version that keeps `__x` as it came and prefixes the rest.
        Any,
    }

    /// Every character outside `[a-zA-Z0-9_]` to `_`, rune by rune.
    fn sanitised(name: &str) -> String {
        name.chars().map(sanitise).collect()
    }

    /// The collapsing sanitiser (the default of newer translators): `_`
    /// counts as invalid, a run of invalid runes becomes one `_`, and a
    /// name wrapped in `__` keeps its wrapping.
    fn collapsed(name: &str) -> String {
        let wrapped = name.len() >= 4 && name.starts_with("__") && name.ends_with("__");
        let inner = if wrapped {
            &name[2..name.len() - 2]
        } else {
            name
        };
        let mut out = String::new();
        let mut previous_invalid = false;
        for c in inner.chars() {
            if c.is_ascii_alphanumeric() {
                out.push(c);
                previous_invalid = false;
            } else if !previous_invalid {
                out.push('_');
                previous_invalid = true;
            }
        }
        if wrapped {
            format!("__{out}__")
        } else {
            out
        }
    }

    fn prefixed(name: String, underscore: UnderscorePrefix) -> String {
        let single = name.starts_with('_') && !name.starts_with("__");
        match underscore {
            _ if name.starts_with(|c: char| c.is_ascii_digit()) => format!("key_{name}"),
            UnderscorePrefix::Single if single => format!("key{name}"),
            UnderscorePrefix::Any if name.starts_with('_') => format!("key{name}"),
            _ => name,
        }
    }

    /// The names the translators make of a data-point attribute `key`.
    fn readings(key: &str) -> Vec<String> {
        let mut all = vec![key.to_owned()]; // the UTF-8 modes
        for underscore in [
            UnderscorePrefix::Never,
            UnderscorePrefix::Single,
            UnderscorePrefix::Any,
        ] {
            all.push(prefixed(sanitised(key), underscore));
            all.push(prefixed(collapsed(key), underscore));
        }
        all
    }

    /// The names a scope attribute `key` becomes: `otel_scope_` joined
    /// before the translation or after it.
    fn scope_readings(key: &str) -> Vec<String> {
        let mut all = readings(&format!("otel_scope_{key}"));
        all.extend(readings(key).iter().map(|r| format!("otel_scope_{r}")));
        all
    }

    /// Names where the translators part ways.
    #[test]
    fn every_translator_variant_is_a_reading() {
        for (key, label) in [
            (".ns", "_ns"),         // no `key` before a single `_`
            (".ns", "key_ns"),      // `key` before it
            ("..ns", "key_ns"),     // collapsed first, then prefixed
            ("..ns", "key__ns"),    // prefixed, not collapsed
            ("_.ns", "_ns"),        // collapsed, no prefix
            ("a_.b", "a_b"),        // `_` and an invalid rune, one run
            ("a__b", "a_b"),        // a run of `_` alone
            ("1.x", "key_1_x"),     // a leading digit, always prefixed
            ("é.ns", "_ns"),        // a non-ASCII rune is one `_`
            ("______", "key_____"), // `__` kept around a collapsed `__`
            ("__a..b__", "key__a_b__"),
        ] {
            assert!(
                readings(key).iter().any(|r| r == label),
                "model: {key} → {label}"
            );
            assert!(
                translates_to(key, Level::DataPoint, label),
                "{key} → {label}"
            );
        }
        assert!(translates_to("1x", Level::Scope, "otel_scope_key_1x"));
        assert!(translates_to("1x", Level::Scope, "otel_scope_1x"));
        assert!(!translates_to("ns", Level::DataPoint, "key_ns"));
        assert!(!translates_to("a.b", Level::DataPoint, "ab"));
        // Only a name wrapped in `__` at both ends keeps them around what
        // collapses inside.
        assert!(!translates_to("__a..b.", Level::DataPoint, "key__a___"));
        assert!(!translates_to("__ns__", Level::DataPoint, "ns_"));
    }

    /// A resource's service attributes become `job` and `instance` on
    /// `target_info` and on promoted series; elsewhere they are names like
    /// any other.
    #[test]
    fn service_attributes_become_job_and_instance_at_resource_level() {
        for (key, label) in [
            ("service.name", "job"),
            ("service.namespace", "job"),
            ("service.instance.id", "instance"),
        ] {
            assert!(translates_to(key, Level::Resource, label), "{key}");
            assert!(!translates_to(key, Level::DataPoint, label), "{key}");
            assert!(!translates_to(key, Level::Scope, label), "{key}");
        }
        assert!(!translates_to("service.version", Level::Resource, "job"));
    }

    /// The byte prefilter, which runs on every attribute, rules out a name
    /// whose last character cannot end the label, and lets the others
    /// through.
    #[test]
    fn the_prefilter_rules_out_names_by_their_last_character() {
        for (key, level) in [
            ("http.method", Level::DataPoint),
            ("k8s.pod.uid", Level::Resource),
            ("service.id", Level::DataPoint),
        ] {
            assert!(
                !may_translate_to(key.as_bytes(), level, "namespace"),
                "{key}"
            );
        }
        // Except a resource's `service.*`, whose names become `job` and
        // `instance`.
        assert!(may_translate_to(
            b"service.id",
            Level::Resource,
            "namespace"
        ));
        for (key, label) in [
            ("k8s.namespace", "namespace"),
            ("ns.", "namespace_"),
            ("", "x"),
        ] {
            assert!(
                may_translate_to(key.as_bytes(), Level::DataPoint, label),
                "{key}"
            );
        }
    }

    fn key() -> impl Strategy<Value = String> {
        let alphabet = prop::sample::select(vec!['a', 'k', 'e', 'y', '_', '.', '-', '1', 'é', '/']);
        prop::collection::vec(alphabet, 0..8).prop_map(|chars| chars.into_iter().collect())
    }

    /// A label the proxy accepts: a Prometheus label name, not `__`-led.
    fn configurable(label: &str) -> bool {
        crate::config::is_label_name(label) && !label.starts_with("__")
    }

    proptest! {
        /// Whatever a translator makes of an attribute, if that is the
        /// tenant label, the attribute is found, and the byte prefilter
        /// never rules it out.
        #[test]
        fn every_reading_of_every_translator_is_found(
            key in key(), scope in any::<bool>(), pick in any::<prop::sample::Index>(),
        ) {
            let (level, readings) = if scope {
                (Level::Scope, scope_readings(&key))
            } else {
                (Level::DataPoint, readings(&key))
            };
            let labels: Vec<_> = readings.into_iter().filter(|r| configurable(r)).collect();
            if !labels.is_empty() {
                let label = pick.get(&labels);
                prop_assert!(may_translate_to(key.as_bytes(), level, label), "{key:?} → {label:?}");
                prop_assert!(translates_to(&key, level, label), "{key:?} → {label:?}");
            }
        }
    }
}
