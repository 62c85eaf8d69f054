//! `sipsec serve`, the I/O driver around the engine: it opens the database, loads
//! registrations, binds one socket per worker per listen address, runs the workers, logs its
//! counters on SIGUSR1, and on SIGINT/SIGTERM stops them and flushes every queued
//! registration to the database before exiting, so a restart loses nothing.
//!
//! - [`worker`]: one thread per core, its loop around one `Engine` (one path for every
//!   message, UDP or stream);
//! - [`connections`]: a worker's TCP and TLS listeners and connections;
//! - [`mailbox`]: how other threads reach a worker; [`token`]: its epoll tokens;
//! - `coalesce`: letting datagrams accumulate briefly under load; [`busy`]: the busy
//!   fraction overload control steers by;
//! - [`fetch`]: credential fetches off the workers' threads, and the user-database fetcher;
//!   [`authority`]: the Proxychain authority's channel; [`dns`]: DNS lookups (RFC 3263);
//!   [`certs`]: STIR/SHAKEN certificate fetches (`[identity] verify`);
//! - [`metrics`]: what `/metrics` exposes (`[metrics] listen`); [`reload`]: SIGHUP and
//!   `sipsec ctl reload`; [`control`]: the socket `sipsec ctl` talks to (`[control] socket`);
//! - `cluster`: with `[cluster]`, the other nodes' registrations in, and the heartbeat.

pub mod authority;
pub mod busy;
pub mod certs;
pub(crate) mod cluster;
pub(crate) mod coalesce;
pub mod connections;
pub mod control;
pub mod dns;
pub mod fetch;
pub mod mailbox;
pub mod metrics;
pub mod reload;
pub mod token;
pub mod worker;

use crate::config::{Config, Mode};
use crate::db::store::{self, Commits, Store};
use crate::engine::{Engine, Mail};
use crate::location::BindingChange;
use crate::stats;
use anyhow::{bail, Context, Result};
use connections::Connections;
use sipsec_transport::net::epoll::Epoll;
use sipsec_transport::net::transport::Transport;
use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use worker::{Parts, Worker};

/// With digest authentication: the credential cache, kept in step with the user database by
/// a task on the database runtime. Waits for the first load (up to 30 s) so a server that
/// says it is up can authenticate; without it, requests are answered 503 until it comes.
fn start_auth(
    cfg: &Config,
    runtime: &tokio::runtime::Runtime,
) -> Result<Option<Arc<crate::auth::digest::DigestShared>>> {
    use crate::auth::credentials::Credentials;
    if cfg.auth.scheme != crate::auth::Scheme::Digest {
        return Ok(None);
    }
    let credentials = Arc::new(Credentials::new(&cfg.auth.scope.realm));
    if !cfg.auth.credential_cache {
        // Every authentication queries the database (userdb::spawn_fetcher).
        let shared = crate::auth::digest::DigestShared::new(&cfg.auth, credentials)
            .context("cannot make a nonce secret")?;
        return Ok(Some(Arc::new(shared)));
    }
    runtime.spawn(crate::db::users::sync(
        cfg.database_url.clone(),
        credentials.clone(),
        Duration::from_secs(1),
    ));
    runtime.block_on(crate::db::users::wait_loaded(
        &credentials,
        Duration::from_secs(30),
    ));
    let shared = crate::auth::digest::DigestShared::new(&cfg.auth, credentials)
        .context("cannot make a nonce secret")?;
    Ok(Some(Arc::new(shared)))
}

/// With Proxychain: the chain cache the workers share, and the TLS client configuration of
/// the channel to the authority (this server's certificate is its identity there).
pub(crate) fn start_proxychain(
    cfg: &Config,
) -> Result<
    Option<(
        Arc<crate::auth::proxychain::PcShared>,
        Arc<rustls::ClientConfig>,
    )>,
