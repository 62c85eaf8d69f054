//! Seed 000's 2008 TLS setup end to end with the OpenSSL backend (cargo feature `openssl`):
//! RSA-2048 certificates and TLS_RSA_WITH_AES_128_CBC_SHA only, on every side — `sipsec load`
//! calling through `sipsec serve` to `sipsec load`'s UAS — in the proxy-chain mode and with a
//! connection per call on both sides (resumed after the first), with client certificates.
#![cfg(feature = "openssl")]

mod common;

use common::*;
use std::process::Command;

const SUITE: &str = "TLS_RSA_WITH_AES_128_CBC_SHA";

#[test]
fn the_seed_suite_carries_calls_in_the_chain_and_local_modes() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args(["certs", "--key", "rsa-2048", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let f = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (cert, key, ca) = (f("server.pem"), f("server-key.pem"), f("ca.pem"));
    let port = ports(29600);
    let uas_addr = format!("tls:127.0.0.1:{}", port + 1);
    let seed = [
        "--tls-backend",
        "openssl",
        "--tls-cipher-suite",
        SUITE,
        "--tls-version",
        "1.2",
    ];
    let mut uas_args = tls_files(&cert, &key, &ca).to_vec();
    uas_args.extend(["--tls-client-auth", "required"]);
    uas_args.extend(seed);
    let uas = LoadUas::start(dir.path(), &uas_addr, &uas_args);
    let calls = 60u64;
    for (i, (caller, outbound)) in [("persistent", "persistent"), ("per-call", "per-call")]
        .into_iter()
        .enumerate()
    {
        let listen = format!("tls:127.0.0.1:{}", port + 2 + i as u16);
        let cfg = format!(
            "[server]\nlisten = [\"{listen}\"]\ndomains = [\"example.test\"]\nworkers = 2\n\
             outbound_connections = \"{outbound}\"\n\
             [routing]\ndefault_route = \"sip:{};transport=tls\"\n\
             [database]\nurl = \"sqlite://{}\"\n\
             [tls]\ncert = \"{cert}\"\nkey = \"{key}\"\nca = \"{ca}\"\nclient_auth = \"required\"\n\
             backend = \"openssl\"\nversions = [\"1.2\"]\ncipher_suites = [\"{SUITE}\"]\n",
            &uas_addr[4..],
            dir.path().join("s.db").display()
        );
        let server = Server::start_logged(dir.path(), &cfg);
        let mut args = vec![listen.as_str()];
        args.extend(tls_files(&cert, &key, &ca));
        args.extend(["--connection", caller, "--calls", "60", "--rate", "60"]);
        args.extend(seed);
        let run = load(dir.path(), &args);
        assert_all_succeeded(&run, calls, caller, &server);
        let v = &run.1;
        let c = server.stop_counters();
        let (accepted, opened) = (c.get("connections_accepted"), c.get("connections_opened"));
        let (full, resumed) = (
            c.get("tls_handshakes_full"),
            c.get("tls_handshakes_resumed"),
        );
        assert_eq!(full + resumed, accepted + opened, "{caller}: {c:?}");
        assert_eq!(c.get("tls_failures"), 0, "{caller}: {c:?}");
        if caller == "per-call" {
            assert_eq!((accepted, opened), (calls, calls), "{c:?}");
            // OpenSSL's session IDs and tickets: all but the first few calls resume.
            assert!(resumed >= calls, "{c:?}");
            assert!(
                n(&v["connections"], "tls_resumed_handshakes") >= calls / 2,
                "{v}"
            );
        } else {
            assert_eq!(accepted, 1, "{c:?}");
        }
    }
    let u = uas.finish();
    assert_eq!(n(&u, "uas_answered"), 2 * calls, "{u}");
}
