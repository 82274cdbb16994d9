//! The stream-health hook of the packet path never allocates: a counting
//! global allocator watches while every payload mode reads thousands of
//! datagrams — clean RTP-in-TS, and damaged ones (cut short, bad sync
//! bytes, not RTP) — after the tracker was built.

use std::sync::Arc;

use mcrelay_relay::counters::FlowCounters;
use mcrelay_relay::health::{HealthSettings, InputHealth};
use mcrelay_wire::health::Payload;
use mcrelay_wire::{rtp, ts};

use mcrelay_testkit::counting::{Counting, on_this_thread};

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn observing_never_allocates() {
    let mut datagrams: Vec<Vec<u8>> = (0..64u16)
        .map(|seq| {
            let mut d = vec![0xffu8; 12 + 7 * ts::PACKET];
            let _ = rtp::build(&mut d, 33, seq, u32::from(seq) * 900, 1);
            for (k, p) in d[12..].chunks_exact_mut(ts::PACKET).enumerate() {
                let cc = u8::try_from((usize::from(seq) * 7 + k) % 16).unwrap();
                ts::build(p, 0x100 + u16::try_from(k).unwrap(), cc, true, None);
            }
            d
        })
        .collect();
    datagrams[10][12] = 0x48; // a lost sync byte
    datagrams[20][0] = 0x40; // not RTP
    let mut trackers: Vec<InputHealth> = Payload::ALL
        .iter()
        .map(|&payload| {
            let settings = HealthSettings {
                payload,
                ..HealthSettings::default()
            };
            InputHealth::new(settings, Arc::new(FlowCounters::default()))
        })
        .collect();
    // The clock's epoch is set on first use: before the window.
    let _ = mcrelay_relay::health::now_ns();
    // This thread's allocations only: the test harness's own threads may
    // allocate meanwhile (seen on a loaded machine).
    let before = on_this_thread();
    for round in 0..100 {
        for (i, d) in datagrams.iter().enumerate() {
            let now = mcrelay_relay::health::now_ns();
            for t in &mut trackers {
                t.observe_at(d, now);
                // Cut short, too.
                t.observe_at(&d[..(i * 37 + round) % d.len()], now);
                t.publish();
            }
        }
    }
    let allocated = on_this_thread() - before;
    assert_eq!(allocated, 0, "the health hook allocated {allocated} times");
    let rtp_ts = trackers[3].counters();
    assert!(rtp_ts.ts_sync_errors.get() > 0 && rtp_ts.rtp_malformed.get() > 0);
    assert!(rtp_ts.ts_packets.get() > 0);
}
