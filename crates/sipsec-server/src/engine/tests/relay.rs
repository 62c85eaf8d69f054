//! The relay rule in simulated time (see `engine::relay`): with digest on, what nobody vouches
//! for goes only to registered contacts, configured routes, or the hop its dialog token names;
//! nothing goes to the server's management ports; and a local answer to an INVITE is sent once,
//! so a spoofed source draws no more than the bytes it sent, a few times over.

use super::*;
use crate::auth::credentials::{CacheState, Credentials, Secrets};
use crate::auth::digest::DigestShared;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A branch no other request of these tests has (a repeated one is a retransmission).
fn fresh_branch() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A caller in a trusted network: vouched for without credentials.
const TRUSTED: &str = "127.0.0.9:5070";

/// An engine with digest on (default `auth.methods`: INVITE and REGISTER) and `extra` config.
fn digest_engine(extra: &str) -> Engine {
    let cfg = Config::from_toml(&format!(
        "[server]\nlisten = [\"udp:{PROXY}\"]\ndomains = [\"example.test\"]\nworkers = 2\n\
         [auth]\nscheme = \"digest\"\ntrusted = [\"127.0.0.9\"]\n{extra}"
    ))
    .unwrap();
    let creds = Arc::new(Credentials::new(&cfg.auth.scope.realm));
    creds.apply([(
        "alice".to_string(),
        Some(Secrets::from_password(
            "alice",
            &cfg.auth.scope.realm,
            "wonderland",
        )),
    )]);
    creds.set_state(CacheState::Current);
    let shared = Arc::new(DigestShared::new(&cfg.auth, creds).unwrap());
    let mut e = Engine::new(Arc::new(cfg), 0, 1_000_000, Arc::new(Stats::default()));
    e.enable_auth(shared);
    e
}

/// Bob registered at BOB1.
fn with_bob(e: &mut Engine) {
    preload_binding(e, "bob@example.test", &format!("sip:bob@{BOB1}"), BOB1);
}

/// A MESSAGE (not challenged by default) to `ruri`, with `extra` header lines, from `from`.
fn message(ruri: &str, to_tag: &str, extra: &str, from: &str) -> String {
    format!(
        "MESSAGE {ruri} SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bKm{}\r\nMax-Forwards: 70\r\n\
         {extra}From: <sip:alice@example.test>;tag=a1\r\nTo: <sip:bob@example.test>{to_tag}\r\n\
         Call-ID: msg\r\nCSeq: 1 MESSAGE\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi",
        fresh_branch()
    )
}

/// Where a request went, if forwarded, else the status it was answered.
fn outcome(sent: &[Sent]) -> Result<SocketAddr, Option<u16>> {
    match sent.iter().find(|s| s.status().is_none()) {
        Some(fwd) => Ok(fwd.to),
        None => Err(sent.iter().find_map(Sent::status)),
    }
}

#[test]
fn unauthenticated_requests_reach_only_registered_contacts_and_configured_routes() {
    let mut e = digest_engine("");
    with_bob(&mut e);
    let foreign = "sip:x@192.0.2.99:9999;transport=tcp";
    let route = "Route: <sip:192.0.2.99:9999;transport=tcp;lr>\r\n";
    for (ruri, to_tag, extra) in [
        (foreign, "", ""),
        ("sip:bob@example.test", "", route),
        (foreign, ";tag=b1", ""),
        (
            foreign,
            ";tag=b1",
            &format!("Route: <sip:{PROXY};lr>\r\n")[..],
        ),
        (
            foreign,
            ";tag=b1",
            &format!("Route: <sip:{PROXY};lr;rt=0123456789abcdef>\r\n")[..],
        ),
        ("sip:bob@example.test", ";tag=b1", route),
    ] {
        let (sent, _) = deliver(&mut e, 0, ALICE, &message(ruri, to_tag, extra, ALICE));
        assert_eq!(outcome(&sent), Err(Some(403)), "{ruri} {to_tag} {extra}");
        assert!(sent[0].text.starts_with("SIP/2.0 403 Relay Forbidden"));
    }
    assert_eq!(e.stats.relay_refused.load(Ordering::Relaxed), 6);
    // A local user's registered contact: delivered.
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &message("sip:bob@example.test", "", "", ALICE),
    );
    assert_eq!(outcome(&sent), Ok(addr(BOB1)));
    // From a trusted network, anywhere (over UDP, the one transport this engine has).
    let udp_route = "Route: <sip:192.0.2.99:9999;lr>\r\n";
    let (sent, _) = deliver(
        &mut e,
        0,
        TRUSTED,
        &message(foreign, "", udp_route, TRUSTED),
    );
    assert_eq!(outcome(&sent), Ok(addr("192.0.2.99:9999")));

    // A configured route takes what is not for a local user.
    let mut e = digest_engine("[routing]\ndefault_route = \"sip:127.0.0.3:5080\"\n");
    let (sent, _) = deliver(
        &mut e,
        0,
        ALICE,
        &message("sip:x@elsewhere.test", "", "", ALICE),
    );
    assert_eq!(outcome(&sent), Ok(addr("127.0.0.3:5080")));
    let (sent, _) = deliver(&mut e, 0, ALICE, &message(foreign, "", route, ALICE));
    assert_eq!(
        outcome(&sent),
        Err(Some(403)),
        "a Route is not a configured route"
    );
    // In a dialog whose peer kept no Record-Route, a Request-URI naming the route itself.
    let to_route = |port: u16| message(&format!("sip:127.0.0.3:{port}"), ";tag=b1", "", ALICE);
    let (sent, _) = deliver(&mut e, 0, ALICE, &to_route(5080));
    assert_eq!(outcome(&sent), Ok(addr("127.0.0.3:5080")));
    let (sent, _) = deliver(&mut e, 0, ALICE, &to_route(5081));
    assert_eq!(outcome(&sent), Err(Some(403)));

    // Without authentication the proxy is open by configuration, as before.
    let mut e = engine("");
    let (sent, _) = deliver(&mut e, 0, ALICE, &message(foreign, "", udp_route, ALICE));
    assert_eq!(outcome(&sent), Ok(addr("192.0.2.99:9999")));
}

