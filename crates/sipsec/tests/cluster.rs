//! A cluster of `sipsec serve` nodes sharing their registrations through PostgreSQL (issue
//! 36): a user registered at one node is reached through every other, unregistering at any
//! node stops it everywhere, and a phone on a connection to one node is called through
//! another over that connection.
//!
//! Needs PostgreSQL (`SIPSEC_TEST_POSTGRES`); without it each test says it skipped, and
//! under CI fails. Every run uses node names and a domain of its own, so runs sharing the
//! database do not meet.

mod common;

use common::*;
use std::time::{Duration, Instant};

fn postgres() -> String {
    std::env::var("SIPSEC_TEST_POSTGRES")
        .expect("SIPSEC_TEST_POSTGRES must name a PostgreSQL database")
}

/// Names of this run's own: a suffix for node names and the domain.
fn run_id() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    )
}

/// A node's config: `listen`, in `domain`, as cluster node `node`, with `extra` appended.
fn node_config(listen: &[String], domain: &str, node: &str, extra: &str) -> String {
    let listen: Vec<String> = listen.iter().map(|l| format!("\"{l}\"")).collect();
    format!(
        "[server]\nlisten = [{}]\ndomains = [\"{domain}\"]\nworkers = 2\n\
         [database]\nurl = \"{}\"\n\
         [cluster]\nnode = \"{node}\"\nheartbeat_ms = 200\ndead_after_ms = 1000\n{extra}",
        listen.join(", "),
        postgres()
    )
}

