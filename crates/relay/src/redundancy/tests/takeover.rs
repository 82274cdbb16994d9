//! `Core::take_over`: a reload's new flow takes the old one's
//! redundancy state over, so the datagrams both flows' sockets receive
//! around the swap leave once; with a fake clock, as the other rules.

use proptest::prelude::*;

use super::*;
use crate::Handover;
use mcrelay_pool::Class;

impl Harness {
    /// A second flow on the same core (the reload's new one), sending
    /// into the same output record (`sent`) as the first.
    fn add(&mut self, legs: u8, redundancy: Redundancy) -> (FlowId, Arc<FlowCounters>) {
        let counters = Arc::<FlowCounters>::default();
        let spec = OutputSpec {
            depth: 100_000,
            gso: false,
            counters: Arc::default(),
        };
        let id = self
            .core
            .add_flow([spec], Arc::clone(&counters), legs, redundancy, 8)
            .expect("room");
        (id, counters)
    }

    fn rx_on(&mut self, flow: FlowId, leg: u8, seq: u16, now: u64) -> Received {
        let r = self.core.receive_on(flow, LegId(leg), &rtp(seq, SSRC), now);
        self.send();
        r
    }

    /// The flow `flow` replaces `self.flow`, which goes once quiet.
    fn replace(&mut self, flow: FlowId, handover: Handover, now: u64) {
        let old = self.flow;
        assert!(self.core.take_over(old, flow, handover, now));
        assert!(self.core.is_removing(old));
        assert_eq!(self.core.held(old), 0, "the hold moved");
        self.send();
    }

    fn free_buffers(&self) -> u32 {
        Class::ALL.iter().map(|&c| self.core.pool().free(c)).sum()
    }
}

fn repeats(sent: &[u16]) -> Vec<u16> {
    let mut seen = std::collections::HashSet::new();
    sent.iter().copied().filter(|s| !seen.insert(*s)).collect()
}

#[test]
fn a_merge_taking_over_keeps_the_hold_in_order_and_repeats_nothing() {
    let mut h = Harness::new(2, merge(50, 100));
    let free = h.free_buffers();
    for seq in [0, 2, 3] {
        h.rx(0, seq, 0);
    }
    assert_eq!((h.sent.as_slice(), h.core.held(h.flow)), (&[0u16][..], 2));
    let (new, counters) = h.add(3, merge(50, 100));
    h.replace(new, Handover::default(), MS);
    assert_eq!(h.core.held(new), 2, "held packets keep their buffers");
    // The old flow's late receives go nowhere; the new legs' copies of
    // what it sent or held are duplicates; the gap still fills in order.
    assert_eq!(h.rx(0, 4, MS), Received::Dropped);
    assert_eq!(h.red().duplicates.get(), 1, "counted on the old flow");
    for seq in [0, 2, 3, 1, 4] {
        h.rx_on(new, 1, seq, 2 * MS);
    }
    assert_eq!(h.sent, [0, 1, 2, 3, 4]);
    assert_eq!(counters.redundancy.duplicates.get(), 3);
    assert!(h.core.is_quiet(h.flow));
    h.core.forget(h.flow);
    h.core.remove_flow(new);
    h.send();
    assert_eq!(h.free_buffers(), free, "every buffer back");
}

#[test]
fn a_merge_without_delay_taking_over_a_hold_sends_it_at_once_in_order() {
    let mut h = Harness::new(2, merge(50, 100));
    for seq in [0, 2, 3] {
        h.rx(0, seq, 0);
    }
    let (new, _) = h.add(2, merge(0, 100));
    h.replace(new, Handover::default(), MS);
    assert_eq!(h.sent, [0, 2, 3]);
    for seq in [2, 3, 1, 4] {
        h.rx_on(new, 1, seq, 2 * MS);
    }
    assert_eq!(h.sent, [0, 2, 3, 1, 4], "1 recovered late, nothing twice");
}

#[test]
fn a_merge_with_a_delay_taking_over_one_without_waits_for_the_first_gap() {
    let mut h = Harness::new(2, merge(0, 100));
    for seq in [0, 1, 3, 4] {
        h.rx(0, seq, 0);
    }
    let (new, _) = h.add(2, merge(50, 100));
    h.replace(new, Handover::default(), MS);
    for seq in [5, 2, 3, 6] {
        h.rx_on(new, 1, seq, 2 * MS);
    }
    assert_eq!(h.sent, [0, 1, 3, 4, 2, 5, 6]);
}

#[test]
fn a_merge_taking_over_a_one_leg_flow_starts_after_its_last_number() {
    let mut h = Harness::new(1, Redundancy::Single);
    for seq in 0..10 {
        h.rx(0, seq, 0);
    }
    let (new, counters) = h.add(2, merge(0, 50));
    let handover = Handover {
        kept: 0b01,
        last_rtp: Some((9, SSRC)),
    };
    h.replace(new, handover, MS);
    // The new leg 1 is behind: its copies of 5..9 are duplicates.
    for seq in 5..12 {
        h.rx_on(new, 1, seq, 2 * MS);
        h.rx_on(new, 0, seq + 5, 2 * MS);
    }
    assert_eq!(repeats(&h.sent), [] as [u16; 0], "{:?}", h.sent);
    assert_eq!(h.sent, (0..17).collect::<Vec<_>>());
    assert!(counters.redundancy.duplicates.get() >= 5);
}

