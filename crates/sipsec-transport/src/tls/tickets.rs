//! The client side's store of sessions to resume: per server, the key-exchange hint, one
//! TLS 1.2 session and a pool of TLS 1.3 tickets deep enough for a connection per call.
//!
//! rustls's own `ClientSessionMemoryCache` keeps at most 8 TLS 1.3 tickets per server. A
//! ticket resumes one connection only (RFC 8446 §C.4) and each connection earns one back once
//! its handshake is done, so a client opening a connection per call needs as many tickets as
//! it has handshakes under way at once. At 500 calls/s a stall of a few tens of milliseconds
//! puts more than 8 in flight: the pool runs dry, those calls pay a full handshake, and the
//! tickets they earn beyond 8 are thrown away, so the next stall drains it again. Measured in
//! the proxy opening a TLS connection per call (seed 000's inbound mode), 5–16% of handshakes
//! were full with rustls's store. This one keeps up to [`TICKETS_PER_SERVER`]; a pool only
//! grows by full handshakes, so its depth follows the concurrency the client has needed.

use rustls::client::{ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::pki_types::ServerName;
use rustls::NamedGroup;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// TLS 1.3 tickets kept per server.
pub(crate) const TICKETS_PER_SERVER: usize = 128;

#[derive(Default)]
struct ServerData {
    kx_hint: Option<NamedGroup>,
    tls12: Option<Tls12ClientSessionValue>,
    /// Oldest first; the newest is used first, as rustls does.
    tls13: VecDeque<Tls13ClientSessionValue>,
}

#[derive(Default)]
struct Servers {
    by_name: HashMap<ServerName<'static>, ServerData>,
    /// Insertion order, to forget the oldest server when `max_servers` are known.
    order: VecDeque<ServerName<'static>>,
}

/// Sessions to resume for up to `max_servers` servers, the oldest forgotten first.
pub(crate) struct TicketStore {
    servers: Mutex<Servers>,
    max_servers: usize,
}

impl TicketStore {
    /// A store holding at most `tickets` TLS 1.3 tickets in all (at least one server's worth).
    pub(super) fn new(tickets: usize) -> Self {
        Self {
            servers: Mutex::new(Servers::default()),
            max_servers: tickets.div_ceil(TICKETS_PER_SERVER).max(1),
        }
    }

    /// Runs `edit` on `name`'s entry, adding one for a new server (and forgetting the oldest
    /// server when `max_servers` are known).
    fn edit(&self, name: ServerName<'static>, edit: impl FnOnce(&mut ServerData)) {
        let mut s = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        if !s.by_name.contains_key(&name) {
            if s.order.len() >= self.max_servers {
                if let Some(oldest) = s.order.pop_front() {
                    s.by_name.remove(&oldest);
                }
            }
            s.order.push_back(name.clone());
        }
        edit(s.by_name.entry(name).or_default());
    }

    /// Runs `f` on `name`'s entry if the server is known; adds nothing.
    fn with_known<T>(
        &self,
        name: &ServerName<'_>,
        f: impl FnOnce(&mut ServerData) -> T,
    ) -> Option<T> {
        // The map's keys are 'static and lookups cannot borrow a shorter name; the copy is a
        // few bytes once per handshake.
        let key = name.to_owned();
        let mut s = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        s.by_name.get_mut(&key).map(f)
    }
}

impl std::fmt::Debug for TicketStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketStore")
            .field("max_servers", &self.max_servers)
            .finish_non_exhaustive()
    }
}

impl ClientSessionStore for TicketStore {
    fn set_kx_hint(&self, name: ServerName<'static>, group: NamedGroup) {
        self.edit(name, |d| d.kx_hint = Some(group));
    }

    fn kx_hint(&self, name: &ServerName<'_>) -> Option<NamedGroup> {
        self.with_known(name, |d| d.kx_hint).flatten()
    }

    fn set_tls12_session(&self, name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.edit(name, |d| d.tls12 = Some(value));
    }

    fn tls12_session(&self, name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.with_known(name, |d| d.tls12.clone()).flatten()
    }

    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.with_known(name, |d| d.tls12 = None);
    }

    fn insert_tls13_ticket(&self, name: ServerName<'static>, value: Tls13ClientSessionValue) {
        self.edit(name, |d| {
            if d.tls13.len() >= TICKETS_PER_SERVER {
                d.tls13.pop_front();
            }
            d.tls13.push_back(value);
        });
    }

    fn take_tls13_ticket(&self, name: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        self.with_known(name, |d| d.tls13.pop_back()).flatten()
    }
}
