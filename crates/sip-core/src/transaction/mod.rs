//! The RFC 3261 §17 transaction layer: client and server, INVITE and non-INVITE, with the
//! "Accepted" states of RFC 6026 so that 2xx retransmissions and their ACKs pass end to end.
//!
//! Sans-IO: the table is handed messages and "now", and appends [`Output`]s (bytes to send,
//! timeouts, terminations) for the caller to perform. Every timer (A–M) sits on one
//! [`TimerWheel`], so a busy table costs O(1) per event however many transactions it holds.
//! Transactions live in a slab addressed by [`TxId`] (index plus generation, so a stale id
//! finds nothing), and each carries a user value `U` that the transaction user (a proxy, a
//! UA) links to its own state; `U` comes back in [`Output::Terminated`].
//!
//! Matching follows §17.1.3 and §17.2.3: by branch (with the magic cookie) plus sent-by and
//! method for server transactions, ACK matching the INVITE; by branch plus CSeq method for
//! client transactions; requests with RFC 2543 branches match on Call-ID, CSeq, From tag and
//! top Via.

#[cfg(test)]
mod tests;

use crate::message::{build, Message, Method};
use crate::timer::{Millis, TimerHandle, TimerWheel};
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Timer base values (RFC 3261 §17.1.1.1).
#[derive(Debug, Clone, Copy)]
pub struct Timers {
    /// T1, the round-trip time estimate in ms (RFC 3261 §17.1.1.1; default 500): the first
    /// retransmission interval over UDP and the base of timers B, F, H and J (64·T1).
    pub t1: Millis,
    /// T2, the longest retransmission interval in ms for non-INVITE requests and INVITE responses
    /// (default 4000).
    pub t2: Millis,
    pub(crate) t4: Millis,
    /// Timer C (RFC 3261 §16.6 step 11): how long a client INVITE transaction may stay in
    /// Proceeding without a final response; reset by every provisional. Without it a UAS that
    /// rings forever would hold a proxy's transactions forever.
    pub c: Millis,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            t1: 500,
            t2: 4_000,
            t4: 5_000,
            c: 180_000,
        }
    }
}

/// A transaction handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TxId {
    index: u32,
    generation: u32,
}

/// Which of the four machines a transaction runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A client INVITE transaction (RFC 3261 §17.1.1).
    ClientInvite,
    /// A client non-INVITE transaction (RFC 3261 §17.1.2).
    ClientNonInvite,
    /// A server INVITE transaction (RFC 3261 §17.2.1).
    ServerInvite,
    /// A server non-INVITE transaction (RFC 3261 §17.2.2).
    ServerNonInvite,
}

/// Transaction states across the four machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Client INVITE: the request is sent, no response yet.
    Calling,
    /// Non-INVITE: the request is sent (client) or received (server), no provisional response yet.
    Trying,
    /// A provisional response has been received (client) or sent (server).
    Proceeding,
    /// INVITE: a 2xx has been received (client) or sent (server); its retransmissions and ACKs pass
    /// end to end (RFC 6026).
    Accepted,
    /// A final non-2xx response has been received or sent; waiting out retransmissions.
    Completed,
    /// Server INVITE: the ACK for its non-2xx final response arrived (timer I running).
    Confirmed,
    /// The machine has ended; the table removes a transaction as it gets here, so a live one never
    /// reports it.
    Terminated,
}

/// What the caller must do.
#[derive(Debug)]
pub enum Output<A, U> {
    /// Send these bytes to `dest`.
    Transmit {
        /// Where to send: the transaction's peer.
        dest: A,
        /// The message: a request, a retransmission, an ACK or a response.
        data: Bytes,
    },
    /// Timer B, C, F or H fired: the transaction failed and is gone (the TU answers 408 for a
    /// client transaction, and CANCELs a client INVITE that timed out in `Proceeding`, i.e.
    /// on timer C). Carries the state it was in, where it sent, the user value, and the
    /// request a client transaction sent (the last response for a server transaction).
    Timeout {
        /// The transaction that failed (already gone).
        id: TxId,
        /// Which machine it ran.
        kind: Kind,
        /// The state it timed out in.
        state: State,
        /// The peer it sent to.
        dest: A,
        /// Its user value.
        user: U,
        /// The request a client transaction sent, or the last response of a server one.
        message: Bytes,
    },
    /// The transaction is gone; its user value is handed back.
    Terminated {
        /// The transaction that ended (already gone).
        id: TxId,
        /// Its user value.
        user: U,
    },
}

