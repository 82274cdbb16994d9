//! Everything an operator can see of a running daemon, as plain data.
//!
//! The daemon fills a [`Snapshot`] from its workers' published counters
//! (`mcrelay_pool::PoolStatsHandle`, `mcrelay_uring` flow, output and
//! loop counters); `mcrelayctl` decodes it from the control socket. Every
//! counter is a `u64` that only grows while its flow or worker lives, so
//! rates come from the difference of two snapshots ([`crate::Rates`]).
//! Fields added later carry `#[serde(default)]`, so a newer client can read
//! an older daemon's snapshot.

use serde::{Deserialize, Serialize};

/// The daemon at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The daemon's version (`CARGO_PKG_VERSION`).
    pub version: String,
    pub pid: u32,
    /// Seconds since the daemon started.
    pub uptime_seconds: f64,
    /// Wall-clock time the counters were read, in ms since the Unix epoch.
    pub taken_at_unix_ms: u64,
    pub state: DaemonState,
    /// The configuration file in force (and re-read by `reload`).
    pub config_path: String,
    pub workers: Vec<WorkerSnapshot>,
    /// In configuration order.
    pub flows: Vec<FlowSnapshot>,
    /// Relaying, or a warm standby that sends nothing (absent from older
    /// daemons: active).
    #[serde(default)]
    pub mode: crate::Mode,
    /// The metrics endpoint's connection counters, when it listens
    /// (absent from older daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_endpoint: Option<EndpointSnapshot>,
}

/// What the `/metrics` endpoint did with the connections it accepted
/// (`daemon.metrics_allow`, the per-address and total caps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSnapshot {
    /// Connections served (a thread of their own, a request read).
    pub served: u64,
    /// Closed at accept: the peer is not in `daemon.metrics_allow`.
    pub refused_not_allowed: u64,
    /// Closed at accept: the peer's address already had its share of
    /// connections, every one of them being answered.
    pub refused_address_cap: u64,
    /// Closed at accept: every connection slot was being answered.
    pub refused_full: u64,
    /// Shut down, still reading their request, to make room for a newer
    /// connection from the same address.
    pub displaced_address_cap: u64,
    /// Shut down, still reading their request, to make room for a
    /// connection from an address holding fewer.
    pub displaced_full: u64,
}

/// Whether the daemon is doing all it was configured to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "reason", rename_all = "snake_case")]
pub enum DaemonState {
    /// Every flow is relaying.
    Running,
    /// Relaying, but not everything configured works; why.
    Degraded(String),
    /// A configuration reload is being applied.
    Reloading,
}

/// One worker: a core-pinned event loop and the pool set it owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSnapshot {
    pub index: usize,
    /// The CPU it is pinned to, if any.
    pub cpu: Option<usize>,
    /// How it receives, e.g. "io_uring multishot" or "recvmmsg".
    pub receive_mode: String,
    /// Turns of the event loop (one `io_uring_enter` each).
    pub loop_turns: u64,
    /// Completions handled.
    pub completions: u64,
    /// Send SQEs submitted (a GSO send counts once).
    pub sends_submitted: u64,
    /// One entry per buffer class, smallest first.
    pub pools: Vec<PoolClassSnapshot>,
}

/// One size class of a worker's buffer pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolClassSnapshot {
    /// "small", "standard" or "jumbo".
    pub class: String,
    /// Size of each buffer in the class.
    pub buffer_bytes: u32,
    /// Buffers in the class.
    pub capacity: u32,
    /// Buffers out of the pool right now.
    pub in_use: u32,
    /// Most buffers ever out at once.
    pub high_water: u32,
    /// Successful takes since start.
    pub taken: u64,
    /// Takes that failed because the class had no free buffer.
    pub exhausted: u64,
}

