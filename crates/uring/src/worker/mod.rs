//! One worker: a thread pinned to one CPU that owns an io_uring, a pool
//! set, receive buffers, and the sockets of the flows assigned to it.
//!
//! Each loop turn makes one `io_uring_enter` that submits everything queued
//! since the last turn and waits for at least one completion (or a 100 ms
//! tick, to notice a stop request; sooner when the core's redundancy rules
//! have a timer due, [`mcrelay_relay::Core::next_tick_ns`]); a command from
//! the control plane wakes it at once (an eventfd polled on the same ring,
//! [`wake`]). The monotonic clock is read once per completion batch and per
//! turn, never per datagram; each turn ends with
//! [`mcrelay_relay::Core::tick`]. Then it handles the completions in
//! batches: a receive copies the datagram into a pool buffer (the one copy),
//! gives the receive buffer back to the kernel, and queues the datagram on
//! each output that has room; at the end of the batch each output's queue
//! becomes sends — a UDP GSO send per run of same-size datagrams where the
//! kernel takes it, else one send per datagram — handed to the kernel at
//! once. A send completion releases one use of the pool buffer per
//! datagram, and the last one gives it back. Nothing in the turn allocates,
//! locks, blocks (outside the enter) or logs per packet.
//!
//! Every one of those rules is the [`mcrelay_relay`]'s; this module is the
//! public API, `driver` the loop and the translation of send requests into
//! SQEs (and send completions back), `receive` that of receives and packet
//! ring frames into the core's "datagram received".

mod attention;
mod commands;
mod driver;
mod flow;
mod receive;
mod rist;
mod wake;
mod xsk;
mod xsk_egress;

pub use xsk_egress::{NextHopMac, XskOutput};

use std::io;
use std::net::UdpSocket;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use mcrelay_pool::{PoolConfig, PoolStatsHandle};

use crate::ingress::IngressSocket;
use driver::Worker;
use mcrelay_relay::Redundancy;
use mcrelay_relay::counters::{FlowCounters, FlowStats, LoopCounters, OutputCounters};

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
    /// The last RTP number (and SSRC) the flow this one replaces sent to
    /// this output, on another worker (a reload that moved it): the new
    /// flow sends the numbers after it only ([`Event::FlowRemoved`]
    /// reports it for the old flow).
    pub resume_after: Option<(u16, u32)>,
    /// `egress = "xdp"`: the AF_XDP socket its datagrams leave on (as
    /// frames); `socket` then only gave the frames' source address.
    pub xsk: Option<XskOutput>,
}

impl OutputSocket {
    pub fn new(label: String, socket: UdpSocket, queue_depth: u32) -> Self {
        Self {
            label,
            socket,
            queue_depth,
            counters: Arc::default(),
            resume_after: None,
            xsk: None,
        }
    }

    /// With its datagrams sent as frames on an AF_XDP socket.
    pub fn with_xsk(self, xsk: XskOutput) -> Self {
        Self {
            xsk: Some(xsk),
            ..self
        }
    }
}

/// One flow's sockets, opened before the flow starts (at start-up or on a
/// reload), and its counters.
#[derive(Debug)]
pub struct FlowSockets {
    pub name: String,
    /// Each leg's ingress (1 to [`mcrelay_relay::LegId::MAX_LEGS`]), in config order:
    /// the leg's number is its index here.
    pub legs: Vec<IngressSocket>,
    pub outputs: Vec<OutputSocket>,
    /// Written by the worker, read by anyone.
    pub counters: Arc<FlowCounters>,
    /// What the datagrams carry, for stream health.
    pub health: mcrelay_relay::health::HealthSettings,
    /// How the legs combine (`Single` for one leg).
    pub redundancy: Redundancy,
    /// SMPTE 2022-1 FEC sockets of legs with `fec` (see
    /// [`FlowSockets::with_fec`]).
    pub fec: Vec<FecSocket>,
    /// SMPTE 2022-1 FEC of outputs with `fec` (see
    /// [`FlowSockets::with_fec_outputs`]).
    pub fec_outputs: Vec<FecOutput>,
    /// `latency = "low"`: the worker serving it never sleeps (see
    /// [`FlowSockets::with_busy_poll`]).
    pub busy_poll: bool,
    /// The RTCP sockets of RIST legs and outputs (see
    /// [`FlowSockets::with_rist`]).
    pub rist: Vec<RistSocket>,
}

