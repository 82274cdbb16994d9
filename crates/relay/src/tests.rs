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
            resume_after: None,
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

fn rtp(seq: u16) -> Vec<u8> {
    let mut d = vec![0u8; 100];
    let _ = mcrelay_wire::rtp::build(&mut d, 96, seq, 0, 0x5eed);
    d
}

/// The RTP numbers sent to each output, in order.
fn numbers_per_output(core: &mut Core, outputs: usize) -> Vec<Vec<u16>> {
    let mut seen = vec![Vec::new(); outputs];
    let mut sent = Vec::new();
    core.flush(&mut |req, _| {
        sent.push((req.token(), slots_of(req), req.output.index()));
        true
    });
    for (_, slots, output) in &sent {
        for &slot in slots {
            let b = core.in_flight().buffer(slot).expect("in flight");
            let bytes = core.pool().bytes(b);
            seen[*output].push(u16::from_be_bytes([bytes[2], bytes[3]]));
        }
    }
    complete_all(
        core,
        sent.into_iter().map(|(t, s, _)| (t, s)).collect(),
        100,
    );
    seen
}

/// Whether `f` takes the plain one-leg path.
fn plain(c: &Core, f: FlowId) -> bool {
    c.flows[f.index()].as_ref().is_some_and(|f| f.plain)
}

#[test]
fn only_a_one_leg_flow_with_nothing_to_ask_per_output_is_plain() {
    let mut c = core(64);
    let (f, _, _) = add(&mut c, &[8, 8, 8], false);
    assert!(plain(&c, f));
    assert!(c.enable_fec_output(
        f,
        OutputId(0),
        OutputId(1),
        OutputId(2),
        super::fec::FecLayout {
            columns: 4,
            rows: 4,
            row_stream: true
        }
    ));
    assert!(!plain(&c, f), "FEC output");
    let (g, _, _) = add(&mut c, &[8], false);
    assert!(c.enable_fec(g, LegId(0)));
    assert!(!plain(&c, g), "FEC input");
    let (h, _, _) = add(&mut c, &[8], false);
    assert!(c.enable_rist_output(h, OutputId(0), 100));
    assert!(!plain(&c, h), "RIST output");
    let (i, _, _) = add(&mut c, &[8], false);
    assert!(c.enable_rist_input(i, LegId(0), 100));
    assert!(!plain(&c, i), "RIST input");
    let (specs, _) = outputs(&[8], false);
    let m = c
        .add_flow(
            specs,
            Arc::default(),
            2,
            Redundancy::Merge {
                window_ns: 1_000_000,
                delay_ns: 0,
            },
            64,
        )
        .expect("room");
    assert!(!plain(&c, m), "merge");
}

#[test]
fn an_output_resuming_after_a_reload_skips_what_its_predecessor_sent() {
    let mut c = core(64);
    // Output 0 moved here from a flow that sent up to 105; output 1 from
    // one that sent up to 102; output 2 is new.
    let (mut specs, outs) = outputs(&[64, 64, 64], false);
    specs[0].resume_after = Some((105, 0x5eed));
    specs[1].resume_after = Some((102, 0x5eed));
    let counters = Arc::<FlowCounters>::default();
    let f = c
        .add_flow(specs, Arc::clone(&counters), 1, Redundancy::Single, 64)
        .expect("room");
    assert!(!plain(&c, f), "guarded outputs take the full path");
    // The new sockets joined at 100: 100..=110 arrive, one a stray
    // non-RTP datagram.
    for seq in 100..=110 {
        c.receive(f, &rtp(seq));
    }
    assert!(plain(&c, f), "both guards ended: the plain path again");
    let seen = numbers_per_output(&mut c, 3);
    assert_eq!(seen[0], (106..=110).collect::<Vec<_>>());
    assert_eq!(seen[1], (103..=110).collect::<Vec<_>>());
    assert_eq!(seen[2], (100..=110).collect::<Vec<_>>());
    // Output 2 wanted every number: nothing was dropped whole.
    assert_eq!(
        counters.redundancy.duplicates.get(),
        0,
        "output 2 took them all"
    );
    assert_eq!(
        outs[0].drop_backlog.get(),
        0,
        "a skip is not a backlog drop"
    );
    // Guards over: a late old number goes everywhere now.
    c.receive(f, &rtp(104));
    let seen = numbers_per_output(&mut c, 3);
    assert_eq!(seen, vec![vec![104]; 3]);
    assert_eq!(in_use(&c), 0);

    // Every output resuming: a number they all have takes no buffer.
    let (mut specs, _) = outputs(&[8], false);
    specs[0].resume_after = Some((7, 0x5eed));
    let counters = Arc::<FlowCounters>::default();
    let g = c
        .add_flow(specs, Arc::clone(&counters), 1, Redundancy::Single, 64)
        .expect("room");
    assert_eq!(c.receive(g, &rtp(6)), Received::Dropped);
    assert_eq!(counters.redundancy.duplicates.get(), 1);
    assert!(!c.is_paused(g), "not a full output");
    assert_eq!(in_use(&c), 0);
}