/// One flow: an input group and the outputs it is relayed to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowSnapshot {
    pub name: String,
    /// Index of the worker that owns it (of a spread flow: shard 0's).
    pub worker: usize,
    /// A flow with `spread` > 1: every worker serving a share of its
    /// outputs, shard `k` (outputs `k`, `k + spread`, ...) on the `k`th.
    /// Empty, and absent from JSON, for a flow on one worker.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<usize>,
    /// The input, e.g. "239.1.1.1:5000 on vRA".
    pub input: String,
    pub packets_in: u64,
    /// UDP payload bytes received.
    pub bytes_in: u64,
    pub drops: IngressDropsSnapshot,
    /// Receive completions that failed (the kernel's error, not a packet).
    pub receive_errors: u64,
    /// Times the worker's provided receive buffers ran out and the receive
    /// was re-armed (datagrams waited in the socket buffer meanwhile).
    #[serde(default)]
    pub receive_rearms: u64,
    /// Datagrams copied into a larger pool class because the fitting one
    /// had no buffer for this flow (relayed: not a drop).
    #[serde(default)]
    pub pool_fallbacks: u64,
    /// In configuration order.
    pub outputs: Vec<OutputSnapshot>,
    /// Whether it relays now, and if not, why.
    #[serde(default)]
    pub state: FlowState,
    /// Times the flow stopped relaying because an interface of it went
    /// down or away (each is logged once, and the flow resumes when the
    /// interface is back).
    #[serde(default)]
    pub interface_pauses: u64,
    /// Stream health of the input (absent from older daemons); for a flow
    /// with several inputs, that of its first (see `redundancy`).
    #[serde(default)]
    pub health: InputHealth,
    /// A flow with several inputs (legs): each leg, and what the flow's
    /// `redundancy` did with them. Absent for a flow with one input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redundancy: Option<RedundancySnapshot>,
    /// Datagrams received while the daemon was in standby: read and
    /// discarded on purpose, not a drop.
    #[serde(default)]
    pub standby_discarded: u64,
    /// A flow with an input with `fec = "2022-1"`: what the FEC repaired,
    /// summed over its legs. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fec: Option<FecSnapshot>,
    /// The flow's SRT inputs (legs with `protocol = "srt"`), in leg
    /// order. Absent for a flow without one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub srt_inputs: Vec<SrtInputSnapshot>,
    /// A flow with a RIST input or output: NACKs, retransmissions and the
    /// RTT, summed over them. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rist: Option<RistSnapshot>,
}

/// RIST (TR-06-1 simple profile) on a flow's input and outputs.
/// Recovered datagrams are in `packets_in` (they arrived, late).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RistSnapshot {
    /// Input: sequence numbers NACKed to the sender.
    pub nacks_sent: u64,
    /// Input: gaps filled by a retransmission.
    pub recovered: u64,
    /// Input: the loss left after RIST for the flow. One input: numbers
    /// neither received nor recovered within `buffer_ms` (skipped).
    /// Inputs merged by 2022-7: numbers no leg delivered after each leg's
    /// repair (the merge's `lost`; each leg's own count is under
    /// `redundancy.legs[].rist`). Failover: what the active leg skipped.
    pub unrecovered: u64,
    /// Input: datagrams the receiver dropped (already handed on or
    /// skipped, stray, not RTP).
    pub dropped: u64,
    /// Input: RTT from NACKs to their retransmissions, in microseconds
    /// (0: no sample yet).
    pub input_rtt_us: u64,
    /// Output: sequence numbers the receivers NACKed.
    pub nacks_received: u64,
    /// Output: datagrams sent again.
    pub retransmitted: u64,
    /// Output: NACKed numbers no longer in the buffer.
    pub unrecoverable: u64,
    /// Output: RTT to the receivers from their reports, in microseconds
    /// (0: no sample yet).
    pub output_rtt_us: u64,
}

/// One SRT input: its connection (the caller connected to it, or its own
/// connection out) and what the SRT thread handed the worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrtInputSnapshot {
    /// Its leg in the flow (0 for `input`).
    pub leg: usize,
    /// `srt://0.0.0.0:9000`, `?mode=caller`, `&streamid=...`.
    pub label: String,
    /// Waits for a caller (one at a time) rather than calling out.
    pub listener: bool,
    /// The connected peer, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<SrtPeerSnapshot>,
    /// Datagrams received from the peer.
    pub datagrams: u64,
    /// Of those, handed to the worker.
    pub delivered: u64,
    /// Dropped: the worker's queue (the socket pair) was full.
    pub drop_queue_full: u64,
    /// Dropped: the flow had stopped reading (it was being removed).
    pub drop_flow_gone: u64,
    /// Callers accepted, or connections made.
    pub connects: u64,
    /// Callers refused: a second caller while one is connected, unknown
    /// stream ID, wrong or missing passphrase.
    pub refused: u64,
    /// Connections ended.
    pub disconnects: u64,
    /// Failed connection attempts (caller mode).
    pub connect_failures: u64,
    /// The listener couldn't open, or the last connect error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The SRT thread's route these totals are of (not in the JSON): a
    /// reload's successor on another route adds them ([`FlowSnapshot::carry`]).
    #[serde(skip)]
    pub series: u64,
}

