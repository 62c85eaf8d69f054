//! STIR/SHAKEN. The authentication service (RFC 8224 §5, ATIS-1000074): an initial INVITE
//! from a caller the gate vouched for leaves with an `Identity` header — a SHAKEN PASSporT
//! naming the calling number (P-Asserted-Identity, else From), the called number (To, else
//! the Request-URI), when, and how well we know the caller — signed with the configured key. The verification service (RFC 8224 §6): an initial INVITE that arrives with one is
//! checked — the token, its freshness, its numbers against the request's, the signer's
//! certificate (fetched off the worker by `serve::certs`, cached per URL, the request waiting
//! in its transaction meanwhile, as for DNS), the signature, and replays across workers
//! ([`ReplayTable`]) — and routed on with the caller's number marked `verstat=` (3GPP TS
//! 24.229), or answered with RFC 8224's response, per `policy`.
//!
//! [`Signing`] owns the key and the attestation rules (see `config::IdentityConfig`); the
//! engine asks it once per forwarded INVITE ([`Engine::identity_sign`]), and every branch
//! of the request carries the same header. An INVITE that already carries an Identity (a
//! trusted neighbour signed it) is left as it is; one that names no telephone number on
//! either side cannot be signed and is counted.

use super::relay::Vouched;
use super::reply::{Answer, ReplyTo};
use super::{locate, Effects, Engine, Link, RequestFacts};
use crate::config::{IdentityPolicy as Policy, SignConfig, VerifyConfig};
use crate::stats::inc;
use bytes::Bytes;
use sip_core::message::rewrite::Splice;
use sip_core::message::{HeaderName, Message, Method};
use sip_core::timer::Millis;
use sip_core::transaction::TxId;
use sipsec_identity::fetch::Allow;
use sipsec_identity::replay::Replays;
use sipsec_identity::{header, tn, Attest, CertError, Claims, Invalid, Signer, SigningKey};
use sipsec_transport::net::transport::Peer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A worker's authentication service: the key (shared by every worker) and the rules.
pub(super) struct Signing {
    key: Arc<SigningKey>,
    /// Our `origid`: one UUID for the server, made at start (ATIS-1000074 names the point
    /// where calls enter the network, not the call).
    origid: Arc<str>,
    /// An authenticated caller calling from its own number.
    attest: Attest,
    /// A caller vouched for only by where it came from.
    attest_trusted: Attest,
}

impl Signing {
    pub(super) fn new(key: Arc<SigningKey>, origid: Arc<str>, cfg: &SignConfig) -> Signing {
        Signing {
            key,
            origid,
            attest: cfg.attest,
            attest_trusted: cfg.attest_trusted,
        }
    }
}

/// Whether the request already carries an Identity header (`y` is its compact form).
pub(super) fn has_identity(msg: &Message<'_>) -> bool {
    msg.other_header(b"Identity").is_some() || msg.other_header(b"y").is_some()
}

/// The calling number: P-Asserted-Identity's (RFC 3325; a trusted network's word), else
/// From's, canonical.
fn calling_number(msg: &Message<'_>) -> Option<String> {
    let text = |b: &[u8]| std::str::from_utf8(b).ok().and_then(tn::from_uri);
    // A list, maybe over several lines: the first value that names a number (a sip: and a
    // tel: may both be there).
    for pai in msg.other_headers(b"P-Asserted-Identity") {
        if let Some(n) = list_values(pai).into_iter().find_map(text) {
            return Some(n);
        }
    }
    msg.from().ok().and_then(|f| text(f.uri.raw))
}

/// The called number: To's (RFC 8224 §4.1), else the Request-URI's, canonical.
fn called_number(msg: &Message<'_>) -> Option<String> {
    let text = |b: &[u8]| std::str::from_utf8(b).ok().and_then(tn::from_uri);
    msg.to()
        .ok()
        .and_then(|t| text(t.uri.raw))
        .or_else(|| msg.request_uri().and_then(|u| text(u.raw)))
}

impl Engine {
    /// Turns the authentication service on, with the key and `origid` every worker shares
    /// (`passport::new_origid` makes one).
    pub fn enable_identity(&mut self, key: Arc<SigningKey>, origid: Arc<str>) {
        if let Some(cfg) = &self.cfg.identity.sign {
            self.signing = Some(Signing::new(key, origid, cfg));
        }
    }

