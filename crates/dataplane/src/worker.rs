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
use crate::inflight::InFlight;
use crate::submit::{Submit, UserData};

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
}

/// One flow's sockets, opened before the worker starts.
#[derive(Debug)]
pub struct FlowSockets {
    pub name: String,
    pub ingress: UdpSocket,
    pub outputs: Vec<OutputSocket>,
}

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

/// What readers can see of a running worker.
#[derive(Debug)]
pub struct WorkerStats {
    pub index: usize,
    pub cpu: Option<usize>,
    pub flows: Vec<FlowStats>,
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
}

impl WorkerHandle {
    /// Wait for the worker to finish (after the stop flag is set).
    pub fn join(self) -> Result<(), WorkerError> {
        let worker = self.stats.index;
        self.thread
            .join()
            .unwrap_or(Err(WorkerError::Vanished { worker }))
    }
}

/// Start a worker thread; returns once its ring, pools and receives are set
/// up (or with the reason they could not be).
pub fn spawn(config: WorkerConfig, stop: Arc<AtomicBool>) -> Result<WorkerHandle, WorkerError> {
    let worker = config.index;
    let (ready_tx, ready_rx) = mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name(format!("mcrelay-w{worker}"))
        .spawn(move || {
            let mut w = match Worker::new(config) {
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
        Ok(Ok(stats)) => Ok(WorkerHandle { stats, thread }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(WorkerError::Vanished { worker }),
    }
}

struct Flow {
    fd: i32,
    /// `outputs[first..first + count]` of the worker.
    first: usize,
    count: usize,
    counters: Arc<FlowCounters>,
    /// The receive is armed in the kernel.
    armed: bool,
    /// The first receive error was logged.
    error_logged: bool,
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
}

/// Completions handled per batch (a stack array; the loop takes batches
/// until the completion queue is empty, submitting the sends of each).
const CQE_BATCH: usize = 64;

struct Worker {
    // Field order is drop order: the ring (and with it every registration
    // and pending request) goes before the memory the kernel may touch.
    ring: IoUring,
    bufs: ProvidedBuffers,
    pool: PoolSet,
    in_flight: InFlight,
    gso: GsoTable,
    flows: Vec<Flow>,
    outputs: Vec<Output>,
    /// Outputs with queued sends, each once.
    dirty: Vec<u16>,
    /// Keeps the sockets open for as long as the ring may use their fds.
    _sockets: Vec<UdpSocket>,
    multishot: bool,
    index: usize,
    cpu: Option<usize>,
    loop_counters: Arc<LoopCounters>,
    flow_stats: Vec<FlowStats>,
}

impl Worker {
    fn new(config: WorkerConfig) -> Result<Self, WorkerError> {
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
        if config.flows.len() >= usize::from(u16::MAX) || output_count >= usize::from(u16::MAX) {
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
        let entries = receive_buffers.max(
            u16::try_from(config.flows.len())
                .unwrap_or(u16::MAX)
                .next_power_of_two(),
        );
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
        let mut flows = Vec::with_capacity(config.flows.len());
        let mut outputs = Vec::with_capacity(output_count);
        let mut sockets = Vec::with_capacity(config.flows.len() + output_count);
        let mut flow_stats = Vec::with_capacity(config.flows.len());
        let mut gso_outputs = 0usize;
        for f in config.flows {
            let counters = Arc::new(FlowCounters::default());
            let mut out_stats = Vec::with_capacity(f.outputs.len());
            let first = outputs.len();
            for o in f.outputs {
                let oc = Arc::new(OutputCounters::default());
                let gso_max = if config.gso && crate::sockets::supports_gso(&o.socket) {
                    MAX_PAYLOAD
                } else {
                    0
                };
                gso_outputs += usize::from(gso_max > 0);
                out_stats.push((o.label, Arc::clone(&oc)));
                outputs.push(Output {
                    fd: o.socket.as_raw_fd(),
                    depth: o.queue_depth.max(1),
                    in_flight: 0,
                    pending: PendingSends::default(),
                    gso_max,
                    counters: oc,
                });
                sockets.push(o.socket);
            }
            flows.push(Flow {
                fd: f.ingress.as_raw_fd(),
                first,
                count: outputs.len() - first,
                counters: Arc::clone(&counters),
                armed: false,
                error_logged: false,
            });
            flow_stats.push(FlowStats {
                name: f.name,
                input: counters,
                outputs: out_stats,
            });
            sockets.push(f.ingress);
        }
        tracing::info!(
            worker,
            cpu = ?config.cpu,
            flows = flows.len(),
            outputs = outputs.len(),
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
            dirty: Vec::with_capacity(outputs.len()),
            flows,
            outputs,
            _sockets: sockets,
            multishot,
            index: worker,
            cpu: config.cpu,
            loop_counters: Arc::new(LoopCounters::default()),
            flow_stats,
        })
    }

    fn stats(&mut self) -> Arc<WorkerStats> {
        let flows = std::mem::take(&mut self.flow_stats);
        Arc::new(WorkerStats {
            index: self.index,
            cpu: self.cpu,
            flows,
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
                self.cancel_receives();
            }
            if let Some(since) = stopping {
                let receiving = self.flows.iter().any(|f| f.armed);
                if (!receiving && self.in_flight.is_empty())
                    || since.elapsed() > Duration::from_secs(1)
                {
                    break;
                }
            }
            match self.ring.submitter().submit_with_args(1, &args) {
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
            for f in 0..self.flows.len() {
                if !self.flows[f].armed && stopping.is_none() {
                    self.arm_receive(f);
                }
            }
            self.bufs.publish();
            self.pool.publish_stats();
        }
        self.pool.publish_stats();
        if !self.in_flight.is_empty() || self.flows.iter().any(|f| f.armed) {
            self.leak_kernel_memory();
        }
        Ok(())
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
    }

    fn arm_receive(&mut self, f: usize) {
        let flow = &self.flows[f];
        let user_data = UserData::Receive {
            flow: u32::try_from(f).unwrap_or(u32::MAX),
        }
        .encode();
        let entry = if self.multishot {
            opcode::RecvMulti::new(Fd(flow.fd), self.bufs.group()).build()
        } else {
            // One receive buffer per flow, its index the flow's: the ring
            // has at least as many buffers as the worker has flows.
            let id = u16::try_from(f).unwrap_or(u16::MAX);
            let Some(ptr) = self.bufs.receive_ptr(id) else {
                return;
            };
            opcode::Recv::new(Fd(flow.fd), ptr, BUFFER_LEN).build()
        };
        if self.ring.push(&entry.user_data(user_data)) {
            self.flows[f].armed = true;
        }
    }

    fn cancel_receives(&mut self) {
        for f in 0..self.flows.len() {
            if self.flows[f].armed {
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
    }

    fn complete(&mut self, cqe: &cqueue::Entry) {
        match UserData::decode(cqe.user_data()) {
            Some(UserData::Receive { flow }) => self.received(flow as usize, cqe),
            Some(UserData::Send { slot, output }) => {
                self.sent(slot, usize::from(output), cqe.result())
            }
            Some(UserData::GsoSend { record, output }) => {
                self.gso_sent(record, usize::from(output), cqe.result())
            }
            Some(UserData::Cancel) | None => {}
        }
    }

    fn received(&mut self, f: usize, cqe: &cqueue::Entry) {
        let Some(flow) = self.flows.get_mut(f) else {
            return;
        };
        let flags = cqe.flags();
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
                            flow = f,
                            "receive failed: {}",
                            io::Error::from_raw_os_error(errno)
                        );
                    }
                }
            }
            return;
        }
        let len = result.unsigned_abs() as usize;
        let id = if self.multishot {
            match cqueue::buffer_select(flags) {
                Some(id) => id,
                None => return,
            }
        } else {
            u16::try_from(f).unwrap_or(u16::MAX)
        };
        self.relay(f, id, len);
        if self.multishot {
            self.bufs.recycle(id);
        }
    }

    /// The packet path: classify, take, copy, queue a send per output.
    fn relay(&mut self, f: usize, id: u16, len: usize) {
        let flow = &self.flows[f];
        flow.counters.packets_in.inc();
        flow.counters.bytes_in.add(len as u64);
        if len > MAX_PAYLOAD {
            flow.counters.drops.oversize.inc();
            return;
        }
        let Some(payload) = self.bufs.filled(id, len) else {
            return;
        };
        let Some(buf) = self.pool.take_filled(payload) else {
            flow.counters.drops.pool_exhausted.inc();
            return;
        };
        let outputs = &mut self.outputs[flow.first..flow.first + flow.count];
        let mut accepted = 0u32;
        for o in outputs.iter() {
            if o.in_flight < o.depth {
                accepted += 1;
            } else {
                o.counters.drop_backlog.inc();
            }
        }
        let shared = match SharedBuffer::new(buf, accepted) {
            Ok(s) => s,
            Err(buf) => {
                let _ = self.pool.give(buf);
                return;
            }
        };
        let (ptr, len32) = (
            shared.buffer().as_ptr(),
            u32::try_from(shared.buffer().len()).unwrap_or(0),
        );
        let slot = match self.in_flight.insert(shared) {
            Ok(slot) => slot,
            Err(shared) => {
                // Unreachable: the table holds as many slots as the pool
                // has buffers. Drop the packet (no send started), keep the
                // buffer.
                let _ = self.pool.give(shared.into_buffer());
                return;
            }
        };
        let first = flow.first;
        for (i, o) in outputs.iter_mut().enumerate() {
            if o.in_flight >= o.depth {
                continue;
            }
            if o.pending.is_empty() {
                self.dirty
                    .push(u16::try_from(first + i).unwrap_or(u16::MAX));
            }
            let queued = o.pending.push(Pending {
                slot,
                ptr,
                len: len32 as usize,
            });
            if queued {
                o.in_flight += 1;
                if u64::from(o.in_flight) > o.counters.in_flight_high_water.get() {
                    o.counters.in_flight_high_water.set(u64::from(o.in_flight));
                }
            } else {
                // Unreachable: a batch holds fewer completions than the
                // queue has room for, and the queue is flushed after each.
                o.counters.drop_backlog.inc();
                if let Some(buf) = self.in_flight.complete_one(slot) {
                    let _ = self.pool.give(buf);
                }
            }
        }
    }

    /// Turn every output's queued datagrams into SQEs: a GSO send per run
    /// of same-size datagrams, a plain send for the rest.
    fn flush_sends(&mut self) {
        for d in 0..self.dirty.len() {
            let index = usize::from(self.dirty[d]);
            let Some(o) = self.outputs.get_mut(index) else {
                continue;
            };
            let output = u16::try_from(index).unwrap_or(u16::MAX);
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
                    let entry = opcode::SendMsg::new(Fd(o.fd), msg)
                        .build()
                        .user_data(UserData::GsoSend { record, output }.encode());
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
                    plain.push(o.fd, output, p, &mut o.in_flight, &o.counters);
                }
            }
            o.pending.clear();
        }
        self.dirty.clear();
    }

    fn sent(&mut self, slot: u32, output: usize, result: i32) {
        if let Some(o) = self.outputs.get_mut(output) {
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

    fn gso_sent(&mut self, record: u32, output: usize, result: i32) {
        let Some(r) = self.gso.get(record) else {
            return;
        };
        let Some(o) = self.outputs.get_mut(output) else {
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
            let output = u16::try_from(output).unwrap_or(u16::MAX);
            let mut plain = PlainSends {
                ring: &mut self.ring,
                loop_counters: &self.loop_counters,
                in_flight: &mut self.in_flight,
                pool: &mut self.pool,
            };
            for (&slot, iov) in r.slots().iter().zip(r.iovecs()) {
                let p = Pending {
                    slot,
                    ptr: iov.iov_base.cast_const().cast(),
                    len: iov.iov_len,
                };
                // `o.in_flight` already counts these datagrams.
                plain.push(o.fd, output, &p, &mut o.in_flight, &o.counters);
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
    /// Queue one plain send on output number `output` (socket `fd`) of a
    /// datagram already counted in `queued`, the output's in-flight count;
    /// if the submission queue stays full, drop it for this output and
    /// count it.
    fn push(
        &mut self,
        fd: i32,
        output: u16,
        p: &Pending,
        queued: &mut u32,
        counters: &OutputCounters,
    ) {
        let len = u32::try_from(p.len).unwrap_or(0);
        let entry = opcode::Send::new(Fd(fd), p.ptr, len).build().user_data(
            UserData::Send {
                slot: p.slot,
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
