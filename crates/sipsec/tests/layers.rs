//! The layering `lib.rs` states: a module imports only from the modules listed before it there.
//! Read from the source, so an upward `crate::` path anywhere (code, tests, doc links) fails.

use std::path::Path;

/// Lowest first, as `lib.rs` lists them.
const LAYERS: &[&str] = &[
    "ablation", "tls", "net", "auth", "config", "stats", "engine", "db", "signals", "serve",
    "authd", "load", "cmd", "bench", "lab",
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|m| *m == module)
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    for m in LAYERS {
        assert!(lib.contains(&format!("pub mod {m};")), "lib.rs lost {m}");
    }
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut upward = Vec::new();
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
                upward.push(format!("{}: crate::{name}", rel.display()));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports from a higher layer: {upward:#?}"
    );
}