#[test]
fn a_one_leg_flow_replaced_in_place_resumes_after_the_old_ones_last_number() {
    let mut c = core(64);
    let (old, _, _) = add(&mut c, &[64, 64], false);
    let (new, _, _) = add(&mut c, &[64, 64], false);
    let handover = Handover {
        kept: 1,
        last_rtp: Some((20, 0x5eed)),
    };
    assert!(c.take_over(old, new, handover, 0));
    for seq in 18..=22 {
        c.receive(new, &rtp(seq));
    }
    let seen = numbers_per_output(&mut c, 2);
    assert_eq!(seen, vec![vec![21, 22]; 2]);
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
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(revert_after_ns, rtp, rewrite)| Redundancy::Failover {
                after_ns: 2 * MS,
                revert_after_ns,
                rtp,
                rtp_rewrite: (rtp && rewrite).then_some(90_000),
                gap_factor: 4,
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
                        // In RTP order: a new SSRC continuing the
                        // numbering (the model's new source) is the same
                        // stream to the merge (`mcrelay_relay::sequence`), so the
                        // order is the numbers' (which never wrap here).
                        let seq = if f.in_rtp_order() {
                            let _ = ssrc;
                            u64::from(rtp)
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

/// 2022-1 FEC on a leg: lost packets repaired by the FEC datagrams go to
/// the outputs byte-exact, are not counted as received, and a repaired
/// packet arriving after all is dropped as a duplicate.
#[test]
fn fec_repairs_go_to_the_outputs_byte_exact() {
    use super::fec::{FecEncoder, FecLayout};
    let mut core = core(256);
    let (id, counters, _) = add(&mut core, &[512], false);
    assert!(core.enable_fec(id, LegId(0)));
    assert!(!core.enable_fec(id, LegId(1)));
    let mut enc = FecEncoder::new(FecLayout {
        columns: 5,
        rows: 5,
        row_stream: true,
    });
    let packet = |seq: u16| {
        let mut p = vec![0x80, 33];
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 9, 1, 2, 3, 4]);
        let [_, low] = seq.to_be_bytes();
        p.extend(
            (0..=255u8)
                .cycle()
                .take(100 + usize::from(seq))
                .map(|i| i ^ low),
        );
        p
    };
    // Column 2 loses 7 and 12; rows 1 and 2 repair them.
    let lost = [7u16, 12];
    for seq in 0..25u16 {
        let p = packet(seq);
        let mut fec = Vec::new();
        enc.push(&p, |_, f| fec.push(f.to_vec()));
        if !lost.contains(&seq) {
            assert_eq!(core.receive_on(id, LegId(0), &p, 0), Received::Queued);
        }
        for f in fec {
            core.receive_fec(id, LegId(0), &f, 0);
        }
    }
    let mut sent = BTreeMap::new();
    for (_, slots) in flush_all(&mut core) {
        for slot in slots {
            let b = core.in_flight().buffer(slot).expect("parked");
            let bytes = core.pool().bytes(b).to_vec();
            sent.insert(u16::from_be_bytes([bytes[2], bytes[3]]), bytes);
        }
    }
    assert_eq!(sent.len(), 25);
    for (seq, bytes) in &sent {
        assert_eq!(bytes, &packet(*seq), "{seq}");
    }
    assert_eq!(counters.packets_in.get(), 23);
    assert_eq!(counters.fec.recovered.get(), 2);
    assert_eq!(counters.fec.packets.get(), 10);
    assert_eq!(
        core.receive_on(id, LegId(0), &packet(7), 0),
        Received::Dropped
    );
    assert_eq!(counters.fec.duplicates.get(), 1);
}

/// The FEC packets of each group read before its last media packet (they
/// arrive on other sockets): the media packet completes them, and what
/// they repair goes to the outputs after it.
#[test]
fn fec_read_before_the_last_media_packet_of_its_group_still_repairs() {
    use super::fec::{FecEncoder, FecLayout};
    let mut core = core(256);
    let (id, counters, _) = add(&mut core, &[512], false);
    assert!(core.enable_fec(id, LegId(0)));
    let mut enc = FecEncoder::new(FecLayout {
        columns: 5,
        rows: 5,
        row_stream: true,
    });
    let packet = |seq: u16| {
        let mut p = vec![0x80, 33];
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 9, 1, 2, 3, 4]);
        p.extend((0..=255u8).cycle().take(60 + usize::from(seq)));
        p
    };
    // 7 lost; row 1's FEC packet (5..9) is read before 9.
    let mut order = Vec::new();
    for seq in 0..25u16 {
        let p = packet(seq);
        let mut fec = Vec::new();
        enc.push(&p, |_, f| fec.push(f.to_vec()));
        if seq == 9 {
            for f in &fec {
                core.receive_fec(id, LegId(0), f, 0);
            }
            assert_eq!(counters.fec.recovered.get(), 0, "row 1 misses 7 and 9");
        }
        if seq != 7 {
            core.receive_on(id, LegId(0), &p, 0);
            order.push(seq);
            if seq == 9 {
                order.push(7);
            }
        }
        if seq != 9 {
            for f in &fec {
                core.receive_fec(id, LegId(0), f, 0);
            }
        }
    }
    let mut sent = Vec::new();
    for (_, slots) in flush_all(&mut core) {
        for slot in slots {
            let b = core.in_flight().buffer(slot).expect("parked");
            sent.push(core.pool().bytes(b).to_vec());
        }
    }
    let seqs: Vec<u16> = sent
        .iter()
        .map(|b| u16::from_be_bytes([b[2], b[3]]))
        .collect();
    assert_eq!(seqs, order, "7 right after 9, which completed row 1");
    assert_eq!(
        sent[order.iter().position(|&s| s == 7).expect("7")],
        packet(7)
    );
    assert_eq!(counters.packets_in.get(), 24);
    assert_eq!(counters.fec.recovered.get(), 1);
}

