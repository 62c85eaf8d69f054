//! Locating SIP servers by name (RFC 3263): what a next hop's URI asks DNS, what DNS answered,
//! and the order to try the answer's targets in.
//!
//! Split the way the rest of the server is: [`Query`], [`Resolution`] and [`Resolution::order`]
//! are plain data and arithmetic the engine uses on its message path (a cached answer costs a
//! hash lookup and a few comparisons), and `resolver` is the asynchronous half that asks DNS
//! (with `hickory-resolver`, whose cache honours TTLs) off the workers' threads.
//!
//! The RFC 3263 rules, by what the URI says ([`Query`]):
//! - an IP address: no DNS at all (the engine never makes a query for one);
//! - a port: A/AAAA at that port, over the `transport` parameter, else UDP (TLS for `sips:`);
//! - a `transport` but no port: SRV for that transport, else A/AAAA at its default port;
//! - neither: NAPTR for the services we speak (`SIPS+D2T` only for `sips:`), then SRV for
//!   each transport when there is no NAPTR, then A/AAAA over UDP (TLS for `sips:`).
//!
//! Ordering is ours, not the resolver's (it returns records as the server sent them): NAPTR
//! order and preference first, then SRV priority, then within one priority RFC 2782's weighted
//! random choice, drawn afresh for every request so the load spreads by the weights.

pub(crate) mod resolver;

use sip_core::message::{Scheme, Uri};
use sipsec_transport::net::transport::{Peer, Transport};
use smallvec::SmallVec;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};

/// What one next hop asks DNS: a host name and what its URI fixed of the transport and port.
/// Names compare and hash without regard to ASCII case.
#[derive(Debug, Clone, Eq)]
pub struct Query {
    /// The host name, lower case, no trailing dot.
    pub name: Box<str>,
    /// The URI's `transport` parameter.
    pub transport: Option<Transport>,
    /// The URI's port.
    pub port: Option<u16>,
    /// A `sips:` URI: TLS only, and the certificate must name the domain (RFC 5922).
    pub secure: bool,
}

impl Query {
    /// A query for `name`, lower-cased and without a trailing dot.
    pub fn new(
        name: &[u8],
        transport: Option<Transport>,
        port: Option<u16>,
        secure: bool,
    ) -> Query {
        let name = String::from_utf8_lossy(name.strip_suffix(b".").unwrap_or(name))
            .to_ascii_lowercase()
            .into_boxed_str();
        Query {
            name,
            transport,
            port,
            secure,
        }
    }

    /// The same query, borrowed.
    pub(crate) fn as_key(&self) -> QueryKey<'_> {
        QueryKey {
            name: self.name.as_bytes(),
            transport: self.transport,
            port: self.port,
            secure: self.secure,
        }
    }
}

impl PartialEq for Query {
    fn eq(&self, other: &Query) -> bool {
        self.as_key() == other.as_key()
    }
}

impl Hash for Query {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_key().hash(state);
    }
}

impl std::fmt::Display for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.secure { "sips:" } else { "sip:" })?;
        f.write_str(&self.name)?;
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        if let Some(t) = self.transport {
            write!(f, ";transport={t}")?;
        }
        Ok(())
    }
}

/// A [`Query`] borrowed from a message being routed: the cache is probed with it, so a cached
/// name costs no allocation.
#[derive(Debug, Clone, Copy)]
pub struct QueryKey<'a> {
    /// The host name as written in the message (any case, a trailing dot allowed).
    pub name: &'a [u8],
    /// The URI's `transport` parameter.
    pub transport: Option<Transport>,
    /// The URI's port.
    pub port: Option<u16>,
    /// A `sips:` URI: TLS only, and the certificate must name the domain (RFC 5922).
    pub secure: bool,
}

impl QueryKey<'_> {
    pub(crate) fn to_query(self) -> Query {
        Query::new(self.name, self.transport, self.port, self.secure)
    }
}

impl PartialEq for QueryKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        let trim = |n: &[u8]| -> usize { n.len() - usize::from(n.ends_with(b".")) };
        self.transport == other.transport
            && self.port == other.port
            && self.secure == other.secure
            && self.name[..trim(self.name)].eq_ignore_ascii_case(&other.name[..trim(other.name)])
    }
}

impl Hash for QueryKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let name = self.name.strip_suffix(b".").unwrap_or(self.name);
        for b in name {
            state.write_u8(b.to_ascii_lowercase());
        }
        state.write_u8(0xff);
        self.transport.hash(state);
        self.port.hash(state);
        self.secure.hash(state);
    }
}