/// A dialog set up through the proxy carries tokens in its Record-Route: the callee's
/// unauthenticated BYE reaches the caller, the caller's reaches the callee, and the same
/// Route aimed anywhere else is refused.
#[test]
fn dialogs_set_up_here_are_vouched_for_by_their_record_route() {
    let mut e = digest_engine("");
    with_bob(&mut e);
    // The caller is trusted (vouched for without credentials): its INVITE is forwarded.
    let invite = request("INVITE", "sip:bob@example.test", "z9hG4bKdlg", "")
        .replace(&format!("UDP {ALICE}"), &format!("UDP {TRUSTED}"))
        .replace(
            &format!("<sip:alice@{ALICE}>"),
            &format!("<sip:alice@{TRUSTED}>"),
        );
    let (sent, _) = deliver(&mut e, 0, TRUSTED, &invite);
    let fwd = sent.iter().find(|s| s.status().is_none()).unwrap();
    let rr_line = fwd
        .text
        .lines()
        .find(|l| l.starts_with("Record-Route:"))
        .unwrap()
        .to_string();
    assert!(rr_line.contains(";rt="), "{rr_line}");
    let callee_route = rr_line.replacen("Record-Route", "Route", 1);

    // Bob answers 200, his Record-Route copied; the caller gets it with its token for Bob.
    let mut ok = answer(fwd, 200, "b1");
    ok = ok.replacen(
        "\r\n\r\n",
        &format!("\r\n{rr_line}\r\nContact: <sip:bob@{BOB1}>\r\n\r\n"),
        1,
    );
    let ok = ok.replacen("Content-Length: 0\r\n", "", 1) + "";
    let (up, _) = deliver(&mut e, 10, BOB1, &ok);
    let up = up
        .iter()
        .find(|s| s.status() == Some(200))
        .expect("200 upstream");
    let caller_rr = up
        .text
        .lines()
        .find(|l| l.starts_with("Record-Route:"))
        .unwrap()
        .to_string();
    assert_ne!(caller_rr, rr_line, "the 2xx's entry names the callee's hop");
    let caller_route = caller_rr.replacen("Record-Route", "Route", 1);

    let bye = |ruri: &str, route: &str, from: &str| {
        format!(
            "BYE {ruri} SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bKbye{}\r\nMax-Forwards: 70\r\n\
             {route}\r\nFrom: <sip:x@example.test>;tag=b1\r\nTo: <sip:y@example.test>;tag=a1\r\n\
             Call-ID: dlg\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n",
            fresh_branch()
        )
    };
    let to_caller = format!("sip:alice@{TRUSTED}");
    let to_callee = format!("sip:bob@{BOB1}");
    // Each side reaches the other.
    let (sent, _) = deliver(&mut e, 20, BOB1, &bye(&to_caller, &callee_route, BOB1));
    assert_eq!(outcome(&sent), Ok(addr(TRUSTED)));
    let (sent, _) = deliver(&mut e, 20, ALICE, &bye(&to_callee, &caller_route, ALICE));
    assert_eq!(outcome(&sent), Ok(addr(BOB1)));
    // Either token aimed elsewhere, or the other side's token: refused.
    for (ruri, route) in [
        ("sip:evil@192.0.2.99:9999", &callee_route),
        ("sip:evil@192.0.2.99:9999", &caller_route),
        (&to_callee[..], &callee_route),
        (&to_caller[..], &caller_route),
        (
            &format!("sip:alice@{TRUSTED};maddr=192.0.2.99")[..],
            &callee_route,
        ),
    ] {
        let (sent, _) = deliver(&mut e, 30, ALICE, &bye(ruri, route, ALICE));
        assert_eq!(outcome(&sent), Err(Some(403)), "{ruri} {route}");
    }
}

