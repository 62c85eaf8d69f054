//! The registrar's bounds in simulated time: bindings stop at `max_bindings` in all and at
//! `max_bindings_per_source` per address, counted across workers (each worker's replica
//! receives the others' changes, as the mailboxes deliver them).

use super::*;
use std::sync::atomic::Ordering;

const CONTACT: &str = "<sip:x@192.0.2.1>";
const LIMITS: &str = "[registrar]\nmax_bindings = 5\nmax_bindings_per_source = 3\n";

/// Two workers, each applying the other's binding changes.
struct Pair([Engine; 2]);

impl Pair {
    fn new() -> Pair {
        let cfg = Arc::new(
            Config::from_toml(&format!(
                "[server]\nlisten = [\"udp:{PROXY}\"]\ndomains = [\"example.test\"]\nworkers = 2\n{LIMITS}"
            ))
            .unwrap(),
        );
        let stats = Arc::new(Stats::default());
        Pair([0, 1].map(|w| Engine::new(cfg.clone(), w, 1_000_000, stats.clone())))
    }

    /// `user` registers [`CONTACT`] from `from` through worker `w`; the answer's status line.
    fn register(&mut self, w: usize, from: &str, user: &str, cseq: u32) -> String {
        let text = register(user, CONTACT, "", &format!("z9hG4bKc{user}{cseq}"), cseq);
        let (sent, fx) = deliver(&mut self.0[w], 10, from, &text);
        for change in fx.changes {
            self.0[1 - w].handle_mail(10, Mail::Binding(change), &mut Effects::default());
        }
        sent[0].text.lines().next().unwrap().to_string()
            + if sent[0].text.contains("Retry-After: 60\r\n") {
                " (Retry-After)"
            } else {
                ""
            }
    }

    /// Users `{prefix}0`, `{prefix}1`… register from `from`, through each worker in turn, and
    /// are all bound.
    fn fill(&mut self, from: &str, prefix: &str, count: usize) {
        for n in 0..count {
            let status = self.register(n % 2, from, &format!("{prefix}{n}"), 1);
            assert_eq!(status, "SIP/2.0 200 OK");
        }
    }
}

/// Issue 32: with no authentication, one address registered 640,000 bindings in 20 s.
#[test]
fn bindings_stop_at_the_caps_across_workers() {
    let mut p = Pair::new();
    let (a, b) = (ALICE, BOB2);
    // Alice's address, through both workers: three bindings, then the per-source cap.
    p.fill(a, "u", 3);
    let status = p.register(1, a, "u3", 1);
    assert_eq!(
        status,
        "SIP/2.0 503 Service Unavailable (too many bindings from this address) (Retry-After)"
    );
    // At the cap, a refresh of a binding it holds is still answered.
    assert_eq!(p.register(1, a, "u0", 2), "SIP/2.0 200 OK");
    // Another address: two more make five in all, the global cap.
    p.fill(b, "v", 2);
    let status = p.register(0, b, "v2", 1);
    assert_eq!(
        status,
        "SIP/2.0 503 Service Unavailable (registrar full) (Retry-After)"
    );
    let refused = p.0[0].stats.registrations_refused.load(Ordering::Relaxed);
    assert_eq!(refused, 2);
    // A removal makes room, on the other worker too.
    let remove = register("u1", CONTACT, "Expires: 0\r\n", "z9hG4bKrm", 2);
    let (sent, fx) = deliver(&mut p.0[0], 20, a, &remove);
    assert_eq!(sent[0].status(), Some(200));
    for change in fx.changes {
        p.0[1].handle_mail(20, Mail::Binding(change), &mut Effects::default());
    }
    assert_eq!(p.register(1, b, "v2", 1), "SIP/2.0 200 OK");
}

/// `max_bindings_per_source = 0` lifts the per-source cap (a site of phones behind one
/// NAT): the global one still holds.
#[test]
fn a_per_source_cap_of_zero_leaves_only_the_global_one() {
    let cfg = Config::from_toml(&format!(
        "[server]\nlisten = [\"udp:{PROXY}\"]\ndomains = [\"example.test\"]\n\
         [registrar]\nmax_bindings = 5\nmax_bindings_per_source = 0\n"
    ))
    .unwrap();
    let mut e = Engine::new(Arc::new(cfg), 0, 1_000_000, Arc::new(Stats::default()));
    let codes: Vec<_> = (0..6)
        .map(|n| {
            let text = register(&format!("u{n}"), CONTACT, "", &format!("z9hG4bKz{n}"), 1);
            deliver(&mut e, 10, ALICE, &text).0[0].status().unwrap()
        })
        .collect();
    assert_eq!(codes, [200, 200, 200, 200, 200, 503]);
}

/// Issue 32: a wildcard listener knew only loopback as its own, so a Contact naming one of the
/// host's other addresses was bound and every call to it came back to the server. The host's
/// addresses are read as `serve` reads them (getifaddrs), and the first that is not loopback
/// (or, on a host with none, a documentation address standing in for it) must be refused.
#[test]
fn a_wildcard_listener_owns_every_address_of_the_host() {
    let host = sipsec_transport::net::names::host_addresses();
    assert!(host.contains(&"127.0.0.1".parse().unwrap()), "{host:?}");
    let ip: IpAddr = host
        .iter()
        .copied()
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
        .unwrap_or_else(|| "198.18.0.7".parse().unwrap());
    let status = |host_addrs: Vec<IpAddr>| {
        let mut cfg = Config::from_toml(
            "[server]\nlisten = [\"udp:0.0.0.0:5060\"]\ndomains = [\"example.test\"]\n",
        )
        .unwrap();
        cfg.host_addrs = host_addrs;
        let mut e = Engine::new(Arc::new(cfg), 0, 1_000_000, Arc::new(Stats::default()));
        let contact = format!("<sip:bob@{ip}:5060>");
        let text = register("bob", &contact, "", "z9hG4bKw", 1);
        deliver(&mut e, 0, BOB1, &text).0[0].status()
    };
    let mut known = host.clone();
    if !known.contains(&ip) {
        known.push(ip);
    }
    assert_eq!(status(known), Some(403), "{ip} is this host's");
    // Not knowing the host's addresses (as before), it was bound.
    assert_eq!(status(Vec::new()), Some(200));
}