/// 2022-1 FEC on an output: its column and row packets leave on the two
/// outputs named for them (which take no media), and a decoder repairs
/// a loss from them.
#[test]
fn fec_output_sends_parity_that_repairs() {
    use super::fec::{Direction, FecDecoder, FecLayout, header};
    let mut core = core(256);
    let (id, _, outs) = add(&mut core, &[512, 512, 512], false);
    let layout = FecLayout {
        columns: 4,
        rows: 4,
        row_stream: true,
    };
    assert!(!core.enable_fec_output(id, OutputId(0), OutputId(0), OutputId(2), layout));
    assert!(core.enable_fec_output(id, OutputId(0), OutputId(1), OutputId(2), layout));
    let packet = |seq: u16| {
        let mut p = vec![0x80, 33];
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&[0, 0, 1, 0, 9, 9, 9, 9]);
        let [_, low] = seq.to_be_bytes();
        p.extend((0..200u8).map(|i| i.wrapping_mul(low)));
        p
    };
    for seq in 0..16u16 {
        assert_eq!(core.receive(id, &packet(seq)), Received::Queued);
    }
    let mut by_output: BTreeMap<u16, Vec<Vec<u8>>> = BTreeMap::new();
    let sent = flush_all(&mut core);
    for (token, slots) in &sent {
        let SendToken::Plain { output, .. } = *token else {
            panic!("no GSO here");
        };
        for &slot in slots {
            let b = core.in_flight().buffer(slot).expect("parked");
            by_output
                .entry(output.0)
                .or_default()
                .push(core.pool().bytes(b).to_vec());
        }
    }
    assert_eq!(by_output[&0].len(), 16);
    assert_eq!(by_output[&1].len(), 4, "a column packet per column");
    assert_eq!(by_output[&2].len(), 4, "a row packet per row");
    for (o, dir) in [(1, Direction::Column), (2, Direction::Row)] {
        for p in &by_output[&o] {
            assert_eq!(header::parse(p).expect("FEC").0.direction, dir);
        }
    }
    let mut dec = FecDecoder::new();
    for p in by_output[&0].iter().filter(|p| p[3] != 6) {
        dec.media(p, |_| {});
    }
    let mut repaired = Vec::new();
    for p in by_output[&1].iter().chain(&by_output[&2]) {
        dec.repair(p, |r| repaired.push(r.to_vec()));
    }
    assert_eq!(repaired, vec![packet(6)]);
    complete_all(&mut core, sent, 1);
    assert_eq!(in_use(&core), 0);
    assert_eq!(outs[1].packets_out.get(), 4);
}

/// The datagrams each output sent, flushed and completed.
fn sent_by_output(core: &mut Core) -> BTreeMap<u16, Vec<Vec<u8>>> {
    let mut by_output: BTreeMap<u16, Vec<Vec<u8>>> = BTreeMap::new();
    let sent = flush_all(core);
    for (token, slots) in &sent {
        let SendToken::Plain { output, .. } = *token else {
            panic!("no GSO here");
        };
        for &slot in slots {
            let b = core.in_flight().buffer(slot).expect("parked");
            by_output
                .entry(output.0)
                .or_default()
                .push(core.pool().bytes(b).to_vec());
        }
    }
    complete_all(core, sent, 1);
    by_output
}

fn rtp_packet(seq: u16) -> Vec<u8> {
    let mut p = vec![0x80, 33];
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&[0, 0, 1, 0, 9, 9, 9, 8]);
    let [_, low] = seq.to_be_bytes();
    p.extend((0..200u8).map(|i| i.wrapping_mul(low)));
    p
}

/// [`rtp_packet`] `seq` as a RIST sender retransmits it (TR-06-1: the
/// SSRC's lowest bit set).
fn retransmission(seq: u16) -> Vec<u8> {
    let mut p = rtp_packet(seq);
    p[11] |= 1;
    p
}

/// The RTP numbers output 0 sent, flushed and completed.
fn numbers_sent(core: &mut Core) -> Vec<u16> {
    sent_by_output(core)
        .remove(&0)
        .unwrap_or_default()
        .iter()
        .map(|p| u16::from_be_bytes([p[2], p[3]]))
        .collect()
}

/// The RTP numbers output 0 sent over RIST ticks at each of `ticks`
/// (nanoseconds).
fn numbers_sent_over(core: &mut Core, ticks: std::ops::Range<u64>) -> Vec<u16> {
    let mut got = Vec::new();
    for t in ticks {
        core.rist_tick(t, 0, |_, _| {});
        got.extend(numbers_sent(core));
    }
    got
}

/// A one-leg flow whose leg is RIST (a `buffer_ms` buffer), to one output
/// `depth` deep.
fn rist_leg(
    core: &mut Core,
    depth: u32,
    buffer_ms: u32,
) -> (FlowId, Arc<FlowCounters>, Vec<Arc<OutputCounters>>) {
    let (id, counters, outs) = add(core, &[depth], false);
    assert!(core.enable_rist_input(id, LegId(0), buffer_ms));
    (id, counters, outs)
}

/// A flow of two RIST legs (100 ms buffers) combined by `redundancy`, to
/// one output.
fn two_rist_legs(core: &mut Core, redundancy: Redundancy) -> (FlowId, Arc<FlowCounters>) {
    let (specs, _) = outputs(&[512], false);
    let counters = Arc::<FlowCounters>::default();
    let id = core
        .add_flow(specs, Arc::clone(&counters), 2, redundancy, 64)
        .expect("room");
    assert!(core.enable_rist_input(id, LegId(0), 100));
    assert!(core.enable_rist_input(id, LegId(1), 100));
    (id, counters)
}

/// A RIST tick and a core tick at each of `at_ms`.
fn tick_at(core: &mut Core, at_ms: &[u64]) {
    for &t in at_ms {
        core.rist_tick(t * 1_000_000, 0, |_, _| {});
        core.tick(t * 1_000_000);
    }
}

/// RTP health for the flow's input, one second of silence.
fn rtp_health() -> crate::health::HealthSettings {
    crate::health::HealthSettings {
        payload: mcrelay_wire::health::Payload::Rtp,
        rtp_clock_hz: 90_000,
        silence_ms: 1000,
    }
}

