//! File names in a directory, for the tests that insist every file there
//! is checked. Included on its own (`#[path]`), without the API server.

use std::path::Path;

/// The names of the files in `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}
