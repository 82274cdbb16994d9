//! What readers see: the table of configured flows with their counters
//! ([`Shared`], locked by the control socket, the metrics endpoint and the
//! supervisor), the [`Snapshot`] built from it, and the final `key=value`
//! report printed when the daemon stops.

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use mcrelay_config::Flow;
use mcrelay_control::{
    DaemonState, FecSnapshot, FlowSnapshot, FlowState, IngressDropsSnapshot, LegFecSnapshot,
    LegRistSnapshot, LegSnapshot, OutputSnapshot, PoolClassSnapshot, RedundancySnapshot,
    RistSnapshot, Snapshot, SrtCallerSnapshot, SrtInputSnapshot, SrtPeerSnapshot, SrtSnapshot,
    WorkerSnapshot,
};
use mcrelay_relay::counters::{FlowCounters, FlowStats};
use mcrelay_srt::RouteView;
use mcrelay_uring::WorkerStats;

use crate::outputs::{OutputState, Unconnected};
use crate::sockets::output_label;

/// One configured flow as readers see it, relaying or not.
#[derive(Debug)]
pub(super) struct FlowEntry {
    /// Its workers: shard `k` on the `k`th (one for a flow without
    /// `spread`).
    pub(super) workers: Vec<usize>,
    /// The input counters of shards 1 and up of a spread flow (shard 0's
    /// are `stats.input`), kept across pauses: their drops add to the
    /// flow's.
    pub(super) shard_inputs: Vec<Arc<FlowCounters>>,
    input: String,
    /// A flow with several inputs: "merge" or "failover", and each leg as
    /// "address:port on interface". Empty `legs` for one input.
    redundancy: &'static str,
    legs: Vec<String>,
    /// An input has `fec`: the snapshot shows the FEC counters.
    fec: bool,
    /// An input or output has `protocol = "rist"`: the snapshot shows
    /// the RIST counters.
    rist: bool,
    /// Bit `k`: leg `k` has `protocol = "rist"` (its own RIST figures
    /// are under `redundancy.legs`).
    rist_legs: u8,
    /// Bit `k`: leg `k` has `fec = "2022-1"` (its own FEC figures are
    /// under `redundancy.legs`).
    fec_legs: u8,
    /// Kept across pauses: the counters go on where they stopped.
    pub(super) stats: FlowStats,
    /// While it runs, a second handle on the ingress socket, to read the
    /// kernel's drop count; dropped when the flow stops (so its group is
    /// left).
    pub(super) ingress: Option<mcrelay_uring::sockets::KernelDrops>,
    /// The local addresses of its connected outputs (the loop guard's).
    pub(super) own: Vec<std::net::SocketAddr>,
    /// Kernel drops counted by earlier ingress sockets (before pauses),
    /// over every leg and per leg.
    kernel_drops_before: u64,
    leg_kernel_drops_before: [u64; mcrelay_config::MAX_LEGS],
    pub(super) state: FlowState,
    pub(super) interface_pauses: u64,
    /// Each output's connection, in config order.
    pub(super) outputs_state: Vec<OutputState>,
    /// What the flows this one replaced in reloads counted: added to its
    /// own counters in every snapshot, so none goes down
    /// ([`FlowSnapshot::carry`]).
    pub(super) before: Option<Before>,
}

/// The counters a flow replaced by a reload had, carried to its successor.
#[derive(Debug)]
pub(super) enum Before {
    /// The replaced flow itself, its shards possibly still counting (the
    /// replace is under way): read live, so what readers see never goes
    /// down while both count.
    Live(Box<FlowEntry>),
    /// Its final counts, once its shards are gone.
    Frozen(Box<FlowSnapshot>),
}

impl Before {
    /// Its counts as they stand, no longer read live (once the replaced
    /// flow's shards are gone: final).
    pub(super) fn frozen(self) -> Before {
        match self {
            Before::Live(old) => old.freeze(),
            frozen @ Before::Frozen(_) => frozen,
        }
    }
}

impl FlowEntry {
    /// What this flow counted, with what its predecessors did, as of now:
    /// the `before` of its successor.
    pub(super) fn freeze(&self) -> Before {
        Before::Frozen(Box::new(kept_snapshot(self, &crate::srt::view())))
    }
}

impl FlowEntry {
    pub(super) fn kernel_drops(&self) -> u64 {
        let now = self
            .ingress
            .as_ref()
            .map_or(0, mcrelay_uring::sockets::KernelDrops::get);
        self.kernel_drops_before.saturating_add(now)
    }

