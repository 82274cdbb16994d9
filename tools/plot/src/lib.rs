//! Off the packet path: renders the benchmarks' committed results (the
//! end-to-end relay run's JSON in `experiments/relay-throughput/results/`,
//! the latency run's in `experiments/relay-latency/results/`,
//! the pool's instruction counts in `benches/results/`) as the SVG plots in
//! `docs/plots/`. The plots are a pure function of those files, so a test
//! can regenerate them and fail when the committed SVGs have drifted.

use std::path::{Path, PathBuf};

use anyhow::Result;

pub mod chart;
pub mod latency;
pub mod pool;
pub mod relay;

/// Where the plots go, relative to the workspace root.
pub const OUT_DIR: &str = "docs/plots";

/// One rendered plot.
#[derive(Debug, Clone)]
pub struct Figure {
    /// File name inside the output directory.
    pub file_name: &'static str,
    /// The data file it was drawn from.
    pub source: PathBuf,
    /// The SVG document.
    pub svg: String,
}

/// The inputs of [`render_all`].
#[derive(Debug, Clone)]
pub struct Inputs {
    /// An end-to-end results file of `experiments/relay-throughput`.
    pub relay: PathBuf,
    /// The pool's instruction counts (`benches/results/pool_instructions.json`).
    pub pool: PathBuf,
    /// A results file of `experiments/relay-latency`.
    pub latency: PathBuf,
}

impl Inputs {
    /// The committed inputs under the workspace root `root`: the newest
    /// complete full relay run (see [`relay::latest_full_run`]) and the
    /// pool's instruction counts.
    pub fn committed(root: &Path) -> Result<Self> {
        Ok(Self {
            relay: relay::latest_full_run(&root.join(relay::RESULTS_DIR))?,
            pool: root.join(pool::RESULTS_FILE),
            latency: latency::latest_full_run(&root.join(latency::RESULTS_DIR))?,
        })
    }
}

/// Renders every plot from `inputs`. `root` is the workspace root; the
/// captions name the data files relative to it.
pub fn render_all(root: &Path, inputs: &Inputs) -> Result<Vec<Figure>> {
    let relay_name = display_path(root, &inputs.relay);
    let pool_name = display_path(root, &inputs.pool);
    let latency_name = display_path(root, &inputs.latency);
    Ok(vec![
        Figure {
            file_name: relay::FILE_NAME,
            source: inputs.relay.clone(),
            svg: relay::render(&relay::load(&inputs.relay)?, &relay_name)?,
        },
        Figure {
            file_name: latency::FILE_NAME,
            source: inputs.latency.clone(),
            svg: latency::render(&latency::load(&inputs.latency)?, &latency_name)?,
        },
        Figure {
            file_name: pool::FILE_NAME,
            source: inputs.pool.clone(),
            svg: pool::render(&pool::load(&inputs.pool)?, &pool_name)?,
        },
    ])
}

/// The newest `.json` file in `dir` (results are named by UTC timestamp,
/// so the newest sorts last) that `accept` (given its path and text) takes;
/// `None` if there is none.
pub(crate) fn newest_results(
    dir: &Path,
    accept: impl Fn(&Path, &str) -> Result<bool>,
) -> Result<Option<PathBuf>> {
    use anyhow::Context as _;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("listing {}", dir.display()))?;
    files.retain(|p| p.extension().is_some_and(|e| e == "json"));
    files.sort();
    for path in files.iter().rev() {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        if accept(path, &text)? {
            return Ok(Some(path.clone()));
        }
    }
    Ok(None)
}

/// `path` relative to `root` when it is under it, with `/` separators, so a
/// caption reads the same on every checkout.
fn display_path(root: &Path, path: &Path) -> String {
    let shown = path.strip_prefix(root).unwrap_or(path);
    shown
        .components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}
