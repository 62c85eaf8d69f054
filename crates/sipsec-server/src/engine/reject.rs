//! Messages the parser refused: answered with the status and reason the fault calls for when
//! enough of the raw text can be salvaged to address a response, dropped and counted otherwise.

use super::{Effects, Engine};
use crate::stats::inc;
use bytes::Bytes;
use sip_core::message::{build, ParseError};
use sip_core::timer::Millis;
use sipsec_transport::net::transport::Peer;

impl Engine {
    /// Answers a message the parser refused, when enough of it is readable to address a
    /// response; otherwise drops it. Never answers a response or an ACK.
    pub(super) fn reject_unparsed(
        &mut self,
        now: Millis,
        source: Peer,
        data: &[u8],
        err: ParseError,
        fx: &mut Effects,
    ) {
        if let Some(answer) = self.reject_salvage(now, source, data, err) {
            fx.transmits.push((source, answer));
        }
    }

    /// Logs (rate-limited) a refused message and builds its answer, counting it as a local
    /// response, or as dropped when it cannot be addressed.
    fn reject_salvage(
        &mut self,
        now: Millis,
        source: Peer,
        data: &[u8],
        err: ParseError,
    ) -> Option<Bytes> {
        if self.log.allow(now) {
            tracing::warn!(%source, "rejected message: {err}");
        }
        let mut out = Vec::new();
        let extra = self.cfg.server_line.as_bytes();
        if build::salvage_response(data, err.status(), &err.reason(), extra, &mut out) {
            inc(&self.stats.local_responses);
            Some(Bytes::from(out))
        } else {
            inc(&self.stats.malformed_dropped);
            None
        }
    }
}
