//! The location service: address-of-record → current bindings, in memory.
//!
//! Each worker holds its own replica, so a lookup on the call path takes no lock shared with
//! other workers. A registration is applied by the worker that received it and then sent as a
//! [`BindingChange`] to every other worker (through their mailboxes, drained before each
//! receive batch, so a REGISTER's 200 OK never overtakes its binding) and to the write-behind
//! store. Expiry sits on a timing wheel: no sweep over all bindings, ever.

use sip_core::timer::{Millis, TimerHandle, TimerWheel};
use sipsec_transport::net::transport::Peer;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

/// One contact bound to an address-of-record. Its strings are shared (`Arc<str>`): a binding
/// is held by every worker's replica, the expiry wheel and the store's queue, and a clone is a
/// reference count, not a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The contact URI as registered.
    pub contact: Arc<str>,
    /// Where requests for this contact are sent: the Contact's address, or (a phone behind a
    /// NAT, an RFC 5626 flow) where the REGISTER came from; a [`Peer::flow`] goes over the
    /// registering connection only.
    pub target: Peer,
    /// Expiry, in Unix milliseconds.
    pub(crate) expires_at: u64,
    /// The `q` parameter as written, if any.
    pub q: Option<Arc<str>>,
    /// The Call-ID of the REGISTER that made or last refreshed it (RFC 3261 §10.3: a
    /// refresh from the same Call-ID must carry a higher CSeq).
    pub call_id: Arc<str>,
    /// That REGISTER's CSeq number.
    pub cseq: u32,
    /// Where the REGISTER came from: transport, address and port as seen (after any NAT),
    /// and the listener socket or connection it arrived on. For the per-source limit, and
    /// what the NAT keep-alives are sent to. `None` for a binding stored before this was
    /// kept.
    pub received: Option<Peer>,
    /// RFC 5626: the instance (`+sip.instance`) and `reg-id` of an outbound registration;
    /// bindings of one instance are its flows, tried one at a time.
    pub outbound: Option<Outbound>,
    /// RFC 3327: the Path the REGISTER brought (the header values as written, comma
    /// separated), the route set requests to this binding are sent along. For a binding
    /// another cluster node holds over its flow, that node's hop comes first.
    pub path: Option<Arc<str>>,
    /// In a cluster, the node holding the binding when it is another one (`None`: this node,
    /// or no cluster). Such bindings come from the shared table, never go back to it, and
    /// are not pinged here.
    pub node: Option<Arc<str>>,
    /// In a cluster, for a binding only its node can reach (over the registering
    /// connection, or through a NAT's mapping for that node's address): the Path entry the
    /// other nodes route through to reach it (that node, with the flow token). On another
    /// node's binding it is already at the head of `path`, and says the binding is
    /// unreachable while its node is down.
    pub via: Option<Arc<str>>,
}

/// The RFC 5626 identity of an outbound registration: one flow of one user agent instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbound {
    /// The `+sip.instance` Contact parameter as written (with its quotes and angle brackets).
    pub instance: Arc<str>,
    /// The `reg-id` Contact parameter.
    pub reg_id: u32,
}

impl Binding {
    /// The source address the binding counts against, for the per-source limit.
    fn source(&self) -> Option<IpAddr> {
        self.received.map(|p| p.addr.ip())
    }

    /// Whether this is the binding a registration of `contact` (with the RFC 5626 identity
    /// `outbound`, if any) refreshes or replaces: an outbound flow is one instance's reg-id
    /// (§6: two flows may register the same Contact URI), any other binding its Contact.
    pub fn is(&self, contact: &str, outbound: Option<&Outbound>) -> bool {
        match (&self.outbound, outbound) {
            (Some(mine), Some(theirs)) => mine == theirs,
            _ => *self.contact == *contact,
        }
    }
}

/// A change to the location service, applied by every replica and by the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingChange {
    /// Adds `binding` to `aor`, or replaces the one with the same contact.
    Upsert {
        /// The address-of-record.
        aor: Arc<str>,
        /// The binding as it now stands.
        binding: Binding,
    },
    /// Removes `contact` from `aor` (expired, or registered with `expires=0`): every
    /// binding with that Contact, outbound flows of it included.
    Remove {
        /// The address-of-record.
        aor: Arc<str>,
        /// The contact URI as registered.
        contact: Arc<str>,
    },
    /// Removes every binding of `aor` (`Contact: *` with `Expires: 0`).
    RemoveAll {
        /// The address-of-record.
        aor: Arc<str>,
    },
}