    /// Kernel drops at leg `leg`'s socket.
    fn leg_kernel_drops(&self, leg: usize) -> u64 {
        let now = self.ingress.as_ref().and_then(|k| k.leg(leg)).unwrap_or(0);
        self.leg_kernel_drops_before
            .get(leg)
            .map_or(0, |b| b.saturating_add(now))
    }

    /// Close the second ingress handle, keeping its drop count.
    pub(super) fn close_ingress(&mut self) {
        let legs: Vec<u64> = (0..4).map(|i| self.leg_kernel_drops(i)).collect();
        self.kernel_drops_before = self.kernel_drops();
        for (before, now) in self.leg_kernel_drops_before.iter_mut().zip(legs) {
            *before = now;
        }
        self.ingress = None;
    }
}

/// What the control socket, the metrics endpoint and the final report
/// read. Locked only by readers and by the supervisor on a reload.
#[derive(Debug)]
pub struct Shared {
    /// The readers' half of every configured flow, in start order (the
    /// supervisor's half, and the index of both, is `Daemon::flows`).
    pub(super) flows: super::table::Entries,
    pub(super) workers: Vec<Arc<WorkerStats>>,
    pub state: DaemonState,
    pub(super) config_path: String,
    pub(super) started: Instant,
    /// The mode every worker has confirmed (or was started in).
    pub(super) mode: mcrelay_control::Mode,
    /// The metrics endpoint's connection counters, once it listens.
    pub(crate) metrics_endpoint: Option<Arc<crate::metrics::EndpointCounters>>,
}

/// Readers' handle.
pub type SharedHandle = Arc<Mutex<Shared>>;

/// Lock `shared`, also after a reader panicked while holding it (the data
/// is counters and a list; it stays consistent).
pub fn lock(shared: &SharedHandle) -> std::sync::MutexGuard<'_, Shared> {
    let guard = shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    #[cfg(test)]
    super::tests::reads::taken(&guard);
    guard
}

impl Shared {
    /// [`Self::snapshot`] for an operator's read (control socket, metrics):
    /// the same, as no read resets anything.
    pub fn read(&self) -> Snapshot {
        self.snapshot()
    }

    /// No flows, no workers: what the endpoints' unit tests serve.
    #[cfg(test)]
    pub fn empty() -> SharedHandle {
        Arc::new(Mutex::new(Shared {
            flows: super::table::Entries::default(),
            workers: Vec::new(),
            state: DaemonState::Running,
            config_path: String::new(),
            started: Instant::now(),
            mode: mcrelay_control::Mode::Active,
            metrics_endpoint: None,
        }))
    }

    /// Every counter, read without stopping a worker.
    pub fn snapshot(&self) -> Snapshot {
        let taken_at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Snapshot {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            taken_at_unix_ms,
            state: self.state.clone(),
            config_path: self.config_path.clone(),
            workers: self.workers.iter().map(|w| worker_snapshot(w)).collect(),
            flows: {
                let srt = crate::srt::view();
                self.flows.iter().map(|f| flow_snapshot(f, &srt)).collect()
            },
            mode: self.mode,
            metrics_endpoint: self.metrics_endpoint.as_ref().map(|c| c.snapshot()),
        }
    }
}

fn worker_snapshot(w: &WorkerStats) -> WorkerSnapshot {
    let pool = w.pool.snapshot();
    let l = &w.loop_counters;
    let u32_of = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    WorkerSnapshot {
        index: w.index,
        cpu: w.cpu,
        receive_mode: if w.multishot { "multishot" } else { "single" }.to_owned(),
        loop_turns: l.turns.get(),
        completions: l.completions.get(),
        sends_submitted: l.sends_submitted.get(),
        pools: mcrelay_pool::Class::ALL
            .iter()
            .map(|&class| {
                let c = pool.class(class);
                PoolClassSnapshot {
                    class: class.name().to_owned(),
                    buffer_bytes: u32_of(class.size() as u64),
                    capacity: u32_of(c.capacity),
                    in_use: u32_of(c.in_use),
                    high_water: u32_of(c.high_water),
                    taken: c.taken,
                    exhausted: c.exhausted,
                }
            })
            .collect(),
    }
}

