//! Instruction counts (callgrind, via gungraun) of stream health's
//! per-datagram cost, each payload mode next to `udp`: the figure issue 16
//! asks for (≤ 25 ns added for `rtp-mpegts`), stable on a loaded machine
//! where `benches/health.rs`'s times are not.
//!
//! Each run observes `N` datagrams of a clean stream of 1316-byte TS
//! payloads (seven packets; 1328 bytes with the RTP header), after `WARM`
//! datagrams observed in setup (not counted) so the RTP sequence, the PID's
//! continuity counter and the jitter are past their first-packet paths: the
//! count per datagram is the total divided by `N`, loop and `black_box`
//! included (the same in every mode, so they cancel in the difference with
//! `udp`). Every datagram is distinct (its own sequence number, timestamp
//! and continuity counters), so nothing is rewritten inside the counted
//! loop; instruction counts don't depend on the cache, so the stream's size
//! doesn't matter here. The datagrams are handed back to the teardown, so
//! freeing them (~200 instructions each) isn't counted. The teardown (not
//! counted) checks that the stream was clean and every datagram parsed.
//!
//! Two groups: `tracker` is `mcrelay_wire::health::InputTracker::observe`
//! (the parse and the bookkeeping); `hook` is the worker's
//! `mcrelay_relay::health::InputHealth::observe_at` per datagram plus
//! `InputHealth::publish` (the relaxed stores) once per [`BATCH`]
//! datagrams, as the worker pays them apart from its clock read (once per
//! batch too, the same in every mode).

use std::hint::black_box;
use std::sync::Arc;

use gungraun::{library_benchmark, library_benchmark_group, main};
use mcrelay_benches::health_datagram;
use mcrelay_relay::counters::FlowCounters;
use mcrelay_relay::health::{HealthSettings, InputHealth};
use mcrelay_wire::health::{InputTracker, Payload};

/// Datagrams observed in setup, before the counted ones.
const WARM: usize = 16;
/// Datagrams observed in the counted run.
const N: usize = 1000;
/// Arrival spacing, matching the RTP timestamps' 900 ticks at 90 kHz.
const STEP_NS: u64 = 10_000_000;
const RTP_CLOCK_HZ: u32 = 90_000;
/// Datagrams per completion batch: the worker publishes once per batch
/// (`CQE_BATCH` in its driver; a busy flow's batches are full).
const BATCH: usize = 64;

/// `WARM + N` datagrams of one clean stream in `payload`'s framing.
fn stream(payload: Payload) -> Vec<Vec<u8>> {
    (0..WARM + N).map(|i| health_datagram(payload, i)).collect()
}

fn now(i: usize) -> u64 {
    i as u64 * STEP_NS
}

fn tracker_setup(payload: Payload) -> (InputTracker, Vec<Vec<u8>>) {
    let datagrams = stream(payload);
    let mut t = InputTracker::new(payload, RTP_CLOCK_HZ);
    for (i, d) in datagrams.iter().take(WARM).enumerate() {
        t.observe(d, now(i));
    }
    (t, datagrams)
}

fn tracker_teardown((t, _datagrams): (InputTracker, Vec<Vec<u8>>)) {
    assert_eq!(t.arrival().last_ns, Some(now(WARM + N - 1)));
    let r = t.rtp();
    assert_eq!(
        (r.lost, r.duplicates, r.reordered, r.malformed),
        (0, 0, 0, 0)
    );
    let s = t.ts();
    assert_eq!(
        (s.sync_errors, s.continuity_errors, s.transport_errors),
        (0, 0, 0)
    );
    // Every datagram parsed, not rejected early (which would be cheaper).
    let all = (WARM + N) as u64;
    let p = t.payload();
    assert_eq!(r.packets, if p.has_rtp() { all } else { 0 });
    assert_eq!(s.packets, if p.has_ts() { 7 * all } else { 0 });
}

#[library_benchmark]
#[bench::udp(args = (Payload::Udp), setup = tracker_setup, teardown = tracker_teardown)]
#[bench::rtp(args = (Payload::Rtp), setup = tracker_setup, teardown = tracker_teardown)]
#[bench::mpegts(args = (Payload::Mpegts), setup = tracker_setup, teardown = tracker_teardown)]
#[bench::rtp_mpegts(args = (Payload::RtpMpegts), setup = tracker_setup, teardown = tracker_teardown)]
fn observe_x1000((mut t, datagrams): (InputTracker, Vec<Vec<u8>>)) -> (InputTracker, Vec<Vec<u8>>) {
    for (i, d) in datagrams.iter().enumerate().skip(WARM) {
        black_box(t.observe(black_box(d), black_box(now(i))));
    }
    (t, datagrams)
}

library_benchmark_group!(name = tracker; benchmarks = observe_x1000);

fn hook_setup(payload: Payload) -> (InputHealth, Vec<Vec<u8>>) {
    let datagrams = stream(payload);
    let settings = HealthSettings {
        payload,
        rtp_clock_hz: RTP_CLOCK_HZ,
        ..HealthSettings::default()
    };
    let mut h = InputHealth::new(settings, Arc::new(FlowCounters::default()));
    for (i, d) in datagrams.iter().take(WARM).enumerate() {
        h.observe_at(d, now(i));
    }
    h.publish();
    (h, datagrams)
}

fn hook_teardown((h, _datagrams): (InputHealth, Vec<Vec<u8>>)) {
    let c = h.counters();
    assert_eq!(c.last_arrival_ns.get(), now(WARM + N - 1) + 1);
    assert_eq!(
        (
            c.rtp_lost.get(),
            c.rtp_duplicates.get(),
            c.rtp_reordered.get(),
            c.rtp_resyncs.get(),
            c.ts_continuity_errors.get(),
            c.ts_sync_errors.get()
        ),
        (0, 0, 0, 0, 0, 0)
    );
    let all = (WARM + N) as u64;
    let p = c.settings().map_or(Payload::Udp, |s| s.payload);
    assert_eq!(c.rtp_packets.get(), if p.has_rtp() { all } else { 0 });
    assert_eq!(c.ts_packets.get(), if p.has_ts() { 7 * all } else { 0 });
}

#[library_benchmark]
#[bench::udp(args = (Payload::Udp), setup = hook_setup, teardown = hook_teardown)]
#[bench::rtp(args = (Payload::Rtp), setup = hook_setup, teardown = hook_teardown)]
#[bench::mpegts(args = (Payload::Mpegts), setup = hook_setup, teardown = hook_teardown)]
#[bench::rtp_mpegts(args = (Payload::RtpMpegts), setup = hook_setup, teardown = hook_teardown)]
fn observe_at_x1000(
    (mut h, datagrams): (InputHealth, Vec<Vec<u8>>),
) -> (InputHealth, Vec<Vec<u8>>) {
    for (i, d) in datagrams.iter().enumerate().skip(WARM) {
        h.observe_at(black_box(d), black_box(now(i)));
        if i % BATCH == BATCH - 1 {
            h.publish();
        }
    }
    h.publish();
    (h, datagrams)
}

library_benchmark_group!(name = hook; benchmarks = observe_at_x1000);

main!(library_benchmark_groups = tracker, hook);
