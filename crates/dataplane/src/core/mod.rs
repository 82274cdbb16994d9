//! The relay core: every rule of the packet path, with no sockets, no
//! io_uring, no fds and no clock (the model is quinn-proto). It takes
//! events — a datagram received on flow F with these bytes, send N
//! completed with result R, a loop turn — and hands out sends as plain
//! data ([`SendRequest`]: output, in-flight slots, segment size). The
//! worker's driver (`worker::driver`) only translates between these and
//! the kernel's SQEs and CQEs, its receive buffers and its packet rings.
//!
//! Rules and where they live:
//! - admission ([`Core::receive`]): oversize drop, "every output full"
//!   (then the flow pauses), pool class choice with fallback and per-flow
//!   reserve ([`admission`]), the one copy, a queue entry per output with
//!   room;
//! - bounded queues ([`queue`]): at most `depth` datagrams per output in
//!   flight (queued or in the kernel), at most [`queue::QUEUE_CAPACITY`] queued
//!   per batch;
//! - GSO grouping and its fallback ([`Core::flush`], [`Core::complete`]):
//!   runs of same-size datagrams become one send; a refused GSO send is
//!   resent datagram by datagram and the output stops grouping that size;
//! - the in-flight table ([`InFlight`]) and completion accounting: a
//!   buffer goes back to the pool when the last send naming it completes;
//! - pause and resume ([`Core::resume`]): a flow whose outputs are all full
//!   stops receiving until one has drained to half its depth;
//! - redundant legs ([`redundancy`], [`Core::receive_on`], [`Core::tick`]):
//!   SMPTE 2022-7 merge and input failover, timed by the driver's clock
//!   passed in as `now_ns`.
#![forbid(unsafe_code)]

pub mod admission;
pub mod gso;
pub mod ids;
pub mod inflight;
pub mod queue;
pub mod redundancy;
mod request;

use std::sync::Arc;

use mcrelay_pool::{Buffer, MAX_PAYLOAD, PoolSet, SharedBuffer};

use crate::counters::{FlowCounters, OutputCounters};
use admission::{Held, Reserve, Taken};
use gso::GsoRuns;
pub use ids::{FlowId, OutputId, Slot};
pub use inflight::InFlight;
use queue::{Queued, SendQueue};
use redundancy::Mode;
use redundancy::failover::Pass;
use redundancy::merge::{Merge, Verdict};
use redundancy::timers::Timers;
pub use redundancy::{LegId, Redundancy};
pub use request::{OutputSpec, Received, SendKind, SendRequest, SendToken, errno, refuses_gso};

#[derive(Debug)]
struct Output {
    depth: u32,
    /// Datagrams queued or in the kernel.
    in_flight: u32,
    queue: SendQueue,
    /// Largest datagram grouped into GSO sends; 0 when GSO is off.
    gso_max: usize,
    counters: Arc<OutputCounters>,
}

#[derive(Debug)]
struct Flow {
    outputs: Box<[Output]>,
    counters: Arc<FlowCounters>,
    paused: bool,
    removing: bool,
    held: Held,
    /// Its inputs (1 to [`LegId::MAX_LEGS`]).
    legs: u8,
    redundancy: Redundancy,
    mode: Mode,
    /// In [`Core::ready`]: held packets may leave once the queues have
    /// room.
    ready: bool,
}

/// One worker's relay state: its pool, in-flight table, GSO runs and flows.
#[derive(Debug)]
pub struct Core {
    pool: PoolSet,
    in_flight: InFlight,
    gso: GsoRuns,
    reserve: Reserve,
    /// Indexed by [`FlowId`]; `None` is a free number.
    flows: Vec<Option<Flow>>,
    /// Outputs with queued datagrams, each once.
    dirty: Vec<(FlowId, OutputId)>,
    /// When each redundancy flow next has something due.
    timers: Timers,
    /// Merge flows with held packets whose turn has come, stopped by full
    /// queues: served by the next tick (each once).
    ready: Vec<FlowId>,
    /// The flows a tick serves (kept for its capacity).
    due: Vec<FlowId>,
}

