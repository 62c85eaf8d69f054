//! Where a verifier may fetch a signing certificate from: the first attack on a verifier is a
//! token whose `x5u` points inside the network (server-side request forgery), so a URL is
//! fetched only when it is `https:`, names a host the allow-list permits, and — once DNS has
//! answered — connects to an address that is public, or that the allow-list names itself.
//! Pure policy: the fetch itself (DNS, TCP, TLS, HTTP, its limits) is the server's.
//!
//! An allow-list entry is a host name (`cert.example.net`), a domain and its subdomains
//! (`*.example.net`), or an address (`127.0.0.1`, `[::1]`): addresses are allowed only
//! explicitly, never because a permitted name resolved to them (a name an attacker controls
//! can be pointed at `127.0.0.1` at any time).

use crate::error::CertError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Hosts and addresses `x5u` URLs may name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allow {
    /// Lower-case names; `*.` entries kept with their dot (`.example.net`).
    names: Vec<String>,
    addrs: Vec<IpAddr>,
}

/// A URL the allow-list permits, taken apart for the fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The host, lower case, without brackets.
    pub host: String,
    /// The port (443 unless given).
    pub port: u16,
    /// The path and query (at least `/`).
    pub path: String,
    /// The host, when it is an address.
    pub literal: Option<IpAddr>,
}

impl Target {
    /// `Host` as the request should carry it.
    pub fn authority(&self) -> String {
        let host = match self.literal {
            Some(IpAddr::V6(_)) => format!("[{}]", self.host),
            _ => self.host.clone(),
        };
        if self.port == 443 {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

fn refused(why: String) -> CertError {
    CertError::Fetch(why)
}

impl Allow {
    /// An allow-list from configuration entries; an error names an entry that is none of a
    /// host name, `*.domain` or an address.
    pub fn new(entries: &[String]) -> Result<Allow, String> {
        let mut allow = Allow::default();
        for e in entries {
            let bare = e.trim_start_matches('[').trim_end_matches(']');
            if let Ok(ip) = bare.parse::<IpAddr>() {
                allow.addrs.push(ip);
                continue;
            }
            let name = e.to_ascii_lowercase();
            let (wild, rest) = match name.strip_prefix("*.") {
                Some(rest) => (true, rest),
                None => (false, name.as_str()),
            };
            if !valid_name(rest) {
                return Err(format!(
                    "{e:?} is not a host name, *.domain or an IP address"
                ));
            }
            allow.names.push(if wild {
                format!(".{rest}")
            } else {
                rest.to_string()
            });
        }
        Ok(allow)
    }

    /// Whether nothing is allowed (every fetch refused).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.addrs.is_empty()
    }

    /// `url` taken apart, if it is an `https:` URL naming a permitted host.
    pub fn target(&self, url: &str) -> Result<Target, CertError> {
        let target = parse(url).ok_or_else(|| refused(format!("{url:?} is not an https URL")))?;
        let permitted = match target.literal {
            Some(ip) => self.addrs.contains(&ip),
            None => self.names.iter().any(|n| match n.strip_prefix('.') {
                Some(domain) => {
                    target.host.len() > n.len() && target.host.ends_with(n.as_str())
                        || target.host == domain
                }
                None => *n == target.host,
            }),
        };
        if !permitted {
            return Err(refused(format!(
                "{} is not in identity.fetch_allow",
                target.host
            )));
        }
        Ok(target)
    }

    /// Whether the fetch of `target` may connect to `ip`: an address the allow-list names,
    /// or a public one.
    pub fn address(&self, ip: IpAddr) -> bool {
        self.addrs.contains(&ip) || is_public(ip)
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// An `https:` URL's host, port and path; `None` for any other scheme, user information, a
/// bad host or port.
pub fn parse(url: &str) -> Option<Target> {
    let rest = url
        .get(..8)
        .filter(|s| s.eq_ignore_ascii_case("https://"))
        .map(|_| &url[8..])?;
    if rest.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.contains('@') || authority.is_empty() {
        return None;
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (h, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => 443,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0)?,
    };
    let literal = host.parse::<IpAddr>().ok();
    if literal.is_none() && !valid_name(&host.to_ascii_lowercase()) {
        return None;
    }
    let path = tail.split('#').next().unwrap_or("");
    let path = if path.is_empty() || path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    Some(Target {
        host: host.to_ascii_lowercase(),
        port,
        path,
        literal,
    })
}

/// Whether `ip` is an address on the public Internet: not loopback, private, link-local,
/// shared (CGNAT), benchmarking, documentation, multicast, broadcast, unspecified or reserved
/// (IPv4-mapped and -compatible IPv6 addresses judged as the IPv4 address they carry).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return public_v4(v4);
            }
            public_v6(v6)
        }
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240)
}

