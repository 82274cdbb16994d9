//! The core's rules, one test each, and a model test driving random
//! interleavings of everything a worker sees.

use std::collections::{BTreeMap, BTreeSet};

use mcrelay_pool::{Class, PoolConfig};
use proptest::prelude::*;

use super::*;

fn core(per_class: u32) -> Core {
    Core::new(
        PoolSet::new(PoolConfig {
            small: per_class,
            standard: per_class,
            jumbo: per_class,
        })
        .expect("pool"),
    )
}

fn outputs(depths: &[u32], gso: bool) -> (Vec<OutputSpec>, Vec<Arc<OutputCounters>>) {
    let counters: Vec<Arc<OutputCounters>> = depths.iter().map(|_| Arc::default()).collect();
    let specs = depths
        .iter()
        .zip(&counters)
        .map(|(&depth, c)| OutputSpec {
            depth,
            gso,
            counters: Arc::clone(c),
        })
        .collect();
    (specs, counters)
}

fn add(
    core: &mut Core,
    depths: &[u32],
    gso: bool,
) -> (FlowId, Arc<FlowCounters>, Vec<Arc<OutputCounters>>) {
    let (specs, outs) = outputs(depths, gso);
    let counters = Arc::<FlowCounters>::default();
    let id = core
        .add_flow(specs, Arc::clone(&counters), 1, Redundancy::Single, 64)
        .expect("room");
    (id, counters, outs)
}

/// Flush, accepting every send; the requests' tokens and slots.
fn flush_all(core: &mut Core) -> Vec<(SendToken, Vec<Slot>)> {
    let mut sent = Vec::new();
    core.flush(&mut |req, _| {
        sent.push((req.token(), slots_of(req)));
        true
    });
    sent
}

fn slots_of(req: &SendRequest<'_>) -> Vec<Slot> {
    match req.kind {
        SendKind::Plain { slot } => vec![slot],
        SendKind::Gso { slots, .. } => slots.to_vec(),
    }
}

fn complete_all(core: &mut Core, sent: Vec<(SendToken, Vec<Slot>)>, result: i32) {
    for (token, slots) in sent {
        core.complete(
            token,
            result * i32::try_from(slots.len()).unwrap_or(1),
            &mut |_, _| true,
        );
    }
}

fn in_use(core: &Core) -> u32 {
    Class::ALL.iter().map(|&c| core.pool().in_use(c)).sum()
}

#[test]
fn oversize_is_dropped_and_counted() {
    let mut c = core(4);
    let (f, counters, _) = add(&mut c, &[8], false);
    assert_eq!(c.receive(f, &[0; MAX_PAYLOAD + 1]), Received::Dropped);
    assert_eq!(counters.drops.oversize.get(), 1);
    assert_eq!(counters.packets_in.get(), 1);
    assert_eq!(in_use(&c), 0);
}

#[test]
fn full_outputs_pause_the_flow_until_one_drains_to_half() {
    let mut c = core(16);
    let (f, counters, outs) = add(&mut c, &[4, 2], false);
    for _ in 0..4 {
        assert_eq!(c.receive(f, &[1; 100]), Received::Queued);
    }
    // The second output (depth 2) dropped the last two as backlog.
    assert_eq!(outs[1].drop_backlog.get(), 2);
    assert_eq!(c.receive(f, &[1; 100]), Received::Full { newly: true });
    assert_eq!(c.receive(f, &[1; 100]), Received::Full { newly: false });
    assert!(c.is_paused(f));
    assert_eq!(outs[0].drop_backlog.get(), 2);
    assert!(!c.resume(f), "nothing drained yet");
    let sent = flush_all(&mut c);
    assert_eq!(sent.len(), 6);
    // The depth-2 output's two sends complete: at 0 <= 1, it has drained.
    let (first, rest): (Vec<_>, Vec<_>) = sent
        .into_iter()
        .partition(|(t, _)| matches!(t, SendToken::Plain { output, .. } if output.0 == 1));
    complete_all(&mut c, first, 100);
    assert!(c.resume(f));
    assert!(!c.is_paused(f));
    assert_eq!(counters.receive_resumes.get(), 1);
    complete_all(&mut c, rest, 100);
    assert_eq!(in_use(&c), 0);
}