impl BindingChange {
    /// Whether the change is about the binding of `contact` with identity `outbound` (see
    /// [`Binding::is`]).
    pub(crate) fn is_about(&self, contact: &str, outbound: Option<&Outbound>) -> bool {
        match self {
            BindingChange::Upsert { binding, .. } => binding.is(contact, outbound),
            BindingChange::Remove { contact: c, .. } => **c == *contact,
            BindingChange::RemoveAll { .. } => false,
        }
    }

    /// What the change is about, for a log line: the AOR and contact, cut to 80 bytes each.
    pub(crate) fn describe(&self) -> String {
        let cut = |s: &str| match s.char_indices().nth(80) {
            Some((i, _)) => format!("{}…", &s[..i]),
            None => s.to_string(),
        };
        match self {
            BindingChange::Upsert { aor, binding } => {
                format!("{} -> {}", cut(aor), cut(&binding.contact))
            }
            BindingChange::Remove { aor, contact } => format!("{} -/-> {}", cut(aor), cut(contact)),
            BindingChange::RemoveAll { aor } => format!("{} (all)", cut(aor)),
        }
    }
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// Live bindings, best `q` first.
    Found(Vec<&'a Binding>),
    /// The AOR has registered before but has no live binding now (answered 404 like an
    /// unknown one, so probers cannot tell them apart).
    Unavailable,
    /// Never heard of it (404).
    Unknown,
}

/// One replica of the location service. Times are Unix milliseconds.
pub(crate) struct Location {
    aors: HashMap<Arc<str>, Vec<Bound>>,
    /// In a cluster, the other nodes held dead (silent past `dead_after_ms`): bindings only
    /// they reach are failed at once rather than sent into silence.
    nodes_down: Vec<Arc<str>>,
    /// Bindings held per source address (those with one), for the registrar's limit.
    per_source: HashMap<IpAddr, usize>,
    expiry: TimerWheel<(Arc<str>, Arc<str>)>,
    fired: Vec<(Arc<str>, Arc<str>)>,
}

/// A binding with its expiry timer, cancelled when the binding is refreshed or removed so
/// the wheel holds one timer per live binding, not one per REGISTER ever received.
struct Bound {
    binding: Binding,
    timer: TimerHandle,
}

fn q_value(b: &Binding) -> f32 {
    b.q.as_deref().and_then(|q| q.parse().ok()).unwrap_or(1.0)
}

impl Location {
    pub(crate) fn new(now_unix_ms: u64) -> Self {
        Location {
            aors: HashMap::new(),
            nodes_down: Vec::new(),
            per_source: HashMap::new(),
            expiry: TimerWheel::new(now_unix_ms),
            fired: Vec::new(),
        }
    }

    /// Marks an AOR as known without bindings (loaded from the store).
    pub(crate) fn know(&mut self, aor: &str) {
        self.aors.entry(aor.into()).or_default();
    }

    /// Applies a change made here or elsewhere.
    pub(crate) fn apply(&mut self, change: &BindingChange) {
        match change {
            BindingChange::Upsert { aor, binding } => {
                let timer = self
                    .expiry
                    .insert(binding.expires_at, (aor.clone(), binding.contact.clone()));
                let list = match self.aors.get_mut(aor) {
                    Some(list) => list,
                    None => self.aors.entry(aor.clone()).or_default(),
                };
                count(&mut self.per_source, binding.source(), true);
                let bound = Bound {
                    binding: binding.clone(),
                    timer,
                };
                match list
                    .iter_mut()
                    .find(|b| b.binding.is(&binding.contact, binding.outbound.as_ref()))
                {
                    Some(old) => {
                        self.expiry.cancel(old.timer);
                        count(&mut self.per_source, old.binding.source(), false);
                        *old = bound;
                    }
                    None => list.push(bound),
                }
            }
            BindingChange::Remove { aor, contact } => {
                if let Some(list) = self.aors.get_mut(aor) {
                    let (expiry, per_source) = (&mut self.expiry, &mut self.per_source);
                    unbind(expiry, per_source, list, |b| b.contact == *contact);
                }
            }
            BindingChange::RemoveAll { aor } => {
                if let Some(list) = self.aors.get_mut(aor) {
                    unbind(&mut self.expiry, &mut self.per_source, list, |_| true);
                }
            }
        }
    }

    /// Notes another cluster node going down (`alive` false) or coming back.
    pub(crate) fn node_state(&mut self, node: &Arc<str>, alive: bool) {
        self.nodes_down.retain(|n| n != node);
        if !alive {
            self.nodes_down.push(node.clone());
        }
    }

