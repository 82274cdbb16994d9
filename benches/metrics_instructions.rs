//! Instruction counts (callgrind, via gungraun) of one scrape of 1000
//! fully populated flows (`mcrelay_control::bench_snapshot`: two outputs,
//! RTP and TS health, 36 samples a flow), three ways: the text format and
//! OpenMetrics as mcrelay writes them by hand, and OpenMetrics encoded by
//! `prometheus-client` from the same families. Stable on a loaded machine
//! where `benches/metrics.rs`' times are not. Building the snapshot
//! (setup) and freeing it and the output (teardown) are not counted.
//!
//! ```text
//! nice -n 19 cargo bench -p mcrelay-benches --bench metrics_instructions
//! ```

use std::hint::black_box;

use gungraun::{library_benchmark, library_benchmark_group, main};
use mcrelay_control::{
    MetricsFormat, Snapshot, bench_snapshot, render_metrics_as, render_with_prometheus_client,
};

const FLOWS: usize = 1000;

/// Which encoder a run measures.
#[derive(Debug, Clone, Copy)]
enum Contender {
    ByHand(MetricsFormat),
    PrometheusClient,
}

fn setup(c: Contender) -> (Snapshot, Contender) {
    (bench_snapshot(FLOWS), c)
}

fn teardown((_s, out): (Snapshot, String)) {
    assert!(out.contains("channel-0999"));
}

#[library_benchmark]
#[bench::text(args = (Contender::ByHand(MetricsFormat::Text)), setup = setup, teardown = teardown)]
#[bench::openmetrics(args = (Contender::ByHand(MetricsFormat::OpenMetrics)), setup = setup, teardown = teardown)]
#[bench::prometheus_client(args = (Contender::PrometheusClient), setup = setup, teardown = teardown)]
fn scrape_1000_flows((s, c): (Snapshot, Contender)) -> (Snapshot, String) {
    let out = match c {
        Contender::ByHand(format) => render_metrics_as(black_box(&s), format),
        Contender::PrometheusClient => render_with_prometheus_client(black_box(&s)),
    };
    (s, out)
}

library_benchmark_group!(name = scrape; benchmarks = scrape_1000_flows);
main!(library_benchmark_groups = scrape);
