//! The signals an operator may send `sipsec serve` and `sipsec authd`, the same for both:
//! SIGINT and SIGTERM stop cleanly, SIGUSR1 asks for the counters, SIGHUP reloads the
//! configuration (`sipsec serve`; `sipsec authd` logs that it has nothing to reload).
//! Unhandled, USR1 and HUP would kill the process without its clean shutdown. Handlers only
//! set flags; the process's main loop polls them.

use anyhow::{Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The flags the handlers set.
pub(crate) struct Signals {
    /// Set by SIGINT and SIGTERM; shared with whatever must stop.
    pub stop: Arc<AtomicBool>,
    report: Arc<AtomicBool>,
    hangup: Arc<AtomicBool>,
}

impl Signals {
    /// Installs the handlers.
    pub(crate) fn install() -> Result<Signals> {
        let signals = Signals {
            stop: Arc::default(),
            report: Arc::default(),
            hangup: Arc::default(),
        };
        for (signal, flag) in [
            (SIGINT, &signals.stop),
            (SIGTERM, &signals.stop),
            (SIGUSR1, &signals.report),
            (SIGHUP, &signals.hangup),
        ] {
            signal_hook::flag::register(signal, flag.clone())
                .context("cannot install signal handlers")?;
        }
        Ok(signals)
    }

    /// Whether a stop was asked for.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Handles what arrived since the last call: `report` runs once per SIGUSR1, `hangup`
    /// once per SIGHUP (at least once for several of either).
    pub(crate) fn poll(&self, report: impl FnOnce(), hangup: impl FnOnce()) {
        if self.report.swap(false, Ordering::Relaxed) {
            report();
        }
        if self.hangup.swap(false, Ordering::Relaxed) {
            hangup();
        }
    }
}