/// How an incoming request related to existing transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestMatch {
    /// No transaction: the TU decides (and calls [`Transactions::create_server`]).
    New,
    /// A retransmission, answered from the transaction's state.
    Retransmission(TxId),
    /// The ACK for a non-2xx final response, absorbed (RFC 3261 §17.2.1).
    AckAbsorbed(TxId),
    /// An ACK for a 2xx or matching nothing: end to end, the TU forwards it.
    Ack,
}

/// How an incoming response related to client transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseMatch {
    /// Pass to the TU.
    Deliver(TxId),
    /// A retransmission handled here (ACK re-sent, or dropped).
    Absorbed,
    /// No matching client transaction (a stray, or a 2xx retransmission after the
    /// transaction ended); a stateful proxy forwards it statelessly (RFC 3261 §16.7).
    Unmatched,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerKind {
    /// A, E or G: retransmit.
    Retransmit,
    /// B, F or H: the transaction failed.
    Timeout,
    /// D, I, J, K, L or M: linger for retransmissions, then end.
    Linger,
}

struct Tx<A, U> {
    kind: Kind,
    state: State,
    generation: u32,
    key: Arc<[u8]>,
    dest: A,
    reliable: bool,
    /// Client: the request (for retransmission, ACK and CANCEL). Server: the last response.
    message: Bytes,
    /// Client INVITE: the ACK sent for a non-2xx final response.
    ack: Option<Bytes>,
    retransmit_timer: Option<TimerHandle>,
    timeout_timer: Option<TimerHandle>,
    interval: Millis,
    user: Option<U>,
    /// In a state that only waits (timers D, I, J, K, L, M) to absorb or pass retransmissions.
    lingering: bool,
    /// A client transaction whose Timer B or F was brought forward
    /// ([`Transactions::expect_response_within`]).
    hurried: bool,
}

impl<A, U> Tx<A, U> {
    /// A new transaction of `kind`, in the state its machine starts in (RFC 3261 §17: a client
    /// INVITE Calling, a server INVITE Proceeding, a non-INVITE Trying on either side), with
    /// no timer armed yet, `interval` its first retransmission interval and `user` its user
    /// value.
    fn new(
        kind: Kind,
        key: Arc<[u8]>,
        dest: A,
        reliable: bool,
        message: Bytes,
        interval: Millis,
        user: U,
    ) -> Tx<A, U> {
        let state = match kind {
            Kind::ClientInvite => State::Calling,
            Kind::ServerInvite => State::Proceeding,
            Kind::ClientNonInvite | Kind::ServerNonInvite => State::Trying,
        };
        Tx {
            kind,
            state,
            generation: 0,
            key,
            dest,
            reliable,
            message,
            ack: None,
            retransmit_timer: None,
            timeout_timer: None,
            interval,
            user: Some(user),
            lingering: false,
            hurried: false,
        }
    }
}

/// A table of transactions with their timers.
pub struct Transactions<A, U> {
    timers: Timers,
    slab: Vec<Option<Tx<A, U>>>,
    generations: Vec<u32>,
    free: Vec<u32>,
    server_keys: KeyMap,
    client_keys: KeyMap,
    wheel: TimerWheel<(TxId, TimerKind)>,
    key_scratch: Vec<u8>,
    fired: Vec<(TxId, TimerKind)>,
    /// Transactions that began lingering, oldest first (stale ids are skipped when popped):
    /// the ones to end early when the table is full, see [`Transactions::evict_lingering`].
    linger_order: VecDeque<TxId>,
    lingering: usize,
}