/// The SRT thread's view of output `label` of `flow`, if it is an SRT
/// output.
fn srt_snapshot(srt: &[RouteView], flow: &str, label: &str) -> Option<SrtSnapshot> {
    let r = srt
        .iter()
        .find(|r| !r.input && r.flow == flow && r.label == label)?;
    Some(SrtSnapshot {
        listener: r.listener,
        max_callers: r.max_callers,
        callers: r
            .callers
            .iter()
            .map(|c| SrtCallerSnapshot {
                peer: c.peer.map(|p| p.to_string()).unwrap_or_default(),
                stream_id: c.stream_id.clone(),
                connected_since: c.connected_since,
                sent: c.sent,
                dropped: c.dropped,
                retransmitted: c.srt.retransmitted,
                lost: c.srt.lost,
                too_late: c.srt.sender_dropped,
                rtt_us: float_to_u64(c.srt.rtt_ms * 1000.0),
                send_bps: float_to_u64(c.srt.send_mbps * 1e6),
            })
            .collect(),
        datagrams: r.datagrams,
        no_caller: r.no_caller,
        oversize: r.oversize,
        sent: r.sent,
        dropped: r.dropped,
        connects: r.connects,
        refused: r.refused,
        disconnects: r.disconnects,
        late_disconnects: r.late_disconnects,
        holding: r.holding,
        connect_failures: r.connect_failures,
        error: r.error.clone(),
        series: r.series,
    })
}

/// A non-negative finite float, rounded, as u64 (0 otherwise).
fn float_to_u64(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = v.round().min(u64::MAX as f64) as u64;
        n
    } else {
        0
    }
}

/// `f` as readers see it: its own counters and its predecessors'.
fn flow_snapshot(f: &FlowEntry, srt: &[RouteView]) -> FlowSnapshot {
    carried(f, srt, FlowSnapshot::carry)
}

/// `f` as a successor goes on from: as readers see it, and what its
/// predecessors counted in sections it does not have now
/// ([`FlowSnapshot::carry_keeping`]).
fn kept_snapshot(f: &FlowEntry, srt: &[RouteView]) -> FlowSnapshot {
    carried(f, srt, FlowSnapshot::carry_keeping)
}

fn carried(
    f: &FlowEntry,
    srt: &[RouteView],
    carry: fn(&mut FlowSnapshot, &FlowSnapshot),
) -> FlowSnapshot {
    let mut now = own_snapshot(f, srt);
    match &f.before {
        None => {}
        Some(Before::Frozen(earlier)) => carry(&mut now, earlier),
        Some(Before::Live(earlier)) => carry(&mut now, &kept_snapshot(earlier, srt)),
    }
    now
}

/// The counters of `f`'s own shards, without its predecessors'.
fn own_snapshot(f: &FlowEntry, srt: &[RouteView]) -> FlowSnapshot {
    let c = &f.stats.input;
    // Read before `packets_in`: the worker counts a datagram in first,
    // so a snapshot never shows more discarded than received (relaxed
    // counters: this relies on x86 keeping loads, and stores, in order).
    let standby_discarded = c.standby_discarded.get();
    // A spread flow: every shard receives each datagram, so the input is
    // counted once (shard 0's), while drops and errors add up.
    let sum = |get: fn(&FlowCounters) -> u64| -> u64 {
        f.shard_inputs
            .iter()
            .fold(get(c), |n, s| n.saturating_add(get(s)))
    };
    FlowSnapshot {
        name: f.stats.name.clone(),
        worker: f.workers.first().copied().unwrap_or(0),
        workers: if f.workers.len() > 1 {
            f.workers.clone()
        } else {
            Vec::new()
        },
        input: f.input.clone(),
        packets_in: c.packets_in.get(),
        bytes_in: c.bytes_in.get(),
        drops: IngressDropsSnapshot {
            oversize: sum(|c| c.drops.oversize.get()),
            pool_exhausted: sum(|c| c.drops.pool_exhausted.get()),
            kernel: f.kernel_drops(),
            truncated: sum(|c| c.frames.truncated.get()),
            malformed: sum(|c| c.frames.malformed.get()),
            fragment: sum(|c| c.frames.fragment.get()),
            bad_checksum: sum(|c| c.frames.bad_checksum.get()),
            not_this_flow: sum(|c| c.frames.not_this_flow.get()),
            looped: sum(|c| c.drops.looped.get()),
        },
        receive_errors: sum(|c| c.receive_errors.get()),
        receive_rearms: sum(|c| c.receive_rearms.get()),
        pool_fallbacks: sum(|c| c.pool_fallbacks.get()),
        outputs: f
            .stats
            .outputs
            .iter()
            .zip(f.outputs_state.iter())
            .map(|((label, o), state)| OutputSnapshot {
                label: label.clone(),
                packets_out: o.packets_out.get(),
                bytes_out: o.bytes_out.get(),
                drops_backlog: o.drop_backlog.get(),
                drops_send_error: o.drop_send_error.get(),
                last_error: match o.last_error.get() {
                    0 => None,
                    // A send on an output whose connection failed: its
                    // cause, as status reports it, not the symptom.
                    errno
                        if errno == u64::from(libc::EDESTADDRREQ.unsigned_abs())
                            && state.last_cause.is_some() =>
                    {
                        state.last_cause.clone()
                    }
                    errno => Some(
                        std::io::Error::from_raw_os_error(i32::try_from(errno).unwrap_or(0))
                            .to_string(),
                    ),
                },
                in_flight_high_water: o.in_flight_high_water.get(),
                gso_sends: o.gso_sends.get(),
                gso_fallbacks: o.gso_fallbacks.get(),
                not_connected: state.not_connected.clone(),
                connect_failures: state.connect_failures,
                srt: srt_snapshot(srt, &f.stats.name, label),
            })
            .collect(),
        state: f.state.clone(),
        interface_pauses: f.interface_pauses,
        // A flow with several legs: its output's (each leg's is under
        // `redundancy.legs`).
        health: crate::health::snapshot(if f.legs.is_empty() {
            &c.health
        } else {
            &c.output_health
        }),
        redundancy: redundancy_snapshot(f),
        standby_discarded,
        fec: f.fec.then(|| FecSnapshot {
            packets: c.fec.packets.get(),
            recovered: c.fec.recovered.get(),
            unrecoverable: c.fec.unrecoverable.get(),
            duplicates: c.fec.duplicates.get(),
            rejected: c.fec.rejected.get(),
        }),
        srt_inputs: srt_inputs(srt, &f.stats.name),
        rist: f.rist.then(|| rist_snapshot(&c.rist)),
    }
}

