//! The io_uring driver of one worker: the loop, and the translation of the
//! core's send requests into SQEs and of send completions back. Every relay
//! rule is the core's ([`mcrelay_relay`]); receives and packet rings are in
//! [`super::receive`], the commands of a reload in [`super::commands`], what
//! it keeps per flow and leg in [`super::flow`].
#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use io_uring::types::{SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue};
use mcrelay_pool::{PoolConfig, PoolSet};

use super::flow::{Flow, Leg};
use super::{Command, Event, ReceiveMode, WorkerConfig, WorkerError, WorkerStats, receive_buffers};
use crate::egress::GsoMessages;
use crate::packet_ring::WAKE_INTERVAL;
use crate::receive_buffers::ReceiveBuffers;
use crate::submit::{self, UserData};
use mcrelay_relay::counters::LoopCounters;
use mcrelay_relay::{Core, FlowId, InFlight, LegId, SendKind, SendRequest};

/// The longest a loop turn waits for a completion: how soon a stop request
/// or a command is noticed.
const TICK_NS: u64 = 100_000_000;

/// The receive buffer of leg `leg` of flow `f` in single-receive mode.
pub(super) fn single_buffer(f: FlowId, leg: LegId) -> Option<u16> {
    f.get()
        .checked_mul(u16::from(LegId::MAX_RECEIVERS))?
        .checked_add(u16::from(leg.0))
}

/// Completions handled per batch (a stack array; the loop takes batches
/// until the completion queue is empty, submitting the sends of each).
pub(super) const CQE_BATCH: usize = 64;

pub(super) struct Worker {
    // Field order is drop order: the io_uring (and with it every
    // registration and pending request) goes before the memory and sockets
    // the kernel may touch.
    pub(super) uring: IoUring,
    pub(super) receive_buffers: ReceiveBuffers,
    pub(super) core: Core,
    pub(super) gso_msgs: GsoMessages,
    /// Indexed by [`FlowId`], as the core's flows; `None` is a free number.
    pub(super) flows: Vec<Option<Flow>>,
    pub(super) multishot: bool,
    /// Flows with `latency = "low"` placed here: while any, the loop never
    /// waits.
    pub(super) busy_flows: usize,
    pub(super) gso_enabled: bool,
    pub(super) index: usize,
    cpu: Option<usize>,
    pub(super) loop_counters: Arc<LoopCounters>,
    /// The monotonic clock ([`mcrelay_relay::health::now_ns`]), read once per
    /// completion batch and loop turn: the arrival time of what it holds.
    pub(super) now_ns: u64,
    /// When [`Worker::settle_health`] last ran.
    settled_ns: u64,
    pub(super) commands: mpsc::Receiver<Command>,
    pub(super) events: mpsc::Sender<Event>,
    /// Written by the control plane after queueing a command; its poll is
    /// armed on the ring while `wake_armed`.
    waker: super::wake::Waker,
    wake_armed: bool,
    /// Flows to visit at the end of this turn (not every flow).
    pub(super) attention: super::attention::Attention,
    /// Flows being removed, until their last send completes.
    pub(super) removing: Vec<FlowId>,
    /// RIST's RTCP reads ([`Worker::service_rist`]).
    pub(super) rist_io: super::rist::RistIo,
    /// `egress = "xdp"` outputs placed here (while 0, flushes skip them).
    pub(super) xsk_outputs: usize,
    /// The xdp outputs' sends of one flush, completed after it
    /// ([`Worker::finish_xsk_sends`]); capacity `xsk_done_room`.
    pub(super) xsk_done: Vec<(mcrelay_relay::SendToken, i32)>,
    pub(super) xsk_done_room: usize,
    /// An xdp output's last kick left frames the kernel could take soon:
    /// the loop waits at most `WAKE_INTERVAL` to kick again.
    pub(super) xsk_retry: bool,
}

