//! The redundancy rules through the core, one test each, with a fake
//! clock: datagrams are RTP packets whose sequence number the output
//! is read back by.

use std::sync::Arc;

use mcrelay_pool::{PoolConfig, PoolSet};

use super::timers::SHIFT;
use super::*;
use crate::counters::{FlowCounters, OutputCounters};
use crate::{Core, FlowId, OutputId, OutputSpec, Received, SendKind, SendToken};

const MS: u64 = 1_000_000;
/// A timer slot: rules fire at most this late.
const SLOT: u64 = 1 << SHIFT;
const SSRC: u32 = 0x2022_0007;

struct Harness {
    core: Core,
    flow: FlowId,
    counters: Arc<FlowCounters>,
    out: Arc<OutputCounters>,
    /// Sequence numbers as they left, in order.
    sent: Vec<u16>,
}

fn rtp(seq: u16, ssrc: u32) -> [u8; 200] {
    let mut b = [0u8; 200];
    let _ = mcrelay_wire::rtp::build(&mut b, 33, seq, u32::from(seq) * 90, ssrc);
    b
}

impl Harness {
    fn new(legs: u8, redundancy: Redundancy) -> Self {
        Self::with_pool(legs, redundancy, 2000)
    }

    fn with_pool(legs: u8, redundancy: Redundancy, buffers: u32) -> Self {
        let mut core = Core::new(
            PoolSet::new(PoolConfig {
                small: buffers,
                standard: buffers,
                jumbo: buffers,
            })
            .expect("pool"),
        );
        let out = Arc::<OutputCounters>::default();
        let counters = Arc::<FlowCounters>::default();
        let spec = OutputSpec {
            depth: 100_000,
            gso: false,
            counters: Arc::clone(&out),
        };
        let flow = core
            .add_flow([spec], Arc::clone(&counters), legs, redundancy, 8)
            .expect("room");
        Self {
            core,
            flow,
            counters,
            out,
            sent: Vec::new(),
        }
    }

    fn rx_ssrc(&mut self, leg: u8, seq: u16, ssrc: u32, now: u64) -> Received {
        let r = self
            .core
            .receive_on(self.flow, LegId(leg), &rtp(seq, ssrc), now);
        self.send();
        r
    }

    fn rx(&mut self, leg: u8, seq: u16, now: u64) -> Received {
        self.rx_ssrc(leg, seq, SSRC, now)
    }

    fn tick(&mut self, now: u64) {
        self.core.tick(now);
        self.send();
    }

    /// Flush, read each sent datagram's number, complete the sends.
    fn send(&mut self) {
        let mut tokens: Vec<(SendToken, usize)> = Vec::new();
        let Self { core, sent, .. } = self;
        core.flush(&mut |req, in_flight| {
            let SendKind::Plain { slot } = req.kind else {
                panic!("no GSO asked");
            };
            let buf = in_flight.buffer(slot).expect("in flight");
            tokens.push((req.token(), buf.len()));
            true
        });
        for (token, _) in &tokens {
            let SendToken::Plain { slot, .. } = *token else {
                unreachable!()
            };
            let buf = self.core.in_flight().buffer(slot).expect("in flight");
            let b = self.core.pool().bytes(buf);
            sent.push(u16::from_be_bytes([b[2], b[3]]));
        }
        for (token, len) in tokens {
            self.core
                .complete(token, i32::try_from(len).expect("small"), &mut |_, _| true);
        }
    }

    fn red(&self) -> &crate::counters::RedundancyCounters {
        &self.counters.redundancy
    }

    /// Every received datagram is accounted for exactly once.
    fn assert_adds_up(&self) {
        let k = &self.counters;
        let r = self.red();
        assert_eq!(
            k.packets_in.get(),
            r.forwarded_total()
                + r.dropped()
                + k.drops.oversize.get()
                + k.drops.pool_exhausted.get()
                + self.out.drop_backlog.get(),
            "received = forwarded + each drop reason"
        );
        let in_flight = self.core.output_in_flight(self.flow, OutputId(0));
        assert_eq!(
            r.forwarded_total(),
            self.out.packets_out.get()
                + self.out.drop_backlog.get()
                + u64::from(in_flight.expect("output"))
                + self.core.held(self.flow) as u64,
            "forwarded = sent + in flight + held"
        );
    }
}

