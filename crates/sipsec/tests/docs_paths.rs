//! What the documents name exists. README.md, BENCHMARKS.md, scripts/README.md and docs/*.md
//! tell a reader which file to open and which command to run; a name that has gone stale sends
//! them nowhere. So every repository path they give (`scripts/…`, `crates/…`, `peers/…`,
//! `bench/…`, `docs/…`, `.ci/…`, `fuzz/…`, `testdata/…`, `contrib/…`) must exist, unless the
//! repository's `.gitignore` says it is made by running something (`fuzz/corpus/`); every
//! script scripts/README.md lists by name must be in `scripts/`; and in their code (fenced
//! blocks and inline code spans) every `sipsec SUBCOMMAND … --flag` must be a flag that `sipsec
//! SUBCOMMAND --help` lists (asked of the binary built with this test), every `scripts/NAME.py
//! … --flag` one that the script's `--help` lists, and every `--example NAME` an example of one
//! of the crates.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where a path named in a document starts, when it names a file of the repository.
const PREFIXES: &[&str] = &[
    "scripts/",
    "crates/",
    "peers/",
    "bench/",
    "docs/",
    ".ci/",
    "fuzz/",
    "testdata/",
    "contrib/",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The documents checked, by their path in the repository, with their text.
fn documents() -> Vec<(String, String)> {
    let root = repo();
    let mut names: Vec<String> = ["README.md", "BENCHMARKS.md", "scripts/README.md"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(root.join(&n)).unwrap();
            (n, text)
        })
        .collect()
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// The repository paths a text names, with the line of each: a prefix not preceded by a path
/// character (so `../shared/bench/…`, outside the repository, is not one), followed by at
/// least one more character; trailing sentence punctuation is not part of it.
fn named_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for prefix in PREFIXES {
            for (at, _) in line.match_indices(prefix) {
                if line[..at].chars().next_back().is_some_and(is_path_char) {
                    continue;
                }
                let path: String = line[at..]
                    .chars()
                    .take_while(|c| is_path_char(*c))
                    .collect();
                let path = path.trim_end_matches(['.', ',', ':', ';']);
                if path.len() > prefix.len() {
                    found.push((n + 1, path.to_string()));
                }
            }
        }
    }
    found
}

/// What the repository's `.gitignore` says running things makes at a fixed place (its lines
/// anchored at the root, such as `/fuzz/corpus`): a document may name those.
fn generated() -> Vec<String> {
    std::fs::read_to_string(repo().join(".gitignore"))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix('/'))
        .map(|l| l.trim_end_matches('/').to_string())
        .collect()
}

/// The code of a markdown text, each piece with the line it starts on: the lines of fenced
/// blocks (a line ending in `\` joined with the next), and the inline code spans of the prose,
/// which may run over a line break.
fn code(text: &str) -> Vec<(usize, String)> {
    let mut pieces = Vec::new();
    let mut prose = String::new();
    let mut fenced = false;
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            prose.push('\n');
            continue;
        }
        if fenced {
            let (start, mut joined) = pending.take().unwrap_or((n + 1, String::new()));
            match line.strip_suffix('\\') {
                Some(head) => {
                    joined.push_str(head);
                    joined.push(' ');
                    pending = Some((start, joined));
                }
                None => {
                    joined.push_str(line);
                    pieces.push((start, joined));
                }
            }
            prose.push('\n');
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    // Inline spans: text between single backticks, within the prose.
    let mut line = 1;
    let mut open: Option<(usize, String)> = None;
    let mut previous = '\n';
    for c in prose.chars() {
        match (&mut open, c) {
            (None, '`') => open = Some((line, String::new())),
            (Some(_), '`') => pieces.push(open.take().unwrap()),
            (Some((_, span)), c) => span.push(if c == '\n' { ' ' } else { c }),
            (None, _) => {}
        }
        if c == '\n' {
            line += 1;
            // A span never crosses a paragraph: an unclosed backtick ends at a blank line.
            if previous == '\n' {
                open = None;
            }
        }
        previous = c;
    }
    pieces
}

/// What a command's `--help` lists: its subcommands and its long flags.
#[derive(Default)]
struct Help {
    subcommands: Vec<String>,
    flags: Vec<String>,
}

/// The help of a command: `["sipsec", SUBCOMMAND…]`, asked of the binary built with this test,
/// or `["scripts/NAME.py"]`, asked of the script (argparse) with `python3`.
fn help(command: &[String]) -> Help {
    let out = if command[0] == "sipsec" {
        Command::new(env!("CARGO_BIN_EXE_sipsec"))
            .args(&command[1..])
            .arg("--help")
            .output()
    } else {
        Command::new("python3")
            .arg(repo().join(&command[0]))
            .arg("--help")
            .output()
    }
    .unwrap_or_else(|e| panic!("{} --help did not run: {e}", command.join(" ")));
    assert!(out.status.success(), "{} --help failed", command.join(" "));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut help = Help::default();
    let mut in_commands = false;
    for line in text.lines() {
        if !line.starts_with(' ') {
            in_commands = line == "Commands:";
            continue;
        }
        let trimmed = line.trim_start();
        if in_commands && line.starts_with("  ") && !line.starts_with("   ") {
            if let Some(name) = trimmed.split_whitespace().next() {
                help.subcommands.push(name.to_string());
            }
        } else if trimmed.starts_with('-') {
            // An option's own line: `-c, --config <FILE>  …`; its description may name other
            // flags, which are not its own.
            for word in trimmed.split_whitespace().map(|w| w.trim_end_matches(',')) {
                if !word.starts_with('-') {
                    break;
                }
                if word.starts_with("--") {
                    help.flags
                        .push(word.split(['=', '[']).next().unwrap().to_string());
                }
            }
        }
    }
    help
}