impl Core {
    /// A core relaying through `pool`: the in-flight table holds as many
    /// slots as the pool has buffers, so parking a buffer never fails.
    pub fn new(pool: PoolSet) -> Self {
        let capacity: u32 = mcrelay_pool::Class::ALL
            .iter()
            .map(|&c| pool.capacity(c))
            .sum();
        Self {
            pool,
            in_flight: InFlight::with_capacity(capacity),
            // A GSO send carries two datagrams or more, and every datagram
            // in flight holds a pool buffer.
            gso: GsoRuns::with_capacity(capacity / 2 + 1),
            reserve: Reserve::default(),
            flows: Vec::new(),
            dirty: Vec::with_capacity(64),
            timers: Timers::new(),
            ready: Vec::new(),
            due: Vec::new(),
        }
    }

    pub fn pool(&self) -> &PoolSet {
        &self.pool
    }

    pub fn in_flight(&self) -> &InFlight {
        &self.in_flight
    }

    /// Records of the GSO run table (the driver sizes its messages by it).
    pub fn gso_capacity(&self) -> usize {
        self.gso.capacity()
    }

    /// Flow numbers handed out so far (free ones included).
    pub fn flow_slots(&self) -> usize {
        self.flows.len()
    }

    /// Add a flow fed by `legs` inputs (1 to [`LegId::MAX_LEGS`], clamped)
    /// under `redundancy`; its number, or `None` when `limit` flows exist
    /// already.
    pub fn add_flow(
        &mut self,
        outputs: impl IntoIterator<Item = OutputSpec>,
        counters: Arc<FlowCounters>,
        legs: u8,
        redundancy: Redundancy,
        limit: usize,
    ) -> Option<FlowId> {
        let index = match self.flows.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.flows.len() < limit.min(FlowId::LIMIT) => {
                self.flows.push(None);
                self.flows.len() - 1
            }
            None => return None,
        };
        let id = FlowId::new(index)?;
        let outputs: Box<[Output]> = outputs
            .into_iter()
            .map(|o| Output {
                depth: o.depth.max(1),
                in_flight: 0,
                queue: SendQueue::default(),
                gso_max: if o.gso { MAX_PAYLOAD } else { 0 },
                counters: o.counters,
            })
            .take(usize::from(u16::MAX))
            .collect();
        self.flows[index] = Some(Flow {
            outputs,
            counters,
            paused: false,
            removing: false,
            held: Held::default(),
            legs: legs.clamp(1, LegId::MAX_LEGS),
            redundancy,
            mode: Mode::new(legs, redundancy),
            ready: false,
        });
        // A tick serves each flow at most twice (its timer, the ready
        // list): no allocation on the packet path.
        let slots = self.flows.len();
        self.timers.reserve(slots);
        self.ready.reserve(slots.saturating_sub(self.ready.len()));
        self.due.reserve((2 * slots).saturating_sub(self.due.len()));
        // The dirty list holds every output at most once.
        let total: usize = self.flows.iter().flatten().map(|f| f.outputs.len()).sum();
        self.dirty
            .reserve(total.saturating_sub(self.dirty.capacity()));
        self.rebalance();
        Some(id)
    }

    fn rebalance(&mut self) {
        let flows = self.flows.iter().flatten().map(|f| &f.held);
        self.reserve.rebalance(&self.pool, flows);
    }

    /// Stop relaying a flow: it takes no more datagrams and goes once its
    /// sends have completed ([`Core::is_quiet`], [`Core::forget`]).
    /// Packets a merge holds are sent first, in order.
    pub fn remove_flow(&mut self, flow: FlowId) {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return;
        };
        f.removing = true;
        if let Mode::Merge(m) = &mut f.mode {
            let mut parts = Parts {
                pool: &mut self.pool,
                in_flight: &mut self.in_flight,
                reserve: &mut self.reserve,
                dirty: &mut self.dirty,
            };
            m.drain(&mut |buf| parts.enqueue(flow, &mut f.outputs, &mut f.held, buf));
        }
    }

    /// Buffers a merge flow holds back (waiting for their turn).
    pub fn held(&self, flow: FlowId) -> usize {
        match self.flow(flow).map(|f| &f.mode) {
            Some(Mode::Merge(m)) => m.held(),
            _ => 0,
        }
    }

    /// A failover flow's active leg.
    pub fn active_leg(&self, flow: FlowId) -> Option<LegId> {
        match &self.flow(flow)?.mode {
            Mode::Failover(f) => Some(f.active()),
            _ => None,
        }
    }

    pub fn is_removing(&self, flow: FlowId) -> bool {
        self.flow(flow).is_some_and(|f| f.removing)
    }

    /// No send of this flow is queued or in the kernel.
    pub fn is_quiet(&self, flow: FlowId) -> bool {
        self.flow(flow)
            .is_none_or(|f| f.outputs.iter().all(|o| o.in_flight == 0))
    }

    /// Drop a quiet flow's state and free its number.
    pub fn forget(&mut self, flow: FlowId) {
        if self.is_quiet(flow)
            && let Some(slot) = self.flows.get_mut(flow.index())
        {
            *slot = None;
            self.timers.disarm(flow);
            self.ready.retain(|&f| f != flow);
            self.rebalance();
        }
    }

    pub fn is_paused(&self, flow: FlowId) -> bool {
        self.flow(flow).is_some_and(|f| f.paused)
    }

    /// The pause rule, checked once per loop turn: a paused flow resumes
    /// once one of its outputs has drained to half its depth. `true` when
    /// it resumed now (counted).
    pub fn resume(&mut self, flow: FlowId) -> bool {
        let Some(f) = self.flow_mut(flow) else {
            return false;
        };
        if !f.paused || !f.outputs.iter().any(|o| o.in_flight <= o.depth / 2) {
            return false;
        }
        f.paused = false;
        f.counters.receive_resumes.inc();
        true
    }

    fn flow(&self, flow: FlowId) -> Option<&Flow> {
        self.flows.get(flow.index())?.as_ref()
    }

    fn flow_mut(&mut self, flow: FlowId) -> Option<&mut Flow> {
        self.flows.get_mut(flow.index())?.as_mut()
    }

    /// A flow's legs and redundancy rule.
    pub fn redundancy(&self, flow: FlowId) -> Option<(u8, Redundancy)> {
        self.flow(flow).map(|f| (f.legs, f.redundancy))
    }

    /// A flow's counters (for the driver's receive errors).
    pub fn counters(&self, flow: FlowId) -> Option<&FlowCounters> {
        self.flow(flow).map(|f| &*f.counters)
    }

    /// [`Core::receive_on`] for a flow's first leg at time 0 (a
    /// `Single` flow reads no clock).
    #[inline]
    pub fn receive(&mut self, flow: FlowId, payload: &[u8]) -> Received {
        self.receive_on(flow, LegId(0), payload, 0)
    }

    /// Admission, the packet path: count, apply the flow's redundancy rule
    /// (which may drop the datagram, counted, before it takes a buffer),
    /// classify, take a pool buffer, copy `payload` into it once, and
    /// queue it on every output of `flow` that has room (or, merging with
    /// a delay, hold it until its turn). `leg` is the input it came from,
    /// `now_ns` the driver's clock.
    #[inline]
    pub fn receive_on(
        &mut self,
        flow: FlowId,
        leg: LegId,
        payload: &[u8],
        now_ns: u64,
    ) -> Received {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return Received::Dropped;
        };
        let len = payload.len();
        f.counters.packets_in.inc();
        f.counters.bytes_in.add(len as u64);
        let red = &f.counters.redundancy;
        let Some(forwarded) = red.forwarded.get(leg.index()).filter(|_| leg.0 < f.legs) else {
            red.unknown_leg.inc();
            return Received::Dropped;
        };
        if len > MAX_PAYLOAD {
            f.counters.drops.oversize.inc();
            return Received::Dropped;
        }
        let mut parts = Parts {
            pool: &mut self.pool,
            in_flight: &mut self.in_flight,
            reserve: &mut self.reserve,
            dirty: &mut self.dirty,
        };
        let counters = &*f.counters;
        let Flow {
            outputs,
            paused,
            held,
            mode,
            ready,
            ..
        } = f;
        // The rule's verdict, before any buffer is taken.
        let ticket = match mode {
            Mode::Single => Ticket::Single,
            Mode::Failover(fo) => {
                match fo.admit(leg, payload, now_ns, red) {
                    Pass::Forward(seq) => {
                        // The active leg's silence (or a revert) is next;
                        // a standby datagram changes neither.
                        if let Some(deadline) = fo.deadline(now_ns) {
                            self.timers.arm(flow, deadline);
                        }
                        Ticket::Failover(seq)
                    }
                    Pass::Standby => match red.standby.get(leg.index()) {
                        Some(c) => return drop(c),
                        None => return Received::Dropped,
                    },
                    Pass::Duplicate => return drop(&red.duplicates),
                    Pass::Late => return drop(&red.late),
                    Pass::NotRtp => return drop(&red.not_rtp),
                }
            }
            Mode::Merge(m) => {
                let Some(h) = mcrelay_wire::rtp::parse(payload) else {
                    return drop(&red.not_rtp);
                };
                let verdict = m.classify(leg, h.sequence, h.ssrc, now_ns, red, &mut |buf| {
                    parts.enqueue(flow, outputs, held, buf);
                });
                if let Some(deadline) = m.deadline() {
                    self.timers.arm(flow, deadline);
                }
                match verdict {
                    Verdict::New(ext) => Ticket::Merge(ext),
                    Verdict::Duplicate => return drop(&red.duplicates),
                    Verdict::Late => return drop(&red.late),
                }
            }
        };
        let buf = match parts.admit(outputs, counters, held, paused, payload) {
            Ok(buf) => buf,
            Err(dropped) => return dropped,
        };
        forwarded.inc();
        let buf = match (ticket, mode) {
            (Ticket::Failover(seq), Mode::Failover(fo)) => {
                fo.sent(seq, red);
                Some(buf)
            }
            (Ticket::Merge(ext), Mode::Merge(m)) => {
                let buf = m.commit(ext, buf);
                if m.delays() {
                    if let Some(buf) = buf {
                        parts.enqueue(flow, outputs, held, buf);
                    }
                    if parts.release_ready(flow, m, outputs, held, now_ns) && !*ready {
                        *ready = true;
                        self.ready.push(flow);
                    }
                    // Its turn may have opened windows to close.
                    if let Some(deadline) = m.deadline() {
                        self.timers.arm(flow, deadline);
                    }
                    None
                } else {
                    buf
                }
            }
            _ => Some(buf),
        };
        if let Some(buf) = buf {
            parts.enqueue(flow, outputs, held, buf);
        }
        Received::Queued
    }

    /// A loop turn at `now_ns`: what the redundancy rules have due —
    /// held packets whose turn came (also those stopped by full queues
    /// last turn), numbers missing for the merge delay skipped, merge
    /// windows accounted, the failover rule. O(flows with something
    /// due). Call it before flushing.
    pub fn tick(&mut self, now_ns: u64) {
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        self.timers.expire(now_ns, &mut due);
        due.append(&mut self.ready);
        for &flow in &due {
            self.serve(flow, now_ns);
        }
        due.clear();
        self.due = due;
    }

    /// When the driver should tick next at the latest (its wait's
    /// timeout): now when held packets are ready, the next timer slot when
    /// a timer is armed, `None` when nothing is pending.
    pub fn next_tick_ns(&self) -> Option<u64> {
        if !self.ready.is_empty() {
            return Some(0);
        }
        self.timers.next_ns()
    }

    fn serve(&mut self, flow: FlowId, now_ns: u64) {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return;
        };
        let red = &f.counters.redundancy;
        f.ready = false;
        let deadline = match &mut f.mode {
            Mode::Single => None,
            Mode::Failover(fo) => {
                fo.evaluate(now_ns, red);
                fo.deadline(now_ns)
            }
            Mode::Merge(m) => {
                let mut parts = Parts {
                    pool: &mut self.pool,
                    in_flight: &mut self.in_flight,
                    reserve: &mut self.reserve,
                    dirty: &mut self.dirty,
                };
                if parts.release_ready(flow, m, &mut f.outputs, &mut f.held, now_ns) {
                    f.ready = true;
                    self.ready.push(flow);
                }
                m.finalise(now_ns, red);
                m.deadline()
            }
        };
        if let Some(deadline) = deadline {
            self.timers.arm(flow, deadline);
        }
    }

    /// The slots of the datagrams queued on all outputs, not yet flushed.
    #[cfg(test)]
    fn queued_slots(&self) -> impl Iterator<Item = Slot> + '_ {
        self.dirty
            .iter()
            .filter_map(|&(f, o)| self.flow(f)?.outputs.get(o.index()))
            .flat_map(|o| o.queue.items().iter().map(|q| q.slot))
    }

    /// Turn every output's queued datagrams into sends: a GSO send per run
    /// of same-size datagrams, a plain send for the rest. `submit` hands
    /// one to the kernel; `false` when it could not (the submission queue
    /// stayed full): a GSO send is then sent plain, a plain one dropped and
    /// counted as a send error.
    pub fn flush(&mut self, submit: &mut impl FnMut(&SendRequest<'_>, &InFlight) -> bool) {
        for d in 0..self.dirty.len() {
            let (flow, output) = self.dirty[d];
            let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
                continue;
            };
            let Some(o) = f.outputs.get_mut(output.index()) else {
                continue;
            };
            let mut at = 0;
            loop {
                let n = o.queue.run_len(at, o.gso_max);
                let Some(run) = o.queue.items().get(at..at + n) else {
                    break;
                };
                let Some(first) = run.first() else {
                    break;
                };
                at += n;
                let record = if n > 1 {
                    u16::try_from(first.len).ok().and_then(|size| {
                        Some((size, self.gso.start(size, run.iter().map(|q| q.slot))?))
                    })
                } else {
                    None
                };
                if let Some((segment_size, record)) = record {
                    let req = SendRequest {
                        flow,
                        output,
                        kind: SendKind::Gso {
                            record,
                            segment_size,
                            slots: self.gso.slots(record),
                        },
                    };
                    if submit(&req, &self.in_flight) {
                        continue;
                    }
                    self.gso.finish(record);
                }
                for q in run {
                    let req = SendRequest {
                        flow,
                        output,
                        kind: SendKind::Plain { slot: q.slot },
                    };
                    if !submit(&req, &self.in_flight) {
                        let parts = (&mut self.in_flight, &mut self.pool, &mut self.reserve);
                        unsent((&mut o.in_flight, &o.counters), &mut f.held, parts, q.slot);
                    }
                }
            }
            o.queue.clear();
        }
        self.dirty.clear();
    }

    /// A send completed with `result` (bytes sent, or a negative errno).
    /// A refused GSO send is resent datagram by datagram through `submit`.
    pub fn complete(
        &mut self,
        token: SendToken,
        result: i32,
        submit: &mut impl FnMut(&SendRequest<'_>, &InFlight) -> bool,
    ) {
        match token {
            SendToken::Plain { slot, flow, output } => {
                self.plain_done(slot, flow, output, result);
            }
            SendToken::Gso {
                record,
                flow,
                output,
            } => self.gso_done(record, flow, output, result, submit),
        }
    }

    fn plain_done(&mut self, slot: Slot, flow: FlowId, output: OutputId, result: i32) {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return;
        };
        if let Some(o) = f.outputs.get_mut(output.index()) {
            o.in_flight = o.in_flight.saturating_sub(1);
            count_result(&o.counters, result, 1);
        }
        release(
            &mut self.in_flight,
            &mut self.pool,
            &mut self.reserve,
            &mut f.held,
            slot,
        );
    }

    fn gso_done(
        &mut self,
        record: u32,
        flow: FlowId,
        output: OutputId,
        result: i32,
        submit: &mut impl FnMut(&SendRequest<'_>, &InFlight) -> bool,
    ) {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return;
        };
        let Some(o) = f.outputs.get_mut(output.index()) else {
            return;
        };
        let slots = self.gso.slots(record);
        if slots.is_empty() {
            return;
        }
        if result < 0 && refuses_gso(-result) {
            // The kernel or the route can't segment this: send the same
            // datagrams one by one (their buffers are still held, and
            // `o.in_flight` still counts them), and stop grouping
            // datagrams this large on this output.
            o.counters.gso_fallbacks.inc();
            o.gso_max = if -result == errno::EINVAL || -result == errno::EMSGSIZE {
                self.gso.segment_size(record).saturating_sub(1)
            } else {
                0
            };
            for &slot in slots {
                let req = SendRequest {
                    flow,
                    output,
                    kind: SendKind::Plain { slot },
                };
                if !submit(&req, &self.in_flight) {
                    let parts = (&mut self.in_flight, &mut self.pool, &mut self.reserve);
                    unsent((&mut o.in_flight, &o.counters), &mut f.held, parts, slot);
                }
            }
            self.gso.finish(record);
            return;
        }
        let n = u32::try_from(slots.len()).unwrap_or(u32::MAX);
        o.in_flight = o.in_flight.saturating_sub(n);
        if result >= 0 {
            o.counters.gso_sends.inc();
        }
        count_result(&o.counters, result, u64::from(n));
        for &slot in slots {
            release(
                &mut self.in_flight,
                &mut self.pool,
                &mut self.reserve,
                &mut f.held,
                slot,
            );
        }
        self.gso.finish(record);
    }

    /// Datagrams an output has queued or in the kernel (`None` for an
    /// unknown output).
    pub fn output_in_flight(&self, flow: FlowId, output: OutputId) -> Option<u32> {
        Some(self.flow(flow)?.outputs.get(output.index())?.in_flight)
    }

    /// Publish the pool's counters (once per loop turn).
    pub fn publish_stats(&self) {
        self.pool.publish_stats();
    }

    /// Give up the pool (at exit with requests still pending: the driver
    /// leaks it, as the kernel may still read it).
    pub fn into_pool(self) -> PoolSet {
        self.pool
    }
}

