//! The tables README.md and BENCHMARKS.md quote, kept equal to the checked-in results. A
//! document marks each generated block with a pair of HTML comments,
//!
//! ```text
//! <!-- lab-table: seed000 -->
//! ...markdown written by `sipsec lab report --update`, never edited by hand...
//! <!-- /lab-table: seed000 -->
//! ```
//!
//! and [`update`] replaces what lies between them with the report's block of that name (see
//! [`super::report::Rendered::blocks`]). `sipsec lab report DIR --check FILE…` fails when a
//! document's blocks differ from what DIR's results say: the test that keeps README true.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

const OPEN: &str = "<!-- lab-table: ";
const CLOSE: &str = "<!-- /lab-table: ";
const END: &str = " -->";

/// `text` with every generated block replaced by `blocks`' text of its name, and the names
/// it holds. An unknown name, or a block opened and not closed, is an error that names it.
pub fn update(text: &str, blocks: &BTreeMap<String, String>) -> Result<(String, Vec<String>)> {
    let mut out = String::with_capacity(text.len());
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        let after = &rest[at + OPEN.len()..];
        let name_end = after
            .find(END)
            .context("a `<!-- lab-table:` marker is not closed by ` -->`")?;
        let name = after[..name_end].trim();
        let body = &after[name_end + END.len()..];
        let close = format!("{CLOSE}{name}{END}");
        let Some(end) = body.find(&close) else {
            bail!("block {name:?} has no closing `{close}`");
        };
        let Some(generated) = blocks.get(name) else {
            let known: Vec<&str> = blocks.keys().map(String::as_str).collect();
            bail!(
                "block {name:?}: the results make no such table (they make: {})",
                known.join(", ")
            );
        };
        out.push_str(&rest[..at]);
        out.push_str(&format!(
            "{OPEN}{name}{END}\n{}\n{close}",
            generated.trim_end()
        ));
        names.push(name.to_string());
        rest = &body[end + close.len()..];
    }
    out.push_str(rest);
    Ok((out, names))
}

/// Rewrites (or, with `check`, compares) the generated blocks of `files`. With `check`, an
/// error lists every document whose blocks differ from the results.
pub fn apply(
    files: &[impl AsRef<Path>],
    blocks: &BTreeMap<String, String>,
    check: bool,
) -> Result<()> {
    let mut stale = Vec::new();
    for file in files {
        let file = file.as_ref();
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let (new, names) =
            update(&text, blocks).with_context(|| format!("in {}", file.display()))?;
        if new == text {
            continue;
        }
        if check {
            stale.push(format!("{} ({})", file.display(), names.join(", ")));
        } else {
            std::fs::write(file, new)
                .with_context(|| format!("cannot write {}", file.display()))?;
            eprintln!(
                "sipsec lab: updated {} ({})",
                file.display(),
                names.join(", ")
            );
        }
    }
    if !stale.is_empty() {
        bail!(
            "these documents' lab tables differ from the results: {} — run `sipsec lab report \
             DIR --update FILE…` and commit both",
            stale.join("; ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks() -> BTreeMap<String, String> {
        BTreeMap::from([("seed000".to_string(), "| a | b |\n".to_string())])
    }

    #[test]
    fn a_block_is_replaced_and_the_rest_kept() {
        let text =
            "before\n<!-- lab-table: seed000 -->\nold\n<!-- /lab-table: seed000 -->\nafter\n";
        let (new, names) = update(text, &blocks()).unwrap();
        assert_eq!(
            new,
            "before\n<!-- lab-table: seed000 -->\n| a | b |\n<!-- /lab-table: seed000 -->\nafter\n"
        );
        assert_eq!(names, ["seed000"]);
        // Generated again, nothing changes.
        assert_eq!(update(&new, &blocks()).unwrap().0, new);
    }

    #[test]
    fn unknown_and_unclosed_blocks_are_errors() {
        let e = update(
            "<!-- lab-table: nope -->\n<!-- /lab-table: nope -->",
            &blocks(),
        );
        assert!(format!("{:#}", e.unwrap_err()).contains("\"nope\""));
        let e = update("<!-- lab-table: seed000 -->\nno end", &blocks());
        assert!(format!("{:#}", e.unwrap_err()).contains("no closing"));
    }

    #[test]
    fn check_fails_on_a_stale_document_and_update_fixes_it() {
        let dir = tempfile::tempdir().unwrap();
        let doc = dir.path().join("README.md");
        std::fs::write(
            &doc,
            "<!-- lab-table: seed000 -->\n<!-- /lab-table: seed000 -->\n",
        )
        .unwrap();
        let e = apply(&[&doc], &blocks(), true).unwrap_err();
        assert!(format!("{e:#}").contains("README.md (seed000)"), "{e:#}");
        apply(&[&doc], &blocks(), false).unwrap();
        apply(&[&doc], &blocks(), true).unwrap();
    }
}
