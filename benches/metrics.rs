//! A scrape of 1000 flows, three ways in one run: the Prometheus text
//! format and OpenMetrics as mcrelay writes them by hand (what `/metrics`
//! serves), and OpenMetrics encoded by the Prometheus project's
//! `prometheus-client` from the same families (the contender issue 20
//! asked for). Each flow is fully populated (two outputs, RTP and TS
//! health: 36 samples). IDs: `metrics/{text,openmetrics,prometheus-client}/1000`;
//! the bytes of each are printed once.
//!
//! ```text
//! nice -n 19 cargo bench -p mcrelay-benches --bench metrics
//! ```

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mcrelay_control::{
    MetricsFormat, Snapshot, bench_snapshot, render_metrics_as, render_with_prometheus_client,
};

const FLOWS: usize = 1000;

/// An encoder of a whole scrape.
type Render = fn(&Snapshot) -> String;

fn scrape(c: &mut Criterion) {
    let s = bench_snapshot(FLOWS);
    let mut group = c.benchmark_group("metrics");
    group.throughput(Throughput::Elements(1));
    let contenders: [(&str, Render); 3] = [
        ("text", |s| render_metrics_as(s, MetricsFormat::Text)),
        ("openmetrics", |s| {
            render_metrics_as(s, MetricsFormat::OpenMetrics)
        }),
        ("prometheus-client", render_with_prometheus_client),
    ];
    for (id, render) in contenders {
        println!("metrics/{id}/{FLOWS}: {} bytes", render(&s).len());
        group.bench_function(BenchmarkId::new(id, FLOWS), |b| {
            b.iter(|| render(black_box(&s)));
        });
    }
    group.finish();
}

criterion_group!(benches, scrape);
criterion_main!(benches);
