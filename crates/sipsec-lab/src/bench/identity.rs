//! STIR/SHAKEN in a bench run (`--identity`): the started server signs every call's INVITE,
//! or verifies the INVITEs the load signs — with the signing certificate fetched once and
//! cached, or fetched for every call — so its CPU per call is read against the same proxy
//! without (issue 39's question). Made here for the run: a test STI-CA and a signing
//! certificate (`sipsec certs --shaken`), and the certificate repository the verifier fetches
//! from (`sipsec cert-server`, pinned beside the load, its CPU reported as a peer's). In
//! `verify-hostile`, beside the load's calls, a hostile sender offers INVITEs whose
//! certificates are at a host that never answers: the question is whether the good calls
//! wait for the hostile ones' fetches (issue 39: their p99 unchanged within 10%).

use super::cpu;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use sipsec_identity::{cert::Authority, sti};
use sipsec_load::LoadArgs;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where the bench's certificate repository listens.
const CERT_SERVER: &str = "127.0.0.1:35443";

/// The host the hostile INVITEs' certificates are at: a listener that takes connections (the
/// kernel completes them, up to its backlog) and never reads or answers one — "a host that
/// never answers", inside the allow-list.
const TARPIT: &str = "127.0.0.1:35444";

/// Where the hostile sender sends from (beside the load's 127.0.0.2).
const HOSTILE_FROM: &str = "127.0.0.4:0";

/// Hostile INVITEs a second in `verify-hostile`: each names a certificate URL of its own, so
/// no cached failure answers it: each is a fetch that waits its whole time-out, or, with the
/// verifier's fetch slots all taken, waits that long for a slot and is refused.
pub(crate) const HOSTILE_RATE: f64 = 50.0;

/// The numbers the load calls from and to in an identity run: a token names telephone
/// numbers, and a SIP user that is none is neither signed nor verified.
pub(crate) const CALLER: &str = "+15551230000";
pub(crate) const CALLEE: &str = "+15557650000";

/// What the started server does with caller identity (`sipsec bench --identity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum IdentityMode {
    /// Nothing: no `[identity]`, the load's usual users.
    #[default]
    Off,
    /// No `[identity]`, calls between the telephone numbers the other modes use: their
    /// baseline, like for like.
    Unsigned,
    /// Signs every call's INVITE (an open proxy vouches for its callers: attestation C).
    Sign,
    /// Verifies every call's INVITE, signed by the load; the certificate is fetched once and
    /// kept for its max-age (an hour).
    Verify,
    /// Verifies as `verify`, keeping no certificate (`cert_max_ttl_s = 0`): a fetch per call,
    /// unless calls arrive while one is under way (they wait for it).
    VerifyFetch,
    /// Verifies as `verify` while a hostile sender offers 50 INVITEs a second, each signed
    /// with an x5u of its own at a host the allow-list admits and that never answers: eight
    /// fetches at once, each waiting its whole time-out (2 s), the rest waiting as long for a
    /// slot and refused.
    VerifyHostile,
}

impl IdentityMode {
    /// Whether the load signs its INVITEs for the server to verify.
    fn verifies(self) -> bool {
        matches!(
            self,
            IdentityMode::Verify | IdentityMode::VerifyFetch | IdentityMode::VerifyHostile
        )
    }
}

/// An identity run's set-up: the server's `[identity]` table, and the certificate repository
/// (stopped on drop).
pub(crate) struct Identity {
    /// The `[identity]` table of the started server's config.
    pub(crate) table: String,
    /// The repository's process (for its CPU, as a peer's).
    repository: Option<Child>,
    /// `verify-hostile`: the host that never answers, and the signing key's PEM.
    hostile: Option<(TcpListener, Vec<u8>)>,
}

