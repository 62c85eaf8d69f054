//! The channel between proxies and `sipsec authd`: one JSON object per line, over a TLS
//! connection on which both sides present certificates. Requests carry an id and answers name
//! it, so a proxy keeps many requests in flight on one connection (pipelining) and matches
//! answers as they come; the authority also pushes revocations unasked. JSON because the
//! messages are small and rare (one per user per chain), and a person debugging the channel
//! can read it; the bytes it costs per call are measured in the lab.
//!
//! The same credential record is the line format of backup-credential files.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sip_core::hex;
use sip_core::proxychain::{self, HashKind, Issued, Nonce, Token, NONCE_LEN};

/// Longest line either side accepts: a credential is ~400 bytes.
pub(crate) const MAX_LINE: usize = 4096;

/// Proxy → authority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// A credential (a new chain) for `user` at this proxy, of the proxy's configured length
    /// and hash (the authority may make it longer when busy; absent: its own defaults).
    Issue {
        /// Matches the answer to the request.
        id: u64,
        /// The user the chain is for.
        user: String,
        /// The chain length the proxy wants; absent: the authority's `chain_length`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        length: Option<u32>,
        /// The hash function, `MD5` or `SHA-256`; absent: the authority's `hash`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hash: Option<String>,
    },
}

/// Authority → proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// First line on a connection: the identifier P the authority knows this proxy by (from
    /// its certificate), which the chains it issues are bound to.
    Welcome {
        /// P, the proxy's identifier.
        proxy: String,
    },
    /// The credential asked for by request `id`.
    Issued {
        /// The request's `id`.
        id: u64,
        /// The user the chain is for.
        user: String,
        /// The chain, bound to this proxy.
        credential: Credential,
    },
    /// No such user, or a user with no Proxychain key (stored before schema 3).
    Unknown {
        /// The request's `id`.
        id: u64,
        /// The user asked for.
        user: String,
    },
    /// The authority cannot answer now (its user database is not loaded or is down).
    Unavailable {
        /// The request's `id`.
        id: u64,
        /// The user asked for.
        user: String,
    },
    /// Drop any chain held for `user`: the user's key changed or the user was removed.
    Revoke {
        /// The user whose chains are void.
        user: String,
    },
    /// The authority is closing this connection on purpose, and why (this proxy was revoked).
    Goodbye {
        /// Why, for the proxy's log.
        reason: String,
    },
}

/// A credential as it travels: the five-tuple, and when it expires (never, for backups).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// `MD5` or `SHA-256`.
    pub hash: String,
    /// H^l(tk_A), hex.
    pub anchor: String,
    /// l, the chain length.
    pub length: u32,
    /// n_DP, hex.
    pub n_dp: String,
    /// n_DA, hex.
    pub n_da: String,
    /// tk_P, the session key this proxy shares with the user, hex.
    pub tk_p: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires_unix_s: Option<u64>,
}

impl Credential {
    /// The wire form of `c`, expiring at `expires_unix_s` (Unix s; `None`: never, for backups).
    pub fn new(c: &Issued, expires_unix_s: Option<u64>) -> Credential {
        Credential {
            hash: c.hash.token().to_string(),
            anchor: c.anchor.hex(),
            length: c.length,
            n_dp: hex::encode(&c.n_dp),
            n_da: hex::encode(&c.n_da),
            tk_p: c.tk_p.hex(),
            expires_unix_s,
        }
    }

    /// Back to the five-tuple; an error names the bad field.
    pub fn issued(&self) -> Result<Issued> {
        let hash = HashKind::from_token(self.hash.as_bytes())
            .with_context(|| format!("unknown hash {:?}", self.hash))?;
        let token = |name: &str, v: &str| {
            Token::from_hex(hash, v.as_bytes()).with_context(|| format!("bad {name}"))
        };
        let nonce = |name: &str, v: &str| -> Result<Nonce> {
            let mut n = [0; NONCE_LEN];
            if !hex::decode(v.as_bytes(), &mut n) {
                bail!("bad {name}");
            }
            Ok(n)
        };
        if self.length == 0 || self.length > proxychain::MAX_COUNTER {
            bail!("chain length {} out of range", self.length);
        }
        Ok(Issued {
            hash,
            anchor: token("anchor", &self.anchor)?,
            length: self.length,
            n_dp: nonce("n_dp", &self.n_dp)?,
            n_da: nonce("n_da", &self.n_da)?,
            tk_p: token("tk_p", &self.tk_p)?,
        })
    }
}

/// One message as a line (with its newline).
pub fn line<T: Serialize>(msg: &T) -> String {
    let mut s = serde_json::to_string(msg).expect("wire messages serialise");
    s.push('\n');
    s
}

/// A line back into a message.
pub fn parse<'a, T: Deserialize<'a>>(line: &'a str) -> Result<T> {
    if line.len() > MAX_LINE {
        bail!("line of {} bytes is longer than {MAX_LINE}", line.len());
    }
    serde_json::from_str(line.trim_end()).context("malformed message")
}

/// Now in Unix seconds: the clock credential expiry (`expires_unix_s`), revocations and
/// backup files are stated in, on the authority and the proxy alike.
pub(crate) fn unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_ones_are_refused() {
        let issued = proxychain::issue(HashKind::Sha256, &[1; 32], "p1", 10, [2; 16], [3; 16]);
        let reply = Reply::Issued {
            id: 7,
            user: "alice".into(),
            credential: Credential::new(&issued, Some(99)),
        };
        let text = line(&reply);
        assert!(text.ends_with('\n') && !text[..text.len() - 1].contains('\n'));
        let back: Reply = parse(&text).unwrap();
        assert_eq!(back, reply);
        let Reply::Issued { credential, .. } = back else {
            unreachable!()
        };
        assert_eq!(credential.issued().unwrap(), issued);
        let req = Request::Issue {
            id: 1,
            user: "bob".into(),
            length: Some(20),
            hash: Some("MD5".into()),
        };
        assert_eq!(parse::<Request>(&line(&req)).unwrap(), req);
        for bad in [
            "",
            "{",
            r#"{"op":"issue","id":1}"#,
            r#"{"op":"launch","id":1,"user":"a"}"#,
            r#"{"op":"issue","id":-1,"user":"a"}"#,
            r#"{"op":"issue","id":1,"user":"a","extra":1}"#,
        ] {
            assert!(parse::<Request>(bad).is_err(), "{bad}");
        }
        let mut c = Credential::new(&issued, None);
        c.anchor = "00".into();
        assert!(c.issued().is_err());
        let mut c = Credential::new(&issued, None);
        c.length = 0;
        assert!(c.issued().is_err());
    }
}
