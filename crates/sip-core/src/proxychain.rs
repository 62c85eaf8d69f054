//! Proxychain (Dacosta and Traynor; seed 001 §3.3 and §4.2): hash-chain credentials issued by a
//! central authority, cached by proxies, and answered by clients — the arithmetic and the SIP
//! header syntax, shared by all three so they cannot disagree.
//!
//! The authority shares a key k_AD with each user. For a user A and a proxy P it issues the
//! five-tuple ([`Issued`]): the chain anchor H^l(tk_A) with tk_A = HMAC(k_AD, n_DA ‖ P), the
//! length l, the nonces n_DP and n_DA, and the session key tk_P = HMAC(k_AD, n_DP ‖ P). The
//! proxy keeps it as a [`Chain`]. To a request carrying the user's nonce n_AP it answers with a
//! [`Challenge`]: the counter i, P, both nonces and HMAC(tk_P, n_AP ‖ i), which only someone
//! knowing k_AD can make — the client checks it, and so authenticates the network. The client
//! answers with a [`Response`]: i, HMAC(tk_P, A ‖ B ‖ i) and H^(i-1)(tk_A); the proxy hashes
//! the last once, compares it with the H^i(tk_A) it holds, and steps down the chain. The proxy
//! never holds k_AD or tk_A, so its cache cannot be used to answer as the user.
//!
//! `docs/proxychain.md` is the full description, with test vectors made independently (Python's
//! `hashlib`) that the tests below check. Where the paper leaves an encoding open this module
//! fixes it: ‖ is the concatenation of each field preceded by its length as two big-endian
//! bytes, so no two different field lists concatenate alike; i is four big-endian bytes; A and
//! B are the `user@host` of the From and To URIs.
//!
//! Sans-IO: no clock, no randomness. Nonces come from the caller.

use crate::digest::{parse_scheme_params, DigestError, Quoted};
use crate::hex;
use crate::message::scan::eq_ic;
use hmac::{Hmac, Mac};
use md5::Md5;
use sha2::{Digest as _, Sha256};

/// Bytes in each nonce (n_AP, n_DA, n_DP).
pub const NONCE_LEN: usize = 16;

/// A nonce.
pub type Nonce = [u8; NONCE_LEN];

/// The hash function of a chain (and of its HMACs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashKind {
    /// The paper's choice, kept to compare with it.
    Md5,
    /// The default.
    Sha256,
}

impl HashKind {
    /// The token carried in `algorithm=`.
    pub fn token(self) -> &'static str {
        match self {
            HashKind::Md5 => "MD5",
            HashKind::Sha256 => "SHA-256",
        }
    }

    /// Parses an `algorithm=` token (case-insensitive).
    pub fn from_token(t: &[u8]) -> Option<HashKind> {
        [HashKind::Md5, HashKind::Sha256]
            .into_iter()
            .find(|h| eq_ic(h.token().as_bytes(), t))
    }

    /// Output bytes.
    pub fn output_len(self) -> usize {
        match self {
            HashKind::Md5 => 16,
            HashKind::Sha256 => 32,
        }
    }

    /// H(x).
    pub fn hash(self, x: &[u8]) -> Token {
        match self {
            HashKind::Md5 => Token::new(&Md5::digest(x)),
            HashKind::Sha256 => Token::new(&Sha256::digest(x)),
        }
    }

    /// H^n(x): `x` hashed `n` times (H^0(x) = x).
    pub fn hash_n(self, x: Token, n: u32) -> Token {
        (0..n).fold(x, |t, _| self.hash(t.as_bytes()))
    }

    /// HMAC(key, ‖ fields), with ‖ as the module doc defines it.
    pub fn hmac(self, key: &[u8], fields: &[&[u8]]) -> Token {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], fields: &[&[u8]]) -> Token {
            let mut m = <M as hmac::digest::KeyInit>::new_from_slice(key)
                .expect("HMAC takes keys of any length");
            for f in fields {
                // Fields are identities, nonces and counters; longer ones are refused by
                // the parsers long before they get here.
                let len = u16::try_from(f.len()).unwrap_or(u16::MAX);
                m.update(&len.to_be_bytes());
                m.update(&f[..usize::from(len)]);
            }
            Token::new(&m.finalize().into_bytes())
        }
        match self {
            HashKind::Md5 => run::<Hmac<Md5>>(key, fields),
            HashKind::Sha256 => run::<Hmac<Sha256>>(key, fields),
        }
    }
}

