//! The io_uring driver of one worker: the loop, the commands of a reload,
//! and the translation of the core's send requests into SQEs and of send
//! completions back. Every relay rule is the core's ([`crate::core`]);
//! receives and packet rings are in [`super::receive`].
#![allow(unsafe_code)]

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use io_uring::types::{SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue};
use mcrelay_pool::{PoolConfig, PoolSet};

use super::{
    Command, Event, FlowSockets, ReceiveMode, WorkerConfig, WorkerError, WorkerStats,
    receive_buffers,
};
use crate::core::{Core, FlowId, InFlight, LegId, OutputSpec, Redundancy, SendKind, SendRequest};
use crate::counters::LoopCounters;
use crate::egress::GsoMessages;
use crate::ingress::IngressSocket;
use crate::packet_ring::PacketRing;
use crate::receive_buffers::ReceiveBuffers;
use crate::submit::{self, UserData};

/// The longest a loop turn waits for a completion: how soon a stop request
/// or a command is noticed.
const TICK_NS: u64 = 100_000_000;

/// The receive buffer of leg `leg` of flow `f` in single-receive mode.
pub(super) fn single_buffer(f: FlowId, leg: LegId) -> Option<u16> {
    f.get()
        .checked_mul(u16::from(LegId::MAX_LEGS))?
        .checked_add(u16::from(leg.0))
}

/// Completions handled per batch (a stack array; the loop takes batches
/// until the completion queue is empty, submitting the sends of each).
pub(super) const CQE_BATCH: usize = 64;

/// What the driver keeps of one leg (input) of a flow: its socket, the
/// state of its receive in the kernel, its packet ring and its health.
pub(super) struct Leg {
    pub(super) fd: i32,
    /// The receive (or the packet ring's poll) is armed in the kernel.
    pub(super) armed: bool,
    /// The first receive error was logged.
    pub(super) error_logged: bool,
    /// Stream health of the leg: every datagram is shown to it before
    /// the core, with the batch's clock reading; published once per batch
    /// ([`Worker::publish_health`]).
    pub(super) health: crate::health::InputHealth,
    /// Packet ingress: the frames' filter, checked again per frame.
    pub(super) packet: Option<mcrelay_wire::FlowMatch>,
    /// Packet ingress: frames are left in the packet ring for the next turn.
    pub(super) ring_pending: bool,
    /// Packet ingress: the mapped `TPACKET_V3` packet ring (`None` only if
    /// it could not be set up: then the leg receives nothing, logged).
    /// Unmapped before the socket closes (field order).
    pub(super) packet_ring: Option<PacketRing>,
    /// Closed when the flow goes (which leaves its group), after the packet
    /// ring no longer names its fd.
    _ingress: IngressSocket,
}

/// What the driver keeps of a flow: its legs and its output sockets. Its
/// relay state is the core's, at the same [`FlowId`].
pub(super) struct Flow {
    pub(super) name: String,
    /// Output sockets' fds, in the core's output order.
    pub(super) output_fds: Box<[i32]>,
    /// Each leg, its index its [`LegId`] (1 to [`LegId::MAX_LEGS`]).
    pub(super) legs: Box<[Leg]>,
    /// Kept open for as long as the io_uring may name their fds.
    _outputs: Box<[UdpSocket]>,
}

impl Flow {
    /// Split a flow's sockets into the driver's part and the core's.
    fn new(
        f: FlowSockets,
        gso: bool,
    ) -> (
        Self,
        Vec<OutputSpec>,
        Arc<crate::counters::FlowCounters>,
        Redundancy,
    ) {
        let specs = f
            .outputs
            .iter()
            .map(|o| OutputSpec {
                depth: o.queue_depth,
                gso: gso && crate::sockets::supports_gso(&o.socket),
                counters: Arc::clone(&o.counters),
            })
            .collect();
        let output_fds = f.outputs.iter().map(|o| o.socket.as_raw_fd()).collect();
        let legs = f
            .legs
            .into_iter()
            .enumerate()
            .map(|(i, ingress)| Leg::new(&f.name, i, ingress, f.health, &f.counters))
            .collect();
        let flow = Self {
            name: f.name,
            output_fds,
            legs,
            _outputs: f.outputs.into_iter().map(|o| o.socket).collect(),
        };
        (flow, specs, f.counters, f.redundancy)
    }

    /// Leg `leg`, if the flow has it.
    pub(super) fn leg(&self, leg: LegId) -> Option<&Leg> {
        self.legs.get(leg.index())
    }

    pub(super) fn leg_mut(&mut self, leg: LegId) -> Option<&mut Leg> {
        self.legs.get_mut(leg.index())
    }

    /// Every leg's number.
    pub(super) fn leg_ids(&self) -> impl Iterator<Item = LegId> + Clone + use<> {
        (0..u8::try_from(self.legs.len()).unwrap_or(0)).map(LegId)
    }
}