impl Identity {
    /// Makes the STI certificates in `dir` (beside the TLS ones of `tls_dir`, which the
    /// repository serves with) and, where the server verifies, starts the repository pinned
    /// to `load_cpu`.
    pub(crate) fn start(
        mode: IdentityMode,
        dir: &Path,
        tls_dir: &Path,
        load_cpu: usize,
    ) -> Result<Self> {
        if matches!(mode, IdentityMode::Off | IdentityMode::Unsigned) {
            return Ok(Identity {
                table: String::new(),
                repository: None,
                hostile: None,
            });
        }
        sti::make(dir, &Authority::Codes(vec!["1234".into()]))?;
        let url = format!("https://{CERT_SERVER}/{}", sti::SHAKEN_CERT);
        if mode == IdentityMode::Sign {
            return Ok(Identity {
                table: format!(
                    "[identity]\nsign = true\nkey = \"{}\"\nx5u = \"{url}\"\n",
                    dir.join(sti::SHAKEN_KEY).display()
                ),
                repository: None,
                hostile: None,
            });
        }
        let keep = if mode == IdentityMode::VerifyFetch {
            "cert_ttl_s = 0\ncert_max_ttl_s = 0\n"
        } else {
            ""
        };
        let table = format!(
            "[identity]\nverify = true\nroots = \"{}\"\nfetch_allow = [\"127.0.0.1\"]\n\
             fetch_ca = \"{}\"\npolicy = \"reject\"\nrequire = true\n{keep}",
            dir.join(sti::STI_CA).display(),
            tls_dir.join(sipsec_transport::tls::certs::CA).display()
        );
        // The repository serves the signing certificate (from `dir`) over TLS with the
        // bench's server certificate (from `tls_dir`).
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("cert-server")
            .args(["--listen", CERT_SERVER, "--dir"])
            .arg(dir)
            .arg("--cert")
            .arg(tls_dir.join(sipsec_transport::tls::certs::SERVER))
            .arg("--key")
            .arg(tls_dir.join(sipsec_transport::tls::certs::SERVER_KEY))
            .args([
                "--max-age-s",
                if mode == IdentityMode::VerifyFetch {
                    "0"
                } else {
                    "3600"
                },
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: set_affinity makes only async-signal-safe calls between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || cpu::set_affinity(load_cpu));
        }
        let mut child = cmd.spawn().context("cannot start sipsec cert-server")?;
        let mut first = String::new();
        BufReader::new(child.stdout.take().context("no stdout")?)
            .read_line(&mut first)
            .context("reading the certificate server's banner")?;
        let hostile = match mode {
            IdentityMode::VerifyHostile => Some((
                TcpListener::bind(TARPIT).with_context(|| format!("cannot listen on {TARPIT}"))?,
                std::fs::read(dir.join(sti::SHAKEN_KEY))?,
            )),
            _ => None,
        };
        let repository = Identity {
            table,
            repository: Some(child),
            hostile,
        };
        if !first.starts_with("cert server on") {
            bail!("sipsec cert-server did not start (see its errors above)");
        }
        Ok(repository)
    }

    /// The repository's PID, where one runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.repository.as_ref().map(Child::id)
    }

    /// The load's options for `mode`: calls between two telephone numbers, and, where the
    /// server verifies, signed with the certificate's key.
    pub(crate) fn configure_load(mode: IdentityMode, dir: &Path, load: &mut LoadArgs) {
        if mode == IdentityMode::Off {
            return;
        }
        load.caller = CALLER.into();
        load.service = CALLEE.into();
        if mode.verifies() {
            load.identity_key = Some(dir.join(sti::SHAKEN_KEY));
            load.x5u = Some(format!("https://{CERT_SERVER}/{}", sti::SHAKEN_CERT));
        }
    }
}