/// The peer of an SRT input.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrtPeerSnapshot {
    /// `address:port` of the peer.
    pub peer: String,
    pub stream_id: String,
    /// Unix time (s) it connected.
    pub connected_since: u64,
    /// Datagrams received from it.
    pub received: u64,
    /// libsrt: packets found missing on receipt (before retransmission).
    pub lost: u64,
    /// libsrt: packets dropped as too late for the latency (residual
    /// loss: never delivered).
    pub too_late: u64,
    /// Smoothed round-trip time, microseconds.
    pub rtt_us: u64,
    /// Receive rate over the last interval, bits per second.
    pub receive_bps: u64,
}

/// SMPTE 2022-1 FEC decoding on a flow's inputs. Repaired packets are
/// not in `packets_in`, which counts what arrived on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FecSnapshot {
    /// Datagrams received on the FEC ports (port + 2 and + 4).
    pub packets: u64,
    /// Media packets repaired and relayed (each leg's, summed).
    pub recovered: u64,
    /// The loss left after FEC for the flow. One input: media packets
    /// neither received nor repaired. Inputs merged by 2022-7: numbers no
    /// leg delivered after each leg's repair (the merge's `lost`; each
    /// leg's own count is under `redundancy.legs[].fec`). Failover: what
    /// the active leg could not repair.
    pub unrecoverable: u64,
    /// Media packets that arrived after being repaired (dropped).
    pub duplicates: u64,
    /// Datagrams on the FEC ports that are not 2022-1 XOR FEC.
    pub rejected: u64,
}

impl FlowSnapshot {
    /// Its worker, or a spread flow's workers: "1" or "1,0".
    pub fn worker_text(&self) -> String {
        if self.workers.is_empty() {
            return self.worker.to_string();
        }
        let all: Vec<String> = self.workers.iter().map(ToString::to_string).collect();
        all.join(",")
    }
}

/// What a flow with several inputs (legs) did with them
/// (`redundancy = "merge"` or `"failover"`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedundancySnapshot {
    /// "merge" or "failover".
    pub mode: String,
    /// Merge: packets forwarded from one leg while another missed them.
    pub recovered: u64,
    /// Later copies of a packet already forwarded (merge), or repeats
    /// after a switch (failover of RTP): dropped.
    pub duplicates: u64,
    /// Merge: sequence numbers no leg delivered within the window.
    pub lost: u64,
    /// Merge: SSRC changes and jumps that restarted the merge.
    pub resets: u64,
    /// Failover: changes of the active leg.
    pub switches: u64,
    /// Failover: the leg forwarded now (its index in `legs`).
    pub active_input: u64,
    /// Datagrams dropped for arriving too late, or (merge) without an RTP
    /// header.
    pub late: u64,
    pub not_rtp: u64,
    /// Datagrams whose number jumped ahead of their leg's stream without
    /// confirmation (a corrupt header, a stray sender): dropped, the
    /// stream not moved.
    #[serde(default)]
    pub strays: u64,
    /// Datagrams far behind their leg's stream, not a confirmed restart
    /// (a replay of an old datagram): dropped.
    #[serde(default)]
    pub replays: u64,
    /// Merge: datagrams of a leg whose numbering is not the flow's (an
    /// independent encoder): dropped, never forwarded beside it.
    #[serde(default)]
    pub mismatched: u64,
    /// The legs, in configuration order (failover priority order).
    pub legs: Vec<LegSnapshot>,
}

/// One leg (input) of a flow with several.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegSnapshot {
    /// The input, e.g. "239.1.1.1:5000 on vRA".
    pub input: String,
    /// Datagrams of this leg forwarded to the outputs.
    pub forwarded: u64,
    /// Failover: datagrams of this leg dropped while another was active.
    pub standby: u64,
    /// Datagrams the kernel dropped at this leg's socket.
    pub kernel_drops: u64,
    /// Merge: this leg is not merged now (its numbering is not the
    /// flow's, or it is further behind than the window).
    #[serde(default)]
    pub detached: bool,
    /// Its stream health.
    pub health: InputHealth,
    /// A leg with `protocol = "rist"`: its own receiver's figures (the
    /// flow's `rist` has the flow's view). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rist: Option<LegRistSnapshot>,
    /// A leg with `fec = "2022-1"`: its own decoder's figures (the
    /// flow's `fec` has the flow's view). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fec: Option<LegFecSnapshot>,
}