impl Worker {
    pub(super) fn new(
        config: WorkerConfig,
        commands: mpsc::Receiver<Command>,
        events: mpsc::Sender<Event>,
        waker: super::wake::Waker,
    ) -> Result<Self, WorkerError> {
        let worker = config.index;
        if let Some(cpu) = config.cpu {
            crate::affinity::pin_current_thread(cpu).map_err(|source| WorkerError::Pin {
                worker,
                cpu,
                source,
            })?;
        }
        // Built on the pinned thread, so its pages are touched (and placed)
        // where they will be used.
        let pool =
            PoolSet::new(config.pools).map_err(|source| WorkerError::Pool { worker, source })?;
        let uring_err = |source| WorkerError::Ring { worker, source };
        let output_count: usize = config.flows.iter().map(|f| f.outputs.len()).sum();
        if config.flows.len() >= FlowId::LIMIT
            || config
                .flows
                .iter()
                .any(|f| f.outputs.len() > usize::from(u16::MAX))
        {
            return Err(WorkerError::TooMany {
                worker,
                flows: config.flows.len(),
                outputs: output_count,
            });
        }
        let depth_total: u64 = config
            .flows
            .iter()
            .flat_map(|f| &f.outputs)
            .map(|o| u64::from(o.queue_depth))
            .sum();
        // Room for every send that may be in flight plus a receive per
        // receive buffer; the kernel buffers overflow beyond that anyway.
        // (Flows added by a reload share this; the kernel keeps completions
        // that overflow the queue and hands them over later.)
        let buffers = receive_buffers(&config.flows);
        let cq = (depth_total + u64::from(buffers) + 64)
            .next_power_of_two()
            .clamp(1024, 65536);
        let uring = IoUring::builder()
            .setup_cqsize(u32::try_from(cq).unwrap_or(65536))
            .setup_single_issuer()
            .setup_coop_taskrun()
            .build(1024)
            .map_err(uring_err)?;
        // In single-receive mode each leg's buffer is the one its flow's
        // number and its leg name ([`single_buffer`]): room for every leg
        // of twice the flows it starts with (a reload that needs more
        // numbers than that is refused for this worker).
        let entries = match config.receive {
            ReceiveMode::Auto => buffers,
            ReceiveMode::Single => buffers.max(
                u16::try_from(config.flows.len() * 2 * usize::from(LegId::MAX_RECEIVERS))
                    .unwrap_or(u16::MAX)
                    .clamp(16, 16384)
                    .next_power_of_two(),
            ),
        };
        let receive_buffers = ReceiveBuffers::new(entries, 0).map_err(uring_err)?;
        let multishot = match config.receive {
            ReceiveMode::Single => false,
            ReceiveMode::Auto => match receive_buffers.register(&uring.submitter()) {
                Ok(()) => true,
                Err(e) => {
                    tracing::info!(
                        worker,
                        "provided buffer rings unavailable ({e}); using re-armed receives"
                    );
                    false
                }
            },
        };
        let mut core = Core::new(pool);
        core.set_standby(config.standby);
        let mut w = Self {
            uring,
            receive_buffers,
            gso_msgs: GsoMessages::with_capacity(core.gso_capacity()),
            core,
            flows: Vec::with_capacity(config.flows.len()),
            multishot,
            busy_flows: 0,
            gso_enabled: config.gso,
            index: worker,
            cpu: config.cpu,
            loop_counters: Arc::new(LoopCounters::default()),
            now_ns: mcrelay_relay::health::now_ns(),
            settled_ns: 0,
            commands,
            events,
            waker,
            wake_armed: false,
            attention: super::attention::Attention::default(),
            removing: Vec::new(),
            rist_io: super::rist::RistIo::default(),
            xsk_outputs: 0,
            xsk_done: Vec::new(),
            xsk_done_room: 0,
            xsk_retry: false,
        };
        let flows = config.flows.len();
        for f in config.flows {
            // Within the limit: checked above.
            let _ = w.place(f, FlowId::LIMIT);
        }
        tracing::info!(
            worker,
            cpu = ?config.cpu,
            flows,
            outputs = output_count,
            receive = if multishot { "multishot + provided buffers" } else { "re-armed single receives" },
            gso = config.gso,
            standby = config.standby,
            "worker ready"
        );
        Ok(w)
    }

    /// At most once per `TICK_NS`: every quiet input's missing RTP
    /// numbers counted lost ([`mcrelay_relay::health::InputHealth::settle`]).
    /// O(legs), off the packet path.
    fn settle_health(&mut self) {
        let now = self.now_ns;
        if now.saturating_sub(self.settled_ns) < TICK_NS {
            return;
        }
        self.settled_ns = now;
        self.core.settle_health(now);
    }

    pub(super) fn stats(&self) -> Arc<WorkerStats> {
        Arc::new(WorkerStats {
            index: self.index,
            cpu: self.cpu,
            loop_counters: Arc::clone(&self.loop_counters),
            pool: self.core.pool().stats(),
            multishot: self.multishot,
        })
    }

