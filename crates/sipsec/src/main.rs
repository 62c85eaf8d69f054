//! The `sipsec` command line: one binary with subcommands over the `sipsec` library.

use sipsec::cmd::{ctl, users};
use sipsec::tls::certs;
use sipsec::{authd, bench, config, lab, load, serve};

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "sipsec",
    version,
    about = "A secure, high-performance SIP server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the SIP server: registrar, stateful or stateless proxy, or redirect server.
    Serve {
        /// TOML configuration file; without it, the embedded defaults (UDP on
        /// 127.0.0.1:5060, stateful proxy, domain localhost, SQLite sipsec.db).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Generate SIP load, open loop: calls, registrations, redirects or OPTIONS, as a
    /// caller (UAC), a callee (UAS), or both.
    Load(Box<load::LoadArgs>),
    /// Measure a server's CPU per operation (and its peak) under sipsec's own load: sipsec
    /// started here and pinned, or any running server given by PID.
    Bench(Box<bench::BenchArgs>),
    /// The seeds' experiments: run suites in rounds, report them (HTML), fit the cost model.
    #[command(subcommand)]
    Lab(lab::LabCommand),
    /// Make a test CA and a server and a client certificate signed by it (PEM files).
    Certs(certs::CertsArgs),
    /// Manage the users digest and Proxychain authentication check: add, remove, list,
    /// import a CSV.
    Users(users::UsersArgs),
    /// Ask a running server (through its `[control] socket`): `reload` its configuration,
    /// or its `counters`. Exits 0 when done, 1 when refused (the reason on stderr), 2 when
    /// the server cannot be reached.
    Ctl(ctl::CtlArgs),
    /// Run Proxychain's central authentication service (or write backup credentials, or
    /// revoke a proxy).
    Authd(authd::AuthdArgs),
    /// Lab helper: a TCP relay that adds a fixed round-trip time (the proxy-authority WAN).
    DelayRelay(bench::relay::RelayArgs),
    /// Bench helper: holds idle TCP connections open in a process of their own (so they do
    /// not count against the bench's own file limit) until stdin closes.
    #[command(hide = true)]
    HoldConnections {
        to: std::net::SocketAddr,
        count: usize,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SIPSEC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::main(*args),
        Command::Lab(command) => lab::main(command),
        Command::Certs(args) => certs::run(&args),
        Command::Authd(args) => authd::run(args),
        Command::DelayRelay(args) => bench::relay::run(args),
        Command::Users(args) => users::run(args),
        Command::HoldConnections { to, count } => bench::modes::hold_idle(to, count),
        Command::Ctl(args) => {
            return match ctl::run(&args) {
                Ok(Ok(text)) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Ok(Err(why)) => {
                    eprint!("sipsec ctl {}: {why}", args.command.name());
                    ExitCode::from(1)
                }
                Err(e) => {
                    eprintln!("sipsec ctl: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        Command::Load(args) => {
            let peak = args.find_peak;
            return match load::run(*args) {
                // Like SIPp: a run where some operation failed exits 1.
                Ok(s) if s.failed > 0 && !peak => ExitCode::from(1),
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("sipsec load: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        // The lab's no-op stages come first: the TLS configuration is built with them.
        Command::Serve { config } => sipsec::ablation::init_from_env()
            .and_then(|_| {
                config
                    .as_deref()
                    .map_or_else(|| Ok(config::Config::default()), config::Config::load)
            })
            .and_then(|cfg| serve::run(cfg, config)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sipsec: {e:#}");
            ExitCode::FAILURE
        }
    }
}