/// What one FEC leg's decoder did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegFecSnapshot {
    /// Datagrams received on this leg's FEC ports (port + 2 and + 4).
    pub packets: u64,
    /// Media packets this leg's decoder repaired.
    pub recovered: u64,
    /// Media packets of this leg neither received nor repaired: lost on
    /// this leg, though another leg of a merged flow may have delivered
    /// them (the flow's `fec.unrecoverable` counts only what the flow
    /// lost).
    pub unrecoverable: u64,
    /// Media packets that arrived on this leg after being repaired.
    pub duplicates: u64,
    /// Datagrams on this leg's FEC ports that are not 2022-1 XOR FEC.
    pub rejected: u64,
}

/// What one RIST leg's receiver did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegRistSnapshot {
    /// Sequence numbers NACKed to the sender.
    pub nacks_sent: u64,
    /// Gaps filled by a retransmission.
    pub recovered: u64,
    /// Numbers this leg neither received nor recovered within
    /// `buffer_ms` (skipped, or given up at once after an outage longer
    /// than the buffer): lost on this leg, though another leg of a merged
    /// flow may have delivered them (the flow's `rist.unrecovered` counts
    /// only what the flow lost).
    pub unrecovered: u64,
    /// RTT from NACKs to their retransmissions, in microseconds (0: no
    /// sample yet).
    pub rtt_us: u64,
}

/// What the input's datagrams said about the stream (the flow's
/// `payload`): arrival for every mode, RTP and TS counters when the mode
/// reads them. Counters grow while the flow is configured.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputHealth {
    /// "udp", "rtp", "mpegts" or "rtp-mpegts"; empty before the flow first
    /// ran.
    pub payload: String,
    /// No datagram for `silence_ms` (or none since the flow started).
    pub silent: bool,
    pub silence_ms: u64,
    /// Longest gap between datagrams that ended in the current or the
    /// previous fixed one-minute window, counting the one still open.
    /// Reading resets nothing.
    pub max_gap_ns: u64,
    /// Present for "rtp" and "rtp-mpegts".
    pub rtp: Option<RtpHealth>,
    /// Present for "mpegts" and "rtp-mpegts".
    pub ts: Option<TsHealth>,
}

/// RTP (RFC 3550) counters of one input.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RtpHealth {
    /// Datagrams with a valid RTP header.
    pub packets: u64,
    /// Sequence numbers skipped and never arrived.
    pub lost: u64,
    pub duplicates: u64,
    /// Arrived after a higher sequence number.
    pub reordered: u64,
    pub ssrc_changes: u64,
    /// Sequence jumps too large to count as loss (counting restarted).
    pub resyncs: u64,
    /// Datagrams that aren't RTP (relayed anyway).
    pub malformed: u64,
    /// Of the latest packet.
    pub payload_type: u8,
    pub ssrc: u32,
    /// Interarrival jitter (RFC 3550 §6.4.1), in nanoseconds.
    pub jitter_ns: u64,
}

/// MPEG-TS (TR 101 290) counters of one input.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TsHealth {
    pub packets: u64,
    /// Datagrams not a multiple of 188 bytes, and packets without 0x47.
    pub sync_errors: u64,
    pub continuity_errors: u64,
    /// Packets with the transport-error indicator set.
    pub transport_errors: u64,
    /// Distinct PIDs seen.
    pub pids: u64,
}

impl InputHealth {
    /// Errors of any kind counted so far (not silence).
    pub fn errors(&self) -> u64 {
        let r = self.rtp.as_ref().map_or(0, |r| {
            r.lost + r.duplicates + r.reordered + r.ssrc_changes + r.malformed
        });
        let t = self.ts.as_ref().map_or(0, |t| {
            t.sync_errors + t.continuity_errors + t.transport_errors
        });
        r + t
    }

    /// Packets lost: RTP sequence gaps and TS continuity errors.
    pub fn losses(&self) -> u64 {
        self.rtp.as_ref().map_or(0, |r| r.lost)
            + self.ts.as_ref().map_or(0, |t| t.continuity_errors)
    }
}

/// The input's label in metrics: `address:port@interface`, from
/// [`FlowSnapshot::input`] ("239.1.1.1:5000 on eth0").
pub fn input_label(input: &str) -> String {
    match input.rsplit_once(" on ") {
        Some((addr, interface)) => format!("{addr}@{interface}"),
        None => input.to_owned(),
    }
}

