//! Drives one engine through a NAT keep-alive interval in memory: BINDINGS UDP bindings behind
//! NATs (private Contacts registered with `rport` from addresses of their own), then one
//! `[nat] ping_interval_ms` of simulated time in the wheel's 100 ms steps, every OPTIONS ping
//! answered 200. Prints the pings sent and the time the engine spent per ping (its
//! `handle_timeout` and the answers' `handle_message`; building the answers excluded): the
//! engine's share of what a ping costs, without sockets.
//!
//!     cargo build --release --example engine_keepalives
//!     target/release/examples/engine_keepalives [BINDINGS=100000]

use sipsec_server::config::Config;
use sipsec_server::engine::{Effects, Engine};
use sipsec_server::stats::Stats;
use sipsec_transport::net::transport::Peer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const INTERVAL_MS: u64 = 25_000;

fn main() {
    let bindings: u32 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let cfg = Config::from_toml(&format!(
        "[server]\nlisten = [\"udp:127.0.0.1:5060\"]\ndomains = [\"bench.test\"]\nworkers = 1\n\
         [registrar]\nmax_bindings = {}\nmax_bindings_per_source = 0\n\
         [nat]\nping_interval_ms = {INTERVAL_MS}\nping_timeout_ms = 0\n",
        bindings * 2
    ))
    .expect("valid config");
    let mut engine = Engine::new(Arc::new(cfg), 0, 0, Arc::new(Stats::default()));
    let mut fx = Effects::default();
    for i in 0..bindings {
        let nat: SocketAddr = format!(
            "198.18.{}.{}:{}",
            (i >> 8) & 255,
            i & 255,
            10_000 + (i >> 16)
        )
        .parse()
        .expect("an address");
        let register = format!(
            "REGISTER sip:bench.test SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.2:5060;rport;branch=z9hG4bK-r{i}\r\n\
From: <sip:u{i}@bench.test>;tag=t{i}\r\nTo: <sip:u{i}@bench.test>\r\nCall-ID: r{i}@x\r\n\
CSeq: 1 REGISTER\r\nContact: <sip:u{i}@10.0.0.2:5060>\r\nExpires: 3600\r\nMax-Forwards: 70\r\n\
Content-Length: 0\r\n\r\n"
        );
        engine.handle_message(0, Peer::udp_via(nat, 0), register.as_bytes(), &mut fx);
        fx.transmits.clear();
        fx.changes.clear();
    }
    let (mut pings, mut spent) = (0u64, Duration::ZERO);
    let mut now = 0;
    while now <= INTERVAL_MS {
        now += 100;
        let t = Instant::now();
        engine.handle_timeout(now, &mut fx);
        spent += t.elapsed();
        let sent: Vec<_> = fx.transmits.drain(..).collect();
        for (to, ping) in sent {
            pings += 1;
            let ping = String::from_utf8_lossy(&ping);
            let keep: Vec<&str> = ping
                .split("\r\n")
                .filter(|l| {
                    ["Via:", "From:", "To:", "Call-ID:", "CSeq:"]
                        .iter()
                        .any(|h| l.starts_with(h))
                })
                .collect();
            let answer = format!(
                "SIP/2.0 200 OK\r\n{}\r\nContent-Length: 0\r\n\r\n",
                keep.join("\r\n")
            );
            let t = Instant::now();
            engine.handle_message(now, to, answer.as_bytes(), &mut fx);
            spent += t.elapsed();
        }
    }
    println!(
        "{pings} pings in {INTERVAL_MS} ms for {bindings} bindings: {:.2} us of engine time per ping and answer",
        spent.as_secs_f64() * 1e6 / pings.max(1) as f64
    );
}
