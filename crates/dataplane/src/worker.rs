//! One worker: a thread pinned to one CPU that owns an io_uring, a pool
//! set, receive buffers, and the sockets of the flows assigned to it.
//!
//! Each loop turn makes one `io_uring_enter` that submits everything queued
//! since the last turn and waits for at least one completion (or a 100 ms
//! tick, to notice a stop request). Then it handles the completions in
//! batches: a receive copies the datagram into a pool buffer (the one copy),
//! gives the receive buffer back to the kernel, and queues the datagram on
//! each output that has room; at the end of the batch each output's queue
//! becomes sends — a UDP GSO send per run of same-size datagrams where the
//! kernel takes it, else one send per datagram — handed to the kernel at
//! once. A send completion releases one use of the pool buffer per
//! datagram, and the last one gives it back. Nothing in the turn allocates,
//! locks, blocks (outside the enter) or logs per packet.

use std::io;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::types::{CancelBuilder, Fd, SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue, opcode};
use mcrelay_pool::{MAX_PAYLOAD, PoolConfig, PoolSet, PoolStatsHandle, SharedBuffer};

use crate::bufring::{BUFFER_LEN, ProvidedBuffers};
use crate::counters::{FlowCounters, FlowStats, LoopCounters, OutputCounters};
use crate::egress::{GsoTable, Pending, PendingSends};
use crate::core::InFlight;
use crate::ingress::IngressSocket;
use crate::packet_ring::PacketRing;
use crate::submit::{MAX_FLOWS, Submit, UserData};

/// How ingress is received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiveMode {
    /// Multishot receive with a provided-buffer ring when the kernel takes
    /// it, else re-armed single receives (probed once at start).
    Auto,
    /// Always re-armed single receives (the fallback; forced in tests).
    Single,
}

/// One output's socket, ready to send.
#[derive(Debug)]
pub struct OutputSocket {
    /// For logs and stats, e.g. `239.2.2.2:6000`.
    pub label: String,
    /// Connected to the destination.
    pub socket: UdpSocket,
    /// Sends in flight before further packets for this output are dropped.
    pub queue_depth: u32,
    /// Written by the worker, read by anyone.
    pub counters: Arc<OutputCounters>,
}

impl OutputSocket {
    pub fn new(label: String, socket: UdpSocket, queue_depth: u32) -> Self {
        Self {
            label,
            socket,
            queue_depth,
            counters: Arc::default(),
        }
    }
}

/// One flow's sockets, opened before the flow starts (at start-up or on a
/// reload), and its counters.
#[derive(Debug)]
pub struct FlowSockets {
    pub name: String,
    pub ingress: IngressSocket,
    pub outputs: Vec<OutputSocket>,
    /// Written by the worker, read by anyone.
    pub counters: Arc<FlowCounters>,
}

impl FlowSockets {
    pub fn new(name: String, ingress: IngressSocket, outputs: Vec<OutputSocket>) -> Self {
        Self {
            name,
            ingress,
            outputs,
            counters: Arc::default(),
        }
    }

    /// The handles a reader keeps to watch this flow's counters.
    pub fn stats(&self) -> FlowStats {
        FlowStats {
            name: self.name.clone(),
            input: Arc::clone(&self.counters),
            outputs: self
                .outputs
                .iter()
                .map(|o| (o.label.clone(), Arc::clone(&o.counters)))
                .collect(),
        }
    }
}

/// A change to a running worker's flows (a reload). Only these allocate,
/// and only on the control plane's schedule, never per packet.
#[derive(Debug)]
pub enum Command {
    /// Start relaying a flow whose sockets are open.
    AddFlow(FlowSockets),
    /// Stop a flow: cancel its receive, let its in-flight sends complete,
    /// close its sockets (which leaves its group).
    RemoveFlow(String),
}

/// What a worker reports back about a [`Command`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    FlowAdded {
        worker: usize,
        flow: String,
    },
    /// The flow could not be added (the worker is full); its sockets were
    /// closed.
    FlowRefused {
        worker: usize,
        flow: String,
        reason: String,
    },
    /// The flow's last send completed and its sockets are closed.
    FlowRemoved {
        worker: usize,
        flow: String,
    },
    /// A remove named a flow the worker doesn't have.
    FlowUnknown {
        worker: usize,
        flow: String,
    },
}

/// Commands waiting for a worker: a reload sends a handful.
const COMMAND_QUEUE: usize = 256;

/// Everything a worker is started with.
#[derive(Debug)]
pub struct WorkerConfig {
    /// Worker number, for thread names and logs.
    pub index: usize,
    /// CPU to pin to; `None` leaves the thread unpinned.
    pub cpu: Option<usize>,
    pub pools: PoolConfig,
    pub flows: Vec<FlowSockets>,
    pub receive: ReceiveMode,
    /// Group same-size datagrams into UDP GSO sends on outputs whose
    /// sockets take `UDP_SEGMENT`.
    pub gso: bool,
}