/// A hash or HMAC output (16 or 32 bytes), kept inline so a cached credential allocates
/// nothing for it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    len: u8,
    bytes: [u8; 32],
}

impl Token {
    /// A token of these bytes (at most 32; longer input is cut, which no hash here makes).
    pub fn new(b: &[u8]) -> Token {
        let len = b.len().min(32);
        let mut bytes = [0; 32];
        bytes[..len].copy_from_slice(&b[..len]);
        Token {
            len: len as u8,
            bytes,
        }
    }

    /// The hash bytes, 16 or 32 of them.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Lower-case hex.
    pub fn hex(&self) -> String {
        hex::encode(self.as_bytes())
    }

    /// Parses hex of exactly `kind`'s length.
    pub fn from_hex(kind: HashKind, text: &[u8]) -> Option<Token> {
        let mut b = [0u8; 32];
        let n = kind.output_len();
        (text.len() == 2 * n && hex::decode(text, &mut b[..n])).then(|| Token::new(&b[..n]))
    }

    /// Equality in time that does not depend on where the bytes differ.
    pub fn ct_eq(&self, other: &Token) -> bool {
        let diff = self
            .as_bytes()
            .iter()
            .zip(other.as_bytes())
            .fold(u8::from(self.len != other.len), |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

fn nonce_from_hex(text: &[u8]) -> Option<Nonce> {
    let mut n = [0; NONCE_LEN];
    hex::decode(text, &mut n).then_some(n)
}

/// k_AD, the key a user shares with the authority, from the user's password: HKDF-SHA256
/// (RFC 5869) with the salt `sipsec proxychain k_AD`, the password as input key material, and
/// `username@realm` as info; 32 bytes. Both the client (which knows the password) and the user
/// database (which stores only this) derive it the same way.
pub fn user_key(username: &str, realm: &str, password: &str) -> [u8; 32] {
    type H = Hmac<Sha256>;
    let mut extract = <H as Mac>::new_from_slice(b"sipsec proxychain k_AD").expect("any key");
    extract.update(password.as_bytes());
    let prk = extract.finalize().into_bytes();
    let mut expand = <H as Mac>::new_from_slice(&prk).expect("any key");
    expand.update(username.as_bytes());
    expand.update(b"@");
    expand.update(realm.as_bytes());
    expand.update(&[1]);
    expand.finalize().into_bytes().into()
}

/// tk_A = HMAC(k_AD, n_DA ‖ P): the root of the user's chain at proxy P.
pub fn chain_root(kind: HashKind, k_ad: &[u8], n_da: &Nonce, proxy: &str) -> Token {
    kind.hmac(k_ad, &[n_da, proxy.as_bytes()])
}

/// tk_P = HMAC(k_AD, n_DP ‖ P): the key the proxy and the user share for this chain.
pub(crate) fn session_key(kind: HashKind, k_ad: &[u8], n_dp: &Nonce, proxy: &str) -> Token {
    kind.hmac(k_ad, &[n_dp, proxy.as_bytes()])
}

/// The five-tuple the authority issues to a proxy (message 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The hash function of the chain and its HMACs.
    pub hash: HashKind,
    /// H^l(tk_A).
    pub anchor: Token,
    /// l.
    pub length: u32,
    /// n_DP: the authority's nonce for the proxy, from which tk_P is derived.
    pub n_dp: Nonce,
    /// n_DA: the authority's nonce for the user, from which tk_A is derived.
    pub n_da: Nonce,
    /// tk_P.
    pub tk_p: Token,
}

/// The authority's side: the credential for `proxy` from the user's key and fresh nonces.
/// Cost: l + 4 hash compressions or so; the paper's Table 2 measured it.
pub fn issue(
    kind: HashKind,
    k_ad: &[u8],
    proxy: &str,
    length: u32,
    n_da: Nonce,
    n_dp: Nonce,
) -> Issued {
    let root = chain_root(kind, k_ad, &n_da, proxy);
    Issued {
        hash: kind,
        anchor: kind.hash_n(root, length),
        length,
        n_dp,
        n_da,
        tk_p: session_key(kind, k_ad, &n_dp, proxy),
    }
}

/// HMAC(tk_P, n_AP ‖ i): the network's proof in a challenge.
pub(crate) fn network_proof(kind: HashKind, tk_p: &Token, n_ap: &Nonce, i: u32) -> Token {
    kind.hmac(tk_p.as_bytes(), &[n_ap, &i.to_be_bytes()])
}

/// HMAC(tk_P, A ‖ B ‖ i): binds a response to the caller, the callee and the counter.
pub(crate) fn request_proof(kind: HashKind, tk_p: &Token, from: &[u8], to: &[u8], i: u32) -> Token {
    kind.hmac(tk_p.as_bytes(), &[from, to, &i.to_be_bytes()])
}

/// Why a response, or a challenge, was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The counter is not the one the proxy is at (a replay, or a lowered counter).
    #[error("counter is not the chain's current one")]
    Counter,
    /// HMAC(tk_P, A ‖ B ‖ i) does not verify: From, To or i were changed, or a wrong key.
    #[error("request HMAC does not verify")]
    RequestProof,
    /// H(response) is not the value the proxy holds.
    #[error("response is not the next chain value")]
    Chain,
    /// The chain has no values left.
    #[error("chain exhausted")]
    Exhausted,
    /// The challenge's network HMAC does not verify: not from a proxy the authority trusts.
    #[error("network HMAC does not verify")]
    NetworkProof,
    /// A challenge whose counter is zero or above the chain lengths any authority issues.
    #[error("challenge counter out of range")]
    CounterRange,
    /// A different hash than the chain's.
    #[error("hash algorithm differs from the chain's")]
    Algorithm,
}

/// A proxy's cached credential for one user: where it is on the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The hash function of the chain and its HMACs.
    pub hash: HashKind,
    /// H^i(tk_A).
    pub current: Token,
    /// i: how many values are left to reveal (H^(i-1) .. H^0).
    pub counter: u32,
    /// n_DP, as issued; sent to the client in each challenge.
    pub n_dp: Nonce,
    /// n_DA, as issued; sent to the client in each challenge.
    pub n_da: Nonce,
    /// tk_P: the session key this proxy shares with the user, keying the challenge's and the
    /// response's HMACs.
    pub tk_p: Token,
}

