//! Transports and peers: the address type the engine sees. A [`Peer`] is a transport, a
//! remote address and, for streams, the connection a message came in on (so a response goes
//! back on it, RFC 3261 §18.2.2); the worker's driver maps peers to sockets and connections.

use sip_core::message::{Scheme, Uri, Via};
use std::net::{IpAddr, SocketAddr};

/// A SIP transport (RFC 3261 §18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Transport {
    /// SIP over UDP, port 5060 by default.
    Udp,
    /// SIP over TCP, port 5060 by default.
    Tcp,
    /// SIP over TLS on TCP, port 5061 by default (RFC 3261 §26.2.1).
    Tls,
    /// SIP over WebSocket (RFC 7118), port 80 by default: browsers' SIP. The server only
    /// accepts it — a browser opens the connection, and is reached over it.
    Ws,
    /// SIP over secure WebSocket (WebSocket on TLS), port 443 by default.
    Wss,
}

impl Transport {
    /// Streams need no retransmissions (RFC 3261 §17.1.1.2) and carry framing.
    pub fn reliable(self) -> bool {
        self != Transport::Udp
    }

    /// Carried in TLS (`tls`, `wss`).
    pub fn secure(self) -> bool {
        matches!(self, Transport::Tls | Transport::Wss)
    }

    /// Carried in WebSocket messages (`ws`, `wss`): the connection begins with an HTTP
    /// upgrade, and only a client (a browser) opens one.
    pub fn websocket(self) -> bool {
        matches!(self, Transport::Ws | Transport::Wss)
    }

    /// The token in a Via (`SIP/2.0/UDP`).
    pub fn via_token(self) -> &'static str {
        match self {
            Transport::Udp => "UDP",
            Transport::Tcp => "TCP",
            Transport::Tls => "TLS",
            Transport::Ws => "WS",
            Transport::Wss => "WSS",
        }
    }

    /// The lower-case name in configs and `transport=` URI parameters.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Ws => "ws",
            Transport::Wss => "wss",
        }
    }

    /// The `transport` parameter of a Contact URI we write, so a proxy reaches us over the
    /// same transport (it would default to UDP).
    pub fn uri_param(self) -> &'static str {
        match self {
            Transport::Udp => "",
            Transport::Tcp => ";transport=tcp",
            Transport::Tls => ";transport=tls",
            Transport::Ws => ";transport=ws",
            Transport::Wss => ";transport=wss",
        }
    }

    /// Every transport.
    pub const ALL: [Transport; 5] = [
        Transport::Udp,
        Transport::Tcp,
        Transport::Tls,
        Transport::Ws,
        Transport::Wss,
    ];

    /// The transport named `name` (`udp`, `tcp`, `tls`, `ws`, `wss`, case-insensitive), as in
    /// a Via or a `transport=` parameter.
    pub fn parse(name: &[u8]) -> Option<Transport> {
        Transport::ALL
            .into_iter()
            .find(|t| t.name().as_bytes().eq_ignore_ascii_case(name))
    }

    /// The port when a URI or Via names none (RFC 3261 §19.1.2, §18.2.2; RFC 7118 §5).
    pub fn default_port(self) -> u16 {
        match self {
            Transport::Tls => 5061,
            Transport::Ws => 80,
            Transport::Wss => 443,
            _ => 5060,
        }
    }

    /// The transport a URI asks for without DNS: its `transport` parameter, else TLS for
    /// `sips:`, else UDP (a name's NAPTR/SRV choice is `dns`'s). `sips:` with
    /// `transport=ws` is secure WebSocket (RFC 7118 §5.2).
    pub(crate) fn of_uri(uri: &Uri<'_>) -> Option<Transport> {
        match uri.param(b"transport").flatten() {
            Some(t) => match Transport::parse(t)? {
                Transport::Ws if uri.scheme == Scheme::Sips => Some(Transport::Wss),
                t => Some(t),
            },
            None if uri.scheme == Scheme::Sips => Some(Transport::Tls),
            None => Some(Transport::Udp),
        }
    }

    /// The transport a Via names.
    pub fn of_via(via: &Via<'_>) -> Option<Transport> {
        Transport::parse(via.transport)
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The local end of a message: for streams a connection, by the worker that owns it and its
/// slot there; for UDP the listening socket, by its index among the UDP listen addresses, plus
/// one. 0 is "none": the driver finds (or opens) a connection, or picks a UDP socket of the
/// destination's address family.
pub type ConnId = u32;

/// Where a message came from or goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer {
    /// The transport the message travels on.
    pub transport: Transport,
    /// The remote address.
    pub addr: SocketAddr,
    /// Streams: the connection to use while it is still open. UDP: the socket a request came
    /// in on, so its responses leave from the address it was sent to (RFC 3581 §4). See
    /// [`ConnId`].
    pub conn: ConnId,
    /// A flow (RFC 5626; a phone behind a NAT, or one that accepts no connections): requests
    /// go over `conn` only, and fail at once when it is gone, instead of a new connection
    /// being opened to `addr` (which the phone's NAT or firewall refuses).
    pub flow: bool,
}

