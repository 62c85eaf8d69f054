//! sipsec and Kamailio 5.6 as TLS neighbours, chained in both directions, with and without
//! client certificates: `sipsec load` calls through sipsec then Kamailio, and through
//! Kamailio then sipsec, to a `sipsec load` callee, all over TLS.
//!
//! Needs Debian's `kamailio` and `kamailio-tls-modules` (required under CI; skipped, and said
//! so, elsewhere).

mod common;

use common::*;
use std::path::Path;

/// Kamailio on `tls:127.0.0.1:port` running the reference proxy (`peers/kamailio`), relaying every
/// initial INVITE to `next_hop`. `mutual`: it demands client certificates and presents its
/// own when it connects out.
fn start_kamailio(dir: &Path, port: u16, next_hop: &str, mutual: bool) -> Kamailio {
    let p = |f: &str| dir.join(f).display().to_string();
    let yes_no = if mutual { "yes" } else { "no" };
    let client_cert = if mutual {
        format!(
            "certificate = {}\nprivate_key = {}\n",
            p("client.pem"),
            p("client-key.pem")
        )
    } else {
        String::new()
    };
    let tls_cfg = format!(
        "[server:default]\nmethod = TLSv1.2+\nverify_certificate = {yes_no}\n\
require_certificate = {yes_no}\nprivate_key = {}\ncertificate = {}\nca_list = {}\n\n\
[client:default]\nmethod = TLSv1.2+\nverify_certificate = yes\nrequire_certificate = yes\n\
ca_list = {}\n{client_cert}",
        p("server-key.pem"),
        p("server.pem"),
        p("ca.pem"),
        p("ca.pem"),
    );
    let tls_path = dir.join(format!("kamailio-tls-{port}.cfg"));
    std::fs::write(&tls_path, tls_cfg).unwrap();
    Kamailio::proxy(
        dir,
        &format!("tls:127.0.0.1:{port}"),
        next_hop,
        &[
            "WITH_TLS".into(),
            format!("TLS_CFG=\"{}\"", tls_path.display()),
        ],
    )
}

fn sipsec_config(dir: &Path, port: u16, next_hop: &str, client_auth: &str) -> String {
    let p = |f: &str| dir.join(f).display().to_string();
    format!(
        "[server]\nlisten = [\"tls:127.0.0.1:{port}\"]\ndomains = [\"example.test\"]\nworkers = 2\n\
[routing]\ndefault_route = \"{next_hop}\"\n[database]\nurl = \"sqlite://{}\"\n\
[tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\nclient_auth = \"{client_auth}\"\n",
        p(&format!("s{port}.db")),
        p("server.pem"),
        p("server-key.pem"),
        p("ca.pem")
    )
}

/// Calls from `sipsec load` into `first` over TLS, presenting a client certificate.
fn calls_into(dir: &Path, first: u16, calls: u64) -> (i32, serde_json::Value, String) {
    let p = |f: &str| dir.join(f).display().to_string();
    let (ca, cert, key) = (p("ca.pem"), p("client.pem"), p("client-key.pem"));
    let target = format!("tls:127.0.0.1:{first}");
    let calls = calls.to_string();
    let mut args = vec![target.as_str()];
    args.extend(tls_files(&cert, &key, &ca));
    args.extend(["--calls", &calls, "--rate", "50"]);
    load(dir, &args)
}

