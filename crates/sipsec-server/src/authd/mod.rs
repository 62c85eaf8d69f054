//! `sipsec authd`: Proxychain's central authentication service (seed 001; the protocol in
//! `docs/proxychain.md`). It holds each user's key k_AD (from the user database that `sipsec
//! users` fills, kept in memory and in step with it), issues hash-chain credentials to proxies
//! over mutually authenticated TLS, pushes revocations when a user's key changes, refuses
//! revoked proxies, and writes backup credentials for outages.
//!
//! - [`authority`]: issuing, chain length under load, who holds what;
//! - [`server`]: the TLS listener and the per-proxy connections.
//!
//! What the proxy shares with it lives with the proxy's side of Proxychain:
//! [`crate::auth::proxychain::wire`] (the channel's messages, also the backup file's records)
//! and [`crate::auth::proxychain::backup`] (backup-credential files). The proxy's end of the
//! channel is [`crate::serve::authority`]; the lab's delay relay is `bench::relay`.

pub mod authority;
pub mod server;

use crate::auth::credentials::Credentials;
use crate::auth::proxychain::{backup, wire};
use crate::db::store::Store;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use sip_core::proxychain::HashKind;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `sipsec authd` options.
#[derive(clap::Args, Debug)]
pub struct AuthdArgs {
    /// TOML configuration (`[authd]` table); without it, the defaults: 127.0.0.1:5070, realm
    /// localhost, the database and certificates `sipsec serve` and `sipsec certs` use.
    #[arg(long, short, global = true)]
    pub config: Option<PathBuf>,
    /// Load and validate the configuration (its TLS files too), print what the authority
    /// would listen on, and exit: 0 when it is good, 1 with the offending key when not.
    /// Binds nothing, opens no database, creates no file.
    #[arg(long)]
    pub check: bool,
    /// Something else to do than run the authority.
    #[command(subcommand)]
    pub command: Option<AuthdCommand>,
}

/// `sipsec authd`'s subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum AuthdCommand {
    /// Write backup credentials for one proxy: a long chain with no expiry per user.
    Backup {
        /// The proxy's identifier (its certificate's common name).
        #[arg(long)]
        proxy: String,
        /// Chain length: how many authentications each user gets through an outage.
        #[arg(long, default_value_t = 1000)]
        length: u32,
        /// The file to write the credentials to (the proxy's `[auth] backup`).
        #[arg(long)]
        out: PathBuf,
    },
    /// Refuse a proxy from now on (compromised): running authorities cut it off within a
    /// second.
    RevokeProxy {
        /// The proxy's identifier (its certificate's common name).
        name: String,
    },
    /// Accept a revoked proxy again.
    AllowProxy {
        /// The proxy's identifier (its certificate's common name).
        name: String,
    },
}

/// The `[authd]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthdConfig {
    /// The address the authority listens on, TLS only (`listen`, default 127.0.0.1:5070).
    pub listen: SocketAddr,
    /// The users' realm (the one `sipsec users` stores them under).
    pub realm: String,
    /// The user database `sipsec users` writes (`database`, default `sqlite://sipsec.db`).
    pub database: String,
    /// The authority's certificate chain (PEM, `cert`); its proxies verify it.
    pub cert: PathBuf,
    /// The private key of `cert` (PEM, `key`).
    pub key: PathBuf,
    /// CA that signs the proxies' certificates.
    pub ca: PathBuf,
    /// The hash of the chains issued when a proxy names none: `MD5` or `SHA-256` (`hash`, default
    /// SHA-256).
    pub hash: String,
    /// The chain length issued when a proxy names none and the authority is not busy
    /// (`chain_length`, default 10).
    pub chain_length: u32,
    /// The longest chain issued, whether a proxy asks for it or load grows one
    /// (`max_chain_length`, default 100).
    pub max_chain_length: u32,
    /// Issues per second above which chains grow longer, in proportion (`busy_issues_per_s`;
    /// default 0: never).
    pub busy_issues_per_s: u64,
    pub(crate) credential_lifetime_s: u64,
}

