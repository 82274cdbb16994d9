//! RIST on the packet path never allocates: a counting global allocator
//! watches a RIST output (every datagram copied into its ring, NACKs
//! answered with retransmissions, sender reports) and a RIST input (gaps
//! NACKed, datagrams held behind them, released in order, one gap never
//! filled and skipped) through 10 000 datagrams, a RIST tick after each,
//! every send flushed and completed, after the flows were added.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use mcrelay_pool::{PoolConfig, PoolSet};
use mcrelay_relay::counters::FlowCounters;
use mcrelay_relay::rist::rtcp::{self, Writer};
use mcrelay_relay::{Core, LegId, OutputId, OutputSpec, Redundancy, RtcpTo, SendToken};
use mcrelay_wire::rtp;

mod counting;
use counting::ALLOCATIONS;

const MS: u64 = 1_000_000;

#[test]
fn rist_output_and_input_never_allocate() {
    let mut core = Core::new(PoolSet::new(PoolConfig::default()).expect("pool"));
    let spec = || OutputSpec {
        depth: 256,
        gso: false,
        counters: Arc::default(),
        resume_after: None,
    };
    let out_counters = Arc::<FlowCounters>::default();
    let out = core
        .add_flow(
            [spec()],
            Arc::clone(&out_counters),
            1,
            Redundancy::Single,
            16,
        )
        .expect("room");
    assert!(core.enable_rist_output(out, OutputId(0), 200));
    let in_counters = Arc::<FlowCounters>::default();
    let input = core
        .add_flow(
            [spec()],
            Arc::clone(&in_counters),
            1,
            Redundancy::Single,
            16,
        )
        .expect("room");
    assert!(core.enable_rist_input(input, LegId(0), 200));
    let mut datagram = vec![0x47u8; 12 + 1316];
    let mut nack = [0u8; 64];
    let mut sent: Vec<SendToken> = Vec::with_capacity(1 << 16);
    let mut nacks_seen = 0u64;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let mut now = 0u64;
    for i in 0..10_000u32 {
        now += MS;
        let seq = u16::try_from(i % 65_536).unwrap_or(0);
        let _ = rtp::build(&mut datagram, 33, seq, i, 0x10);
        let _ = core.receive_on(out, LegId(0), &datagram, now);
        // The receivers of the output lose every 20th and NACK it.
        if i % 20 == 5 {
            let mut w = Writer::new(&mut nack);
            w.range_nack(0x10, &[(seq.wrapping_sub(1), 0)]);
            let n = w.len();
            core.rist_output_rtcp(out, OutputId(0), now, &nack[..n]);
        }
        // The input loses every 10th; its retransmission comes 20 ms
        // later, except for number 5000's.
        if i % 10 != 3 {
            let _ = core.receive_on(input, LegId(0), &datagram, now);
        }
        if i >= 20 && i % 10 == 3 && i != 5023 {
            let s = seq.wrapping_sub(20);
            let _ = rtp::build(&mut datagram, 33, s, i - 20, 0x11);
            let _ = core.receive_on(input, LegId(0), &datagram, now);
        }
        core.rist_tick(now, now, |to, d| {
            if matches!(to, RtcpTo::Leg(..)) {
                for p in rtcp::packets(d) {
                    rtcp::nacked(&p, |_| nacks_seen += 1);
                }
            }
        });
        core.flush(&mut |req, _| {
            sent.push(req.token());
            true
        });
        for token in sent.drain(..) {
            core.complete(token, 1328, &mut |_, _| true);
        }
    }
    let allocated = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(allocated, 0, "RIST allocated {allocated} times");
    assert!(out_counters.rist.retransmitted.get() >= 490);
    assert!(nacks_seen >= 999);
    assert!(in_counters.rist.recovered.get() >= 990);
    assert_eq!(in_counters.rist.unrecovered.get(), 1);
}