/// Leg `k`'s bit in [`FlowEntry`]'s `rist_legs` and `fec_legs` (0 past
/// the eighth).
fn leg_bit(k: usize) -> u8 {
    u32::try_from(k)
        .ok()
        .and_then(|k| 1u8.checked_shl(k))
        .unwrap_or(0)
}

fn rist_snapshot(r: &mcrelay_relay::counters::RistCounters) -> RistSnapshot {
    RistSnapshot {
        nacks_sent: r.nacks_sent.get(),
        recovered: r.recovered.get(),
        unrecovered: r.unrecovered.get(),
        dropped: r.dropped.get(),
        input_rtt_us: r.input_rtt_us.get(),
        nacks_received: r.nacks_received.get(),
        retransmitted: r.retransmitted.get(),
        unrecoverable: r.unrecoverable.get(),
        output_rtt_us: r.output_rtt_us.get(),
    }
}

/// The SRT thread's view of `flow`'s SRT inputs, in leg order.
fn srt_inputs(srt: &[RouteView], flow: &str) -> Vec<SrtInputSnapshot> {
    let mut all: Vec<SrtInputSnapshot> = srt
        .iter()
        .filter(|r| r.input && r.flow == flow)
        .map(|r| SrtInputSnapshot {
            leg: r.leg,
            label: r.label.clone(),
            listener: r.listener,
            peer: r.callers.first().map(|c| SrtPeerSnapshot {
                peer: c.peer.map(|p| p.to_string()).unwrap_or_default(),
                stream_id: c.stream_id.clone(),
                connected_since: c.connected_since,
                received: c.received,
                lost: c.srt.receive_lost,
                too_late: c.srt.receive_dropped,
                rtt_us: float_to_u64(c.srt.rtt_ms * 1000.0),
                receive_bps: float_to_u64(c.srt.receive_mbps * 1e6),
            }),
            datagrams: r.datagrams,
            delivered: r.delivered,
            drop_queue_full: r.drop_queue_full,
            drop_flow_gone: r.drop_flow_gone,
            connects: r.connects,
            refused: r.refused,
            disconnects: r.disconnects,
            connect_failures: r.connect_failures,
            error: r.error.clone(),
            series: r.series,
        })
        .collect();
    all.sort_by_key(|s| s.leg);
    all
}

