//! The layering inside a crate, where Cargo cannot enforce it. Between crates the dependency
//! graph is the layering (the workspace `Cargo.toml` says it); inside a library crate whose
//! root says its modules are listed "lowest first", a module may import only from the modules
//! listed before it. The list is read from the crate root's doc, and every module the root
//! declares must be in it, so a new module cannot be forgotten. Read from the source: an
//! upward `crate::` path anywhere (code, tests, doc links) fails.

use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules a crate root lists in its doc, in order: lines `//! - [`name`]…`, or
/// `//! - `name`…` for a private module (rustdoc links no private item from a public doc).
fn listed(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| {
            line.strip_prefix("//! - [`")
                .or_else(|| line.strip_prefix("//! - `"))
        })
        .map(|rest| rest.chars().take_while(|c| *c != '`').collect())
        .collect()
}

/// The modules a crate root declares: `mod name;` with any visibility.
fn declared(lib: &str) -> Vec<String> {
    lib.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .filter_map(|line| {
            let line = line.trim();
            let at = line.find("mod ")?;
            let before = line[..at].trim();
            let visibility = before.is_empty() || before.starts_with("pub");
            let name = line[at + 4..].strip_suffix(';')?;
            visibility.then(|| name.to_string())
        })
        .collect()
}

/// The crates whose root orders its modules, lowest first.
fn layered_crates() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let lib = entry.unwrap().path().join("src/lib.rs");
        if std::fs::read_to_string(&lib).is_ok_and(|t| t.contains("lowest first")) {
            out.push(lib.parent().unwrap().to_path_buf());
        }
    }
    out.sort();
    out
}

#[test]
fn the_server_the_transport_and_identity_order_their_modules() {
    let names: Vec<String> = layered_crates()
        .iter()
        .map(|src| {
            src.parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into()
        })
        .collect();
    for expected in ["sipsec-identity", "sipsec-server", "sipsec-transport"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} lost its order: {names:?}"
        );
    }
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let mut upward = Vec::new();
    for src in layered_crates() {
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        let layers = listed(&lib);
        let mut modules = declared(&lib);
        modules.sort();
        let mut in_list = layers.clone();
        in_list.sort();
        assert_eq!(
            modules,
            in_list,
            "{}: the modules lib.rs declares and the ones its doc lists differ",
            src.display()
        );
        let rank = |m: &str| layers.iter().position(|l| l == m);
        let mut all = Vec::new();
        files(&src, &mut all);
        for path in &all {
            let rel = path.strip_prefix(&src).unwrap();
            let top = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let Some(own) = rank(top.trim_end_matches(".rs")) else {
                continue;
            };
            let text = std::fs::read_to_string(path).unwrap();
            for (i, _) in text.match_indices("crate::") {
                let name: String = text[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if rank(&name).is_some_and(|r| r > own) {
                    upward.push(format!("{}: crate::{name}", path.display()));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports from a higher layer: {upward:#?}"
    );
}
