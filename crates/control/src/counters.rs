//! The counter table: every number of a [`Snapshot`], one row each, per
//! section (the struct it lives in). A row says what the number is (a
//! [`Kind`]: a total, a high-water mark, or a gauge), how to read it and,
//! for a total or a high-water mark, where it lives so a reload can carry
//! it ([`carry`]), and how Prometheus shows it ([`Metric`]). Three readers
//! follow the table instead of listing fields themselves:
//!
//! - [`FlowSnapshot::carry`](crate::FlowSnapshot::carry) (`carry.rs`)
//!   adds every total and keeps the larger of every high-water mark of a
//!   section, leaving gauges as they are;
//! - the Prometheus renderer (`prometheus.rs`) writes one family per row
//!   with a [`Metric::Family`] or [`Metric::Seconds`], and one family per
//!   [`ReasonFamily`] whose rows are its `reason` label's values, in
//!   table order;
//! - the reload test (`crates/mcrelayd/tests/counters_reload.rs`) checks
//!   that no number of `stats --json` but the [`gauges`] goes down.
//!
//! A test walks the JSON of every section and fails on a number that has
//! no row, so a new counter is one row plus the code that counts it: it
//! cannot be forgotten by the carry, the exposition or the test. Rows
//! whose metric is [`Metric::None`] are shown some other way (a family
//! the renderer writes itself, from several fields or only for some
//! flows) or only in `stats --json`; the row says which.
//!
//! Why a `const` slice of rows with accessor functions rather than a
//! macro generating the structs: the snapshot structs keep their doc
//! comments and serde attributes as plain Rust, the table reads as a
//! table, and a row is checked by the compiler like any code (a macro
//! only writes the two accessors of a row: `total!`, `max!`,
//! `gauge!`). Each table is `#[rustfmt::skip]` so that a row stays on one
//! line, help text included (rustfmt would spread it over about seven):
//! a table is read, diffed and grepped row by row.

use crate::snapshot::{
    EndpointSnapshot, FecSnapshot, FlowSnapshot, IngressDropsSnapshot, InputHealth, LegFecSnapshot,
    LegRistSnapshot, LegSnapshot, OutputSnapshot, PoolClassSnapshot, RedundancySnapshot,
    RistSnapshot, RtpHealth, Snapshot, SrtCallerSnapshot, SrtInputSnapshot, SrtPeerSnapshot,
    SrtSnapshot, TsHealth, WorkerSnapshot,
};

/// What a number is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Counts since its flow (or worker) was configured: never goes down,
    /// and a reload's successor adds its predecessor's. A Prometheus
    /// counter (`_total`).
    Total,
    /// The most ever (a high-water mark): never goes down, and a reload's
    /// successor keeps the larger. A Prometheus gauge.
    Max,
    /// Describes now (the latest SSRC, an RTT, a rate, a setting, an
    /// index): may go down, and the successor's own stands.
    Gauge,
}

/// A Prometheus family whose samples are a section's rows, told apart by
/// their `reason` label.
#[derive(Debug)]
pub struct ReasonFamily {
    pub name: &'static str,
    pub help: &'static str,
}

/// How Prometheus shows a row.
#[derive(Debug, Clone, Copy)]
pub enum Metric {
    /// Not a family of its own (see the row's comment).
    None,
    /// A family of its own: a counter for a [`Kind::Total`], else a gauge.
    Family {
        name: &'static str,
        help: &'static str,
    },
    /// A gauge in seconds of a number counted in `per_second` units
    /// (1e6: microseconds).
    Seconds {
        name: &'static str,
        help: &'static str,
        per_second: f64,
    },
    /// One `reason` of a family by reason.
    Reason {
        family: &'static ReasonFamily,
        reason: &'static str,
    },
}

/// One number of section `T`.
#[derive(Debug)]
pub struct Counter<T> {
    /// Its name in `stats --json`.
    pub field: &'static str,
    pub kind: Kind,
    /// Its value.
    pub value: fn(&T) -> u64,
    /// Where it lives, for [`carry`]: every total and high-water mark.
    pub slot: Option<fn(&mut T) -> &mut u64>,
    pub metric: Metric,
}

impl<T> Counter<T> {
    /// The family this row is a reason of, and the reason.
    pub fn reason(&self) -> Option<(&'static ReasonFamily, &'static str)> {
        match self.metric {
            Metric::Reason { family, reason } => Some((family, reason)),
            _ => None,
        }
    }
}

const fn family(name: &'static str, help: &'static str) -> Metric {
    Metric::Family { name, help }
}

const fn seconds(name: &'static str, help: &'static str, per_second: f64) -> Metric {
    Metric::Seconds {
        name,
        help,
        per_second,
    }
}

const fn reason(family: &'static ReasonFamily, reason: &'static str) -> Metric {
    Metric::Reason { family, reason }
}