/// Which side of a flow a RIST RTCP socket serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RistEnd {
    /// A RIST input: NACKs and receiver reports go to its sender.
    Leg(mcrelay_relay::LegId),
    /// A RIST output (index in `outputs`): its receivers' NACKs come in,
    /// sender reports go out.
    Output(usize),
}

/// The RTCP socket (the media port + 1) of a RIST leg or output, and its
/// buffer. The worker reads and writes it without io_uring (RTCP is a
/// few datagrams per second and per NACK burst, not the packet path):
/// non-blocking `recv_from`/`send_to` at most every millisecond.
#[derive(Debug)]
pub struct RistSocket {
    pub end: RistEnd,
    /// `buffer_ms`: kept for retransmission (output) or waited for
    /// before a gap is skipped (input).
    pub buffer_ms: u32,
    /// A leg's: bound to its address, port + 1. An output's: not
    /// connected (see `mcrelay_sockets::open_flow`).
    pub socket: UdpSocket,
    /// An output's: its address, port + 1 (where reports go; for a
    /// unicast output, the only address RTCP is taken from). A leg's:
    /// `None`, the sender's address is learned from its RTCP.
    pub peer: Option<std::net::SocketAddr>,
}

/// An output's 2022-1 FEC: the matrix and the sockets its column (port +
/// 2) and row (port + 4) packets leave on. The worker adds them after
/// the flow's outputs, as outputs that carry only FEC.
#[derive(Debug)]
pub struct FecOutput {
    /// The output (index in `outputs`) whose datagrams are protected.
    pub output: usize,
    pub layout: mcrelay_relay::fec::FecLayout,
    pub column: OutputSocket,
    pub row: OutputSocket,
}

/// A socket receiving one of a leg's 2022-1 FEC streams (the leg's port
/// + 2 for columns, + 4 for rows).
#[derive(Debug)]
pub struct FecSocket {
    /// The leg whose media it protects.
    pub leg: mcrelay_relay::LegId,
    pub direction: mcrelay_relay::fec::Direction,
    pub socket: IngressSocket,
}

impl FlowSockets {
    /// A flow with one input.
    pub fn new(name: String, ingress: IngressSocket, outputs: Vec<OutputSocket>) -> Self {
        Self {
            name,
            legs: vec![ingress],
            outputs,
            counters: Arc::default(),
            health: mcrelay_relay::health::HealthSettings::default(),
            redundancy: Redundancy::Single,
            fec: Vec::new(),
            fec_outputs: Vec::new(),
            busy_poll: false,
            rist: Vec::new(),
        }
    }

    /// A flow fed by `legs` (2 to [`mcrelay_relay::LegId::MAX_LEGS`]; any further ones
    /// are refused by the worker) combined by `redundancy`.
    pub fn with_legs(
        name: String,
        legs: Vec<IngressSocket>,
        redundancy: Redundancy,
        outputs: Vec<OutputSocket>,
    ) -> Self {
        Self {
            name,
            legs,
            outputs,
            counters: Arc::default(),
            health: mcrelay_relay::health::HealthSettings::default(),
            redundancy,
            fec: Vec::new(),
            fec_outputs: Vec::new(),
            busy_poll: false,
            rist: Vec::new(),
        }
    }

    /// Busy-polled (`latency = "low"`): while the worker serves this flow
    /// it never waits in the kernel; each loop turn enters it only to
    /// collect completions (a zero timeout), so a datagram is picked up
    /// within a loop turn instead of after a wake-up, at the cost of the
    /// whole core.
    pub fn with_busy_poll(self, busy_poll: bool) -> Self {
        Self { busy_poll, ..self }
    }