impl Default for AuthdConfig {
    fn default() -> Self {
        AuthdConfig {
            listen: "127.0.0.1:5070".parse().expect("valid"),
            realm: "localhost".into(),
            database: "sqlite://sipsec.db".into(),
            cert: "certs/server.pem".into(),
            key: "certs/server-key.pem".into(),
            ca: "certs/ca.pem".into(),
            hash: "SHA-256".into(),
            chain_length: 10,
            max_chain_length: 100,
            busy_issues_per_s: 0,
            credential_lifetime_s: 3600,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    authd: AuthdConfig,
    #[serde(default)]
    metrics: MetricsTable,
}

/// `[metrics]`, as in `sipsec serve`'s file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsTable {
    /// Where Prometheus metrics are served, if anywhere.
    pub listen: Option<SocketAddr>,
}

impl AuthdConfig {
    /// Reads the `[authd]` and `[metrics]` tables of `path` (the defaults without one) and
    /// validates them; relative paths are taken from the file's directory.
    pub fn load(path: Option<&std::path::Path>) -> Result<(AuthdConfig, MetricsTable)> {
        let (cfg, metrics) = match path {
            Some(p) => {
                let text = crate::config::read_file(p)?;
                let file =
                    toml::from_str::<File>(&text).with_context(|| format!("{}", p.display()))?;
                let mut cfg = file.authd;
                // Relative paths in the file mean relative to the file.
                let base = p.parent().unwrap_or(std::path::Path::new(""));
                cfg.database = crate::config::resolve_relative(&cfg.database, base);
                for p in [&mut cfg.cert, &mut cfg.key, &mut cfg.ca] {
                    *p = base.join(&*p);
                }
                (cfg, file.metrics)
            }
            None => (AuthdConfig::default(), MetricsTable::default()),
        };
        cfg.policy()?;
        Ok((cfg, metrics))
    }

    /// The authority's settings, validated: the hash known, the lengths within
    /// [`sip_core::proxychain::MAX_COUNTER`].
    pub fn policy(&self) -> Result<authority::Policy> {
        let hash = HashKind::from_token(self.hash.as_bytes())
            .with_context(|| format!("authd.hash: {:?} is not MD5 or SHA-256", self.hash))?;
        let max = sip_core::proxychain::MAX_COUNTER;
        if self.chain_length == 0 || self.chain_length > max {
            bail!("authd.chain_length must be 1 to {max}");
        }
        if self.max_chain_length > max {
            bail!("authd.max_chain_length must be at most {max}");
        }
        Ok(authority::Policy {
            hash,
            chain_length: self.chain_length,
            max_chain_length: self.max_chain_length.max(self.chain_length),
            busy_issues_per_s: self.busy_issues_per_s,
            lifetime_s: self.credential_lifetime_s,
        })
    }
}

/// `sipsec authd`.
pub fn run(args: AuthdArgs) -> Result<()> {
    let (cfg, metrics) = AuthdConfig::load(args.config.as_deref())?;
    // Every proxy connection, and every connection still handshaking, is a descriptor.
    sipsec_transport::net::raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match args.command {
            None => serve(cfg, metrics).await,
            Some(AuthdCommand::RevokeProxy { name }) => {
                let store = Store::connect(&cfg.database).await?;
                store.set_proxy_revoked(&name, true).await?;
                println!("proxy {name} revoked");
                Ok(())
            }
            Some(AuthdCommand::AllowProxy { name }) => {
                let store = Store::connect(&cfg.database).await?;
                store.set_proxy_revoked(&name, false).await?;
                println!("proxy {name} allowed");
                Ok(())
            }
            Some(AuthdCommand::Backup { proxy, length, out }) => {
                let policy = cfg.policy()?;
                if length == 0 || length > sip_core::proxychain::MAX_COUNTER {
                    bail!(
                        "--length must be 1 to {}",
                        sip_core::proxychain::MAX_COUNTER
                    );
                }
                let store = Store::connect(&cfg.database).await?;
                let keys = store.user_keys(&cfg.realm).await?;
                let n = tokio::task::spawn_blocking(move || {
                    backup::write(&out, &proxy, &keys, |key| {
                        authority::issue_fresh(policy.hash, key, &proxy, length)
                    })
                    .map(|n| (n, out, proxy))
                })
                .await??;
                println!(
                    "{} backup credentials of length {length} for proxy {} written to {}",
                    n.0,
                    n.2,
                    n.1.display()
                );
                Ok(())
            }
        }
    })
}

/// The authority's TLS: its certificate, and proxies' certificates required and checked
/// against its CA.
pub fn tls(cfg: &AuthdConfig) -> Result<Arc<rustls::ServerConfig>> {
    sipsec_transport::tls::server_config(&sipsec_transport::tls::ServerSide {
        cert: cfg.cert.clone(),
        key: cfg.key.clone(),
        ca: Some(cfg.ca.clone()),
        client_auth: sipsec_transport::tls::ClientAuth::Required,
        protocol: sipsec_transport::tls::Protocol::default(),
    })
    .context("authd TLS")
}