impl hashbrown::Equivalent<Query> for QueryKey<'_> {
    fn equivalent(&self, key: &Query) -> bool {
        *self == key.as_key()
    }
}

/// Where a URI sends, before DNS: an address already, or a name to resolve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Hop<'a> {
    /// An IP address (or `localhost`): no DNS needed.
    Addr(Peer),
    /// A name to locate by DNS (RFC 3263).
    Name(QueryKey<'a>),
}

/// The next hop a SIP URI names (its `maddr`, else its host): `None` for a transport we do
/// not know. IP addresses and `localhost` need no DNS.
pub fn hop<'a>(uri: &Uri<'a>) -> Option<Hop<'a>> {
    let transport = match uri.param(b"transport").flatten() {
        Some(t) => Some(Transport::parse(t)?),
        None => None,
    };
    if let Some(peer) = sipsec_transport::net::transport::uri_peer(uri) {
        return Some(Hop::Addr(peer));
    }
    let host = uri.param(b"maddr").flatten().unwrap_or(uri.host);
    Some(Hop::Name(QueryKey {
        name: sip_core::message::uri::unbracket(host),
        transport,
        port: uri.port,
        secure: uri.scheme == Scheme::Sips,
    }))
}

/// One SRV target (or the single A/AAAA target when there is no SRV): where to send and its
/// place in the order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Lower is tried first: NAPTR order and preference, then SRV priority.
    pub rank: u32,
    /// RFC 2782 weight among the entries of the same rank.
    pub weight: u16,
    /// The target's transport: from the NAPTR service, the SRV name, or the query.
    pub transport: Transport,
    /// The port: the SRV record's, the URI's, or the transport's default.
    pub port: u16,
    /// The target's addresses, IPv4 before IPv6.
    pub addrs: SmallVec<[IpAddr; 2]>,
}

impl Entry {
    /// Where this target is reached: each of its addresses at its port, over its transport.
    pub fn peers(&self) -> impl Iterator<Item = Peer> + '_ {
        self.addrs
            .iter()
            .map(|ip| Peer::new(self.transport, SocketAddr::new(*ip, self.port)))
    }
}

/// What DNS answered for a [`Query`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// In rank order; empty when the name has no usable records.
    pub entries: Vec<Entry>,
    /// How long the answer may be used, in seconds (the least TTL of the records it was made
    /// of; for an answer of no records, the negative TTL).
    pub ttl_s: u32,
    /// Why there are no entries, when there are none.
    pub error: Option<Failure>,
}

/// Why a name gave no targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// DNS answered: no such name, or no records of the kinds RFC 3263 asks for.
    NoRecords,
    /// DNS did not answer (timeout, refused, server failure): the name may be fine.
    Unavailable,
}

impl Resolution {
    /// An answer with no entries, failed for `error`, usable for `ttl_s` seconds.
    pub fn failed(error: Failure, ttl_s: u32) -> Resolution {
        Resolution {
            entries: Vec::new(),
            ttl_s,
            error: Some(error),
        }
    }

    /// The peers to try, in order, into `out`: ranks ascending, and within a rank RFC 2782's
    /// weighted random order (`random` gives a fresh 32-bit number each time it is called).
    pub fn order(&self, random: impl FnMut() -> u32, out: &mut SmallVec<[Peer; 2]>) {
        if let [only] = &self.entries[..] {
            return push_entry(only, out);
        }
        let e = &self.entries;
        weighted_order(
            e.len(),
            |i| e[i].rank,
            |i| e[i].weight,
            random,
            |i| push_entry(&e[i], out),
        );
    }
}

/// RFC 2782's order over `len` items: ascending rank; within one rank, a running sum of the
/// weights, a random number, the first item whose running sum passes it — repeated without
/// it. `visit` gets the items' indices in that order.
///
/// One departure from the RFC's letter: it draws from 0..=sum, which favours the first item
/// by one part in sum+1 (weights 3 and 1 share 80/20, not 75/25) so that zero weights get "a
/// very small chance"; we draw from 0..sum, which gives every item exactly its weight's share,
/// and zero weights come after the others of their rank.
pub(crate) fn weighted_order(
    len: usize,
    rank: impl Fn(usize) -> u32,
    weight: impl Fn(usize) -> u16,
    mut random: impl FnMut() -> u32,
    mut visit: impl FnMut(usize),
) {
    let mut all: SmallVec<[usize; 8]> = (0..len).collect();
    all.sort_by_key(|&i| rank(i));
    let mut start = 0;
    while start < all.len() {
        let r = rank(all[start]);
        let end = all[start..]
            .iter()
            .position(|&i| rank(i) != r)
            .map_or(all.len(), |n| start + n);
        let mut left: SmallVec<[usize; 8]> = all[start..end].iter().copied().collect();
        while !left.is_empty() {
            let total: u32 = left.iter().map(|&i| u32::from(weight(i))).sum();
            let pick = if left.len() == 1 || total == 0 {
                0
            } else {
                let target = random() % total;
                let mut sum = 0;
                left.iter()
                    .position(|&i| {
                        sum += u32::from(weight(i));
                        sum > target
                    })
                    .unwrap_or(0)
            };
            visit(left.remove(pick));
        }
        start = end;
    }
}

