//! sipsec's measurements: `sipsec bench`, a server and the load generator run side by side and
//! measured, and `sipsec lab`, the seeds' experiments in one command. `run` measures the suites' rows in
//! rounds and appends each result as a JSON line; `report` turns the results into one
//! self-contained HTML page (and the markdown tables BENCHMARKS.md quotes); `model` fits the
//! component cost model and states its held-out error.
//!
//! - [`bench`](mod@bench): `sipsec bench`, one server and `sipsec load` measured together
//!   (CPU, latency, instructions); the lab's delay relay.
//! - [`suite`]: each seed's experiment as a table of rows, with the seed's own figures.
//! - [`run`](mod@run): runs the rows, alternated within rounds, resumable.
//! - [`results`]: the JSON lines, the only thing `report` and `model` read.
//! - [`stats`]: the statistics that decide when one row may be called cheaper than another.
//! - [`model`]: per-call cost decomposed into building blocks, validated held out.
//! - [`peaks`]: the model's predicted peak against the peak measured where the server set it.
//! - [`report`]: the HTML report and the markdown export.
//! - [`charts`]: the report's SVG charts, from labelled numbers.

pub mod bench;
pub mod charts;
pub mod model;
pub mod peaks;
pub mod report;
pub mod results;
pub mod run;
pub mod stats;
pub mod suite;

use std::path::PathBuf;

/// `sipsec lab` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum LabCommand {
    /// Run suites (default: all), append each row's result to DIR/results.jsonl, and write
    /// the report of everything DIR holds.
    Run(run::RunArgs),
    /// Write DIR/report.html (and DIR/report.md) from DIR/results.jsonl.
    Report {
        /// The directory `lab run --out` wrote.
        #[arg(default_value = "lab-results")]
        dir: PathBuf,
    },
    /// Fit the component cost model to DIR's results and print its blocks, its predictions
    /// and its held-out error per row.
    Model {
        /// The directory `lab run --out` wrote.
        #[arg(default_value = "lab-results")]
        dir: PathBuf,
    },
}

/// `sipsec lab`.
pub fn main(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Run(a) => run::run(a),
        LabCommand::Report { dir } => report::write(&dir),
        LabCommand::Model { dir } => {
            let records = results::load(&dir)?;
            let m = model::fit_all(&records);
            print!("{}", model::text(&m));
            let peaks = peaks::markdown(&records, &m);
            if !peaks.is_empty() {
                print!("\nPredicted and measured peaks, server-set:\n\n{peaks}");
            }
            Ok(())
        }
    }
}
