//! Redundancy's cost in the relay core, per delivered packet, each rule
//! next to a one-leg flow in one run: `Core::receive_on` for every copy of
//! every leg, `Core::tick` after each (the driver ticks every loop turn),
//! `Core::flush` and `Core::complete` of the sends (one output). 1328-byte
//! RTP datagrams (a 1316-byte TS payload), 10 kpps of fake clock.
//! IDs: `redundancy/core/{scenario}`, where the scenario is
//!
//! - `single`: one leg, every number once;
//! - `merge`: two legs, `delay 0`, both complete and in step (every
//!   second datagram a duplicate);
//! - `merge-lossy`: two legs, `delay 0`, each losing a disjoint 5 %, leg 1
//!   2 ms (20 packets) behind leg 0 (what the merge is for);
//! - `merge-delay-lossy`: the same with a 50 ms delay (in-order output:
//!   packets wait behind each gap until the late leg fills it);
//! - `failover`: two legs, both complete, leg 1 standby.
//!
//! Each iteration delivers [`BLOCK`] packets; Criterion's time per element
//! is the time per delivered packet.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mcrelay_benches::redundancy_run::{BLOCK, Run, scenarios};

fn core(c: &mut Criterion) {
    let mut group = c.benchmark_group("redundancy");
    group.throughput(Throughput::Elements(u64::try_from(BLOCK).unwrap_or(1)));
    for s in scenarios() {
        let mut run = Run::new(&s);
        // Past the start, a block delivers each of its numbers once.
        run.block();
        let before = run.out.packets_out.get();
        run.block();
        assert_eq!(
            run.out.packets_out.get() - before,
            u64::try_from(BLOCK).unwrap_or(0),
            "{}: a block delivers every number once",
            s.name
        );
        group.bench_function(BenchmarkId::new("core", s.name), |b| {
            b.iter(|| run.block());
        });
    }
    group.finish();
}

criterion_group!(benches, core);
criterion_main!(benches);