/// Whether a flow relays. A flow that doesn't has no sockets open; its
/// counters keep their values and go on when it resumes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum FlowState {
    /// Its sockets are open and its worker relays it.
    #[default]
    Running,
    /// Paused: an interface of the flow is down (administratively, or no
    /// carrier). It resumes when the interface is up again.
    InterfaceDown { interface: String },
    /// An interface of the flow does not exist (yet). It starts when the
    /// interface appears.
    WaitingForInterface { interface: String },
    /// Its interfaces are up but its sockets could not be opened (or its
    /// worker refused it); retried with a growing delay.
    OpenFailed { error: String },
}

impl FlowState {
    pub fn is_running(&self) -> bool {
        *self == FlowState::Running
    }

    /// The state's tag without its details (`running`, `interface_down`,
    /// `waiting_for_interface`, `open_failed`): one word, for `key=value`
    /// lines.
    pub fn tag(&self) -> &'static str {
        match self {
            FlowState::Running => "running",
            FlowState::InterfaceDown { .. } => "interface_down",
            FlowState::WaitingForInterface { .. } => "waiting_for_interface",
            FlowState::OpenFailed { .. } => "open_failed",
        }
    }
}

impl std::fmt::Display for FlowState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlowState::Running => f.write_str("running"),
            FlowState::InterfaceDown { interface } => {
                write!(f, "paused: interface {interface} down")
            }
            FlowState::WaitingForInterface { interface } => {
                write!(f, "waiting for interface {interface}")
            }
            FlowState::OpenFailed { error } => write!(f, "paused: {error}"),
        }
    }
}

/// Why received (or arriving) datagrams of a flow were not relayed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngressDropsSnapshot {
    /// Payload above the largest pool class.
    pub oversize: u64,
    /// The class that fits the payload had no free buffer.
    pub pool_exhausted: u64,
    /// Socket receive buffer overflow, counted by the kernel.
    pub kernel: u64,
    /// Packet ingress: frames shorter than their headers say.
    #[serde(default)]
    pub truncated: u64,
    /// Packet ingress: frames with self-contradicting headers.
    #[serde(default)]
    pub malformed: u64,
    /// Packet ingress: IP fragments (not reassembled).
    #[serde(default)]
    pub fragment: u64,
    /// Packet ingress: UDP or IPv4 header checksum mismatch.
    #[serde(default)]
    pub bad_checksum: u64,
    /// Packet ingress: frames past the kernel filter that weren't the
    /// flow's after all.
    #[serde(default)]
    pub not_this_flow: u64,
    /// Datagrams this relay sent that came back to the input (a routing
    /// loop): dropped by the loop guard (`drop_loop`).
    #[serde(default, rename = "loop")]
    pub looped: u64,
}

impl IngressDropsSnapshot {
    /// Every reason with its count, in a fixed order (the names used in
    /// tables and metrics: the counter table's, [`crate::counters::INGRESS_DROPS`]).
    pub fn by_reason(&self) -> [(&'static str, u64); 9] {
        let rows = crate::counters::INGRESS_DROPS;
        std::array::from_fn(|i| {
            (
                rows[i].reason().map_or("", |(_, r)| r),
                (rows[i].value)(self),
            )
        })
    }

    /// All reasons together.
    pub fn total(&self) -> u64 {
        self.by_reason()
            .iter()
            .fold(0u64, |t, (_, n)| t.saturating_add(*n))
    }

    /// Frames packet ingress couldn't parse as the flow's datagrams.
    pub fn frames(&self) -> u64 {
        self.by_reason()[3..8]
            .iter()
            .fold(0u64, |t, (_, n)| t.saturating_add(*n))
    }

    fn add(&mut self, other: &Self) {
        crate::counters::carry(crate::counters::INGRESS_DROPS, self, other);
    }
}

/// One output of a flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSnapshot {
    /// "address:port" (and interface, if any).
    pub label: String,
    pub packets_out: u64,
    /// UDP payload bytes sent.
    pub bytes_out: u64,
    /// Dropped because the output already had its maximum sends in flight.
    pub drops_backlog: u64,
    /// Sends that completed with an error.
    pub drops_send_error: u64,
    /// The latest send error, e.g. "ENOBUFS (No buffer space available)".
    pub last_error: Option<String>,
    /// Most sends this output ever had in flight at once.
    pub in_flight_high_water: u64,
    /// UDP GSO sends that completed (each carried several datagrams).
    #[serde(default)]
    pub gso_sends: u64,
    /// GSO sends the kernel refused; their datagrams went one by one.
    #[serde(default)]
    pub gso_fallbacks: u64,
    /// Why the output is not connected, while it isn't (no route to its
    /// destination, or its source address missing): its sends fail, counted
    /// as `drops_send_error`, and the connection is retried every second
    /// and on every interface change; the flow's other outputs relay on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_connected: Option<String>,
    /// Times opening or connecting this output failed (each attempt).
    #[serde(default)]
    pub connect_failures: u64,
    /// An SRT output's side: its callers and their counters. The fields
    /// above count what the worker handed to the SRT thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub srt: Option<SrtSnapshot>,
}