/// A row for a `u64` counted number of kind `$kind` (its slot carried).
macro_rules! counted {
    ($kind:ident, $field:ident, $metric:expr) => {
        Counter {
            field: stringify!($field),
            kind: Kind::$kind,
            value: |x| x.$field,
            slot: Some(|x| &mut x.$field),
            metric: $metric,
        }
    };
}

/// A row for a `u64` total.
macro_rules! total {
    ($field:ident, $metric:expr) => {
        counted!(Total, $field, $metric)
    };
}

/// A row for a `u64` high-water mark.
macro_rules! max {
    ($field:ident, $metric:expr) => {
        counted!(Max, $field, $metric)
    };
}

/// A row for a gauge: `u64`, or anything `u64::from` takes (`bool`,
/// `u8`, `u32`) with `from`.
macro_rules! gauge {
    (from $field:ident, $metric:expr) => {
        Counter {
            field: stringify!($field),
            kind: Kind::Gauge,
            value: |x| u64::from(x.$field),
            slot: None,
            metric: $metric,
        }
    };
    ($field:ident, $metric:expr) => {
        Counter {
            field: stringify!($field),
            kind: Kind::Gauge,
            value: |x| x.$field,
            slot: None,
            metric: $metric,
        }
    };
}

/// A non-negative float as a whole number (0 for NaN, saturating).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn whole(v: f64) -> u64 {
    v as u64
}

/// The daemon itself: none of these count anything.
#[rustfmt::skip]
pub const DAEMON: &[Counter<Snapshot>] = &[
    gauge!(from pid, Metric::None),
    // mcrelay_uptime_seconds, a float, written by the renderer.
    Counter { field: "uptime_seconds", kind: Kind::Gauge, value: |s| whole(s.uptime_seconds), slot: None, metric: Metric::None },
    gauge!(taken_at_unix_ms, Metric::None),
];

/// The metrics endpoint's connections.
#[rustfmt::skip]
pub const ENDPOINT: &[Counter<EndpointSnapshot>] = &[
    total!(served, family("mcrelay_metrics_connections_served_total", "Connections to the metrics endpoint that were served (read and answered, or timed out).")),
    total!(refused_not_allowed, reason(&REFUSED, "not_allowed")),
    total!(refused_address_cap, reason(&REFUSED, "address_cap")),
    total!(refused_full, reason(&REFUSED, "full")),
    total!(displaced_address_cap, reason(&DISPLACED, "address_cap")),
    total!(displaced_full, reason(&DISPLACED, "full")),
];

pub const REFUSED: ReasonFamily = ReasonFamily {
    name: "mcrelay_metrics_connections_refused_total",
    help: "Connections to the metrics endpoint closed at accept, by reason: not_allowed (the peer \
           is not in daemon.metrics_allow), address_cap (its address already had its share of \
           connections, all being answered), full (every slot was being answered).",
};

pub const DISPLACED: ReasonFamily = ReasonFamily {
    name: "mcrelay_metrics_connections_displaced_total",
    help: "Connections to the metrics endpoint shut down before their request was complete, to make \
           room for a newer one, by reason: address_cap (from the same address), full (from an \
           address holding fewer).",
};

/// A worker's event loop.
#[rustfmt::skip]
pub const WORKER: &[Counter<WorkerSnapshot>] = &[
    total!(loop_turns, family("mcrelay_worker_loop_turns_total", "Turns of the worker's event loop.")),
    total!(completions, family("mcrelay_worker_completions_total", "Completions the worker handled.")),
    total!(sends_submitted, family("mcrelay_worker_sends_submitted_total", "Send operations the worker submitted (a GSO send counts once).")),
    // The `worker` label.
    Counter { field: "index", kind: Kind::Gauge, value: |w| w.index as u64, slot: None, metric: Metric::None },
    Counter { field: "cpu", kind: Kind::Gauge, value: |w| w.cpu.map_or(0, |c| c as u64), slot: None, metric: Metric::None },
];

/// One size class of a worker's pool.
#[rustfmt::skip]
pub const POOL: &[Counter<PoolClassSnapshot>] = &[
    gauge!(from capacity, family("mcrelay_pool_buffers", "Buffers in the worker's pool class.")),
    gauge!(from in_use, family("mcrelay_pool_buffers_in_use", "Buffers of the class out of the pool now.")),
    // A worker's pool is never rebuilt by a reload: nothing to carry.
    Counter { field: "high_water", kind: Kind::Max, value: |p| u64::from(p.high_water), slot: None, metric: family("mcrelay_pool_buffers_high_water", "Most buffers of the class ever out at once.") },
    total!(taken, family("mcrelay_pool_taken_total", "Buffers of the class taken from the pool.")),
    total!(exhausted, family("mcrelay_pool_exhausted_total", "Takes that failed because the class had no free buffer.")),
    gauge!(from buffer_bytes, Metric::None),
];