impl From<Issued> for Chain {
    fn from(c: Issued) -> Chain {
        Chain {
            hash: c.hash,
            current: c.anchor,
            counter: c.length,
            n_dp: c.n_dp,
            n_da: c.n_da,
            tk_p: c.tk_p,
        }
    }
}

impl Chain {
    /// Message 4: the challenge to a request that carried the user's nonce.
    pub fn challenge(&self, proxy: &str, n_ap: &Nonce) -> Challenge {
        Challenge {
            realm: proxy.to_string(),
            counter: self.counter,
            n_da: self.n_da,
            n_dp: self.n_dp,
            proof: network_proof(self.hash, &self.tk_p, n_ap, self.counter),
            hash: self.hash,
        }
    }

    /// Message 5's check: the response must be for the current counter, its HMAC over
    /// `from` ‖ `to` ‖ i must verify, and H(response) must be the value held. Then the chain
    /// steps down: the response is held and the counter drops by one.
    pub fn verify(&mut self, r: &Response, from: &[u8], to: &[u8]) -> Result<(), Refusal> {
        if self.counter == 0 {
            return Err(Refusal::Exhausted);
        }
        if r.hash != self.hash {
            return Err(Refusal::Algorithm);
        }
        if r.counter != self.counter {
            return Err(Refusal::Counter);
        }
        let proof = request_proof(self.hash, &self.tk_p, from, to, r.counter);
        if !proof.ct_eq(&r.proof) {
            return Err(Refusal::RequestProof);
        }
        if !self.hash.hash(r.value.as_bytes()).ct_eq(&self.current) {
            return Err(Refusal::Chain);
        }
        self.current = r.value;
        self.counter -= 1;
        Ok(())
    }
}