/// Issue 13 item 9: pools of 100 each, a 4-output flow of 1000-byte
/// datagrams whose sends are slow: once the small class has run dry, the
/// idle standard class takes the copies (counted as fallbacks), not the
/// drop counter. (Before the fallback, 50 of these 150 were dropped as
/// `pool_exhausted`.)
#[test]
fn a_dry_class_borrows_from_the_next_larger_one() {
    let mut c = core(100);
    let (f, counters, outs) = add(&mut c, &[256; 4], false);
    for _ in 0..150 {
        assert_eq!(c.receive(f, &[7; 1000]), Received::Queued);
        let _ = flush_all(&mut c);
    }
    assert_eq!(counters.drops.pool_exhausted.get(), 0);
    assert_eq!(counters.pool_fallbacks.get(), 50);
    assert_eq!(c.pool().in_use(Class::Small), 100);
    assert_eq!(c.pool().in_use(Class::Standard), 50);
    assert!(outs.iter().all(|o| o.drop_backlog.get() == 0));
}

/// Issue 13 item 9: one flooding flow can't take the last buffers of a
/// class from another flow.
#[test]
fn a_flood_leaves_the_other_flows_their_reserve() {
    let mut c = core(100);
    let (flood, flood_counters, _) = add(&mut c, &[1024; 4], false);
    let (quiet, quiet_counters, _) = add(&mut c, &[1024], false);
    for _ in 0..400 {
        let _ = c.receive(flood, &[1; 1000]);
        let _ = flush_all(&mut c);
    }
    assert!(
        flood_counters.drops.pool_exhausted.get() > 0,
        "the flood ran dry"
    );
    for _ in 0..25 {
        assert_eq!(c.receive(quiet, &[2; 1000]), Received::Queued);
    }
    assert_eq!(quiet_counters.drops.pool_exhausted.get(), 0);
    assert_eq!(
        quiet_counters.pool_fallbacks.get(),
        0,
        "its small reserve was kept"
    );
}

#[test]
fn same_size_runs_go_as_one_gso_send_and_a_refusal_resends_them_plain() {
    let mut c = core(16);
    let (f, _, outs) = add(&mut c, &[16], true);
    for _ in 0..3 {
        c.receive(f, &[3; 1200]);
    }
    let sent = flush_all(&mut c);
    assert_eq!(sent.len(), 1);
    let (token, slots) = sent[0].clone();
    assert!(matches!(token, SendToken::Gso { .. }));
    assert_eq!(slots.len(), 3);
    let mut resent = Vec::new();
    c.complete(token, -errno::EMSGSIZE, &mut |req, _| {
        resent.push((req.token(), slots_of(req)));
        true
    });
    assert_eq!(outs[0].gso_fallbacks.get(), 1);
    assert_eq!(resent.iter().map(|(_, s)| s[0]).collect::<Vec<_>>(), slots);
    complete_all(&mut c, resent, 1200);
    assert_eq!(outs[0].packets_out.get(), 3);
    // 1200-byte datagrams are no longer grouped on this output; smaller
    // ones still are.
    for _ in 0..2 {
        c.receive(f, &[3; 1200]);
    }
    let sent = flush_all(&mut c);
    assert!(
        sent.iter()
            .all(|(t, _)| matches!(t, SendToken::Plain { .. }))
    );
    complete_all(&mut c, sent, 1200);
    for _ in 0..2 {
        c.receive(f, &[3; 100]);
    }
    let sent = flush_all(&mut c);
    assert!(matches!(sent[..], [(SendToken::Gso { .. }, _)]));
    complete_all(&mut c, sent, 100);
    assert_eq!(outs[0].gso_sends.get(), 1);
    assert_eq!(in_use(&c), 0);
}

#[test]
fn a_send_the_kernel_could_not_take_is_counted_and_its_buffer_returns() {
    let mut c = core(4);
    let (f, _, outs) = add(&mut c, &[4, 4], false);
    c.receive(f, &[1; 10]);
    let mut accepted = Vec::new();
    c.flush(&mut |req, _| {
        let ok = req.output.0 == 0;
        if ok {
            accepted.push(req.token());
        }
        ok
    });
    assert_eq!(outs[1].drop_send_error.get(), 1);
    assert_eq!(c.output_in_flight(f, OutputId(1)), Some(0));
    assert_eq!(in_use(&c), 1, "still held by output 0's send");
    c.complete(accepted[0], 10, &mut |_, _| true);
    assert_eq!(in_use(&c), 0);
}

