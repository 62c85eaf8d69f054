//! The `sipsec` command line: one binary whose subcommands dispatch to the workspace's crates
//! (`sipsec-server`, `sipsec-load`, `sipsec-lab`, `sipsec-transport`, `sipsec-identity`).

use sipsec_identity::sti;
use sipsec_lab::{self as lab, bench};
use sipsec_load as load;
use sipsec_server::cmd::{check, ctl, users};
use sipsec_server::{authd, config, serve};
use sipsec_transport::tls::certs;

use clap::{CommandFactory, Parser, Subcommand};
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
        /// Load and validate the configuration (its TLS files too), print what the server
        /// would listen on, and exit: 0 when it is good, 1 with the offending key when not.
        /// Binds nothing, opens no database, creates no file.
        #[arg(long)]
        check: bool,
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
    /// Make a test CA and a server and a client certificate signed by it (PEM files); with
    /// `--shaken`, also a test STI-CA and a STIR/SHAKEN signing certificate.
    Certs {
        #[command(flatten)]
        tls: certs::CertsArgs,
        #[command(flatten)]
        shaken: sti::ShakenArgs,
    },
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
    /// Lab helper: an HTTPS server of one directory's files (STIR/SHAKEN signing certificates
    /// for verifiers to fetch from a token's x5u), each answer cacheable for --max-age-s.
    CertServer(bench::certserver::CertServerArgs),
    /// Print a shell completion script for sipsec (e.g. `sipsec completions bash >
    /// /usr/share/bash-completion/completions/sipsec`).
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print sipsec's manual page (roff), or write one page per subcommand into a directory.
    Man {
        /// Write sipsec.1 and a sipsec-SUBCOMMAND.1 page for each subcommand here (created if
        /// missing) instead of printing sipsec.1.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Bench helper: holds idle connections (TCP, TLS, WS or WSS) open in a process of their
    /// own (so they do not count against the bench's own file limit) until stdin closes.
    #[command(hide = true)]
    HoldConnections(bench::idle::HoldArgs),
}

/// The log on stderr: its level from `SIPSEC_LOG` (default info), its format from
/// `SIPSEC_LOG_FORMAT`: `text` (the default; coloured on a terminal) or `json`, one JSON
/// object a line with the event's fields at the top level (`timestamp`, `level`, `target`,
/// `message`, and fields such as `source_ip` and `user`).
fn init_log() -> Result<(), String> {
    // The STUN parser logs a warning per malformed datagram, which anyone can send to a UDP
    // port: the server counts those itself (`stun_dropped`), so its lines are off.
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("SIPSEC_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
            .add_directive("stun_types=off".parse().expect("a valid directive"))
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr);
    match std::env::var("SIPSEC_LOG_FORMAT").as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("" | "text") => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        Ok("json") => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        Ok(other) => return Err(format!("SIPSEC_LOG_FORMAT={other:?}: text or json")),
        Err(_) => return Err("SIPSEC_LOG_FORMAT is not text or json".into()),
    }
    Ok(())
}

fn main() -> ExitCode {
    if let Err(e) = init_log() {
        eprintln!("sipsec: {e}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::main(*args),
        Command::Lab(command) => lab::main(command),
        Command::Certs { tls, shaken } => certs::run(&tls).and_then(|()| {
            if shaken.shaken {
                sti::make(&tls.out, &shaken.authority()?)?;
                println!(
                    "made a STIR/SHAKEN signing certificate {} (key {}) issued by the test STI-CA {}",
                    tls.out.join(sti::SHAKEN_CERT).display(),
                    tls.out.join(sti::SHAKEN_KEY).display(),
                    tls.out.join(sti::STI_CA).display()
                );
            }
            Ok(())
        }),
        Command::Authd(args) if args.check => match args.command {
            Some(_) => Err(anyhow::anyhow!(
                "--check checks the authority's configuration: give it no subcommand"
            )),
            None => check::authd(args.config.as_deref()).map(|t| print!("{t}")),
        },
        Command::Authd(args) => authd::run(args),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "sipsec", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { out } => man(out.as_deref()),
        Command::DelayRelay(args) => bench::relay::run(args),
        Command::CertServer(args) => bench::certserver::run(args),
        Command::Users(args) => users::run(args),
        Command::HoldConnections(a) => bench::idle::hold(&a),
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
        Command::Serve {
            config,
            check: true,
        } => sipsec_transport::ablation::init_from_env()
            .and_then(|_| check::serve(config.as_deref()))
            .map(|t| print!("{t}")),
        Command::Serve {
            config,
            check: false,
        } => sipsec_transport::ablation::init_from_env()
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

/// `sipsec man`: the top page on stdout, or every page into `out`.
fn man(out: Option<&std::path::Path>) -> anyhow::Result<()> {
    use anyhow::Context;
    match out {
        None => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .context("cannot write the manual page"),
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), dir)
                .with_context(|| format!("cannot write manual pages into {}", dir.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every argument of every subcommand, hidden ones included, says what it is for.
    #[test]
    fn every_argument_has_a_description() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(format!("{path} {} (the subcommand)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        let mut missing = Vec::new();
        walk(&cmd, "sipsec", &mut missing);
        assert!(missing.is_empty(), "without a description: {missing:#?}");
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    fn help(args: &[&str]) -> String {
        let mut all = vec!["sipsec"];
        all.extend_from_slice(args);
        all.push("--help");
        match Cli::try_parse_from(all) {
            Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => e.to_string(),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("--help parsed as a command"),
        }
    }

    /// The lab's no-op stages are for lab builds: production help does not offer them.
    #[test]
    fn lab_noop_is_only_in_lab_builds_help() {
        for args in [&["load"][..], &["bench"]] {
            assert_eq!(
                help(args).contains("--lab-noop"),
                cfg!(feature = "lab-noop"),
                "sipsec {args:?} --help"
            );
        }
    }

    /// `lab run --help` names every suite there is.
    #[test]
    fn lab_run_help_names_every_suite() {
        let text = help(&["lab", "run"]);
        for suite in lab::suite::all() {
            assert!(
                text.contains(suite.name),
                "{} missing from:\n{text}",
                suite.name
            );
        }
    }

    /// Each subcommand that reads a config file takes it as `-c` too.
    #[test]
    fn every_config_option_has_c() {
        fn walk(cmd: &clap::Command, path: &str, without: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                if arg.get_id() == "config" && arg.get_short() != Some('c') {
                    without.push(path.to_string());
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), without);
            }
        }
        let mut without = Vec::new();
        walk(&Cli::command(), "sipsec", &mut without);
        assert!(without.is_empty(), "--config without -c: {without:?}");
    }
}