/// What a flow's redundancy rule let through, to complete once the
/// datagram has a buffer.
#[derive(Debug, Clone, Copy)]
enum Ticket {
    Single,
    /// With the number to mark as sent.
    Failover(Option<(u16, u32)>),
    /// Its extended sequence number.
    Merge(u64),
}

/// Count a datagram a redundancy rule dropped.
fn drop(counter: &crate::counters::Counter) -> Received {
    counter.inc();
    Received::Dropped
}

/// The completion of `n` datagrams' send with `result`.
fn count_result(counters: &OutputCounters, result: i32, n: u64) {
    if result >= 0 {
        counters.packets_out.add(n);
        counters.bytes_out.add(u64::from(result.unsigned_abs()));
    } else {
        counters.drop_send_error.add(n);
        counters.last_error.set(u64::from(result.unsigned_abs()));
    }
}

/// A send the kernel could not take (its submission queue stayed full):
/// dropped for that output, counted as a send error.
fn unsent(
    (queued, counters): (&mut u32, &OutputCounters),
    held: &mut Held,
    (in_flight, pool, reserve): (&mut InFlight, &mut PoolSet, &mut Reserve),
    slot: Slot,
) {
    *queued = queued.saturating_sub(1);
    counters.drop_send_error.inc();
    release(in_flight, pool, reserve, held, slot);
}