/// A flow's own numbers (its input; outputs, drops and the rest are
/// sections of their own).
#[rustfmt::skip]
pub const FLOW: &[Counter<FlowSnapshot>] = &[
    total!(packets_in, family("mcrelay_flow_received_packets_total", "Datagrams received on the flow's input.")),
    total!(bytes_in, family("mcrelay_flow_received_bytes_total", "UDP payload bytes received on the flow's input.")),
    total!(receive_errors, family("mcrelay_flow_receive_errors_total", "Receive completions that failed with an error.")),
    total!(receive_rearms, family("mcrelay_flow_receive_rearms_total", "Times the provided receive buffers ran out and the receive was re-armed.")),
    total!(pool_fallbacks, family("mcrelay_flow_pool_fallbacks_total", "Datagrams copied into a larger pool class because the fitting one had no buffer for the flow.")),
    total!(standby_discarded, family("mcrelay_flow_standby_discarded_packets_total", "Datagrams received while the daemon was in standby: read and discarded on purpose, not a drop.")),
    total!(interface_pauses, family("mcrelay_flow_interface_pauses_total", "Times the flow stopped relaying because an interface of it went down or away.")),
    Counter { field: "worker", kind: Kind::Gauge, value: |f| f.worker as u64, slot: None, metric: Metric::None },
    // A spread flow's workers (a list in stats --json; its length here).
    Counter { field: "workers", kind: Kind::Gauge, value: |f| f.workers.len() as u64, slot: None, metric: Metric::None },
];

pub const FLOW_DROPPED: ReasonFamily = ReasonFamily {
    name: "mcrelay_flow_dropped_packets_total",
    help: "Datagrams of the flow not relayed, by reason: oversize (above the largest \
           buffer), pool_exhausted (no free buffer), kernel (socket buffer overflow); \
           packet ingress only: truncated, malformed, fragment, bad_checksum, \
           not_this_flow (frames that carried no datagram for the flow); loop (datagrams \
           this relay sent that came back to the input, dropped by the loop guard).",
};

/// Why a flow's datagrams were not relayed: every row a reason of
/// [`FLOW_DROPPED`] (the order of [`IngressDropsSnapshot::by_reason`]).
#[rustfmt::skip]
pub const INGRESS_DROPS: &[Counter<IngressDropsSnapshot>; 9] = &[
    total!(oversize, reason(&FLOW_DROPPED, "oversize")),
    total!(pool_exhausted, reason(&FLOW_DROPPED, "pool_exhausted")),
    total!(kernel, reason(&FLOW_DROPPED, "kernel")),
    total!(truncated, reason(&FLOW_DROPPED, "truncated")),
    total!(malformed, reason(&FLOW_DROPPED, "malformed")),
    total!(fragment, reason(&FLOW_DROPPED, "fragment")),
    total!(bad_checksum, reason(&FLOW_DROPPED, "bad_checksum")),
    total!(not_this_flow, reason(&FLOW_DROPPED, "not_this_flow")),
    // `loop` in stats --json.
    Counter { field: "loop", kind: Kind::Total, value: |d| d.looped, slot: Some(|d| &mut d.looped), metric: reason(&FLOW_DROPPED, "loop") },
];

/// An input's stream health (the RTP and TS counters are sections of
/// their own).
#[rustfmt::skip]
pub const INPUT_HEALTH: &[Counter<InputHealth>] = &[
    gauge!(from silent, family("mcrelay_input_silent", "1 while no datagram has arrived on the input for the flow's silence_ms, else 0.")),
    gauge!(max_gap_ns, seconds("mcrelay_input_max_gap_seconds", "Longest gap between datagrams on the input in the last one to two minutes (fixed one-minute windows; reading resets nothing), counting the one still open.", 1e9)),
    // The flow's setting.
    gauge!(silence_ms, Metric::None),
];

/// RTP (RFC 3550) counters of an input.
#[rustfmt::skip]
pub const RTP: &[Counter<RtpHealth>] = &[
    total!(packets, family("mcrelay_input_rtp_packets_total", "Datagrams with a valid RTP header.")),
    total!(lost, family("mcrelay_input_rtp_lost_packets_total", "RTP sequence numbers skipped and never arrived.")),
    total!(duplicates, family("mcrelay_input_rtp_duplicate_packets_total", "RTP packets whose sequence number had already arrived.")),
    total!(reordered, family("mcrelay_input_rtp_reordered_packets_total", "RTP packets that arrived after a higher sequence number.")),
    total!(ssrc_changes, family("mcrelay_input_rtp_ssrc_changes_total", "Times the RTP SSRC changed (a new source).")),
    total!(resyncs, family("mcrelay_input_rtp_resyncs_total", "RTP sequence jumps too large to count as loss; counting restarted.")),
    total!(malformed, family("mcrelay_input_rtp_malformed_packets_total", "Datagrams that are not RTP version 2 (relayed unchanged).")),
    gauge!(jitter_ns, seconds("mcrelay_input_rtp_jitter_seconds", "RTP interarrival jitter (RFC 3550 6.4.1) of the input.", 1e9)),
    gauge!(from payload_type, Metric::None),
    gauge!(from ssrc, Metric::None),
];