fn public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 site-local (deprecated),
        // 2001:db8::/32 documentation, 2001::/32 Teredo, 2002::/16 6to4 and 64:ff9b::/96,
        // 64:ff9b:1::/48 NAT64 (each can carry an IPv4 address a name could not),
        // ::/96 IPv4-compatible (deprecated).
        || (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        || (s[0] == 0x2001 && (s[1] == 0x0db8 || s[1] == 0))
        || s[0] == 0x2002
        || (s[0] == 0x0064 && s[1] == 0xff9b && (s[2] == 0x0001 || s[2..6].iter().all(|&x| x == 0)))
        || s[..6].iter().all(|&x| x == 0))
}

/// How long a response may be kept, from its `Cache-Control` (`max-age`, `s-maxage`, and
/// `no-store`/`no-cache` as 0); `None` when it says nothing about it.
pub fn max_age(cache_control: &str) -> Option<u64> {
    let mut age = None;
    for directive in cache_control.split(',') {
        let d = directive.trim().to_ascii_lowercase();
        if d == "no-store" || d == "no-cache" {
            return Some(0);
        }
        if let Some(v) = d
            .strip_prefix("s-maxage=")
            .or_else(|| d.strip_prefix("max-age="))
        {
            if let Ok(n) = v.trim_matches('"').parse::<u64>() {
                age = Some(age.map_or(n, |a: u64| a.min(n)));
            }
        }
    }
    age
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(entries: &[&str]) -> Allow {
        Allow::new(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn urls_come_apart() {
        let t = parse("HTTPS://Cert.Example.NET/shaken.pem?x=1#frag").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("cert.example.net", 443, "/shaken.pem?x=1")
        );
        let t = parse("https://[::1]:8443").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 8443, "/")
        );
        assert_eq!(t.authority(), "[::1]:8443");
        assert_eq!(t.literal, Some("::1".parse().unwrap()));
        for bad in [
            "http://cert.example.net/c.pem",
            "https://user@cert.example.net/c.pem",
            "https://cert.example.net:0/",
            "https://cert.example.net:99999/",
            "https:///c.pem",
            "https://cert example.net/",
            "https://bad_host.example/",
            "https://[::1/",
            "ftp://x/",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_listed_hosts_and_explicit_addresses_are_fetched() {
        let a = allow(&["cert.example.net", "*.sti.example", "127.0.0.1"]);
        assert!(a.target("https://cert.example.net/c.pem").is_ok());
        assert!(a.target("https://a.b.sti.example/c.pem").is_ok());
        assert!(a.target("https://sti.example/c.pem").is_ok());
        assert!(a.target("https://127.0.0.1:8443/c.pem").is_ok());
        for refused in [
            "https://evil.example/c.pem",
            "https://cert.example.net.evil.example/c.pem",
            "https://xsti.example/c.pem",
            "https://127.0.0.2/c.pem",
            "https://[::1]/c.pem",
            "https://localhost/c.pem",
        ] {
            assert!(
                matches!(a.target(refused), Err(CertError::Fetch(_))),
                "{refused}"
            );
        }
        assert!(Allow::new(&["bad host".into()]).is_err());
        assert!(Allow::default()
            .target("https://cert.example.net/")
            .is_err());
    }

    #[test]
    fn a_permitted_name_reaches_public_or_listed_addresses_only() {
        let a = allow(&["cert.example.net", "198.18.0.5"]);
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "2001:db8::1",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::1",
            "2001:0:4136:e378::1",
            "fec0::1",
        ] {
            assert!(!a.address(private.parse().unwrap()), "{private}");
        }
        for public in ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "198.18.0.5"] {
            assert!(a.address(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn cache_control_says_how_long() {
        assert_eq!(max_age("public, max-age=3600"), Some(3600));
        assert_eq!(max_age("max-age=3600, s-maxage=60"), Some(60));
        assert_eq!(max_age("no-store"), Some(0));
        assert_eq!(max_age("public"), None);
        assert_eq!(max_age("max-age=x"), None);
    }
}