#[test]
fn a_failover_taking_over_keeps_its_active_leg_and_guard() {
    let mut h = Harness::new(2, failover(100, None, true));
    // Leg 0 falls silent: leg 1 is active.
    h.rx(0, 0, 0);
    h.rx(1, 0, 0);
    h.rx(1, 1, 200 * MS);
    h.rx(1, 2, 201 * MS);
    assert_eq!(h.core.active_leg(h.flow), Some(LegId(1)));
    let (new, counters) = h.add(3, failover(100, None, true));
    h.replace(
        new,
        Handover {
            kept: 0b011,
            last_rtp: None,
        },
        202 * MS,
    );
    assert_eq!(h.core.active_leg(new), Some(LegId(1)));
    assert_eq!(counters.redundancy.active_leg.get(), 1);
    h.rx_on(new, 1, 2, 203 * MS);
    h.rx_on(new, 1, 3, 203 * MS);
    assert_eq!(h.sent, [0, 1, 2, 3]);
    assert_eq!(counters.redundancy.duplicates.get(), 1);
}

#[test]
fn a_failover_whose_active_leg_changed_goes_to_a_healthy_one() {
    let mut h = Harness::new(2, failover(100, None, true));
    h.rx(0, 0, 0);
    h.rx(1, 0, 0);
    h.rx(0, 1, 50 * MS);
    h.rx(1, 1, 50 * MS);
    assert_eq!(h.core.active_leg(h.flow), Some(LegId(0)));
    let (new, _) = h.add(2, failover(100, None, true));
    // Leg 0 is a new input (another group): only leg 1 is kept.
    let kept = Handover {
        kept: 0b10,
        last_rtp: None,
    };
    h.replace(new, kept, 60 * MS);
    assert_eq!(h.core.active_leg(new), Some(LegId(1)));
    h.rx_on(new, 1, 2, 61 * MS);
    assert_eq!(h.sent, [0, 1, 2]);
}

#[test]
fn take_over_refuses_unknown_or_going_flows() {
    let mut h = Harness::new(2, merge(0, 50));
    let (new, _) = h.add(2, merge(0, 50));
    assert!(!h.core.take_over(h.flow, h.flow, Handover::default(), 0));
    assert!(
        !h.core
            .take_over(h.flow, FlowId::new(7).expect("id"), Handover::default(), 0)
    );
    assert!(h.core.take_over(h.flow, new, Handover::default(), 0));
    assert!(
        !h.core.take_over(h.flow, new, Handover::default(), 0),
        "once"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// A two-leg stream with disjoint losses and a skewed leg, the flow
    /// replaced at a random point by one with the same or another delay
    /// (a third leg added); the old flow keeps receiving a few datagrams
    /// after the swap (its cancelled receives' last completions). The
    /// combined output has every number once (from the stream's first
    /// number on), and every buffer comes back.
    #[test]
    fn a_takeover_at_any_point_sends_every_number_once(
        at in 0usize..400,
        stale in 0usize..6,
        old_delay in prop::sample::select(vec![0u64, 30]),
        new_delay in prop::sample::select(vec![0u64, 30]),
        skew in 0u64..20,
        seed in any::<u64>(),
    ) {
        let lost = |leg: u8, seq: u16| {
            let x = (u64::from(seq) ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58;
            // Disjoint: 1 in 16 on leg 0, another 1 in 16 on leg 1.
            x == u64::from(leg)
        };
        let events = two_legs(200, skew, lost);
        let mut h = Harness::new(2, merge(old_delay, 100));
        let free = h.free_buffers();
        let (new, _) = h.add(3, merge(new_delay, 100));
        let at = at.min(events.len());
        let mut now = 0;
        for (i, &(t, leg, seq)) in events.iter().enumerate() {
            now = t;
            if i == at {
                h.replace(new, Handover { kept: 0b011, last_rtp: None }, now);
            }
            if i < at || i < at + stale {
                h.rx_on(h.flow, leg, seq, now);
            }
            if i >= at {
                h.rx_on(new, leg, seq, now);
            }
            h.tick(now);
        }
        if at == events.len() {
            h.replace(new, Handover::default(), now);
        }
        h.tick(now + 200 * MS);
        prop_assert_eq!(repeats(&h.sent), Vec::<u16>::new());
        let mut got = h.sent.clone();
        got.sort_unstable();
        // A stream starts at its first number to arrive: one below it
        // (its first copy lost, the other leg's behind) is late for a
        // merge with a delay, as without a takeover.
        let first = events.first().map_or(0, |e| e.2);
        got.retain(|&s| s >= first);
        prop_assert_eq!(got, (first..200).collect::<Vec<u16>>());
        h.core.remove_flow(new);
        h.send();
        prop_assert_eq!(h.free_buffers(), free);
    }
}