/// One use of the buffer in `slot` is over; the last gives it back. Every
/// send of a buffer is on an output of the flow that received it, which
/// lives until its last send completes: `held` is that flow's.
fn release(
    in_flight: &mut InFlight,
    pool: &mut PoolSet,
    reserve: &mut Reserve,
    held: &mut Held,
    slot: Slot,
) {
    if let Some(buf) = in_flight.complete_one(slot) {
        let class = buf.class();
        if pool.give(buf).is_ok() {
            reserve.given(held, class);
        }
    }
}

/// The parts of the core admission and queueing use, borrowed apart
/// from the flow table.
struct Parts<'a> {
    pool: &'a mut PoolSet,
    in_flight: &'a mut InFlight,
    reserve: &'a mut Reserve,
    dirty: &'a mut Vec<(FlowId, OutputId)>,
}

impl Parts<'_> {
    /// Let a merge's held packets whose turn has come at `now` go, in
    /// order, while every output's queue has room; `true` when some are
    /// still due (the queues filled first).
    fn release_ready(
        &mut self,
        flow: FlowId,
        merge: &mut Merge,
        outputs: &mut [Output],
        held: &mut Held,
        now: u64,
    ) -> bool {
        loop {
            if outputs.iter().any(|o| o.queue.room() == 0) {
                return merge.has_ready(now);
            }
            let Some(buf) = merge.pop_ready(now) else {
                return false;
            };
            self.enqueue(flow, outputs, held, buf);
        }
    }

    /// A pool buffer holding `payload`, or why the datagram is dropped
    /// (counted): every output full (the flow pauses), or no buffer.
    /// Inlined: out of line, the one-leg path cost ~50 instructions more
    /// per datagram (`benches/core_instructions.rs`).
    #[inline(always)]
    fn admit(
        &mut self,
        outputs: &[Output],
        counters: &FlowCounters,
        held: &mut Held,
        paused: &mut bool,
        payload: &[u8],
    ) -> Result<Buffer, Received> {
        if !outputs.iter().any(|o| o.in_flight < o.depth) {
            for o in outputs {
                o.counters.drop_backlog.inc();
            }
            let newly = !*paused;
            *paused = true;
            return Err(Received::Full { newly });
        }
        let mut buf = match self.reserve.take(self.pool, held, payload.len()) {
            Taken::Fitting(buf) => buf,
            Taken::Fallback(buf) => {
                counters.pool_fallbacks.inc();
                buf
            }
            Taken::Exhausted => {
                counters.drops.pool_exhausted.inc();
                return Err(Received::Dropped);
            }
        };
        // Fits: admission picked a class at least `len` long.
        let _ = self.pool.fill(&mut buf, payload);
        Ok(buf)
    }

    /// Queue the datagram in `buf` on every output of `flow` with room;
    /// when none has, it is dropped (counted per output as backlog) and
    /// the buffer goes back. Inlined, as [`Parts::admit`].
    #[inline(always)]
    fn enqueue(&mut self, flow: FlowId, outputs: &mut [Output], held: &mut Held, buf: Buffer) {
        let len = buf.len();
        let accepted = outputs.iter().filter(|o| o.in_flight < o.depth).count();
        let uses = u32::try_from(accepted).unwrap_or(u32::MAX);
        let slot = match SharedBuffer::new(buf, uses)
            .and_then(|s| self.in_flight.insert(s).map_err(SharedBuffer::into_buffer))
        {
            Ok(slot) => slot,
            Err(buf) => {
                // No output with room (a held packet's turn came while
                // every output was full), or, unreachable, no free slot:
                // the table holds as many slots as the pool has buffers.
                for o in outputs.iter() {
                    o.counters.drop_backlog.inc();
                }
                let class = buf.class();
                if self.pool.give(buf).is_ok() {
                    self.reserve.given(held, class);
                }
                return;
            }
        };
        for (i, o) in outputs.iter_mut().enumerate() {
            if o.in_flight >= o.depth {
                o.counters.drop_backlog.inc();
                continue;
            }
            if o.queue.is_empty() {
                self.dirty
                    .push((flow, OutputId(u16::try_from(i).unwrap_or(u16::MAX))));
            }
            if o.queue.push(Queued { slot, len }) {
                o.in_flight += 1;
                if u64::from(o.in_flight) > o.counters.in_flight_high_water.get() {
                    o.counters.in_flight_high_water.set(u64::from(o.in_flight));
                }
            } else {
                // The queues are flushed before they can fill (after each
                // completion batch, and every 32 ring frames) and a merge's
                // held packets leave only into queues with room, but for
                // what a merge must let go at once (its hold full, a
                // restart, the flow removed): counted as backlog.
                o.counters.drop_backlog.inc();
                release(self.in_flight, self.pool, self.reserve, held, slot);
            }
        }
    }
}

#[cfg(test)]
mod tests;
