//! `sipsec serve`: opens the database, loads registrations, binds one socket per worker per
//! listen address, runs the workers, and on SIGINT/SIGTERM stops them and flushes every
//! queued registration to the database before exiting, so a restart loses nothing.

use crate::config::{Config, Mode};
use crate::engine::{stats, Engine};
use crate::location::BindingChange;
use crate::store::{self, Store};
use crate::worker::{self, Worker};
use anyhow::{Context, Result};
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub fn run(cfg: Config) -> Result<()> {
    if let Some(l) = cfg.listen.iter().find(|l| l.transport.reliable()) {
        // The engine routes by transport already; the workers' stream driver is next.
        anyhow::bail!(
            "server.listen: {l}: TCP and TLS listeners are not served yet (the engine is ready; \
             the connection driver is in progress); use udp"
        );
    }
    let cfg = Arc::new(cfg);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sipsec-store")
        .enable_all()
        .build()
        .context("cannot start the database runtime")?;
    let started = Instant::now();
    let epoch_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let (store, loaded) = runtime.block_on(async {
        let store = Store::connect(&cfg.database_url).await?;
        let loaded = store
            .load(epoch_unix_ms)
            .await
            .context("cannot load registrations")?;
        anyhow::Ok((store, loaded))
    })?;
    let store = store::spawn_writer(store, &runtime);

    let shutdown = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, shutdown.clone())
            .context("cannot install signal handlers")?;
    }

    let mut senders = Vec::new();
    let mut mailboxes = Vec::new();
    for _ in 0..cfg.workers {
        let (tx, rx) = worker::mailbox().context("cannot create a worker mailbox")?;
        senders.push(tx);
        mailboxes.push(rx);
    }
    let mut all_stats = Vec::new();
    let mut workers = Vec::new();
    for (index, mailbox) in mailboxes.into_iter().enumerate() {
        let mut sockets = Vec::new();
        for l in &cfg.listen {
            sockets.push(
                crate::udp::bind_reuseport(l.addr)
                    .with_context(|| format!("cannot listen on {l}"))?,
            );
        }
        let worker_stats = Arc::new(stats::Stats::default());
        all_stats.push(worker_stats.clone());
        let mut engine = Engine::new(cfg.clone(), index, epoch_unix_ms, worker_stats);
        for aor in &loaded.known_aors {
            engine.know_aor(aor);
        }
        for (aor, binding) in &loaded.bindings {
            engine.preload(&BindingChange::Upsert {
                aor: aor.as_str().into(),
                binding: binding.clone(),
            });
        }
        workers.push(Worker {
            engine,
            sockets,
            mailbox,
            peers: senders.clone(),
            store: Some(store.clone()),
            shutdown: shutdown.clone(),
            started,
            index,
            coalescer: crate::coalesce::Coalescer::new(Duration::from_micros(
                cfg.max_batch_delay_us,
            )),
        });
    }
    let handles: Vec<_> = workers
        .into_iter()
        .map(|w| {
            std::thread::Builder::new()
                .name(format!("sipsec-worker-{}", w.index))
                .spawn(move || w.run())
        })
        .collect::<Result<_, _>>()
        .context("cannot start worker threads")?;

    let listens: Vec<String> = cfg.listen.iter().map(ToString::to_string).collect();
    let role = match (cfg.mode, cfg.stateful) {
        (Mode::Redirect, _) => "redirect server",
        (Mode::Proxy, true) => "stateful proxy",
        (Mode::Proxy, false) => "stateless proxy",
    };
    println!(
        "sipsec listening on {} ({role} and registrar for {}; {} worker{}; database {}; {} registrations loaded)",
        listens.join(", "),
        cfg.domains.join(", "),
        cfg.workers,
        if cfg.workers == 1 { "" } else { "s" },
        cfg.database_url,
        loaded.bindings.len(),
    );
    let _ = std::io::stdout().flush();

    while !shutdown.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    tracing::info!("shutting down");
    for h in handles {
        let _ = h.join();
    }
    store.flush_blocking();
    let totals: Vec<String> = stats::total(&all_stats)
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if totals.is_empty() {
        tracing::info!("stopped (no traffic)");
    } else {
        tracing::info!("stopped; {}", totals.join(" "));
    }
    Ok(())
}