/// An SRT output: a listener and its callers, or a caller.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrtSnapshot {
    /// A listener (callers connect to it) rather than a caller.
    pub listener: bool,
    pub max_callers: u32,
    /// Connected callers (a caller output: its one connection, if up).
    pub callers: Vec<SrtCallerSnapshot>,
    /// Datagrams the SRT thread read from the worker.
    pub datagrams: u64,
    /// Of those, read while no caller was connected (not sent).
    pub no_caller: u64,
    /// Of those, larger than an SRT live payload (1456 B), not sent.
    pub oversize: u64,
    /// Every caller's `sent` and `dropped` added up, callers that left
    /// included.
    #[serde(default)]
    pub sent: u64,
    #[serde(default)]
    pub dropped: u64,
    /// Callers accepted, or connections made.
    pub connects: u64,
    /// Callers refused: unknown stream ID, `max_callers` reached, wrong or
    /// missing passphrase.
    pub refused: u64,
    /// Callers gone: left, broke, or dropped for not keeping up.
    pub disconnects: u64,
    /// Of those, disconnected for not keeping up: datagrams were dropped
    /// for them two seconds in a row (their libsrt held about a second of
    /// the stream), or their receiver stopped reading.
    #[serde(default)]
    pub late_disconnects: u64,
    /// New callers are refused for now (`refused`): most callers fell
    /// behind at once, the relay's own sending is short.
    #[serde(default)]
    pub holding: bool,
    /// Failed connection attempts (caller mode).
    pub connect_failures: u64,
    /// The listener couldn't open, or the last connect error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The SRT thread's route these totals are of (not in the JSON): a
    /// reload's successor on another route adds them ([`FlowSnapshot::carry`]).
    #[serde(skip)]
    pub series: u64,
}

/// One connected SRT caller (or a caller output's connection).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrtCallerSnapshot {
    /// `address:port` of the peer.
    pub peer: String,
    pub stream_id: String,
    /// Unix time (s) it connected.
    pub connected_since: u64,
    /// Datagrams handed to libsrt for it.
    pub sent: u64,
    /// Datagrams dropped because its send buffer was full.
    pub dropped: u64,
    /// libsrt: packets retransmitted, reported lost by the peer, dropped
    /// as too late to deliver.
    pub retransmitted: u64,
    pub lost: u64,
    pub too_late: u64,
    /// Smoothed round-trip time, microseconds.
    pub rtt_us: u64,
    /// Send rate over the last interval, bits per second.
    pub send_bps: u64,
}

impl OutputSnapshot {
    /// All drop reasons together.
    pub fn drops(&self) -> u64 {
        self.drops_backlog.saturating_add(self.drops_send_error)
    }
}

/// Sums over every flow and output of a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub flows: usize,
    /// Flows relaying now ([`FlowState::Running`]).
    #[serde(default)]
    pub flows_running: usize,
    pub outputs: usize,
    pub packets_in: u64,
    pub bytes_in: u64,
    pub ingress_drops: IngressDropsSnapshot,
    pub receive_errors: u64,
    pub packets_out: u64,
    pub bytes_out: u64,
    pub drops_backlog: u64,
    pub drops_send_error: u64,
}

impl Snapshot {
    /// Sums over every flow and output (saturating, never wrapping).
    pub fn totals(&self) -> Totals {
        let mut t = Totals {
            flows: self.flows.len(),
            ..Totals::default()
        };
        for flow in &self.flows {
            t.flows_running += usize::from(flow.state.is_running());
            t.packets_in = t.packets_in.saturating_add(flow.packets_in);
            t.bytes_in = t.bytes_in.saturating_add(flow.bytes_in);
            t.ingress_drops.add(&flow.drops);
            t.receive_errors = t.receive_errors.saturating_add(flow.receive_errors);
            t.outputs += flow.outputs.len();
            for out in &flow.outputs {
                t.packets_out = t.packets_out.saturating_add(out.packets_out);
                t.bytes_out = t.bytes_out.saturating_add(out.bytes_out);
                t.drops_backlog = t.drops_backlog.saturating_add(out.drops_backlog);
                t.drops_send_error = t.drops_send_error.saturating_add(out.drops_send_error);
            }
        }
        t
    }