/// A flow with several inputs: each leg's counters and health, and what
/// the redundancy rule did. `None` for a flow with one input.
fn redundancy_snapshot(f: &FlowEntry) -> Option<RedundancySnapshot> {
    if f.legs.is_empty() {
        return None;
    }
    let c = &f.stats.input;
    let r = &c.redundancy;
    Some(RedundancySnapshot {
        mode: f.redundancy.to_owned(),
        recovered: r.recovered.get(),
        duplicates: r.duplicates.get(),
        lost: r.lost.get(),
        resets: r.resets.get(),
        switches: r.switches.get(),
        active_input: r.active_leg.get(),
        late: r.late.get(),
        not_rtp: r.not_rtp.get(),
        strays: r.strays.get(),
        replays: r.replays.get(),
        mismatched: r.mismatched.get(),
        legs: f
            .legs
            .iter()
            .enumerate()
            .map(|(i, input)| LegSnapshot {
                input: input.clone(),
                forwarded: r.forwarded.get(i).map_or(0, |n| n.get()),
                standby: r.standby.get(i).map_or(0, |n| n.get()),
                kernel_drops: f.leg_kernel_drops(i),
                detached: r.detached_legs.get() & (1 << i) != 0,
                health: c
                    .leg_health(i)
                    .map(crate::health::snapshot)
                    .unwrap_or_default(),
                rist: c
                    .leg_rist
                    .get(i)
                    .filter(|_| f.rist_legs & leg_bit(i) != 0)
                    .map(|r| LegRistSnapshot {
                        nacks_sent: r.nacks_sent.get(),
                        recovered: r.recovered.get(),
                        unrecovered: r.unrecovered.get(),
                        rtt_us: r.rtt_us.get(),
                    }),
                fec: c
                    .leg_fec
                    .get(i)
                    .filter(|_| f.fec_legs & leg_bit(i) != 0)
                    .map(|x| LegFecSnapshot {
                        packets: x.packets.get(),
                        recovered: x.recovered.get(),
                        unrecoverable: x.unrecoverable.get(),
                        duplicates: x.duplicates.get(),
                        rejected: x.rejected.get(),
                    }),
            })
            .collect(),
    })
}

/// Fresh counters for `flow`.
pub(super) fn new_stats(flow: &Flow) -> FlowStats {
    FlowStats {
        name: flow.name.clone(),
        input: Arc::default(),
        outputs: flow
            .outputs
            .iter()
            .map(|o| (output_label(o), Arc::default()))
            .collect(),
    }
}

/// Another handle on the same counters.
pub(super) fn share(stats: &FlowStats) -> FlowStats {
    FlowStats {
        name: stats.name.clone(),
        input: Arc::clone(&stats.input),
        outputs: stats
            .outputs
            .iter()
            .map(|(label, c)| (label.clone(), Arc::clone(c)))
            .collect(),
    }
}

/// An input as readers see it: "239.1.1.1:5000 on eth0", or its SRT
/// label ("srt://0.0.0.0:9000").
pub(super) fn input_text(input: &mcrelay_config::Input) -> String {
    if let Some(s) = &input.srt {
        return crate::srt::label(input.socket_addr(), &s.as_output());
    }
    format!(
        "{} on {}",
        std::net::SocketAddr::new(input.address, input.port),
        input.interface
    )
}

/// `flow` as readers see it, on `workers`, with fresh counters (nothing
/// carried: see [`FlowEntry::before`]), running.
pub(super) fn new_entry(flow: &Flow, workers: &[usize]) -> FlowEntry {
    let legs: Vec<String> = flow.inputs.iter().map(input_text).collect();
    FlowEntry {
        workers: workers.to_vec(),
        shard_inputs: (1..workers.len()).map(|_| Arc::default()).collect(),
        input: legs.join(", "),
        redundancy: flow.redundancy.as_str(),
        legs: if legs.len() > 1 { legs } else { Vec::new() },
        fec: flow.inputs.iter().any(|i| i.fec.is_some()),
        rist: flow.inputs.iter().any(|i| i.rist.is_some())
            || flow.outputs.iter().any(|o| o.rist.is_some()),
        rist_legs: flow
            .inputs
            .iter()
            .enumerate()
            .filter(|(_, i)| i.rist.is_some())
            .fold(0, |m, (k, _)| m | leg_bit(k)),
        fec_legs: flow
            .inputs
            .iter()
            .enumerate()
            .filter(|(_, i)| i.fec.is_some())
            .fold(0, |m, (k, _)| m | leg_bit(k)),
        stats: new_stats(flow),
        ingress: None,
        own: Vec::new(),
        kernel_drops_before: 0,
        leg_kernel_drops_before: [0; mcrelay_config::MAX_LEGS],
        state: FlowState::Running,
        interface_pauses: 0,
        outputs_state: vec![OutputState::default(); flow.outputs.len()],
        before: None,
    }
}