fn merge(delay_ms: u64, window_ms: u64) -> Redundancy {
    Redundancy::Merge {
        delay_ns: delay_ms * MS,
        window_ns: window_ms * MS,
    }
}

fn failover(after_ms: u64, revert_ms: Option<u64>, rtp: bool) -> Redundancy {
    Redundancy::Failover {
        after_ns: after_ms * MS,
        revert_after_ns: revert_ms.map(|r| r * MS),
        rtp,
    }
}

/// Events of a two-leg stream at 1 packet per ms: leg 1 `skew_ms` behind
/// leg 0, each leg losing the numbers `lost` says; in time order.
fn two_legs(n: u16, skew_ms: u64, lost: impl Fn(u8, u16) -> bool) -> Vec<(u64, u8, u16)> {
    let mut events = Vec::new();
    for seq in 0..n {
        for leg in 0..2u8 {
            if !lost(leg, seq) {
                let t = u64::from(seq) * MS + u64::from(leg) * skew_ms * MS + 1000 * MS;
                events.push((t, leg, seq));
            }
        }
    }
    events.sort();
    events
}

/// Play `events`, ticking every 100 µs of fake time in between, then
/// for `after_ms` more.
fn play(h: &mut Harness, events: &[(u64, u8, u16)], after_ms: u64) -> u64 {
    let mut now = events.first().map_or(0, |e| e.0);
    for &(t, leg, seq) in events {
        while now + MS / 10 < t {
            now += MS / 10;
            h.tick(now);
        }
        now = t;
        h.rx(leg, seq, now);
        h.tick(now);
    }
    let end = now + after_ms * MS;
    while now < end {
        now += MS / 10;
        h.tick(now);
    }
    now
}

#[test]
fn single_forwards_every_leg_and_counts_per_leg() {
    let mut h = Harness::new(2, Redundancy::Single);
    for seq in 0..5 {
        assert_eq!(h.rx(0, seq, 0), Received::Queued);
        assert_eq!(h.rx(1, seq, 0), Received::Queued);
    }
    assert_eq!(h.rx(2, 9, 0), Received::Dropped, "no third leg");
    assert_eq!(h.sent.len(), 10);
    assert_eq!(h.red().forwarded[0].get(), 5);
    assert_eq!(h.red().forwarded[1].get(), 5);
    assert_eq!(h.red().unknown_leg.get(), 1);
    h.assert_adds_up();
}

#[test]
fn merge_forwards_the_first_copy_and_counts_the_duplicates() {
    let mut h = Harness::new(2, merge(0, 50));
    for seq in 0..10 {
        assert_eq!(h.rx(1, seq, u64::from(seq) * MS), Received::Queued);
        assert_eq!(h.rx(0, seq, u64::from(seq) * MS + 1), Received::Dropped);
    }
    assert_eq!(h.sent, (0..10).collect::<Vec<_>>());
    assert_eq!(h.red().forwarded[1].get(), 10);
    assert_eq!(h.red().forwarded[0].get(), 0);
    assert_eq!(h.red().duplicates.get(), 10);
    h.tick(100 * MS);
    assert_eq!(h.red().recovered.get(), 0, "both legs delivered all");
    assert_eq!(h.red().lost.get(), 0);
    h.assert_adds_up();
}

#[test]
fn disjoint_losses_on_two_legs_give_a_complete_output() {
    let mut h = Harness::new(2, merge(0, 50));
    // 5 % each, never the same number.
    let lost = |leg: u8, seq: u16| seq % 20 == if leg == 0 { 3 } else { 13 };
    let events = two_legs(1000, 0, lost);
    play(&mut h, &events, 100);
    let mut sorted = h.sent.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..1000).collect::<Vec<_>>(), "each number once");
    assert_eq!(h.red().recovered.get(), 100, "each leg's 50 losses");
    assert_eq!(h.red().lost.get(), 0);
    assert_eq!(h.red().duplicates.get(), 900);
    h.assert_adds_up();
}

