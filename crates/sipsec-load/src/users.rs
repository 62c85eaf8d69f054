//! The load generator's users: a CSV of `username,password[,domain]` lines that supplies the
//! From and To users of calls and the credentials for digest challenges.

use anyhow::{bail, Context, Result};
use std::path::Path;

/// One user of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user part of the From/To URIs and the digest username.
    pub username: String,
    /// The digest password.
    pub password: String,
    /// Overrides the run's domain for this user.
    pub domain: Option<String>,
}

/// The users of a run, in file order.
#[derive(Debug, Clone, Default)]
pub struct Users(Vec<User>);

impl Users {
    /// The given users, in their order.
    pub fn new(users: Vec<User>) -> Users {
        Users(users)
    }

    /// The `i`-th user, counting from 0.
    pub fn get(&self, i: usize) -> Option<&User> {
        self.0.get(i)
    }

    /// How many users there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Reads and parses the file at `path` (see [`Users::parse`]).
    pub fn load(path: &Path) -> Result<Users> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read users file {}", path.display()))?;
        Users::parse(&text).with_context(|| format!("in users file {}", path.display()))
    }

    /// Parses CSV text. Blank lines and `#` comments are skipped; a header line
    /// `username,password[,domain]` is allowed.
    pub fn parse(text: &str) -> Result<Users> {
        let mut users = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if users.is_empty() && fields.first() == Some(&"username") {
                continue;
            }
            let n = i + 1;
            let (username, password, domain) = match fields.as_slice() {
                [u, p] => (*u, *p, None),
                [u, p, d] => (*u, *p, Some(*d)),
                _ => bail!(
                    "line {n}: expected username,password[,domain], got {} fields",
                    fields.len()
                ),
            };
            if username.is_empty() {
                bail!("line {n}: empty username");
            }
            if !username
                .bytes()
                .all(|b| sip_core::message::scan::is_unreserved(b) || b"&=+$;?/".contains(&b))
            {
                bail!("line {n}: username {username:?} has characters a SIP URI user cannot carry");
            }
            if domain.is_some_and(|d| !sip_core::message::uri::valid_host(d.as_bytes())) {
                bail!(
                    "line {n}: {:?} is not a valid host",
                    domain.unwrap_or_default()
                );
            }
            users.push(User {
                username: username.to_string(),
                password: password.to_string(),
                domain: domain.map(str::to_string),
            });
        }
        if users.is_empty() {
            bail!("no users");
        }
        Ok(Users(users))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_users_with_and_without_domain() {
        let u =
            Users::parse("username,password,domain\n# x\nalice,secret\n\nbob, pw ,example.com\n")
                .unwrap();
        assert_eq!(u.len(), 2);
        assert_eq!(u.get(0).unwrap().username, "alice");
        assert_eq!(u.get(1).unwrap().password, "pw");
        assert_eq!(u.get(1).unwrap().domain.as_deref(), Some("example.com"));
    }

    #[test]
    fn bad_lines_name_their_line() {
        let e = Users::parse("alice,secret\nbob\n").unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        let e = Users::parse("al ice,pw").unwrap_err().to_string();
        assert!(e.contains("cannot carry"), "{e}");
        let e = Users::parse("a,b,c,d").unwrap_err().to_string();
        assert!(e.contains("4 fields"), "{e}");
        assert!(Users::parse("\n# only comments\n").is_err());
        assert!(Users::parse("a,b,bad host").is_err());
    }
}