/// After `entry`'s flow opened: outputs not in `pending` are connected,
/// those in it are not (each logged when that is news). The ones to retry.
pub(super) fn note_outputs(
    entry: &mut FlowEntry,
    pending: Vec<(Unconnected, std::io::Error)>,
) -> Vec<Unconnected> {
    let name = entry.stats.name.clone();
    for (index, state) in entry.outputs_state.iter_mut().enumerate() {
        if !pending.iter().any(|(u, _)| u.index == index) && state.connected() {
            let output = entry.stats.outputs.get(index).map(|(l, _)| l.as_str());
            tracing::info!(flow = %name, output, "output connected; relaying to it");
        }
    }
    pending
        .into_iter()
        .map(|(u, e)| {
            log_output(entry, u.index, Err(e));
            u
        })
        .collect()
}

/// Publish one attempt to connect output `index` of `entry`'s flow,
/// logging it when it changes the output's state.
pub(super) fn log_output(entry: &mut FlowEntry, index: usize, result: std::io::Result<()>) {
    let output = entry.stats.outputs.get(index).map(|(l, _)| l.clone());
    let Some(state) = entry.outputs_state.get_mut(index) else {
        return;
    };
    let name = &entry.stats.name;
    match result {
        Ok(()) => {
            if state.connected() {
                tracing::info!(flow = %name, output, "output connected; relaying to it");
            }
        }
        Err(e) => {
            if state.failed(&e) {
                tracing::warn!(
                    flow = %name,
                    output,
                    "output not connected ({e}); the flow relays to its other outputs, \
                     this one is retried every second and on interface changes"
                );
            }
        }
    }
}

/// One `key=value` line per flow, output, worker and pool class on stderr,
/// for operators and for tests.
pub(super) fn print_final(shared: &Shared) {
    let snapshot = shared.snapshot();
    for flow in &snapshot.flows {
        eprintln!(
            "final flow={} worker={} packets_in={} bytes_in={} drop_oversize={} drop_pool_exhausted={} drop_kernel={} drop_truncated={} drop_malformed={} drop_fragment={} drop_bad_checksum={} drop_not_this_flow={} drop_loop={} receive_errors={} state={} interface_pauses={}",
            flow.name,
            flow.worker_text(),
            flow.packets_in,
            flow.bytes_in,
            flow.drops.oversize,
            flow.drops.pool_exhausted,
            flow.drops.kernel,
            flow.drops.truncated,
            flow.drops.malformed,
            flow.drops.fragment,
            flow.drops.bad_checksum,
            flow.drops.not_this_flow,
            flow.drops.looped,
            flow.receive_errors,
            flow.state.tag(),
            flow.interface_pauses,
        );
        if let Some(r) = &flow.redundancy {
            eprintln!(
                "final redundancy flow={} mode={} recovered={} duplicates={} lost={} resets={} switches={} active_input={} late={} not_rtp={}",
                flow.name,
                r.mode,
                r.recovered,
                r.duplicates,
                r.lost,
                r.resets,
                r.switches,
                r.active_input,
                r.late,
                r.not_rtp,
            );
            for (i, leg) in r.legs.iter().enumerate() {
                eprintln!(
                    "final leg flow={} leg={i} input={:?} forwarded={} standby={} kernel_drops={}",
                    flow.name, leg.input, leg.forwarded, leg.standby, leg.kernel_drops,
                );
            }
        }
        for o in &flow.outputs {
            eprintln!(
                "final output flow={} output={} packets_out={} bytes_out={} drop_backlog={} drop_send_error={} last_error={:?} in_flight_high_water={} gso_sends={} gso_fallbacks={}",
                flow.name,
                o.label,
                o.packets_out,
                o.bytes_out,
                o.drops_backlog,
                o.drops_send_error,
                o.last_error.as_deref().unwrap_or(""),
                o.in_flight_high_water,
                o.gso_sends,
                o.gso_fallbacks,
            );
        }
    }
    for w in &snapshot.workers {
        eprintln!(
            "final worker={} turns={} completions={} sends_submitted={}",
            w.index, w.loop_turns, w.completions, w.sends_submitted
        );
        for p in &w.pools {
            eprintln!(
                "final pool worker={} class={} capacity={} taken={} exhausted={} high_water={} in_use={}",
                w.index, p.class, p.capacity, p.taken, p.exhausted, p.high_water, p.in_use
            );
        }
    }
}