#[test]
fn with_no_delay_a_skewed_legs_recovered_packets_leave_late_and_nothing_twice() {
    let mut h = Harness::new(2, merge(0, 50));
    let lost = |leg: u8, seq: u16| leg == 0 && seq % 20 == 3;
    let events = two_legs(500, 20, lost);
    play(&mut h, &events, 100);
    let mut sorted = h.sent.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..500).collect::<Vec<_>>(), "complete, no repeat");
    // Out of order are exactly the numbers leg 0 lost: they came 20 ms
    // later from leg 1, after about 20 higher numbers.
    let late: Vec<u16> = h
        .sent
        .windows(2)
        .filter(|w| w[1] < w[0])
        .map(|w| w[1])
        .collect();
    assert_eq!(late, (0..500).filter(|s| s % 20 == 3).collect::<Vec<_>>());
    let pos = |s: u16| h.sent.iter().position(|&x| x == s).expect("sent");
    assert!(pos(23) > pos(42), "left after the numbers 20 ms newer");
    assert_eq!(h.red().recovered.get(), 25);
    assert_eq!(h.red().forwarded[1].get(), 25);
    assert_eq!(h.red().lost.get(), 0);
    h.assert_adds_up();
}

#[test]
fn with_a_delay_the_output_is_in_sequence_order() {
    let mut h = Harness::new(2, merge(50, 100));
    let lost = |leg: u8, seq: u16| seq % 20 == if leg == 0 { 3 } else { 13 };
    let events = two_legs(500, 20, lost);
    play(&mut h, &events, 200);
    assert_eq!(
        h.sent,
        (0..500).collect::<Vec<_>>(),
        "complete and in order"
    );
    assert_eq!(h.core.held(h.flow), 0);
    assert_eq!(h.red().recovered.get(), 50);
    assert_eq!(h.red().lost.get(), 0);
    assert_eq!(h.red().late.get(), 0);
    h.assert_adds_up();
}

#[test]
fn a_number_missing_on_both_legs_is_skipped_after_the_delay_and_lost_after_the_window() {
    let mut h = Harness::new(2, merge(10, 50));
    let t0 = 5000 * MS;
    for seq in [0u16, 1, 2, 4, 5] {
        let t = t0 + u64::from(seq) * MS;
        h.rx(0, seq, t);
        h.rx(1, seq, t + 1);
        h.tick(t + 1);
    }
    assert_eq!(h.sent, [0, 1, 2], "4 and 5 wait for 3");
    assert_eq!(h.core.held(h.flow), 2);
    // 3 is expected from 4's arrival (t0 + 4 ms): skipped 10 ms later.
    h.tick(t0 + 13 * MS);
    assert_eq!(h.sent, [0, 1, 2]);
    h.tick(t0 + 14 * MS + SLOT);
    assert_eq!(h.sent, [0, 1, 2, 4, 5]);
    assert_eq!(h.core.held(h.flow), 0);
    assert_eq!(h.red().lost.get(), 0, "its window is still open");
    // Too late now: it was skipped.
    assert_eq!(h.rx(1, 3, t0 + 20 * MS), Received::Dropped);
    assert_eq!(h.red().late.get(), 1);
    h.tick(t0 + 54 * MS + SLOT);
    assert_eq!(h.red().lost.get(), 1);
    assert_eq!(h.red().recovered.get(), 0);
    h.assert_adds_up();
}

#[test]
fn a_number_missing_on_both_legs_without_delay_is_lost_after_the_window() {
    let mut h = Harness::new(2, merge(0, 50));
    for seq in [0u16, 1, 3] {
        h.rx(0, seq, u64::from(seq) * MS);
        h.rx(1, seq, u64::from(seq) * MS);
    }
    assert_eq!(h.sent, [0, 1, 3]);
    h.tick(52 * MS);
    assert_eq!(h.red().lost.get(), 0, "open until 3 ms + 50 ms");
    h.tick(53 * MS + SLOT);
    assert_eq!(h.red().lost.get(), 1);
    // A copy after the window closed is not sent.
    assert_eq!(h.rx(1, 2, 60 * MS), Received::Dropped);
    assert_eq!(h.red().late.get(), 1);
    h.assert_adds_up();
}

