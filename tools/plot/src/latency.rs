//! The end-to-end latency benchmark (`experiments/relay-latency`): one-way
//! delay percentiles per contender at each load point, from the `summary`
//! of one results file.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow};
use serde::Deserialize;

use crate::chart::{self, Bar, Panel, Series};

/// The results directory, relative to the workspace root.
pub const RESULTS_DIR: &str = "experiments/relay-latency/results";
/// The plot's file name in `docs/plots/`.
pub const FILE_NAME: &str = "relay-latency.svg";

/// A results file: the parts the plot uses.
#[derive(Debug, Clone, Deserialize)]
pub struct Run {
    pub meta: Meta,
    pub summary: Vec<Row>,
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
    pub reps: u32,
    pub size: u32,
    pub relay_sched: String,
}

/// One contender at one load point, over its repetitions (µs).
#[derive(Debug, Clone, Deserialize)]
pub struct Row {
    pub contender: String,
    /// "10 %", "1 kpps", ...
    pub point: String,
    pub reps: u32,
    pub p50_us_median: Option<f64>,
    pub p50_us_min: Option<f64>,
    pub p50_us_max: Option<f64>,
    pub p99_us_median: Option<f64>,
    pub p99_us_min: Option<f64>,
    pub p99_us_max: Option<f64>,
    pub p999_us_median: Option<f64>,
    pub p999_us_min: Option<f64>,
    pub p999_us_max: Option<f64>,
}

impl Row {
    /// The bar of percentile `which` ("p50", "p99", "p999"), if measured.
    fn bar(&self, which: &str) -> Option<Bar> {
        let (value, min, max) = match which {
            "p50" => (self.p50_us_median, self.p50_us_min, self.p50_us_max),
            "p99" => (self.p99_us_median, self.p99_us_min, self.p99_us_max),
            _ => (self.p999_us_median, self.p999_us_min, self.p999_us_max),
        };
        let value = value?;
        Some(Bar {
            value,
            min: min.unwrap_or(value),
            max: max.unwrap_or(value),
            floor: false,
            note: None,
        })
    }
}

/// Reads a results file.
pub fn load(path: &Path) -> Result<Run> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let run: Run = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a relay-latency results file (relay_latency.py's JSON)",
            path.display()
        )
    })?;
    if run.summary.iter().all(|r| r.p50_us_median.is_none()) {
        return Err(anyhow!("{}: no latency was measured", path.display()));
    }
    Ok(run)
}

/// The newest results file in `dir` (names are UTC timestamps) of a
/// complete run that is not `--quick` and has the four contenders the
/// docs compare (runs of fewer are side experiments).
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
        let compares = ["mcrelay", "mcrelay-packet", "baseline", "kernel"]
            .iter()
            .all(|c| run.summary.iter().any(|s| s.contender == *c));
        Ok(run.meta.status == "complete" && !run.meta.options.quick && compares)
    })?
    .ok_or_else(|| {
        anyhow!(
            "no complete run (without --quick, with mcrelay, mcrelay-packet, baseline and kernel) in {}",
            dir.display()
        )
    })
}

/// Renders the three-panel figure: p50, p99 and p99.9 per load point.
/// `source` names the results file in the caption.
pub fn render(run: &Run, source: &str) -> Result<String> {
    let mut points: Vec<&str> = Vec::new();
    let mut contenders: Vec<&str> = Vec::new();
    for r in &run.summary {
        if !points.contains(&r.point.as_str()) {
            points.push(&r.point);
        }
        if !contenders.contains(&r.contender.as_str()) {
            contenders.push(&r.contender);
        }
    }
    let find = |contender: &str, point: &str| {
        run.summary
            .iter()
            .find(|r| r.contender == contender && r.point == point)
    };
    let panel = |which: &str, title: &str, legend: bool| Panel {
        title: title.into(),
        x_desc: "load: share of the contender's max lossless rate, or fixed rate".into(),
        y_desc: "µs".into(),
        groups: points.iter().map(|p| (*p).to_owned()).collect(),
        series: contenders
            .iter()
            .enumerate()
            .map(|(i, &c)| Series {
                name: c.to_owned(),
                colour: chart::colour(i),
                bars: points
                    .iter()
                    .map(|&p| find(c, p).and_then(|r| r.bar(which)))
                    .collect(),
            })
            .collect(),
        value_label: |v| format!("{v:.0}"),
        legend,
    };
    let panels = [
        panel("p50", "Median one-way delay (lower is better)", true),
        panel("p99", "p99", false),
        panel("p999", "p99.9", false),
    ];
    let o = &run.meta.options;
    let sched = if o.relay_sched == "fifo" {
        "mcrelayd and the baseline at SCHED_FIFO on CPU 1"
    } else {
        "relays at SCHED_OTHER"
    };
    let caption = [
        format!(
            "Data: {source} (kernel {}, {} vCPUs, shared with other jobs); {} B payloads, 1→1; median of {} interleaved rounds, whiskers min–max.",
            run.meta.kernel, run.meta.cpus, o.size, o.reps
        ),
        "Delay: the receiver's kernel receive stamp (SO_TIMESTAMPNS) minus the sender's CLOCK_MONOTONIC stamp in the payload.".into(),
        format!(
            "Loads: 10/50/90 % of each contender's own max lossless rate (searched first), and a fixed rate; {sched}."
        ),
        "mcrelay: socket ingress; mcrelay-packet: AF_PACKET ring (TPACKET_V2 frame slots at MTU 1500); *-before: an older mcrelayd (--mcrelayd-before); baseline: recvmmsg/sendmmsg; kernel: smcroute (MFC).".into(),
    ];
    chart::render(
        (1600, 620),
        "One-way latency through the relay, three namespaces on veth, 2-vCPU VM",
        &panels,
        &caption,
    )
}