    /// The Identity header value an initial INVITE forwarded now should carry: signing on,
    /// the caller vouched for, no Identity already, and a number on both sides.
    pub(super) fn identity_sign(
        &self,
        now: Millis,
        msg: &Message<'_>,
        vouched: Vouched,
    ) -> Option<Arc<str>> {
        let signing = self.signing.as_ref()?;
        if msg.method() != Method::Invite || vouched == Vouched::No || has_identity(msg) {
            return None;
        }
        let (Some(orig), Some(dest)) = (calling_number(msg), called_number(msg)) else {
            inc(&self.stats.identity_unsigned);
            return None;
        };
        let attest = match vouched {
            // Full attestation only for the number the caller authenticated as.
            Vouched::User => match crate::auth::named_user(msg).and_then(|u| tn::canonical(&u)) {
                Some(user) if user == orig => signing.attest,
                _ => signing.attest.min(Attest::B),
            },
            Vouched::Source | Vouched::Open | Vouched::No => signing.attest_trusted,
        };
        let claims = Claims {
            attest,
            orig,
            dest: vec![dest],
            iat: self.unix_ms(now) / 1000,
            origid: signing.origid.to_string(),
        };
        inc(&self.stats.identity_signed);
        Some(header::value(&signing.key, &claims).into())
    }
}

// The verification service.

/// A certificate fetch's outcome, as the fetcher (`serve::certs`) mails it to every worker.
#[derive(Debug)]
pub struct Fetched {
    /// The certificate, its chain checked, or why not.
    pub signer: Result<Arc<Signer>, CertError>,
    /// How long to keep it (or the failure), seconds.
    pub ttl_s: u64,
}

/// The tokens every worker has accepted, against replay (a token replayed to another worker
/// is as much a replay): shards of [`Replays`], each behind its own lock, held for one
/// lookup.
pub struct ReplayTable {
    shards: Vec<Mutex<Replays>>,
}

impl ReplayTable {
    /// A table of about `entries` tokens in all.
    pub fn new(entries: usize) -> ReplayTable {
        const SHARDS: usize = 16;
        ReplayTable {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Replays::new(entries.div_ceil(SHARDS))))
                .collect(),
        }
    }

    fn check(
        &self,
        signature: &[u8; 64],
        call: u64,
        now_s: u64,
        until_s: u64,
    ) -> Result<(), Invalid> {
        let shard = &self.shards[usize::from(signature[0]) % self.shards.len()];
        // A poisoned lock means a panic elsewhere mid-update; the table is still a table.
        let mut table = shard.lock().unwrap_or_else(|p| p.into_inner());
        table.check(signature, call, now_s, until_s)
    }
}

/// The verification service's certificates, per URL.
enum Cert {
    Ready {
        signer: Arc<Signer>,
        until: Millis,
    },
    Failed {
        error: CertError,
        until: Millis,
    },
    /// Asked of the fetcher; requests wait in `Verifying::waiting`.
    Asked,
}

/// An INVITE waiting for its certificate.
struct Waiter {
    /// Its server transaction (stateful), which carries the answer and absorbed retransmissions.
    server: Option<TxId>,
    source: Peer,
    data: Bytes,
    vouched: Vouched,
}

/// INVITEs waiting for certificates, at most this many in all; beyond, 503.
const MAX_WAITING: usize = 10_000;
/// Certificates a worker keeps; past it, the expired go, then all.
const MAX_CERTS: usize = 4_096;

/// A worker's verification service.
pub(super) struct Verifying {
    cfg: VerifyConfig,
    allow: Allow,
    certs: HashMap<Arc<str>, Cert>,
    waiting: HashMap<Arc<str>, Vec<Waiter>>,
    waiting_total: usize,
    replays: Arc<ReplayTable>,
}

impl Verifying {
    /// Room for one more certificate: past `MAX_CERTS`, the expired go, then every one had
    /// (those asked for stay: requests wait for them).
    fn make_room(&mut self, now: Millis) {
        if self.certs.len() < MAX_CERTS {
            return;
        }
        self.certs.retain(|_, c| match c {
            Cert::Ready { until, .. } | Cert::Failed { until, .. } => *until >= now,
            Cert::Asked => true,
        });
        if self.certs.len() >= MAX_CERTS {
            self.certs.retain(|_, c| matches!(c, Cert::Asked));
        }
    }
}

