//! The control socket (`[control] socket`): a Unix socket on which `sipsec ctl` asks the
//! running server to reload its configuration or report its counters — what SIGHUP and SIGUSR1
//! do, with the outcome returned to the one who asked instead of only logged.
//!
//! One command a connection: the client writes one line (`reload`, `counters`); the server
//! answers `ok` or `error` on the first line, then text, and closes. Only the user the server
//! runs as and root may connect: the socket is made 0600 and each peer's uid is checked too.
//! At most `MAX_CLIENTS` connections are served at once (more are told so and closed), and
//! one that sends no command within `READ_TIMEOUT`, or does not take its answer within as
//! long, is closed.
//! The listener runs on the server's runtime; the commands themselves are carried out by the
//! server's main thread, the one that handles signals (`Control::next`), so reloads by
//! either way happen one at a time.

use anyhow::{bail, Context, Result};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The longest command line read; anything longer is refused.
const MAX_LINE: usize = 256;

/// How long a client has to send its command, and to take its answer.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections served at once.
pub(crate) const MAX_CLIENTS: usize = 8;

/// What `sipsec ctl` can ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Read the configuration file again (as SIGHUP does).
    Reload,
    /// Every counter, `name value` a line (what SIGUSR1 logs, zeros included).
    Counters,
    /// The registrations held, one a line: AOR, Contact, where it is reached and from where
    /// it registered, its outbound identity and Path (the first worker's replica, which holds
    /// them all).
    Bindings,
}

impl Command {
    /// Every command, in the order `sipsec ctl` lists them.
    pub const ALL: [Command; 3] = [Command::Reload, Command::Counters, Command::Bindings];

    /// The word on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Command::Reload => "reload",
            Command::Counters => "counters",
            Command::Bindings => "bindings",
        }
    }

    fn parse(line: &str) -> Option<Command> {
        Command::ALL.into_iter().find(|c| c.name() == line.trim())
    }
}

/// The answer to a command: its text, or why it was refused.
pub type Reply = std::result::Result<String, String>;

/// Writes `reply` as it goes on the wire.
pub fn encode(reply: &Reply) -> String {
    let (status, text) = match reply {
        Ok(t) => ("ok", t),
        Err(t) => ("error", t),
    };
    match text.ends_with('\n') || text.is_empty() {
        true => format!("{status}\n{text}"),
        false => format!("{status}\n{text}\n"),
    }
}

/// Reads a reply off the wire (what [`encode`] wrote).
pub fn decode(wire: &str) -> Reply {
    match wire.split_once('\n') {
        Some(("ok", text)) => Ok(text.to_string()),
        Some(("error", text)) => Err(text.to_string()),
        _ => Err(format!("not a sipsec control reply: {wire:?}\n")),
    }
}

/// A command waiting for the main thread, and where its answer goes.
#[derive(Debug)]
pub struct Request {
    /// What was asked.
    pub command: Command,
    reply: tokio::sync::oneshot::Sender<Reply>,
}

impl Request {
    /// Sends the answer back to the client; a client that has gone is ignored.
    pub fn answer(self, reply: Reply) {
        let _ = self.reply.send(reply);
    }
}

/// The bound socket. Dropping it stops listening and removes the socket file.
pub(crate) struct Control {
    path: PathBuf,
    requests: mpsc::Receiver<Request>,
    task: tokio::task::JoinHandle<()>,
}

impl Control {
    /// Binds `path` (refusing one a live server answers on, replacing a stale one) and listens
    /// on `runtime`.
    pub(crate) fn bind(runtime: &tokio::runtime::Handle, path: &Path) -> Result<Control> {
        let key = || format!("control.socket: {}", path.display());
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                bail!("{}: exists and is not a socket", key());
            }
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("{}: another server is listening there", key());
            }
            std::fs::remove_file(path).with_context(|| format!("{}: cannot replace", key()))?;
        }
        let listener = std::os::unix::net::UnixListener::bind(path)
            .with_context(|| format!("{}: cannot listen", key()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("{}: cannot make it private", key()))?;
        let owner = std::fs::metadata(path)?.uid();
        listener.set_nonblocking(true)?;
        let _guard = runtime.enter();
        let listener = tokio::net::UnixListener::from_std(listener)?;
        let (tx, requests) = mpsc::channel();
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CLIENTS));
        let task = runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(crate::metrics::ACCEPT_BACKOFF).await;
                    continue;
                };
                match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            serve(stream, owner, &tx).await;
                            drop(slot);
                        });
                    }
                    // Told without waiting (the answer fits any socket buffer), then closed.
                    Err(_) => {
                        let busy: Reply = Err(format!("busy: {MAX_CLIENTS} connections already\n"));
                        let _ = stream.try_write(encode(&busy).as_bytes());
                    }
                }
            }
        });
        Ok(Control {
            path: path.to_path_buf(),
            requests,
            task,
        })
    }

    /// A command that arrived since the last call, if any. For the main thread's loop.
    pub(crate) fn next(&self) -> Option<Request> {
        self.requests.try_recv().ok()
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One connection: one command in, one reply out.
async fn serve(mut stream: tokio::net::UnixStream, owner: u32, requests: &mpsc::Sender<Request>) {
    let reply = match stream.peer_cred() {
        Ok(c) if c.uid() == owner || c.uid() == 0 => read_and_run(&mut stream, requests).await,
        Ok(c) => Err(format!("uid {} may not control this server\n", c.uid())),
        Err(e) => Err(format!("cannot tell who is asking: {e}\n")),
    };
    let _ = tokio::time::timeout(READ_TIMEOUT, async {
        let _ = stream.write_all(encode(&reply).as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

async fn read_and_run(
    stream: &mut tokio::net::UnixStream,
    requests: &mpsc::Sender<Request>,
) -> Reply {
    let mut line = String::new();
    let mut reader = BufReader::new(stream).take(MAX_LINE as u64);
    match tokio::time::timeout(READ_TIMEOUT, reader.read_line(&mut line)).await {
        Err(_) => return Err("no command within 5 s\n".into()),
        Ok(Err(e)) => return Err(format!("cannot read the command: {e}\n")),
        Ok(Ok(_)) if !line.ends_with('\n') => {
            return Err(format!(
                "a command is one line of at most {MAX_LINE} bytes\n"
            ))
        }
        Ok(Ok(_)) => {}
    }
    let Some(command) = Command::parse(&line) else {
        let known: Vec<_> = Command::ALL.iter().map(|c| c.name()).collect();
        return Err(format!(
            "unknown command {:?}; known: {}\n",
            line.trim(),
            known.join(", ")
        ));
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    if requests.send(Request { command, reply }).is_err() {
        return Err("the server is stopping\n".into());
    }
    answer
        .await
        .unwrap_or_else(|_| Err("the server is stopping\n".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_survive_the_wire() {
        for reply in [
            Ok(String::new()),
            Ok("reloaded\n".to_string()),
            Err("server.listen cannot change".to_string()),
        ] {
            let trimmed = |r: &Reply| match r {
                Ok(t) => Ok(t.trim_end().to_string()),
                Err(t) => Err(t.trim_end().to_string()),
            };
            assert_eq!(trimmed(&decode(&encode(&reply))), trimmed(&reply));
        }
        assert!(decode("HTTP/1.1 200 OK\r\n").is_err());
    }

    #[test]
    fn commands_are_words() {
        assert_eq!(Command::parse("reload\n"), Some(Command::Reload));
        assert_eq!(Command::parse(" counters \r\n"), Some(Command::Counters));
        assert_eq!(Command::parse("Reload\n"), None);
        assert_eq!(Command::parse("reload now\n"), None);
    }
}