/// The largest counter a client accepts in a challenge: bounds the hashing a forged or
/// mistaken challenge can make a client do.
pub const MAX_COUNTER: u32 = 1 << 20;

/// The client's copy of a chain whose challenge it verified: what it needs to answer the
/// same proxy's next counter without being challenged again (`sipsec load --auth-reuse`;
/// `docs/proxychain.md`, "Answering without a challenge"). A sipsec extension on the client
/// side only: the response is the paper's message 5 unchanged, and the proxy verifies it the
/// same way, since verifying needs nothing from the challenge but its counter.
#[derive(Debug, Clone)]
pub struct ClientChain {
    hash: HashKind,
    proxy: String,
    tk_p: Token,
    root: Token,
    /// The counter last answered; the next answer is for `counter - 1`.
    counter: u32,
}

impl ClientChain {
    /// The client's side: checks the network's proof in `ch` (mutual authentication) and
    /// makes the response for a request from `from` to `to`, keeping the chain for the next
    /// requests.
    pub fn answer(
        k_ad: &[u8],
        ch: &Challenge,
        n_ap: &Nonce,
        username: &str,
        from: &[u8],
        to: &[u8],
    ) -> Result<(ClientChain, Response), Refusal> {
        let kind = ch.hash;
        if ch.counter == 0 || ch.counter > MAX_COUNTER {
            return Err(Refusal::CounterRange);
        }
        let tk_p = session_key(kind, k_ad, &ch.n_dp, &ch.realm);
        if !network_proof(kind, &tk_p, n_ap, ch.counter).ct_eq(&ch.proof) {
            return Err(Refusal::NetworkProof);
        }
        let chain = ClientChain {
            hash: kind,
            proxy: ch.realm.clone(),
            tk_p,
            root: chain_root(kind, k_ad, &ch.n_da, &ch.realm),
            counter: ch.counter,
        };
        let response = chain.response(username, from, to);
        Ok((chain, response))
    }

    /// Message 5 for the current counter.
    fn response(&self, username: &str, from: &[u8], to: &[u8]) -> Response {
        let i = self.counter;
        Response {
            username: username.to_string(),
            realm: self.proxy.clone(),
            counter: i,
            value: self.hash.hash_n(self.root, i - 1),
            proof: request_proof(self.hash, &self.tk_p, from, to, i),
            hash: self.hash,
        }
    }

    /// The response for the next counter, for a request from `from` to `to`; None when the
    /// chain has nothing left to reveal (the client then sends a hello).
    pub fn next(&mut self, username: &str, from: &[u8], to: &[u8]) -> Option<Response> {
        if self.counter <= 1 {
            return None;
        }
        self.counter -= 1;
        Some(self.response(username, from, to))
    }
}

/// Why a `PC` header could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The header's scheme is another than `PC`.
    #[error("not a PC header")]
    NotPc,
    /// The parameter list does not parse (see [`DigestError::Malformed`]).
    #[error("malformed PC parameters")]
    Malformed,
    /// A parameter is missing, empty, too long or not of its form (counter, nonce or hex); the
    /// string names it.
    #[error("missing or bad {0}")]
    Bad(&'static str),
    /// The `algorithm` token is neither `MD5` nor `SHA-256`.
    #[error("unsupported algorithm")]
    UnsupportedAlgorithm,
}

