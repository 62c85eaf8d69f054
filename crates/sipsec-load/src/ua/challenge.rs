//! Answering challenges: digest (401/407, with nonces reused and counted across calls when
//! asked) and Proxychain (`PC`: the hello, the answer, and starting over when a concurrent
//! call of the same user spent the chain value first).

use super::*;

impl Ua {
    /// Credentials from `caller`'s last challenge with the next nonce count, if there is one.
    pub(super) fn reused_credentials(
        &mut self,
        caller: usize,
        method: &str,
        uri: &str,
        number: u64,
    ) -> Option<(&'static str, String)> {
        let register = method == "REGISTER";
        let user = self.cfg.users.get(caller)?;
        let (challenge, nc) = self.nonces.get_mut(&(caller, register))?;
        *nc += 1;
        let cnonce = format!("{:x}{number:x}r", self.cfg.epoch);
        let value =
            challenge.authorization(&user.username, &user.password, method, uri, *nc, &cnonce);
        let name = digest::credentials_header(digest::challenge_status(register)).as_str();
        Some((name, value))
    }

    /// A fresh n_AP: unpredictable (keyed by a random seed), never repeated in this run.
    pub(super) fn pc_nonce(&mut self) -> sip_core::proxychain::Nonce {
        use sha2::Digest as _;
        self.pc_counter += 1;
        let mut h = sha2::Sha256::new();
        h.update(self.pc_seed);
        h.update(self.pc_counter.to_be_bytes());
        let mut n = [0; 16];
        n.copy_from_slice(&h.finalize()[..16]);
        n
    }

    /// A and B of a call as the proxy reads them: user@host of its From and To URIs.
    pub(super) fn pc_parties(&self, caller: usize, number: u64) -> Option<(String, String)> {
        let username = &self.cfg.users.get(caller)?.username;
        let from = user_at_host(&format!("sip:{username}@{}", self.domain_of(caller)))?;
        let to = self.calls.get(&number)?.to.as_str();
        let to = to
            .trim_start_matches('<')
            .split('>')
            .next()
            .unwrap_or_default();
        Some((from, user_at_host(to)?))
    }

    /// Under `auth_reuse`, the response for the next counter of the user's verified chain,
    /// sent without waiting to be challenged.
    pub(super) fn pc_reused(
        &mut self,
        caller: usize,
        method: &'static str,
        number: u64,
    ) -> Option<(&'static str, String)> {
        if !self.cfg.auth_reuse || !self.pc_methods.contains(&method) {
            return None;
        }
        let (from, to) = self.pc_parties(caller, number)?;
        let username = &self.cfg.users.get(caller)?.username;
        let r = self
            .pc_chains
            .get_mut(&caller)?
            .next(username, from.as_bytes(), to.as_bytes())?;
        let name =
            digest::credentials_header(digest::challenge_status(method == "REGISTER")).as_str();
        Some((name, r.render()))
    }

    /// The Proxychain hello for a new request: the user and a fresh nonce.
    pub(super) fn pc_hello(
        &mut self,
        caller: usize,
        method: &str,
        number: u64,
    ) -> Option<(&'static str, String)> {
        let username = self.cfg.users.get(caller)?.username.clone();
        let n_ap = self.pc_nonce();
        self.calls.get_mut(&number)?.pc_nonce = n_ap;
        let hello = sip_core::proxychain::Hello { username, n_ap };
        let name =
            digest::credentials_header(digest::challenge_status(method == "REGISTER")).as_str();
        Some((name, hello.render()))
    }

    /// Answers a `PC` challenge: checks the network's proof, then reveals the next chain
    /// value (or starts over with a hello when the proxy asks for one).
    pub(super) fn answer_pc(&mut self, now_us: u64, number: u64, code: u16, value: &[u8]) {
        use sip_core::proxychain::{Authenticate, ClientChain};
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        let (caller, tries) = (call.caller, call.auth_tries);
        let method = call.stage.method();
        if !self.pc_methods.contains(&method) {
            self.pc_methods.push(method);
        }
        let (Some(user), Some(realm)) = (self.cfg.users.get(caller), &self.cfg.proxychain) else {
            self.finish(
                number,
                Some(&format!("{code} (no credentials: give --users)")),
            );
            return;
        };
        let username = user.username.clone();
        let challenge = match Authenticate::parse(value) {
            Ok(Authenticate::Challenge(c)) => Some(c),
            Ok(Authenticate::Hello { .. }) => None,
            Err(e) => {
                self.finish(
                    number,
                    Some(&format!("{code} with a bad PC challenge: {e}")),
                );
                return;
            }
        };
        // After a response, the hello challenge again means another call of the same user
        // spent the chain value first: start over, a few times.
        if tries >= PC_MAX_TRIES {
            self.finish(
                number,
                Some(&format!("{code} (Proxychain credentials refused)")),
            );
            return;
        }
        call.auth_tries += 1;
        call.cseq += 1;
        let Some(challenge) = challenge else {
            // The hello challenge: start over with a fresh nonce (and, if an answer given
            // ahead was refused, without the chain it came from).
            self.pc_chains.remove(&caller);
            self.send_request(now_us, number, None);
            return;
        };
        let password = user.password.clone();
        let key = *self
            .pc_keys
            .entry(caller)
            .or_insert_with(|| sip_core::proxychain::user_key(&username, realm, &password));
        let (Some((from, to)), Some(call)) =
            (self.pc_parties(caller, number), self.calls.get(&number))
        else {
            return;
        };
        let answered = ClientChain::answer(
            &key,
            &challenge,
            &call.pc_nonce,
            &username,
            from.as_bytes(),
            to.as_bytes(),
        );
        match answered {
            Ok((chain, r)) => {
                if self.cfg.auth_reuse {
                    self.pc_chains.insert(caller, chain);
                }
                let name = digest::credentials_header(code).as_str();
                self.send_request(now_us, number, Some((name, r.render())));
            }
            Err(e) => {
                // The network did not prove itself: never answer it.
                self.finish(number, Some(&format!("{code} refused: {e}")));
            }
        }
    }

