//! `sipsec lab` end to end: a real (small) run of two rows, resumed for a second round,
//! the report written from it and rendered by headless Chromium as a person would open it,
//! and the cost model printed.

mod common;

use std::path::Path;
use std::process::Command;

fn lab(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .arg("lab")
        .args(args)
        .output()
        .expect("run sipsec lab")
}

fn lines(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
#[cfg_attr(
    sipsec_skip_chromium,
    ignore = "Chromium is not installed (apt-get install chromium)"
)]
fn a_lab_run_resumes_and_its_report_renders_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("results");
    let o = out.to_str().unwrap();
    // One row of seed 004 and its baseline, small.
    let run_rows = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "seed004",
            "--quick",
            "--only",
            "stateless-tcp",
            "--out",
            o,
        ];
        args.extend_from_slice(extra);
        lab(&args)
    };
    let run = run_rows(&[]);
    assert!(run.status.success(), "{run:?}");
    // A run that ends writes its report.
    assert!(out.join("report.html").exists());
    std::fs::remove_file(out.join("report.html")).unwrap();
    let first = lines(&out);
    let rows: Vec<&str> = first.iter().map(|r| r["row"].as_str().unwrap()).collect();
    assert_eq!(
        rows,
        ["stateful", "stateless-tcp"],
        "the row and its baseline"
    );
    for r in &first {
        assert!(r.get("skipped").is_none(), "{r}");
        let ok = r["succeeded"].as_u64().unwrap();
        assert!(ok >= 990, "{r}");
        // Every call is INVITE, 180, 200, ACK, BYE, 200 through the proxy: six messages in.
        let msgs = r["counters"]["requests_in"].as_u64().unwrap()
            + r["counters"]["responses_in"].as_u64().unwrap();
        assert_eq!(msgs, 6 * ok, "{r}");
        assert!(r["cpu_us"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(first[0]["transport"], "udp");
    assert_eq!(first[1]["transport"], "tcp");
    // The bench's connections were opened during its warm-up and reused: none per call.
    assert!(first[1]["counters"].get("connections_accepted").is_none());

    // A second run into the same directory must be asked to resume, and then runs only
    // round 2, rows in the other order.
    let again = run_rows(&[]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--resume"));
    let resumed = run_rows(&["--rounds", "2", "--resume"]);
    assert!(resumed.status.success(), "{resumed:?}");
    let all = lines(&out);
    let order: Vec<(u64, &str)> = all
        .iter()
        .map(|r| (r["round"].as_u64().unwrap(), r["row"].as_str().unwrap()))
        .collect();
    assert_eq!(
        order,
        [
            (1, "stateful"),
            (1, "stateless-tcp"),
            (2, "stateless-tcp"),
            (2, "stateful")
        ]
    );

    let report = lab(&["report", o]);
    assert!(report.status.success(), "{report:?}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("stateless TCP") && html.contains("<svg"));
    assert!(
        !html.contains("<script") && !html.contains("src="),
        "self-contained"
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("| stateless TCP |"), "{md}");

    let model = lab(&["model", o]);
    assert!(model.status.success(), "{model:?}");
    let text = String::from_utf8_lossy(&model.stdout);
    assert!(
        text.contains("Unit cost per block") && text.contains("stateless-tcp"),
        "{text}"
    );

    // As a person opens it: headless Chromium, from disk, to a screenshot.
    let png = dir.path().join("report.png");
    let shot = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1200,1600",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("chromium").display()
        ))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", out.join("report.html").display()))
        .output()
        .expect("chromium (Debian package chromium) is required under CI");
    assert!(png.exists(), "no screenshot: {shot:?}");
    // A blank page compresses to a few kB; tables and charts do not.
    let size = std::fs::metadata(&png).unwrap().len();
    assert!(size > 40_000, "screenshot of {size} bytes looks blank");
    if let Ok(keep) = std::env::var("SIPSEC_KEEP_SCREENSHOT") {
        std::fs::copy(&png, keep).unwrap();
    }

    // A row whose helper cannot start (the authority's delay relay finds its port taken) is
    // recorded as failed, the other rows still run, and the run says so and fails. (In this
    // test, not one of its own: every lab run uses the bench's fixed ports.)
    let _taken = std::net::TcpListener::bind("127.0.0.1:31071").unwrap();
    let other = dir.path().join("taken");
    let run = lab(&[
        "run",
        "seed001",
        "--quick",
        "--only",
        "proxychain-ahead",
        "--out",
        other.to_str().unwrap(),
    ]);
    assert!(!run.status.success(), "{run:?}");
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("proxychain-ahead (round 1)"),
        "{run:?}"
    );
    let rows = lines(&other);
    let row = |id: &str| rows.iter().find(|r| r["row"] == id).unwrap();
    assert!(row("no-auth").get("skipped").is_none(), "{rows:?}");
    let why = row("proxychain-ahead")["skipped"].as_str().unwrap();
    assert!(
        why.starts_with("failed: ") && why.contains("31071"),
        "{why}"
    );
}

/// README's and BENCHMARKS.md's lab tables are what the checked-in results (`results/lab`,
/// one full run) say: regenerated here, they must not differ. After a new run:
/// `sipsec lab report results/lab --update README.md BENCHMARKS.md`.
#[test]
fn the_documents_lab_tables_are_the_checked_in_results() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let docs = [root.join("README.md"), root.join("BENCHMARKS.md")];
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        assert!(
            text.contains("<!-- lab-table: "),
            "{} quotes no generated lab table",
            doc.display()
        );
    }
    let results = root.join("results/lab");
    let mut args = vec![
        "report".into(),
        results.display().to_string(),
        "--check".into(),
    ];
    args.extend(docs.iter().map(|d| d.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let check = lab(&args);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}