#[test]
#[cfg_attr(
    sipsec_skip_kamailio,
    ignore = "Kamailio with TLS is not installed (kamailio, kamailio-tls-modules)"
)]
fn sipsec_and_kamailio_chained_over_tls_both_ways_with_and_without_client_certificates() {
    if !have_kamailio(&["tls"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = make_certs(dir.path());
    let base = ports(29400);
    let uas_port = base;
    let uas = LoadUas::start(
        dir.path(),
        &format!("tls:127.0.0.1:{uas_port}"),
        &[
            "--tls-cert",
            &f("server.pem"),
            "--tls-key",
            &f("server-key.pem"),
        ],
    );
    let uas_uri = format!("sip:127.0.0.1:{uas_port};transport=tls");
    let calls = 50;
    let mut answered = 0;
    for (i, mutual) in [false, true].into_iter().enumerate() {
        let client_auth = if mutual { "required" } else { "none" };
        // Each Kamailio on its own port: its children may outlive it for a moment.
        let (sipsec_port, first_kamailio, second_kamailio) = (
            base + 1 + 3 * i as u16,
            base + 2 + 3 * i as u16,
            base + 3 + 3 * i as u16,
        );
        let sipsec_uri = format!("sip:127.0.0.1:{sipsec_port};transport=tls");
        let kamailio_uri = format!("sip:127.0.0.1:{second_kamailio};transport=tls");

        // sipsec first, Kamailio second.
        let kam = start_kamailio(dir.path(), second_kamailio, &uas_uri, mutual);
        let server = Server::start_logged(
            dir.path(),
            &sipsec_config(dir.path(), sipsec_port, &kamailio_uri, client_auth),
        );
        assert_all_succeeded(
            &calls_into(dir.path(), sipsec_port, calls),
            calls,
            &format!("load → sipsec → Kamailio, mutual {mutual}"),
            &server,
        );
        let c = server.stop_counters();
        assert_eq!(c.get("tls_failures"), 0, "{c:?}");
        assert!(c.get("connections_opened") >= 1, "{c:?}");
        drop(kam);
        answered += calls;

        // Kamailio first, sipsec second.
        let server = Server::start_logged(
            dir.path(),
            &sipsec_config(dir.path(), sipsec_port, &uas_uri, client_auth),
        );
        let kam = start_kamailio(dir.path(), first_kamailio, &sipsec_uri, mutual);
        assert_all_succeeded(
            &calls_into(dir.path(), first_kamailio, calls),
            calls,
            &format!("load → Kamailio → sipsec, mutual {mutual}"),
            &server,
        );
        drop(kam);
        let c = server.stop_counters();
        assert_eq!(c.get("tls_failures"), 0, "{c:?}");
        assert!(c.get("connections_accepted") >= 1, "{c:?}");
        // Kamailio presented its client certificate exactly when sipsec demanded one.
        assert_eq!(c.get("tls_client_certificates") > 0, mutual, "{c:?}");
        answered += calls;
    }
    let u = uas.finish();
    assert_eq!(n(&u, "uas_answered"), answered, "{u}");
}

#[test]
#[cfg_attr(
    sipsec_skip_kamailio,
    ignore = "Kamailio with TLS is not installed (kamailio, kamailio-tls-modules)"
)]
fn a_kamailio_without_a_client_certificate_is_refused_when_one_is_required() {
    if !have_kamailio(&["tls"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _ = make_certs(dir.path());
    let base = ports(29400) + 7;
    let (sipsec_port, kamailio_port) = (base, base + 1);
    // No UAS: the calls must not get past sipsec's handshake.
    let server = Server::start_logged(
        dir.path(),
        &sipsec_config(
            dir.path(),
            sipsec_port,
            &format!("sip:127.0.0.1:{};transport=tls", base + 2),
            "required",
        ),
    );
    let kam = start_kamailio(
        dir.path(),
        kamailio_port,
        &format!("sip:127.0.0.1:{sipsec_port};transport=tls"),
        false,
    );
    let mut args = vec![format!("tls:127.0.0.1:{kamailio_port}")];
    for (opt, file) in [
        ("--tls-ca", "ca.pem"),
        ("--tls-cert", "client.pem"),
        ("--tls-key", "client-key.pem"),
    ] {
        args.push(opt.into());
        args.push(dir.path().join(file).display().to_string());
    }
    args.extend(["--calls", "3", "--rate", "10", "--drain-s", "2"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, v, _) = load(dir.path(), &args);
    assert_eq!(n(&v, "succeeded"), 0, "{v}");
    drop(kam);
    let c = server.stop_counters();
    assert!(c.get("tls_failures") >= 1, "{c:?}");
    assert_eq!(c.get("forwarded_requests"), 0, "{c:?}");
}