/// Receive buffers in a worker's provided-buffer ring: half the smallest
/// output queue depth of its flows (a power of two, 16 to 512).
///
/// Completions are reaped in order, and up to one ring's worth of receive
/// completions can be queued ahead of the completions of sends already
/// done, so an output's in-flight count can overshoot by that much. Keeping
/// the ring below the queue depth keeps the cap about slow outputs, not
/// about reap order. (Measured: with 512 buffers and the default depth of
/// 256, a 1→4 fan-out at 30 kpps dropped up to 40 % as "backlog".) The
/// socket's receive buffer, not this ring, absorbs bursts.
fn receive_buffers(flows: &[FlowSockets]) -> u16 {
    let depth = flows
        .iter()
        .flat_map(|f| &f.outputs)
        .map(|o| o.queue_depth)
        .min()
        .unwrap_or(256);
    let half = u16::try_from((depth / 2).clamp(16, 512)).unwrap_or(512);
    // Largest power of two not above `half`.
    1 << (15 - half.leading_zeros())
}

/// What readers can see of a running worker (its flows' counters are in
/// the [`FlowSockets`] the worker was given).
#[derive(Debug)]
pub struct WorkerStats {
    pub index: usize,
    pub cpu: Option<usize>,
    pub loop_counters: Arc<LoopCounters>,
    pub pool: PoolStatsHandle,
    /// Whether multishot receive with provided buffers is in use.
    pub multishot: bool,
}

/// Why a worker could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("worker {worker}: pinning to CPU {cpu}: {source}")]
    Pin {
        worker: usize,
        cpu: usize,
        source: io::Error,
    },
    #[error("worker {worker}: building its pools: {source}")]
    Pool {
        worker: usize,
        source: mcrelay_pool::PoolError,
    },
    #[error("worker {worker}: setting up io_uring: {source}")]
    Ring { worker: usize, source: io::Error },
    #[error("worker {worker}: {flows} flows with {outputs} outputs exceed the worker's limits")]
    TooMany {
        worker: usize,
        flows: usize,
        outputs: usize,
    },
    #[error("worker {worker}: io_uring_enter failed: {source}")]
    Enter { worker: usize, source: io::Error },
    #[error("worker {worker}: thread could not start: {source}")]
    Spawn { worker: usize, source: io::Error },
    #[error("worker {worker}: stopped before it was ready")]
    Vanished { worker: usize },
}

/// A running worker.
#[derive(Debug)]
pub struct WorkerHandle {
    pub stats: Arc<WorkerStats>,
    thread: JoinHandle<Result<(), WorkerError>>,
    commands: mpsc::SyncSender<Command>,
}

impl WorkerHandle {
    /// Queue a command; the worker takes it within one loop turn (at most
    /// its 100 ms tick) and answers with an [`Event`]. The command back
    /// when the queue is full or the worker is gone.
    pub fn command(&self, command: Command) -> Result<(), Command> {
        self.commands.try_send(command).map_err(|e| match e {
            mpsc::TrySendError::Full(c) | mpsc::TrySendError::Disconnected(c) => c,
        })
    }

    /// Whether the worker thread has ended (it only does after a stop or a
    /// fatal ring error).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Wait for the worker to finish (after the stop flag is set).
    pub fn join(self) -> Result<(), WorkerError> {
        let worker = self.stats.index;
        self.thread
            .join()
            .unwrap_or(Err(WorkerError::Vanished { worker }))
    }
}

