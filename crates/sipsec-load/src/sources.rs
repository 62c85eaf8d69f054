//! The caller's source addresses (`--source-addresses N`): which local address each call's
//! connection comes from. A connection per call binds a local port of its address, and the
//! port stays taken while the closed connection waits in TIME_WAIT (60 s on Linux), so one
//! address's ~28,000 ephemeral ports carry at most ~470 new connections a second for long;
//! N consecutive addresses carry N times that (on Linux, loopback answers for every address
//! of 127.0.0.0/8 without aliases). Call number n comes from the (n mod N)-th address after
//! the first, and its Via and Contact name that address, so the server sees each request's
//! sent-by where its connection comes from, as with a single address (no `received=`).

use anyhow::{bail, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The caller's `count` consecutive source addresses from `first` (its port is the one Via and
/// Contact name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sources {
    first: SocketAddr,
    count: u32,
}

impl Sources {
    /// `count` addresses from `first`: at least one, none past the end of the address space.
    pub fn new(first: SocketAddr, count: u32) -> Result<Sources> {
        if count == 0 {
            bail!("--source-addresses must be at least 1");
        }
        let last = u128::from(count - 1);
        let fits = match first.ip() {
            IpAddr::V4(ip) => u128::from(u32::from(ip)) + last <= u128::from(u32::MAX),
            IpAddr::V6(ip) => u128::from(ip).checked_add(last).is_some(),
        };
        if !fits {
            bail!(
                "--source-addresses {count} from {} runs past the last address",
                first.ip()
            );
        }
        Ok(Sources { first, count })
    }

    /// A single address.
    pub fn one(addr: SocketAddr) -> Sources {
        Sources {
            first: addr,
            count: 1,
        }
    }

    /// How many addresses.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The first address (a caller's own when it has only one).
    pub fn first(&self) -> SocketAddr {
        self.first
    }

    /// The address call number `call` comes from.
    pub fn of_call(&self, call: u64) -> SocketAddr {
        let k = call % u64::from(self.count);
        let ip = match self.first.ip() {
            // In range: `new` checked the last one.
            IpAddr::V4(ip) => IpAddr::from(Ipv4Addr::from((u64::from(u32::from(ip)) + k) as u32)),
            IpAddr::V6(ip) => IpAddr::from(Ipv6Addr::from(u128::from(ip) + u128::from(k))),
        };
        SocketAddr::new(ip, self.first.port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_go_round_the_addresses_and_the_range_must_fit() {
        let s = Sources::new("127.0.1.254:5060".parse().unwrap(), 4).unwrap();
        let of = |n| s.of_call(n).to_string();
        assert_eq!(
            [of(0), of(1), of(2), of(3), of(4)],
            [
                "127.0.1.254:5060",
                "127.0.1.255:5060",
                "127.0.2.0:5060",
                "127.0.2.1:5060",
                "127.0.1.254:5060"
            ]
        );
        assert_eq!(
            Sources::one("[::1]:5060".parse().unwrap()).of_call(9),
            "[::1]:5060".parse().unwrap()
        );
        assert!(Sources::new("255.255.255.254:1".parse().unwrap(), 2).is_ok());
        assert!(Sources::new("255.255.255.254:1".parse().unwrap(), 3).is_err());
        assert!(Sources::new("127.0.0.1:1".parse().unwrap(), 0).is_err());
    }
}