/// 2022-7 merge, no delay, a 50 ms window.
fn merge_within_50_ms() -> Redundancy {
    Redundancy::Merge {
        delay_ns: 0,
        window_ns: 50_000_000,
    }
}

/// Failover after 10 s of silence, by RTP, no revert or rewrite.
fn failover_after_10_s() -> Redundancy {
    Redundancy::Failover {
        after_ns: 10_000_000_000,
        revert_after_ns: None,
        rtp: true,
        rtp_rewrite: None,
        gap_factor: 0,
    }
}

/// Numbers `seqs` on both (RIST) legs of `id`, 1 ms apart from `start`
/// ns, leg 1 a nanosecond after leg 0, but those each leg loses; the
/// core ticked after each number.
fn run_rist_legs(
    core: &mut Core,
    id: FlowId,
    seqs: std::ops::Range<u16>,
    start: u64,
    lost: [&[u16]; 2],
) {
    let ms = 1_000_000u64;
    for seq in seqs {
        let t = start + u64::from(seq) * ms;
        for (leg, lost, at) in [(LegId(0), lost[0], t), (LegId(1), lost[1], t + 1)] {
            if !lost.contains(&seq) {
                core.receive_on(id, leg, &rtp_packet(seq), at);
            }
        }
        core.tick(t + 1);
    }
}

/// The flow's output health saw `count` numbers, each once: none lost,
/// none twice.
fn assert_output_saw_each_once(counters: &FlowCounters, count: u64) {
    let out = &counters.output_health;
    assert_eq!(out.rtp_packets.get(), count, "each number once");
    assert_eq!(out.rtp_lost.get(), 0);
    assert_eq!(out.rtp_duplicates.get(), 0);
}

/// A RIST output keeps what it sent and answers a NACK with the same
/// datagram (SSRC's lowest bit set) on the same output; a plain output
/// beside it sends nothing more; NACKs for what is gone are counted.
#[test]
fn rist_output_retransmits_what_a_receiver_nacks() {
    use super::rist::rtcp::Writer;
    let mut core = core(256);
    let (id, counters, outs) = add(&mut core, &[512, 512], false);
    assert!(core.enable_rist_output(id, OutputId(0), 200));
    assert!(!core.enable_rist_output(id, OutputId(5), 200));
    assert!(core.has_rist());
    let mut reports = Vec::new();
    core.rist_tick(1_000_000, 0, |to, d| reports.push((to, d.to_vec())));
    for seq in 0..20u16 {
        assert_eq!(core.receive(id, &rtp_packet(seq)), Received::Queued);
    }
    let first = sent_by_output(&mut core);
    assert_eq!(first[&0].len(), 20);
    assert_eq!(first[&1].len(), 20);
    let mut b = [0u8; 64];
    let mut w = Writer::new(&mut b);
    w.range_nack(0x0909_0908, &[(3, 1), (500, 0)]);
    let n = w.len();
    core.rist_output_rtcp(id, OutputId(0), 5_000_000, &b[..n]);
    let again = sent_by_output(&mut core);
    assert_eq!(again[&0], vec![retransmission(3), retransmission(4)]);
    assert!(!again.contains_key(&1));
    assert_eq!(counters.rist.retransmitted.get(), 2);
    assert_eq!(counters.rist.nacks_received.get(), 3);
    assert_eq!(counters.rist.unrecoverable.get(), 1);
    assert_eq!(outs[0].packets_out.get(), 22);
    // Sender reports every 100 ms, to the output's receivers.
    reports.clear();
    core.rist_tick(150_000_000, 1_700_000_000_000_000_000, |to, d| {
        reports.push((to, d.to_vec()))
    });
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].0, RtcpTo::Output(id, OutputId(0)));
    assert_eq!(reports[0].1[1], 200, "an SR");
    assert_eq!(in_use(&core), 0);
}

/// A RIST leg: a gap is NACKed on the next tick, what follows it waits,
/// the retransmission releases everything in order; a gap nobody fills
/// is skipped after buffer_ms.
#[test]
fn rist_input_nacks_gaps_and_hands_on_in_order() {
    let mut core = core(256);
    let (id, counters, _) = rist_leg(&mut core, 512, 100);
    let ms = 1_000_000u64;
    for seq in [0u16, 1, 3, 4] {
        core.receive_on(id, LegId(0), &rtp_packet(seq), ms);
    }
    assert_eq!(numbers_sent(&mut core), [0, 1]);
    let mut rtcp = Vec::new();
    core.rist_tick(2 * ms, 0, |to, d| rtcp.push((to, d.to_vec())));
    assert_eq!(rtcp.len(), 1);
    assert_eq!(rtcp[0].0, RtcpTo::Leg(id, LegId(0)));
    let mut nacked = Vec::new();
    for p in super::rist::rtcp::packets(&rtcp[0].1) {
        super::rist::rtcp::nacked(&p, |s| nacked.push(s));
    }
    assert_eq!(nacked, [2]);
    core.receive_on(id, LegId(0), &retransmission(2), 20 * ms);
    assert_eq!(numbers_sent(&mut core), [2, 3, 4]);
    assert_eq!(counters.rist.recovered.get(), 1);
    assert_eq!(counters.rist.nacks_sent.get(), 1);
    assert_eq!(counters.rist.input_rtt_us.get(), 18_000);
    // 6 never comes: 7 waits 100 ms, then goes.
    core.receive_on(id, LegId(0), &rtp_packet(5), 21 * ms);
    core.receive_on(id, LegId(0), &rtp_packet(7), 22 * ms);
    core.rist_tick(50 * ms, 0, |_, _| {});
    assert_eq!(numbers_sent(&mut core), [5]);
    core.rist_tick(123 * ms, 0, |_, _| {});
    assert_eq!(numbers_sent(&mut core), [7]);
    assert_eq!(counters.rist.unrecovered.get(), 1);
    // Every datagram that arrived is counted in once.
    assert_eq!(counters.packets_in.get(), 7);
    assert_eq!(in_use(&core), 0);
}

