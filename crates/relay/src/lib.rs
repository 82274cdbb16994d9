//! mcrelay's relay crate: the packet path's decisions, with no I/O. It sits
//! between the io_uring driver (`mcrelay-uring`), which receives a datagram
//! and hands its bytes here, and the sends that driver submits: what this
//! crate decides (admit or drop and why, which pool buffer, which outputs,
//! GSO grouping, redundancy merge and failover, standby) comes back as plain
//! data. Its dependencies are the buffer pool (`mcrelay-pool`) and the
//! parsers (`mcrelay-wire`) only: no io_uring, libc, nix or socket crate,
//! and `unsafe` is forbidden. Beside the core it holds the per-datagram
//! pieces that need no kernel: the flow, output and loop [`counters`]
//! (relaxed atomics the driver writes and the supervisor reads) and stream
//! [`health`] (RTP/TS observation of every datagram; the one clock read,
//! [`health::now_ns`], is the driver's to call once per batch).
//!
//! The relay core: every rule of the packet path, with no sockets, no
//! io_uring, no fds and no clock (the model is quinn-proto). It takes
//! events — a datagram received on flow F with these bytes, send N
//! completed with result R, a loop turn — and hands out sends as plain
//! data ([`SendRequest`]: output, in-flight slots, segment size). The
//! driver (`mcrelay_uring::worker::driver`) only translates between these and
//! the kernel's SQEs and CQEs, its receive buffers and its packet rings.
//!
//! Rules and where they live:
//! - intake ([`Core::ingest`], [`intake`]): the one entry of every
//!   ingress: a frame its parser rejected counted by reason, an FEC
//!   receiver's datagram to its leg's decoder, a media datagram shown to
//!   its leg's stream health, then admitted;
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
//!   passed in as `now_ns`;
//! - warm standby ([`standby`]): every datagram is counted and discarded
//!   before admission, so nothing is sent;
//! - a flow replaced by a reload ([`Core::take_over`], `takeover`): its
//!   successor takes its redundancy state over, so nothing leaves twice;
//! - an output resuming after its predecessor's last RTP number
//!   (`resume`, [`OutputSpec::resume_after`]): a reload that moved it
//!   skips what it already sent.
#![forbid(unsafe_code)]

pub mod admission;
pub mod counters;
pub mod fec;
pub mod gso;
pub mod health;
pub mod ids;
pub mod inflight;
pub mod intake;
pub mod queue;
mod receive;
pub mod redundancy;
mod request;
mod resume;
pub mod rist;
mod rist_core;
pub use rist_core::RtcpTo;
mod send;
pub mod sequence;
pub mod standby;
mod takeover;

use std::sync::Arc;

use mcrelay_pool::{Buffer, MAX_PAYLOAD, PoolSet, SharedBuffer};

use crate::counters::{FlowCounters, OutputCounters};
use admission::{Held, Reserve, Taken};
use gso::GsoRuns;
pub use ids::{FlowId, OutputId, Slot};
pub use inflight::InFlight;
use queue::{Queued, SendQueue};
use redundancy::Mode;
use redundancy::merge::Merge;
use redundancy::timers::Timers;
pub use redundancy::{LegId, Redundancy};
pub use request::{OutputSpec, Received, SendKind, SendRequest, SendToken, errno, refuses_gso};
pub use takeover::Handover;

#[derive(Debug)]
struct Output {
    depth: u32,
    /// Datagrams queued or in the kernel.
    in_flight: u32,
    queue: SendQueue,
    /// Largest datagram grouped into GSO sends; 0 when GSO is off.
    gso_max: usize,
    counters: Arc<OutputCounters>,
    /// Resuming after another flow's last RTP number (`resume`).
    guard: resume::Guard,
    /// Carries only another output's 2022-1 FEC: takes no media.
    parity: bool,
    /// This output's 2022-1 FEC encoder and the outputs its column and
    /// row packets go to ([`Core::enable_fec_output`]).
    fec: Option<Box<OutputFec>>,
    /// A RIST output's retransmission buffer ([`Core::enable_rist_output`]).
    rist: Option<Box<rist::RistSender>>,
}

impl Output {
    /// Room for one more datagram, `bytes`, which it doesn't have yet.
    /// The guard is asked first, so its verdict is always this
    /// datagram's (read back by the enqueue).
    #[inline(always)]
    fn takes(&self, bytes: &[u8]) -> bool {
        !self.parity && self.guard.admits(bytes) && self.in_flight < self.depth
    }
}

