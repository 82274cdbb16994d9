//! Instruction counts (callgrind, via gungraun) of the driver's one
//! receive path, `Core::ingest`, against the sequence the driver ran
//! itself before it (`InputHealth::observe_at`, then `Core::receive_on`):
//! the cost of moving stream health and reject counting into the core.
//! Both relay a 1316-byte datagram 1000 times as `core_instructions`
//! does (`flush`, `complete` of its send; one output, no GSO), with
//! stream health in `udp` mode observed per datagram and published once
//! per 64 (a completion batch), after 16 in setup. Kept apart from
//! `core_instructions` so that binary, and its figure, stay as they were.

use std::hint::black_box;
use std::sync::Arc;

use gungraun::{library_benchmark, library_benchmark_group, main};
use mcrelay_pool::{PoolConfig, PoolSet};
use mcrelay_relay::counters::{FlowCounters, OutputCounters};
use mcrelay_relay::health::{HealthSettings, InputHealth};
use mcrelay_relay::{Core, FlowId, LegId, OutputSpec, Redundancy, SendToken};

const WARM: usize = 16;
const N: usize = 1000;
/// Datagrams per completion batch: health is published once per batch.
const BATCH: usize = 64;

struct State {
    core: Core,
    flow: FlowId,
    out: Arc<OutputCounters>,
    payload: Vec<u8>,
    sent: Vec<SendToken>,
    /// `observe_then_receive`: the leg's health, kept by the driver.
    health: InputHealth,
}

fn send_all(core: &mut Core, sent: &mut Vec<SendToken>) {
    core.flush(&mut |req, _| {
        sent.push(req.token());
        true
    });
    for token in sent.drain(..) {
        core.complete(token, 1316, &mut |_, _| true);
    }
}

/// The one receive path: `Core::ingest`, the flow's intake set.
fn ingest(s: &mut State, n: usize) {
    for i in 0..n {
        let d = black_box(s.payload.as_slice());
        black_box(s.core.ingest(s.flow, LegId(0), Ok(d), black_box(i as u64)));
        send_all(&mut s.core, &mut s.sent);
        if i % BATCH == BATCH - 1 {
            s.core.publish_health();
        }
    }
}

/// What the driver did itself before `Core::ingest`.
fn observe_then_receive(s: &mut State, n: usize) {
    for i in 0..n {
        let d = black_box(s.payload.as_slice());
        let now = black_box(i as u64);
        black_box(s.health.observe_at(d, now));
        black_box(s.core.receive_on(s.flow, LegId(0), d, now));
        send_all(&mut s.core, &mut s.sent);
        if i % BATCH == BATCH - 1 {
            s.health.publish();
        }
    }
}

fn state(intake: bool) -> State {
    let mut core = Core::new(PoolSet::new(PoolConfig::default()).expect("pool fits"));
    let out = Arc::<OutputCounters>::default();
    let spec = OutputSpec {
        depth: 256,
        gso: false,
        counters: Arc::clone(&out),
        resume_after: None,
    };
    let counters = Arc::<FlowCounters>::default();
    let flow = core
        .add_flow([spec], Arc::clone(&counters), 1, Redundancy::Single, 1)
        .expect("an empty core takes a flow");
    if intake {
        assert!(core.set_intake(flow, HealthSettings::default(), &[]));
    }
    State {
        core,
        flow,
        out,
        payload: vec![0x47u8; 1316],
        sent: Vec::with_capacity(4),
        health: InputHealth::new(HealthSettings::default(), counters),
    }
}

fn ingest_setup() -> State {
    let mut s = state(true);
    ingest(&mut s, WARM);
    s
}

fn observe_setup() -> State {
    let mut s = state(false);
    observe_then_receive(&mut s, WARM);
    s
}

fn teardown(mut s: State) {
    assert_eq!(s.out.packets_out.get(), (WARM + N) as u64);
    // Both published the leg's health (the last batch included).
    s.core.publish_health();
    s.health.publish();
    let arrived = s
        .core
        .counters(s.flow)
        .and_then(|c| c.health.last_arrival());
    assert_eq!(arrived, Some((N - 1) as u64));
}

#[library_benchmark]
#[bench::one_output(setup = ingest_setup, teardown = teardown)]
fn ingest_x1000(mut s: State) -> State {
    ingest(&mut s, N);
    s
}

#[library_benchmark]
#[bench::one_output(setup = observe_setup, teardown = teardown)]
fn observe_then_receive_x1000(mut s: State) -> State {
    observe_then_receive(&mut s, N);
    s
}

library_benchmark_group!(
    name = ingest;
    benchmarks = ingest_x1000, observe_then_receive_x1000
);

main!(library_benchmark_groups = ingest);
