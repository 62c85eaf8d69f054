//! Idle connections held open through a bench run (`--idle-connections`): what a server pays
//! to keep thousands of registered phones' or browsers' connections that carry no calls. A
//! helper process of its own (`sipsec hold-connections`) holds them, so they do not count
//! against the bench's own limit of open files; over TLS each finishes a full handshake (a
//! client apiece, no resumption), over `ws`/`wss` its WebSocket upgrade too, and the helper
//! answers what the server sends them (WebSocket keep-alive Pings) until it is told to stop.
//! The bench reads the server's resident memory before and after they open.

use anyhow::{bail, Context, Result};
use sipsec_transport::net::conn::{Framed, ReadEnd, StreamConn};
use sipsec_transport::net::epoll::{self, Epoll};
use sipsec_transport::net::transport::Transport;
use sipsec_transport::net::ws::Policy;
use sipsec_transport::tls::{self, ClientTls};
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections whose handshake is under way at once: enough to keep the server busy
/// accepting, few enough that none waits out its handshake timeout in the listen queue.
const IN_FLIGHT: usize = 128;

/// The helper process holding the connections; dropping it closes them.
pub(crate) struct IdleConnections {
    child: std::process::Child,
}

impl IdleConnections {
    /// Opens `n` connections over `transport` to `to` (TLS checked against `tls_ca`) and
    /// returns once the server has taken every one.
    /// With `identity` (certificate and key), TLS connections present it (`--mutual`).
    pub(crate) fn open(
        to: SocketAddr,
        n: usize,
        transport: Transport,
        tls_ca: &Path,
        identity: Option<(&Path, &Path)>,
    ) -> Result<IdleConnections> {
        let mut command = std::process::Command::new(std::env::current_exe()?);
        command
            .args(["hold-connections", &to.to_string(), &n.to_string()])
            .args(["--transport", &transport.to_string()])
            .arg("--tls-ca")
            .arg(tls_ca);
        if let Some((cert, key)) = identity {
            command
                .arg("--tls-cert")
                .arg(cert)
                .arg("--tls-key")
                .arg(key);
        }
        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("start the idle-connection holder")?;
        let mut line = String::new();
        let stdout = child.stdout.take().context("the holder's stdout")?;
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = child.wait();
            bail!("could not open {n} idle {transport} connections to {to} (see above)");
        }
        Ok(IdleConnections { child })
    }
}