/// MPEG-TS (TR 101 290) counters of an input.
#[rustfmt::skip]
pub const TS: &[Counter<TsHealth>] = &[
    total!(packets, family("mcrelay_input_ts_packets_total", "MPEG-TS packets read on the input.")),
    total!(continuity_errors, family("mcrelay_input_ts_continuity_errors_total", "MPEG-TS continuity-counter errors (TR 101 290 1.4).")),
    total!(sync_errors, family("mcrelay_input_ts_sync_errors_total", "Datagrams not a multiple of 188 bytes, and TS packets without the 0x47 sync byte.")),
    total!(transport_errors, family("mcrelay_input_ts_transport_errors_total", "MPEG-TS packets with the transport-error indicator set (TR 101 290 2.1).")),
    gauge!(pids, family("mcrelay_input_ts_pids", "Distinct MPEG-TS PIDs seen on the input.")),
];

pub const REDUNDANCY_DROPPED: ReasonFamily = ReasonFamily {
    name: "mcrelay_flow_redundancy_dropped_packets_total",
    help: "Datagrams the flow's redundancy rule dropped, by reason: late (after their turn or the window), \
           stray (an unconfirmed jump ahead), replay (far behind, not a restart), mismatched (merge: another \
           numbering than the flow's), not_rtp. Duplicates are mcrelay_flow_merge_duplicate_packets_total.",
};

/// What a flow's redundancy rule did with its legs.
#[rustfmt::skip]
pub const REDUNDANCY: &[Counter<RedundancySnapshot>] = &[
    total!(recovered, family("mcrelay_flow_merge_recovered_packets_total", "Merge: packets forwarded from one input while another missed them.")),
    total!(duplicates, family("mcrelay_flow_merge_duplicate_packets_total", "Later copies of packets already forwarded (merge), or repeats after a failover switch: dropped.")),
    total!(lost, family("mcrelay_flow_merge_lost_packets_total", "Merge: sequence numbers no input delivered within merge_window_ms.")),
    total!(switches, family("mcrelay_flow_input_switches_total", "Failover: changes of the input the flow forwards from.")),
    total!(resets, family("mcrelay_flow_sequence_restarts_total", "Restarts of the flow's RTP sequence state: an input confirmed a new numbering (an encoder restart).")),
    total!(late, reason(&REDUNDANCY_DROPPED, "late")),
    total!(strays, reason(&REDUNDANCY_DROPPED, "stray")),
    total!(replays, reason(&REDUNDANCY_DROPPED, "replay")),
    total!(mismatched, reason(&REDUNDANCY_DROPPED, "mismatched")),
    total!(not_rtp, reason(&REDUNDANCY_DROPPED, "not_rtp")),
    // mcrelay_flow_active_input: one sample per leg, written by the
    // renderer for failover flows.
    gauge!(active_input, Metric::None),
];

/// One leg of a flow with several inputs.
#[rustfmt::skip]
pub const LEG: &[Counter<LegSnapshot>] = &[
    total!(forwarded, family("mcrelay_input_forwarded_packets_total", "Datagrams of the input forwarded to the flow's outputs (flows with several inputs).")),
    // In stats --json and the leg's row of `mcrelayctl flows`.
    total!(standby, Metric::None),
    total!(kernel_drops, Metric::None),
    // mcrelay_input_detached: merge flows only, written by the renderer.
    gauge!(from detached, Metric::None),
];

/// A RIST leg of a flow with several inputs: its own receiver's figures
/// (the flow's are [`RIST`]).
#[rustfmt::skip]
pub const LEG_RIST: &[Counter<LegRistSnapshot>] = &[
    total!(nacks_sent, family("mcrelay_input_rist_nacks_sent_total", "RIST input of a flow with several inputs: sequence numbers it NACKed to the sender.")),
    total!(recovered, family("mcrelay_input_rist_recovered_packets_total", "RIST input of a flow with several inputs: gaps filled by a retransmission.")),
    total!(unrecovered, family("mcrelay_input_rist_unrecovered_packets_total", "RIST input of a flow with several inputs: packets it neither received nor recovered within buffer_ms (lost on this input; another input may have delivered them: the flow's own loss is mcrelay_flow_rist_unrecovered_packets_total).")),
    gauge!(rtt_us, seconds("mcrelay_input_rist_rtt_seconds", "RIST input of a flow with several inputs: round-trip time to the sender, from NACKs to their retransmissions (0: no sample yet).", 1e6)),
];

