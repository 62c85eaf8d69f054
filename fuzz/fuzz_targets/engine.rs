//! The engine (`sipsec serve`'s whole decision layer) fed structured sequences: requests built
//! from pieces that matter (our domain, registered users, contacts that point back at the
//! server, Max-Forwards, Max-Breadth), responses to what it forwarded, raw and mutated bytes,
//! clock ticks, store commits, transport failures and DNS answers (to the names the engine asked
//! about: addresses anywhere, the server's own included, or failures), in any order, under four
//! server roles.
//! Everything the engine sends to its own address is delivered back to it, as the network
//! would. Invariants: no panic; one input message never yields more than a fork's worth of
//! datagrams; and what one message sets off, fed back through the server, stays within
//! Max-Breadth × Max-Forwards forwards (RFC 5393) — the fork-loop amplification is exactly
//! what breaks that.
#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use sip_core::message::{build, Message};
use sipsec_server::config::Config;
use sipsec_server::dns::{Entry, Failure, Query, Resolution};
use sipsec_server::engine::{Effects, Engine, Mail};
use sipsec_transport::net::transport::{Peer, Transport};
use sipsec_server::stats::Stats;
use std::net::SocketAddr;
use std::sync::Arc;

const ME: &str = "127.0.0.1:5060";
const ME6: &str = "[::1]:5060";
/// Forwards one message may set off through the server and back: Max-Breadth's default (60)
/// times the most hops a request may make (70), with room for the responses and CANCELs.
const CASCADE_BOUND: usize = 3 * 60 * 71;
/// Datagrams one message may produce at once: a fork of at most Max-Breadth branches, or a
/// 2xx that cancels them all, plus its own answer.
const STEP_BOUND: usize = 2 * 60 + 4;

#[derive(Arbitrary, Debug)]
enum Role {
    Stateful,
    Stateless,
    Redirect,
    DurableRegistrar,
}