/// Runs the authority until the process is stopped.
async fn serve(cfg: AuthdConfig, metrics: MetricsTable) -> Result<()> {
    let policy = cfg.policy()?;
    let tls = tls(&cfg)?;
    // Fail early on a database that cannot be opened or migrated.
    let store = Store::connect(&cfg.database).await?;
    let users = Arc::new(Credentials::new(&cfg.realm));
    let authority = Arc::new(authority::Authority::new(policy, users.clone()));
    let registry = Arc::new(server::Registry::default());
    registry.set_revoked(store.revoked_proxies().await?);

    let (changed_tx, mut changed) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(crate::db::users::sync_notifying(
        cfg.database.clone(),
        users.clone(),
        Duration::from_secs(1),
        Some(changed_tx),
    ));
    // Proxies are served only once the users are in: a chain asked for earlier would be
    // refused as unavailable.
    crate::db::users::wait_loaded(&users, Duration::from_secs(30)).await;
    // Key changes: void every chain issued for the user.
    let (a, r) = (authority.clone(), registry.clone());
    tokio::spawn(async move {
        while let Some(user) = changed.recv().await {
            let line = wire::line(&wire::Reply::Revoke { user: user.clone() });
            for proxy in a.take_holders(&user) {
                if r.send(&proxy, &line) {
                    a.stats
                        .revocations_pushed
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::info!(%user, %proxy, "revocation pushed");
                }
            }
        }
    });
    // Revoked proxies, polled like the users.
    let (a, r) = (authority.clone(), registry.clone());
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match store.revoked_proxies().await {
                Ok(set) => {
                    for p in r.set_revoked(set) {
                        a.forget_proxy(&p);
                        tracing::warn!(proxy = %p, "proxy revoked");
                    }
                }
                Err(e) => tracing::debug!("revoked proxies not read: {e:#}"),
            }
        }
    });
    if let Some(addr) = metrics.listen {
        let mut exposed = prometheus_client::registry::Registry::default();
        exposed.register_collector(Box::new(AuthdMetrics {
            authority: authority.clone(),
            proxies: registry.clone(),
        }));
        let handle = tokio::runtime::Handle::current();
        let bound = crate::metrics::serve(&handle, addr, exposed)?;
        tracing::info!("metrics at http://{bound}/metrics");
    }
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    println!(
        "sipsec authd listening on tls:{} (realm {}, {} chains of {}, database {})",
        listener.local_addr()?,
        cfg.realm,
        cfg.hash,
        cfg.chain_length,
        crate::db::store::redacted(&cfg.database)
    );
    // SIGUSR1 logs the counters without stopping, so a lab can difference two readings.
    let signals = crate::signals::Signals::install()?;
    let stats = authority.clone();
    let stopped = async {
        while !signals.stopping() {
            signals.poll(
                || log_counters("counters", &stats.stats),
                || {
                    tracing::warn!(
                        "SIGHUP: the authority reloads users and revoked proxies by itself \
                         (every second); its own settings need a restart"
                    );
                },
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        r = server::run(listener, tls, authority.clone(), registry) => r?,
        _ = stopped => {}
    }
    log_counters("stopped", &authority.stats);
    Ok(())
}

/// What `sipsec authd` exposes at `/metrics`.
#[derive(Clone)]
struct AuthdMetrics {
    authority: Arc<authority::Authority>,
    proxies: Arc<server::Registry>,
}

impl std::fmt::Debug for AuthdMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthdMetrics")
    }
}

impl prometheus_client::collector::Collector for AuthdMetrics {
    fn encode(
        &self,
        mut enc: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        let w = &mut crate::metrics::Writer { enc: &mut enc };
        for c in self.authority.stats.report() {
            w.counter(c.metric, c.help, c.value)?;
        }
        w.gauge(
            "sipsec_authd_proxies_connected",
            "Proxies with a connection open",
            self.proxies.connected() as f64,
        )?;
        w.gauge(
            "sipsec_authd_users",
            "Users whose keys the authority holds",
            self.authority.users.len() as f64,
        )?;
        Ok(())
    }
}

/// One log line with every counter, in the `name=value` form the lab scripts read.
fn log_counters(event: &str, s: &authority::AuthorityStats) {
    let counters: Vec<String> = s
        .report()
        .iter()
        .map(|c| format!("{}={}", c.log, c.value))
        .collect();
    tracing::info!("{event}; {}", counters.join(" "));
}