    pub(super) fn answer_challenge(
        &mut self,
        now_us: u64,
        number: u64,
        code: u16,
        msg: &Message<'_>,
    ) {
        let Some(call) = self.calls.get_mut(&number) else {
            return;
        };
        let header = if code == 401 {
            HeaderName::WwwAuthenticate
        } else {
            HeaderName::ProxyAuthenticate
        };
        if self.cfg.proxychain.is_some() {
            if let Some(v) = msg
                .headers_named(header)
                .map(|h| msg.value(h))
                .find(|v| v.trim_ascii_start().starts_with(b"PC"))
            {
                let v = v.to_vec();
                self.answer_pc(now_us, number, code, &v);
                return;
            }
        }
        let (caller, tries, cseq) = (call.caller, call.auth_tries, call.cseq);
        let cnonce = format!("{:x}{number:x}{}", self.cfg.epoch, tries + 1);
        let method = call.stage.method();
        let uri = call.current_uri().to_string();
        match self.digest_answer(code, msg, caller, tries, method, &uri, &cnonce) {
            Ok((name, value, c)) => {
                if let Some(call) = self.calls.get_mut(&number) {
                    call.auth_tries = tries + 1;
                    call.cseq = cseq + 1;
                }
                if self.cfg.auth_reuse {
                    self.nonces.insert((caller, code == 401), (c, 1));
                }
                self.send_request(now_us, number, Some((name, value)));
            }
            Err(reason) => self.finish(number, Some(&reason)),
        }
    }

    /// The digest credentials (header name and value, and the challenge they answer) for a
    /// 401 or 407 to `user`'s `method` request for `uri`, after `tries` answers already
    /// refused; or why there are none.
    #[allow(
        clippy::too_many_arguments,
        reason = "the request's fields, which the caller and the registrations keep differently"
    )]
    pub(super) fn digest_answer(
        &self,
        code: u16,
        msg: &Message<'_>,
        user: usize,
        tries: u8,
        method: &str,
        uri: &str,
        cnonce: &str,
    ) -> Result<(&'static str, String, Challenge), String> {
        let header = if code == 401 {
            HeaderName::WwwAuthenticate
        } else {
            HeaderName::ProxyAuthenticate
        };
        let challenge = msg.header_value(header).map(Challenge::parse);
        match (challenge, self.cfg.users.get(user)) {
            (None, _) => Err(format!("{code} without a challenge")),
            (Some(Err(e)), _) => Err(format!("{code} with a bad challenge: {e}")),
            (Some(Ok(_)), None) => Err(format!("{code} (no credentials: give --users)")),
            (Some(Ok(c)), Some(_)) if tries >= 1 && !(c.stale && tries < 2) => Err(format!(
                "{code} {} (credentials refused)",
                build::reason_phrase(code)
            )),
            (Some(Ok(c)), Some(u)) => {
                let value = c.authorization(&u.username, &u.password, method, uri, 1, cnonce);
                Ok((digest::credentials_header(code).as_str(), value, c))
            }
        }
    }
}

/// `user@host` of a SIP URI, as the proxy binds a Proxychain proof to the From and To
/// identities: the host as written, without port or parameters.
fn user_at_host(uri: &str) -> Option<String> {
    let u = Uri::parse(uri.as_bytes()).ok()?;
    Some(format!(
        "{}@{}",
        String::from_utf8_lossy(u.user.unwrap_or_default()),
        String::from_utf8_lossy(u.host)
    ))
}

#[cfg(test)]
mod tests {
    /// The proxy binds a Proxychain proof to user@host of From and To; a Request-URI with a
    /// port (the load's default: the server's address) must be bound the same way.
    #[test]
    fn parties_are_user_at_host_without_port_or_parameters() {
        let id = super::user_at_host;
        assert_eq!(
            id("sip:bob@127.0.0.1:35060;transport=udp").as_deref(),
            Some("bob@127.0.0.1")
        );
        assert_eq!(
            id("sip:alice@example.test").as_deref(),
            Some("alice@example.test")
        );
        assert_eq!(id("sip:[::1]:5060").as_deref(), Some("@[::1]"));
    }
}
