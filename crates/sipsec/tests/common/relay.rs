//! A TCP relay that can be cut and restored: a database outage without touching the
//! database.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A TCP relay to `to` that can be cut (every connection closed, new ones refused) and
/// restored: a database outage without touching the database.
pub(crate) struct Relay {
    pub port: u16,
    /// Cleared to cut the relay, set to restore it.
    pub up: Arc<AtomicBool>,
}

impl Relay {
    /// A relay to a network database's URL (PostgreSQL or MariaDB), and the URL that goes
    /// through it.
    pub(crate) fn for_database(url: &str) -> (Relay, String) {
        let default_port = if url.starts_with("postgres") {
            5432
        } else {
            3306
        };
        let (scheme, rest) = url.split_once("://").unwrap();
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, host) = authority.rsplit_once('@').unwrap_or(("", authority));
        let to = if host.contains(':') {
            host.to_string()
        } else {
            format!("{host}:{default_port}")
        };
        let relay = Relay::start(to);
        let at = if userinfo.is_empty() {
            String::new()
        } else {
            format!("{userinfo}@")
        };
        let relayed = format!("{scheme}://{at}127.0.0.1:{}/{path}", relay.port);
        (relay, relayed)
    }

    pub(crate) fn start(to: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let flag = up.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !flag.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let Ok(server) = TcpStream::connect(&to) else {
                    continue;
                };
                for (mut from, mut into) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let flag = flag.clone();
                    std::thread::spawn(move || {
                        let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
                        let mut buf = [0u8; 16384];
                        loop {
                            if !flag.load(Ordering::SeqCst) {
                                let _ = from.shutdown(std::net::Shutdown::Both);
                                let _ = into.shutdown(std::net::Shutdown::Both);
                                return;
                            }
                            match from.read(&mut buf) {
                                Ok(0) => {
                                    let _ = into.shutdown(std::net::Shutdown::Write);
                                    return;
                                }
                                Ok(n) => {
                                    if into.write_all(&buf[..n]).is_err() {
                                        return;
                                    }
                                }
                                Err(e)
                                    if e.kind() == std::io::ErrorKind::WouldBlock
                                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                                Err(_) => return,
                            }
                        }
                    });
                }
            }
        });
        Relay { port, up }
    }
}
