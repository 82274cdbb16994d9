//! The pool against the allocator, per size class, in instructions per
//! operation: the counts `benches/pool_instructions.rs` measures with
//! callgrind, written to `benches/results/pool_instructions.json` by
//! `.ci/instruction_gate.py --write --all`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result, anyhow};

use crate::chart::{self, Bar, Panel, Series};

/// The data file, relative to the workspace root.
pub const RESULTS_FILE: &str = "benches/results/pool_instructions.json";
/// The plot's file name in `docs/plots/`.
pub const FILE_NAME: &str = "pool-vs-allocator.svg";

/// Operations per benchmark run (`PAIRS` in `benches/pool_instructions.rs`).
const OPS: f64 = 1000.0;
/// The benchmark that measures the loop alone, subtracted from the others.
const LOOP_ONLY: &str = "pool_instructions::pool::loop_only_x1000 empty";
/// The classes, with their buffer sizes (`mcrelay_pool::Class`).
const CLASSES: [(&str, u32); 3] = [("small", 1500), ("standard", 4096), ("jumbo", 9000)];
/// Series: legend name and benchmark (before the class id).
const SERIES: [(&str, &str); 2] = [
    (
        "pool take + give",
        "pool_instructions::pool::take_give_x1000",
    ),
    (
        "Vec::with_capacity + drop",
        "pool_instructions::alloc::vec_with_capacity_x1000",
    ),
];

/// Instruction counts by `"<module path> <id>"`.
pub type Counts = BTreeMap<String, u64>;

/// Reads the counts file.
pub fn load(path: &Path) -> Result<Counts> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected {{\"<benchmark> <id>\": instructions, ...}} as written by .ci/instruction_gate.py",
            path.display()
        )
    })
}

fn get(counts: &Counts, key: &str, source: &str) -> Result<u64> {
    counts.get(key).copied().ok_or_else(|| {
        anyhow!("{source} has no count for {key:?}: rerun the instruction-count suite (docs/benchmarks.md)")
    })
}

/// Renders the per-class comparison. `source` names the data file in the
/// caption.
pub fn render(counts: &Counts, source: &str) -> Result<String> {
    let loop_only = get(counts, LOOP_ONLY, source)?;
    let per_op = |bench: &str, class: &str| -> Result<f64> {
        let total = get(counts, &format!("{bench} {class}"), source)?;
        // Net of the loop; the counts are < 2^53, exact in an f64.
        Ok(total.saturating_sub(loop_only) as f64 / OPS)
    };
    let mut series = Vec::new();
    for (i, (name, bench)) in SERIES.iter().enumerate() {
        let mut bars = Vec::new();
        for (class, _) in CLASSES {
            let value = per_op(bench, class)?;
            // Every series but the pool's says how many times the pool's it is.
            let pool = per_op(SERIES[0].1, class)?;
            bars.push(Some(Bar {
                value,
                min: value,
                max: value,
                floor: false,
                note: (i > 0 && pool > 0.0).then(|| format!("{:.1}x the pool", value / pool)),
            }));
        }
        series.push(Series {
            name: (*name).to_owned(),
            colour: chart::colour(i),
            bars,
        });
    }
    let panel = Panel {
        title: "Instructions per buffer (lower is better)".into(),
        x_desc: "pool size class (buffer size)".into(),
        y_desc: "instructions".into(),
        groups: CLASSES
            .iter()
            .map(|(class, size)| format!("{class} ({size} B)"))
            .collect(),
        series,
        value_label: |v| format!("{v:.1}"),
        legend: true,
    };
    let caption = [
        format!(
            "Data: {source} (callgrind via gungraun, 1000 operations per run; the loop's own {:.1} per turn subtracted).",
            loop_only as f64 / OPS
        ),
        "pool: take + give of a buffer of the class (1000 / 4000 / 8000 B asked for); allocator: a Vec of the class's size."
            .into(),
    ];
    chart::render(
        (1000, 560),
        "Buffer pool vs the allocator (glibc malloc)",
        &[panel],
        &caption,
    )
}