/// What a RIST leg releases after a recovered gap goes out only as the
/// output's queue has room: nothing is dropped for a burst.
#[test]
fn rist_input_releases_a_burst_as_the_queue_drains() {
    let mut core = core(512);
    let (id, counters, outs) = rist_leg(&mut core, 8, 1000);
    core.receive_on(id, LegId(0), &rtp_packet(0), 0);
    for seq in 2..40u16 {
        core.receive_on(id, LegId(0), &rtp_packet(seq), 0);
    }
    // NACKed, then retransmitted.
    core.rist_tick(0, 0, |_, _| {});
    core.receive_on(id, LegId(0), &retransmission(1), 0);
    let got = numbers_sent_over(&mut core, 0..20);
    assert_eq!(got, (0..40).collect::<Vec<u16>>());
    assert_eq!(outs[0].drop_backlog.get(), 0);
    assert_eq!(counters.rist.recovered.get(), 1);
}

/// A RIST leg's datagrams that arrive in order while its flow's outputs
/// are full (a batch of receives after the worker stalled, or behind a
/// recovered gap's burst) wait in the leg's ring and go on in order as
/// the outputs drain, instead of meeting a full output (a 60 s interop
/// run at 500 ms lost 7 in a row as `drops_backlog` that way, with every
/// gap repaired). Bounded: past half the ring they are let go (counted).
#[test]
fn rist_input_holds_in_order_datagrams_while_the_output_is_full() {
    let mut core = core(512);
    let (id, counters, outs) = rist_leg(&mut core, 8, 1000);
    // A batch of 30 in order: the output (depth 8) takes 8; the ninth
    // pauses the flow's receives (the rest of the batch was read already).
    let got: Vec<Received> = (0..30u16)
        .map(|seq| core.receive_on(id, LegId(0), &rtp_packet(seq), 0))
        .collect();
    assert_eq!(got[8], Received::Full { newly: true });
    assert_eq!(got[9], Received::Full { newly: false });
    assert!(core.is_paused(id));
    assert_eq!(outs[0].drop_backlog.get(), 0, "met a full output");
    let got = numbers_sent_over(&mut core, 1..41);
    assert_eq!(got, (0..30).collect::<Vec<u16>>());
    assert!(core.resume(id), "drained: receives resume");
    assert_eq!(outs[0].drop_backlog.get(), 0);
    assert_eq!(counters.rist.unrecovered.get(), 0);
    assert_eq!(counters.packets_in.get(), 30);
    assert_eq!(in_use(&core), 0);
}

/// A gap a standby RIST leg skips at its buffer's end was never NACKed:
/// it is not counted as unrecovered (an alert on that would fire on every
/// healthy standby), and once active a gap is again.
#[test]
fn a_standby_rist_leg_counts_no_unrecovered() {
    let mut core = core(256);
    core.set_standby(true);
    let (id, counters, _) = rist_leg(&mut core, 512, 100);
    let ms = 1_000_000u64;
    for seq in [0u16, 1, 3, 4] {
        core.receive_on(id, LegId(0), &rtp_packet(seq), ms);
    }
    core.rist_tick(200 * ms, 0, |_, _| {});
    assert_eq!(counters.rist.unrecovered.get(), 0);
    core.set_standby(false);
    for seq in [5u16, 7] {
        core.receive_on(id, LegId(0), &rtp_packet(seq), 300 * ms);
    }
    core.rist_tick(500 * ms, 0, |_, _| {});
    assert_eq!(counters.rist.unrecovered.get(), 1);
    let _ = flush_all(&mut core);
}

/// A RIST leg's retransmissions (TR-06-1: the media SSRC with its lowest
/// bit set) are repairs, not a new stream: the leg's health sees one
/// SSRC (no `ssrc_changes`, no strays: it used to count two for each
/// pair of consecutive retransmissions), and the flow hands each repaired
/// datagram on as it was first sent, with the media SSRC.
#[test]
fn rist_retransmissions_are_repairs_not_an_ssrc_change() {
    let mut core = core(256);
    let (id, counters, _) = add(&mut core, &[512], false);
    assert!(core.set_intake(id, rtp_health(), &[]));
    assert!(core.enable_rist_input(id, LegId(0), 1000));
    let ms = 1_000_000u64;
    for seq in [0u16, 1, 4, 5] {
        core.ingest(id, LegId(0), Ok(&rtp_packet(seq)), ms);
    }
    core.rist_tick(2 * ms, 0, |_, _| {});
    for seq in [2u16, 3] {
        core.ingest(id, LegId(0), Ok(&retransmission(seq)), 20 * ms);
    }
    for seq in 6..10u16 {
        core.ingest(id, LegId(0), Ok(&rtp_packet(seq)), 21 * ms);
    }
    core.publish_health();
    let h = &counters.health;
    assert_eq!(h.rtp_ssrc_changes.get(), 0);
    assert_eq!(h.rtp_strays.get(), 0);
    assert_eq!(h.rtp_resyncs.get(), 0);
    assert_eq!(h.rtp_ssrc.get(), 0x0909_0908);
    assert_eq!(h.rtp_packets.get(), 8, "the wire's originals");
    assert_eq!(counters.rist.recovered.get(), 2);
    assert_eq!(counters.packets_in.get(), 10);
    let sent = sent_by_output(&mut core).remove(&0).unwrap_or_default();
    let want: Vec<Vec<u8>> = (0..10).map(rtp_packet).collect();
    assert!(sent == want, "in order, each as first sent: {sent:?}");
    assert_eq!(in_use(&core), 0);
}

