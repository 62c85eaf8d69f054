//! STIR/SHAKEN in a bench run (`--identity`): the started server signs every call's INVITE,
//! or verifies the INVITEs the load signs — with the signing certificate fetched once and
//! cached, or fetched for every call — so its CPU per call is read against the same proxy
//! without (issue 39's question). Made here for the run: a test STI-CA and a signing
//! certificate (`sipsec certs --shaken`), and the certificate repository the verifier fetches
//! from (`sipsec cert-server`, pinned beside the load, its CPU reported as a peer's).

use super::cpu;
use anyhow::{bail, Context, Result};
use sipsec_identity::{cert::Authority, sti};
use sipsec_load::LoadArgs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Where the bench's certificate repository listens.
const CERT_SERVER: &str = "127.0.0.1:35443";

/// The numbers the load calls from and to in an identity run: a token names telephone
/// numbers, and a SIP user that is none is neither signed nor verified.
pub(crate) const CALLER: &str = "+15551230000";
pub(crate) const CALLEE: &str = "+15557650000";

/// What the started server does with caller identity (`sipsec bench --identity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum IdentityMode {
    /// Nothing: no `[identity]`, the load's usual users.
    #[default]
    Off,
    /// No `[identity]`, calls between the telephone numbers the other modes use: their
    /// baseline, like for like.
    Unsigned,
    /// Signs every call's INVITE (an open proxy vouches for its callers: attestation C).
    Sign,
    /// Verifies every call's INVITE, signed by the load; the certificate is fetched once and
    /// kept for its max-age (an hour).
    Verify,
    /// Verifies as `verify`, keeping no certificate (`cert_max_ttl_s = 0`): a fetch per call,
    /// unless calls arrive while one is under way (they wait for it).
    VerifyFetch,
}

impl IdentityMode {
    /// Whether the load signs its INVITEs for the server to verify.
    fn verifies(self) -> bool {
        matches!(self, IdentityMode::Verify | IdentityMode::VerifyFetch)
    }
}

/// An identity run's set-up: the server's `[identity]` table, and the certificate repository
/// (stopped on drop).
pub(crate) struct Identity {
    /// The `[identity]` table of the started server's config.
    pub(crate) table: String,
    /// The repository's process (for its CPU, as a peer's).
    repository: Option<Child>,
}

impl Identity {
    /// Makes the STI certificates in `dir` (beside the TLS ones of `tls_dir`, which the
    /// repository serves with) and, where the server verifies, starts the repository pinned
    /// to `load_cpu`.
    pub(crate) fn start(
        mode: IdentityMode,
        dir: &Path,
        tls_dir: &Path,
        load_cpu: usize,
    ) -> Result<Self> {
        if matches!(mode, IdentityMode::Off | IdentityMode::Unsigned) {
            return Ok(Identity {
                table: String::new(),
                repository: None,
            });
        }
        sti::make(dir, &Authority::Codes(vec!["1234".into()]))?;
        let url = format!("https://{CERT_SERVER}/{}", sti::SHAKEN_CERT);
        if mode == IdentityMode::Sign {
            return Ok(Identity {
                table: format!(
                    "[identity]\nsign = true\nkey = \"{}\"\nx5u = \"{url}\"\n",
                    dir.join(sti::SHAKEN_KEY).display()
                ),
                repository: None,
            });
        }
        let keep = if mode == IdentityMode::VerifyFetch {
            "cert_ttl_s = 0\ncert_max_ttl_s = 0\n"
        } else {
            ""
        };
        let table = format!(
            "[identity]\nverify = true\nroots = \"{}\"\nfetch_allow = [\"127.0.0.1\"]\n\
             fetch_ca = \"{}\"\npolicy = \"reject\"\nrequire = true\n{keep}",
            dir.join(sti::STI_CA).display(),
            tls_dir.join(sipsec_transport::tls::certs::CA).display()
        );
        // The repository serves the signing certificate (from `dir`) over TLS with the
        // bench's server certificate (from `tls_dir`).
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("cert-server")
            .args(["--listen", CERT_SERVER, "--dir"])
            .arg(dir)
            .arg("--cert")
            .arg(tls_dir.join(sipsec_transport::tls::certs::SERVER))
            .arg("--key")
            .arg(tls_dir.join(sipsec_transport::tls::certs::SERVER_KEY))
            .args([
                "--max-age-s",
                if mode == IdentityMode::VerifyFetch {
                    "0"
                } else {
                    "3600"
                },
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: set_affinity makes only async-signal-safe calls between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || cpu::set_affinity(load_cpu));
        }
        let mut child = cmd.spawn().context("cannot start sipsec cert-server")?;
        let mut first = String::new();
        BufReader::new(child.stdout.take().context("no stdout")?)
            .read_line(&mut first)
            .context("reading the certificate server's banner")?;
        let repository = Identity {
            table,
            repository: Some(child),
        };
        if !first.starts_with("cert server on") {
            bail!("sipsec cert-server did not start (see its errors above)");
        }
        Ok(repository)
    }

    /// The repository's PID, where one runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.repository.as_ref().map(Child::id)
    }

    /// The load's options for `mode`: calls between two telephone numbers, and, where the
    /// server verifies, signed with the certificate's key.
    pub(crate) fn configure_load(mode: IdentityMode, dir: &Path, load: &mut LoadArgs) {
        if mode == IdentityMode::Off {
            return;
        }
        load.caller = CALLER.into();
        load.service = CALLEE.into();
        if mode.verifies() {
            load.identity_key = Some(dir.join(sti::SHAKEN_KEY));
            load.x5u = Some(format!("https://{CERT_SERVER}/{}", sti::SHAKEN_CERT));
        }
    }
}

impl Drop for Identity {
    fn drop(&mut self) {
        if let Some(child) = &mut self.repository {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