#[test]
fn sequence_numbers_wrap_without_a_reset() {
    for delay in [0, 20] {
        let mut h = Harness::new(2, merge(delay, 50));
        let seqs: Vec<u16> = (65530..=65535).chain(0..6).collect();
        for (i, &seq) in seqs.iter().enumerate() {
            let t = i as u64 * MS;
            h.rx(0, seq, t);
            h.rx(1, seq, t + 1);
        }
        h.tick(200 * MS);
        assert_eq!(h.sent, seqs, "delay {delay}");
        assert_eq!(h.red().resets.get(), 0);
        assert_eq!(h.red().duplicates.get(), 12);
        assert_eq!(h.red().lost.get(), 0);
        h.assert_adds_up();
    }
}

#[test]
fn an_ssrc_change_or_a_big_jump_restarts_the_merge() {
    for delay in [0, 20] {
        let mut h = Harness::new(2, merge(delay, 50));
        h.rx(0, 100, 0);
        h.rx(0, 102, MS);
        // A new source: its numbers start elsewhere.
        h.rx_ssrc(0, 7, 0xbeef, 2 * MS);
        h.rx_ssrc(1, 7, 0xbeef, 2 * MS);
        h.rx_ssrc(1, 8, 0xbeef, 3 * MS);
        assert_eq!(h.red().resets.get(), 1, "delay {delay}");
        // A jump of more than the span.
        h.rx_ssrc(0, 8 + 10_000, 0xbeef, 4 * MS);
        h.rx_ssrc(0, 8 + 10_001, 0xbeef, 5 * MS);
        assert_eq!(h.red().resets.get(), 2);
        h.tick(500 * MS);
        // 100 and 102 (held with a delay: they leave at the restart),
        // then each stream from where it started.
        assert_eq!(h.sent, [100, 102, 7, 8, 10_008, 10_009], "delay {delay}");
        assert_eq!(h.red().duplicates.get(), 1);
        assert_eq!(h.red().lost.get(), 0, "windows of a restart aren't counted");
        h.assert_adds_up();
    }
}

#[test]
fn a_full_hold_lets_its_oldest_numbers_go_early_and_counts_the_skips() {
    let mut h = Harness::with_pool(1, merge(1000, 1000), 6000);
    h.rx(0, 0, 0);
    // 1 never comes; 2.. are held behind it until the span is full.
    let span = u16::try_from(SPAN).expect("fits");
    for seq in 2..=span + 2 {
        assert_eq!(h.rx(0, seq, MS), Received::Queued);
        h.tick(MS);
    }
    assert_eq!(h.red().hold_overflows.get(), 1, "1 skipped early");
    assert_eq!(h.sent[..4], [0, 2, 3, 4]);
    assert!(h.sent.windows(2).all(|w| w[0] < w[1]), "still in order");
    assert!(h.core.held(h.flow) < usize::from(span));
    // The rest leaves a queue's worth per turn.
    for _ in 0..100 {
        h.tick(2000 * MS);
    }
    assert_eq!(h.sent.len(), usize::from(span) + 2);
    assert_eq!(h.out.drop_backlog.get(), 0);
    assert_eq!(h.core.held(h.flow), 0);
    h.assert_adds_up();
}