/// Two RIST legs merged by 2022-7: each leg counts what it lost itself
/// (`leg_rist`), but the flow's `rist.unrecovered` is what the flow lost
/// after the merge: a number one leg never recovered and the other
/// delivered is not lost (the flow used to add its legs' counts up, so
/// a leg's outage showed as the flow's loss); one both legs lost is.
#[test]
fn a_merged_flow_counts_as_unrecovered_only_what_no_rist_leg_delivered() {
    let mut core = core(512);
    let ms = 1_000_000u64;
    let (id, counters) = two_rist_legs(&mut core, merge_within_50_ms());
    // Leg 0 loses 5 (never retransmitted); leg 1 delivers it.
    run_rist_legs(&mut core, id, 0..10, 0, [&[5], &[]]);
    tick_at(&mut core, &[20, 150, 300]);
    let _ = sent_by_output(&mut core);
    let leg = |i: usize| counters.leg_rist[i].unrecovered.get();
    assert_eq!((leg(0), leg(1)), (1, 0));
    assert_eq!(counters.redundancy.lost.get(), 0);
    assert_eq!(counters.rist.unrecovered.get(), 0, "leg 1 delivered 5");
    assert!(counters.leg_rist[0].nacks_sent.get() > 0);
    assert_eq!(
        counters.rist.nacks_sent.get(),
        counters.leg_rist[0].nacks_sent.get() + counters.leg_rist[1].nacks_sent.get()
    );
    // Both legs lose 12: lost for the flow.
    run_rist_legs(&mut core, id, 10..20, 400 * ms, [&[12], &[12]]);
    tick_at(&mut core, &[450, 600, 800, 1000]);
    core.rist_tick(1001 * ms, 0, |_, _| {});
    let _ = sent_by_output(&mut core);
    assert_eq!((leg(0), leg(1)), (2, 1));
    assert_eq!(counters.redundancy.lost.get(), 1);
    assert_eq!(counters.rist.unrecovered.get(), 1);
}

/// Two RIST legs under failover: the flow's `rist.unrecovered` is what the
/// active leg skipped (what the flow lost), not what the standby leg did.
#[test]
fn a_failover_flow_counts_as_unrecovered_what_its_active_rist_leg_skipped() {
    let mut core = core(512);
    let (id, counters) = two_rist_legs(&mut core, failover_after_10_s());
    // Leg 0 (active) loses 3, leg 1 (standing by) loses 7; neither is
    // retransmitted.
    run_rist_legs(&mut core, id, 0..10, 0, [&[3], &[7]]);
    tick_at(&mut core, &[20, 150, 300]);
    let _ = sent_by_output(&mut core);
    assert_eq!(core.active_leg(id), Some(LegId(0)));
    let leg = |i: usize| counters.leg_rist[i].unrecovered.get();
    assert_eq!((leg(0), leg(1)), (1, 1));
    assert_eq!(counters.rist.unrecovered.get(), 1, "the active leg's 3");
}

/// A merged flow's output health sees what its RIST legs release after a
/// gap (the repair and what waited behind it) as it sees what goes on at
/// once: each number once, none lost, one SSRC. It used to see only the
/// latter, so every repaired gap showed as loss on the output.
#[test]
fn a_merged_flows_output_health_sees_what_rist_legs_release() {
    let mut core = core(512);
    let ms = 1_000_000u64;
    let (id, counters) = two_rist_legs(&mut core, merge_within_50_ms());
    assert!(core.set_intake(id, rtp_health(), &[]));
    // Both legs lose 3; leg 0's retransmission repairs it.
    for seq in [0u16, 1, 2, 4, 5] {
        for leg in [LegId(0), LegId(1)] {
            core.ingest(id, leg, Ok(&rtp_packet(seq)), ms);
        }
    }
    core.rist_tick(2 * ms, 0, |_, _| {});
    core.ingest(id, LegId(0), Ok(&retransmission(3)), 20 * ms);
    // Leg 1 gives 3 up and lets 4 and 5 go: duplicates by then.
    core.rist_tick(150 * ms, 0, |_, _| {});
    for seq in 6..10u16 {
        for leg in [LegId(0), LegId(1)] {
            core.ingest(id, leg, Ok(&rtp_packet(seq)), 160 * ms);
        }
    }
    core.tick(300 * ms);
    core.publish_health();
    core.settle_health(2000 * ms);
    assert_output_saw_each_once(&counters, 10);
    assert_eq!(counters.output_health.rtp_ssrc_changes.get(), 0);
    let sent = sent_by_output(&mut core).remove(&0).unwrap_or_default();
    let want: Vec<Vec<u8>> = (0..10).map(rtp_packet).collect();
    assert!(sent == want, "{sent:?}");
    assert_eq!(counters.leg_rist[1].unrecovered.get(), 1);
    assert_eq!(counters.rist.unrecovered.get(), 0);
}