#[test]
fn a_removed_flow_goes_once_its_sends_completed() {
    let mut c = core(4);
    let (f, _, _) = add(&mut c, &[4], false);
    c.receive(f, &[1; 10]);
    let sent = flush_all(&mut c);
    c.remove_flow(f);
    assert!(c.is_removing(f));
    assert!(!c.is_quiet(f));
    c.forget(f);
    assert!(c.is_removing(f), "not forgotten while a send is out");
    complete_all(&mut c, sent, 10);
    c.forget(f);
    assert_eq!(c.flow_slots(), 1);
    let (again, _, _) = add(&mut c, &[4], false);
    assert_eq!(again, f, "the number is reused");
}

// ---- the model test ----

#[derive(Debug, Clone)]
enum Op {
    Add {
        depths: Vec<u32>,
        gso: bool,
        legs: u8,
        redundancy: Redundancy,
    },
    Remove(usize),
    /// A datagram on `leg` (possibly one the flow hasn't) carrying RTP
    /// number `back` below the flow's newest, which moves on by `step`.
    Receive {
        flow: usize,
        len: usize,
        leg: u8,
        back: u16,
        step: u16,
    },
    Flush {
        refuse_every: usize,
    },
    Complete {
        pick: usize,
        result: SendResult,
    },
    Resume,
    /// The clock moves on by this many µs and the core ticks.
    Tick(u64),
    /// The flow's source changes its SSRC (a merge restarts).
    NewSource(usize),
}

#[derive(Debug, Clone, Copy)]
enum SendResult {
    Ok,
    NoBufs,
    RefusedGso,
    Io,
}