/// Transactions by key. Keys carry bytes a peer chose (its branch), so the hasher is seeded
/// at random per process, as the standard one is; foldhash rather than SipHash because a
/// proxy looks up or inserts about four keys per call, and SipHash was 6% of the engine's
/// instructions. What foldhash gives up is resistance to an attacker who studies the process
/// long enough to recover its seed (foldhash's own caveat); collisions then cost lookups,
/// not correctness, and the table's size is capped (`max_transactions`).
type KeyMap = HashMap<Arc<[u8]>, TxId, foldhash::fast::RandomState>;

/// Writes the server-transaction key of a request into `out` (ACK maps to INVITE).
pub(crate) fn server_key(msg: &Message<'_>, out: &mut Vec<u8>) {
    out.clear();
    let via = msg.top_via();
    let method = match msg.method() {
        Method::Ack => b"INVITE" as &[u8],
        _ => msg.method_raw(),
    };
    if via.is_rfc3261() {
        out.extend_from_slice(via.branch.unwrap_or_default());
        out.push(0);
        out.extend_from_slice(via.host);
        out.push(0);
        build::push_int(out, via.port.unwrap_or(0));
    } else {
        out.extend_from_slice(b"2543\0");
        out.extend_from_slice(msg.call_id());
        out.push(0);
        build::push_int(out, msg.cseq().seq);
        out.push(0);
        if let Ok(from) = msg.from() {
            out.extend_from_slice(from.tag().unwrap_or_default());
        }
        out.push(0);
        out.extend_from_slice(&msg.as_bytes()[via.start..via.end]);
    }
    out.push(0);
    out.extend_from_slice(method);
}

/// Writes the client-transaction key for a branch and method.
pub(crate) fn client_key(branch: &[u8], method: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(branch);
    out.push(0);
    out.extend_from_slice(method);
}

impl<A: Copy, U> Transactions<A, U> {
    /// An empty table whose timer wheel starts at `now` (ms).
    pub fn new(now: Millis, timers: Timers) -> Self {
        Transactions {
            timers,
            slab: Vec::new(),
            generations: Vec::new(),
            free: Vec::new(),
            server_keys: KeyMap::default(),
            client_keys: KeyMap::default(),
            wheel: TimerWheel::new(now),
            key_scratch: Vec::with_capacity(128),
            fired: Vec::new(),
            linger_order: VecDeque::new(),
            lingering: 0,
        }
    }

    /// Live transactions.
    pub fn len(&self) -> usize {
        self.server_keys.len() + self.client_keys.len()
    }

    /// Whether no transaction is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Transactions that are done and only wait out their linger timer. Over UDP each call
    /// through a stateful proxy leaves about four of them for up to 32 s (64·T1), so at
    /// thousands of calls a second they outnumber the live ones many times over.
    pub fn lingering(&self) -> usize {
        self.lingering
    }

    /// Ends the transaction that has lingered longest, as if its timer had fired, so a full
    /// table makes room for new work instead of refusing it. The cost is only that a very
    /// late retransmission meets no transaction (a 2xx is then forwarded statelessly, a
    /// request handled as new). Returns false when nothing lingers.
    pub fn evict_lingering(&mut self, out: &mut Vec<Output<A, U>>) -> bool {
        while let Some(id) = self.linger_order.pop_front() {
            if self.get(id).is_some_and(|t| t.lingering) {
                if let Some(user) = self.terminate(id) {
                    out.push(Output::Terminated { id, user });
                }
                return true;
            }
        }
        false
    }

    /// The timer base values the table runs with.
    pub fn timers(&self) -> Timers {
        self.timers
    }

    fn get(&self, id: TxId) -> Option<&Tx<A, U>> {
        self.slab
            .get(id.index as usize)?
            .as_ref()
            .filter(|t| t.generation == id.generation)
    }

    fn get_mut(&mut self, id: TxId) -> Option<&mut Tx<A, U>> {
        self.slab
            .get_mut(id.index as usize)?
            .as_mut()
            .filter(|t| t.generation == id.generation)
    }

    /// The state of transaction `id`; `None` once it is gone.
    pub fn state(&self, id: TxId) -> Option<State> {
        self.get(id).map(|t| t.state)
    }

    /// Which machine transaction `id` runs; `None` once it is gone.
    pub fn kind(&self, id: TxId) -> Option<Kind> {
        self.get(id).map(|t| t.kind)
    }