impl Leg {
    fn new(
        flow: &str,
        index: usize,
        ingress: IngressSocket,
        health: crate::health::HealthSettings,
        counters: &Arc<crate::counters::FlowCounters>,
    ) -> Self {
        let packet_ring =
            ingress
                .packet_filter()
                .and_then(|_| match PacketRing::new(ingress.fd()) {
                    Ok(ring) => {
                        tracing::info!(
                            flow,
                            leg = index,
                            blocks = ring.blocks(),
                            "packet ingress on a TPACKET_V3 ring"
                        );
                        Some(ring)
                    }
                    Err(e) => {
                        tracing::error!(
                            flow,
                            leg = index,
                            "no TPACKET_V3 ring ({e}): this packet leg receives nothing"
                        );
                        None
                    }
                });
        Self {
            fd: ingress.fd(),
            armed: false,
            error_logged: false,
            health: crate::health::InputHealth::for_leg(health, Arc::clone(counters), index),
            packet: ingress.packet_filter(),
            ring_pending: false,
            packet_ring,
            _ingress: ingress,
        }
    }
}

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
    gso_enabled: bool,
    pub(super) index: usize,
    cpu: Option<usize>,
    pub(super) loop_counters: Arc<LoopCounters>,
    /// The monotonic clock ([`crate::health::now_ns`]), read once per
    /// completion batch and loop turn: the arrival time of what it holds.
    pub(super) now_ns: u64,
    /// Legs whose stream health saw datagrams not yet published, each at
    /// most once; room for every leg of every flow, so a push never
    /// allocates.
    pub(super) health_unpublished: Vec<(FlowId, LegId)>,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<Event>,
}

impl Worker {
    pub(super) fn new(
        config: WorkerConfig,
        commands: mpsc::Receiver<Command>,
        events: mpsc::Sender<Event>,
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
                u16::try_from(config.flows.len() * 2 * usize::from(LegId::MAX_LEGS))
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
        let core = Core::new(pool);
        let mut w = Self {
            uring,
            receive_buffers,
            gso_msgs: GsoMessages::with_capacity(core.gso_capacity()),
            core,
            flows: Vec::with_capacity(config.flows.len()),
            multishot,
            gso_enabled: config.gso,
            index: worker,
            cpu: config.cpu,
            loop_counters: Arc::new(LoopCounters::default()),
            now_ns: crate::health::now_ns(),
            health_unpublished: Vec::new(),
            commands,
            events,
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
            "worker ready"
        );
        Ok(w)
    }

    /// Give a flow a number in the core and here; its name back when
    /// `limit` flows exist already.
    fn place(&mut self, f: FlowSockets, limit: usize) -> Result<FlowId, String> {
        let (flow, specs, counters, redundancy) = Flow::new(f, self.gso_enabled);
        let legs = u8::try_from(flow.legs.len()).unwrap_or(u8::MAX);
        let Some(id) = self.core.add_flow(specs, counters, legs, redundancy, limit) else {
            return Err(flow.name);
        };
        if self.flows.len() <= id.index() {
            self.flows.resize_with(id.index() + 1, || None);
        }
        self.flows[id.index()] = Some(flow);
        let room = self.flows.len() * usize::from(LegId::MAX_LEGS);
        self.health_unpublished
            .reserve(room.saturating_sub(self.health_unpublished.len()));
        Ok(id)
    }