impl From<DigestError> for ParseError {
    fn from(e: DigestError) -> ParseError {
        match e {
            DigestError::NotDigest => ParseError::NotPc,
            _ => ParseError::Malformed,
        }
    }
}

/// Reads the `algorithm=` of a parameter list (absent: MD5, as in the paper's headers).
fn algorithm(params: &[crate::digest::AuthParam<'_>]) -> Result<HashKind, ParseError> {
    match params.iter().find(|(n, _)| eq_ic(n, b"algorithm")) {
        Some((_, v)) => HashKind::from_token(v).ok_or(ParseError::UnsupportedAlgorithm),
        None => Ok(HashKind::Md5),
    }
}

fn param<'p>(params: &'p [crate::digest::AuthParam<'_>], name: &[u8]) -> Option<&'p [u8]> {
    params
        .iter()
        .find(|(n, _)| eq_ic(n, name))
        .map(|(_, v)| v.as_ref())
}

fn counter(params: &[crate::digest::AuthParam<'_>]) -> Result<u32, ParseError> {
    param(params, b"i")
        .filter(|v| !v.is_empty() && v.len() <= 10 && v.iter().all(u8::is_ascii_digit))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
        .ok_or(ParseError::Bad("i"))
}

fn text(params: &[crate::digest::AuthParam<'_>], name: &'static str) -> Result<String, ParseError> {
    param(params, name.as_bytes())
        .filter(|v| !v.is_empty() && v.len() <= 256)
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::to_string)
        .ok_or(ParseError::Bad(name))
}

/// Message 4 (`Proxy-Authenticate: PC …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// P, the proxy's identifier.
    pub realm: String,
    /// i.
    pub counter: u32,
    /// n_DA, hex in `nda`.
    pub n_da: Nonce,
    /// n_DP, hex in `ndp`.
    pub n_dp: Nonce,
    /// HMAC(tk_P, n_AP ‖ i).
    pub proof: Token,
    /// The hash function of the chain and its HMACs.
    pub hash: HashKind,
}

impl Challenge {
    /// The header value.
    pub fn render(&self) -> String {
        format!(
            "PC realm={}, i=\"{}\", nda=\"{}\", ndp=\"{}\", hmac=\"{}\", algorithm={}",
            Quoted(&self.realm),
            self.counter,
            hex::encode(&self.n_da),
            hex::encode(&self.n_dp),
            self.proof.hex(),
            self.hash.token()
        )
    }

    /// Parses a `Proxy-Authenticate: PC` value carrying a counter.
    pub fn parse(value: &[u8]) -> Result<Challenge, ParseError> {
        Challenge::from_params(&parse_scheme_params(value, b"PC")?)
    }

    fn from_params(p: &[crate::digest::AuthParam<'_>]) -> Result<Challenge, ParseError> {
        let hash = algorithm(p)?;
        Ok(Challenge {
            realm: text(p, "realm")?,
            counter: counter(p)?,
            n_da: param(p, b"nda")
                .and_then(nonce_from_hex)
                .ok_or(ParseError::Bad("nda"))?,
            n_dp: param(p, b"ndp")
                .and_then(nonce_from_hex)
                .ok_or(ParseError::Bad("ndp"))?,
            proof: param(p, b"hmac")
                .and_then(|v| Token::from_hex(hash, v))
                .ok_or(ParseError::Bad("hmac"))?,
            hash,
        })
    }
}

/// A `Proxy-Authenticate: PC …` value: message 4, or the *hello challenge*, which carries
/// only the realm and asks for message 1 (a hello with a fresh n_AP) because the proxy has
/// no chain value to challenge with (none yet, spent, or a replay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authenticate {
    /// The hello challenge: asks the client for message 1.
    Hello {
        /// P, the proxy's identifier.
        realm: String,
    },
    /// Message 4, a challenge on the chain.
    Challenge(Challenge),
}

impl Authenticate {
    /// Parses either form: a counter (`i`) makes it message 4.
    pub fn parse(value: &[u8]) -> Result<Authenticate, ParseError> {
        let p = parse_scheme_params(value, b"PC")?;
        if param(&p, b"i").is_none() {
            return Ok(Authenticate::Hello {
                realm: text(&p, "realm")?,
            });
        }
        Challenge::from_params(&p).map(Authenticate::Challenge)
    }

    /// The header value.
    pub fn render(&self) -> String {
        match self {
            Authenticate::Hello { realm } => format!("PC realm={}", Quoted(realm)),
            Authenticate::Challenge(c) => c.render(),
        }
    }
}

/// Message 5 (`Proxy-Authorization: PC …` with a response).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// A, the user answering (`username`).
    pub username: String,
    /// P, the proxy's identifier the response is for.
    pub realm: String,
    /// i.
    pub counter: u32,
    /// H^(i-1)(tk_A).
    pub value: Token,
    /// HMAC(tk_P, A ‖ B ‖ i).
    pub proof: Token,
    /// The hash function of the chain and its HMACs.
    pub hash: HashKind,
}

impl Response {
    /// The header value: `PC username=…, realm=…, i=…, response=…, hmac=…, algorithm=…`.
    pub fn render(&self) -> String {
        format!(
            "PC username={}, realm={}, i=\"{}\", response=\"{}\", hmac=\"{}\", algorithm={}",
            Quoted(&self.username),
            Quoted(&self.realm),
            self.counter,
            self.value.hex(),
            self.proof.hex(),
            self.hash.token()
        )
    }
}

/// Message 1's credentials: who the user is and the user's nonce n_AP, carried on the first
/// request so the challenge can prove the network to the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// A, the user (`username`).
    pub username: String,
    /// n_AP: the user's fresh nonce, which the proxy's challenge must prove (`nap`, hex).
    pub n_ap: Nonce,
}