/// An FEC leg of a flow with several inputs: its own decoder's figures
/// (the flow's are [`FEC`]).
#[rustfmt::skip]
pub const LEG_FEC: &[Counter<LegFecSnapshot>] = &[
    total!(packets, family("mcrelay_input_fec_packets_total", "FEC input of a flow with several inputs: datagrams received on its 2022-1 FEC ports (port + 2 and + 4).")),
    total!(recovered, family("mcrelay_input_fec_recovered_packets_total", "FEC input of a flow with several inputs: media packets its decoder repaired.")),
    total!(unrecoverable, family("mcrelay_input_fec_unrecoverable_packets_total", "FEC input of a flow with several inputs: media packets it neither received nor repaired (lost on this input; another input may have delivered them: the flow's own loss is mcrelay_flow_fec_unrecoverable_packets_total).")),
    total!(duplicates, family("mcrelay_input_fec_duplicate_packets_total", "FEC input of a flow with several inputs: media packets that arrived after its decoder had repaired them: dropped.")),
    total!(rejected, family("mcrelay_input_fec_rejected_total", "FEC input of a flow with several inputs: datagrams on its FEC ports that are not 2022-1 XOR FEC.")),
];

/// SMPTE 2022-1 FEC on a flow's inputs.
#[rustfmt::skip]
pub const FEC: &[Counter<FecSnapshot>] = &[
    total!(packets, family("mcrelay_flow_fec_packets_total", "Datagrams received on the 2022-1 FEC ports (input port + 2 and + 4).")),
    total!(recovered, family("mcrelay_flow_fec_recovered_packets_total", "Media packets repaired by 2022-1 FEC and relayed (not in received_packets_total; every input's, summed).")),
    total!(unrecoverable, family("mcrelay_flow_fec_unrecoverable_packets_total", "What the flow lost after FEC: media packets neither received nor repaired; of inputs merged by 2022-7, packets no input delivered (the merge's lost); of failover, what the active input could not repair.")),
    total!(duplicates, family("mcrelay_flow_fec_duplicate_packets_total", "Media packets that arrived after FEC had repaired them: dropped.")),
    total!(rejected, family("mcrelay_flow_fec_rejected_total", "Datagrams on the FEC ports that are not 2022-1 XOR FEC.")),
];

/// RIST on a flow's input and outputs.
#[rustfmt::skip]
pub const RIST: &[Counter<RistSnapshot>] = &[
    total!(nacks_sent, family("mcrelay_flow_rist_nacks_sent_total", "RIST input: sequence numbers NACKed to the sender.")),
    total!(recovered, family("mcrelay_flow_rist_recovered_packets_total", "RIST input: gaps filled by a retransmission.")),
    total!(unrecovered, family("mcrelay_flow_rist_unrecovered_packets_total", "RIST input: what the flow lost after RIST: packets neither received nor retransmitted within buffer_ms (skipped); of inputs merged by 2022-7, packets no input delivered (the merge's lost); of failover, what the active input skipped.")),
    total!(nacks_received, family("mcrelay_flow_rist_nacks_received_total", "RIST output: sequence numbers the receivers NACKed.")),
    total!(retransmitted, family("mcrelay_flow_rist_retransmitted_packets_total", "RIST output: packets sent again.")),
    total!(unrecoverable, family("mcrelay_flow_rist_unrecoverable_nacks_total", "RIST output: NACKed packets no longer in the buffer (NACKed too late, or buffer_ms too short for the receivers).")),
    gauge!(input_rtt_us, seconds("mcrelay_flow_rist_input_rtt_seconds", "RIST input: round-trip time to the sender, from NACKs to their retransmissions (0: no sample yet).", 1e6)),
    gauge!(output_rtt_us, seconds("mcrelay_flow_rist_output_rtt_seconds", "RIST output: round-trip time to the receivers, from their reports (0: no sample yet).", 1e6)),
    // In stats --json only.
    total!(dropped, Metric::None),
];

pub const OUTPUT_DROPPED: ReasonFamily = ReasonFamily {
    name: "mcrelay_output_dropped_packets_total",
    help: "Datagrams not sent to the output, by reason: backlog (too many sends in \
           flight), send_error (the send failed).",
};

/// One output of a flow. `mcrelay_output_connected` (from
/// `not_connected`, not a number) is written by the renderer.
#[rustfmt::skip]
pub const OUTPUT: &[Counter<OutputSnapshot>] = &[
    total!(packets_out, family("mcrelay_output_sent_packets_total", "Datagrams sent to the output.")),
    total!(bytes_out, family("mcrelay_output_sent_bytes_total", "UDP payload bytes sent to the output.")),
    max!(in_flight_high_water, family("mcrelay_output_in_flight_high_water", "Most sends the output ever had in flight at once.")),
    total!(gso_sends, family("mcrelay_output_gso_sends_total", "UDP GSO sends completed (each carried several datagrams).")),
    total!(gso_fallbacks, family("mcrelay_output_gso_fallbacks_total", "GSO sends the kernel refused; their datagrams were sent one by one.")),
    total!(connect_failures, family("mcrelay_output_connect_failures_total", "Attempts to connect the output that failed (no route, source address missing).")),
    total!(drops_backlog, reason(&OUTPUT_DROPPED, "backlog")),
    total!(drops_send_error, reason(&OUTPUT_DROPPED, "send_error")),
];