/// What verification says of an INVITE.
pub(super) enum Verified {
    /// Route it: as it came (`None`), or as rewritten with its `verstat`.
    Go(Option<Bytes>),
    /// It was answered, or waits for its certificate.
    Stop,
}

/// `verstat` values (3GPP TS 24.229 §7.2A.20).
const PASSED: &[u8] = b"TN-Validation-Passed";
const FAILED: &[u8] = b"TN-Validation-Failed";

/// The values of a list header (P-Asserted-Identity), split at the commas outside quoted
/// display names and angle brackets, trimmed.
fn list_values(v: &[u8]) -> Vec<&[u8]> {
    let (mut out, mut start, mut quoted, mut bracket, mut escaped) =
        (Vec::new(), 0, false, false, false);
    for (i, &b) in v.iter().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' if !bracket => quoted = !quoted,
            b'<' if !quoted => bracket = true,
            b'>' if !quoted => bracket = false,
            b',' if !quoted && !bracket => {
                out.push(v[start..i].trim_ascii());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(v[start..].trim_ascii());
    out.retain(|v| !v.is_empty());
    out
}

/// The URI inside a name-addr's angle brackets (after any quoted display name); `None` for an
/// addr-spec without brackets, whose `;` parameters are the header's, not the URI's.
fn bracketed_uri(v: &[u8]) -> Option<&[u8]> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, &b) in v.iter().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b'<' if !quoted => {
                let close = v[i + 1..].iter().position(|&c| c == b'>')?;
                return Some(&v[i + 1..i + 1 + close]);
            }
            _ => {}
        }
    }
    None
}

/// Of a URI, the part a `verstat` lives in: a `sip:`/`sips:` user part (up to `@`) or a
/// `tel:` number with its parameters (the whole URI after the scheme).
fn number_part(uri: &[u8]) -> Option<&[u8]> {
    let colon = uri.iter().position(|&b| b == b':')?;
    let rest = &uri[colon + 1..];
    if uri[..colon].eq_ignore_ascii_case(b"tel") {
        Some(rest)
    } else {
        let at = rest.iter().position(|&b| b == b'@')?;
        Some(&rest[..at])
    }
}

fn offset(msg: &Message<'_>, part: &[u8]) -> usize {
    part.as_ptr() as usize - msg.as_bytes().as_ptr() as usize
}

/// Every `;verstat=…` parameter in a number part, any case, as ranges of the message.
fn verstats(msg: &Message<'_>, part: &[u8], out: &mut Vec<(usize, usize)>) {
    let base = offset(msg, part);
    let mut i = 0;
    while i + 9 <= part.len() {
        if part[i..i + 9].eq_ignore_ascii_case(b";verstat=") {
            let len = part[i + 1..]
                .iter()
                .position(|&b| b == b';')
                .map_or(part.len() - i, |j| j + 1);
            out.push((base + i, base + i + len));
            i += len;
        } else {
            i += 1;
        }
    }
}

/// The request with every `verstat` on From and P-Asserted-Identity removed and, given a
/// `value`, ours put on the caller's number (the first P-Asserted-Identity naming one, else
/// From; bracketed URIs only); `None` when nothing changes.
fn with_verstat(msg: &Message<'_>, value: Option<&[u8]>) -> Option<Bytes> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for pai in msg.other_headers(b"P-Asserted-Identity") {
        parts.extend(
            list_values(pai)
                .into_iter()
                .filter_map(bracketed_uri)
                .filter_map(number_part),
        );
    }
    let pai_count = parts.len();
    let from = msg
        .header_value(HeaderName::From)
        .and_then(bracketed_uri)
        .and_then(number_part);
    parts.extend(from);
    let mut removals = Vec::new();
    for part in &parts {
        verstats(msg, part, &mut removals);
    }
    // Ours goes on the first P-Asserted-Identity that names a number, else From.
    let named = |part: &[u8]| {
        std::str::from_utf8(part)
            .ok()
            .and_then(|p| tn::canonical(p.split(';').next().unwrap_or("")))
            .is_some()
    };
    let at = value.and_then(|_| {
        parts[..pai_count]
            .iter()
            .find(|p| named(p))
            .or(from.as_ref().filter(|f| named(f)))
            .map(|part| offset(msg, part) + part.len())
    });
    if removals.is_empty() && at.is_none() {
        return None;
    }
    let mut splice = Splice::new();
    for (s, e) in removals {
        splice.remove(s, e);
    }
    if let (Some(at), Some(v)) = (at, value) {
        splice.replace_with(at, at, |t| {
            t.extend_from_slice(b";verstat=");
            t.extend_from_slice(v);
        });
    }
    let mut out = Vec::with_capacity(msg.as_bytes().len() + 32);
    splice.apply(msg.as_bytes(), &mut out);
    Some(Bytes::from(out))
}