/// What `sipsec ctl COMMAND` answers, asked of the server whose control socket is
/// `dir/ctl.sock`.
fn ctl(dir: &std::path::Path, command: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args(["ctl", command, "--socket"])
        .arg(dir.join("ctl.sock"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The status code of a SIP response's first line (0 for a request).
fn code(m: &str) -> u16 {
    m.strip_prefix("SIP/2.0 ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The next message on `ep` whose first line starts with `prefix`, on a blocking or a
/// non-blocking socket; panics past 3 s.
fn wait_for(ep: &Endpoint, prefix: &str) -> String {
    let mut buf = vec![0u8; 65_536];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        match ep.socket.recv_from(&mut buf) {
            Ok((n, _)) if buf[..n].starts_with(prefix.as_bytes()) => {
                return String::from_utf8_lossy(&buf[..n]).into_owned();
            }
            Ok(_) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    panic!("nothing starting {prefix:?} at {} within 3 s", ep.addr);
}

fn register(phone: &Endpoint, node: &str, aor: &str, expires: u32, seq: u32) -> u16 {
    let (user, domain) = aor.split_once('@').unwrap();
    let text = format!(
        "REGISTER sip:{domain} SIP/2.0\r\n\
         Via: SIP/2.0/UDP {};branch=z9hG4bK-r{seq}-{}\r\nMax-Forwards: 70\r\n\
         From: <sip:{aor}>;tag=r{seq}\r\nTo: <sip:{aor}>\r\n\
         Call-ID: reg-{user}@{}\r\nCSeq: {seq} REGISTER\r\n\
         Contact: <sip:{user}@{}>;expires={expires}\r\nContent-Length: 0\r\n\r\n",
        phone.addr,
        rand_name(),
        phone.addr,
        phone.addr
    );
    phone.send(node, &text);
    code(&wait_for(phone, "SIP/2.0 "))
}

/// What became of an OPTIONS to `aor` sent by `caller` through `node`: whether the phone
/// received it (it answers 200), or the status the node answered with.
fn options_through(caller: &Endpoint, phone: &Endpoint, node: &str, aor: &str) -> Result<(), u16> {
    let branch = format!("z9hG4bK-o{}", rand_name());
    let text = format!(
        "OPTIONS sip:{aor} SIP/2.0\r\n\
         Via: SIP/2.0/UDP {};branch={branch}\r\nMax-Forwards: 70\r\n\
         From: <sip:caller@{}>;tag=o1\r\nTo: <sip:{aor}>\r\n\
         Call-ID: {branch}@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n",
        caller.addr, caller.addr
    );
    caller.send(node, &text);
    // Proxied, the phone has it (a non-INVITE gets no 100 Trying); else the node answers
    // the caller. Both sockets are watched, a millisecond apart.
    let mut buf = vec![0u8; 65_536];
    let start = Instant::now();
    let (n, from) = loop {
        if let Ok(got) = phone.socket.recv_from(&mut buf) {
            break got;
        }
        if let Ok((n, _)) = caller.socket.recv_from(&mut buf) {
            return Err(code(&String::from_utf8_lossy(&buf[..n])));
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "no answer from {node}"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    let request = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(request.starts_with("OPTIONS "), "{request}");
    let mut reply = String::from("SIP/2.0 200 OK\r\n");
    for l in request.lines().skip(1) {
        let name = l
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if ["via", "from", "to", "call-id", "cseq"].contains(&name.as_str()) {
            reply.push_str(l);
            reply.push_str("\r\n");
        }
    }
    reply.push_str("Content-Length: 0\r\n\r\n");
    phone.socket.send_to(reply.as_bytes(), from).unwrap();
    let done = wait_for(caller, "SIP/2.0 ");
    assert_eq!(code(&done), 200, "{done}");
    Ok(())
}

/// Sends OPTIONS through `node` until one reaches the phone (`Ok`) or, with `reach` false,
/// until the node answers it not found (404 or 480); how long that took. Panics past 3 s.
fn until_routed(
    caller: &Endpoint,
    phone: &Endpoint,
    node: &str,
    aor: &str,
    reach: bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let r = options_through(caller, phone, node, aor);
        match (reach, r) {
            (true, Ok(())) | (false, Err(404 | 480)) => return start.elapsed(),
            (false, Ok(())) | (true, Err(404 | 480)) => {}
            (_, Err(other)) => panic!("{node} answered {other}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{node}: still {r:?} after 3 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
#[cfg_attr(sipsec_skip_postgres, ignore = "needs SIPSEC_TEST_POSTGRES")]
fn a_user_registered_at_one_node_is_reached_through_all_and_unregistered_from_any() {
    let dir = tempfile::tempdir().unwrap();
    let id = run_id();
    let domain = format!("c{id}.test");
    let port = ports(27000);
    let nodes: Vec<(String, Server)> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let at = format!("127.0.0.1:{}", port + i as u16);
            let sub = dir.path().join(name);
            std::fs::create_dir_all(&sub).unwrap();
            let cfg = node_config(&[format!("udp:{at}")], &domain, &format!("{name}-{id}"), "");
            (at, Server::start_logged(&sub, &cfg))
        })
        .collect();
    let (a, b, c) = (&nodes[0].0, &nodes[1].0, &nodes[2].0);
    let phone = Endpoint::bind("127.0.0.1:0");
    let caller = Endpoint::bind("127.0.0.1:0");
    let aor = format!("alice@{domain}");
    assert_eq!(register(&phone, a, &aor, 300, 1), 200);
    // Polled from here on (`options_through`).
    phone.socket.set_nonblocking(true).unwrap();
    caller.socket.set_nonblocking(true).unwrap();
    let log = || {
        nodes
            .iter()
            .map(|(at, s)| format!("--- {at}\n{}", s.log()))
            .collect::<String>()
    };

    // Through the node it registered at, at once; through the others once the notice is in.
    assert!(
        options_through(&caller, &phone, a, &aor).is_ok(),
        "{}",
        log()
    );
    for node in [b, c] {
        let took = until_routed(&caller, &phone, node, &aor, true);
        assert!(took < Duration::from_secs(1), "{node}: {took:?}");
    }
    // Every call through every node reaches it.
    for _ in 0..5 {
        for node in [a, b, c] {
            assert!(
                options_through(&caller, &phone, node, &aor).is_ok(),
                "{node}"
            );
        }
    }

    // Unregistered at C: no node routes to it any more.
    assert_eq!(register(&phone, c, &aor, 0, 2), 200, "{}", log());
    for node in [c, a, b] {
        until_routed(&caller, &phone, node, &aor, false);
    }
    for (_, s) in nodes {
        assert!(s.stop().success());
    }
}

/// A phone on a TLS connection to node A (`sipsec load` registering over TLS) is called
/// through node B, which has no TLS listener at all: B routes through A's hop with the
/// flow's token, and A sends the INVITE over the phone's connection.
#[test]
#[cfg_attr(sipsec_skip_postgres, ignore = "needs SIPSEC_TEST_POSTGRES")]
fn a_tls_phone_registered_through_one_node_is_called_through_another() {
    let dir = tempfile::tempdir().unwrap();
    let id = run_id();
    let domain = format!("t{id}.test");
    let certs = make_certs(dir.path());
    let port = ports(27100);
    let (a_udp, a_tls, b_udp) = (
        format!("127.0.0.1:{port}"),
        format!("127.0.0.1:{}", port + 1),
        format!("127.0.0.1:{}", port + 2),
    );
    let tls = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        certs("server.pem"),
        certs("server-key.pem")
    );
    let a_dir = dir.path().join("a");
    let b_dir = dir.path().join("b");
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let a = Server::start_logged(
        &a_dir,
        &node_config(
            &[format!("udp:{a_udp}"), format!("tls:{a_tls}")],
            &domain,
            &format!("a-{id}"),
            &tls,
        ),
    );
    let b = Server::start_logged(
        &b_dir,
        &node_config(
            &[format!("udp:{b_udp}")],
            &domain,
            &format!("b-{id}"),
            "[control]\nsocket = \"ctl.sock\"\n",
        ),
    );
    let users = dir.path().join("phone.csv");
    std::fs::write(&users, format!("tlsphone,unused,{domain}\n")).unwrap();
    let phone = LoadUas::start(
        dir.path(),
        &format!("tls:127.0.0.1:{}", port + 3),
        &[
            "--register",
            &format!("tls:{a_tls}"),
            "--users",
            users.to_str().unwrap(),
            "--domain",
            &domain,
            "--tls-ca",
            &certs("ca.pem"),
            "--duration",
            "60",
        ],
    );
    let log = || format!("--- a\n{}\n--- b\n{}", a.log(), b.log());
    // Wait until B has the binding, then call through B.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut run;
    loop {
        run = load(
            dir.path(),
            &[
                &format!("udp:{b_udp}"),
                "--service",
                "tlsphone",
                "--domain",
                &domain,
                "--calls",
                "5",
                "--rate",
                "20",
                "--drain-s",
                "5",
            ],
        );
        if n(&run.1, "succeeded") == 5 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(n(&run.1, "succeeded"), 5, "{}\n{}\n{}", run.2, run.1, log());
    // B holds the binding as A's, reached through A's hop with the flow's token.
    let bindings = ctl(&b_dir, "bindings");
    let line = bindings
        .lines()
        .find(|l| l.starts_with(&format!("tlsphone@{domain} ")))
        .unwrap_or_else(|| panic!("{bindings}"));
    assert!(
        line.contains(&format!("path=<sip:{a_udp};lr;ob;fl="))
            && line.ends_with(&format!("node=a-{id}")),
        "{line}"
    );
    let served = phone.finish();
    assert!(n(&served, "uas_completed") >= 5, "{served}\n{}", log());
    assert!(a.stop().success() && b.stop().success());
}

/// Node A is killed: a phone registered at A with an address anyone reaches is still
/// reached through B, while a phone on a TCP connection to A — a flow that died with A —
/// is answered 480 at once by B once A's heartbeat has been silent for `dead_after_ms`,
/// rather than after a transaction timeout.
#[test]
#[cfg_attr(sipsec_skip_postgres, ignore = "needs SIPSEC_TEST_POSTGRES")]
fn a_dead_nodes_flows_fail_at_once_and_its_other_bindings_stay_routable() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let id = run_id();
    let domain = format!("d{id}.test");
    let port = ports(27200);
    let (a_at, b_at) = (
        format!("127.0.0.1:{port}"),
        format!("127.0.0.1:{}", port + 1),
    );
    let a_dir = dir.path().join("a");
    let b_dir = dir.path().join("b");
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let mut a = Server::start_logged(
        &a_dir,
        &node_config(
            &[format!("udp:{a_at}"), format!("tcp:{a_at}")],
            &domain,
            &format!("a-{id}"),
            "",
        ),
    );
    let b = Server::start_logged(
        &b_dir,
        &node_config(
            &[format!("udp:{b_at}")],
            &domain,
            &format!("b-{id}"),
            "[control]\nsocket = \"ctl.sock\"\n",
        ),
    );
    let bindings = || ctl(&b_dir, "bindings");
    let phone = Endpoint::bind("127.0.0.1:0");
    let caller = Endpoint::bind("127.0.0.1:0");
    let direct = format!("direct@{domain}");
    assert_eq!(register(&phone, &a_at, &direct, 300, 1), 200);
    phone.socket.set_nonblocking(true).unwrap();
    caller.socket.set_nonblocking(true).unwrap();

    // The TCP phone: registered over its connection to A.
    let mut tcp = std::net::TcpStream::connect(&a_at).unwrap();
    let local = tcp.local_addr().unwrap();
    write!(
        tcp,
        "REGISTER sip:{domain} SIP/2.0\r\nVia: SIP/2.0/TCP {local};branch=z9hG4bK-t1\r\n\
         Max-Forwards: 70\r\nFrom: <sip:flow@{domain}>;tag=t1\r\nTo: <sip:flow@{domain}>\r\n\
         Call-ID: flow-{id}\r\nCSeq: 1 REGISTER\r\n\
         Contact: <sip:flow@{local};transport=tcp>\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut buf = [0u8; 4096];
    tcp.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let n = tcp.read(&mut buf).unwrap();
    assert!(
        buf[..n].starts_with(b"SIP/2.0 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    until_routed(&caller, &phone, &b_at, &direct, true);

    // A dies without a word.
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    // Silent for dead_after_ms (1 s), noticed at one of B's heartbeats (every 200 ms): its
    // log says when (waited for, not slept on, as a busy machine may delay it).
    let silent = format!("node a-{id} at udp:{a_at} is silent");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !b.log().contains(&silent) {
        assert!(
            Instant::now() < deadline,
            "B never held A dead:\n{}",
            b.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let flow = format!("flow@{domain}");
    let start = Instant::now();
    assert_eq!(
        options_through(&caller, &phone, &b_at, &flow),
        Err(480),
        "{}\n{}",
        bindings(),
        b.log()
    );
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
    assert!(
        options_through(&caller, &phone, &b_at, &direct).is_ok(),
        "{}",
        b.log()
    );
    assert!(b.stop().success());
}

/// A dispatcher in front of three durable nodes: a registering callee's 20 users register
/// through it (each AOR to one node) and calls through it reach them, whichever node each
/// call lands on. One node is killed: once the dispatcher's probes have taken it out
/// (`probe_interval_s` 1, `failover_timeout_ms` 1,000), every new call succeeds, and every
/// registration acknowledged — durable, so committed before its 200 OK — is still held by
/// the nodes left.
#[test]
#[cfg_attr(sipsec_skip_postgres, ignore = "needs SIPSEC_TEST_POSTGRES")]
fn a_dispatcher_spreads_the_cluster_and_takes_a_dead_node_out() {
    let dir = tempfile::tempdir().unwrap();
    let id = run_id();
    let domain = format!("x{id}.test");
    let port = ports(27300);
    let at = |i: u16| format!("127.0.0.1:{}", port + i);
    let mut nodes: Vec<Server> = (1..=3)
        .map(|i| {
            let sub = dir.path().join(format!("n{i}"));
            std::fs::create_dir_all(&sub).unwrap();
            let cfg = node_config(
                &[format!("udp:{}", at(i))],
                &domain,
                &format!("n{i}-{id}"),
                "[registrar]\ndurable = true\n[control]\nsocket = \"ctl.sock\"\n",
            );
            Server::start_logged(&sub, &cfg)
        })
        .collect();
    let d_dir = dir.path().join("d");
    std::fs::create_dir_all(&d_dir).unwrap();
    let routes: Vec<String> = (1..=3)
        .map(|i| format!("{{ uri = \"sip:{}\" }}", at(i)))
        .collect();
    let dispatcher = Server::start_logged(
        &d_dir,
        &format!(
            "[server]\nlisten = [\"udp:{}\"]\ndomains = [\"{domain}\"]\nworkers = 2\n\
             mode = \"dispatcher\"\n[routing]\ndefault_routes = [{}]\nprobe_interval_s = 1\n\
             failover_timeout_ms = 1000\n",
            at(0),
            routes.join(", ")
        ),
    );
    let users = dir.path().join("users.csv");
    let csv: String = (0..20).map(|u| format!("u{u},unused,{domain}\n")).collect();
    std::fs::write(&users, csv).unwrap();
    let users = users.to_str().unwrap();
    let callee = LoadUas::start(
        dir.path(),
        &format!("udp:127.0.0.1:{}", port + 9),
        &[
            "--register",
            &format!("udp:{}", at(0)),
            "--users",
            users,
            "--domain",
            &domain,
            "--duration",
            "60",
        ],
    );
    // Every user registered (node 1's replica holds them all), waited for.
    let held = |dir: &std::path::Path| {
        ctl(dir, "bindings")
            .lines()
            .filter(|l| l.contains(&format!("@{domain} ")))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while held(&nodes[0].dir) < 20 {
        assert!(
            Instant::now() < deadline,
            "the callee's users did not all register"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = |nodes: &[Server]| {
        let mut all = format!("--- dispatcher\n{}", dispatcher.log());
        for (i, n) in nodes.iter().enumerate() {
            all += &format!("--- node {}\n{}", i + 1, n.log());
        }
        all
    };
    let calls = |count: u32, rate: u32| {
        load(
            dir.path(),
            &[
                &format!("udp:{}", at(0)),
                "--users",
                users,
                "--domain",
                &domain,
                "--calls",
                &count.to_string(),
                "--rate",
                &rate.to_string(),
                "--drain-s",
                "8",
            ],
        )
    };
    let before = calls(60, 30);
    assert_eq!(
        n(&before.1, "succeeded"),
        60,
        "{}\n{}\n{}",
        before.2,
        before.1,
        log(&nodes)
    );
    let spread: Vec<u64> = nodes
        .iter()
        .map(|n| {
            ctl(&n.dir, "counters")
                .lines()
                .find_map(|l| l.strip_prefix("registrations "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        })
        .collect();
    assert!(
        spread.iter().all(|&r| r > 0),
        "registrations per node: {spread:?}"
    );

    // Node 2 dies; the dispatcher's probe notices within about two seconds.
    let mut dead = nodes.remove(1);
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(3_000));
    let after = calls(100, 50);
    assert_eq!(
        n(&after.1, "succeeded"),
        100,
        "{}\n{}\n{}",
        after.2,
        after.1,
        log(&nodes)
    );
    // Every acknowledged registration is still held (node 1's replica).
    assert_eq!(held(&nodes[0].dir), 20);
    drop(callee);
    assert!(dispatcher.stop().success());
    for n in nodes {
        assert!(n.stop().success());
    }
}

/// The database goes away (a relay between the nodes and PostgreSQL is cut) for three
/// seconds: both nodes keep routing from memory, a user registers at A meanwhile (answered at
/// once: write-behind), and once the database is back B reaches that user too — A's
/// writer committed what it held, and B resynchronised when its listener reconnected.
#[test]
#[cfg_attr(sipsec_skip_postgres, ignore = "needs SIPSEC_TEST_POSTGRES")]
fn the_nodes_route_from_memory_through_a_database_outage_and_catch_up() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let id = run_id();
    let domain = format!("o{id}.test");
    let port = ports(27400);
    let (relay, relayed) = relay::Relay::for_database(&postgres());
    let (a_at, b_at) = (
        format!("127.0.0.1:{port}"),
        format!("127.0.0.1:{}", port + 1),
    );
    let start = |name: &str, at: &str| {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let cfg = node_config(&[format!("udp:{at}")], &domain, &format!("{name}-{id}"), "")
            .replace(&postgres(), &relayed);
        Server::start_logged(&sub, &cfg)
    };
    let a = start("a", &a_at);
    let b = start("b", &b_at);
    let phone = Endpoint::bind("127.0.0.1:0");
    let caller = Endpoint::bind("127.0.0.1:0");
    let (x, y) = (format!("x@{domain}"), format!("y@{domain}"));
    assert_eq!(register(&phone, &a_at, &x, 300, 1), 200);
    phone.socket.set_nonblocking(true).unwrap();
    caller.socket.set_nonblocking(true).unwrap();
    until_routed(&caller, &phone, &b_at, &x, true);

    relay.up.store(false, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(500));
    for node in [&a_at, &b_at] {
        assert!(options_through(&caller, &phone, node, &x).is_ok(), "{node}");
    }
    assert_eq!(register(&phone, &a_at, &y, 300, 2), 200);
    assert!(options_through(&caller, &phone, &a_at, &y).is_ok());
    std::thread::sleep(Duration::from_millis(2_500));
    relay.up.store(true, Ordering::SeqCst);
    let start = Instant::now();
    loop {
        match options_through(&caller, &phone, &b_at, &y) {
            Ok(()) => break,
            Err(404 | 480) => {}
            Err(other) => panic!("B answered {other}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "B never learnt y:\n--- a\n{}\n--- b\n{}",
            a.log(),
            b.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(b.log().contains("resynchronised"), "{}", b.log());
    assert!(a.stop().success() && b.stop().success());
}

/// The testbed (`scripts/cluster_testbed.py`): every part a host of its own in network
/// namespaces — a private PostgreSQL, three durable nodes authenticating with Proxychain
/// against one `sipsec authd`, a dispatcher, the load — and PostgreSQL really restarted (not
/// a relay cut): calls through the dispatcher all succeed; new passwords are pushed to more
/// than one node and work at once; a killed node is taken out and loses no acknowledged
/// registration; through the restart the nodes route from memory and every listener
/// resynchronises.
#[test]
#[cfg_attr(
    sipsec_skip_netns,
    ignore = "needs root with ip (network namespaces) and PostgreSQL's server binaries"
)]
fn the_testbed_survives_a_killed_node_and_a_restarted_postgresql() {
    if !netns::have_netns() {
        return;
    }
    let out = std::process::Command::new("python3")
        .arg(repo_dir().join("scripts/cluster_testbed.py"))
        .args(["--sipsec", env!("CARGO_BIN_EXE_sipsec")])
        .args(["--users", "50", "--calls", "100", "--rate", "50"])
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("every check held"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A second node started under a live node's name, from another address, is refused at
/// start with a clear error; the same node restarted (its own address) is not.
#[test]
#[cfg_attr(sipsec_skip_postgres, ignore = "needs SIPSEC_TEST_POSTGRES")]
fn a_node_name_in_use_by_a_live_node_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let id = run_id();
    let domain = format!("n{id}.test");
    let port = ports(27500);
    let name = format!("a-{id}");
    let first = Server::start_logged(
        dir.path(),
        &node_config(&[format!("udp:127.0.0.1:{port}")], &domain, &name, ""),
    );
    let cfg = dir.path().join("twin.toml");
    std::fs::write(
        &cfg,
        node_config(&[format!("udp:127.0.0.1:{}", port + 1)], &domain, &name, ""),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sipsec"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("node \"{name}\" at udp:127.0.0.1:{port} is alive")),
        "{err}"
    );
    assert!(first.stop().success());
    // The same node, restarted at once: its own address, so itself.
    let again = Server::start_logged(
        dir.path(),
        &node_config(&[format!("udp:127.0.0.1:{port}")], &domain, &name, ""),
    );
    assert!(again.stop().success());
}