/// An SRT output's route, kept by the SRT thread. `mcrelay_srt_callers`
/// (the callers connected) is written by the renderer.
#[rustfmt::skip]
pub const SRT_OUTPUT: &[Counter<SrtSnapshot>] = &[
    gauge!(from max_callers, family("mcrelay_srt_max_callers", "Most callers the SRT output serves at once.")),
    total!(refused, family("mcrelay_srt_refused_total", "SRT callers refused: unknown stream ID, max_callers reached, wrong or missing passphrase.")),
    total!(disconnects, family("mcrelay_srt_disconnects_total", "SRT callers gone: left, broke, or dropped for not keeping up.")),
    total!(late_disconnects, family("mcrelay_srt_late_disconnects_total", "SRT callers disconnected for not keeping up: datagrams dropped for them two seconds in a row, or their receiver stopped reading.")),
    gauge!(from holding, family("mcrelay_srt_refusing_callers", "1 while the SRT output refuses new callers because most of its callers fell behind at once (the relay's sending is short).")),
    total!(connect_failures, family("mcrelay_srt_connect_failures_total", "Failed connection attempts of an SRT caller output.")),
    total!(no_caller, family("mcrelay_srt_no_caller_packets_total", "Datagrams that reached the SRT output while no caller was connected.")),
    total!(sent, family("mcrelay_srt_sent_packets_total", "Datagrams handed to libsrt for the SRT output's callers, those gone included.")),
    total!(dropped, family("mcrelay_srt_dropped_packets_total", "Datagrams dropped for the SRT output's callers (those gone included): a caller's send buffer was full.")),
    // In stats --json only.
    total!(datagrams, Metric::None),
    total!(oversize, Metric::None),
    total!(connects, Metric::None),
];

/// One caller of an SRT output: its own series (labelled by its peer)
/// for as long as it is connected, so nothing of it is carried.
#[rustfmt::skip]
pub const SRT_CALLER: &[Counter<SrtCallerSnapshot>] = &[
    total!(sent, family("mcrelay_srt_caller_sent_packets_total", "Datagrams handed to libsrt for this SRT caller.")),
    total!(dropped, family("mcrelay_srt_caller_dropped_packets_total", "Datagrams dropped for this SRT caller: its send buffer was full.")),
    total!(retransmitted, family("mcrelay_srt_caller_retransmitted_packets_total", "Packets libsrt retransmitted to this caller.")),
    total!(lost, family("mcrelay_srt_caller_lost_packets_total", "Packets this caller reported lost (before retransmission).")),
    total!(too_late, family("mcrelay_srt_caller_too_late_packets_total", "Packets libsrt dropped as too late to deliver to this caller (residual loss).")),
    gauge!(send_bps, family("mcrelay_srt_caller_send_bits_per_second", "Send rate to this caller over the last second.")),
    gauge!(rtt_us, seconds("mcrelay_srt_caller_rtt_seconds", "Smoothed round-trip time to this SRT caller.", 1e6)),
    gauge!(connected_since, Metric::None),
];

pub const SRT_INPUT_DROPPED: ReasonFamily = ReasonFamily {
    name: "mcrelay_srt_input_dropped_packets_total",
    help: "Datagrams of the SRT input dropped before its worker, by reason: queue_full (the worker's queue was full), flow_gone (the flow was being removed).",
};

/// An SRT input's route, kept by the SRT thread.
/// `mcrelay_srt_input_connected` (whether it has a peer) is written by
/// the renderer, and so are the peer's libsrt counters.
#[rustfmt::skip]
pub const SRT_INPUT: &[Counter<SrtInputSnapshot>] = &[
    total!(datagrams, family("mcrelay_srt_input_received_packets_total", "Datagrams the SRT input received from its peer.")),
    total!(delivered, family("mcrelay_srt_input_delivered_packets_total", "Datagrams of the SRT input handed to the flow's worker.")),
    total!(refused, family("mcrelay_srt_input_refused_total", "Callers the SRT input refused: a second caller while one is connected, unknown stream ID, wrong or missing passphrase.")),
    total!(disconnects, family("mcrelay_srt_input_disconnects_total", "Connections of the SRT input that ended.")),
    total!(connect_failures, family("mcrelay_srt_input_connect_failures_total", "Failed connection attempts of an SRT caller input.")),
    total!(drop_queue_full, reason(&SRT_INPUT_DROPPED, "queue_full")),
    total!(drop_flow_gone, reason(&SRT_INPUT_DROPPED, "flow_gone")),
    // In stats --json only.
    total!(connects, Metric::None),
    Counter { field: "leg", kind: Kind::Gauge, value: |i| i.leg as u64, slot: None, metric: Metric::None },
];