/// A standby worker sends nothing (`crate::standby`), RTCP included: no
/// NACKs for its RIST legs' gaps, no receiver or sender reports, no
/// retransmissions for what its RIST outputs' receivers NACK. Taking
/// over, the legs NACK what is still missing and the outputs answer.
#[test]
fn a_standby_worker_sends_no_rist_rtcp_or_retransmissions() {
    use super::rist::rtcp::Writer;
    let mut core = core(256);
    let (id, counters, outs) = add(&mut core, &[512], false);
    assert!(core.enable_rist_output(id, OutputId(0), 1000));
    let (leg_flow, leg_counters, _) = rist_leg(&mut core, 512, 1000);
    let ms = 1_000_000u64;
    // Active: the output sends (and keeps) 0..10.
    for seq in 0..10u16 {
        assert_eq!(core.receive(id, &rtp_packet(seq)), Received::Queued);
    }
    assert_eq!(sent_by_output(&mut core)[&0].len(), 10);
    core.rist_tick(ms, 0, |_, _| {});
    core.set_standby(true);
    // A gap on the leg: 2 missing.
    for seq in [0u16, 1, 3, 4] {
        core.receive_on(leg_flow, LegId(0), &rtp_packet(seq), 2 * ms);
    }
    // A receiver of the output NACKs 3.
    let mut b = [0u8; 64];
    let mut w = Writer::new(&mut b);
    w.range_nack(0x0909_0908, &[(3, 0)]);
    let n = w.len();
    core.rist_output_rtcp(id, OutputId(0), 3 * ms, &b[..n]);
    let mut rtcp = Vec::new();
    for t in [4, 60, 150, 300] {
        core.rist_tick(t * ms, 0, |to, d| rtcp.push((to, d.to_vec())));
    }
    assert!(rtcp.is_empty(), "standby wrote RTCP: {rtcp:?}");
    assert!(sent_by_output(&mut core).is_empty(), "standby sent");
    assert_eq!(counters.rist.retransmitted.get(), 0);
    assert_eq!(leg_counters.rist.nacks_sent.get(), 0);
    assert_eq!(outs[0].packets_out.get(), 10);
    // Taking over: the leg NACKs 2 (still within its 1000 ms), reports
    // go out again, a NACK is answered.
    core.set_standby(false);
    core.rist_tick(400 * ms, 0, |to, d| rtcp.push((to, d.to_vec())));
    let mut nacked = Vec::new();
    for (to, d) in &rtcp {
        if *to == RtcpTo::Leg(leg_flow, LegId(0)) {
            for p in super::rist::rtcp::packets(d) {
                super::rist::rtcp::nacked(&p, |s| nacked.push(s));
            }
        }
    }
    assert_eq!(nacked, [2]);
    assert!(
        rtcp.iter()
            .any(|(to, _)| *to == RtcpTo::Output(id, OutputId(0)))
    );
    core.rist_output_rtcp(id, OutputId(0), 401 * ms, &b[..n]);
    assert_eq!(sent_by_output(&mut core)[&0].len(), 1);
    assert_eq!(counters.rist.retransmitted.get(), 1);
}

/// Row-only 2022-1 FEC (`columns` packets a row) for [`rtp_packet`]s:
/// the FEC datagrams pushing `seq` completes.
fn row_fec(enc: &mut super::fec::FecEncoder, seq: u16) -> Vec<Vec<u8>> {
    let mut fec = Vec::new();
    enc.push(&rtp_packet(seq), |_, f| fec.push(f.to_vec()));
    fec
}

fn row_encoder(columns: u8) -> super::fec::FecEncoder {
    super::fec::FecEncoder::new(super::fec::FecLayout {
        columns,
        rows: 0,
        row_stream: true,
    })
}

/// A two-leg flow (`redundancy`) with FEC on both legs, one output.
fn fec_legs(core: &mut Core, redundancy: Redundancy) -> (FlowId, Arc<FlowCounters>) {
    let (specs, _) = outputs(&[512], false);
    let counters = Arc::<FlowCounters>::default();
    let id = core
        .add_flow(specs, Arc::clone(&counters), 2, redundancy, 64)
        .expect("room");
    assert!(core.enable_fec(id, LegId(0)));
    assert!(core.enable_fec(id, LegId(1)));
    (id, counters)
}

/// Numbers `0..count` on both legs of `id` (media and row FEC, 4 a
/// row), 1 ms apart, but those each leg loses; the core ticked and
/// the output drained as it goes.
fn run_fec_legs(core: &mut Core, id: FlowId, count: u16, lost: [&[u16]; 2]) {
    let ms = 1_000_000u64;
    let mut enc = row_encoder(4);
    for seq in 0..count {
        let t = u64::from(seq) * ms;
        let fec = row_fec(&mut enc, seq);
        for (leg, lost, at) in [(LegId(0), lost[0], t), (LegId(1), lost[1], t + 1)] {
            if !lost.contains(&seq) {
                core.receive_on(id, leg, &rtp_packet(seq), at);
            }
            for f in &fec {
                core.receive_fec(id, leg, f, at);
            }
        }
        core.tick(t + 2);
        if seq % 64 == 63 {
            let _ = sent_by_output(core);
        }
    }
    let end = u64::from(count) * ms;
    for t in [end, end + 100 * ms, end + 200 * ms] {
        core.tick(t);
    }
    let _ = sent_by_output(core);
}