    /// The flow named `name`.
    pub fn flow(&self, name: &str) -> Option<&FlowSnapshot> {
        self.flows.iter().find(|f| f.name == name)
    }
}

/// A snapshot of `flows` flows, each a copy of [`sample`]'s fully
/// populated one (two outputs, RTP and TS health) under its own name, on
/// one worker: what the renderers' benchmarks (benches/metrics.rs) feed
/// them. Only with the `test-support` feature (or in this crate's tests).
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub fn bench_snapshot(flows: usize) -> Snapshot {
    let mut s = sample();
    let template = s.flows[0].clone();
    s.flows = (0..flows)
        .map(|i| FlowSnapshot {
            name: format!("channel-{i:04}"),
            ..template.clone()
        })
        .collect();
    s
}

/// A small, fully populated snapshot for tests across the crate.
#[cfg(any(test, feature = "test-support"))]
pub(crate) fn sample() -> Snapshot {
    let pool = |class: &str, buffer_bytes, capacity, in_use, exhausted| PoolClassSnapshot {
        class: class.into(),
        buffer_bytes,
        capacity,
        in_use,
        high_water: in_use + 3,
        taken: 1_000_000,
        exhausted,
    };
    Snapshot {
        metrics_endpoint: None,
        version: "0.1.0".into(),
        pid: 4242,
        uptime_seconds: 3723.5,
        taken_at_unix_ms: 1_700_000_000_000,
        state: DaemonState::Running,
        config_path: "/etc/mcrelay/mcrelay.toml".into(),
        workers: vec![WorkerSnapshot {
            index: 0,
            cpu: Some(2),
            receive_mode: "io_uring multishot".into(),
            loop_turns: 5000,
            completions: 20000,
            sends_submitted: 15000,
            pools: vec![
                pool("small", 1500, 4096, 17, 0),
                pool("standard", 4096, 1024, 2, 0),
                pool("jumbo", 9000, 256, 0, 9),
            ],
        }],
        flows: vec![FlowSnapshot {
            name: "video-a".into(),
            worker: 0,
            workers: Vec::new(),
            input: "239.1.1.1:5000 on vRA".into(),
            packets_in: 812,
            bytes_in: 1_048_576,
            drops: IngressDropsSnapshot {
                oversize: 1,
                pool_exhausted: 2,
                kernel: 3,
                ..IngressDropsSnapshot::default()
            },
            receive_errors: 4,
            receive_rearms: 5,
            pool_fallbacks: 6,
            outputs: vec![
                OutputSnapshot {
                    label: "10.0.0.1:6000".into(),
                    packets_out: 800,
                    bytes_out: 1_000_000,
                    drops_backlog: 6,
                    drops_send_error: 7,
                    last_error: Some("ENOBUFS".into()),
                    in_flight_high_water: 8,
                    gso_sends: 0,
                    gso_fallbacks: 0,
                    not_connected: None,
                    connect_failures: 0,
                    srt: None,
                },
                OutputSnapshot {
                    label: "239.2.2.2:7000".into(),
                    packets_out: 805,
                    bytes_out: 1_010_000,
                    drops_backlog: 0,
                    drops_send_error: 0,
                    last_error: None,
                    in_flight_high_water: 2,
                    gso_sends: 10,
                    gso_fallbacks: 1,
                    not_connected: None,
                    connect_failures: 0,
                    srt: None,
                },
            ],
            state: FlowState::Running,
            interface_pauses: 0,
            health: InputHealth {
                payload: "rtp-mpegts".into(),
                silent: false,
                silence_ms: 1000,
                max_gap_ns: 25_000_000,
                rtp: Some(RtpHealth {
                    packets: 800,
                    lost: 3,
                    duplicates: 2,
                    reordered: 1,
                    ssrc_changes: 1,
                    resyncs: 0,
                    malformed: 4,
                    payload_type: 33,
                    ssrc: 0x1234,
                    jitter_ns: 1_500_000,
                }),
                ts: Some(TsHealth {
                    packets: 5600,
                    sync_errors: 5,
                    continuity_errors: 6,
                    transport_errors: 7,
                    pids: 4,
                }),
            },
            redundancy: None,
            standby_discarded: 9,
            fec: None,
            srt_inputs: Vec::new(),
            rist: None,
        }],
        mode: crate::Mode::Active,
    }
}

