//! A real NAT for the tests, in network namespaces made per test and deleted on drop: a "home"
//! network with the phones (198.18.k.0/24), a "router" that masquerades it with nftables onto
//! its outside address (198.19.k.1), and the "server"'s network (198.19.k.0/24), where
//! `sipsec serve` and the callers run. Every address is from RFC 2544's 198.18.0.0/15 and
//! exists only inside these namespaces; the server's namespace has no route to the home
//! network, so the phones are reachable only through the router's mappings, whose conntrack
//! timeouts are cut to seconds so a test can watch a mapping expire.

use super::{load_run, Endpoint, LoadRun, Server};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Whether network namespaces can be made here (root, `ip` and `nft`). When not, says why
/// (the test then skips); under CI a missing capability is a failure.
pub(crate) fn have_netns() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tool = |t: &str| {
        Command::new(t)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    let why = if !root {
        "network namespaces need root"
    } else if !tool("ip") {
        "no `ip` (iproute2)"
    } else if !tool("nft") {
        "no `nft` (apt-get install nftables)"
    } else {
        return true;
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "the NAT tests need network namespaces under CI: {why}"
    );
    eprintln!("skipped: {why}");
    false
}

/// One network namespace, named uniquely for this test; on drop the processes still in it
/// (all started by the test) are killed and it is deleted, with its interfaces.
pub(crate) struct Netns {
    pub name: String,
}