    /// With 2022-1 FEC decoded on the legs these sockets name (a leg at
    /// most once per direction; a socket naming no leg is refused by the
    /// worker).
    pub fn with_fec(self, fec: Vec<FecSocket>) -> Self {
        Self { fec, ..self }
    }

    /// With 2022-1 FEC sent for the outputs these name (an output naming
    /// none is ignored by the worker).
    pub fn with_fec_outputs(self, fec_outputs: Vec<FecOutput>) -> Self {
        Self {
            fec_outputs,
            ..self
        }
    }

    /// With RIST on the legs and outputs these sockets name (one naming
    /// none is ignored by the worker).
    pub fn with_rist(self, rist: Vec<RistSocket>) -> Self {
        Self { rist, ..self }
    }

    /// With stream-health settings other than the default (`udp`).
    pub fn with_health(self, health: mcrelay_relay::health::HealthSettings) -> Self {
        Self { health, ..self }
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
    AddFlow(Box<FlowSockets>),
    /// Stop a flow: cancel its receive, let its in-flight sends complete,
    /// close its sockets (which leaves its group).
    RemoveFlow(String),
    /// Replace the running flow of the same name by this one, make
    /// before break (a reload that changes a flow and keeps its worker):
    /// in one step the old flow stops receiving, the new one takes over
    /// its redundancy state ([`mcrelay_relay::Core::take_over`]) and starts
    /// receiving, so no sequence number leaves twice. `kept`: the new
    /// flow's legs that are the old one's leg of the same index, a bit per
    /// leg. Answered with [`Event::FlowAdded`] (or `FlowRefused`) for the
    /// new flow and [`Event::FlowRemoved`] (or `FlowUnknown`) for the old
    /// one, once its last send completed.
    Replace { flow: Box<FlowSockets>, kept: u8 },
    /// Enter (`true`) or leave (`false`) warm standby: every flow stays
    /// open and receiving, and while in standby nothing is sent
    /// ([`mcrelay_relay::standby`]). Answered with [`Event::ModeSet`].
    SetStandby(bool),
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
    /// `last_rtp`: the highest RTP sequence number (and SSRC) it relayed,
    /// if its datagrams were RTP — where its successor on another worker
    /// resumes ([`OutputSocket::resume_after`]).
    FlowRemoved {
        worker: usize,
        flow: String,
        last_rtp: Option<(u16, u32)>,
    },
    /// A remove named a flow the worker doesn't have.
    FlowUnknown {
        worker: usize,
        flow: String,
    },
    /// A [`Command::SetStandby`] is in force: from the next datagram on,
    /// the worker relays (`standby: false`) or sends nothing.
    ModeSet {
        worker: usize,
        standby: bool,
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
    /// Start in warm standby: receive, count and send nothing until a
    /// [`Command::SetStandby`]`(false)`.
    pub standby: bool,
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
    waker: wake::Waker,
}

impl WorkerHandle {
    /// Queue a command and wake the worker, which takes it in the loop
    /// turn that wake-up starts and answers with an [`Event`]. The command
    /// back when the queue is full or the worker is gone.
    pub fn command(&self, command: Command) -> Result<(), Command> {
        self.commands.try_send(command).map_err(|e| match e {
            mpsc::TrySendError::Full(c) | mpsc::TrySendError::Disconnected(c) => c,
        })?;
        self.waker.wake();
        Ok(())
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
    let waker = wake::Waker::new().map_err(|source| WorkerError::Ring { worker, source })?;
    let worker_waker = waker.clone();
    let thread = std::thread::Builder::new()
        .name(format!("mcrelay-w{worker}"))
        .spawn(move || {
            let mut w = match Worker::new(config, command_rx, events, worker_waker) {
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
            waker,
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(WorkerError::Vanished { worker }),
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
