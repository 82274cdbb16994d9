//! The data plane's per-packet userspace work without the kernel, so CI
//! catches regressions of the hot path: classify, take a pool buffer, copy
//! the payload, park it for N sends, build N send SQEs, complete them,
//! give the buffer back. IDs: `dataplane/packet/{1316,8000}/{1,4}`.
//!
//! `dataplane/core/{1316,8000}/{1,4}`: the same through the relay core
//! (`Core::receive`, `Core::flush` into a send list, `Core::complete` per
//! send), with its counters, admission and queue bookkeeping: the
//! worker's whole userspace share of a datagram but the SQE and CQE
//! translation.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use io_uring::{opcode, squeue, types::Fd};
use mcrelay_pool::{MAX_PAYLOAD, PoolConfig, PoolSet, SharedBuffer};
use mcrelay_relay::{Core, OutputSpec, Redundancy, SendToken};
use mcrelay_uring::bench_support::{FlowId, InFlight, OutputId, UserData};

fn packet(c: &mut Criterion) {
    let config = PoolConfig::default();
    let mut pool = PoolSet::new(config).expect("pool fits in memory");
    let mut in_flight = InFlight::with_capacity(config.small + config.standard + config.jumbo);
    let mut sqes: Vec<squeue::Entry> = Vec::with_capacity(4);
    let flow = FlowId::new(0).expect("flow 0 exists");
    let mut group = c.benchmark_group("dataplane");
    for size in [1316usize, 8000] {
        let payload: Vec<u8> = (0..size).map(|i| i.to_le_bytes()[0]).collect();
        for outputs in [1u16, 4] {
            group.throughput(Throughput::Elements(1));
            group.bench_function(
                BenchmarkId::new("packet", format!("{size}/{outputs}")),
                |b| {
                    b.iter(|| {
                        let data = black_box(payload.as_slice());
                        if data.len() > MAX_PAYLOAD {
                            return;
                        }
                        let Some(buf) = pool.take_filled(data) else {
                            return;
                        };
                        let shared =
                            SharedBuffer::new(buf, u32::from(outputs)).expect("outputs > 0");
                        let (ptr, len) = (
                            shared.buffer().as_ptr(),
                            u32::try_from(shared.buffer().len()).unwrap_or(0),
                        );
                        let Ok(slot) = in_flight.insert(shared) else {
                            return;
                        };
                        for output in 0..outputs {
                            let entry = opcode::Send::new(Fd(3 + i32::from(output)), ptr, len)
                                .build()
                                .user_data(
                                    UserData::Send {
                                        slot,
                                        flow,
                                        output: OutputId(output),
                                    }
                                    .encode(),
                                );
                            sqes.push(entry);
                        }
                        black_box(&sqes);
                        // The completions, as the worker reaps them.
                        for sqe in sqes.drain(..) {
                            black_box(sqe);
                            if let Some(buf) = in_flight.complete_one(slot) {
                                let _ = pool.give(buf);
                            }
                        }
                    });
                },
            );
        }
    }
    group.finish();
}

fn core(c: &mut Criterion) {
    let mut group = c.benchmark_group("dataplane");
    for size in [1316usize, 8000] {
        let payload: Vec<u8> = (0..size).map(|i| i.to_le_bytes()[0]).collect();
        for outputs in [1usize, 4] {
            let pool = PoolSet::new(PoolConfig::default()).expect("pool fits in memory");
            let mut core = Core::new(pool);
            let specs = (0..outputs).map(|_| OutputSpec {
                depth: 256,
                gso: false,
                counters: Arc::default(),
            });
            let flow = core
                .add_flow(specs, Arc::default(), 1, Redundancy::Single, 1)
                .expect("an empty core takes a flow");
            let mut sent: Vec<SendToken> = Vec::with_capacity(outputs);
            let result = i32::try_from(size).unwrap_or(0);
            group.throughput(Throughput::Elements(1));
            group.bench_function(BenchmarkId::new("core", format!("{size}/{outputs}")), |b| {
                b.iter(|| {
                    black_box(core.receive(flow, black_box(payload.as_slice())));
                    core.flush(&mut |req, _| {
                        sent.push(req.token());
                        true
                    });
                    for token in sent.drain(..) {
                        core.complete(token, result, &mut |_, _| true);
                    }
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, packet, core);
criterion_main!(benches);
