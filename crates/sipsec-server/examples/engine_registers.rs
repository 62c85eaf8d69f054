//! Drives one engine through registrations in memory, for instruction counts under callgrind:
//! 1,000 users refreshing their one binding, each REGISTER with a new Call-ID as SIPp's
//! `peers/sipp/register.xml` sends it, 0.5 ms apart (2,000/s), with no sockets, no clock and
//! no store (the changes it hands the store are dropped here).
//!
//!     cargo build --release --example engine_registers
//!     valgrind --tool=callgrind target/release/examples/engine_registers 5000
//!
//! `scripts/callgrind.sh` runs it and reports instructions per REGISTER.

use sipsec_server::config::Config;
use sipsec_server::engine::{Effects, Engine};
use sipsec_server::stats::Stats;
use sipsec_transport::net::transport::Peer;
use std::sync::Arc;

const USERS: u64 = 1000;

fn main() {
    let registers: u64 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(5000);
    let cfg = Config::from_toml(
        "[server]\nlisten = [\"udp:127.0.0.1:5060\"]\ndomains = [\"bench.test\"]\nworkers = 1\n",
    )
    .expect("valid config");
    let mut engine = Engine::new(Arc::new(cfg), 0, 0, Arc::new(Stats::default()));
    let phone = Peer::udp("127.0.0.2:5070".parse().unwrap());
    let mut fx = Effects::default();
    let mut ok = 0;
    for n in 0..registers {
        let now = n / 2;
        let user = n % USERS;
        let register = format!(
            "REGISTER sip:bench.test SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.2:5070;branch=z9hG4bK-{n}-1-0\r\n\
From: <sip:user{user}@bench.test>;tag={n}SIPpTag00{n}\r\nTo: <sip:user{user}@bench.test>\r\n\
Call-ID: {n}-4242@127.0.0.2\r\nCSeq: 1 REGISTER\r\nContact: <sip:user{user}@127.0.0.2:5070>\r\n\
Expires: 3600\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
        );
        engine.handle_message(now, phone, register.as_bytes(), &mut fx);
        if fx
            .transmits
            .iter()
            .any(|(_, r)| r.starts_with(b"SIP/2.0 200"))
        {
            ok += 1;
        }
        fx.transmits.clear();
        fx.changes.clear();
        engine.handle_timeout(now, &mut fx);
        fx.transmits.clear();
    }
    assert_eq!(ok, registers, "every REGISTER is answered 200");
    println!("{ok} registrations answered 200");
}
