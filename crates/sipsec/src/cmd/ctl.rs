//! `sipsec ctl reload | counters`: asking a running `sipsec serve` through its control socket
//! (`serve::control`, `[control] socket`) and printing its answer — a reload's outcome, not
//! only a log line as with SIGHUP.
//!
//! The socket is found in the server's config file. That file is read leniently, for
//! `[control] socket` alone: `reload` is most needed when the file has just been edited, and
//! the server, not this command, says what is wrong with it.

use crate::serve::control::{self, Command, Reply};
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct CtlArgs {
    /// What to ask: `reload` (read the config file again) or `counters` (every counter).
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
    let timeout = Some(Duration::from_secs(args.timeout_s.max(1)));
    stream.set_read_timeout(timeout)?;
    stream.set_write_timeout(timeout)?;
    stream.write_all(format!("{}\n", args.command.name()).as_bytes())?;
    let mut wire = String::new();
    stream
        .read_to_string(&mut wire)
        .with_context(|| format!("no answer from {}", socket.display()))?;
    Ok(control::decode(&wire))
}

/// `[control] socket` of a config file, taken relative to the file as the server takes it.
fn socket_of(config: &Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string(config)
        .with_context(|| format!("cannot read config file {}", config.display()))?;
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