fn redundancy() -> impl Strategy<Value = Redundancy> {
    const MS: u64 = 1_000_000;
    prop_oneof![
        Just(Redundancy::Single),
        (
            prop::sample::select(vec![0, 2 * MS]),
            prop::sample::select(vec![MS, 5 * MS])
        )
            .prop_map(|(delay_ns, window_ns)| Redundancy::Merge {
                delay_ns,
                window_ns
            }),
        (
            prop::sample::select(vec![None, Some(0), Some(3 * MS)]),
            any::<bool>()
        )
            .prop_map(|(revert_after_ns, rtp)| Redundancy::Failover {
                after_ns: 2 * MS,
                revert_after_ns,
                rtp,
            }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (prop::collection::vec(1u32..6, 1..4), any::<bool>(), 1u8..=4, redundancy())
            .prop_map(|(depths, gso, legs, redundancy)| Op::Add { depths, gso, legs, redundancy }),
        1 => (0usize..4).prop_map(Op::Remove),
        8 => (
            0usize..4,
            prop::sample::select(vec![8usize, 100, 1400, 1500, 1501, 4000, 4097, 9000, 9001]),
            0u8..5,
            prop::sample::select(vec![0u16, 0, 1, 2, 5, 40]),
            0u16..3,
        )
            .prop_map(|(flow, len, leg, back, step)| Op::Receive { flow, len, leg, back, step }),
        2 => (0u64..1500).prop_map(Op::Tick),
        1 => (0usize..4).prop_map(Op::NewSource),
        3 => (0usize..5).prop_map(|refuse_every| Op::Flush { refuse_every }),
        5 => (any::<usize>(), prop::sample::select(vec![SendResult::Ok, SendResult::Ok, SendResult::NoBufs, SendResult::RefusedGso, SendResult::Io]))
            .prop_map(|(pick, result)| Op::Complete { pick, result }),
        1 => Just(Op::Resume),
    ]
}

struct ModelFlow {
    id: FlowId,
    counters: Arc<FlowCounters>,
    outputs: Vec<Arc<OutputCounters>>,
    depths: Vec<u32>,
    redundancy: Redundancy,
    /// Its newest RTP number.
    rtp: u16,
    /// Its source's SSRC: only grows, so (SSRC, number) names one packet.
    ssrc: u32,
}

impl ModelFlow {
    fn merges(&self) -> bool {
        matches!(self.redundancy, Redundancy::Merge { .. })
    }

    /// Merging with a delay: the output is in RTP order (not arrival).
    fn in_rtp_order(&self) -> bool {
        matches!(self.redundancy, Redundancy::Merge { delay_ns, .. } if delay_ns > 0)
    }
}

struct Model {
    core: Core,
    flows: Vec<ModelFlow>,
    /// Sends handed to the kernel and not completed: token, slots.
    out: Vec<(SendToken, Vec<Slot>)>,
    /// Datagram number last sent first-hand per (flow, output).
    last_seq: BTreeMap<(FlowId, OutputId), u64>,
    next_seq: u64,
    submits: usize,
    /// The fake clock.
    now: u64,
    /// Merge flows: (SSRC, RTP number)s sent first-hand per (flow, output).
    rtp_sent: BTreeMap<(FlowId, OutputId), BTreeSet<(u32, u16)>>,
}

/// A datagram's model number (after its 12-byte RTP header), RTP number
/// and SSRC.
fn seq_of(core: &Core, in_flight: &InFlight, slot: Slot) -> (u64, u16, u32) {
    let bytes = in_flight
        .buffer(slot)
        .map(|b| core_bytes(core, b))
        .unwrap_or_default();
    (u64::from_le_bytes(bytes.0), bytes.1, bytes.2)
}

fn core_bytes(core: &Core, b: &mcrelay_pool::Buffer) -> ([u8; 8], u16, u32) {
    let bytes = core.pool().bytes(b);
    let mut seq = [0; 8];
    seq.copy_from_slice(&bytes[12..20]);
    let ssrc = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    (seq, u16::from_be_bytes([bytes[2], bytes[3]]), ssrc)
}

impl Model {
    fn step(&mut self, op: Op) {
        match op {
            Op::Add {
                depths,
                gso,
                legs,
                redundancy,
            } => {
                let (specs, outputs) = outputs(&depths, gso);
                let counters = Arc::<FlowCounters>::default();
                if let Some(id) =
                    self.core
                        .add_flow(specs, Arc::clone(&counters), legs, redundancy, 4)
                {
                    self.flows.retain(|f| f.id != id);
                    self.last_seq.retain(|(f, _), _| *f != id);
                    self.rtp_sent.retain(|(f, _), _| *f != id);
                    self.flows.push(ModelFlow {
                        id,
                        counters,
                        outputs,
                        depths,
                        redundancy,
                        rtp: 1000,
                        ssrc: 7,
                    });
                }
            }
            Op::Remove(i) => {
                if let Some(f) = self.flows.get(i) {
                    self.core.remove_flow(f.id);
                }
            }
            Op::Receive {
                flow,
                len,
                leg,
                back,
                step,
            } => {
                let Some(f) = self.flows.get_mut(flow) else {
                    return;
                };
                if self.core.is_removing(f.id) {
                    return;
                }
                f.rtp = f.rtp.wrapping_add(step);
                let mut payload = vec![0u8; len.max(20)];
                let _ = mcrelay_wire::rtp::build(&mut payload, 96, f.rtp - back, 0, f.ssrc);
                self.next_seq += 1;
                payload[12..20].copy_from_slice(&self.next_seq.to_le_bytes());
                self.now += 10_000;
                let _ = self.core.receive_on(f.id, LegId(leg), &payload, self.now);
            }
            Op::NewSource(flow) => {
                if let Some(f) = self.flows.get_mut(flow) {
                    f.ssrc += 1;
                }
            }
            Op::Tick(us) => {
                self.now += us * 1000;
                self.core.tick(self.now);
            }
            Op::Flush { refuse_every } => {
                let Self {
                    core,
                    out,
                    last_seq,
                    submits,
                    flows,
                    rtp_sent,
                    ..
                } = self;
                let mut pending = Vec::new();
                let mut check = Vec::new();
                // Order is checked on first-hand sends (a refused GSO
                // send's datagrams go again later, out of order).
                core.flush(&mut |req, _| {
                    *submits += 1;
                    if refuse_every > 0 && *submits % refuse_every == 0 {
                        return false;
                    }
                    pending.push((req.token(), slots_of(req)));
                    check.push((req.flow, req.output, slots_of(req)));
                    true
                });
                for (flow, output, slots) in check {
                    let Some(f) = flows.iter().find(|f| f.id == flow) else {
                        continue;
                    };
                    for slot in slots {
                        let (seq, rtp, ssrc) = seq_of(core, core.in_flight(), slot);
                        // In RTP order within a source; a new source's
                        // packets after the old one's.
                        let seq = if f.in_rtp_order() {
                            u64::from(ssrc) << 16 | u64::from(rtp)
                        } else {
                            seq
                        };
                        let last = last_seq.entry((flow, output)).or_insert(0);
                        assert!(
                            seq > *last,
                            "output {output:?} of {flow:?}: {seq} after {last}"
                        );
                        *last = seq;
                        if f.merges() {
                            assert!(
                                rtp_sent
                                    .entry((flow, output))
                                    .or_default()
                                    .insert((ssrc, rtp)),
                                "merge sent RTP number {rtp} twice on {output:?} of {flow:?}"
                            );
                        }
                    }
                }
                out.extend(pending);
            }
            Op::Complete { pick, result } => {
                if self.out.is_empty() {
                    return;
                }
                let (token, slots) = self.out.swap_remove(pick % self.out.len());
                let result = match result {
                    SendResult::Ok => i32::try_from(slots.len()).unwrap_or(1) * 8,
                    SendResult::NoBufs => -105,
                    SendResult::RefusedGso => -errno::EINVAL,
                    SendResult::Io => -errno::EIO,
                };
                let mut resent = Vec::new();
                self.core.complete(token, result, &mut |req, _| {
                    resent.push((req.token(), slots_of(req)));
                    true
                });
                self.out.extend(resent);
            }
            Op::Resume => {
                for f in &self.flows {
                    let _ = self.core.resume(f.id);
                }
            }
        }
        // Removed flows whose sends all completed go.
        let core = &mut self.core;
        self.flows.retain(|f| {
            if core.is_removing(f.id) && core.is_quiet(f.id) {
                core.forget(f.id);
                false
            } else {
                true
            }
        });
        self.check();
    }

    fn check(&self) {
        let c = &self.core;
        // Every buffer out of the pool is parked in exactly one slot or
        // held by a merge, and every parked slot is named by a queued or
        // outstanding send.
        let held: usize = self.flows.iter().map(|f| c.held(f.id)).sum();
        assert_eq!(in_use(c) as usize, c.in_flight().len() + held);
        let named: BTreeSet<Slot> = self
            .out
            .iter()
            .flat_map(|(_, s)| s.iter().copied())
            .chain(c.queued_slots())
            .collect();
        assert_eq!(
            named.len(),
            c.in_flight().len(),
            "a buffer leaked or was freed early"
        );
        for f in &self.flows {
            let k = &f.counters;
            let red = &k.redundancy;
            let held = c.held(f.id) as u64;
            assert!(held <= redundancy::SPAN, "the hold's bound");
            assert!(red.forwarded_total() <= k.packets_in.get());
            if matches!(f.redundancy, Redundancy::Single) {
                assert_eq!(red.dropped(), red.unknown_leg.get());
            }
            // Dropped before reaching the outputs (or not yet there).
            let dropped_at_input =
                k.drops.oversize.get() + k.drops.pool_exhausted.get() + red.dropped() + held;
            for (i, (o, &depth)) in f.outputs.iter().zip(&f.depths).enumerate() {
                let output = OutputId(u16::try_from(i).expect("few"));
                let in_flight = c.output_in_flight(f.id, output).expect("output");
                assert!(in_flight <= depth, "queue bound");
                // Received = relayed + each drop reason + still in flight.
                assert_eq!(
                    k.packets_in.get(),
                    o.packets_out.get()
                        + o.drop_send_error.get()
                        + o.drop_backlog.get()
                        + dropped_at_input
                        + u64::from(in_flight),
                    "counters of output {i} of {:?}",
                    f.id
                );
            }
        }
    }

    /// Complete everything, remove every flow: the pool is whole again.
    fn drain(&mut self) {
        // Removing a flow sends what a merge held first.
        for f in &self.flows {
            self.core.remove_flow(f.id);
        }
        for _ in 0..4 {
            self.step(Op::Flush { refuse_every: 0 });
            while !self.out.is_empty() {
                self.step(Op::Complete {
                    pick: 0,
                    result: SendResult::Ok,
                });
            }
        }
        self.step(Op::Resume);
        assert!(self.flows.is_empty(), "every flow went");
        assert_eq!(in_use(&self.core), 0);
        assert!(self.core.in_flight().is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_interleavings_keep_every_invariant(ops in prop::collection::vec(op(), 1..300)) {
        let mut m = Model {
            core: core(6),
            flows: Vec::new(),
            out: Vec::new(),
            last_seq: BTreeMap::new(),
            next_seq: 0,
            submits: 0,
            now: 0,
            rtp_sent: BTreeMap::new(),
        };
        for op in ops {
            m.step(op);
        }
        m.drain();
    }
}