/// Two FEC legs merged by 2022-7: each leg counts what its decoder could
/// not repair (`leg_fec`), but the flow's `fec.unrecoverable` is what
/// the flow lost after the merge: two numbers of one row leg 0 lost (one
/// row FEC packet repairs one) and leg 1 delivered are not lost (the flow
/// used to add its legs' counts up); two both legs lost are.
#[test]
fn a_merged_flow_counts_as_unrecoverable_only_what_no_fec_leg_delivered() {
    let mut core = core(1024);
    let (id, counters) = fec_legs(&mut core, merge_within_50_ms());
    // Row 4..7: leg 0 loses 5 and 6. Row 20..23: both lose 21 and 22.
    // Row 40..43: leg 1 loses 41, which its row FEC repairs.
    // 600 numbers: the decoders count a loss once it leaves their window
    // of 512.
    run_fec_legs(&mut core, id, 600, [&[5, 6, 21, 22], &[21, 22, 41]]);
    let leg = |i: usize| {
        let l = &counters.leg_fec[i];
        (l.unrecoverable.get(), l.recovered.get())
    };
    assert_eq!(leg(0), (4, 0));
    assert_eq!(leg(1), (2, 1));
    assert_eq!(counters.redundancy.lost.get(), 2);
    assert_eq!(
        counters.fec.unrecoverable.get(),
        2,
        "only 21 and 22: leg 1 delivered 5 and 6"
    );
    assert_eq!(counters.fec.recovered.get(), 1);
    assert_eq!(
        counters.leg_fec[0].packets.get() + counters.leg_fec[1].packets.get(),
        counters.fec.packets.get()
    );
    assert_eq!(counters.leg_fec[0].packets.get(), 150, "a row FEC per 4");
    assert_eq!(in_use(&core), 0);
}

/// Two FEC legs under failover: the flow's `fec.unrecoverable` is what
/// the active leg could not repair, not what the standby leg lost.
#[test]
fn a_failover_flow_counts_as_unrecoverable_what_its_active_fec_leg_lost() {
    let mut core = core(1024);
    let (id, counters) = fec_legs(&mut core, failover_after_10_s());
    // Leg 0 (active) loses 5 and 6, leg 1 (standing by) 9 and 10: a row's
    // two, beyond its FEC.
    run_fec_legs(&mut core, id, 600, [&[5, 6], &[9, 10]]);
    assert_eq!(core.active_leg(id), Some(LegId(0)));
    let leg = |i: usize| counters.leg_fec[i].unrecoverable.get();
    assert_eq!((leg(0), leg(1)), (2, 2));
    assert_eq!(counters.fec.unrecoverable.get(), 2, "the active leg's");
}

/// A merged flow's output health sees what its FEC legs repair as it
/// sees what goes on at once: a number both legs lost and FEC repaired
/// reached the output, so it is not lost there (the output's health used
/// to see only the datagrams that went on from the wire, and counted
/// every repair as lost).
#[test]
fn a_merged_flows_output_health_counts_what_fec_repaired() {
    let mut core = core(512);
    let ms = 1_000_000u64;
    let (id, counters) = fec_legs(&mut core, merge_within_50_ms());
    // Receivers: legs 0 and 1, then leg 0's FEC socket (2) and leg 1's (3).
    assert!(core.set_intake(id, rtp_health(), &[LegId(0), LegId(1)]));
    let mut enc = row_encoder(4);
    for seq in 0..12u16 {
        let t = u64::from(seq) * ms;
        let fec = row_fec(&mut enc, seq);
        // Both legs lose 6 (row 4..7): each leg's row FEC repairs it.
        if seq != 6 {
            core.ingest(id, LegId(0), Ok(&rtp_packet(seq)), t);
            core.ingest(id, LegId(1), Ok(&rtp_packet(seq)), t + 1);
        }
        for f in &fec {
            core.ingest(id, LegId(2), Ok(f), t);
            core.ingest(id, LegId(3), Ok(f), t + 1);
        }
        core.tick(t + 2);
    }
    core.tick(300 * ms);
    core.publish_health();
    core.settle_health(3000 * ms);
    assert_eq!(counters.fec.recovered.get(), 2, "each leg repaired 6");
    assert_output_saw_each_once(&counters, 12); // 6 repaired
    assert_eq!(counters.health.rtp_lost.get(), 1, "leg 0's wire lost 6");
    let sent = sent_by_output(&mut core).remove(&0).unwrap_or_default();
    assert_eq!(sent.len(), 12);
    assert!(sent.contains(&rtp_packet(6)), "the repair, byte-exact");
    assert_eq!(in_use(&core), 0);
}

/// The worker reads a FEC datagram before the media datagram sent just
/// before it (they come on different sockets): the row's last packet is
/// queued, not lost. It is not repaired: the original goes on when read,
/// and `fec.recovered` counts only what FEC saved (the decoder used to
/// rebuild it, counting a repair, and drop the original as a duplicate:
/// a CI run counted 20 repairs for 13 losses on the wire).
#[test]
fn fec_read_before_a_queued_media_packet_is_not_counted_recovered() {
    let mut core = core(256);
    let (id, counters, _) = add(&mut core, &[512], false);
    assert!(core.enable_fec(id, LegId(0)));
    let mut enc = row_encoder(4);
    let mut order = Vec::new();
    for seq in 0..12u16 {
        let fec = row_fec(&mut enc, seq);
        if seq == 7 {
            // Row 4..7's FEC read first, 7 still queued.
            for f in &fec {
                core.receive_fec(id, LegId(0), f, 0);
            }
        }
        // 10 is lost: row 8..11's FEC repairs it (11 came before it).
        if seq != 10 {
            core.receive_on(id, LegId(0), &rtp_packet(seq), 0);
            order.push(seq);
        }
        if seq != 7 {
            for f in &fec {
                core.receive_fec(id, LegId(0), f, 0);
            }
        }
    }
    order.push(10);
    assert_eq!(counters.fec.recovered.get(), 1, "10 only");
    assert_eq!(counters.fec.duplicates.get(), 0);
    assert_eq!(counters.packets_in.get(), 11);
    let sent = sent_by_output(&mut core).remove(&0).unwrap_or_default();
    let seqs: Vec<u16> = sent
        .iter()
        .map(|b| u16::from_be_bytes([b[2], b[3]]))
        .collect();
    assert_eq!(seqs, order, "7 as read from the wire, 10 repaired");
    assert_eq!(sent[7], rtp_packet(7));
}
