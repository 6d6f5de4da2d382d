//! The layout of `proxy/src` as docs/architecture.md draws it: no source
//! file refers to a module that refers back to it (two files that import
//! each other are one concern split in two, or a layer upside down).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Source files by module path (`http::body`, `auth`, `lib` for the root),
/// leaving out unit-test files, which belong to their module.
fn modules(dir: &Path, prefix: &str, out: &mut BTreeMap<String, PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let module = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}::{name}")
        };
        if path.is_dir() {
            modules(&path, &module, out);
        } else if name == "mod" {
            out.insert(prefix.to_owned(), path);
        } else if name != "tests" && path.extension().is_some_and(|e| e == "rs") {
            out.insert(
                if prefix.is_empty() && name == "lib" {
                    "lib".into()
                } else {
                    module
                },
                path,
            );
        }
    }
}

/// The modules a file names, by their longest path that is a file.
fn references(module: &str, text: &str, known: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
    let is_mod_rs = known[module].ends_with("mod.rs");
    let mut found = BTreeSet::new();
    for (prefix, base) in [
        ("crate::", String::new()),
        ("super::", parent.to_owned()),
        (
            "self::",
            if is_mod_rs {
                module.to_owned()
            } else {
                parent.to_owned()
            },
        ),
    ] {
        for (at, _) in text.match_indices(prefix) {
            let preceded_by_ident = text[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            if preceded_by_ident {
                continue;
            }
            let path: Vec<&str> = text[at + prefix.len()..]
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap()
                .split("::")
                .collect();
            let mut best = None;
            for n in 1..=path.len() {
                let candidate = [base.as_str()]
                    .into_iter()
                    .chain(path[..n].iter().copied())
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join("::");
                if known.contains_key(&candidate) {
                    best = Some(candidate);
                }
            }
            if let Some(target) = best.filter(|t| t != module) {
                found.insert(target);
            }
        }
    }
    found
}

#[test]
fn no_source_file_imports_one_that_imports_it_back() {
    let mut known = BTreeMap::new();
    modules(&src(), "", &mut known);
    assert!(
        known.contains_key("http::body") && known.contains_key("auth"),
        "{known:?}"
    );
    let graph: BTreeMap<&String, BTreeSet<String>> = known
        .iter()
        .map(|(module, path)| {
            let text = std::fs::read_to_string(path).unwrap();
            // Unit tests (at the end of a file, by convention) may use
            // anything; `super` inside them is the file's own module.
            let code = text.split("#[cfg(test)]").next().unwrap();
            (module, references(module, code, &known))
        })
        .collect();
    let mut loops = Vec::new();
    for (a, targets) in &graph {
        for b in targets {
            if graph.get(b).is_some_and(|back| back.contains(a.as_str())) && a.as_str() < b.as_str()
            {
                loops.push(format!("{a} <-> {b}"));
            }
        }
    }
    assert!(loops.is_empty(), "files that import each other: {loops:?}");
    // The check finds references at all: the request path (the `proxy`
    // folder) names its layers.
    let request_path: BTreeSet<&str> = graph
        .iter()
        .filter(|(module, _)| module.as_str() == "proxy" || module.starts_with("proxy::"))
        .flat_map(|(_, targets)| targets.iter().map(String::as_str))
        .collect();
    for layer in ["auth", "http::error", "enforce::remote_write", "upstream"] {
        assert!(
            request_path.contains(layer),
            "proxy/ -> {layer}: {request_path:?}"
        );
    }
}