impl Netns {
    fn add(name: String) -> Netns {
        let ns = Netns { name };
        ip(&["netns", "add", &ns.name]);
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `program` run inside this namespace (`ip netns exec`, which execs it: the child's pid
    /// is the program's).
    pub(crate) fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Runs `program args` inside; panics with its stderr if it fails.
    pub(crate) fn run(&self, program: &str, args: &[&str]) {
        let out = self.command(program).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{} {program} {args:?}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `ip -n NAME args`.
    pub(crate) fn ip(&self, args: &[&str]) {
        ip(&[&["-n", &self.name], args].concat());
    }

    /// A UDP endpoint bound to `addr` inside this namespace: the socket is made on a thread
    /// that entered the namespace, and stays in it wherever it is used.
    pub(crate) fn endpoint(&self, addr: &str) -> Endpoint {
        let path = format!("/run/netns/{}", self.name);
        let addr = addr.to_string();
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let ns = std::fs::File::open(&path).unwrap();
            // SAFETY: a valid namespace descriptor; only this thread moves.
            let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
            Endpoint::bind(&addr)
        })
        .join()
        .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: a process of this test's own namespace.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The topology: home, router and server namespaces (fields drop in this order, each after
/// what the test started in it).
pub(crate) struct Nat {
    pub home: Netns,
    pub router: Netns,
    pub server: Netns,
    /// The third octet of every address of this topology.
    pub k: u8,
    /// The router's conntrack timeout for UDP (both kinds) and for established TCP.
    pub conntrack: Duration,
}

/// How many callers' addresses the server's namespace has besides the server's own
/// (198.19.k.3 up).
const CALLER_ADDRESSES: u8 = 3;

impl Nat {
    /// Builds the topology; the router forgets a UDP mapping `conntrack_s` seconds after its
    /// last packet, and an established TCP one after `conntrack_s` seconds idle too.
    pub(crate) fn new(conntrack_s: u32) -> Nat {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("sipsec-{}-{n}", std::process::id());
        let k = (n % 250 + 1) as u8;
        let nat = Nat {
            home: Netns::add(format!("{prefix}-home")),
            router: Netns::add(format!("{prefix}-router")),
            server: Netns::add(format!("{prefix}-server")),
            k,
            conntrack: Duration::from_secs(conntrack_s.into()),
        };
        let (home, router, server) = (&nat.home.name, &nat.router.name, &nat.server.name);
        nat.router.ip(&[
            "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", home,
        ]);
        nat.router.ip(&[
            "link", "add", "wan", "type", "veth", "peer", "name", "eth0", "netns", server,
        ]);
        nat.home
            .ip(&["addr", "add", &format!("198.18.{k}.2/24"), "dev", "eth0"]);
        nat.home.ip(&["link", "set", "eth0", "up"]);
        nat.home
            .ip(&["route", "add", "default", "via", &format!("198.18.{k}.1")]);
        nat.router
            .ip(&["addr", "add", &format!("198.18.{k}.1/24"), "dev", "lan"]);
        nat.router
            .ip(&["addr", "add", &format!("198.19.{k}.1/24"), "dev", "wan"]);
        nat.router.ip(&["link", "set", "lan", "up"]);
        nat.router.ip(&["link", "set", "wan", "up"]);
        for host in 2..3 + CALLER_ADDRESSES {
            nat.server.ip(&[
                "addr",
                "add",
                &format!("198.19.{k}.{host}/24"),
                "dev",
                "eth0",
            ]);
        }
        nat.server.ip(&["link", "set", "eth0", "up"]);
        // Everything leaving by the outside interface takes the router's address.
        let mut nft = nat
            .router
            .command("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(
            nft.stdin.as_mut().unwrap(),
            b"table ip nat {\n chain postrouting {\n  type nat hook postrouting priority 100;\n  \
              oifname \"wan\" masquerade\n }\n}\n",
        )
        .unwrap();
        drop(nft.stdin.take());
        assert!(nft.wait().unwrap().success(), "nft in {router}");
        // The conntrack sysctls are per namespace, there once the NAT table loaded conntrack.
        let t = conntrack_s.to_string();
        nat.router.run(
            "sysctl",
            &[
                "-qw",
                "net.ipv4.ip_forward=1",
                &format!("net.netfilter.nf_conntrack_udp_timeout={t}"),
                &format!("net.netfilter.nf_conntrack_udp_timeout_stream={t}"),
                &format!("net.netfilter.nf_conntrack_tcp_timeout_established={t}"),
            ],
        );
        nat
    }

    /// The phone's (private) address in the home network; `n` from 2.
    pub(crate) fn home_ip(&self, n: u8) -> String {
        if n > 2 {
            self.home.ip(&[
                "addr",
                "replace",
                &format!("198.18.{}.{n}/24", self.k),
                "dev",
                "eth0",
            ]);
        }
        format!("198.18.{}.{n}", self.k)
    }

    /// The router's outside address, which the server sees the phones come from.
    pub(crate) fn public_ip(&self) -> String {
        format!("198.19.{}.1", self.k)
    }

    /// The server's address.
    pub(crate) fn server_ip(&self) -> String {
        format!("198.19.{}.2", self.k)
    }

    /// A caller's address in the server's network, `n` in 1..=3, other than the server's.
    pub(crate) fn caller_ip(&self, n: u8) -> String {
        assert!((1..=CALLER_ADDRESSES).contains(&n));
        format!("198.19.{}.{}", self.k, 2 + n)
    }

    /// Long enough idle for the router to forget every mapping: three conntrack timeouts and
    /// a second.
    pub(crate) fn idle_past_three_timeouts(&self) {
        std::thread::sleep(self.conntrack * 3 + Duration::from_secs(1));
    }

    /// `sipsec serve` in the server's namespace with `config` (written to `dir/sipsec.toml`),
    /// logging at info to `dir/serve.log` ([`Server::log`], [`Server::stop_counters`]).
    pub(crate) fn serve(&self, dir: &Path, config: &str) -> Server {
        let path = dir.join("sipsec.toml");
        std::fs::write(&path, config).unwrap();
        let log = std::fs::File::create(dir.join("serve.log")).unwrap();
        let child = self
            .server
            .command(env!("CARGO_BIN_EXE_sipsec"))
            .args(["serve", "--config", path.to_str().unwrap()])
            .current_dir(dir)
            .env("SIPSEC_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start sipsec in the server's namespace");
        Server::started(child, dir)
    }

    /// The server's config: UDP and TCP on 5060, TLS on 5061 (certificates made in `dir`),
    /// record-routing, the domain example.test; `extra` appended (tables such as `[nat]`).
    pub(crate) fn config(&self, dir: &Path, extra: &str) -> String {
        let ip = self.server_ip();
        let made = Command::new(env!("CARGO_BIN_EXE_sipsec"))
            .args(["certs", "--name", &ip, "--out"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
        let f = |name: &str| dir.join(name).display().to_string();
        format!(
            "[server]\nlisten = [\"udp:{ip}:5060\", \"tcp:{ip}:5060\", \"tls:{ip}:5061\"]\n\
             domains = [\"example.test\"]\nrecord_route = true\n\
             [tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n\
             [database]\nurl = \"sqlite://{}\"\n{extra}",
            f("server.pem"),
            f("server-key.pem"),
            f("ca.pem"),
            f("s.db"),
        )
    }

    /// `sipsec load` in the server's namespace, as a caller from caller address `from`
    /// (1..=3) over UDP, to `user`@example.test through the server, with `args` (rate,
    /// calls, drain); run to completion.
    pub(crate) fn call(&self, dir: &Path, from: u8, user: &str, args: &[&str]) -> LoadRun {
        let target = format!("udp:{}:5060", self.server_ip());
        let from = self.caller_ip(from);
        let base = [target.as_str(), "--local", &from, "--service", user];
        let more = ["--domain", "example.test", "--quiet"];
        load_run(
            self.server.command(env!("CARGO_BIN_EXE_sipsec")),
            dir,
            &[&base[..], &more, args].concat(),
        )
    }

    /// A SIPp phone in the home network (`peers/sipp/phone.xml`): registers `user` from
    /// `home_ip(2)`:`port` over `transport` (`u1` or `t1`) with its private Contact and
    /// takes calls there; `set` are `-set name value` pairs of the scenario's variables.
    pub(crate) fn sipp_phone(
        &self,
        dir: &Path,
        user: &str,
        transport: &str,
        port: u16,
        set: &[(&str, &str)],
    ) -> SippPhone {
        let log = dir.join(format!("phone-{user}-{port}.log"));
        let peers = super::repo_dir().join("peers/sipp");
        let mut cmd = self.home.command("sipp");
        cmd.arg(format!("{}:5060", self.server_ip()))
            .arg("-sf")
            .arg(peers.join("phone.xml"))
            .arg("-oocsf")
            .arg(peers.join("phone_uas.xml"))
            .args(["-s", user, "-i", &self.home_ip(2), "-p", &port.to_string()])
            .args(["-t", transport, "-m", "1", "-d", "300000", "-nostdin"])
            .args(["-trace_msg", "-message_file", log.to_str().unwrap()])
            .args(["-trace_err", "-error_file"])
            .arg(dir.join(format!("phone-{user}-{port}.err")));
        for (name, value) in set {
            cmd.args(["-set", name, value]);
        }
        let child = cmd
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the SIPp phone");
        SippPhone { child, log }
    }
}

/// baresip, a real softphone, in the home network at `home_ip(2)`:`port`: registers `user`
/// through `outbound` (`sip:SERVER:PORT;transport=...`) with `params` added to the account
/// (`;sipnat=outbound`: an RFC 5626 client, with an instance UUID of its own), answers calls
/// by itself, quits after `seconds`. G.711 from an 8 kHz
/// WAV file of silence (no sound card here, and the sine source makes 48 kHz only), so the
/// PCMU that `sipsec load` offers is taken; `extra` config lines (TLS files). Its output,
/// with a SIP trace, goes to `dir/user.log`.
pub(crate) fn baresip_phone(
    nat: &Nat,
    dir: &Path,
    (user, port): (&str, u16),
    (outbound, params): (&str, &str),
    extra: &str,
    seconds: u32,
) -> Baresip {
    let home = dir.join(user);
    std::fs::create_dir_all(&home).unwrap();
    let wav = home.join("silence-8k.wav");
    std::fs::write(&wav, silence_wav(8000, 30)).unwrap();
    let ip = nat.home_ip(2);
    std::fs::write(
        home.join("uuid"),
        format!("00000000-0000-4000-8000-{:012x}", super::rand_name()),
    )
    .unwrap();
    std::fs::write(
        home.join("config"),
        format!(
            "sip_listen {ip}:{port}\nnet_interface {ip}\nmodule_path /usr/lib/baresip/modules\n\
             module g711.so\nmodule aufile.so\nmodule uuid.so\nmodule_app account.so\n\
             module_app menu.so\n\
             audio_source aufile,{}\naudio_player aufile,/dev/null\n\
             audio_alert aufile,/dev/null\n{extra}",
            wav.display()
        ),
    )
    .unwrap();
    std::fs::write(
        home.join("accounts"),
        format!(
            "<sip:{user}@example.test>;outbound=\"{outbound}\";regint=600;answermode=auto{params}\n"
        ),
    )
    .unwrap();
    let log = dir.join(format!("{user}.log"));
    let child = nat
        .home
        .command("baresip")
        .arg("-f")
        .arg(&home)
        .args(["-s", "-t", &seconds.to_string()])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("start baresip in the home namespace");
    Baresip { child, log }
}

/// A mono 16-bit PCM WAV file of `seconds` of silence at `rate` Hz.
fn silence_wav(rate: u32, seconds: u32) -> Vec<u8> {
    let data = rate * seconds * 2;
    let mut w = Vec::with_capacity(44 + data as usize);
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&(36 + data).to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    w.extend_from_slice(&16u32.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes()); // PCM
    w.extend_from_slice(&1u16.to_le_bytes()); // mono
    w.extend_from_slice(&rate.to_le_bytes());
    w.extend_from_slice(&(rate * 2).to_le_bytes());
    w.extend_from_slice(&2u16.to_le_bytes());
    w.extend_from_slice(&16u16.to_le_bytes());
    w.extend_from_slice(b"data");
    w.extend_from_slice(&data.to_le_bytes());
    w.resize(44 + data as usize, 0);
    w
}

/// A baresip phone behind the NAT, killed on drop.
pub(crate) struct Baresip {
    pub child: Child,
    pub log: PathBuf,
}

impl Baresip {
    /// What baresip printed so far.
    pub(crate) fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `within` for the server's 200 OK to baresip's REGISTER; panics with its
    /// output if it does not come.
    pub(crate) fn registered(&self, within: Duration) {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if self.output().contains("200 OK (sipsec)") {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("baresip did not register:\n{}", self.output());
    }
}

impl Drop for Baresip {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sipsec load --role uas --register` in the home network: registers `user` from
/// `home_ip(2)` over `transport` (`udp`, `tcp`, `tls`, checking the server's certificate
/// against `dir/ca.pem`) and takes its calls on that flow; `extra` options (`--outbound`).
/// Runs up to five minutes; its stderr goes to `dir/load-phone-user.err`.
pub(crate) fn load_phone(
    nat: &Nat,
    dir: &Path,
    user: &str,
    transport: &str,
    extra: &[&str],
) -> LoadPhone {
    let users = dir.join(format!("{user}.csv"));
    std::fs::write(&users, format!("{user},unused,example.test\n")).unwrap();
    let port = if transport == "tls" { 5061 } else { 5060 };
    let err = dir.join(format!("load-phone-{user}.err"));
    let mut command = nat.home.command(env!("CARGO_BIN_EXE_sipsec"));
    command
        .args(["load", "--role", "uas", "--register"])
        .arg(format!("{transport}:{}:{port}", nat.server_ip()))
        .arg("--users")
        .arg(&users)
        .args(["--domain", "example.test", "--local", &nat.home_ip(2)]);
    if transport == "tls" {
        command.arg("--tls-ca").arg(dir.join("ca.pem"));
    }
    let child = command
        .args(["--duration", "300", "--quiet"])
        .args(extra)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("start sipsec load as a registering callee in the home namespace");
    LoadPhone { child, err }
}

/// A registering `sipsec load` callee behind the NAT, killed on drop.
pub(crate) struct LoadPhone {
    pub child: Child,
    pub err: PathBuf,
}

impl LoadPhone {
    /// Waits up to `within` for the callee's report that all its flows registered; panics
    /// with what it printed if they did not.
    pub(crate) fn registered(&self, within: Duration) {
        let until = Instant::now() + within;
        while Instant::now() < until {
            let text = std::fs::read_to_string(&self.err).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.contains("flows registered")) {
                let mut words = line.split_whitespace().skip(2);
                let (ok, of, all) = (words.next(), words.next(), words.next());
                assert!(of == Some("of") && ok == all && ok != Some("0"), "{text}");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the load phone did not register: {}",
            std::fs::read_to_string(&self.err).unwrap_or_default()
        );
    }
}

impl Drop for LoadPhone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A SIPp phone behind the NAT, killed on drop; its messages traced to a file.
pub(crate) struct SippPhone {
    pub child: Child,
    pub log: PathBuf,
}

impl SippPhone {
    /// What the phone sent and received so far.
    pub(crate) fn messages(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The received messages whose first line starts with `start` (`INVITE `, `OPTIONS `,
    /// `SIP/2.0 200`), each with its CSeq line.
    pub(crate) fn received(&self, start: &str) -> Vec<String> {
        self.messages()
            .split("-----------------------------------------------")
            .filter(|block| block.contains("message received"))
            .filter_map(|block| {
                let mut lines = block
                    .lines()
                    .skip_while(|l| !l.contains("message received"));
                let first = lines.find(|l| !l.trim().is_empty() && !l.contains("received"))?;
                first.starts_with(start).then(|| block.to_string())
            })
            .collect()
    }

    /// Waits up to `within` for the 200 OK to the phone's REGISTER; panics with the trace if
    /// it does not come.
    pub(crate) fn registered(&self, within: Duration) {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if self
                .received("SIP/2.0 200")
                .iter()
                .any(|m| m.contains("REGISTER"))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the phone did not register:\n{}", self.messages());
    }

    /// Kills the phone: its socket or connection closes with it.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SippPhone {
    fn drop(&mut self) {
        self.kill();
    }
}