#[derive(Arbitrary, Debug)]
enum Step {
    Request(Req),
    /// A response to the `nth` most recent request the engine sent.
    Respond {
        nth: u8,
        code: u16,
        to_tag: bool,
    },
    /// A recent message (sent or received) again, with one byte changed.
    Mutate {
        nth: u8,
        at: u16,
        byte: u8,
    },
    Raw {
        from: u8,
        data: Vec<u8>,
    },
    Tick {
        ms: u16,
    },
    Saved {
        count: u8,
    },
    /// The connection for the `nth` most recent transmission failed.
    TransportError {
        nth: u8,
    },
    /// DNS answers the `nth` most recent lookup the engine asked for: a target per byte, or
    /// a failure.
    Resolve {
        nth: u8,
        targets: Vec<u8>,
        fail: Option<bool>,
        ttl: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Req {
    method: u8,
    target: u8,
    from: u8,
    branch: u8,
    call: u8,
    cseq: u8,
    max_forwards: Option<u8>,
    max_breadth: Option<u8>,
    contacts: Vec<u8>,
    expires: Option<u16>,
    to_tag: bool,
    route_me: bool,
}

const METHODS: &[&str] = &[
    "INVITE", "REGISTER", "OPTIONS", "BYE", "ACK", "CANCEL", "MESSAGE", "FOO",
];
const TARGETS: &[&str] = &[
    "sip:bob@example.test",
    "sip:alice@example.test",
    "sip:127.0.0.1:5060",
    "sip:bob@127.0.0.1:5060",
    "sip:carol@elsewhere.test",
    "sip:bob@[::1]:5060",
    "sip:dave@127.0.0.9:5070;transport=tcp",
    "sips:bob@example.test",
    "tel:+15551234",
    "sip:carol@gw.example.net",
    "sips:erin@secure.example.net;transport=tls",
];
/// Contact patterns; `#` becomes a number from the input, so one user can have many
/// distinct contacts of one kind (sixteen pointing back at the server, say).
const CONTACTS: &[&str] = &[
    "<sip:bob@127.0.0.3:5080;n=#>",
    "<sip:bob@127.0.0.1:5060;n=#>",
    "<sip:bob@example.test;n=#>",
    "<sip:bob@[::1]:5060;n=#>;q=0.5",
    "<sip:bob@127.0.0.4:5090;transport=tcp;n=#>;expires=0",
    "*",
    "<sip:alice@127.0.0.2:5070>;q=1.5",
];
const PEERS: &[&str] = &["127.0.0.2:5070", "127.0.0.3:5080", "[::1]:5070", ME];

fn peer(i: u8) -> Peer {
    let addr: SocketAddr = PEERS[i as usize % PEERS.len()].parse().unwrap();
    match i / 64 {
        0 | 1 => Peer::udp_via(addr, if addr.is_ipv6() { 1 } else { 0 }),
        2 => Peer::new(Transport::Tcp, addr),
        _ => Peer::new(Transport::Tls, addr),
    }
}

/// A DNS target from one byte: any of the peers (the server itself too), any transport.
fn entry(b: u8) -> Entry {
    let addr: SocketAddr = PEERS[b as usize % PEERS.len()].parse().unwrap();
    Entry {
        rank: u32::from(b / 64),
        weight: u16::from(b % 5),
        transport: [Transport::Udp, Transport::Tcp, Transport::Tls][(b / 4) as usize % 3],
        port: addr.port(),
        addrs: [addr.ip()].into_iter().collect(),
    }
}

fn request(r: &Req) -> String {
    let method = METHODS[r.method as usize % METHODS.len()];
    let target = TARGETS[r.target as usize % TARGETS.len()];
    let from = PEERS[r.from as usize % PEERS.len()];
    let mut s = format!(
        "{method} {target} SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bK{}\r\n\
         From: <sip:alice@example.test>;tag=f{}\r\nTo: <{target}>{}\r\nCall-ID: c{}\r\n\
         CSeq: {} {method}\r\n",
        r.branch,
        r.call,
        if r.to_tag { ";tag=t1" } else { "" },
        r.call,
        r.cseq,
    );
    if let Some(mf) = r.max_forwards {
        s += &format!("Max-Forwards: {}\r\n", mf % 72);
    }
    if let Some(mb) = r.max_breadth {
        s += &format!("Max-Breadth: {mb}\r\n");
    }
    if r.route_me {
        s += &format!("Route: <sip:{ME};lr>\r\n");
    }
    for c in r.contacts.iter().take(20) {
        let n = (*c as usize / CONTACTS.len()).to_string();
        s += &format!(
            "Contact: {}\r\n",
            CONTACTS[*c as usize % CONTACTS.len()].replace('#', &n)
        );
    }
    if let Some(e) = r.expires {
        s += &format!("Expires: {e}\r\n");
    }
    s += "Content-Length: 0\r\n\r\n";
    s
}

/// The engine under test and what it has sent lately.
struct Net {
    engine: Engine,
    now: u64,
    /// Recent datagrams, newest last: (where they went, what they were).
    recent: Vec<(Peer, Bytes)>,
    me: [SocketAddr; 2],
    /// Names the engine asked DNS about lately, newest last.
    lookups: Vec<Query>,
}

impl Net {
    fn remember(&mut self, to: Peer, data: Bytes) {
        if self.recent.len() == 32 {
            self.recent.remove(0);
        }
        self.recent.push((to, data));
    }

    /// Runs one input and everything it sends back to the server itself; checks the bounds.
    fn run(&mut self, first: impl FnOnce(&mut Engine, u64, &mut Effects), bounded: bool) {
        let mut fx = Effects::default();
        first(&mut self.engine, self.now, &mut fx);
        let mut cascade = 0;
        loop {
            for q in fx.lookups.drain(..) {
                if self.lookups.len() == 16 {
                    self.lookups.remove(0);
                }
                self.lookups.push(q);
            }
            if bounded {
                assert!(
                    fx.transmits.len() <= STEP_BOUND,
                    "{} datagrams at once",
                    fx.transmits.len()
                );
            }
            let out: Vec<_> = fx.transmits.drain(..).collect();
            fx = Effects::default();
            let mut back = Vec::new();
            for (to, data) in out {
                if self.me.contains(&to.addr) {
                    back.push((to, data.clone()));
                }
                self.remember(to, data);
            }
            if back.is_empty() {
                return;
            }
            cascade += back.len();
            assert!(
                cascade <= CASCADE_BOUND,
                "one message set off {cascade} messages to the server itself"
            );
            for (to, data) in back {
                // It arrives from the server's own address, on the transport it was sent on.
                let from = Peer::new(to.transport, to.addr);
                self.engine.handle_message(self.now, from, &data, &mut fx);
            }
        }
    }
}

fuzz_target!(|input: (Role, Vec<Step>)| {
    let (role, steps) = input;
    let role = match role {
        Role::Stateful => "mode = \"proxy\"\nrecord_route = true\n[routing]\n\
                           default_routes = [{ uri = \"sip:gw.example.net\", priority = 1 }, \
                           { uri = \"sip:127.0.0.3:5080\", priority = 2 }]\nprobe_interval_s = 1",
        Role::Stateless => "mode = \"proxy\"\nstateful = false\n[routing]\n\
                            default_route = \"sip:gw.example.net;transport=udp\"",
        Role::Redirect => "mode = \"redirect\"",
        Role::DurableRegistrar => "mode = \"proxy\"\n[registrar]\ndurable = true",
    };
    let cfg = Config::from_toml(&format!(
        "[server]\nlisten = [\"udp:{ME}\", \"udp:{ME6}\", \"tcp:{ME}\"]\ndomains = [\"example.test\"]\n\
         workers = 2\n{role}\n"
    ))
    .unwrap();
    let mut net = Net {
        engine: Engine::new(Arc::new(cfg), 0, 1_000_000, Arc::new(Stats::default())),
        now: 0,
        recent: Vec::new(),
        me: [ME.parse().unwrap(), ME6.parse().unwrap()],
        lookups: Vec::new(),
    };
    let mut saved = 0u64;
    for step in steps.into_iter().take(64) {
        match step {
            Step::Request(r) => {
                let text = request(&r);
                let from = peer(r.from);
                net.remember(from, Bytes::from(text.clone()));
                net.run(
                    |e, now, fx| e.handle_message(now, from, text.as_bytes(), fx),
                    true,
                );
            }
            Step::Respond { nth, code, to_tag } => {
                let requests: Vec<_> = net
                    .recent
                    .iter()
                    .filter(|(_, d)| !d.starts_with(b"SIP/2.0"))
                    .collect();
                let Some((to, data)) = requests.get(nth as usize % requests.len().max(1)) else {
                    continue;
                };
                let (to, data) = (*to, data.clone());
                let Ok(req) = Message::parse(&data) else {
                    continue;
                };
                let mut out = Vec::new();
                let code = 100 + code % 600;
                build::response(
                    &req,
                    code,
                    "X",
                    to_tag.then_some("uas1"),
                    b"",
                    b"",
                    &mut out,
                );
                net.run(|e, now, fx| e.handle_message(now, to, &out, fx), true);
            }
            Step::Mutate { nth, at, byte } => {
                let Some((to, data)) = net.recent.get(nth as usize % net.recent.len().max(1))
                else {
                    continue;
                };
                let to = *to;
                let mut data = data.to_vec();
                if !data.is_empty() {
                    let i = at as usize % data.len();
                    data[i] = byte;
                }
                net.run(|e, now, fx| e.handle_message(now, to, &data, fx), true);
            }
            Step::Raw { from, data } => {
                let from = peer(from);
                net.run(|e, now, fx| e.handle_message(now, from, &data, fx), true);
            }
            Step::Tick { ms } => {
                net.now += u64::from(ms) * 4;
                net.run(|e, now, fx| e.handle_timeout(now, fx), false);
            }
            Step::Saved { count } => {
                saved += u64::from(count % 4);
                net.run(|e, now, fx| e.handle_saved(now, saved, fx), false);
            }
            Step::TransportError { nth } => {
                let Some((to, data)) = net.recent.get(nth as usize % net.recent.len().max(1))
                else {
                    continue;
                };
                let (to, data) = (*to, data.clone());
                net.run(|e, now, fx| e.handle_transport_error(now, to, &data, fx), true);
            }
            Step::Resolve {
                nth,
                targets,
                fail,
                ttl,
            } => {
                let Some(query) = net.lookups.get(nth as usize % net.lookups.len().max(1)) else {
                    continue;
                };
                let query = query.clone();
                let resolution = match fail {
                    Some(true) => Resolution::failed(Failure::Unavailable, u32::from(ttl)),
                    Some(false) => Resolution::failed(Failure::NoRecords, u32::from(ttl)),
                    None => Resolution {
                        entries: targets.iter().take(8).map(|&b| entry(b)).collect(),
                        ttl_s: u32::from(ttl),
                        error: None,
                    },
                };
                let mail = Mail::Resolved {
                    query,
                    resolution: Arc::new(resolution),
                };
                net.run(|e, now, fx| e.handle_mail(now, mail, fx), true);
            }
        }
    }
    // However it ended, time runs out every transaction.
    net.now += 3_600_000;
    net.run(|e, now, fx| e.handle_timeout(now, fx), false);
});
