//! The end-to-end relay benchmark (`experiments/relay-throughput`): max
//! lossless input rate and relay-CPU nanoseconds per delivered packet, per
//! contender, payload size and fan-out, from the `summary` of one results
//! file.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow};
use serde::Deserialize;

use crate::chart::{self, Bar, Panel, Series};

/// The results directory, relative to the workspace root.
pub const RESULTS_DIR: &str = "experiments/relay-throughput/results";
/// The plot's file name in `docs/plots/`.
pub const FILE_NAME: &str = "relay-throughput.svg";

/// A results file: the parts the plot uses.
#[derive(Debug, Clone, Deserialize)]
pub struct Run {
    pub meta: Meta,
    pub summary: Vec<Summary>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Meta {
    pub kernel: String,
    pub cpus: u32,
    pub status: String,
    pub options: Options,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Options {
    pub quick: bool,
    pub keep_uso: bool,
}

/// One contender × size × fan-out, over its repetitions.
#[derive(Debug, Clone, Deserialize)]
pub struct Summary {
    pub contender: String,
    pub size: u32,
    pub fanout: u32,
    pub reps: u32,
    pub max_lossless_pps_median: f64,
    pub max_lossless_pps_min: f64,
    pub max_lossless_pps_max: f64,
    /// Repetitions whose search stopped because the sender ran out.
    pub sender_limited: u32,
    pub ns_per_delivered_median: f64,
    pub ns_per_delivered_min: f64,
    pub ns_per_delivered_max: f64,
}

/// Reads a results file.
pub fn load(path: &Path) -> Result<Run> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let run: Run = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a relay-throughput results file (relay_throughput.py's JSON)",
            path.display()
        )
    })?;
    if run.summary.is_empty() {
        return Err(anyhow!("{}: the summary is empty", path.display()));
    }
    Ok(run)
}

/// The newest results file in `dir` (names are UTC timestamps, so the
/// newest sorts last) of a complete, full run: not `--quick`, not
/// `--keep-uso`, and comparing mcrelay with the baseline relay and the
/// kernel (runs of fewer contenders are side experiments, not the
/// comparison the docs tabulate).
pub fn latest_full_run(dir: &Path) -> Result<PathBuf> {
    #[derive(Deserialize)]
    struct MetaOnly {
        meta: Meta,
        summary: Vec<ContenderOnly>,
    }
    #[derive(Deserialize)]
    struct ContenderOnly {
        contender: String,
    }
    crate::newest_results(dir, |path, text| {
        let run: MetaOnly = serde_json::from_str(text)
            .with_context(|| format!("{}: no run metadata (meta)", path.display()))?;
        let compares = ["mcrelay", "baseline", "kernel"]
            .iter()
            .all(|c| run.summary.iter().any(|s| s.contender == *c));
        Ok(run.meta.status == "complete"
            && !run.meta.options.quick
            && !run.meta.options.keep_uso
            && compares)
    })?
    .ok_or_else(|| {
        anyhow!(
            "no complete full run (without --quick or --keep-uso, with mcrelay, baseline and kernel) in {}",
            dir.display()
        )
    })
}

/// Renders the two-panel figure: max lossless rate and CPU per packet.
/// `source` names the results file in the caption.
pub fn render(run: &Run, source: &str) -> Result<String> {
    // Groups and contenders in order of first appearance; sizes largest
    // first, as in docs/benchmarks.md.
    let mut configs: Vec<(u32, u32)> = Vec::new();
    let mut contenders: Vec<&str> = Vec::new();
    for s in &run.summary {
        if !configs.contains(&(s.size, s.fanout)) {
            configs.push((s.size, s.fanout));
        }
        if !contenders.contains(&s.contender.as_str()) {
            contenders.push(&s.contender);
        }
    }
    configs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let groups: Vec<String> = configs
        .iter()
        .map(|(size, fanout)| format!("{size} B, 1→{fanout}"))
        .collect();
    let find = |contender: &str, (size, fanout): (u32, u32)| {
        run.summary
            .iter()
            .find(|s| s.contender == contender && s.size == size && s.fanout == fanout)
    };

    let mut rate = Vec::new();
    let mut cpu = Vec::new();
    for (i, &contender) in contenders.iter().enumerate() {
        let colour = chart::colour(i);
        let rows: Vec<Option<&Summary>> = configs.iter().map(|&c| find(contender, c)).collect();
        rate.push(Series {
            name: contender.to_owned(),
            colour,
            bars: rows
                .iter()
                .map(|r| {
                    r.map(|s| Bar {
                        value: s.max_lossless_pps_median / 1000.0,
                        min: s.max_lossless_pps_min / 1000.0,
                        max: s.max_lossless_pps_max / 1000.0,
                        floor: s.sender_limited >= s.reps,
                        note: (s.sender_limited > 0 && s.sender_limited < s.reps)
                            .then(|| format!("{}/{} SL", s.sender_limited, s.reps)),
                    })
                })
                .collect(),
        });
        cpu.push(Series {
            name: contender.to_owned(),
            colour,
            bars: rows
                .iter()
                .map(|r| {
                    r.map(|s| Bar {
                        value: s.ns_per_delivered_median,
                        min: s.ns_per_delivered_min,
                        max: s.ns_per_delivered_max,
                        floor: false,
                        note: None,
                    })
                })
                .collect(),
        });
    }

    let reps = run.summary.iter().map(|s| s.reps).max().unwrap_or(0);
    let panels = [
        Panel {
            title: "Max lossless input rate (higher is better)".into(),
            x_desc: "payload, fan-out".into(),
            y_desc: "kpps in".into(),
            groups: groups.clone(),
            series: rate,
            value_label: |v| format!("{v:.0}"),
            legend: true,
        },
        Panel {
            title: "Relay CPU per delivered packet (lower is better)".into(),
            x_desc: "payload, fan-out".into(),
            y_desc: "ns".into(),
            groups,
            series: cpu,
            value_label: |v| format!("{v:.0}"),
            legend: false,
        },
    ];
    let caption = [
        format!(
            "Data: {source} (kernel {}, {} vCPUs); median of {reps} interleaved repetitions, whiskers min–max.",
            run.meta.kernel, run.meta.cpus
        ),
        "Pale bar with ≥: every repetition was sender-limited, the relay can do more; \"n/3 SL\": n repetitions were."
            .into(),
        "CPU: the relay core's busy time (/proc/stat) ÷ packets delivered to all outputs, at the max lossless rate."
            .into(),
        "mcrelay: mcrelayd, one worker, UDP GSO; baseline: blocking recvmmsg, one sendmmsg per output, batches of 64; kernel: smcroute (MFC)."
            .into(),
    ];
    chart::render(
        (1400, 620),
        "End-to-end relay, three namespaces on veth, 2-vCPU VM",
        &panels,
        &caption,
    )
}
