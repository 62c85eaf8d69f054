//! Backup credentials (seed 001 §6.3): long chains with no expiry, made by the authority for
//! one proxy ahead of an outage, kept at the proxy and read only when the authority cannot be
//! reached. The file is JSON lines: a header naming the proxy, then one credential per user,
//! in the channel's own credential record ([`wire::Credential`]).
//!
//! ```text
//! sipsec authd backup --proxy proxy-1 --length 1000 --out proxy-1.backup
//! ```

use super::wire::{self, Credential};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sip_core::proxychain::{Chain, Issued};
use std::collections::HashMap;
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    /// P: the chains are bound to it.
    proxy: String,
    made_unix_s: u64,
    users: usize,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    user: String,
    credential: Credential,
}

/// Writes a backup file for `proxy`: one chain per user with a key, made by `issue` (the
/// authority's, with fresh nonces). Returns how many users it holds.
pub fn write(
    path: &Path,
    proxy: &str,
    users: &[(String, [u8; 32])],
    issue: impl Fn(&[u8; 32]) -> Result<Issued>,
) -> Result<usize> {
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = BufWriter::new(file);
    let now = wire::unix_s();
    out.write_all(
        wire::line(&Header {
            proxy: proxy.to_string(),
            made_unix_s: now,
            users: users.len(),
        })
        .as_bytes(),
    )?;
    for (user, key) in users {
        let issued = issue(key)?;
        out.write_all(
            wire::line(&Line {
                user: user.clone(),
                credential: Credential::new(&issued, None),
            })
            .as_bytes(),
        )?;
    }
    out.flush()?;
    Ok(users.len())
}

/// Reads a backup file: the proxy it was made for, and a chain per user.
pub fn read(path: &Path) -> Result<(String, HashMap<Box<str>, Chain>)> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut lines = std::io::BufReader::new(file).lines();
    let header: Header = match lines.next() {
        Some(l) => wire::parse(&l?).context("the header line")?,
        None => bail!("{} is empty", path.display()),
    };
    let mut chains = HashMap::with_capacity(header.users);
    for (n, l) in lines.enumerate() {
        let l = l?;
        let line: Line = wire::parse(&l).with_context(|| format!("line {}", n + 2))?;
        let issued = line
            .credential
            .issued()
            .with_context(|| format!("line {}", n + 2))?;
        chains.insert(line.user.into_boxed_str(), Chain::from(issued));
    }
    Ok((header.proxy, chains))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sip_core::proxychain::{issue, user_key, ClientChain, HashKind};

    #[test]
    fn a_backup_file_round_trips_and_its_chains_authenticate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p1.backup");
        let alice = user_key("alice", "example.com", "pw");
        let users = vec![
            ("alice".to_string(), alice),
            ("bob".to_string(), user_key("bob", "example.com", "pw2")),
        ];
        assert_eq!(
            write(&path, "p1", &users, |key| Ok(issue(
                HashKind::Sha256,
                key,
                "p1",
                100,
                [1; 16],
                [2; 16]
            )))
            .unwrap(),
            2
        );
        let (proxy, mut chains) = read(&path).unwrap();
        assert_eq!(proxy, "p1");
        assert_eq!(chains.len(), 2);
        let chain = chains.get_mut("alice").unwrap();
        assert_eq!(chain.counter, 100);
        let ch = chain.challenge("p1", &[4; 16]);
        let (_, r) = ClientChain::answer(&alice, &ch, &[4; 16], "alice", b"a@x", b"b@x").unwrap();
        chain.verify(&r, b"a@x", b"b@x").unwrap();
        std::fs::write(
            &path,
            "{\"proxy\":\"p1\",\"made_unix_s\":0,\"users\":1}\nnot json\n",
        )
        .unwrap();
        assert!(read(&path).is_err());
    }
}