/// [`sample`] with a second flow, "video-r", merging two legs.
#[cfg(test)]
pub(crate) fn sample_with_legs() -> Snapshot {
    let mut s = sample();
    let mut f = s.flows[0].clone();
    f.name = "video-r".into();
    f.input = "239.1.1.1:5000 on vRA, 239.1.2.1:5000 on vRB".into();
    let leg = |input: &str, forwarded, lost| LegSnapshot {
        input: input.into(),
        forwarded,
        standby: 0,
        kernel_drops: 1,
        detached: false,
        health: InputHealth {
            rtp: Some(RtpHealth {
                packets: 500,
                lost,
                ..RtpHealth::default()
            }),
            ts: None,
            payload: "rtp".into(),
            ..f.health.clone()
        },
        rist: None,
        fec: None,
    };
    f.redundancy = Some(RedundancySnapshot {
        mode: "merge".into(),
        recovered: 25,
        duplicates: 475,
        lost: 2,
        resets: 1,
        switches: 0,
        active_input: 0,
        late: 3,
        not_rtp: 0,
        strays: 4,
        replays: 5,
        mismatched: 6,
        legs: vec![
            leg("239.1.1.1:5000 on vRA", 490, 10),
            leg("239.1.2.1:5000 on vRB", 10, 15),
        ],
    });
    s.flows.push(f);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_json() {
        let s = sample();
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Snapshot>(&json).unwrap(), s);
    }

    #[test]
    fn state_is_tagged() {
        let json = serde_json::to_string(&DaemonState::Degraded("no route".into())).unwrap();
        assert_eq!(json, r#"{"state":"degraded","reason":"no route"}"#);
        assert_eq!(
            serde_json::to_string(&DaemonState::Running).unwrap(),
            r#"{"state":"running"}"#
        );
    }

    #[test]
    fn totals_add_up() {
        let t = sample().totals();
        assert_eq!((t.flows, t.outputs), (1, 2));
        assert_eq!(t.packets_out, 1605);
        assert_eq!(t.ingress_drops.total(), 6);
        assert_eq!(t.drops_backlog + t.drops_send_error, 13);
    }

    #[test]
    fn totals_saturate() {
        let mut s = sample();
        s.flows.push(s.flows[0].clone());
        s.flows[0].packets_in = u64::MAX;
        assert_eq!(s.totals().packets_in, u64::MAX);
    }

    #[test]
    fn optional_fields_may_be_missing() {
        let mut v = serde_json::to_value(sample()).unwrap();
        let flow = &mut v["flows"][0];
        flow.as_object_mut().unwrap().remove("receive_rearms");
        flow.as_object_mut().unwrap().remove("state");
        flow.as_object_mut().unwrap().remove("interface_pauses");
        flow.as_object_mut().unwrap().remove("standby_discarded");
        v.as_object_mut().unwrap().remove("mode");
        let flow = &mut v["flows"][0];
        flow["outputs"][0]
            .as_object_mut()
            .unwrap()
            .remove("gso_sends");
        let s: Snapshot = serde_json::from_value(v).unwrap();
        assert_eq!(s.flows[0].receive_rearms, 0);
        assert_eq!(s.flows[0].state, FlowState::Running);
        assert_eq!(s.flows[0].interface_pauses, 0);
        assert_eq!(s.flows[0].standby_discarded, 0);
        assert_eq!(s.mode, crate::Mode::Active);
    }

    #[test]
    fn flow_state_is_tagged_and_readable() {
        let down = FlowState::InterfaceDown {
            interface: "vRA".into(),
        };
        assert_eq!(
            serde_json::to_string(&down).unwrap(),
            r#"{"state":"interface_down","interface":"vRA"}"#
        );
        assert_eq!(down.to_string(), "paused: interface vRA down");
        let waiting = FlowState::WaitingForInterface {
            interface: "eth9".into(),
        };
        assert_eq!(waiting.to_string(), "waiting for interface eth9");
        assert_eq!(waiting.tag(), "waiting_for_interface");
        assert_eq!(
            serde_json::to_string(&FlowState::Running).unwrap(),
            r#"{"state":"running"}"#
        );
        let mut s = sample();
        s.flows.push(s.flows[0].clone());
        s.flows[1].state = waiting;
        assert_eq!((s.totals().flows, s.totals().flows_running), (2, 1));
    }
}