#[test]
fn copies_take_no_buffer_and_a_first_copy_without_one_lets_the_next_go() {
    // One buffer per class: seq 0's send holds the small one, then the
    // standard and jumbo ones are taken as fallbacks.
    let mut h = Harness::with_pool(2, merge(0, 50), 1);
    let mut tokens = Vec::new();
    let take = |h: &mut Harness, tokens: &mut Vec<SendToken>, leg: u8, seq: u16| {
        let r = h.core.receive_on(h.flow, LegId(leg), &rtp(seq, SSRC), 0);
        h.core.flush(&mut |req, _| {
            tokens.push(req.token());
            true
        });
        r
    };
    for seq in 0..3 {
        assert_eq!(take(&mut h, &mut tokens, 0, seq), Received::Queued);
    }
    // Duplicates need no buffer: dropped as duplicates, not exhaustion.
    assert_eq!(take(&mut h, &mut tokens, 1, 0), Received::Dropped);
    assert_eq!(h.red().duplicates.get(), 1);
    assert_eq!(h.counters.drops.pool_exhausted.get(), 0);
    // 3 finds no buffer on leg 0 ...
    assert_eq!(take(&mut h, &mut tokens, 0, 3), Received::Dropped);
    assert_eq!(h.counters.drops.pool_exhausted.get(), 1);
    for t in tokens.drain(..) {
        h.core.complete(t, 200, &mut |_, _| true);
    }
    // ... its copy from leg 1 still goes.
    assert_eq!(take(&mut h, &mut tokens, 1, 3), Received::Queued);
    assert_eq!(h.red().forwarded[1].get(), 1);
    for t in tokens {
        h.core.complete(t, 200, &mut |_, _| true);
    }
    h.assert_adds_up();
}

#[test]
fn failover_switches_after_the_silence_and_reverts_after_the_delay() {
    let mut h = Harness::new(2, failover(100, Some(1000), false));
    let mut now = 0;
    let mut seq = 0u16;
    // Both legs for 50 ms: leg 0 is active.
    for _ in 0..50 {
        h.rx(0, seq, now);
        h.rx(1, seq, now + 1);
        h.tick(now);
        now += MS;
        seq += 1;
    }
    assert_eq!(h.sent.len(), 50);
    assert_eq!(h.red().standby[1].get(), 50);
    // Leg 0 stops: leg 1 goes on alone, still standby for 100 ms.
    let stop = now - MS;
    while now < stop + 100 * MS {
        h.rx(1, seq, now);
        h.tick(now);
        now += MS;
        seq += 1;
    }
    assert_eq!(h.red().switches.get(), 0);
    assert_eq!(h.core.active_leg(h.flow), Some(LegId(0)));
    h.rx(1, seq, now);
    assert_eq!(h.red().switches.get(), 1, "switched at 100 ms of silence");
    assert_eq!(h.core.active_leg(h.flow), Some(LegId(1)));
    assert_eq!(h.red().active_leg.get(), 1);
    assert_eq!(*h.sent.last().expect("sent"), seq, "its datagram went");
    // Leg 0 comes back: 1 s later the flow returns to it.
    let back = now + MS;
    while now < back + 1000 * MS {
        now += MS;
        seq += 1;
        h.rx(0, seq, now);
        h.rx(1, seq, now);
        h.tick(now);
        if now + MS < back + 1000 * MS {
            assert_eq!(h.core.active_leg(h.flow), Some(LegId(1)), "at {now}");
        }
    }
    now += SLOT;
    h.tick(now);
    assert_eq!(h.core.active_leg(h.flow), Some(LegId(0)));
    assert_eq!(h.red().switches.get(), 2);
    assert_eq!(h.red().active_leg.get(), 0);
    h.assert_adds_up();
}

#[test]
fn failover_switches_on_its_timer_when_the_backup_is_quiet_between_packets() {
    let mut h = Harness::new(2, failover(100, None, false));
    h.rx(0, 0, 0);
    h.rx(1, 0, 0);
    h.rx(1, 1, 60 * MS);
    // The backup's latest packet was at 60 ms: healthy until 160 ms.
    h.tick(100 * MS - 1);
    assert_eq!(h.core.active_leg(h.flow), Some(LegId(0)));
    h.tick(100 * MS + SLOT);
    assert_eq!(h.core.active_leg(h.flow), Some(LegId(1)));
    assert_eq!(h.red().switches.get(), 1);
}

