//! The names a server answers to, for "is this for us?" questions, and the host's own
//! addresses, which a listener on the unspecified address answers at.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The addresses of the host's interfaces (`getifaddrs`), loopback included; empty if they
/// cannot be read.
pub fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list that stays valid until
    // freeifaddrs; each `ifa_addr` is null or points at a sockaddr of the family it names.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut at = list;
        while let Some(ifa) = at.as_ref() {
            if let Some(sa) = ifa.ifa_addr.as_ref() {
                match i32::from(sa.sa_family) {
                    libc::AF_INET => {
                        let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            at = ifa.ifa_next;
        }
        libc::freeifaddrs(list);
    }
    out.sort();
    out.dedup();
    out
}

/// The names this server answers to: its domains and listen addresses. The engine's routing
/// ("is this for us?") and digest's `uri` check both ask it.
#[derive(Debug, Clone, Default)]
pub struct ServerNames {
    /// Lower case.
    pub domains: Vec<String>,
    /// The listen addresses (`listen` in the configuration).
    pub addrs: Vec<SocketAddr>,
}

impl ServerNames {
    /// Whether `uri`'s host (and port, if given) is this server: one of its domains, or one
    /// of its listen addresses.
    pub fn names(&self, uri: &sip_core::message::Uri<'_>) -> bool {
        let host = uri.host_unbracketed();
        let port = uri.port.unwrap_or(5060);
        (self.is_domain(host)
            && (uri.port.is_none() || self.addrs.iter().any(|a| a.port() == port)))
            || self.is_addr(host, port)
    }

    /// Whether `host` is one of our domains.
    pub fn is_domain(&self, host: &[u8]) -> bool {
        self.domains
            .iter()
            .any(|d| d.as_bytes().eq_ignore_ascii_case(host))
    }

    /// True when `host:port` is one of our listen addresses; `host` may be an IPv6 reference
    /// in brackets, as Via sent-by and URI hosts write it.
    pub fn is_addr(&self, host: &[u8], port: u16) -> bool {
        std::str::from_utf8(sip_core::message::uri::unbracket(host))
            .ok()
            .and_then(|h| h.parse::<IpAddr>().ok())
            .is_some_and(|ip| self.addrs.iter().any(|a| a.ip() == ip && a.port() == port))
    }
}