    /// Every flow number in use or free.
    pub(super) fn ids(&self) -> impl Iterator<Item = FlowId> + use<> {
        (0..self.flows.len()).filter_map(FlowId::new)
    }

    pub(super) fn run(&mut self, stop: &AtomicBool) -> Result<(), WorkerError> {
        let worker = self.index;
        for f in self.ids() {
            self.arm_receives(f);
            self.notice_if_needed(f);
        }
        self.arm_wake();
        let interval_ns = u64::try_from(WAKE_INTERVAL.as_nanos()).unwrap_or(TICK_NS);
        let mut batch = [const { None::<cqueue::Entry> }; CQE_BATCH];
        let mut stopping: Option<Instant> = None;
        loop {
            if stopping.is_none() && stop.load(Ordering::Relaxed) {
                stopping = Some(Instant::now());
                for f in self.ids() {
                    self.cancel_receives(f);
                }
            }
            if let Some(since) = stopping {
                let receiving = self
                    .flows
                    .iter()
                    .flatten()
                    .any(|f| f.legs.iter().any(|l| l.armed));
                if (!receiving && self.core.in_flight().is_empty())
                    || since.elapsed() > Duration::from_secs(1)
                {
                    break;
                }
            }
            // Wait at most the 100 ms tick, or until the redundancy rules'
            // next timer (a held packet's turn, a merge window, failover),
            // or WAKE_INTERVAL when a busy frame-slot ring is walked by
            // interval.
            let mut wait_ns = self.core.next_tick_ns().map_or(TICK_NS, |at| {
                at.saturating_sub(mcrelay_relay::health::now_ns())
                    .min(TICK_NS)
            });
            // Frames left in a packet ring (only flows queued for attention
            // can have some, or walk by interval), or a timer due: look for
            // completions, don't wait.
            let flows = &self.flows;
            let (ring_pending, by_interval) =
                self.attention
                    .queued()
                    .iter()
                    .fold((false, false), |(p, i), f| {
                        match flows.get(f.index()).and_then(Option::as_ref) {
                            Some(fl) => (
                                p || fl.legs.iter().any(|l| l.ring_pending),
                                i || fl.walks_by_interval(),
                            ),
                            None => (p, i),
                        }
                    });
            // An xdp output's TX ring holds frames its last kick left (see
            // `xsk_egress`): come back soon to kick again.
            if by_interval || self.xsk_retry {
                wait_ns = wait_ns.min(interval_ns);
            }
            if self.core.has_rist() {
                wait_ns = wait_ns.min(super::rist::RIST_POLL_NS);
            }
            // Busy polling: enter only to run task work and reap (a zero
            // timeout, still with GETEVENTS so receive completions are
            // posted), never to sleep.
            if self.busy_flows > 0 {
                wait_ns = 0;
            }
            let want = usize::from((wait_ns > 0 || self.busy_flows > 0) && !ring_pending);
            let tick = Timespec::new().nsec(u32::try_from(wait_ns).unwrap_or(100_000_000));
            let args = SubmitArgs::new().timespec(&tick);
            match self.uring.submitter().submit_with_args(want, &args) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
                    ) => {}
                Err(source) => return Err(WorkerError::Enter { worker, source }),
            }
            self.loop_counters.turns.inc();
            loop {
                let mut n = 0;
                for (slot, cqe) in batch.iter_mut().zip(self.uring.completion()) {
                    *slot = Some(cqe);
                    n += 1;
                }
                if n == 0 {
                    break;
                }
                // One clock reading per batch: every datagram in it
                // arrived by now (the core and stream health take it).
                self.now_ns = mcrelay_relay::health::now_ns();
                self.loop_counters.completions.add(n as u64);
                for cqe in batch.iter_mut().take(n).filter_map(Option::take) {
                    self.complete(&cqe);
                }
                self.flush_sends();
                // Stream health, once per batch.
                self.core.publish_health();
                // Hand this batch's sends to the kernel now: they complete
                // (inline, mostly) while the next batch is handled, so an
                // output's in-flight count tracks the kernel, not how many
                // receives one turn happened to reap.
                if !self.uring.submission().is_empty() {
                    let _ = self.uring.submit();
                }
            }
            if stopping.is_none() {
                if !self.wake_armed {
                    self.arm_wake();
                }
                self.take_commands();
                self.now_ns = mcrelay_relay::health::now_ns();
                let visit = self.attention.take();
                for &f in &visit {
                    self.turn(f);
                }
                self.attention.done(visit);
                // The redundancy rules' timers: held packets whose turn
                // came, the merge window, failover. What they release is
                // sent now.
                self.core.tick(self.now_ns);
                self.service_rist();
                self.flush_sends();
                self.settle_health();
            }
            self.finish_removals();
            self.receive_buffers.publish();
            self.core.publish_stats();
        }
        self.core.publish_stats();
        if !self.core.in_flight().is_empty()
            || self
                .flows
                .iter()
                .flatten()
                .any(|f| f.legs.iter().any(|l| l.armed))
        {
            self.leak_kernel_memory();
        }
        Ok(())
    }

    /// A flow's share of a loop turn: the pause rule, the packet rings'
    /// leftover frames, re-arming receives (per leg).
    fn turn(&mut self, f: FlowId) {
        let Some(flow) = self.flows.get(f.index()).and_then(Option::as_ref) else {
            return;
        };
        if self.core.is_removing(f) {
            return;
        }
        let legs = flow.leg_ids();
        // A socket leg's pause cancelled its receive; a packet ring leg's
        // poll stays armed and its pause only stopped the walk.
        if self.core.is_paused(f) {
            if !self.core.resume(f) {
                // Checked again next turn.
                self.attention.notice(f);
                return;
            }
            for leg in legs.clone() {
                if self.leg(f, leg).is_some_and(|l| l.has_ring()) {
                    // Blocks filled meanwhile wake nobody: walk them.
                    self.service_ring(f, leg);
                }
            }
        }
        for leg in legs {
            if self
                .leg(f, leg)
                .is_some_and(|l| l.ring_pending || l.walks_by_interval())
                && !self.core.is_paused(f)
            {
                self.service_ring(f, leg);
            }
            if self.leg(f, leg).is_some_and(|l| !l.armed) {
                self.arm_receive(f, leg);
            }
        }
        self.notice_if_needed(f);
    }

    /// Leg `leg` of flow `f`.
    pub(super) fn leg(&self, f: FlowId, leg: LegId) -> Option<&Leg> {
        self.flows.get(f.index())?.as_ref()?.leg(leg)
    }

    pub(super) fn leg_mut(&mut self, f: FlowId, leg: LegId) -> Option<&mut Leg> {
        self.flows.get_mut(f.index())?.as_mut()?.leg_mut(leg)
    }

    /// The legs of flow `f` (none for a free number).
    fn legs_of(&self, f: FlowId) -> impl Iterator<Item = LegId> + use<> {
        self.flows
            .get(f.index())
            .and_then(Option::as_ref)
            .map(Flow::leg_ids)
            .into_iter()
            .flatten()
    }

    /// Arm every leg's receive of flow `f`.
    pub(super) fn arm_receives(&mut self, f: FlowId) {
        for leg in self.legs_of(f) {
            self.arm_receive(f, leg);
        }
    }

    /// Cancel every leg's receive of flow `f`.
    pub(super) fn cancel_receives(&mut self, f: FlowId) {
        for leg in self.legs_of(f) {
            self.cancel_receive(f, leg);
        }
    }

    /// Queue flow `f` for the end of the turn if it needs the loop: a
    /// pause to lift, frames left in its packet ring, a receive to re-arm
    /// (a packet flow without a ring never has one).
    pub(super) fn notice_if_needed(&mut self, f: FlowId) {
        let Some(flow) = self.flows.get(f.index()).and_then(Option::as_ref) else {
            return;
        };
        if self.core.is_removing(f) {
            return;
        }
        // A packet leg without a ring never has a receive to arm; a busy
        // frame-slot ring is walked every turn (every WAKE_INTERVAL).
        let leg_needs = |l: &Leg| {
            l.ring_pending
                || l.walks_by_interval()
                || (!l.armed && (l.packet.is_none() || l.has_ring()))
        };
        if self.core.is_paused(f) || flow.legs.iter().any(leg_needs) {
            self.attention.notice(f);
        }
    }

    /// Requests still pending at exit may make the kernel read pool buffers
    /// or write receive buffers after the io_uring is gone: never free
    /// memory it could touch. The process is stopping, so leaking it is
    /// harmless.
    fn leak_kernel_memory(&mut self) {
        tracing::warn!(
            worker = self.index,
            pending_sends = self.core.in_flight().len(),
            "requests still pending at exit; leaking their buffers"
        );
        let tiny = PoolConfig {
            small: 1,
            standard: 1,
            jumbo: 1,
        };
        if let Ok(small) = PoolSet::new(tiny) {
            let core = std::mem::replace(&mut self.core, Core::new(small));
            std::mem::forget(core);
        }
        std::mem::forget(std::mem::replace(
            &mut self.gso_msgs,
            GsoMessages::with_capacity(0),
        ));
        if let Ok(small) = ReceiveBuffers::new(1, 0) {
            std::mem::forget(std::mem::replace(&mut self.receive_buffers, small));
        }
        // Their sockets too: a pending request names their fds.
        std::mem::forget(std::mem::take(&mut self.flows));
    }

    /// Poll the wake-up eventfd (multishot): a command queued by the
    /// control plane ends the wait of this turn's enter.
    fn arm_wake(&mut self) {
        let entry = self.waker.poll_entry().user_data(UserData::Wake.encode());
        // SAFETY: the poll names only the eventfd, which `self.waker` keeps
        // open for as long as the worker (and so its io_uring) lives.
        self.wake_armed = unsafe { submit::push(&mut self.uring, &entry) };
    }

    fn complete(&mut self, cqe: &cqueue::Entry) {
        match UserData::decode(cqe.user_data()) {
            Some(UserData::Wake) => {
                // The commands themselves are taken at the end of the turn.
                self.waker.drain();
                if !cqueue::more(cqe.flags()) {
                    self.wake_armed = false;
                }
            }
            Some(UserData::Receive { flow, leg }) => {
                self.received(flow, leg, cqe);
                // Its receive ended, it paused, or frames are left.
                self.notice_if_needed(flow);
            }
            Some(u) => {
                if let Some(token) = u.token() {
                    let (mut submitter, core) = self.submitter();
                    core.complete(token, cqe.result(), &mut |req, inf| {
                        submitter.submit(req, inf)
                    });
                }
            }
            None => {}
        }
    }

    /// Hand every output's queued datagrams to the kernel.
    pub(super) fn flush_sends(&mut self) {
        let (mut submitter, core) = self.submitter();
        core.flush(&mut |req, inf| submitter.submit(req, inf));
        self.finish_xsk_sends();
    }

    pub(super) fn submitter(&mut self) -> (Submitter<'_>, &mut Core) {
        (
            Submitter {
                uring: &mut self.uring,
                gso_msgs: &mut self.gso_msgs,
                flows: &mut self.flows,
                loop_counters: &self.loop_counters,
                xsk_done: &mut self.xsk_done,
            },
            &mut self.core,
        )
    }
}

