//! `mcrelay-plot`: renders the committed benchmark results as the SVG plots
//! in `docs/plots/` (`cargo run -p mcrelay-plot` from the workspace root),
//! or with `--check` fails when the committed plots differ from what the
//! data renders to.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Parser;
use mcrelay_plot::{Inputs, OUT_DIR, chart, latency, pool, relay, render_all};

/// Render the benchmark results in the repository as SVG plots.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Workspace root: the data is read from, and the plots written to,
    /// paths under it.
    #[arg(long, default_value = ".")]
    root: PathBuf,
    /// End-to-end results file [default: the newest complete full run in
    /// experiments/relay-throughput/results/].
    #[arg(long)]
    relay: Option<PathBuf>,
    /// Latency results file [default: the newest complete run in
    /// experiments/relay-latency/results/].
    #[arg(long)]
    latency: Option<PathBuf>,
    /// Pool instruction counts [default: benches/results/pool_instructions.json].
    #[arg(long)]
    pool: Option<PathBuf>,
    /// Output directory [default: ROOT/docs/plots].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write nothing; exit 1 if a plot in the output directory differs from
    /// what the data renders to.
    #[arg(long)]
    check: bool,
}

fn main() -> Result<ExitCode> {
    let cli = Cli::parse();
    let root = cli
        .root
        .canonicalize()
        .with_context(|| format!("workspace root {}", cli.root.display()))?;
    let inputs = Inputs {
        relay: match cli.relay {
            Some(path) => path,
            None => relay::latest_full_run(&root.join(relay::RESULTS_DIR))?,
        },
        pool: cli.pool.unwrap_or_else(|| root.join(pool::RESULTS_FILE)),
        latency: match cli.latency {
            Some(path) => path,
            None => latency::latest_full_run(&root.join(latency::RESULTS_DIR))?,
        },
    };
    let out = cli.out.unwrap_or_else(|| root.join(OUT_DIR));
    let mut stale = 0;
    for figure in render_all(&root, &inputs)? {
        let path = out.join(figure.file_name);
        if cli.check {
            let current = std::fs::read_to_string(&path).unwrap_or_default();
            if current == figure.svg {
                println!("up to date: {}", path.display());
            } else {
                println!(
                    "STALE: {} differs from what {} renders to",
                    path.display(),
                    figure.source.display()
                );
                stale += 1;
            }
        } else {
            chart::write_file(&path, &figure.svg)?;
            println!("wrote {} from {}", path.display(), figure.source.display());
        }
    }
    if stale > 0 {
        eprintln!("regenerate with: cargo run -p mcrelay-plot");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