impl Peer {
    /// A UDP peer reached through our UDP socket number `socket`.
    pub fn udp_via(addr: SocketAddr, socket: usize) -> Peer {
        Peer {
            transport: Transport::Udp,
            addr,
            conn: socket as ConnId + 1,
            flow: false,
        }
    }

    /// For UDP, the index of the socket to send from, if one is set.
    pub fn udp_socket(&self) -> Option<usize> {
        (self.transport == Transport::Udp && self.conn != 0).then(|| self.conn as usize - 1)
    }

    /// Whether `conn` names a stream connection.
    pub fn stream_conn(&self) -> Option<ConnId> {
        (self.transport.reliable() && self.conn != 0).then_some(self.conn)
    }

    /// A UDP peer; the driver picks the socket to send from.
    pub fn udp(addr: SocketAddr) -> Peer {
        Peer {
            transport: Transport::Udp,
            addr,
            conn: 0,
            flow: false,
        }
    }

    /// A peer on `transport` with no connection chosen: the driver finds or opens one.
    pub fn new(transport: Transport, addr: SocketAddr) -> Peer {
        Peer {
            transport,
            addr,
            conn: 0,
            flow: false,
        }
    }

    /// `self` as a flow: requests to it go over its connection only (see [`Peer::flow`]).
    pub fn as_flow(self) -> Peer {
        Peer { flow: true, ..self }
    }

    /// Whether this is a stream flow whose connection is not known (a binding loaded from
    /// the database after a restart: the phone's connection died with the process).
    pub fn flow_lost(&self) -> bool {
        self.flow && self.transport.reliable() && self.conn == 0
    }

    /// `transport:ip:port`, the form stored in the database; a bare `ip:port` is UDP.
    pub fn parse(s: &str) -> Option<Peer> {
        if let Ok(addr) = s.parse() {
            return Some(Peer::udp(addr));
        }
        let (t, addr) = s.split_once(':')?;
        Some(Peer::new(
            Transport::parse(t.as_bytes())?,
            addr.parse().ok()?,
        ))
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.transport, self.addr)
    }
}

/// Resolves a SIP URI to a peer without DNS (IP literals and `localhost`): its `maddr` or
/// host, its port or the transport's default, its transport.
pub fn uri_peer(uri: &Uri<'_>) -> Option<Peer> {
    let transport = Transport::of_uri(uri)?;
    let host = uri.param(b"maddr").flatten().unwrap_or(uri.host);
    let host = sip_core::message::uri::unbracket(host);
    let ip: IpAddr = if host.eq_ignore_ascii_case(b"localhost") {
        IpAddr::from([127, 0, 0, 1])
    } else {
        std::str::from_utf8(host).ok()?.parse().ok()?
    };
    let port = uri.port.unwrap_or(transport.default_port());
    Some(Peer::new(transport, SocketAddr::new(ip, port)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sip_core::message::Uri;

    fn peer(uri: &str) -> Option<Peer> {
        uri_peer(&Uri::parse(uri.as_bytes()).unwrap())
    }

    #[test]
    fn uris_resolve_to_transport_and_address() {
        let p = |t, a: &str| Some(Peer::new(t, a.parse().unwrap()));
        assert_eq!(peer("sip:10.0.0.1"), p(Transport::Udp, "10.0.0.1:5060"));
        assert_eq!(
            peer("sip:u@10.0.0.1:5070;transport=TCP"),
            p(Transport::Tcp, "10.0.0.1:5070")
        );
        assert_eq!(peer("sips:u@10.0.0.1"), p(Transport::Tls, "10.0.0.1:5061"));
        assert_eq!(
            peer("sip:u@[::1]:5062;transport=tls"),
            p(Transport::Tls, "[::1]:5062")
        );
        assert_eq!(
            peer("sip:u@10.0.0.1;transport=ws"),
            p(Transport::Ws, "10.0.0.1:80")
        );
        assert_eq!(
            peer("sips:u@10.0.0.1:8443;transport=ws"),
            p(Transport::Wss, "10.0.0.1:8443")
        );
        assert_eq!(peer("sip:u@10.0.0.1;transport=sctp"), None);
        assert_eq!(peer("sip:u@example.com"), None);
    }

    #[test]
    fn peers_print_and_parse_back() {
        for s in [
            "udp:1.2.3.4:5060",
            "tcp:[::1]:5070",
            "tls:10.0.0.1:5061",
            "ws:10.0.0.1:80",
            "wss:10.0.0.1:443",
        ] {
            assert_eq!(Peer::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(
            Peer::parse("1.2.3.4:5060"),
            Some(Peer::udp("1.2.3.4:5060".parse().unwrap()))
        );
        assert_eq!(Peer::parse("sctp:1.2.3.4:5060"), None);
    }
}