/// The peer of an SRT input, over its current connection (libsrt's
/// counters start again with each connection, so nothing is carried).
/// The renderer writes `lost` and `too_late` as the input's
/// `mcrelay_srt_input_lost_packets_total` and
/// `mcrelay_srt_input_too_late_packets_total` (0 without a peer), and
/// its RTT as `mcrelay_srt_input_rtt_seconds`.
#[rustfmt::skip]
pub const SRT_PEER: &[Counter<SrtPeerSnapshot>] = &[
    total!(received, Metric::None),
    total!(lost, Metric::None),
    total!(too_late, Metric::None),
    gauge!(rtt_us, Metric::None),
    gauge!(receive_bps, Metric::None),
    gauge!(connected_since, Metric::None),
];

/// Adds every total of `from` to `to`'s and keeps the larger of every
/// high-water mark (saturating): `to` goes on from `from`.
pub fn carry<T>(table: &[Counter<T>], to: &mut T, from: &T) {
    for c in table {
        if let Some(slot) = c.slot {
            let earlier = (c.value)(from);
            let now = slot(to);
            *now = match c.kind {
                Kind::Total => now.saturating_add(earlier),
                Kind::Max => (*now).max(earlier),
                Kind::Gauge => *now,
            };
        }
    }
}

/// Every row of every section: (section, field, kind).
pub fn rows() -> Vec<(&'static str, &'static str, Kind)> {
    fn of<T>(section: &'static str, t: &[Counter<T>]) -> Vec<(&'static str, &'static str, Kind)> {
        t.iter().map(|c| (section, c.field, c.kind)).collect()
    }
    [
        of("daemon", DAEMON),
        of("metrics_endpoint", ENDPOINT),
        of("worker", WORKER),
        of("pool", POOL),
        of("flow", FLOW),
        of("drops", INGRESS_DROPS),
        of("health", INPUT_HEALTH),
        of("rtp", RTP),
        of("ts", TS),
        of("redundancy", REDUNDANCY),
        of("leg", LEG),
        of("leg_rist", LEG_RIST),
        of("leg_fec", LEG_FEC),
        of("fec", FEC),
        of("rist", RIST),
        of("output", OUTPUT),
        of("srt", SRT_OUTPUT),
        of("srt_caller", SRT_CALLER),
        of("srt_input", SRT_INPUT),
        of("srt_peer", SRT_PEER),
    ]
    .concat()
}

