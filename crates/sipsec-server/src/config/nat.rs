//! `[nat]`: phones behind NATs and RFC 5626 flows — when a binding is reached where its
//! REGISTER came from rather than at its Contact, and how the server keeps the NAT's mapping
//! open (pings to UDP bindings, the Flow-Timer it gives outbound clients).

use anyhow::{bail, Result};
use serde::Deserialize;

/// When a binding is reached at the address its REGISTER came from (`[nat] mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NatMode {
    /// When the Contact is not reachable as written: a private (RFC 1918), shared (RFC 6598)
    /// or link-local address other than the source, or a Contact that differs from the
    /// source when the client asked for `rport`; and always for an RFC 5626 flow. The default.
    Auto,
    /// Always: every binding is reached where its REGISTER came from (over its connection,
    /// for TCP and TLS).
    Always,
    /// Never (but for RFC 5626 flows, which ask for it): the Contact as written.
    Never,
}

/// What the server sends to keep a UDP binding's NAT mapping open (`[nat] ping`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NatPing {
    /// An OPTIONS request: answered, so a binding whose pings go unanswered for
    /// `ping_timeout_ms` is dropped. The default.
    Options,
    /// A CRLF datagram (RFC 5626's keep-alive shape): cheaper, never answered, so nothing is
    /// dropped for silence.
    Crlf,
    /// No pings.
    Off,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawNat {
    mode: NatMode,
    ping: NatPing,
    ping_interval_ms: u64,
    ping_timeout_ms: u64,
    flow_timer_s: u32,
}

impl Default for RawNat {
    fn default() -> Self {
        RawNat {
            mode: NatMode::Auto,
            ping: NatPing::Options,
            ping_interval_ms: 25_000,
            ping_timeout_ms: 90_000,
            flow_timer_s: 25,
        }
    }
}

/// NAT traversal and flows (`[nat]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatConfig {
    /// When a binding is reached where its REGISTER came from.
    pub mode: NatMode,
    /// What is sent to UDP bindings reached through a NAT.
    pub ping: NatPing,
    /// How often each such binding is pinged (each binding at its own phase, spread over
    /// the interval), in milliseconds.
    pub ping_interval_ms: u64,
    /// With OPTIONS pings: a binding none of whose pings (nor REGISTERs) was answered for
    /// this long is dropped (0: never).
    pub ping_timeout_ms: u64,
    /// The `Flow-Timer` (RFC 5626 §4.4.1) in the 200 OK to an outbound registration: how
    /// often, in seconds, the client should send its keep-alive.
    pub flow_timer_s: u32,
}

impl RawNat {
    pub(super) fn validate(self) -> Result<NatConfig> {
        if self.ping != NatPing::Off && !(1_000..=3_600_000).contains(&self.ping_interval_ms) {
            bail!("nat.ping_interval_ms must be between 1000 and 3600000 (one hour)");
        }
        if self.ping_timeout_ms != 0 && self.ping_timeout_ms < 2 * self.ping_interval_ms {
            bail!(
                "nat.ping_timeout_ms must be 0 (never drop) or at least twice \
                 nat.ping_interval_ms, so one lost ping does not drop a binding"
            );
        }
        if !(10..=3_600).contains(&self.flow_timer_s) {
            bail!("nat.flow_timer_s must be between 10 and 3600");
        }
        Ok(NatConfig {
            mode: self.mode,
            ping: self.ping,
            ping_interval_ms: self.ping_interval_ms,
            ping_timeout_ms: self.ping_timeout_ms,
            flow_timer_s: self.flow_timer_s,
        })
    }
}
