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

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mcrelay_dataplane::core::{Core, FlowId, LegId, OutputSpec, Redundancy, SendToken};
use mcrelay_dataplane::counters::OutputCounters;
use mcrelay_pool::{PoolConfig, PoolSet};

/// Sequence numbers (delivered packets) per iteration.
const BLOCK: i32 = 1000;
/// Fake time between two numbers (10 kpps).
const PERIOD_NS: u64 = 100_000;
const MS: u64 = 1_000_000;

struct Scenario {
    name: &'static str,
    legs: u8,
    redundancy: Redundancy,
    /// Leg 1's lag, in packets.
    skew: i32,
    /// Each leg loses a disjoint 5 %.
    lossy: bool,
}

/// One block's arrivals in time order: (time slot, leg, offset of its
/// number from the block's first).
fn schedule(s: &Scenario) -> Vec<(u64, u8, i32)> {
    let mut events = Vec::new();
    for k in 0..BLOCK {
        let slot = u64::try_from(k).unwrap_or(0);
        for leg in 0..s.legs {
            let j = if leg == 1 { k - s.skew } else { k };
            let lost = s.lossy && j.rem_euclid(20) == if leg == 0 { 3 } else { 13 };
            if !lost {
                events.push((slot, leg, j));
            }
        }
    }
    events
}

fn scenarios() -> [Scenario; 5] {
    let merge = |delay_ns| Redundancy::Merge {
        delay_ns,
        window_ns: 50 * MS,
    };
    [
        Scenario {
            name: "single",
            legs: 1,
            redundancy: Redundancy::Single,
            skew: 0,
            lossy: false,
        },
        Scenario {
            name: "merge",
            legs: 2,
            redundancy: merge(0),
            skew: 0,
            lossy: false,
        },
        Scenario {
            name: "merge-lossy",
            legs: 2,
            redundancy: merge(0),
            skew: 20,
            lossy: true,
        },
        Scenario {
            name: "merge-delay-lossy",
            legs: 2,
            redundancy: merge(50 * MS),
            skew: 20,
            lossy: true,
        },
        Scenario {
            name: "failover",
            legs: 2,
            redundancy: Redundancy::Failover {
                after_ns: 100 * MS,
                revert_after_ns: Some(10_000 * MS),
                rtp: true,
            },
            skew: 0,
            lossy: false,
        },
    ]
}

/// A flow under one scenario, delivering block after block.
struct Run {
    core: Core,
    flow: FlowId,
    out: Arc<OutputCounters>,
    events: Vec<(u64, u8, i32)>,
    datagram: Vec<u8>,
    sent: Vec<SendToken>,
    base: u16,
    now: u64,
}

impl Run {
    fn new(s: &Scenario) -> Self {
        let mut core = Core::new(PoolSet::new(PoolConfig::default()).expect("pool fits"));
        let out = Arc::<OutputCounters>::default();
        let spec = OutputSpec {
            depth: 256,
            gso: false,
            counters: Arc::clone(&out),
        };
        let flow = core
            .add_flow([spec], Arc::default(), s.legs, s.redundancy, 1)
            .expect("an empty core takes a flow");
        let mut datagram = vec![0x47u8; 12 + 1316];
        let _ = mcrelay_wire::rtp::build(&mut datagram, 33, 0, 0, 0x2022_0007);
        Self {
            core,
            flow,
            out,
            events: schedule(s),
            datagram,
            sent: Vec::with_capacity(64),
            base: 0,
            now: 1_000 * MS,
        }
    }

    fn block(&mut self) {
        let result = i32::try_from(self.datagram.len()).unwrap_or(0);
        let start = self.now;
        for &(slot, leg, j) in &self.events {
            let seq = self.base.wrapping_add_signed(i16::try_from(j).unwrap_or(0));
            self.datagram[2..4].copy_from_slice(&seq.to_be_bytes());
            let now = start + slot * PERIOD_NS;
            let core = &mut self.core;
            black_box(core.receive_on(self.flow, LegId(leg), black_box(&self.datagram), now));
            core.tick(now);
            let sent = &mut self.sent;
            core.flush(&mut |req, _| {
                sent.push(req.token());
                true
            });
            for token in sent.drain(..) {
                core.complete(token, result, &mut |_, _| true);
            }
        }
        self.now = start + u64::try_from(BLOCK).unwrap_or(0) * PERIOD_NS;
        self.base = self.base.wrapping_add(u16::try_from(BLOCK).unwrap_or(0));
    }
}

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