#[test]
fn revert_none_never_goes_back() {
    let mut h = Harness::new(2, failover(100, None, false));
    h.rx(0, 0, 0);
    for i in 1..=200u16 {
        h.rx(1, i, u64::from(i) * MS);
        h.tick(u64::from(i) * MS);
    }
    assert_eq!(h.core.active_leg(h.flow), Some(LegId(1)));
    for i in 201..=20_000u16 {
        let t = u64::from(i) * MS;
        h.rx(0, i, t);
        h.rx(1, i, t);
        if i % 100 == 0 {
            h.tick(t);
        }
    }
    assert_eq!(h.core.active_leg(h.flow), Some(LegId(1)));
    assert_eq!(h.red().switches.get(), 1);
    // Leg 1 fails: back to leg 0, the only healthy one.
    h.tick(20_000 * MS + 100 * MS + SLOT);
    h.rx(0, 20_001, 20_000 * MS + 101 * MS);
    assert_eq!(h.core.active_leg(h.flow), Some(LegId(0)));
    assert_eq!(h.red().switches.get(), 2);
}

#[test]
fn a_switch_never_repeats_a_sequence_number_with_rtp() {
    for rtp in [true, false] {
        let mut h = Harness::new(2, failover(100, Some(500), rtp));
        // Leg 1 150 ms behind leg 0, 1 packet per ms; leg 0 stops after
        // 199. At the switch (100 ms later) leg 1 is at 149.
        let events = two_legs(400, 150, |leg, seq| leg == 0 && seq >= 200);
        play(&mut h, &events, 10);
        assert_eq!(h.red().switches.get(), 1);
        if rtp {
            assert_eq!(h.sent, (0..400).collect::<Vec<_>>(), "no repeat, no gap");
            assert_eq!(h.red().duplicates.get(), 51, "149..=199 again");
        } else {
            // Without the guard the backup repeats what was sent.
            assert_eq!(h.sent.len(), 400 + 51);
        }
        h.assert_adds_up();
    }
}

#[test]
fn failover_standby_datagrams_take_no_buffer() {
    let mut h = Harness::with_pool(2, failover(100, None, false), 1);
    let flow = h.flow;
    let mut tokens = Vec::new();
    assert_eq!(
        h.core.receive_on(flow, LegId(0), &rtp(0, SSRC), 0),
        Received::Queued
    );
    h.core.flush(&mut |req, _| {
        tokens.push(req.token());
        true
    });
    for i in 0..10 {
        assert_eq!(
            h.core.receive_on(flow, LegId(1), &rtp(i, SSRC), 1),
            Received::Dropped
        );
    }
    assert_eq!(h.red().standby[1].get(), 10);
    assert_eq!(h.counters.drops.pool_exhausted.get(), 0);
    for t in tokens {
        h.core.complete(t, 200, &mut |_, _| true);
    }
}

#[test]
fn a_removed_merge_flow_sends_what_it_held() {
    let mut h = Harness::new(2, merge(50, 100));
    h.rx(0, 0, 0);
    h.rx(0, 2, 0);
    h.rx(0, 3, 0);
    assert_eq!(h.core.held(h.flow), 2);
    h.core.remove_flow(h.flow);
    h.send();
    assert_eq!(h.sent, [0, 2, 3]);
    assert!(h.core.is_quiet(h.flow));
    h.core.forget(h.flow);
    h.tick(1000 * MS);
    assert_eq!(h.core.flow_slots(), 1);
}

#[test]
fn the_driver_is_told_when_to_tick() {
    let mut h = Harness::new(2, merge(10, 50));
    assert_eq!(h.core.next_tick_ns(), None, "nothing pending");
    h.rx(0, 0, 0);
    h.rx(0, 2, 0);
    let next = h.core.next_tick_ns().expect("a skip and windows pending");
    assert!(next <= SLOT, "{next}");
    h.tick(10 * MS + SLOT);
    assert_eq!(h.sent, [0, 2]);
    assert!(h.core.next_tick_ns().is_some(), "windows still open");
    h.tick(60 * MS + SLOT);
    assert_eq!(h.red().lost.get(), 1);
    assert_eq!(h.core.next_tick_ns(), None, "all accounted");
}

mod takeover;