    /// Whether `b` is reached only through a cluster node that is down: its flow went with
    /// that node, and the phone must register again.
    pub(crate) fn through_node_down(&self, b: &Binding) -> bool {
        b.via.is_some() && b.node.as_ref().is_some_and(|n| self.nodes_down.contains(n))
    }

    /// Drops every binding another cluster node holds (before a resynchronisation reads
    /// them all again).
    pub(crate) fn forget_other_nodes(&mut self) {
        let (expiry, per_source) = (&mut self.expiry, &mut self.per_source);
        for list in self.aors.values_mut() {
            unbind(expiry, per_source, list, |b| b.node.is_some());
        }
    }

    /// The AOR's key as this replica holds it, to share rather than copy.
    pub(crate) fn aor(&self, aor: &str) -> Option<&Arc<str>> {
        self.aors.get_key_value(aor).map(|(k, _)| k)
    }

    /// Live bindings of an AOR.
    pub(crate) fn bindings(&self, aor: &str, now_unix_ms: u64) -> impl Iterator<Item = &Binding> {
        live(self.aors.get(aor), now_unix_ms)
    }

    pub(crate) fn lookup(&self, aor: &str, now_unix_ms: u64) -> Lookup<'_> {
        match self.aors.get(aor) {
            None => Lookup::Unknown,
            Some(list) => {
                let mut live: Vec<&Binding> = live(Some(list), now_unix_ms).collect();
                if live.is_empty() {
                    return Lookup::Unavailable;
                }
                live.sort_by(|a, b| q_value(b).total_cmp(&q_value(a)));
                Lookup::Found(live)
            }
        }
    }

    /// Drops bindings whose expiry passed (each was scheduled on the wheel when bound; a
    /// binding refreshed since is left alone).
    pub(crate) fn expire(&mut self, now_unix_ms: u64) {
        self.expiry.advance(now_unix_ms, &mut self.fired);
        for (aor, contact) in self.fired.drain(..) {
            if let Some(list) = self.aors.get_mut(&aor) {
                let per_source = &mut self.per_source;
                list.retain(|b| {
                    let gone = b.binding.contact == contact && b.binding.expires_at <= now_unix_ms;
                    if gone {
                        count(per_source, b.binding.source(), false);
                    }
                    !gone
                });
            }
        }
    }

    /// Bindings held (each has exactly one expiry timer; expired ones leave at the next
    /// `expire`).
    pub(crate) fn len(&self) -> usize {
        self.expiry.len()
    }

    /// Bindings held that were registered from `source`.
    pub(crate) fn held_from(&self, source: IpAddr) -> usize {
        self.per_source.get(&source).copied().unwrap_or(0)
    }

    /// The live bindings, at most `limit`, one a line: AOR, Contact, `expires=` seconds
    /// left, `target=` where requests go (`flow` when only over where it registered from),
    /// `received=` where it registered from, the outbound identity and Path if any, and
    /// `node=` the cluster node holding it when another.
    pub(crate) fn report(&self, now_unix_ms: u64, limit: usize) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let mut listed = 0;
        let mut aors: Vec<&Arc<str>> = self.aors.keys().collect();
        aors.sort_unstable();
        for aor in aors {
            for b in live(self.aors.get(aor), now_unix_ms) {
                if listed == limit {
                    let _ = writeln!(out, "# first {limit} bindings of {} listed", self.len());
                    return out;
                }
                listed += 1;
                let left = b.expires_at.saturating_sub(now_unix_ms).div_ceil(1000);
                let _ = write!(
                    out,
                    "{aor} <{}> expires={left} target={}",
                    b.contact, b.target
                );
                if b.target.flow {
                    out.push_str(";flow");
                }
                if let Some(r) = b.received {
                    let _ = write!(out, " received={r}");
                }
                if let Some(ob) = &b.outbound {
                    let _ = write!(out, " instance={} reg-id={}", ob.instance, ob.reg_id);
                }
                if let Some(path) = &b.path {
                    let _ = write!(out, " path={path}");
                }
                if let Some(node) = &b.node {
                    let _ = write!(out, " node={node}");
                }
                out.push('\n');
            }
        }
        out
    }

    /// When `expire` next has work.
    pub(crate) fn next_expiry(&self) -> Option<Millis> {
        self.expiry.next_deadline()
    }
}

