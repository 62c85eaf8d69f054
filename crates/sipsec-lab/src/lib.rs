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
//! - [`docs`]: the generated tables in README.md and BENCHMARKS.md, kept equal to the
//!   checked-in results (`results/lab/`).
//! - [`charts`]: the report's SVG charts, from labelled numbers.

pub mod bench;
pub mod charts;
pub mod cluster;
pub mod docs;
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
    /// Write DIR/report.html (and DIR/report.md) from DIR/results.jsonl; with --update or
    /// --check, also the tables README.md and BENCHMARKS.md quote.
    Report {
        /// The directory `lab run --out` wrote.
        #[arg(default_value = "lab-results")]
        dir: PathBuf,
        /// Rewrite the generated blocks (`<!-- lab-table: NAME -->`) of these documents from
        /// the results.
        #[arg(long, num_args = 1.., value_name = "FILE")]
        update: Vec<PathBuf>,
        /// Fail if the generated blocks of these documents differ from the results (writes
        /// nothing, not even the report).
        #[arg(long, num_args = 1.., value_name = "FILE", conflicts_with = "update")]
        check: Vec<PathBuf>,
        /// Keep the ratios of rows below 99% success (they stay marked).
        #[arg(long)]
        with_failures: bool,
    },
    /// Fit the component cost model to DIR's results and print its blocks, its predictions
    /// and its held-out error per row.
    Model {
        /// The directory `lab run --out` wrote.
        #[arg(default_value = "lab-results")]
        dir: PathBuf,
        /// Fit rows below 99% success too (left out by default: their CPU per operation is
        /// divided by the operations that succeeded).
        #[arg(long)]
        with_failures: bool,
    },
}

/// `sipsec lab`.
pub fn main(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Run(a) => run::run(a),
        LabCommand::Report {
            dir,
            update,
            check,
            with_failures,
        } => {
            let opts = report::Options { with_failures };
            if !check.is_empty() {
                // A check writes nothing: it is what the test of README runs on the tree.
                return docs::apply(&check, &report::build(&dir, opts)?.blocks, true);
            }
            let r = report::write(&dir, opts)?;
            docs::apply(&update, &r.blocks, false)
        }
        LabCommand::Model { dir, with_failures } => {
            let records = results::load(&dir)?;
            let m = model::fit_with(&records, with_failures);
            print!("{}", model::text(&m));
            let peaks = peaks::markdown(&records, &m);
            if !peaks.is_empty() {
                print!("\n{}:\n\n{peaks}", peaks::TITLE);
            }
            Ok(())
        }
    }
}