> {
    let Some(pc) = &cfg.auth.proxychain else {
        return Ok(None);
    };
    let (Some(cert), Some(key), Some(ca)) = (&cfg.tls.cert, &cfg.tls.key, &cfg.tls.ca) else {
        bail!(
            "auth: proxychain needs tls.cert and tls.key (this proxy's identity at the \
             authority) and tls.ca (to verify the authority)"
        );
    };
    let tls = sipsec_transport::tls::client_config(&sipsec_transport::tls::ClientSide {
        ca: Some(ca.clone()),
        no_verify: false,
        identity: Some((cert.clone(), key.clone())),
        protocol: sipsec_transport::tls::Protocol::default(),
    })
    .context("the authority channel's TLS")?;
    let shared = Arc::new(crate::auth::proxychain::PcShared::new(pc.clone()));
    Ok(Some((shared, tls)))
}

/// Runs the server with `cfg`, read from `path` (which SIGHUP reads again) if from a file.
pub fn run(mut cfg: Config, path: Option<std::path::PathBuf>) -> Result<()> {
    sipsec_transport::net::raise_fd_limit();
    cfg.host_addrs = sipsec_transport::net::names::host_addresses();
    let fd_limit = sipsec_transport::net::fd_limit();
    if let Some((configured, effective)) = connections::fit_to_descriptors(&mut cfg, fd_limit) {
        tracing::info!(
            "server.max_connections lowered from {configured} to {effective} (and \
             max_connections_per_ip to {} per worker): the open-file limit is {}, and \
             descriptors are kept for the listeners, database, metrics and control socket",
            cfg.streams.max_per_ip_per_worker,
            fd_limit.unwrap_or_default()
        );
    }
    let cfg = Arc::new(cfg);
    let (tls_server, tls_client) = reload::tls(&cfg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sipsec-store")
        .enable_all()
        .build()
        .context("cannot start the database runtime")?;
    claim_addresses(&cfg.listen)?;
    let started = Instant::now();
    let epoch_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let (store, loaded) = runtime.block_on(async {
        // Write-behind answers before it commits, so its commits need not wait for the disk
        // either; a durable 200 OK waits for one that has.
        let commits = if cfg.registrar.durable {
            Commits::Synced
        } else {
            Commits::Buffered
        };
        let mut store = Store::connect_with(&cfg.database_url, commits).await?;
        if let Some(c) = &cfg.cluster {
            cluster::claim_name(&store, c).await?;
            store = store.in_cluster(c.node.clone());
        }
        let loaded = store
            .load(epoch_unix_ms, cfg.registrar.max_bindings)
            .await
            .context("cannot load registrations")?;
        if loaded.bindings.len() >= cfg.registrar.max_bindings {
            tracing::warn!(
                "loaded the {} registrations that live longest: registrar.max_bindings",
                loaded.bindings.len()
            );
        }
        anyhow::Ok((store, loaded))
    })?;
    let mut senders = Vec::new();
    let mut mailboxes = Vec::new();
    for _ in 0..cfg.workers {
        let (tx, rx) = mailbox::mailbox().context("cannot create a worker mailbox")?;
        senders.push(tx);
        mailboxes.push(rx);
    }
    // Durable registration: each commit releases the 200s waiting for it.
    let on_saved = cfg.registrar.durable.then(|| {
        let workers = senders.clone();
        Box::new(move |worker: usize, count| {
            if let Some(w) = workers.get(worker) {
                w.send(Mail::Saved { count });
            }
        }) as store::OnSaved
    });
    let store = store::spawn_writer(store, &cfg.database_url, &runtime, on_saved);
    if let Some(c) = &cfg.cluster {
        cluster::spawn(
            &runtime,
            c.clone(),
            cfg.database_url.clone(),
            senders.clone(),
        );
    }
    let auth = start_auth(&cfg, &runtime)?;
    let proxychain = start_proxychain(&cfg)?;
    let signing = start_signing(&cfg)?;
    if let Some(sign) = &cfg.identity.sign {
        tracing::info!(
            "STIR/SHAKEN: signing our callers' INVITEs (certificate at {})",
            sign.x5u
        );
    }

    let signals = crate::signals::Signals::install()?;
    let control = match &cfg.control_socket {
        Some(p) => Some(control::Control::bind(runtime.handle(), p)?),
        None => None,
    };
    let channel_stats = Arc::new(authority::ChannelStats::default());
    let fetcher = match (&proxychain, &auth) {
        (Some((shared, tls)), _) => Some(authority::spawn(
            &runtime,
            shared.clone(),
            tls.clone(),
            senders.clone(),
            channel_stats.clone(),
        )),
        (None, Some(shared)) if !cfg.auth.credential_cache => Some(fetch::spawn_user_fetcher(
            &runtime,
            cfg.database_url.clone(),
            cfg.auth.scope.realm.clone(),
            shared.clone(),
            senders.clone(),
        )),
        _ => None,
    };
    let resolver = dns::spawn(&runtime, dns::settings(&cfg), senders.clone());
    let verifying = fetch_settings(&cfg)?.map(|(settings, entries)| {
        (
            certs::spawn(&runtime, settings, senders.clone()),
            Arc::new(crate::engine::ReplayTable::new(entries)),
        )
    });
    let common = Common {
        cfg: &cfg,
        tls_server: &tls_server,
        tls_client: &tls_client,
        digest: &auth,
        proxychain: proxychain.as_ref().map(|(shared, _)| shared),
        signing: &signing,
        verifying: &verifying,
        loaded: &loaded,
        epoch_unix_ms,
        started,
        mailboxes: &senders,
        store: &store,
        fetcher: &fetcher,
        resolver: &resolver,
        shutdown: &signals.stop,
    };
    let mut all_stats = Vec::new();
    let mut workers = Vec::new();
    for (index, mailbox) in mailboxes.into_iter().enumerate() {
        let stats = Arc::new(stats::Stats::default());
        all_stats.push(stats.clone());
        workers.push(common.worker(index, mailbox, stats)?);
    }
    if let Some(addr) = cfg.metrics_listen {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(metrics::ServeMetrics {
            workers: all_stats.clone(),
            scheme: cfg.auth.scheme.name(),
            tls: tls_server.is_some() || tls_client.is_some(),
            shedding: cfg.overload.enabled,
        }));
        let bound = crate::metrics::serve(runtime.handle(), addr, registry)?;
        tracing::info!("metrics at http://{bound}/metrics");
    }
    let handles: Vec<_> = workers
        .into_iter()
        .map(|w| {
            std::thread::Builder::new()
                .name(format!("sipsec-worker-{}", w.index()))
                .spawn(move || w.run())
        })
        .collect::<Result<_, _>>()
        .context("cannot start worker threads")?;

    let listens: Vec<String> = cfg.listen.iter().map(ToString::to_string).collect();
    let role = match (cfg.mode, cfg.stateful) {
        (Mode::Redirect, _) => "redirect server",
        (Mode::Proxy, true) => "stateful proxy",
        (Mode::Proxy, false) => "stateless proxy",
        (Mode::Dispatcher, true) => "stateful dispatcher",
        (Mode::Dispatcher, false) => "stateless dispatcher",
    };
    let node = cfg
        .cluster
        .as_ref()
        .map(|c| format!("cluster node {} at {}; ", c.node, c.advertise))
        .unwrap_or_default();
    println!(
        "sipsec listening on {} ({role} and registrar for {}; {} worker{}; {node}database {}; {} registrations loaded)",
        listens.join(", "),
        cfg.domains.join(", "),
        cfg.workers,
        if cfg.workers == 1 { "" } else { "s" },
        store::redacted(&cfg.database_url),
        loaded.bindings.len(),
    );
    let _ = std::io::stdout().flush();

    let totals = || -> Vec<String> {
        stats::total(&all_stats)
            .into_iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    };
    let mut running = cfg.clone();
    let mut reload = |by: &str| -> control::Reply {
        let Some(p) = &path else {
            let why = "the server runs on its embedded defaults (no --config): nothing to reload";
            tracing::warn!("{by}: {why}");
            return Err(why.into());
        };
        match reload::reload(p, &running, &senders, &resolver) {
            Ok(new) => {
                running = new;
                tracing::info!("{by}: {} reloaded", p.display());
                Ok(format!("{} reloaded", p.display()))
            }
            Err(e) => {
                let why = format!("reload refused, the running configuration is unchanged: {e:#}");
                tracing::error!("{by}: {why}");
                Err(why)
            }
        }
    };
    while !signals.stopping() {
        std::thread::sleep(Duration::from_millis(50));
        signals.poll(
            || report_counters(&totals()),
            || {
                let _ = reload("SIGHUP");
            },
        );
        while let Some(request) = control.as_ref().and_then(control::Control::next) {
            let reply = match request.command {
                control::Command::Reload => reload("sipsec ctl"),
                control::Command::Counters => Ok(stats::total(&all_stats)
                    .into_iter()
                    .map(|(k, v)| format!("{k} {v}\n"))
                    .collect()),
                control::Command::Bindings => {
                    // The first worker answers from its replica, which holds every binding.
                    senders[0].send(mailbox::Letter::Bindings(request));
                    continue;
                }
            };
            request.answer(reply);
        }
    }
    drop(control);
    tracing::info!("shutting down");
    for h in handles {
        let _ = h.join();
    }
    store.flush_blocking();
    let totals = totals();
    if let Some((shared, _)) = &proxychain {
        let c = &channel_stats;
        let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
        tracing::info!(
            "authority channel: {} requests, {} bytes out, {} bytes in; {} chains cached",
            load(&c.requests),
            load(&c.bytes_out),
            load(&c.bytes_in),
            shared.cache.len()
        );
    }
    if totals.is_empty() {
        tracing::info!("stopped (no traffic)");
    } else {
        tracing::info!("stopped; {}", totals.join(" "));
    }
    Ok(())
}