/// Takes the bindings `gone` picks out of `list`, with their expiry timers and their counts
/// per source (a removal, made here or elsewhere).
fn unbind(
    expiry: &mut TimerWheel<(Arc<str>, Arc<str>)>,
    per_source: &mut HashMap<IpAddr, usize>,
    list: &mut Vec<Bound>,
    gone: impl Fn(&Binding) -> bool,
) {
    list.retain(|b| {
        let keep = !gone(&b.binding);
        if !keep {
            expiry.cancel(b.timer);
            count(per_source, b.binding.source(), false);
        }
        keep
    });
}

/// One more (`add`) or one fewer binding from `source`.
fn count(per_source: &mut HashMap<IpAddr, usize>, source: Option<IpAddr>, add: bool) {
    let Some(source) = source else { return };
    if add {
        *per_source.entry(source).or_default() += 1;
    } else if let Some(n) = per_source.get_mut(&source) {
        *n -= 1;
        if *n == 0 {
            per_source.remove(&source);
        }
    }
}

/// The bindings in `list` still live at `now_unix_ms`.
fn live(list: Option<&Vec<Bound>>, now_unix_ms: u64) -> impl Iterator<Item = &Binding> {
    list.into_iter()
        .flatten()
        .map(|b| &b.binding)
        .filter(move |b| b.expires_at > now_unix_ms)
}

/// A change shared between replicas without copying it per worker.
pub(crate) type SharedChange = Arc<BindingChange>;

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(contact: &str, expires_at: u64, q: Option<&str>) -> Binding {
        Binding {
            contact: contact.into(),
            target: Peer::udp("127.0.0.1:5070".parse().unwrap()),
            expires_at,
            q: q.map(Into::into),
            call_id: "c".into(),
            cseq: 1,
            received: None,
            outbound: None,
            path: None,
            node: None,
            via: None,
        }
    }

    #[test]
    fn lookup_orders_by_q_and_distinguishes_unknown_from_unavailable() {
        let mut loc = Location::new(0);
        assert_eq!(loc.lookup("a@x", 0), Lookup::Unknown);
        loc.apply(&BindingChange::Upsert {
            aor: "a@x".into(),
            binding: binding("sip:1@h", 10_000, Some("0.5")),
        });
        loc.apply(&BindingChange::Upsert {
            aor: "a@x".into(),
            binding: binding("sip:2@h", 10_000, None),
        });
        let Lookup::Found(found) = loc.lookup("a@x", 0) else {
            panic!()
        };
        assert_eq!(
            found.iter().map(|b| &*b.contact).collect::<Vec<_>>(),
            vec!["sip:2@h", "sip:1@h"]
        );
        loc.apply(&BindingChange::RemoveAll { aor: "a@x".into() });
        assert_eq!(loc.lookup("a@x", 0), Lookup::Unavailable);
    }

    #[test]
    fn expiry_removes_only_bindings_not_refreshed() {
        let mut loc = Location::new(0);
        loc.apply(&BindingChange::Upsert {
            aor: "a@x".into(),
            binding: binding("sip:1@h", 1_000, None),
        });
        loc.apply(&BindingChange::Upsert {
            aor: "a@x".into(),
            binding: binding("sip:2@h", 1_000, None),
        });
        loc.apply(&BindingChange::Upsert {
            aor: "a@x".into(),
            binding: binding("sip:2@h", 5_000, None),
        });
        loc.expire(1_000);
        assert_eq!(
            loc.bindings("a@x", 999).count(),
            1,
            "sip:1 expired, sip:2 refreshed"
        );
        loc.expire(5_000);
        assert_eq!(loc.lookup("a@x", 5_000), Lookup::Unavailable);
    }

    #[test]
    fn refreshes_and_removals_leave_no_stale_timers() {
        let mut loc = Location::new(0);
        for refresh in 1..=100 {
            loc.apply(&BindingChange::Upsert {
                aor: "a@x".into(),
                binding: binding("sip:1@h", refresh * 1_000, None),
            });
        }
        loc.apply(&BindingChange::Upsert {
            aor: "a@x".into(),
            binding: binding("sip:2@h", 500_000, None),
        });
        loc.apply(&BindingChange::Upsert {
            aor: "a@x".into(),
            binding: binding("sip:3@h", 500_000, None),
        });
        assert_eq!(loc.expiry.len(), 3, "one timer per live binding");
        loc.apply(&BindingChange::Remove {
            aor: "a@x".into(),
            contact: "sip:2@h".into(),
        });
        assert_eq!(loc.expiry.len(), 2);
        loc.apply(&BindingChange::RemoveAll { aor: "a@x".into() });
        assert!(loc.expiry.is_empty());
    }
}