impl Drop for IdleConnections {
    fn drop(&mut self) {
        // Closing its stdin tells the holder to exit.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// `sipsec hold-connections`: what to hold.
#[derive(clap::Args, Debug, Clone)]
pub struct HoldArgs {
    /// The server's listener for `transport`.
    pub to: SocketAddr,
    /// How many connections to hold.
    pub count: usize,
    /// Their transport.
    #[arg(long, value_enum, default_value = "tcp")]
    pub transport: Transport,
    /// The CA the server's certificate chains to (TLS and WSS).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate to present (a server that demands one).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// `sipsec hold-connections`: opens the connections, says `ready` once the server has held
/// each for a second, answers what it sends them until stdin closes, then closes them.
pub fn hold(a: &HoldArgs) -> Result<()> {
    sipsec_transport::net::raise_fd_limit();
    let tls = if a.transport.secure() {
        // rustls with its defaults: what holds a connection open does not depend on the
        // suite the calls use.
        let side = tls::ClientSide {
            ca: Some(a.tls_ca.clone().context("TLS needs --tls-ca")?),
            identity: a.tls_cert.clone().zip(a.tls_key.clone()),
            ..tls::ClientSide::default()
        };
        Some(tls::client(&side)?)
    } else {
        None
    };
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let mut held = Held::new(a, tls)?;
    // Open them all, a bounded number handshaking at a time.
    let deadline = Instant::now() + Duration::from_secs(60 + a.count as u64 / 100);
    while held.established < a.count {
        while held.conns.len() < a.count && held.conns.len() - held.established < IN_FLIGHT {
            held.connect()?;
        }
        held.poll(100)?;
        if Instant::now() > deadline {
            bail!(
                "only {} of {} {} connections to {} finished their handshake",
                held.established,
                a.count,
                a.transport,
                a.to
            );
        }
    }
    // Held means still open once the server has seen them all (a server at its connection
    // limit accepts and closes).
    let settle = Instant::now() + Duration::from_secs(1);
    while Instant::now() < settle {
        held.poll(100)?;
    }
    println!("ready");
    std::io::stdout().flush()?;
    while !stop.load(Ordering::Relaxed) {
        // Not fatal once the run is under way: said here, and in the report's server
        // counters (`idle_closed`, `websocket_closed_abruptly`).
        let _ = held.poll(200);
    }
    let closed = held.conns.iter().filter(|c| c.is_none()).count();
    if closed > 0 {
        eprintln!(
            "sipsec hold-connections: the server closed {closed} of {} idle connections during \
             the run",
            a.count
        );
    }
    Ok(())
}

/// The connections, polled together.
struct Held<'a> {
    args: &'a HoldArgs,
    tls: Option<ClientTls>,
    policy: Arc<Policy>,
    epoll: Epoll,
    events: Vec<epoll::Event>,
    conns: Vec<Option<StreamConn>>,
    /// Whether each has finished its handshake (and upgrade).
    ready: Vec<bool>,
    established: usize,
    scratch: Vec<u8>,
    framed: Framed,
}

impl<'a> Held<'a> {
    fn new(args: &'a HoldArgs, tls: Option<ClientTls>) -> Result<Held<'a>> {
        Ok(Held {
            args,
            tls,
            policy: Arc::new(Policy {
                origins: Vec::new(),
                hosts: Vec::new(),
                max_message: 65_535,
            }),
            epoll: Epoll::new()?,
            events: epoll::events(1024),
            conns: Vec::with_capacity(args.count),
            ready: Vec::with_capacity(args.count),
            established: 0,
            scratch: vec![0; 16 * 1024],
            framed: Framed::default(),
        })
    }

    /// Opens the next connection and starts its handshake.
    fn connect(&mut self) -> Result<()> {
        let (to, i) = (self.args.to, self.conns.len());
        let stream = TcpStream::connect_timeout(&to, Duration::from_secs(5))
            .with_context(|| format!("idle connection {} of {} to {to}", i + 1, self.args.count))?;
        stream.set_nonblocking(true)?;
        let session = match &self.tls {
            Some(cfg) => Some(cfg.connect(tls::server_name(None, to.ip())?)?),
            None => None,
        };
        let mut conn = StreamConn::new(stream, to, session);
        if self.args.transport.websocket() {
            conn.open_websocket(self.policy.clone(), &to.to_string());
        }
        self.epoll
            .add(conn.stream.as_raw_fd(), epoll::STREAM, i as u64)?;
        conn.flush();
        self.conns.push(Some(conn));
        self.ready.push(false);
        self.service(i)
    }

    /// Waits up to `timeout_ms` for events and serves them; an error when a connection closed.
    fn poll(&mut self, timeout_ms: i32) -> Result<()> {
        let n = self.epoll.wait(&mut self.events, timeout_ms);
        let ready: Vec<usize> = self.events[..n].iter().map(|e| e.u64 as usize).collect();
        let mut closed = 0;
        for i in ready {
            if self.service(i).is_err() {
                closed += 1;
            }
        }
        if closed > 0 {
            bail!(
                "the server closed {closed} of {} idle connections (its connection limits?)",
                self.args.count
            );
        }
        Ok(())
    }

    /// Reads what connection `i` has, answers it (handshake, upgrade, Pings) and notes when
    /// it is established; an error (and the connection dropped) when it closed.
    fn service(&mut self, i: usize) -> Result<()> {
        let Some(conn) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return Ok(());
        };
        let end = conn.read(&mut self.scratch);
        conn.frame(65_535, &mut self.framed);
        let consumed = self.framed.consumed;
        conn.consume(consumed);
        let failed = !matches!(end, ReadEnd::Drained) || self.framed.closed || !conn.flush();
        if failed {
            self.conns[i] = None;
            bail!("connection {i} closed: {end:?}");
        }
        let handshaken = self.tls.is_none() || conn.handshake_kind().is_some();
        if !self.ready[i] && handshaken && conn.upgraded() {
            self.ready[i] = true;
            self.established += 1;
        }
        Ok(())
    }
}

/// The server's resident memory around opening the idle connections.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Memory {
    /// Resident kB of the server's processes before.
    pub rss_kb_before: u64,
    /// And with the connections held.
    pub rss_kb_with: u64,
    /// The growth per connection held, kB.
    pub kb_per_connection: f64,
}

impl Memory {
    pub(crate) fn new(before: u64, with: u64, n: usize) -> Memory {
        Memory {
            rss_kb_before: before,
            rss_kb_with: with,
            kb_per_connection: with.saturating_sub(before) as f64 / n.max(1) as f64,
        }
    }
}

/// The resident memory of `pids` together, kB (`VmRSS`; 0 for a process gone).
pub(crate) fn resident_kb(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .filter_map(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum()
}