#[derive(Debug)]
struct OutputFec {
    encoder: fec::FecEncoder,
    column: OutputId,
    row: OutputId,
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
    /// Failover with `rtp_rewrite`: the output's one RTP stream.
    rewrite: Option<Box<redundancy::rewrite::Rewrite>>,
    /// Per leg, its 2022-1 FEC decoder ([`Core::enable_fec`]); empty for
    /// a flow without FEC (the packet path's one extra check).
    fec: Vec<Option<Box<fec::FecDecoder>>>,
    /// Per leg, its RIST receiver ([`Core::enable_rist_input`]); empty
    /// for a flow without a RIST input.
    rist: Vec<Option<Box<rist::RistReceiver>>>,
    /// Its receivers and their stream health ([`Core::set_intake`]).
    intake: intake::Intake,
    /// The one-leg relay with nothing else to ask: `Single`, no FEC or
    /// RIST on its input, and no output with a resume guard, parity, a
    /// FEC encoder or a RIST ring ([`Flow::refresh_plain`]). The packet
    /// path's one check before the plain admission.
    plain: bool,
    /// Some output's resume guard is still on: the plain check is
    /// refreshed after each datagram until it ends.
    resuming: bool,
}

impl Flow {
    /// Recompute [`Flow::plain`] (and `resuming`) after anything it
    /// depends on changed: the rule, FEC or RIST enabled, a resume
    /// guard set or ended.
    fn refresh_plain(&mut self) {
        self.resuming = self.outputs.iter().any(|o| o.guard.mark.is_some());
        self.plain = matches!(self.mode, Mode::Single)
            && self.fec.is_empty()
            && self.rist.is_empty()
            && !self.resuming
            && self
                .outputs
                .iter()
                .all(|o| !o.parity && o.fec.is_none() && o.rist.is_none());
    }
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
    /// Warm standby: receive and count, send nothing ([`standby`]).
    standby: bool,
    /// The packets one FEC datagram repaired, copied out of the decoder
    /// before they are admitted (sized when the first FEC leg is added).
    fec_scratch: Vec<u8>,
    /// Their ends in `fec_scratch`.
    fec_ends: Vec<usize>,
    /// RIST state: how many senders and receivers exist, a datagram's
    /// copy out of a receiver, when the next reports are due.
    rist: rist_core::RistState,
    /// Receivers whose stream health took a datagram since the last
    /// [`Core::publish_health`], each once.
    health_unpublished: Vec<(FlowId, LegId)>,
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
            standby: false,
            fec_scratch: Vec::new(),
            fec_ends: Vec::new(),
            rist: rist_core::RistState::default(),
            health_unpublished: Vec::new(),
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
                guard: resume::Guard::new(o.resume_after),
                parity: false,
                fec: None,
                rist: None,
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
            rewrite: match redundancy {
                Redundancy::Failover {
                    rtp_rewrite: Some(clock_hz),
                    ..
                } => Some(Box::new(redundancy::rewrite::Rewrite::new(clock_hz))),
                _ => None,
            },
            fec: Vec::new(),
            rist: Vec::new(),
            intake: intake::Intake::default(),
            plain: false,
            resuming: false,
        });
        if let Some(f) = self.flows[index].as_mut() {
            f.refresh_plain();
        }
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

    /// Decode SMPTE 2022-1 FEC on leg `leg` of `flow`: its media
    /// packets are kept for repairs and [`Core::receive_fec`] takes its
    /// FEC datagrams. Allocates the decoder (about 850 KB); `false` for
    /// an unknown flow or leg.
    pub fn enable_fec(&mut self, flow: FlowId, leg: LegId) -> bool {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return false;
        };
        if leg.0 >= f.legs {
            return false;
        }
        if f.fec.is_empty() {
            f.fec.resize_with(usize::from(f.legs), || None);
        }
        f.fec[leg.index()] = Some(Box::new(fec::FecDecoder::new()));
        f.refresh_plain();
        let most = fec::decode::PENDING + 1;
        self.fec_scratch
            .reserve(most * fec::MAX_MEDIA - self.fec_scratch.len().min(most * fec::MAX_MEDIA));
        self.fec_ends.reserve(most);
        true
    }

    /// Send 2022-1 FEC of output `media` of `flow`: its column packets on
    /// output `column`, its row packets on output `row` (both then carry
    /// nothing else). `false` (nothing changed) for unknown or equal
    /// outputs or an invalid layout.
    pub fn enable_fec_output(
        &mut self,
        flow: FlowId,
        media: OutputId,
        column: OutputId,
        row: OutputId,
        layout: fec::FecLayout,
    ) -> bool {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return false;
        };
        let n = f.outputs.len();
        let (m, c, r) = (media.index(), column.index(), row.index());
        if !layout.is_valid() || m >= n || c >= n || r >= n || m == c || m == r || c == r {
            return false;
        }
        f.outputs[c].parity = true;
        f.outputs[r].parity = true;
        f.outputs[m].fec = Some(Box::new(OutputFec {
            encoder: fec::FecEncoder::new(layout),
            column,
            row,
        }));
        f.refresh_plain();
        true
    }

    /// A flow leg's FEC decoder counters (tests, benches).
    pub fn fec_stats(&self, flow: FlowId, leg: LegId) -> Option<fec::FecStats> {
        let d = self.flow(flow)?.fec.get(leg.index())?.as_ref()?;
        Some(*d.stats())
    }

    /// Buffers a merge flow holds back (waiting for their turn).
    pub fn held(&self, flow: FlowId) -> usize {
        match self.flow(flow).map(|f| &f.mode) {
            Some(Mode::Merge(m)) => m.held(),
            _ => 0,
        }
    }

    /// Datagrams every output of `flow` still has room for (0 for an
    /// unknown flow).
    pub fn room(&self, flow: FlowId) -> u32 {
        self.flow(flow).map_or(0, |f| {
            f.outputs
                .iter()
                .map(|o| o.depth.saturating_sub(o.in_flight))
                .min()
                .unwrap_or(0)
        })
    }

    /// The highest RTP number (and SSRC) a merge or failover flow sent;
    /// `None` for a one-leg flow (its stream health has it) or one that
    /// sent no RTP.
    pub fn last_sent(&self, flow: FlowId) -> Option<(u16, u32)> {
        match &self.flow(flow)?.mode {
            Mode::Merge(m) => m.highest(),
            Mode::Failover(f) => f.highest(),
            Mode::Single | Mode::Replaced => None,
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
        if !f.paused
            || !f
                .outputs
                .iter()
                .any(|o| !o.parity && o.in_flight <= o.depth / 2)
        {
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

    /// The slots of the datagrams queued on all outputs, not yet flushed.
    #[cfg(test)]
    fn queued_slots(&self) -> impl Iterator<Item = Slot> + '_ {
        self.dirty
            .iter()
            .filter_map(|&(f, o)| self.flow(f)?.outputs.get(o.index()))
            .flat_map(|o| o.queue.items().iter().map(|q| q.slot))
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

/// Outputs with room for one more datagram, `bytes`, that they don't
/// have yet (see `resume`).
#[inline(always)]
fn with_room<const PLAIN: bool>(outputs: &[Output], bytes: &[u8]) -> u32 {
    let n = if PLAIN {
        outputs.iter().filter(|o| o.in_flight < o.depth).count()
    } else {
        outputs.iter().filter(|o| o.takes(bytes)).count()
    };
    u32::try_from(n).unwrap_or(u32::MAX)
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

    /// A pool buffer holding `payload` and the number of outputs with
    /// room (its uses, for [`Parts::enqueue_uses`]), or why the datagram
    /// is dropped (counted): every output full (the flow pauses), or no
    /// buffer. Inlined: out of line, the one-leg path cost ~50
    /// instructions more per datagram (`benches/core_instructions.rs`).
    #[inline(always)]
    fn admit(
        &mut self,
        outputs: &[Output],
        counters: &FlowCounters,
        held: &mut Held,
        paused: &mut bool,
        payload: &[u8],
    ) -> Result<(Buffer, u32), Received> {
        self.admit_as::<false>(outputs, counters, held, paused, payload)
    }

    /// [`Parts::admit`]; `PLAIN` for a [`Flow::plain`] flow's outputs
    /// (no guard, parity, encoder or RIST ring to ask).
    #[inline(always)]
    fn admit_as<const PLAIN: bool>(
        &mut self,
        outputs: &[Output],
        counters: &FlowCounters,
        held: &mut Held,
        paused: &mut bool,
        payload: &[u8],
    ) -> Result<(Buffer, u32), Received> {
        let uses = with_room::<PLAIN>(outputs, payload);
        if uses == 0 {
            if outputs.iter().any(|o| o.in_flight < o.depth) {
                // Room, but every output with room already has it: a
                // reload's successor resuming after its predecessor.
                counters.redundancy.duplicates.inc();
                return Err(Received::Dropped);
            }
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
        Ok((buf, uses))
    }

    /// Queue the datagram in `buf` on every output of `flow` with room;
    /// when none has, it is dropped (counted per output as backlog) and
    /// the buffer goes back. Inlined, as [`Parts::admit`].
    #[inline(always)]
    fn enqueue(&mut self, flow: FlowId, outputs: &mut [Output], held: &mut Held, buf: Buffer) {
        let uses = with_room::<false>(outputs, self.pool.bytes(&buf));
        self.enqueue_uses(flow, outputs, held, buf, uses);
    }

    /// [`Parts::enqueue`] with `uses`, the outputs with room, already
    /// counted (by [`Parts::admit`], nothing queued since).
    #[inline(always)]
    fn enqueue_uses(
        &mut self,
        flow: FlowId,
        outputs: &mut [Output],
        held: &mut Held,
        buf: Buffer,
        uses: u32,
    ) {
        self.enqueue_as::<false>(flow, outputs, held, buf, uses);
    }

    /// [`Parts::enqueue_uses`]; `PLAIN` as in [`Parts::admit_as`].
    #[inline(always)]
    fn enqueue_as<const PLAIN: bool>(
        &mut self,
        flow: FlowId,
        outputs: &mut [Output],
        held: &mut Held,
        buf: Buffer,
        uses: u32,
    ) {
        let len = buf.len();
        // Outputs (of the first 64) with an encoder that took the packet,
        // and RIST outputs that sent it (they keep a copy).
        let mut encode = 0u64;
        let mut keep = 0u64;
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
            if !PLAIN && o.parity {
                continue;
            }
            // Judged by `with_room` just before: an output resuming after
            // a reload skips what it already has.
            if !PLAIN && !o.guard.take() {
                continue;
            }
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
                if !PLAIN && o.fec.is_some() && i < 64 {
                    encode |= 1 << i;
                }
                if !PLAIN && o.rist.is_some() && i < 64 {
                    keep |= 1 << i;
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
        if PLAIN {
            return;
        }
        while encode != 0 {
            let i = encode.trailing_zeros() as usize;
            encode &= encode - 1;
            self.encode_fec(flow, outputs, held, slot, i);
        }
        if keep != 0 {
            self.keep_for_rist(outputs, slot, keep);
        }
    }

    /// Feed the datagram in `slot` to output `i`'s FEC encoder and queue
    /// the FEC packets it completes on their outputs (each in a pool
    /// buffer of its own; without one, or without room, counted as that
    /// output's backlog).
    #[cold]
    fn encode_fec(
        &mut self,
        flow: FlowId,
        outputs: &mut [Output],
        held: &mut Held,
        slot: Slot,
        i: usize,
    ) {
        let Some(buf) = self.in_flight.buffer(slot) else {
            return;
        };
        let Some(fec) = outputs.get_mut(i).and_then(|o| o.fec.as_mut()) else {
            return;
        };
        let done = fec.encoder.push_stored(self.pool.bytes(buf));
        let (column, row) = (fec.column, fec.row);
        for direction in done.iter() {
            let target = match direction {
                fec::Direction::Column => column.index(),
                fec::Direction::Row => row.index(),
            };
            let Some(data) = outputs[i].fec.as_ref().map(|f| f.encoder.packet(direction)) else {
                return;
            };
            let len = data.len();
            let mut b = match self.reserve.take(self.pool, held, len) {
                Taken::Fitting(b) | Taken::Fallback(b) => b,
                Taken::Exhausted => {
                    outputs[target].counters.drop_backlog.inc();
                    continue;
                }
            };
            let _ = self.pool.fill(&mut b, data);
            self.queue_one(flow, outputs, held, target, b);
        }
    }

    /// Queue `b`, a datagram of its own (FEC, a RIST retransmission), on
    /// output `target` alone; without room counted as that output's
    /// backlog and given back.
    fn queue_one(
        &mut self,
        flow: FlowId,
        outputs: &mut [Output],
        held: &mut Held,
        target: usize,
        b: Buffer,
    ) {
        let len = b.len();
        let Some(o) = outputs.get_mut(target) else {
            let class = b.class();
            if self.pool.give(b).is_ok() {
                self.reserve.given(held, class);
            }
            return;
        };
        let parked = if o.in_flight < o.depth {
            SharedBuffer::new(b, 1)
                .and_then(|s| self.in_flight.insert(s).map_err(SharedBuffer::into_buffer))
        } else {
            Err(b)
        };
        let s = match parked {
            Ok(s) => s,
            Err(b) => {
                o.counters.drop_backlog.inc();
                let class = b.class();
                if self.pool.give(b).is_ok() {
                    self.reserve.given(held, class);
                }
                return;
            }
        };
        if o.queue.is_empty() {
            self.dirty
                .push((flow, OutputId(u16::try_from(target).unwrap_or(u16::MAX))));
        }
        if o.queue.push(Queued { slot: s, len }) {
            o.in_flight += 1;
            if u64::from(o.in_flight) > o.counters.in_flight_high_water.get() {
                o.counters.in_flight_high_water.set(u64::from(o.in_flight));
            }
        } else {
            o.counters.drop_backlog.inc();
            release(self.in_flight, self.pool, self.reserve, held, s);
        }
    }
}

#[cfg(test)]
mod tests;