impl Identity {
    /// `verify-hostile`: starts offering hostile INVITEs to the server at `target` (UDP)
    /// until [`Hostile::finish`].
    pub(crate) fn start_hostile(&self, target: SocketAddr) -> Result<Option<Hostile>> {
        let Some((_, pem)) = &self.hostile else {
            return Ok(None);
        };
        let socket = UdpSocket::bind(HOSTILE_FROM)
            .with_context(|| format!("cannot bind the hostile sender to {HOSTILE_FROM}"))?;
        socket.set_read_timeout(Some(Duration::from_millis(2)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (pem, flag) = (pem.clone(), stop.clone());
        let thread = std::thread::spawn(move || hostile(&socket, target, &pem, &flag));
        Ok(Some(Hostile {
            stop,
            thread: Some(thread),
        }))
    }
}

/// The hostile sender of a `verify-hostile` run; dropped without [`Hostile::finish`] (the
/// run failed), it stops sending all the same.
pub(crate) struct Hostile {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<HostileReport>>>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Hostile {
    /// Stops sending (answers already on their way are still read for the fetch time-out
    /// and a little more) and says what came back.
    pub(crate) fn finish(mut self) -> Result<HostileReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .expect("joined once")
            .join()
            .map_err(|_| anyhow::anyhow!("the hostile sender panicked"))?
    }
}

/// What the hostile sender sent and what the server answered (the first final response to
/// each INVITE; 100 Trying and retransmissions aside).
#[derive(Debug, Clone, Serialize)]
pub struct HostileReport {
    /// INVITEs sent.
    pub sent: u64,
    /// Final responses by status code.
    pub answered: BTreeMap<u16, u64>,
}

/// Sends [`HOSTILE_RATE`] INVITEs a second from `socket` to `target` until `stop`, each with
/// an Identity signed by the key in `pem` whose x5u is a URL of its own at [`TARPIT`]; then
/// reads answers for the server's fetch time-out and a second more.
fn hostile(
    socket: &UdpSocket,
    target: SocketAddr,
    pem: &[u8],
    stop: &AtomicBool,
) -> Result<HostileReport> {
    use sipsec_identity::{header, passport, Attest, Claims, SigningKey};
    let from = socket.local_addr()?;
    let mut answered: BTreeMap<u16, u64> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut buf = vec![0u8; 65_536];
    let mut read = |seen: &mut std::collections::HashSet<u64>| {
        while let Ok(n) = socket.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]);
            let code = text
                .strip_prefix("SIP/2.0 ")
                .and_then(|t| t.get(..3))
                .and_then(|c| c.parse::<u16>().ok());
            let call = text
                .lines()
                .find_map(|l| l.strip_prefix("Call-ID: hostile-"))
                .and_then(|n| n.trim().parse::<u64>().ok());
            if let (Some(code), Some(call)) = (code, call) {
                if code >= 200 && seen.insert(call) {
                    *answered.entry(code).or_default() += 1;
                }
            }
        }
    };
    let began = Instant::now();
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = began + Duration::from_secs_f64(sent as f64 / HOSTILE_RATE);
        if Instant::now() < due {
            read(&mut seen);
            continue;
        }
        let key = SigningKey::from_pem(pem, &format!("https://{TARPIT}/c{sent}.pem"))?;
        let claims = Claims {
            attest: Attest::A,
            orig: CALLER.trim_start_matches('+').into(),
            dest: vec![CALLEE.trim_start_matches('+').into()],
            iat: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs(),
            origid: passport::new_origid(),
        };
        let invite = format!(
            "INVITE sip:{CALLEE}@{target};user=phone SIP/2.0\r\n\
             Via: SIP/2.0/UDP {from};branch=z9hG4bKhostile{sent}\r\nMax-Forwards: 70\r\n\
             From: <sip:{CALLER}@{from};user=phone>;tag=h{sent}\r\n\
             To: <sip:{CALLEE}@{target};user=phone>\r\nCall-ID: hostile-{sent}\r\n\
             CSeq: 1 INVITE\r\nContact: <sip:h@{from}>\r\nIdentity: {}\r\n\
             Content-Length: 0\r\n\r\n",
            header::value(&key, &claims)
        );
        socket.send_to(invite.as_bytes(), target)?;
        sent += 1;
    }
    let drain = Instant::now() + Duration::from_secs(3);
    while Instant::now() < drain && (seen.len() as u64) < sent {
        read(&mut seen);
    }
    Ok(HostileReport { sent, answered })
}

impl Drop for Identity {
    fn drop(&mut self) {
        if let Some(child) = &mut self.repository {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