#[test]
fn nothing_reaches_the_management_ports() {
    for listen in ["127.0.0.1:9090", "0.0.0.0:9090"] {
        let mut e = engine(&format!("[metrics]\nlisten = \"{listen}\"\n"));
        let metrics = "sip:x@127.0.0.1:9090;transport=tcp";
        for (ruri, extra) in [
            (metrics, ""),
            (
                "sip:x@elsewhere.test",
                "Route: <sip:127.0.0.1:9090;transport=tcp;lr>\r\n",
            ),
            ("sip:x@localhost:9090;transport=tcp", ""),
        ] {
            let (sent, _) = deliver(&mut e, 0, ALICE, &message(ruri, "", extra, ALICE));
            assert_eq!(outcome(&sent), Err(Some(403)), "{listen} {ruri} {extra}");
        }
        let (sent, fx) = deliver(
            &mut e,
            0,
            BOB1,
            &register(
                "bob",
                "<sip:bob@127.0.0.1:9090;transport=tcp>",
                "",
                "z9hG4bKm",
                1,
            ),
        );
        assert_eq!(sent[0].status(), Some(403), "{}", sent[0].text);
        assert!(fx.changes.is_empty());
        // Another port of the same host is not management.
        let (sent, _) = deliver(
            &mut e,
            0,
            ALICE,
            &message("sip:x@127.0.0.1:9091", "", "", ALICE),
        );
        assert_eq!(outcome(&sent), Ok(addr("127.0.0.1:9091")));
    }
}

/// Bytes sent towards the address a spoofed INVITE's Via names, until well past Timer H,
/// and how many messages.
fn reflected(e: &mut Engine, invite: &str) -> (usize, usize) {
    let (first, _) = deliver(e, 0, ALICE, invite);
    let mut sent: Vec<Sent> = first;
    let mut now = 0;
    while now < 40_000 {
        now = e.poll_timeout().unwrap_or(now + 1000).max(now + 1);
        sent.extend(tick(e, now));
    }
    let to_alice: Vec<&Sent> = sent.iter().filter(|s| s.to == addr(ALICE)).collect();
    (to_alice.iter().map(|s| s.text.len()).sum(), to_alice.len())
}

/// One spoofed INVITE draws one answer, not one every Timer G until Timer H (eleven 407s,
/// 27.9 times the bytes it took): challenges and other local refusals are sent statelessly,
/// and the ACK to them is absorbed.
#[test]
fn a_spoofed_invite_draws_one_answer() {
    let invite = request("INVITE", "sip:bob@example.test", "z9hG4bKspoof", "");
    for (mut e, code) in [(digest_engine(""), 407), (engine(""), 404)] {
        let (bytes, count) = reflected(&mut e, &invite);
        assert_eq!(count, 1, "{code}");
        let ratio = bytes as f64 / invite.len() as f64;
        assert!(
            ratio <= 3.0,
            "{code}: {bytes} bytes for {} ({ratio:.1}x)",
            invite.len()
        );
        // The ACK of the answer is absorbed, not routed.
        let (sent, _) = deliver(&mut e, 41_000, ALICE, &{
            let answer = Message::parse(invite.as_bytes()).unwrap();
            let mut resp = Vec::new();
            build::response(
                &answer,
                code,
                "X",
                Some(&reply::local_tag(&answer)),
                b"",
                b"",
                &mut resp,
            );
            let resp = Message::parse(&resp).unwrap();
            let mut ack = Vec::new();
            build::ack_for_non2xx(&answer, &resp, &mut ack);
            String::from_utf8(ack).unwrap()
        });
        assert!(sent.is_empty(), "{code}");
    }
}