/// Start a worker thread; returns once its ring, pools and receives are set
/// up (or with the reason they could not be). It reports what it does with
/// later commands on `events`.
pub fn spawn(
    config: WorkerConfig,
    stop: Arc<AtomicBool>,
    events: mpsc::Sender<Event>,
) -> Result<WorkerHandle, WorkerError> {
    let worker = config.index;
    let (ready_tx, ready_rx) = mpsc::sync_channel(1);
    let (commands, command_rx) = mpsc::sync_channel(COMMAND_QUEUE);
    let thread = std::thread::Builder::new()
        .name(format!("mcrelay-w{worker}"))
        .spawn(move || {
            let mut w = match Worker::new(config, command_rx, events) {
                Ok(w) => w,
                Err(e) => {
                    let msg = e.to_string();
                    let _ = ready_tx.send(Err(e));
                    return Err(WorkerError::Ring {
                        worker,
                        source: io::Error::other(msg),
                    });
                }
            };
            let _ = ready_tx.send(Ok(w.stats()));
            w.run(&stop)
        })
        .map_err(|source| WorkerError::Spawn { worker, source })?;
    match ready_rx.recv() {
        Ok(Ok(stats)) => Ok(WorkerHandle {
            stats,
            thread,
            commands,
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(WorkerError::Vanished { worker }),
    }
}

struct Flow {
    name: String,
    fd: i32,
    outputs: Box<[Output]>,
    counters: Arc<FlowCounters>,
    /// The receive is armed in the kernel.
    armed: bool,
    /// The first receive error was logged.
    error_logged: bool,
    /// A remove is under way: no more receives; the flow goes once its
    /// receive is cancelled and its sends have completed.
    removing: bool,
    /// Every output was backed up: the receive was cancelled so the socket
    /// buffer, not this worker, takes (and counts) the excess. Re-armed
    /// once an output has drained to half its depth.
    paused: bool,
    /// Packet ingress: the frames' filter, checked again per frame.
    packet: Option<mcrelay_wire::FlowMatch>,
    /// Packet ingress: frames are left in the ring for the next turn.
    ring_pending: bool,
    /// Packet ingress: the mapped `TPACKET_V3` ring (`None` only if it
    /// could not be set up: then the flow receives nothing, logged).
    /// Unmapped before the socket closes (field order).
    ring: Option<PacketRing>,
    /// Closed when the flow goes (which leaves its group), after the ring
    /// no longer names its fd.
    _ingress: IngressSocket,
}

impl Flow {
    fn new(f: FlowSockets, gso: bool) -> Self {
        let ring = f.ingress.packet_filter().and_then(|_| {
            match PacketRing::new(f.ingress.fd()) {
                Ok(ring) => {
                    tracing::info!(flow = %f.name, blocks = ring.blocks(), "packet ingress on a TPACKET_V3 ring");
                    Some(ring)
                }
                Err(e) => {
                    tracing::error!(flow = %f.name, "no TPACKET_V3 ring ({e}): this packet flow receives nothing");
                    None
                }
            }
        });
        let outputs = f
            .outputs
            .into_iter()
            .map(|o| Output {
                fd: o.socket.as_raw_fd(),
                depth: o.queue_depth.max(1),
                in_flight: 0,
                pending: PendingSends::default(),
                gso_max: if gso && crate::sockets::supports_gso(&o.socket) {
                    MAX_PAYLOAD
                } else {
                    0
                },
                counters: o.counters,
                _socket: o.socket,
            })
            .collect();
        Self {
            name: f.name,
            fd: f.ingress.fd(),
            packet: f.ingress.packet_filter(),
            ring_pending: false,
            ring,
            outputs,
            counters: f.counters,
            armed: false,
            error_logged: false,
            removing: false,
            paused: false,
            _ingress: f.ingress,
        }
    }

    /// Whether a paused flow may receive again.
    fn drained(&self) -> bool {
        self.outputs.iter().any(|o| o.in_flight <= o.depth / 2)
    }

    /// Nothing of this flow is left in the kernel.
    fn quiet(&self) -> bool {
        !self.armed && self.outputs.iter().all(|o| o.in_flight == 0)
    }
}

struct Output {
    fd: i32,
    depth: u32,
    /// Sends queued or in the kernel, counted in datagrams.
    in_flight: u32,
    /// Datagrams queued in this completion batch, sent when it ends.
    pending: PendingSends,
    /// Largest datagram grouped into GSO sends; 0 when GSO is off.
    gso_max: usize,
    counters: Arc<OutputCounters>,
    /// Kept open for as long as the ring may name its fd.
    _socket: UdpSocket,
}

/// Completions handled per batch (a stack array; the loop takes batches
/// until the completion queue is empty, submitting the sends of each).
const CQE_BATCH: usize = 64;

struct Worker {
    // Field order is drop order: the ring (and with it every registration
    // and pending request) goes before the memory and sockets the kernel
    // may touch.
    ring: IoUring,
    bufs: ProvidedBuffers,
    pool: PoolSet,
    in_flight: InFlight,
    gso: GsoTable,
    /// Indexed by flow number (which travels in `user_data`); `None` is a
    /// free number.
    flows: Vec<Option<Flow>>,
    /// Outputs with queued sends, each once: (flow, output).
    dirty: Vec<(u16, u16)>,
    multishot: bool,
    gso_enabled: bool,
    index: usize,
    cpu: Option<usize>,
    loop_counters: Arc<LoopCounters>,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<Event>,
}

impl Worker {
    fn new(
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
        let ring_err = |source| WorkerError::Ring { worker, source };
        let output_count: usize = config.flows.iter().map(|f| f.outputs.len()).sum();
        if config.flows.len() >= MAX_FLOWS
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
        // provided buffer; the kernel buffers overflow beyond that anyway.
        // (Flows added by a reload share this; the kernel keeps completions
        // that overflow the queue and hands them over later.)
        let receive_buffers = receive_buffers(&config.flows);
        let cq = (depth_total + u64::from(receive_buffers) + 64)
            .next_power_of_two()
            .clamp(1024, 65536);
        let ring = IoUring::builder()
            .setup_cqsize(u32::try_from(cq).unwrap_or(65536))
            .setup_single_issuer()
            .setup_coop_taskrun()
            .build(1024)
            .map_err(ring_err)?;
        // In single-receive mode each flow's buffer is the one its number
        // names: room for twice the flows it starts with (a reload that
        // needs more numbers than that is refused for this worker).
        let entries = match config.receive {
            ReceiveMode::Auto => receive_buffers,
            ReceiveMode::Single => receive_buffers.max(
                u16::try_from(config.flows.len() * 2)
                    .unwrap_or(u16::MAX)
                    .clamp(16, 4096)
                    .next_power_of_two(),
            ),
        };
        let bufs = ProvidedBuffers::new(entries, 0).map_err(ring_err)?;
        let multishot = match config.receive {
            ReceiveMode::Single => false,
            ReceiveMode::Auto => match bufs.register(&ring.submitter()) {
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
        let capacity = config.pools.small + config.pools.standard + config.pools.jumbo;
        let gso_enabled = config.gso;
        let flows: Vec<Option<Flow>> = config
            .flows
            .into_iter()
            .map(|f| Some(Flow::new(f, gso_enabled)))
            .collect();
        let gso_outputs = flows
            .iter()
            .flatten()
            .flat_map(|f| f.outputs.iter())
            .filter(|o| o.gso_max > 0)
            .count();
        tracing::info!(
            worker,
            cpu = ?config.cpu,
            flows = flows.len(),
            outputs = output_count,
            receive = if multishot { "multishot + provided buffers" } else { "re-armed single receives" },
            gso_outputs,
            "worker ready"
        );
        Ok(Self {
            ring,
            bufs,
            pool,
            in_flight: InFlight::with_capacity(capacity),
            // A GSO send carries two datagrams or more, and every datagram
            // in flight holds a pool buffer.
            gso: GsoTable::with_capacity(capacity / 2 + 1),
            dirty: Vec::with_capacity(output_count.max(64)),
            flows,
            multishot,
            gso_enabled,
            index: worker,
            cpu: config.cpu,
            loop_counters: Arc::new(LoopCounters::default()),
            commands,
            events,
        })
    }

    fn stats(&self) -> Arc<WorkerStats> {
        Arc::new(WorkerStats {
            index: self.index,
            cpu: self.cpu,
            loop_counters: Arc::clone(&self.loop_counters),
            pool: self.pool.stats(),
            multishot: self.multishot,
        })
    }

    fn run(&mut self, stop: &AtomicBool) -> Result<(), WorkerError> {
        let worker = self.index;
        for f in 0..self.flows.len() {
            self.arm_receive(f);
        }
        let tick = Timespec::new().nsec(100_000_000);
        let args = SubmitArgs::new().timespec(&tick);
        let mut batch = [const { None::<cqueue::Entry> }; CQE_BATCH];
        let mut stopping: Option<Instant> = None;
        loop {
            if stopping.is_none() && stop.load(Ordering::Relaxed) {
                stopping = Some(Instant::now());
                for f in 0..self.flows.len() {
                    self.cancel_receive(f);
                }
            }
            if let Some(since) = stopping {
                let receiving = self.flows.iter().flatten().any(|f| f.armed);
                if (!receiving && self.in_flight.is_empty())
                    || since.elapsed() > Duration::from_secs(1)
                {
                    break;
                }
            }
            // Frames left in a ring: look for completions, don't wait.
            let want = usize::from(!self.flows.iter().flatten().any(|f| f.ring_pending));
            match self.ring.submitter().submit_with_args(want, &args) {
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
                for (slot, cqe) in batch.iter_mut().zip(self.ring.completion()) {
                    *slot = Some(cqe);
                    n += 1;
                }
                if n == 0 {
                    break;
                }
                self.loop_counters.completions.add(n as u64);
                for cqe in batch.iter_mut().take(n).filter_map(Option::take) {
                    self.complete(&cqe);
                }
                self.flush_sends();
                // Hand this batch's sends to the kernel now: they complete
                // (inline, mostly) while the next batch is handled, so an
                // output's in-flight count tracks the kernel, not how many
                // receives one turn happened to reap.
                if !self.ring.submission().is_empty() {
                    let _ = self.ring.submit();
                }
            }
            if stopping.is_none() {
                self.take_commands();
                for f in 0..self.flows.len() {
                    let Some(flow) = self.flows[f].as_mut() else {
                        continue;
                    };
                    if flow.removing {
                        continue;
                    }
                    // A socket flow's pause cancelled its receive; a ring
                    // flow's poll stays armed and its pause only stopped
                    // the walk.
                    if flow.paused {
                        if !flow.drained() {
                            continue;
                        }
                        flow.paused = false;
                        flow.counters.receive_resumes.inc();
                        if flow.ring.is_some() {
                            // Blocks filled meanwhile wake nobody: walk them.
                            self.service_ring(f);
                        }
                    }
                    if self.flows[f]
                        .as_ref()
                        .is_some_and(|fl| fl.ring_pending && !fl.paused)
                    {
                        self.service_ring(f);
                    }
                    if self.flows[f].as_ref().is_some_and(|fl| !fl.armed) {
                        self.arm_receive(f);
                    }
                }
            }
            self.finish_removals();
            self.bufs.publish();
            self.pool.publish_stats();
        }
        self.pool.publish_stats();
        if !self.in_flight.is_empty() || self.flows.iter().flatten().any(|f| f.armed) {
            self.leak_kernel_memory();
        }
        Ok(())
    }

    /// Apply the commands the control plane queued (a reload).
    fn take_commands(&mut self) {
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::AddFlow(f) => self.add_flow(f),
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
        let limit = if self.multishot {
            MAX_FLOWS - 1
        } else {
            self.bufs.len()
        };
        let number = match self.flows.iter().position(Option::is_none) {
            Some(n) => n,
            None if self.flows.len() < limit => {
                self.flows.push(None);
                self.flows.len() - 1
            }
            None => {
                return self.report(Event::FlowRefused {
                    worker,
                    flow: f.name,
                    reason: format!("worker {worker} already has {limit} flows"),
                });
            }
        };
        let flow = Flow::new(f, self.gso_enabled);
        let name = flow.name.clone();
        let outputs = flow.outputs.len();
        self.flows[number] = Some(flow);
        // The dirty list holds every output at most once.
        let total: usize = self.flows.iter().flatten().map(|f| f.outputs.len()).sum();
        self.dirty
            .reserve(total.saturating_sub(self.dirty.capacity()));
        self.arm_receive(number);
        tracing::info!(worker, flow = %name, outputs, "flow added");
        self.report(Event::FlowAdded { worker, flow: name });
    }

    fn remove_flow(&mut self, name: String) {
        let found = self
            .flows
            .iter()
            .position(|f| f.as_ref().is_some_and(|f| f.name == name && !f.removing));
        match found.and_then(|f| Some((f, self.flows[f].as_mut()?))) {
            Some((f, flow)) => {
                flow.removing = true;
                self.cancel_receive(f);
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
        for slot in &mut self.flows {
            if slot.as_ref().is_some_and(|f| f.removing && f.quiet())
                && let Some(flow) = slot.take()
            {
                tracing::info!(worker = self.index, flow = %flow.name, "flow removed");
                let _ = self.events.send(Event::FlowRemoved {
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
    /// or write receive buffers after the ring is gone: never free memory it
    /// could touch. The process is stopping, so leaking it is harmless.
    fn leak_kernel_memory(&mut self) {
        tracing::warn!(
            worker = self.index,
            pending_sends = self.in_flight.len(),
            "requests still pending at exit; leaking their buffers"
        );
        let tiny = PoolConfig {
            small: 1,
            standard: 1,
            jumbo: 1,
        };
        if let Ok(small) = PoolSet::new(tiny) {
            std::mem::forget(std::mem::replace(&mut self.pool, small));
        }
        if let Ok(small) = ProvidedBuffers::new(1, 0) {
            std::mem::forget(std::mem::replace(&mut self.bufs, small));
        }
        // Their sockets too: a pending request names their fds.
        std::mem::forget(std::mem::take(&mut self.flows));
    }

    fn arm_receive(&mut self, f: usize) {
        let Some(flow) = self.flows.get(f).and_then(Option::as_ref) else {
            return;
        };
        let user_data = UserData::Receive {
            flow: u32::try_from(f).unwrap_or(u32::MAX),
        }
        .encode();
        let entry = if flow.ring.is_some() {
            // Woken once per block the kernel hands over.
            opcode::PollAdd::new(Fd(flow.fd), u32::from(libc::POLLIN.unsigned_abs()))
                .multi(true)
                .build()
        } else if flow.packet.is_some() {
            // Its ring could not be set up (logged when the flow was added).
            return;
        } else if self.multishot {
            opcode::RecvMulti::new(Fd(flow.fd), self.bufs.group()).build()
        } else {
            // One receive buffer per flow, its index the flow's number: the
            // ring has a buffer for every flow number.
            let id = u16::try_from(f).unwrap_or(u16::MAX);
            let Some(ptr) = self.bufs.receive_ptr(id) else {
                return;
            };
            opcode::Recv::new(Fd(flow.fd), ptr, BUFFER_LEN).build()
        };
        if self.ring.push(&entry.user_data(user_data))
            && let Some(flow) = self.flows[f].as_mut()
        {
            flow.armed = true;
        }
    }

    fn cancel_receive(&mut self, f: usize) {
        if self
            .flows
            .get(f)
            .and_then(Option::as_ref)
            .is_some_and(|f| f.armed)
        {
            let target = UserData::Receive {
                flow: u32::try_from(f).unwrap_or(u32::MAX),
            }
            .encode();
            let entry = opcode::AsyncCancel2::new(CancelBuilder::user_data(target).all())
                .build()
                .user_data(UserData::Cancel.encode());
            self.ring.push(&entry);
        }
    }

    fn complete(&mut self, cqe: &cqueue::Entry) {
        match UserData::decode(cqe.user_data()) {
            Some(UserData::Receive { flow }) => self.received(flow as usize, cqe),
            Some(UserData::Send { slot, flow, output }) => {
                self.sent(slot, usize::from(flow), usize::from(output), cqe.result())
            }
            Some(UserData::GsoSend {
                record,
                flow,
                output,
            }) => self.gso_sent(record, usize::from(flow), usize::from(output), cqe.result()),
            Some(UserData::Cancel) | None => {}
        }
    }

    fn received(&mut self, f: usize, cqe: &cqueue::Entry) {
        let flags = cqe.flags();
        if let Some(flow) = self
            .flows
            .get_mut(f)
            .and_then(Option::as_mut)
            .filter(|fl| fl.ring.is_some())
        {
            if !cqueue::more(flags) {
                flow.armed = false;
            }
            let result = cqe.result();
            if result < 0 && result != -libc::ECANCELED {
                flow.counters.receive_errors.inc();
                if !flow.error_logged {
                    flow.error_logged = true;
                    tracing::warn!(
                        worker = self.index,
                        flow = %flow.name,
                        "poll on the packet ring failed: {}",
                        io::Error::from_raw_os_error(-result)
                    );
                }
            }
            if result > 0 && !flow.removing {
                self.service_ring(f);
            }
            return;
        }
        let id = if self.multishot {
            cqueue::buffer_select(flags)
        } else {
            u16::try_from(f).ok()
        };
        let Some(flow) = self.flows.get_mut(f).and_then(Option::as_mut) else {
            if self.multishot
                && let Some(id) = id
            {
                self.bufs.recycle(id);
            }
            return;
        };
        if !self.multishot || !cqueue::more(flags) {
            flow.armed = false;
        }
        let result = cqe.result();
        if result < 0 {
            match -result {
                libc::ENOBUFS => flow.counters.receive_rearms.inc(),
                libc::ECANCELED => {}
                errno => {
                    flow.counters.receive_errors.inc();
                    if !flow.error_logged {
                        flow.error_logged = true;
                        tracing::warn!(
                            worker = self.index,
                            flow = %flow.name,
                            "receive failed: {}",
                            io::Error::from_raw_os_error(errno)
                        );
                    }
                }
            }
            return;
        }
        let Some(id) = id else {
            return;
        };
        let len = result.unsigned_abs() as usize;
        self.relay(f, id, len);
        if self.multishot {
            self.bufs.recycle(id);
        }
    }

    /// The packet path: classify, take, copy, queue the datagram on every
    /// output that has room.
    fn relay(&mut self, f: usize, id: u16, len: usize) {
        let (Some(flow), Some(bytes)) = (
            self.flows.get_mut(f).and_then(Option::as_mut),
            self.bufs.filled(id, len),
        ) else {
            return;
        };
        let parts = Parts {
            pool: &mut self.pool,
            in_flight: &mut self.in_flight,
            dirty: &mut self.dirty,
        };
        if copy_and_queue(flow, f, bytes, parts) == Queued::AllOutputsFull && !flow.paused {
            // Stop receiving until the outputs drain: the kernel drops the
            // excess at the socket for less than a receive costs, and
            // counts it.
            flow.paused = true;
            self.cancel_receive(f);
        }
    }

    /// Packet ingress on a ring: relay the frames the kernel has handed
    /// over, at most a completion batch's worth per call (so completions
    /// are reaped between batches, as for socket ingress), handing each
    /// block back once walked. Sets `ring_pending` when frames are left.
    /// A flow whose outputs are all full stops here; the frames wait in the
    /// ring (and once it is full the kernel drops, counted) until they
    /// drain.
    fn service_ring(&mut self, f: usize) {
        let Some(flow) = self.flows.get_mut(f).and_then(Option::as_mut) else {
            return;
        };
        flow.ring_pending = false;
        let (Some(mut ring), Some(filter)) = (flow.ring.take(), flow.packet) else {
            return;
        };
        // Each frame may queue a send per output; the queues hold
        // `PENDING_CAPACITY`: hand them to the kernel first (what this
        // completion batch queued) and every 32 frames.
        self.flush_sends();
        let mut budget = CQE_BATCH;
        let mut done = ring.done;
        'blocks: while let Some(block) = ring.next_block() {
            for frame in mcrelay_wire::tpacket::frames(block).skip(done) {
                let Some(flow) = self.flows.get_mut(f).and_then(Option::as_mut) else {
                    break 'blocks;
                };
                if budget == 0 {
                    flow.ring_pending = true;
                    break 'blocks;
                }
                let payload = frame.and_then(|fr| {
                    mcrelay_wire::parse(fr.bytes, &filter, fr.verify_checksum)
                        .map(|d| &fr.bytes[d.payload])
                });
                match payload {
                    Ok(payload) => {
                        let parts = Parts {
                            pool: &mut self.pool,
                            in_flight: &mut self.in_flight,
                            dirty: &mut self.dirty,
                        };
                        if copy_and_queue(flow, f, payload, parts) == Queued::AllOutputsFull {
                            // This one is dropped (counted per output as
                            // backlog, as on a socket); the frames after it
                            // wait in the ring.
                            flow.paused = true;
                            done += 1;
                            break 'blocks;
                        }
                    }
                    Err(reason) => flow.counters.frames.count(reason),
                }
                done += 1;
                budget -= 1;
                if budget % 32 == 0 {
                    self.flush_sends();
                }
            }
            ring.release_block();
            done = 0;
        }
        ring.done = done;
        self.flush_sends();
        if let Some(flow) = self.flows.get_mut(f).and_then(Option::as_mut) {
            flow.ring = Some(ring);
        }
    }

    /// Turn every output's queued datagrams into SQEs: a GSO send per run
    /// of same-size datagrams, a plain send for the rest.
    fn flush_sends(&mut self) {
        for d in 0..self.dirty.len() {
            let (flow, output) = self.dirty[d];
            let Some(o) = self
                .flows
                .get_mut(usize::from(flow))
                .and_then(Option::as_mut)
                .and_then(|f| f.outputs.get_mut(usize::from(output)))
            else {
                continue;
            };
            let mut at = 0;
            loop {
                let n = o.pending.run_len(at, o.gso_max);
                let Some(run) = o.pending.items().get(at..at + n) else {
                    break;
                };
                let Some(first) = run.first() else {
                    break;
                };
                at += n;
                let gso = if n > 1 {
                    let segments = run.iter().map(|p| (p.slot, p.ptr, p.len));
                    u16::try_from(first.len)
                        .ok()
                        .and_then(|size| self.gso.start(size, segments))
                } else {
                    None
                };
                if let Some((record, msg)) = gso {
                    let entry = opcode::SendMsg::new(Fd(o.fd), msg).build().user_data(
                        UserData::GsoSend {
                            record,
                            flow,
                            output,
                        }
                        .encode(),
                    );
                    // SAFETY (upheld here, stated in `Submit::push`): `msg`
                    // lives in the GSO table until this send completes, and
                    // its iovecs point into pool buffers parked in
                    // `in_flight` until then.
                    if self.ring.push(&entry) {
                        self.loop_counters.sends_submitted.inc();
                        continue;
                    }
                    self.gso.finish(record);
                }
                let mut plain = PlainSends {
                    ring: &mut self.ring,
                    loop_counters: &self.loop_counters,
                    in_flight: &mut self.in_flight,
                    pool: &mut self.pool,
                };
                for p in run {
                    plain.push(o.fd, (flow, output), p, &mut o.in_flight, &o.counters);
                }
            }
            o.pending.clear();
        }
        self.dirty.clear();
    }

    fn output(&mut self, flow: usize, output: usize) -> Option<&mut Output> {
        self.flows.get_mut(flow)?.as_mut()?.outputs.get_mut(output)
    }

    fn sent(&mut self, slot: u32, flow: usize, output: usize, result: i32) {
        if let Some(o) = self.output(flow, output) {
            o.in_flight = o.in_flight.saturating_sub(1);
            if result >= 0 {
                o.counters.packets_out.inc();
                o.counters.bytes_out.add(u64::from(result.unsigned_abs()));
            } else {
                o.counters.drop_send_error.inc();
                o.counters.last_error.set(u64::from(result.unsigned_abs()));
            }
        }
        if let Some(buf) = self.in_flight.complete_one(slot) {
            let _ = self.pool.give(buf);
        }
    }

    fn gso_sent(&mut self, record: u32, flow: usize, output: usize, result: i32) {
        let Some(r) = self.gso.get(record) else {
            return;
        };
        let Some(o) = self
            .flows
            .get_mut(flow)
            .and_then(Option::as_mut)
            .and_then(|f| f.outputs.get_mut(output))
        else {
            return;
        };
        let count = r.slots().len();
        if result < 0 && refuses_gso(-result) {
            // The kernel or the route can't segment this: send the same
            // datagrams one by one (their buffers are still held), and stop
            // grouping datagrams this large on this output.
            o.counters.gso_fallbacks.inc();
            o.gso_max = if -result == libc::EINVAL || -result == libc::EMSGSIZE {
                r.segment_size().saturating_sub(1)
            } else {
                0
            };
            let mut plain = PlainSends {
                ring: &mut self.ring,
                loop_counters: &self.loop_counters,
                in_flight: &mut self.in_flight,
                pool: &mut self.pool,
            };
            let id = (
                u16::try_from(flow).unwrap_or(u16::MAX),
                u16::try_from(output).unwrap_or(u16::MAX),
            );
            for (&slot, iov) in r.slots().iter().zip(r.iovecs()) {
                let p = Pending {
                    slot,
                    ptr: iov.iov_base.cast_const().cast(),
                    len: iov.iov_len,
                };
                // `o.in_flight` already counts these datagrams.
                plain.push(o.fd, id, &p, &mut o.in_flight, &o.counters);
            }
            self.gso.finish(record);
            return;
        }
        let n = u32::try_from(count).unwrap_or(u32::MAX);
        o.in_flight = o.in_flight.saturating_sub(n);
        if result >= 0 {
            o.counters.gso_sends.inc();
            o.counters.packets_out.add(count as u64);
            o.counters.bytes_out.add(u64::from(result.unsigned_abs()));
        } else {
            o.counters.drop_send_error.add(count as u64);
            o.counters.last_error.set(u64::from(result.unsigned_abs()));
        }
        for &slot in r.slots() {
            if let Some(buf) = self.in_flight.complete_one(slot) {
                let _ = self.pool.give(buf);
            }
        }
        self.gso.finish(record);
    }
}

/// Errors of a GSO send that mean "not like this" rather than "not now":
/// the datagrams are resent one by one.
/// The worker's parts a relayed datagram touches besides its flow.
struct Parts<'a> {
    pool: &'a mut PoolSet,
    in_flight: &'a mut InFlight,
    dirty: &'a mut Vec<(u16, u16)>,
}

/// What became of a datagram handed to [`copy_and_queue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queued {
    /// Copied and queued on every output with room (or dropped and
    /// counted: oversize, pool exhausted).
    Done,
    /// Every output was full: not copied, counted per output.
    AllOutputsFull,
}

/// The packet path: count, classify, take a pool buffer, copy `payload`
/// into it once, and queue it on every output of flow number `f` that has
/// room.
fn copy_and_queue(flow: &mut Flow, f: usize, payload: &[u8], parts: Parts<'_>) -> Queued {
    let len = payload.len();
    flow.counters.packets_in.inc();
    flow.counters.bytes_in.add(len as u64);
    if len > MAX_PAYLOAD {
        flow.counters.drops.oversize.inc();
        return Queued::Done;
    }
    let mut accepted = 0u32;
    for o in flow.outputs.iter() {
        if o.in_flight < o.depth {
            accepted += 1;
        } else {
            o.counters.drop_backlog.inc();
        }
    }
    if accepted == 0 {
        return Queued::AllOutputsFull;
    }
    let Some(buf) = parts.pool.take_filled(payload) else {
        flow.counters.drops.pool_exhausted.inc();
        return Queued::Done;
    };
    let shared = match SharedBuffer::new(buf, accepted) {
        Ok(s) => s,
        Err(buf) => {
            let _ = parts.pool.give(buf);
            return Queued::Done;
        }
    };
    let (ptr, len) = (shared.buffer().as_ptr(), shared.buffer().len());
    let slot = match parts.in_flight.insert(shared) {
        Ok(slot) => slot,
        Err(shared) => {
            // Unreachable: the table holds as many slots as the pool has
            // buffers. Drop the packet (no send started), keep the buffer.
            let _ = parts.pool.give(shared.into_buffer());
            return Queued::Done;
        }
    };
    let flow_number = u16::try_from(f).unwrap_or(u16::MAX);
    for (i, o) in flow.outputs.iter_mut().enumerate() {
        if o.in_flight >= o.depth {
            continue;
        }
        if o.pending.is_empty() {
            parts
                .dirty
                .push((flow_number, u16::try_from(i).unwrap_or(u16::MAX)));
        }
        if o.pending.push(Pending { slot, ptr, len }) {
            o.in_flight += 1;
            if u64::from(o.in_flight) > o.counters.in_flight_high_water.get() {
                o.counters.in_flight_high_water.set(u64::from(o.in_flight));
            }
        } else {
            // Unreachable: the queue is flushed before it can fill (after
            // each completion batch, and every 32 frames of a ring).
            o.counters.drop_backlog.inc();
            if let Some(buf) = parts.in_flight.complete_one(slot) {
                let _ = parts.pool.give(buf);
            }
        }
    }
    Queued::Done
}

fn refuses_gso(errno: i32) -> bool {
    matches!(
        errno,
        libc::EINVAL | libc::EMSGSIZE | libc::EIO | libc::EOPNOTSUPP | libc::ENOPROTOOPT
    )
}

/// What a plain send touches besides its output: split from the worker so
/// an output's queue can be read while its sends are pushed.
struct PlainSends<'a> {
    ring: &'a mut IoUring,
    loop_counters: &'a LoopCounters,
    in_flight: &'a mut InFlight,
    pool: &'a mut PoolSet,
}

impl PlainSends<'_> {
    /// Queue one plain send on output `(flow, output)` (socket `fd`) of a
    /// datagram already counted in `queued`, the output's in-flight count;
    /// if the submission queue stays full, drop it for this output and
    /// count it.
    fn push(
        &mut self,
        fd: i32,
        (flow, output): (u16, u16),
        p: &Pending,
        queued: &mut u32,
        counters: &OutputCounters,
    ) {
        let len = u32::try_from(p.len).unwrap_or(0);
        let entry = opcode::Send::new(Fd(fd), p.ptr, len).build().user_data(
            UserData::Send {
                slot: p.slot,
                flow,
                output,
            }
            .encode(),
        );
        // SAFETY (upheld here, stated in `Submit::push`): `p.ptr` points
        // into a pool buffer parked in `in_flight` until this send's
        // completion releases it, and the pool outlives the ring's use.
        if self.ring.push(&entry) {
            self.loop_counters.sends_submitted.inc();
        } else {
            *queued = queued.saturating_sub(1);
            counters.drop_send_error.inc();
            if let Some(buf) = self.in_flight.complete_one(p.slot) {
                let _ = self.pool.give(buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow_with_depths(depths: &[u32]) -> FlowSockets {
        let sock = || UdpSocket::bind("127.0.0.1:0").expect("bind");
        FlowSockets::new(
            "f".into(),
            IngressSocket::Udp(sock()),
            depths
                .iter()
                .map(|&queue_depth| OutputSocket::new("o".into(), sock(), queue_depth))
                .collect(),
        )
    }

    #[test]
    fn receive_ring_stays_below_the_smallest_queue_depth() {
        assert_eq!(receive_buffers(&[flow_with_depths(&[256, 1024])]), 128);
        assert_eq!(receive_buffers(&[flow_with_depths(&[300])]), 128);
        assert_eq!(receive_buffers(&[flow_with_depths(&[4])]), 16);
        assert_eq!(receive_buffers(&[flow_with_depths(&[65536])]), 512);
        assert_eq!(receive_buffers(&[]), 128);
    }
}
