//! Stream health's per-datagram cost on the packet path, each payload mode
//! next to `udp` in one run: the worker's hook as the worker pays it
//! (`mcrelay_relay::health::InputHealth::observe_at` per datagram; the
//! monotonic clock read and `InputHealth::publish`, the relaxed stores, once
//! per [`BATCH`] datagrams) on a clean stream of 1316-byte TS payloads
//! (seven packets; 1328 bytes with the RTP header).
//! IDs: `health/observe/{udp,rtp,mpegts,rtp-mpegts}`.
//!
//! On a loaded machine those four move with the load between one ID and
//! the next, by more than the differences between them. So
//! `health/added/{rtp,mpegts,rtp-mpegts}` measure the difference itself,
//! interleaved: blocks of [`BATCH`] datagrams of the mode and of `udp`
//! alternate (the order swapped every block), each block timed, and the
//! time reported is the mode's blocks' total minus `udp`'s blocks' total
//! (at least 64 blocks each per sample): the nanoseconds the mode adds per
//! datagram, with both sides under the same load within microseconds.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mcrelay_benches::health_datagram;
use mcrelay_relay::counters::FlowCounters;
use mcrelay_relay::health::{HealthSettings, InputHealth};
use mcrelay_wire::health::Payload;
use mcrelay_wire::ts;

/// Datagrams in the ring the benchmark walks: small enough to stay in
/// cache, as a datagram the worker just received is (a ring of thousands
/// measured cache misses: ~200 ns more). A multiple of 16, so the
/// continuity counters run on across the wrap; the RTP sequence number is
/// rewritten before each datagram (in every mode, for the same work), so
/// it runs on too.
const RING: usize = 64;

/// Datagrams per completion batch: the worker reads the clock and
/// publishes once per batch (`CQE_BATCH` in the worker's driver; a busy
/// flow's batches are full).
const BATCH: usize = 64;

fn stream(payload: Payload) -> Vec<Vec<u8>> {
    (0..RING).map(|i| health_datagram(payload, i)).collect()
}

fn observe(c: &mut Criterion) {
    let mut group = c.benchmark_group("health");
    group.throughput(Throughput::Elements(1));
    for payload in Payload::ALL {
        let datagrams = stream(payload);
        let settings = HealthSettings {
            payload,
            ..HealthSettings::default()
        };
        let mut datagrams = datagrams;
        let mut h = InputHealth::new(settings, Arc::new(FlowCounters::default()));
        let mut i = 0usize;
        let mut seq = 0u16;
        let mut now = 0;
        // Where the sequence number goes: the RTP header, or (no RTP) the
        // last TS packet's payload.
        let at = if payload.has_rtp() {
            2
        } else {
            7 * ts::PACKET - 2
        };
        group.bench_function(BenchmarkId::new("observe", payload.as_str()), |b| {
            b.iter(|| {
                let d = &mut datagrams[i];
                d[at..at + 2].copy_from_slice(&seq.to_be_bytes());
                if i % BATCH == 0 {
                    h.publish();
                    now = mcrelay_relay::health::now_ns();
                }
                h.observe_at(black_box(d), black_box(now));
                i = (i + 1) % RING;
                seq = seq.wrapping_add(1);
            });
        });
        assert_clean(&mut h, payload);
    }
    group.finish();
}

/// Publish, and check the benchmark's stream was clean.
fn assert_clean(h: &mut InputHealth, payload: Payload) {
    h.publish();
    let c = h.counters();
    assert_eq!(
        (
            c.rtp_lost.get(),
            c.rtp_resyncs.get(),
            c.ts_continuity_errors.get()
        ),
        (0, 0, 0),
        "{payload}: the benchmark's stream must be clean"
    );
}

/// One input's hook walking its ring, as in [`observe`].
struct Input {
    h: InputHealth,
    datagrams: Vec<Vec<u8>>,
    at: usize,
    i: usize,
    seq: u16,
}

impl Input {
    fn new(payload: Payload) -> Self {
        let settings = HealthSettings {
            payload,
            ..HealthSettings::default()
        };
        Self {
            h: InputHealth::new(settings, Arc::new(FlowCounters::default())),
            datagrams: stream(payload),
            at: if payload.has_rtp() {
                2
            } else {
                7 * ts::PACKET - 2
            },
            i: 0,
            seq: 0,
        }
    }

    /// One batch: the clock read and the publish, then [`BATCH`]
    /// datagrams observed. Returns how long it took.
    fn batch(&mut self) -> Duration {
        let start = Instant::now();
        self.h.publish();
        let now = mcrelay_relay::health::now_ns();
        for _ in 0..BATCH {
            let d = &mut self.datagrams[self.i];
            d[self.at..self.at + 2].copy_from_slice(&self.seq.to_be_bytes());
            self.h.observe_at(black_box(d), black_box(now));
            self.i = (self.i + 1) % RING;
            self.seq = self.seq.wrapping_add(1);
        }
        start.elapsed()
    }
}

fn added(c: &mut Criterion) {
    let mut group = c.benchmark_group("health");
    // One element per datagram of the mode (the udp ones aren't counted).
    group.throughput(Throughput::Elements(1));
    for payload in [Payload::Rtp, Payload::Mpegts, Payload::RtpMpegts] {
        let mut udp = Input::new(Payload::Udp);
        let mut mode = Input::new(payload);
        group.bench_function(BenchmarkId::new("added", payload.as_str()), |b| {
            b.iter_custom(|iters| {
                // At least 64 blocks (4096 datagrams each side) per sample.
                let blocks = iters.div_ceil(BATCH as u64).max(64);
                let (mut with, mut without) = (Duration::ZERO, Duration::ZERO);
                for k in 0..blocks {
                    if k % 2 == 0 {
                        without += udp.batch();
                        with += mode.batch();
                    } else {
                        with += mode.batch();
                        without += udp.batch();
                    }
                }
                // Scaled to `iters` datagrams. A difference at or below
                // zero (the load hit the udp blocks harder) reads as 1 ns
                // for the sample, as Criterion refuses zero: it moves the
                // median only if half the samples are such.
                let per =
                    with.saturating_sub(without).as_secs_f64() / (blocks * BATCH as u64) as f64;
                Duration::from_secs_f64(per * iters as f64).max(Duration::from_nanos(1))
            });
        });
        assert_clean(&mut mode.h, payload);
    }
    group.finish();
}

criterion_group!(benches, observe, added);
criterion_main!(benches);