/// FNV-1a of a Call-ID: the same on every worker, for the shared replay table.
fn call_key(call_id: &[u8]) -> u64 {
    call_id.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Why an Identity failed, as counted and answered.
struct Failure {
    status: (u16, &'static str),
    why: String,
}

impl From<Invalid> for Failure {
    fn from(e: Invalid) -> Failure {
        Failure {
            status: e.status(),
            why: e.to_string(),
        }
    }
}

impl From<CertError> for Failure {
    fn from(e: CertError) -> Failure {
        Failure {
            status: e.status(),
            why: e.to_string(),
        }
    }
}

impl Engine {
    /// Turns the verification service on, with the replay table every worker shares.
    pub fn enable_verify(&mut self, replays: Arc<ReplayTable>) {
        let Some(cfg) = self.cfg.identity.verify.clone() else {
            return;
        };
        let allow = Allow::new(&cfg.fetch_allow).unwrap_or_default();
        self.verifying = Some(Verifying {
            cfg,
            allow,
            certs: HashMap::new(),
            waiting: HashMap::new(),
            waiting_total: 0,
            replays,
        });
    }

    /// Whether an initial INVITE is for the verification service.
    pub(super) fn identity_verifies(&self) -> bool {
        self.verifying.is_some()
    }

    /// The verification service on an initial INVITE: checked, and routed on marked with its
    /// result, answered, or parked until its certificate comes. `server` is the server
    /// transaction of one that waited.
    pub(super) fn identity_verify(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        (vouched, server): (Vouched, Option<TxId>),
        fx: &mut Effects,
    ) -> Verified {
        let Some(v) = self.verifying.as_ref() else {
            return Verified::Go(None);
        };
        let (policy, require) = (v.cfg.policy, v.cfg.require);
        let Some(value) = msg
            .other_header(b"Identity")
            .or_else(|| msg.other_header(b"y"))
        else {
            // Exempt: our own authenticated users and trusted networks (whose calls we sign,
            // not verify). An open proxy's callers are anyone: `require` holds for all, so an
            // open proxy that also signs has nothing left to sign (unsigned INVITEs are
            // refused here, signed ones keep their Identity).
            if require && matches!(vouched, Vouched::No | Vouched::Open) {
                inc(&self.stats.identity_missing);
                let (code, reason) = sipsec_identity::error::USE_IDENTITY_HEADER;
                let to = server.map_or(ReplyTo::Sender(source), ReplyTo::Transaction);
                self.reply(now, to, msg, &Answer::new(code, reason), fx);
                return Verified::Stop;
            }
            // A verstat is ours to set: one that came with the request goes (from any
            // source: a trusted network's verstat is not ours either).
            return Verified::Go(with_verstat(msg, None));
        };
        let outcome = match self.identity_check(now, msg, value) {
            Ok(None) => Ok(()),
            Ok(Some(url)) => {
                // The certificate is to be fetched: wait for it.
                return self.identity_park(now, source, msg, url, (vouched, server), fx);
            }
            Err(f) => Err(f),
        };
        match outcome {
            Ok(()) => {
                inc(&self.stats.identity_verified);
                Verified::Go(with_verstat(msg, Some(PASSED)))
            }
            Err(f) => {
                inc(&self.stats.identity_failed);
                if self.log.allow(now) {
                    tracing::info!(%source, "Identity refused: {}", f.why);
                }
                match policy {
                    Policy::Mark => Verified::Go(with_verstat(msg, Some(FAILED))),
                    Policy::Reject => {
                        let to = server.map_or(ReplyTo::Sender(source), ReplyTo::Transaction);
                        self.reply(now, to, msg, &Answer::new(f.status.0, f.status.1), fx);
                        Verified::Stop
                    }
                }
            }
        }
    }

    /// The checks: `Ok(None)` verified, `Ok(Some(x5u))` when the certificate must be fetched
    /// first (every check that needs none has passed), or why it failed. Cheap checks come
    /// first, so a token that cannot pass never costs a fetch.
    fn identity_check(
        &mut self,
        now: Millis,
        msg: &Message<'_>,
        value: &[u8],
    ) -> Result<Option<Arc<str>>, Failure> {
        let now_s = self.unix_ms(now) / 1000;
        let v = self.verifying.as_mut().expect("verification is on");
        let text = std::str::from_utf8(value)
            .map_err(|_| Invalid::Malformed("the Identity header is not UTF-8"))?;
        let token = header::decode(text)?;
        token.check_fresh(now_s, v.cfg.freshness_s)?;
        let orig = calling_number(msg);
        let by_uri = msg
            .request_uri()
            .and_then(|u| std::str::from_utf8(u.raw).ok().and_then(tn::from_uri));
        let by_to = msg
            .to()
            .ok()
            .and_then(|t| std::str::from_utf8(t.uri.raw).ok().and_then(tn::from_uri));
        token
            .check_numbers(orig.as_deref(), by_uri.as_deref())
            .or_else(|e| {
                if by_to.is_some() && by_to != by_uri {
                    token.check_numbers(orig.as_deref(), by_to.as_deref())
                } else {
                    Err(e)
                }
            })?;
        let url: &str = &token.x5u;
        let signer = match v.certs.get(url) {
            Some(Cert::Ready { signer, until }) if *until >= now => signer.clone(),
            Some(Cert::Failed { error, until }) if *until >= now => {
                return Err(error.clone().into());
            }
            Some(Cert::Asked) => return Ok(Some(url.into())),
            _ => {
                // Not had, or expired: fetch it, if the allow-list lets us.
                if let Err(e) = v.allow.target(url) {
                    return Err(e.into());
                }
                return Ok(Some(url.into()));
            }
        };
        signer.authorises(orig.as_deref().unwrap_or_default())?;
        signer.verify(&token)?;
        // The call: its Call-ID and the caller's tag (a dialog's own, RFC 3261 §12).
        let tag = msg.from().ok().and_then(|f| f.tag()).unwrap_or_default();
        let call = call_key(msg.call_id()) ^ call_key(tag).rotate_left(1);
        let until_s = token.claims.iat.saturating_add(v.cfg.freshness_s);
        if let Err(e) = v.replays.check(&token.signature, call, now_s, until_s) {
            inc(&self.stats.identity_replayed);
            return Err(e.into());
        }
        Ok(None)
    }

    /// Parks an INVITE until the certificate at `url` comes, asking for it unless asked
    /// already.
    fn identity_park(
        &mut self,
        now: Millis,
        source: Peer,
        msg: &Message<'_>,
        url: Arc<str>,
        (vouched, server): (Vouched, Option<TxId>),
        fx: &mut Effects,
    ) -> Verified {
        let full = self
            .verifying
            .as_ref()
            .is_none_or(|v| v.waiting_total >= MAX_WAITING);
        if full {
            inc(&self.stats.overload_rejected);
            let busy = Answer::new(503, "Service Unavailable").with_headers("Retry-After: 5\r\n");
            let to = server.map_or(ReplyTo::Sender(source), ReplyTo::Transaction);
            self.reply(now, to, msg, &busy, fx);
            return Verified::Stop;
        }
        let server = match server {
            Some(id) => Some(id),
            None if self.cfg.stateful => Some(self.proxy_open_server(now, source, msg)),
            None => None,
        };
        let data = Bytes::copy_from_slice(msg.as_bytes());
        if let Some(Link::Proxied(ctx)) = server.and_then(|id| self.tx.user_mut(id)) {
            ctx.waiting = Some(data.clone());
        }
        let v = self.verifying.as_mut().expect("verification is on");
        if !matches!(v.certs.get(&url), Some(Cert::Asked)) {
            v.make_room(now);
            v.certs.insert(url.clone(), Cert::Asked);
            fx.cert_fetches.push(url.clone());
            inc(&self.stats.identity_fetches);
        }
        v.waiting.entry(url).or_default().push(Waiter {
            server,
            source,
            data,
            vouched,
        });
        v.waiting_total += 1;
        inc(&self.stats.identity_waited);
        Verified::Stop
    }

    /// A certificate fetch ended: cached (or its failure, for a while), and the INVITEs that
    /// waited for it verified and routed.
    pub(super) fn identity_certificate(
        &mut self,
        now: Millis,
        url: Arc<str>,
        fetched: Arc<Fetched>,
        fx: &mut Effects,
    ) {
        let Some(v) = self.verifying.as_mut() else {
            return;
        };
        let until = now + fetched.ttl_s * 1000;
        let cert = match &fetched.signer {
            Ok(signer) => Some(Cert::Ready {
                signer: signer.clone(),
                until,
            }),
            // Another worker's refetch failed: a certificate this one still holds valid stays.
            Err(_) if matches!(v.certs.get(&url), Some(Cert::Ready { until, .. }) if *until >= now) => {
                None
            }
            Err(error) => Some(Cert::Failed {
                error: error.clone(),
                until,
            }),
        };
        if let Some(cert) = cert {
            if !v.certs.contains_key(&url) {
                v.make_room(now);
            }
            v.certs.insert(url.clone(), cert);
        }
        let waiters = v.waiting.remove(&url).unwrap_or_default();
        v.waiting_total -= waiters.len();
        for w in waiters {
            let Ok(msg) = Message::parse(&w.data) else {
                continue;
            };
            if let Some(id) = w.server {
                match self.tx.user(id) {
                    Some(Link::Proxied(ctx)) if !ctx.cancelled && !ctx.final_sent => {}
                    // Cancelled (and answered 487) or ended while it waited.
                    _ => continue,
                }
            }
            let rewritten =
                match self.identity_verify(now, w.source, &msg, (w.vouched, w.server), fx) {
                    Verified::Stop => continue,
                    Verified::Go(r) => r,
                };
            let resumed = Some(locate::Resumed {
                server: w.server,
                waits: 0,
            });
            // Routed as marked; should the mark not parse, as it came (never dropped: its
            // transaction would wait for nothing).
            let marked = rewritten.as_deref().and_then(|d| Message::parse(d).ok());
            let chosen = marked
                .as_ref()
                .filter(|m| RequestFacts::of(m).is_some())
                .unwrap_or(&msg);
            if let Some(facts) = RequestFacts::of(chosen) {
                self.route_request(now, w.source, chosen, (facts, w.vouched), resumed, fx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked(headers: &str, value: Option<&[u8]>) -> String {
        let text = format!(
            "INVITE sip:+15557654321@h SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\n{headers}\
             To: <sip:+15557654321@h>\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
        );
        let msg = Message::parse(text.as_bytes()).unwrap();
        match with_verstat(&msg, value) {
            Some(out) => String::from_utf8(out.to_vec()).unwrap(),
            None => text,
        }
    }

    #[test]
    fn our_mark_goes_on_the_first_number_and_every_other_mark_goes() {
        let out = marked(
            "From: \"A, <sip:+1999@x>\" <sip:+15551234567;VerStat=TN-Validation-Passed;verstat=x@h>;tag=1\r\n\
             P-Asserted-Identity: <sip:alice@h>, <tel:+15551234567;verstat=TN-Validation-Passed>\r\n",
            Some(FAILED),
        );
        assert!(
            out.contains("From: \"A, <sip:+1999@x>\" <sip:+15551234567@h>;tag=1\r\n"),
            "{out}"
        );
        assert!(
            out.contains("P-Asserted-Identity: <sip:alice@h>, <tel:+15551234567;verstat=TN-Validation-Failed>\r\n"),
            "{out}"
        );
    }

    #[test]
    fn without_a_value_forged_marks_only_go_and_unbracketed_uris_are_left() {
        let out = marked(
            "From: <sip:+15551234567;verstat=TN-Validation-Passed@h;user=phone>;tag=1\r\n",
            None,
        );
        assert!(
            out.contains("From: <sip:+15551234567@h;user=phone>;tag=1\r\n"),
            "{out}"
        );
        let out = marked("From: sip:+15551234567@h;tag=1\r\n", Some(PASSED));
        assert!(out.contains("From: sip:+15551234567@h;tag=1\r\n"), "{out}");
        let out = marked("From: <sip:+15551234567@h>;tag=1\r\n", Some(PASSED));
        assert!(
            out.contains("From: <sip:+15551234567;verstat=TN-Validation-Passed@h>;tag=1\r\n"),
            "{out}"
        );
    }

    #[test]
    fn list_values_split_outside_quotes_and_brackets() {
        let v = list_values(b" \"a, b\" <sip:x@h;p=1,2>, <tel:+1> ,");
        assert_eq!(v, [&b"\"a, b\" <sip:x@h;p=1,2>"[..], &b"<tel:+1>"[..]]);
    }
}