    /// The user value of transaction `id`; `None` once it is gone.
    pub fn user(&self, id: TxId) -> Option<&U> {
        self.get(id)?.user.as_ref()
    }

    /// The user value of transaction `id`, to update; `None` once it is gone.
    pub fn user_mut(&mut self, id: TxId) -> Option<&mut U> {
        self.get_mut(id)?.user.as_mut()
    }

    /// The request a client transaction sent.
    pub fn request(&self, id: TxId) -> Option<&Bytes> {
        self.get(id)
            .filter(|t| matches!(t.kind, Kind::ClientInvite | Kind::ClientNonInvite))
            .map(|t| &t.message)
    }

    /// Where a transaction sends (client) or answers (server).
    pub fn dest(&self, id: TxId) -> Option<A> {
        self.get(id).map(|t| t.dest)
    }

    /// The earliest time `advance` has work.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.wheel.next_deadline()
    }

    /// Finds the server transaction a request belongs to, if any.
    pub(crate) fn find_server(&mut self, msg: &Message<'_>) -> Option<TxId> {
        server_key(msg, &mut self.key_scratch);
        self.server_keys.get(self.key_scratch.as_slice()).copied()
    }

    /// Finds the INVITE server transaction a CANCEL targets (same key, method INVITE).
    pub fn find_cancelled(&mut self, cancel: &Message<'_>) -> Option<TxId> {
        server_key(cancel, &mut self.key_scratch);
        let cut = self.key_scratch.len() - cancel.method_raw().len();
        self.key_scratch.truncate(cut);
        self.key_scratch.extend_from_slice(b"INVITE");
        self.server_keys.get(self.key_scratch.as_slice()).copied()
    }

    /// Matches an incoming request against server transactions, absorbing retransmissions
    /// and non-2xx ACKs.
    pub fn recv_request(
        &mut self,
        now: Millis,
        msg: &Message<'_>,
        out: &mut Vec<Output<A, U>>,
    ) -> RequestMatch {
        let Some(id) = self.find_server(msg) else {
            return if msg.method() == Method::Ack {
                RequestMatch::Ack
            } else {
                RequestMatch::New
            };
        };
        let t4 = self.timers.t4;
        let tx = self.get_mut(id).expect("keyed transactions exist");
        if msg.method() == Method::Ack {
            return match tx.state {
                State::Completed => {
                    tx.state = State::Confirmed;
                    let (r, t) = (tx.retransmit_timer.take(), tx.timeout_timer.take());
                    let reliable = tx.reliable;
                    self.cancel_timers(r, t);
                    // Timer I: absorb ACK retransmissions for T4 on unreliable transports.
                    self.arm(id, now + if reliable { 0 } else { t4 }, TimerKind::Linger);
                    RequestMatch::AckAbsorbed(id)
                }
                State::Confirmed => RequestMatch::AckAbsorbed(id),
                _ => RequestMatch::Ack,
            };
        }
        match (tx.kind, tx.state) {
            (Kind::ServerInvite, State::Proceeding | State::Completed)
            | (Kind::ServerNonInvite, State::Proceeding | State::Completed)
                if !tx.message.is_empty() =>
            {
                out.push(Output::Transmit {
                    dest: tx.dest,
                    data: tx.message.clone(),
                });
            }
            _ => {}
        }
        RequestMatch::Retransmission(id)
    }

    fn alloc(&mut self, tx: Tx<A, U>) -> TxId {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slab.push(None);
                self.generations.push(0);
                (self.slab.len() - 1) as u32
            }
        };
        let generation = self.generations[index as usize];
        let mut tx = tx;
        tx.generation = generation;
        self.slab[index as usize] = Some(tx);
        TxId { index, generation }
    }

    fn arm(&mut self, id: TxId, at: Millis, kind: TimerKind) {
        let handle = self.wheel.insert(at, (id, kind));
        let Some(tx) = self.get_mut(id) else { return };
        match kind {
            TimerKind::Retransmit => tx.retransmit_timer = Some(handle),
            TimerKind::Timeout => tx.timeout_timer = Some(handle),
            TimerKind::Linger => {
                tx.timeout_timer = Some(handle);
                if !tx.lingering {
                    tx.lingering = true;
                    self.lingering += 1;
                    self.linger_order.push_back(id);
                    // Ids whose transactions ended on their own timers leave from the front,
                    // so the queue holds about one linger period's worth, not all history.
                    while let Some(&front) = self.linger_order.front() {
                        if self.get(front).is_some_and(|t| t.lingering) {
                            break;
                        }
                        self.linger_order.pop_front();
                    }
                }
            }
        }
    }

    fn cancel_timers(&mut self, a: Option<TimerHandle>, b: Option<TimerHandle>) {
        for h in [a, b].into_iter().flatten() {
            self.wheel.cancel(h);
        }
    }

    /// Creates a server transaction for a request that matched nothing. `dest` is where
    /// responses go (RFC 3261 §18.2.2, worked out by the caller).
    pub fn create_server(&mut self, msg: &Message<'_>, dest: A, reliable: bool, user: U) -> TxId {
        server_key(msg, &mut self.key_scratch);
        let key: Arc<[u8]> = self.key_scratch.as_slice().into();
        let kind = if msg.method() == Method::Invite {
            Kind::ServerInvite
        } else {
            Kind::ServerNonInvite
        };
        let t1 = self.timers.t1;
        let id = self.alloc(Tx::new(
            kind,
            key.clone(),
            dest,
            reliable,
            Bytes::new(),
            t1,
            user,
        ));
        if let Some(old) = self.server_keys.insert(key, id) {
            // Same key as a live transaction: the newer wins; the old one ends quietly.
            if let Some(slot) = self.slab.get_mut(old.index as usize) {
                if let Some(tx) = slot.as_mut() {
                    tx.key = Arc::from(&[][..]);
                }
            }
        }
        id
    }

    /// Sends a response through a server transaction. Returns false if the transaction is
    /// gone or already answered finally (a late response is then the caller's to drop).
    pub fn respond(
        &mut self,
        now: Millis,
        id: TxId,
        code: u16,
        data: Bytes,
        out: &mut Vec<Output<A, U>>,
    ) -> bool {
        let t1 = self.timers.t1;
        let Some(tx) = self.get_mut(id) else {
            return false;
        };
        let dest = tx.dest;
        let reliable = tx.reliable;
        let accepted_again = tx.kind == Kind::ServerInvite
            && tx.state == State::Accepted
            && (200..300).contains(&code);
        if !accepted_again && !matches!(tx.state, State::Trying | State::Proceeding) {
            return false;
        }
        out.push(Output::Transmit {
            dest,
            data: data.clone(),
        });
        if accepted_again {
            return true;
        }
        tx.message = data;
        match (tx.kind, code) {
            (_, 100..=199) => {
                tx.state = State::Proceeding;
            }
            (Kind::ServerInvite, 200..=299) => {
                tx.state = State::Accepted;
                tx.message = Bytes::new();
                // Timer L: stay to pass 2xx retransmissions and absorb request retransmissions.
                self.arm(id, now + 64 * t1, TimerKind::Linger);
            }
            (Kind::ServerInvite, _) => {
                tx.state = State::Completed;
                tx.interval = t1;
                if !reliable {
                    self.arm(id, now + t1, TimerKind::Retransmit); // G
                }
                self.arm(id, now + 64 * t1, TimerKind::Timeout); // H
            }
            (_, _) => {
                tx.state = State::Completed;
                self.arm(
                    id,
                    now + if reliable { 0 } else { 64 * t1 },
                    TimerKind::Linger,
                ); // J
            }
        }
        true
    }

    /// Starts a client transaction and sends `request` to `dest`. `branch` and `method` are
    /// the request's top Via branch and CSeq method (they key the transaction).
    #[allow(
        clippy::too_many_arguments,
        reason = "the hot path passes what it already holds, borrowed; a struct would be built per request"
    )]
    pub fn create_client(
        &mut self,
        now: Millis,
        request: Bytes,
        branch: &[u8],
        method: &[u8],
        dest: A,
        reliable: bool,
        user: U,
        out: &mut Vec<Output<A, U>>,
    ) -> TxId {
        client_key(branch, method, &mut self.key_scratch);
        let key: Arc<[u8]> = self.key_scratch.as_slice().into();
        let invite = method == b"INVITE";
        let t1 = self.timers.t1;
        out.push(Output::Transmit {
            dest,
            data: request.clone(),
        });
        let kind = if invite {
            Kind::ClientInvite
        } else {
            Kind::ClientNonInvite
        };
        let id = self.alloc(Tx::new(
            kind,
            key.clone(),
            dest,
            reliable,
            request,
            t1,
            user,
        ));
        self.client_keys.insert(key, id);
        if !reliable {
            self.arm(id, now + t1, TimerKind::Retransmit); // A or E
        }
        self.arm(id, now + 64 * t1, TimerKind::Timeout); // B or F
        id
    }

    /// Brings a client transaction's Timer B or F forward to `now + within` while nothing has
    /// answered it: a proxy with another target to try (RFC 3263 §4.3) need not wait 32 s to
    /// learn that this one is dead. The first provisional response gives the transaction its
    /// usual timers back (Timer C for INVITE, a full Timer F otherwise).
    pub fn expect_response_within(&mut self, now: Millis, id: TxId, within: Millis) {
        let Some(tx) = self.get_mut(id) else { return };
        if !matches!(tx.state, State::Calling | State::Trying)
            || !matches!(tx.kind, Kind::ClientInvite | Kind::ClientNonInvite)
        {
            return;
        }
        tx.hurried = true;
        let t = tx.timeout_timer.take();
        self.cancel_timers(None, t);
        self.arm(id, now + within, TimerKind::Timeout);
    }

    /// Matches a response to a client transaction and advances it.
    pub fn recv_response(
        &mut self,
        now: Millis,
        msg: &Message<'_>,
        out: &mut Vec<Output<A, U>>,
    ) -> ResponseMatch {
        let Some(branch) = msg.top_via().branch else {
            return ResponseMatch::Unmatched;
        };
        client_key(branch, msg.cseq().method, &mut self.key_scratch);
        let Some(&id) = self.client_keys.get(self.key_scratch.as_slice()) else {
            return ResponseMatch::Unmatched;
        };
        let code = msg.status().unwrap_or(0);
        let (t1, t4) = (self.timers.t1, self.timers.t4);
        let tx = self.get_mut(id).expect("keyed transactions exist");
        let reliable = tx.reliable;
        match (tx.kind, tx.state, code) {
            (Kind::ClientInvite, State::Calling | State::Proceeding, 100..=199) => {
                tx.state = State::Proceeding;
                let (r, t) = (tx.retransmit_timer.take(), tx.timeout_timer.take());
                self.cancel_timers(r, t);
                let c = self.timers.c;
                self.arm(id, now + c, TimerKind::Timeout); // C replaces B, reset per provisional
                ResponseMatch::Deliver(id)
            }
            (Kind::ClientInvite, State::Calling | State::Proceeding, 200..=299) => {
                tx.state = State::Accepted;
                let (r, t) = (tx.retransmit_timer.take(), tx.timeout_timer.take());
                self.cancel_timers(r, t);
                self.arm(id, now + 64 * t1, TimerKind::Linger); // M
                ResponseMatch::Deliver(id)
            }
            (Kind::ClientInvite, State::Accepted, 200..=299) => ResponseMatch::Deliver(id),
            (Kind::ClientInvite, State::Calling | State::Proceeding, _) => {
                let invite = tx.message.clone();
                let mut ack = Vec::with_capacity(invite.len() / 2);
                if let Ok(inv) = Message::parse(&invite) {
                    build::ack_for_non2xx(&inv, msg, &mut ack);
                }
                let ack = Bytes::from(ack);
                let tx = self.get_mut(id).expect("still there");
                tx.state = State::Completed;
                tx.ack = Some(ack.clone());
                out.push(Output::Transmit {
                    dest: tx.dest,
                    data: ack,
                });
                let (r, t) = (tx.retransmit_timer.take(), tx.timeout_timer.take());
                self.cancel_timers(r, t);
                self.arm(
                    id,
                    now + if reliable { 0 } else { 32_000 },
                    TimerKind::Linger,
                ); // D
                ResponseMatch::Deliver(id)
            }
            (Kind::ClientInvite, State::Completed, 300..=699) => {
                if let Some(ack) = tx.ack.clone() {
                    out.push(Output::Transmit {
                        dest: tx.dest,
                        data: ack,
                    });
                }
                ResponseMatch::Absorbed
            }
            (Kind::ClientNonInvite, State::Trying | State::Proceeding, 100..=199) => {
                if tx.state == State::Trying {
                    tx.state = State::Proceeding;
                }
                if std::mem::take(&mut tx.hurried) {
                    // The peer answered: the request gets its full Timer F again.
                    let t = tx.timeout_timer.take();
                    self.cancel_timers(None, t);
                    self.arm(id, now + 64 * t1, TimerKind::Timeout);
                }
                ResponseMatch::Deliver(id)
            }
            (Kind::ClientNonInvite, State::Trying | State::Proceeding, _) => {
                tx.state = State::Completed;
                let (r, t) = (tx.retransmit_timer.take(), tx.timeout_timer.take());
                self.cancel_timers(r, t);
                self.arm(id, now + if reliable { 0 } else { t4 }, TimerKind::Linger); // K
                ResponseMatch::Deliver(id)
            }
            _ => ResponseMatch::Absorbed,
        }
    }

    /// Ends a transaction now (e.g. the TU gives up on it), handing back its user value.
    pub fn terminate(&mut self, id: TxId) -> Option<U> {
        let tx = self
            .slab
            .get_mut(id.index as usize)?
            .take_if(|t| t.generation == id.generation)?;
        self.generations[id.index as usize] = id.generation.wrapping_add(1);
        self.free.push(id.index);
        if tx.lingering {
            self.lingering -= 1;
        }
        let map = match tx.kind {
            Kind::ClientInvite | Kind::ClientNonInvite => &mut self.client_keys,
            Kind::ServerInvite | Kind::ServerNonInvite => &mut self.server_keys,
        };
        if map.get(&tx.key) == Some(&id) {
            map.remove(&tx.key);
        }
        self.cancel_timers(tx.retransmit_timer, tx.timeout_timer);
        tx.user
    }

    /// Fires every timer due at `now`.
    pub fn advance(&mut self, now: Millis, out: &mut Vec<Output<A, U>>) {
        let mut fired = std::mem::take(&mut self.fired);
        self.wheel.advance(now, &mut fired);
        let t2 = self.timers.t2;
        for (id, kind) in fired.drain(..) {
            let Some(tx) = self.get_mut(id) else { continue };
            match kind {
                TimerKind::Retransmit => {
                    tx.retransmit_timer = None;
                    let resend = match (tx.kind, tx.state) {
                        (Kind::ClientInvite, State::Calling) => Some(tx.interval * 2),
                        (Kind::ClientNonInvite, State::Trying) => Some((tx.interval * 2).min(t2)),
                        (Kind::ClientNonInvite, State::Proceeding) => Some(t2),
                        (Kind::ServerInvite, State::Completed) => Some((tx.interval * 2).min(t2)),
                        _ => None,
                    };
                    if let Some(next) = resend {
                        out.push(Output::Transmit {
                            dest: tx.dest,
                            data: tx.message.clone(),
                        });
                        tx.interval = next;
                        self.arm(id, now + next, TimerKind::Retransmit);
                    }
                }
                TimerKind::Timeout => {
                    let (kind, state, dest) = (tx.kind, tx.state, tx.dest);
                    let message = tx.message.clone();
                    tx.timeout_timer = None;
                    if let Some(user) = self.terminate(id) {
                        out.push(Output::Timeout {
                            id,
                            kind,
                            state,
                            dest,
                            user,
                            message,
                        });
                    }
                }
                TimerKind::Linger => {
                    tx.timeout_timer = None;
                    if let Some(user) = self.terminate(id) {
                        out.push(Output::Terminated { id, user });
                    }
                }
            }
        }
        self.fired = fired;
    }
}