impl Hello {
    /// The header value: `PC username=…, nap=…`.
    pub fn render(&self) -> String {
        format!(
            "PC username={}, nap=\"{}\"",
            Quoted(&self.username),
            hex::encode(&self.n_ap)
        )
    }
}

/// A `Proxy-Authorization: PC …` value: a hello (message 1) or a response (message 5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authorization {
    /// Message 1: the user names itself and sends n_AP.
    Hello(Hello),
    /// Message 5: the user reveals the next chain value.
    Response(Response),
}

impl Authorization {
    /// Parses either form: a `response` parameter makes it a response.
    pub fn parse(value: &[u8]) -> Result<Authorization, ParseError> {
        let p = parse_scheme_params(value, b"PC")?;
        let username = text(&p, "username")?;
        if param(&p, b"response").is_none() {
            let n_ap = param(&p, b"nap")
                .and_then(nonce_from_hex)
                .ok_or(ParseError::Bad("nap"))?;
            return Ok(Authorization::Hello(Hello { username, n_ap }));
        }
        let hash = algorithm(&p)?;
        let token = |name: &'static str| {
            param(&p, name.as_bytes())
                .and_then(|v| Token::from_hex(hash, v))
                .ok_or(ParseError::Bad(name))
        };
        Ok(Authorization::Response(Response {
            username,
            realm: text(&p, "realm")?,
            counter: counter(&p)?,
            value: token("response")?,
            proof: token("hmac")?,
            hash,
        }))
    }

    /// The user either form names.
    pub fn username(&self) -> &str {
        match self {
            Authorization::Hello(h) => &h.username,
            Authorization::Response(r) => &r.username,
        }
    }
}

#[cfg(test)]
mod tests;