/// Whether a word of a command line ends the command (a shell operator, a redirection, a
/// comment, a value written as alternatives).
fn ends_command(word: &str) -> bool {
    word.starts_with('#') || word.contains(['&', '|', ';', '>', '<', ')']) || word == "--"
}

/// Every flag of a piece of code that its command's help does not list. The commands are
/// `sipsec` (or a path ending in `/sipsec`) followed by one of its subcommands, and the
/// repository's Python scripts (`scripts/NAME.py`); a command runs to the end of its words or a
/// shell operator, and a flag is checked against the subcommand it follows.
fn unknown_flags(piece: &str, helps: &mut HashMap<Vec<String>, Help>) -> Vec<String> {
    let words: Vec<&str> = piece.split_whitespace().collect();
    let mut bad = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let script = word
            .find("scripts/")
            .map(|at| &word[at..])
            .filter(|s| s.ends_with(".py") && repo().join(s).is_file());
        let mut command: Vec<String> = match script {
            Some(script) => vec![script.to_string()],
            None if (*word == "sipsec" || word.ends_with("/sipsec")) && !word.starts_with('-') => {
                vec!["sipsec".to_string()]
            }
            None => continue,
        };
        for next in &words[i + 1..] {
            if ends_command(next) {
                break;
            }
            let known = helps
                .entry(command.clone())
                .or_insert_with(|| help(&command));
            // A script, or sipsec once a subcommand named it: its flags are checked.
            let named = script.is_some() || command.len() > 1;
            let subcommand = known.subcommands.iter().any(|s| s == next) && *next != "help";
            if let Some(flag) = next.strip_prefix("--").filter(|_| named) {
                let flag = format!("--{}", flag.split('=').next().unwrap());
                if !known.flags.contains(&flag) {
                    bad.push(format!("`{} {flag}`", command.join(" ")));
                }
            } else if subcommand {
                command.push(next.to_string());
            } else if !named {
                // `sipsec` as a word, not a command (`-p sipsec --features`, `--load sipsec`).
                break;
            }
        }
    }
    bad
}

/// Every `--example NAME` of a piece of code that no crate's `examples/NAME.rs` is.
fn missing_examples(piece: &str) -> Vec<String> {
    let words: Vec<&str> = piece.split_whitespace().collect();
    let crates: Vec<PathBuf> = std::fs::read_dir(repo().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    words
        .windows(2)
        .filter(|w| w[0] == "--example")
        .map(|w| w[1])
        .filter(|name| {
            !crates
                .iter()
                .any(|c| c.join("examples").join(format!("{name}.rs")).is_file())
        })
        .map(|name| format!("`--example {name}`"))
        .collect()
}

#[test]
fn the_documents_name_only_paths_scripts_and_flags_that_exist() {
    let root = repo();
    let generated = generated();
    let mut helps = HashMap::new();
    let mut problems = Vec::new();
    for (name, text) in documents() {
        for (line, path) in named_paths(&text) {
            let made = generated.iter().any(|g| path.starts_with(g.as_str()));
            if !made && !root.join(&path).exists() {
                problems.push(format!("{name}:{line}: {path} does not exist"));
            }
        }
        for (line, piece) in code(&text) {
            if name == "scripts/README.md"
                && !piece.contains(['/', ' '])
                && (piece.ends_with(".py") || piece.ends_with(".sh"))
                && !root.join("scripts").join(&piece).exists()
            {
                problems.push(format!("{name}:{line}: scripts/{piece} does not exist"));
            }
            for flag in unknown_flags(&piece, &mut helps) {
                problems.push(format!("{name}:{line}: {flag} is not in its --help"));
            }
            for example in missing_examples(&piece) {
                problems.push(format!("{name}:{line}: {example}: no crate has it"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the documents name what does not exist:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checks_find_what_they_look_for() {
    // The extraction itself: paths in prose and code, spans over a line break, flags after a
    // nested subcommand, and words that only look like a command.
    let text = "See `scripts/soak.sh`, crates/x.rs. and ../shared/bench/k.py.\n\
                Run `sipsec lab run\n--out DIR --nope` then\n\n\
                ```sh\nsipsec bench --rate 5 \\\n  --calls 3 --bogus # --also-bogus\n\
                cargo build -p sipsec --features x --example nowhere\n\
                python3 scripts/relay_floor.py --rounds 3 --nope --sipsec target/release/sipsec\n```\n";
    let paths: Vec<String> = named_paths(text).into_iter().map(|(_, p)| p).collect();
    assert_eq!(
        paths,
        ["scripts/soak.sh", "crates/x.rs", "scripts/relay_floor.py"]
    );
    let mut helps = HashMap::new();
    let mut bad = Vec::new();
    for (line, piece) in code(text) {
        for flag in unknown_flags(&piece, &mut helps) {
            bad.push(format!("{line}: {flag}"));
        }
    }
    assert_eq!(
        bad,
        [
            "6: `sipsec bench --bogus`",
            "9: `scripts/relay_floor.py --nope`",
            "2: `sipsec lab run --nope`"
        ]
    );
    let missing: Vec<String> = code(text)
        .iter()
        .flat_map(|(_, piece)| missing_examples(piece))
        .collect();
    assert_eq!(missing, ["`--example nowhere`"]);
    assert!(missing_examples("cargo run --example tls_floor 500").is_empty());
}