/// The names of the numbers of `stats --json` that may go down (the
/// gauges): every other number is a total or a high-water mark, which
/// never goes down. A name is of one kind in every section (a test holds
/// the table to that), so the name alone tells.
pub fn gauges() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = rows()
        .into_iter()
        .filter(|(_, _, k)| *k == Kind::Gauge)
        .map(|(_, f, _)| f)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use serde::Serialize;

    use super::*;
    use crate::snapshot::sample_with_legs;

    /// The names of the numbers of `v`'s JSON (lists of numbers
    /// included), and the names of all its fields, one level deep.
    fn numbers<T: Serialize>(v: &T) -> (BTreeSet<String>, BTreeSet<String>) {
        let json = serde_json::to_value(v).expect("json");
        let object = json.as_object().expect("an object");
        let numbers = object
            .iter()
            .filter(|(_, v)| match v {
                serde_json::Value::Number(_) => true,
                serde_json::Value::Array(a) => a.iter().any(serde_json::Value::is_number),
                _ => false,
            })
            .map(|(k, _)| k.clone())
            .collect();
        (numbers, object.keys().cloned().collect())
    }

    fn fields<T>(table: &[Counter<T>]) -> BTreeSet<String> {
        table.iter().map(|c| c.field.to_owned()).collect()
    }

    /// Every number of every section has its row, and every row names a
    /// number the section has: a counter added to a snapshot struct
    /// without a row fails here.
    #[test]
    fn every_number_of_every_section_has_a_row() {
        let s = sample_with_legs();
        let f = &s.flows[1];
        let r = f.redundancy.as_ref().expect("legs");
        let h = &f.health;
        let mut workers = s.workers[0].clone();
        workers.cpu = Some(1);
        let mut spread = s.flows[0].clone();
        spread.workers = vec![0, 1];
        type Check = (
            &'static str,
            (BTreeSet<String>, BTreeSet<String>),
            BTreeSet<String>,
        );
        let checks: Vec<Check> = vec![
            ("daemon", numbers(&s), fields(DAEMON)),
            (
                "endpoint",
                numbers(&EndpointSnapshot::default()),
                fields(ENDPOINT),
            ),
            ("worker", numbers(&workers), fields(WORKER)),
            ("pool", numbers(&s.workers[0].pools[0]), fields(POOL)),
            ("flow", numbers(&spread), fields(FLOW)),
            ("drops", numbers(&f.drops), fields(INGRESS_DROPS)),
            ("health", numbers(h), fields(INPUT_HEALTH)),
            ("rtp", numbers(h.rtp.as_ref().expect("rtp")), fields(RTP)),
            ("ts", numbers(h.ts.as_ref().expect("ts")), fields(TS)),
            ("redundancy", numbers(r), fields(REDUNDANCY)),
            ("leg", numbers(&r.legs[0]), fields(LEG)),
            (
                "leg_rist",
                numbers(&LegRistSnapshot::default()),
                fields(LEG_RIST),
            ),
            (
                "leg_fec",
                numbers(&LegFecSnapshot::default()),
                fields(LEG_FEC),
            ),
            ("fec", numbers(&FecSnapshot::default()), fields(FEC)),
            ("rist", numbers(&RistSnapshot::default()), fields(RIST)),
            ("output", numbers(&f.outputs[0]), fields(OUTPUT)),
            ("srt", numbers(&SrtSnapshot::default()), fields(SRT_OUTPUT)),
            (
                "srt_caller",
                numbers(&SrtCallerSnapshot::default()),
                fields(SRT_CALLER),
            ),
            (
                "srt_input",
                numbers(&SrtInputSnapshot::default()),
                fields(SRT_INPUT),
            ),
            (
                "srt_peer",
                numbers(&SrtPeerSnapshot::default()),
                fields(SRT_PEER),
            ),
        ];
        for (section, (numbers, keys), table) in checks {
            let missing: Vec<_> = numbers.difference(&table).collect();
            assert!(
                missing.is_empty(),
                "{section}: numbers without a row: {missing:?}"
            );
            let stray: Vec<_> = table.difference(&keys).collect();
            assert!(stray.is_empty(), "{section}: rows of no field: {stray:?}");
        }
    }

    /// A field name is of one kind in every section, so [`gauges`] can
    /// go by name.
    #[test]
    fn a_name_is_of_one_kind_in_every_section() {
        let mut kinds: BTreeMap<&str, Kind> = BTreeMap::new();
        for (section, field, kind) in rows() {
            let first = *kinds.entry(field).or_insert(kind);
            assert_eq!(first, kind, "{section}.{field}");
        }
        assert!(gauges().contains(&"jitter_ns"));
        assert!(!gauges().contains(&"packets"));
        assert!(!gauges().contains(&"in_flight_high_water"));
    }

    /// Every Prometheus family name is written once, a counter ends in
    /// `_total`, a gauge doesn't.
    #[test]
    fn metric_names_are_unique_and_follow_the_conventions() {
        let mut names = BTreeMap::new();
        let mut check = |name: &'static str, counter: bool| {
            assert_eq!(name.ends_with("_total"), counter, "{name}");
            assert!(name.starts_with("mcrelay_"), "{name}");
            *names.entry(name).or_insert(0) += 1;
        };
        fn each<T>(t: &[Counter<T>], check: &mut dyn FnMut(&'static str, bool)) {
            let mut families: Vec<&str> = Vec::new();
            for c in t {
                match c.metric {
                    Metric::None => {}
                    Metric::Family { name, .. } => check(name, c.kind == Kind::Total),
                    Metric::Seconds { name, .. } => {
                        assert!(name.ends_with("_seconds"), "{name}");
                        check(name, false);
                    }
                    Metric::Reason { family, .. } => {
                        assert_eq!(c.kind, Kind::Total, "{}", c.field);
                        if !families.contains(&family.name) {
                            families.push(family.name);
                            check(family.name, true);
                        }
                    }
                }
            }
        }
        each(DAEMON, &mut check);
        each(ENDPOINT, &mut check);
        each(WORKER, &mut check);
        each(POOL, &mut check);
        each(FLOW, &mut check);
        each(INGRESS_DROPS, &mut check);
        each(INPUT_HEALTH, &mut check);
        each(RTP, &mut check);
        each(TS, &mut check);
        each(REDUNDANCY, &mut check);
        each(LEG, &mut check);
        each(LEG_RIST, &mut check);
        each(LEG_FEC, &mut check);
        each(FEC, &mut check);
        each(RIST, &mut check);
        each(OUTPUT, &mut check);
        each(SRT_OUTPUT, &mut check);
        each(SRT_CALLER, &mut check);
        each(SRT_INPUT, &mut check);
        each(SRT_PEER, &mut check);
        let twice: Vec<_> = names.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "{twice:?}");
    }

    #[test]
    fn carry_adds_totals_keeps_the_larger_high_water_and_leaves_gauges() {
        let mut now = OutputSnapshot {
            packets_out: 1,
            in_flight_high_water: 3,
            ..crate::snapshot::sample().flows[0].outputs[0].clone()
        };
        let mut before = now.clone();
        before.packets_out = u64::MAX;
        before.in_flight_high_water = 9;
        carry(OUTPUT, &mut now, &before);
        assert_eq!((now.packets_out, now.in_flight_high_water), (u64::MAX, 9));
        let mut rtp = RtpHealth {
            lost: 1,
            ssrc: 7,
            ..RtpHealth::default()
        };
        let earlier = RtpHealth {
            lost: 2,
            ssrc: 8,
            ..RtpHealth::default()
        };
        carry(RTP, &mut rtp, &earlier);
        assert_eq!((rtp.lost, rtp.ssrc), (3, 7));
    }
}