/// STIR/SHAKEN's signing key (`[identity] sign`), loaded once for every worker, and the
/// `origid` this server signs with (a UUID made at start).
pub(crate) fn start_signing(
    cfg: &Config,
) -> Result<Option<(Arc<sipsec_identity::SigningKey>, Arc<str>)>> {
    let Some(sign) = &cfg.identity.sign else {
        return Ok(None);
    };
    let pem = std::fs::read(&sign.key)
        .with_context(|| format!("identity.key: cannot read {}", sign.key.display()))?;
    let key = sipsec_identity::SigningKey::from_pem(&pem, &sign.x5u)
        .with_context(|| format!("identity.key: {}", sign.key.display()))?;
    Ok(Some((
        Arc::new(key),
        sipsec_identity::passport::new_origid().into(),
    )))
}

/// STIR/SHAKEN's verification service (`[identity] verify`): the fetcher's settings — the
/// STI-CA roots, the HTTPS client (the system's CAs and `fetch_ca`), the allow-list and the
/// limits — and how many tokens the replay table holds.
pub(crate) fn fetch_settings(cfg: &Config) -> Result<Option<(certs::FetchSettings, usize)>> {
    let Some(v) = &cfg.identity.verify else {
        return Ok(None);
    };
    let pem = std::fs::read(&v.roots)
        .with_context(|| format!("identity.roots: cannot read {}", v.roots.display()))?;
    let roots = sipsec_identity::Roots::from_pem(&pem)
        .with_context(|| format!("identity.roots: {}", v.roots.display()))?;
    let allow = sipsec_identity::fetch::Allow::new(&v.fetch_allow)
        .map_err(|e| anyhow::anyhow!("identity.fetch_allow: {e}"))?;
    let mut store = rustls::RootCertStore::empty();
    // The system's CAs, where Debian keeps them: x5u URLs are public HTTPS servers.
    let system = std::path::Path::new("/etc/ssl/certs/ca-certificates.crt");
    let mut files: Vec<&std::path::Path> = Vec::new();
    if system.exists() {
        files.push(system);
    }
    if let Some(ca) = &v.fetch_ca {
        files.push(ca);
    }
    for file in files {
        use rustls::pki_types::pem::PemObject;
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(file)
            .with_context(|| format!("identity.fetch_ca: cannot read {}", file.display()))?;
        for cert in certs.flatten() {
            // A CA the TLS library cannot use is skipped, as browsers skip it.
            let _ = store.add(cert);
        }
    }
    if store.is_empty() {
        bail!(
            "identity.verify: no CA to check certificate servers with (no {} and no \
             identity.fetch_ca)",
            system.display()
        );
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS for certificate fetches")?
        .with_root_certificates(store)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    if allow.is_empty() {
        tracing::warn!(
            "identity.verify with an empty identity.fetch_allow: no certificate can be \
             fetched, so every Identity fails (436)"
        );
    }
    Ok(Some((
        certs::FetchSettings {
            allow,
            roots: Arc::new(roots),
            tls: Arc::new(tls),
            timeout: Duration::from_millis(v.fetch_timeout_ms),
            max_bytes: v.fetch_max_bytes,
            concurrency: v.fetch_concurrency,
            default_ttl_s: v.cert_ttl_s,
            max_ttl_s: v.cert_max_ttl_s,
            failure_ttl_s: v.cert_failure_ttl_s,
        },
        v.replay_entries,
    )))
}

/// Logs the counters SIGUSR1 asked for (`counters; name=value ...`, the line `sipsec bench`
/// reads). Never inlined, so that `valgrind --tool=callgrind --dump-before=*report_counters*`
/// (`bench --instructions`) can cut the server's instruction count at each report, without
/// `callgrind_control`, whose `vgdb` cannot always reach a process blocked in `epoll_wait`.
#[inline(never)]
fn report_counters(totals: &[String]) {
    tracing::info!("counters; {}", totals.join(" "));
}

/// What every worker is made with.
struct Common<'a> {
    cfg: &'a Arc<Config>,
    tls_server: &'a Option<sipsec_transport::tls::ServerTls>,
    tls_client: &'a Option<sipsec_transport::tls::ClientTls>,
    digest: &'a Option<Arc<crate::auth::digest::DigestShared>>,
    proxychain: Option<&'a Arc<crate::auth::proxychain::PcShared>>,
    signing: &'a Option<(Arc<sipsec_identity::SigningKey>, Arc<str>)>,
    verifying: &'a Option<(certs::CertHandle, Arc<crate::engine::ReplayTable>)>,
    loaded: &'a store::Loaded,
    epoch_unix_ms: u64,
    started: Instant,
    mailboxes: &'a [mailbox::MailboxSender],
    store: &'a store::StoreHandle,
    fetcher: &'a Option<fetch::FetchHandle>,
    resolver: &'a dns::LookupHandle,
    shutdown: &'a Arc<std::sync::atomic::AtomicBool>,
}