/// The translation of the core's send requests into SQEs.
pub(super) struct Submitter<'a> {
    uring: &'a mut IoUring,
    gso_msgs: &'a mut GsoMessages,
    flows: &'a mut [Option<Flow>],
    loop_counters: &'a LoopCounters,
    xsk_done: &'a mut Vec<(mcrelay_relay::SendToken, i32)>,
}

impl Submitter<'_> {
    pub(super) fn submit(&mut self, req: &SendRequest<'_>, in_flight: &InFlight) -> bool {
        let Some(flow) = self
            .flows
            .get_mut(req.flow.index())
            .and_then(Option::as_mut)
        else {
            return false;
        };
        // An xdp output: written into its TX ring, completed after the
        // flush.
        if let Some(taken) = super::xsk_egress::submit(
            flow.xsk_outputs
                .get_mut(req.output.index())
                .and_then(Option::as_mut),
            req,
            in_flight,
            self.xsk_done,
        ) {
            return taken;
        }
        let Some(&fd) = flow.output_fds.get(req.output.index()) else {
            return false;
        };
        let user_data = UserData::from(req.token());
        let queued = match req.kind {
            // SAFETY: the core keeps the slot's buffer parked in
            // `in_flight` until this send's completion (or until this
            // returns false); the pool and the output's socket live in the
            // worker, which drops its io_uring first.
            SendKind::Plain { slot } => unsafe {
                submit::push_send(self.uring, fd, in_flight, slot, user_data)
            },
            SendKind::Gso {
                record,
                segment_size,
                slots,
            } => {
                // SAFETY: as above for every slot; the core hands `record`
                // out again only after this send's completion finished it,
                // and `gso_msgs` lives in the worker after its io_uring.
                unsafe {
                    submit::push_gso(
                        self.uring,
                        fd,
                        self.gso_msgs,
                        (record, segment_size, slots),
                        in_flight,
                        user_data,
                    )
                }
            }
        };
        if queued {
            self.loop_counters.sends_submitted.inc();
        }
        queued
    }
}