fn push_entry(e: &Entry, out: &mut SmallVec<[Peer; 2]>) {
    out.extend(e.peers());
}

/// The NAPTR service field for a transport (RFC 3263 §4.1).
pub(crate) fn naptr_service(transport: Transport) -> &'static [u8] {
    match transport {
        Transport::Udp => b"SIP+D2U",
        Transport::Tcp => b"SIP+D2T",
        Transport::Tls => b"SIPS+D2T",
        // RFC 7118 §7: named, though no lookup asks for them (a WebSocket is never opened).
        Transport::Ws => b"SIP+D2W",
        Transport::Wss => b"SIPS+D2W",
    }
}

/// The SRV owner name prefix for a transport (RFC 3263 §4.1).
pub(crate) fn srv_prefix(transport: Transport) -> &'static str {
    match transport {
        Transport::Udp => "_sip._udp.",
        Transport::Tcp => "_sip._tcp.",
        Transport::Tls => "_sips._tcp.",
        Transport::Ws => "_sip._ws.",
        Transport::Wss => "_sips._ws.",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(rank: u32, weight: u16, last_octet: u8) -> Entry {
        Entry {
            rank,
            weight,
            transport: Transport::Udp,
            port: 5060,
            addrs: smallvec::smallvec![IpAddr::from([10, 0, 0, last_octet])],
        }
    }

    fn first_octets(r: &Resolution, random: impl FnMut() -> u32) -> Vec<u8> {
        let mut out = SmallVec::new();
        r.order(random, &mut out);
        out.iter()
            .map(|p| match p.addr.ip() {
                IpAddr::V4(ip) => ip.octets()[3],
                IpAddr::V6(_) => 0,
            })
            .collect()
    }

    #[test]
    fn queries_match_whatever_the_case_and_trailing_dot() {
        use std::hash::BuildHasher;
        let q = Query::new(b"Carrier.Example.NET.", None, Some(5060), false);
        assert_eq!(&*q.name, "carrier.example.net");
        let k = QueryKey {
            name: b"carrier.EXAMPLE.net",
            transport: None,
            port: Some(5060),
            secure: false,
        };
        let s = hashbrown::DefaultHashBuilder::default();
        assert_eq!(s.hash_one(k), s.hash_one(&q));
        assert!(hashbrown::Equivalent::equivalent(&k, &q));
        let other = QueryKey { port: None, ..k };
        assert!(!hashbrown::Equivalent::equivalent(&other, &q));
        assert_eq!(q.to_string(), "sip:carrier.example.net:5060");
    }

    #[test]
    fn ranks_come_in_order_and_weights_share_the_first_place() {
        let r = Resolution {
            entries: vec![
                entry(1, 60, 1),
                entry(1, 30, 2),
                entry(1, 10, 3),
                entry(2, 0, 9),
            ],
            ttl_s: 60,
            error: None,
        };
        let mut seed = 0x1234_5678u64;
        let mut random = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u32
        };
        let mut firsts = [0u32; 10];
        for _ in 0..10_000 {
            let order = first_octets(&r, &mut random);
            assert_eq!(order.len(), 4);
            assert_eq!(order[3], 9, "the lower priority comes last");
            let mut sorted = order[..3].to_vec();
            sorted.sort();
            assert_eq!(sorted, [1, 2, 3], "every target of the rank, once");
            firsts[order[0] as usize] += 1;
        }
        for (octet, weight) in [(1, 0.6), (2, 0.3), (3, 0.1)] {
            let share = f64::from(firsts[octet]) / 10_000.0;
            assert!(
                (share - weight).abs() < 0.02,
                "{octet}: {share} vs {weight}"
            );
        }
    }

    #[test]
    fn zero_weights_still_get_their_turn() {
        let r = Resolution {
            entries: vec![entry(0, 0, 1), entry(0, 0, 2)],
            ttl_s: 1,
            error: None,
        };
        let order = first_octets(&r, || 7);
        assert_eq!(order.len(), 2);
    }
}