impl Common<'_> {
    /// Worker `index`: its sockets bound (SO_REUSEPORT, one per worker per address), its
    /// connection table, and its engine with authentication on and the registrations loaded.
    fn worker(
        &self,
        index: usize,
        mailbox: mailbox::Mailbox,
        stats: Arc<stats::Stats>,
    ) -> Result<Worker> {
        let cfg = self.cfg;
        let mut sockets = Vec::new();
        let mut listeners = Vec::new();
        for l in &cfg.listen {
            match l.transport {
                Transport::Udp => sockets.push(
                    sipsec_transport::net::udp::bind_reuseport(l.addr)
                        .with_context(|| format!("cannot listen on {l}"))?,
                ),
                t => listeners.push((
                    t,
                    connections::listen_reuseport(l.addr)
                        .with_context(|| format!("cannot listen on {l}"))?,
                )),
            }
        }
        let epoll = Epoll::new().context("cannot create an epoll set")?;
        let connections = Connections::new(
            index,
            cfg.streams.clone(),
            cfg.max_message_size,
            listeners,
            self.tls_server.clone(),
            self.tls_client.clone(),
            stats.clone(),
            &epoll,
        )
        .context("cannot watch the stream listeners")?;
        let mut engine = Engine::new(cfg.clone(), index, self.epoch_unix_ms, stats);
        if let Some(shared) = self.digest {
            engine.enable_auth(shared.clone());
        }
        if let Some(shared) = self.proxychain {
            engine.enable_proxychain(shared.clone());
        }
        if let Some((key, origid)) = self.signing {
            engine.enable_identity(key.clone(), origid.clone());
        }
        if let Some((_, replays)) = self.verifying {
            engine.enable_verify(replays.clone());
        }
        for aor in &self.loaded.known_aors {
            engine.know_aor(aor);
        }
        for (aor, binding) in &self.loaded.bindings {
            engine.preload(&BindingChange::Upsert {
                aor: aor.as_str().into(),
                binding: binding.clone(),
            });
        }
        Worker::new(Parts {
            index,
            engine,
            sockets,
            connections,
            epoll,
            mailbox,
            workers: self.mailboxes.to_vec(),
            store: Some(self.store.clone()),
            fetcher: self.fetcher.clone(),
            resolver: Some(self.resolver.clone()),
            certs: self.verifying.as_ref().map(|(handle, _)| handle.clone()),
            coalescer: coalesce::Coalescer::new(Duration::from_micros(cfg.max_batch_delay_us)),
            flood: crate::flood::Flood::new(&cfg.flood, 0),
            shutdown: self.shutdown.clone(),
            started: self.started,
        })
        .context("cannot watch the worker's sockets")
    }
}

