//! The redundancy rules on the packet path never allocate: a counting
//! global allocator watches the relay core take 40 000 datagrams over
//! merge (with and without a delay), failover (with the RTP guard) and
//! single flows — losses on each leg, a skewed leg, duplicates, held
//! packets, a switch and a return, an SSRC change, a jump — with a tick
//! after each datagram and every send flushed and completed, after the
//! flows were added.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use mcrelay_pool::{PoolConfig, PoolSet};
use mcrelay_relay::counters::FlowCounters;
use mcrelay_relay::{Core, FlowId, LegId, OutputSpec, Redundancy, SendToken};
use mcrelay_wire::rtp;

use mcrelay_testkit::counting::{ALLOCATIONS, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

const MS: u64 = 1_000_000;

#[test]
fn merge_failover_and_their_timers_never_allocate() {
    let mut core = Core::new(PoolSet::new(PoolConfig::default()).expect("pool"));
    let rules = [
        (1, Redundancy::Single),
        (
            2,
            Redundancy::Merge {
                delay_ns: 0,
                window_ns: 50 * MS,
            },
        ),
        (
            3,
            Redundancy::Merge {
                delay_ns: 30 * MS,
                window_ns: 50 * MS,
            },
        ),
        (
            2,
            Redundancy::Failover {
                after_ns: 20 * MS,
                revert_after_ns: Some(100 * MS),
                rtp: true,
                // The header rewrite is on the measured path too.
                rtp_rewrite: Some(90_000),
                gap_factor: 4,
            },
        ),
    ];
    let flows: Vec<(FlowId, u8, Arc<FlowCounters>)> = rules
        .iter()
        .map(|&(legs, rule)| {
            let counters = Arc::<FlowCounters>::default();
            let spec = OutputSpec {
                depth: 256,
                gso: true,
                counters: Arc::default(),
                resume_after: None,
            };
            let id = core
                .add_flow([spec], Arc::clone(&counters), legs, rule, 16)
                .expect("room");
            (id, legs, counters)
        })
        .collect();
    let mut datagram = vec![0x47u8; 12 + 1316];
    let mut sent: Vec<SendToken> = Vec::with_capacity(1 << 16);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let mut now = 0u64;
    for i in 0..10_000u32 {
        now += MS / 10;
        // Numbers: a jump at 4000, a new source at 7000; leg 0 silent
        // from 2000 to 3000 (failover switches, then returns).
        let mut seq = u16::try_from(i % 65_536).unwrap_or(0);
        if i >= 4000 {
            seq = seq.wrapping_add(20_000);
        }
        let ssrc = if i >= 7000 { 2 } else { 1 };
        for &(flow, legs, _) in &flows {
            for leg in 0..legs {
                // Leg 1 runs 25 numbers behind; each leg loses its own 5 %,
                // leg 2 a third (the delayed merge holds numbers behind its
                // gaps until the late leg fills them).
                let s = if leg == 1 { seq.wrapping_sub(25) } else { seq };
                let lost = (i % 20 == u32::from(leg) * 7)
                    || (leg == 0 && (2000..3000).contains(&i))
                    || (leg == 2 && i % 3 == 0);
                if lost {
                    continue;
                }
                let _ = rtp::build(&mut datagram, 33, s, i, ssrc);
                let _ = core.receive_on(flow, LegId(leg), &datagram, now);
            }
        }
        core.tick(now);
        core.flush(&mut |req, _| {
            sent.push(req.token());
            true
        });
        for token in sent.drain(..) {
            core.complete(token, 1328, &mut |_, _| true);
        }
    }
    let allocated = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(
        allocated, 0,
        "the redundancy rules allocated {allocated} times"
    );
    let r = |k: usize| &flows[k].2.redundancy;
    assert!(r(1).duplicates.get() > 0 && r(1).recovered.get() > 0);
    // The jump restarts the merge; the new source continues the numbering,
    // so it is the same stream to the merge (`mcrelay_relay::sequence`).
    assert!(r(1).resets.get() >= 1, "the jump");
    assert!(r(2).forwarded[2].get() > 0, "the third leg filled gaps");
    assert_eq!(r(3).switches.get(), 2, "to the backup and back");
    assert!(r(3).standby[1].get() > 0);
}