    /// Publish the stream health of every leg that received since the
    /// last call: once per completion batch, not per datagram.
    pub(super) fn publish_health(&mut self) {
        for (f, l) in self.health_unpublished.drain(..) {
            if let Some(leg) = self
                .flows
                .get_mut(f.index())
                .and_then(Option::as_mut)
                .and_then(|fl| fl.leg_mut(l))
            {
                leg.health.publish();
            }
        }
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
        }
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
            // next timer (a held packet's turn, a merge window, failover).
            let wait_ns = self.core.next_tick_ns().map_or(TICK_NS, |at| {
                at.saturating_sub(crate::health::now_ns()).min(TICK_NS)
            });
            // Frames left in a packet ring, or a timer due: look for
            // completions, don't wait.
            let want = usize::from(
                wait_ns > 0
                    && !self
                        .flows
                        .iter()
                        .flatten()
                        .any(|f| f.legs.iter().any(|l| l.ring_pending)),
            );
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
                self.now_ns = crate::health::now_ns();
                self.loop_counters.completions.add(n as u64);
                for cqe in batch.iter_mut().take(n).filter_map(Option::take) {
                    self.complete(&cqe);
                }
                self.flush_sends();
                self.publish_health();
                // Hand this batch's sends to the kernel now: they complete
                // (inline, mostly) while the next batch is handled, so an
                // output's in-flight count tracks the kernel, not how many
                // receives one turn happened to reap.
                if !self.uring.submission().is_empty() {
                    let _ = self.uring.submit();
                }
            }
            if stopping.is_none() {
                self.take_commands();
                self.now_ns = crate::health::now_ns();
                for f in self.ids() {
                    self.turn(f);
                }
                // The redundancy rules' timers: held packets whose turn
                // came, the merge window, failover. What they release is
                // sent now.
                self.core.tick(self.now_ns);
                self.flush_sends();
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
                return;
            }
            for leg in legs.clone() {
                if self.leg(f, leg).is_some_and(|l| l.packet_ring.is_some()) {
                    // Blocks filled meanwhile wake nobody: walk them.
                    self.service_ring(f, leg);
                }
            }
        }
        for leg in legs {
            if self.leg(f, leg).is_some_and(|l| l.ring_pending) && !self.core.is_paused(f) {
                self.service_ring(f, leg);
            }
            if self.leg(f, leg).is_some_and(|l| !l.armed) {
                self.arm_receive(f, leg);
            }
        }
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

    /// Apply the commands the control plane queued (a reload).
    fn take_commands(&mut self) {
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::AddFlow(f) => self.add_flow(*f),
                Command::RemoveFlow(name) => self.remove_flow(name),
            }
        }
    }

    fn add_flow(&mut self, f: FlowSockets) {
        let worker = self.index;
        if f.outputs.len() > usize::from(u16::MAX) {
            return self.report(Event::FlowRefused {
                worker,
                flow: f.name,
                reason: format!("more than {} outputs", u16::MAX),
            });
        }
        // Single receives name their buffer by flow number and leg.
        let limit = if self.multishot {
            FlowId::LIMIT - 1
        } else {
            self.receive_buffers.len() / usize::from(LegId::MAX_LEGS)
        };
        let outputs = f.outputs.len();
        let legs = f.legs.len();
        if legs == 0 || legs > usize::from(LegId::MAX_LEGS) {
            return self.report(Event::FlowRefused {
                worker,
                flow: f.name,
                reason: format!("{legs} inputs; a flow has 1 to {}", LegId::MAX_LEGS),
            });
        }
        match self.place(f, limit) {
            Ok(id) => {
                self.arm_receives(id);
                let name = self.flows[id.index()]
                    .as_ref()
                    .map(|f| f.name.clone())
                    .unwrap_or_default();
                tracing::info!(worker, flow = %name, legs, outputs, "flow added");
                self.report(Event::FlowAdded { worker, flow: name });
            }
            Err(name) => self.report(Event::FlowRefused {
                worker,
                flow: name,
                reason: format!("worker {worker} already has {limit} flows"),
            }),
        }
    }

    fn remove_flow(&mut self, name: String) {
        let found = self.ids().find(|&f| {
            !self.core.is_removing(f)
                && self.flows[f.index()]
                    .as_ref()
                    .is_some_and(|fl| fl.name == name)
        });
        match found {
            Some(f) => {
                self.core.remove_flow(f);
                self.cancel_receives(f);
            }
            None => self.report(Event::FlowUnknown {
                worker: self.index,
                flow: name,
            }),
        }
    }

    /// Drop the flows whose remove has finished: nothing of theirs is left
    /// in the kernel, so their sockets can close.
    fn finish_removals(&mut self) {
        for f in self.ids() {
            let done = self.flows[f.index()]
                .as_ref()
                .is_some_and(|fl| fl.legs.iter().all(|l| !l.armed))
                && self.core.is_removing(f)
                && self.core.is_quiet(f);
            if done && let Some(flow) = self.flows[f.index()].take() {
                self.core.forget(f);
                tracing::info!(worker = self.index, flow = %flow.name, "flow removed");
                self.report(Event::FlowRemoved {
                    worker: self.index,
                    flow: flow.name,
                });
            }
        }
    }

    fn report(&self, event: Event) {
        // The control plane may have stopped listening; the worker goes on.
        let _ = self.events.send(event);
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

    fn complete(&mut self, cqe: &cqueue::Entry) {
        match UserData::decode(cqe.user_data()) {
            Some(UserData::Receive { flow, leg }) => self.received(flow, leg, cqe),
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
    }

    fn submitter(&mut self) -> (Submitter<'_>, &mut Core) {
        (
            Submitter {
                uring: &mut self.uring,
                gso_msgs: &mut self.gso_msgs,
                flows: &self.flows,
                loop_counters: &self.loop_counters,
            },
            &mut self.core,
        )
    }
}

/// The translation of the core's send requests into SQEs.
struct Submitter<'a> {
    uring: &'a mut IoUring,
    gso_msgs: &'a mut GsoMessages,
    flows: &'a [Option<Flow>],
    loop_counters: &'a LoopCounters,
}

impl Submitter<'_> {
    fn submit(&mut self, req: &SendRequest<'_>, in_flight: &InFlight) -> bool {
        let Some(&fd) = self
            .flows
            .get(req.flow.index())
            .and_then(Option::as_ref)
            .and_then(|f| f.output_fds.get(req.output.index()))
        else {
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