/// Refuses to start on an address another process already serves. The workers' sockets use
/// SO_REUSEPORT, which would otherwise let a second server silently share the port (and split
/// traffic and registrations between two databases): a probe bound without it fails when the
/// address is taken, whoever holds it.
fn claim_addresses(listen: &[crate::config::Listen]) -> Result<()> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    for l in listen.iter().filter(|l| l.addr.port() != 0) {
        let (kind, protocol) = match l.transport {
            Transport::Udp => (Type::DGRAM, Protocol::UDP),
            _ => (Type::STREAM, Protocol::TCP),
        };
        let probe = Socket::new(Domain::for_address(l.addr), kind, Some(protocol))
            .context("cannot create a socket")?;
        if l.transport.reliable() {
            // Connections of an earlier run in TIME_WAIT do not hold the address.
            probe.set_reuse_address(true)?;
        }
        if let Err(e) = probe.bind(&SockAddr::from(l.addr)) {
            let holder = holder(l.transport, l.addr.port())
                .map(|h| format!(" by {h}"))
                .unwrap_or_default();
            bail!("cannot listen on {l}: the address is already in use{holder} ({e})");
        }
    }
    Ok(())
}

/// The process holding a socket on `port` (listening, for TCP), from /proc: "pid N (name)".
/// Best effort: None when /proc does not say (another user's process, another namespace).
fn holder(transport: Transport, port: u16) -> Option<String> {
    let tables: &[&str] = match transport {
        Transport::Udp => &["/proc/net/udp", "/proc/net/udp6"],
        _ => &["/proc/net/tcp", "/proc/net/tcp6"],
    };
    let mut inodes = Vec::new();
    for table in tables {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            let listening = transport == Transport::Udp || f.get(3) == Some(&"0A");
            if local_port == Some(port) && listening {
                inodes.extend(f.get(9).map(|i| format!("socket:[{i}]")));
            }
        }
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            if inodes.iter().any(|i| target.as_os_str() == i.as_str()) {
                let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
                return Some(format!("pid {pid} ({})", name.trim()));
            }
        }
    }
    None
}
