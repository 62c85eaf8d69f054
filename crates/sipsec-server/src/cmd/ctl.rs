//! `sipsec ctl reload | counters`: asking a running `sipsec serve` through its control socket
//! (`serve::control`, `[control] socket`) and printing its answer — a reload's outcome, not
//! only a log line as with SIGHUP.
//!
//! The socket is found in the server's config file. That file is read leniently, for
//! `[control] socket` alone: `reload` is most needed when the file has just been edited, and
//! the server, not this command, says what is wrong with it.
//!
//! Whoever listens on the socket path is not trusted for being there: the answer counts only
//! if the process holding the socket runs as this user or as root (`SO_PEERCRED`, as the
//! server checks its clients), and what it says is shown as plain text, with escape sequences
//! and other control characters made visible instead of acted on by the terminal.

use crate::serve::control::{self, Command, Reply};
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `sipsec ctl`'s arguments.
#[derive(clap::Args, Debug)]
pub struct CtlArgs {
    /// What to ask: `reload` (read the config file again), `counters` (every counter) or
    /// `bindings` (the registrations held, with where each is reached).
    #[arg(value_parser = parse_command)]
    pub command: Command,
    /// The server's config file, whose `[control] socket` says where to ask.
    #[arg(long, short, conflicts_with = "socket")]
    pub config: Option<PathBuf>,
    /// The control socket itself.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// How long to wait for the answer, in seconds.
    #[arg(long, default_value_t = 30)]
    pub timeout_s: u64,
}

fn parse_command(s: &str) -> std::result::Result<Command, String> {
    Command::ALL
        .into_iter()
        .find(|c| c.name() == s)
        .ok_or_else(|| {
            let known: Vec<_> = Command::ALL.iter().map(|c| c.name()).collect();
            format!("one of {}", known.join(", "))
        })
}

/// Asks the server. `Err` when it could not be asked; `Ok` with its answer, which may be a
/// refusal.
pub fn run(args: &CtlArgs) -> Result<Reply> {
    let socket = match (&args.socket, &args.config) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) => socket_of(c)?,
        (None, None) => bail!("say where the server is: --config FILE or --socket PATH"),
    };
    let mut stream = std::os::unix::net::UnixStream::connect(&socket).with_context(|| {
        format!(
            "cannot reach a server at {} (is it running, with [control] socket set?)",
            socket.display()
        )
    })?;
    let peer = peer_uid(&stream)
        .with_context(|| format!("cannot tell who listens on {}", socket.display()))?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let own = unsafe { libc::getuid() };
    if !trusted_peer(peer, own) {
        bail!(
            "{} is held by uid {peer}, neither this user (uid {own}) nor root: not a server \
             to trust (run ctl as the server's user)",
            socket.display()
        );
    }
    let timeout = Some(Duration::from_secs(args.timeout_s.max(1)));
    stream.set_read_timeout(timeout)?;
    stream.set_write_timeout(timeout)?;
    stream.write_all(format!("{}\n", args.command.name()).as_bytes())?;
    let mut wire = String::new();
    stream
        .read_to_string(&mut wire)
        .with_context(|| format!("no answer from {}", socket.display()))?;
    Ok(match control::decode(&wire) {
        Ok(text) => Ok(plain(&text)),
        Err(text) => Err(plain(&text)),
    })
}

/// Whether a server whose socket is held by `peer` may be believed by a client running as
/// `own`: the same user, or root.
pub(crate) fn trusted_peer(peer: u32, own: u32) -> bool {
    peer == own || peer == 0
}

/// The uid of the process at the other end of a Unix socket (`SO_PEERCRED`).
fn peer_uid(stream: &std::os::unix::net::UnixStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes and `len` is `cred`'s size.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    match r {
        0 => Ok(cred.uid),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// `text` safe to print on a terminal: ANSI escape sequences (CSI `ESC [ … final`, OSC
/// `ESC ] … BEL or ESC \\`, and two-byte `ESC x`) removed, and every other control character
/// but newline and tab — C0, DEL and C1 alike — shown as `\xNN` / `\u{NN}`.
pub fn plain(text: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => match chars.next() {
                // CSI: parameters and intermediates up to a final byte in @..~.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC (and the other string commands): up to BEL or ST (ESC \\).
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    while let Some(c) = chars.next() {
                        if c == '\x07' || (c == '\x1b' && chars.next_if_eq(&'\\').is_some()) {
                            break;
                        }
                    }
                }
                // ESC followed by one character: both gone.
                _ => {}
            },
            '\n' | '\t' => out.push(c),
            c if (c as u32) < 0x20 || c == '\x7f' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if ('\u{80}'..='\u{9f}').contains(&c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// `[control] socket` of a config file, taken relative to the file as the server takes it.
fn socket_of(config: &Path) -> Result<PathBuf> {
    let text = crate::config::read_file(config)?;
    let table: toml::Table = text.parse().with_context(|| {
        format!(
            "cannot find [control] socket in {}, which is not TOML (the server would refuse it \
             too); give --socket",
            config.display()
        )
    })?;
    let Some(socket) = table
        .get("control")
        .and_then(|c| c.get("socket"))
        .and_then(toml::Value::as_str)
    else {
        bail!(
            "{} sets no [control] socket: set one and restart the server, or send it SIGHUP",
            config.display()
        );
    };
    Ok(config.parent().unwrap_or(Path::new("")).join(socket))
}
