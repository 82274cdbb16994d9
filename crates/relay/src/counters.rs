//! Per-flow, per-output and per-worker counters. Written only by the worker
//! that owns them (a relaxed load and store: plain moves, no locked
//! instruction), read by any thread through an `Arc` without locks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A counter with exactly one writer.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Add `n`. Only the owning worker calls this.
    #[inline(always)]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    /// Add one. Only the owning worker calls this.
    #[inline(always)]
    pub fn inc(&self) {
        self.add(1);
    }

    /// Overwrite the value (for "latest" gauges). Owner only.
    #[inline(always)]
    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }

    /// The current value, from any thread.
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A value with one writer (the worker); readers only load it.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    #[inline(always)]
    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// One input's published health. Counters only grow while the flow is
/// configured (across pauses: a re-added flow's tracker starts from where
/// they stood).
#[derive(Debug, Default)]
pub struct HealthCounters {
    /// The payload mode as its index in `mcrelay_wire::health::Payload::ALL`, plus one; 0 until the
    /// flow is first added to a worker.
    pub payload: Gauge,
    pub rtp_clock_hz: Gauge,
    pub silence_ms: Gauge,
    /// When the flow was last added to its worker (`health::now_ns`).
    pub added_ns: Gauge,
    /// When its latest datagram arrived (`health::now_ns`), plus one; 0 before
    /// any.
    pub last_arrival_ns: Gauge,
    /// Longest gap between two datagrams that ended in the window
    /// [`Self::max_gap_window`] (of `health::GAP_WINDOW_NS`).
    pub max_gap_ns: Gauge,
    /// The same for the window before it (0 if no datagram ended one).
    pub max_gap_prev_ns: Gauge,
    /// The index (time / `health::GAP_WINDOW_NS`) of the window `max_gap_ns`
    /// covers.
    pub max_gap_window: Gauge,
    pub rtp_packets: Gauge,
    pub rtp_lost: Gauge,
    pub rtp_duplicates: Gauge,
    pub rtp_reordered: Gauge,
    pub rtp_ssrc_changes: Gauge,
    pub rtp_resyncs: Gauge,
    pub rtp_malformed: Gauge,
    /// Jumps the stream did not confirm (`mcrelay_wire::rtp_seq`): a
    /// corrupt header, a stray sender, a restart's first datagram.
    pub rtp_strays: Gauge,
    /// Far steps back the stream did not confirm: replayed datagrams.
    pub rtp_replays: Gauge,
    pub rtp_payload_type: Gauge,
    pub rtp_ssrc: Gauge,
    /// RFC 3550 jitter in clock units, times 16.
    pub rtp_jitter_x16: Gauge,
    pub ts_packets: Gauge,
    pub ts_sync_errors: Gauge,
    pub ts_continuity_errors: Gauge,
    pub ts_transport_errors: Gauge,
    pub ts_pids: Gauge,
}

/// Why an ingress datagram was not relayed.
#[derive(Debug, Default)]
pub struct IngressDrops {
    /// Payload above 9000 bytes (the largest pool class).
    pub oversize: Counter,
    /// The pool class that fits the payload had no free buffer.
    pub pool_exhausted: Counter,
    /// Datagrams this relay sent itself that came back to the input (a
    /// routing loop), marked by the ingress socket's loop guard
    /// (`mcrelay_wire::bpf::loop_guard`) and dropped before anything else
    /// sees them: not in `packets_in`, not in stream health.
    pub looped: Counter,
}

/// Frames a packet-ingress flow received but could not relay, by reason
/// (see [`mcrelay_wire::Reject`]). Always zero for socket ingress.
#[derive(Debug, Default)]
pub struct FrameDrops {
    /// Shorter than its headers say (UDP length past the frame, ...).
    pub truncated: Counter,
    /// Self-contradicting headers (IPv4 IHL < 5, ...).
    pub malformed: Counter,
    /// IP fragments (not reassembled).
    pub fragment: Counter,
    /// UDP or IPv4 header checksum mismatch.
    pub bad_checksum: Counter,
    /// Passed the kernel filter but not this flow's (e.g. an IPv6
    /// extension chain ending elsewhere).
    pub not_this_flow: Counter,
}

impl FrameDrops {
    /// Count one frame rejected for `reason`. Only the owning worker calls
    /// this.
    pub fn count(&self, reason: mcrelay_wire::Reject) {
        use mcrelay_wire::Reject;
        match reason {
            Reject::Truncated => self.truncated.inc(),
            Reject::Malformed => self.malformed.inc(),
            Reject::Fragment => self.fragment.inc(),
            Reject::BadChecksum => self.bad_checksum.inc(),
            Reject::NotThisFlow => self.not_this_flow.inc(),
        }
    }

    /// Every reason's count, named as in [`mcrelay_wire::Reject::as_str`].
    pub fn by_reason(&self) -> [(&'static str, u64); 5] {
        [
            ("truncated", self.truncated.get()),
            ("malformed", self.malformed.get()),
            ("fragment", self.fragment.get()),
            ("bad_checksum", self.bad_checksum.get()),
            ("not_this_flow", self.not_this_flow.get()),
        ]
    }
}

/// Counters of one flow's input.
#[derive(Debug, Default)]
pub struct FlowCounters {
    pub packets_in: Counter,
    pub bytes_in: Counter,
    pub drops: IngressDrops,
    /// Packet ingress only: frames not relayed, by reason.
    pub frames: FrameDrops,
    /// Receive completions that failed (the kernel's error, not a packet).
    pub receive_errors: Counter,
    /// The worker's provided receive buffers ran out; the kernel kept the
    /// datagrams in the socket buffer until the receive was re-armed.
    pub receive_rearms: Counter,
    /// Datagrams copied into a larger pool class because the fitting one
    /// had no buffer this flow could take (relayed, not a drop).
    pub pool_fallbacks: Counter,
    /// Receives resumed after every output had been backed up (the
    /// socket buffer held, or dropped and counted, what came meanwhile).
    pub receive_resumes: Counter,
    /// Datagrams received while the worker was in standby: read and
    /// discarded on purpose (not a drop; see [`crate::standby`]).
    pub standby_discarded: Counter,
    /// Stream health of the input, or of its first leg (see
    /// the `health` module); [`FlowCounters::leg_health`] has every leg's.
    pub health: HealthCounters,
    /// Stream health of legs 1 to 3 of a flow with several inputs.
    pub more_health: [HealthCounters; crate::redundancy::LegId::MAX_LEGS as usize - 1],
    /// A flow with several inputs: the stream health of what its
    /// redundancy rule let through to the outputs (the merge's or the
    /// active leg's datagrams), as [`Self::health`] is of one input.
    pub output_health: HealthCounters,
    /// What the flow's redundancy rule did with each leg's datagrams
    /// (see [`crate::redundancy`]).
    pub redundancy: RedundancyCounters,
    /// SMPTE 2022-1 FEC on the flow's legs, summed over them (see
    /// [`crate::fec`]); all 0 without `fec`. `unrecoverable` is what the
    /// flow lost after FEC (see there).
    pub fec: FecCounters,
    /// FEC on each leg (0 to 3) with `fec = "2022-1"`: its own decoder's
    /// figures; all 0 on other legs.
    pub leg_fec: [LegFecCounters; crate::redundancy::LegId::MAX_LEGS as usize],
    /// RIST on the flow's legs and outputs, summed over them (see
    /// [`crate::rist`]); all 0 without `protocol = "rist"`.
    /// `unrecovered` is what the flow lost after RIST (see there).
    pub rist: RistCounters,
    /// RIST on each leg (0 to 3) with `protocol = "rist"`: its own
    /// receiver's figures; all 0 on other legs.
    pub leg_rist: [LegRistCounters; crate::redundancy::LegId::MAX_LEGS as usize],
}

/// What one RIST leg's receiver did (a flow's [`RistCounters`] has the
/// flow's view).
#[derive(Debug, Default)]
pub struct LegRistCounters {
    /// Sequence numbers NACKed to the sender (each NACK of each).
    pub nacks_sent: Counter,
    /// Gaps filled by a retransmission.
    pub recovered: Counter,
    /// Numbers this leg neither received nor recovered within
    /// `buffer_ms` (skipped, or given up at once after an outage): lost
    /// on this leg, though another leg of a merged flow may have
    /// delivered them.
    pub unrecovered: Counter,
    /// RTT from NACKs to their retransmissions, microseconds (0: none yet).
    pub rtt_us: Gauge,
}

/// What one FEC leg's decoder did (a flow's [`FecCounters`] has the
/// flow's view).
#[derive(Debug, Default)]
pub struct LegFecCounters {
    /// Datagrams received on this leg's FEC ports.
    pub packets: Counter,
    /// Media packets this leg's decoder repaired.
    pub recovered: Counter,
    /// Media packets of this leg neither received nor repaired (counted
    /// as they leave the decoder's window): lost on this leg, though
    /// another leg of a merged flow may have delivered them.
    pub unrecoverable: Counter,
    /// Media packets that arrived on this leg after being repaired.
    pub duplicates: Counter,
    /// Datagrams on this leg's FEC ports that are not 2022-1 XOR FEC.
    pub rejected: Counter,
}

/// What RIST retransmission did on a flow: its RIST input(s) (NACKs
/// sent, gaps recovered or skipped) and its RIST output(s) (NACKs
/// received, retransmissions). Recovered datagrams are in `packets_in`
/// (they arrived on the wire, late).
#[derive(Debug, Default)]
pub struct RistCounters {
    /// Input: sequence numbers NACKed to the sender (each NACK of each).
    pub nacks_sent: Counter,
    /// Input: datagrams the receiver dropped (a number already handed
    /// on or skipped, a stray far from the stream, not RTP).
    pub dropped: Counter,
    /// Input: gaps filled by a retransmission.
    pub recovered: Counter,
    /// Input: what the flow lost after RIST. One input: the numbers its
    /// receiver neither received nor recovered within `buffer_ms`
    /// (skipped). Inputs merged by 2022-7: the numbers no leg delivered
    /// after each leg's repair (the merge's `lost`), so a number one leg
    /// lost and another delivered is not counted (each leg's own figure
    /// is in [`FlowCounters::leg_rist`]). Failover: the active leg's.
    pub unrecovered: Counter,
    /// Input: the RTT measured from NACKs to their retransmissions, in
    /// microseconds (0: none yet).
    pub input_rtt_us: Gauge,
    /// Output: sequence numbers receivers NACKed.
    pub nacks_received: Counter,
    /// Output: datagrams sent again.
    pub retransmitted: Counter,
    /// Output: NACKed numbers no longer (or never) in the buffer.
    pub unrecoverable: Counter,
    /// Output: the RTT to the receivers from their reports, in
    /// microseconds (0: none yet).
    pub output_rtt_us: Gauge,
}

/// What 2022-1 FEC decoding did on a flow's legs. Repaired packets are
/// not in `packets_in` (which counts what arrived on the wire): each
/// goes on like a received one, counted in `recovered`.
#[derive(Debug, Default)]
pub struct FecCounters {
    /// Datagrams received on the FEC ports (column and row).
    pub packets: Counter,
    /// Media packets repaired (on every leg: summed). A packet is
    /// repaired only once a later media packet was read, so one still
    /// queued on the media socket is not (see [`crate::fec::decode`]).
    pub recovered: Counter,
    /// What the flow lost after FEC. One input: media packets neither
    /// received nor repaired (counted once they leave the decoder's
    /// window of 512 numbers). Inputs merged by 2022-7: the numbers no
    /// leg delivered after each leg's repair (the merge's `lost`), so a
    /// number one leg could not repair and another delivered is not
    /// counted (each leg's own figure is in [`FlowCounters::leg_fec`]).
    /// Failover: the active leg's.
    pub unrecoverable: Counter,
    /// Media packets that arrived after being repaired (dropped).
    pub duplicates: Counter,
    /// Datagrams on a FEC port that are not 2022-1 XOR FEC.
    pub rejected: Counter,
}

impl FlowCounters {
    /// Stream health of leg `leg` (0 to 3).
    pub fn leg_health(&self, leg: usize) -> Option<&HealthCounters> {
        match leg {
            0 => Some(&self.health),
            n => self.more_health.get(n - 1),
        }
    }
}

/// A flow's legs and its redundancy rule (`Single`, `Merge`, `Failover`).
/// Every received datagram (`FlowCounters::packets_in`) is counted once:
/// `forwarded` on its leg, or `duplicates`, `late`, `not_rtp`, `standby`,
/// `unknown_leg`, or one of the input's drop reasons (oversize, pool
/// exhausted, every output full).
#[derive(Debug, Default)]
pub struct RedundancyCounters {
    /// Datagrams admitted for the outputs, per leg (in merge: the first
    /// copy of each sequence number; in failover: the active leg's).
    pub forwarded: [Counter; 4],
    /// Merge: sequence numbers forwarded while some leg did not deliver
    /// them within the window (the merge saved them).
    pub recovered: Counter,
    /// Later copies of a sequence number already forwarded (merge), or a
    /// repeat of one after a switch (failover with `rtp`): dropped.
    pub duplicates: Counter,
    /// Merge: sequence numbers no leg delivered in time (never forwarded),
    /// counted once the window has passed.
    pub lost: Counter,
    /// Restarts of the flow's sequence state: a leg confirmed a new
    /// numbering (an encoder restart, a new SSRC with new numbers) and no
    /// leg still carried the old one (`mcrelay_relay::sequence`).
    pub resets: Counter,
    /// Datagrams whose number jumped ahead of their leg's stream and was
    /// not (yet) confirmed (a corrupt header, a stray sender, the first
    /// datagram of a restart): dropped, nothing moved.
    pub strays: Counter,
    /// Datagrams whose number was far behind their leg's stream and not
    /// confirmed as a restart (a replay of an old datagram): dropped,
    /// nothing moved.
    pub replays: Counter,
    /// Merge: datagrams of a leg whose numbering is not the flow's (an
    /// independent encoder, a leg offset in numbering): dropped; the flow
    /// forwards the numbering it follows, never both.
    pub mismatched: Counter,
    /// Merge: the legs not merged right now (bit per leg, a gauge): their
    /// numbering is not the flow's, or they are behind it by more than
    /// the window.
    pub detached_legs: Counter,
    /// Failover: changes of the active leg.
    pub switches: Counter,
    /// Failover: the active leg's index (a gauge).
    pub active_leg: Counter,
    /// A copy that arrived after its number was skipped or left the
    /// window (or, failover with `rtp`, too far behind the numbers sent
    /// to know it is not a repeat): dropped.
    pub late: Counter,
    /// Merge (and failover with `rtp`): datagrams without an RTP header,
    /// so without a sequence number: dropped.
    pub not_rtp: Counter,
    /// Failover: datagrams of a leg that is not the active one, per leg:
    /// dropped without taking a buffer.
    pub standby: [Counter; 4],
    /// Datagrams named with a leg the flow does not have (a driver bug):
    /// dropped.
    pub unknown_leg: Counter,
    /// Merge with a delay: sequence numbers skipped before their delay was
    /// over because the hold spans at most
    /// [`crate::redundancy::SPAN`] numbers.
    pub hold_overflows: Counter,
}

impl RedundancyCounters {
    /// Datagrams this flow's redundancy rule dropped (every reason).
    pub fn dropped(&self) -> u64 {
        self.duplicates.get()
            + self.late.get()
            + self.strays.get()
            + self.replays.get()
            + self.mismatched.get()
            + self.not_rtp.get()
            + self.unknown_leg.get()
            + self.standby.iter().map(Counter::get).sum::<u64>()
    }

    /// Datagrams forwarded, over every leg.
    pub fn forwarded_total(&self) -> u64 {
        self.forwarded.iter().map(Counter::get).sum()
    }
}

/// Counters of one output of a flow.
#[derive(Debug, Default)]
pub struct OutputCounters {
    pub packets_out: Counter,
    pub bytes_out: Counter,
    /// The output already had its maximum sends in flight.
    pub drop_backlog: Counter,
    /// The send completed with an error (`EAGAIN`: its socket was full;
    /// `ENOBUFS`; `ECONNREFUSED` from an unreachable unicast host, ...).
    pub drop_send_error: Counter,
    /// The errno of the latest failed send, 0 if none.
    pub last_error: Counter,
    /// Most sends this output ever had in flight at once.
    pub in_flight_high_water: Counter,
    /// UDP GSO sends that completed (each carried several datagrams).
    pub gso_sends: Counter,
    /// GSO sends the kernel refused; their datagrams were sent one by one
    /// and the output stopped grouping datagrams of that size.
    pub gso_fallbacks: Counter,
}

/// Counters of one worker's loop.
#[derive(Debug, Default)]
pub struct LoopCounters {
    /// Turns of the event loop (one `io_uring_enter` each).
    pub turns: Counter,
    /// Completions handled.
    pub completions: Counter,
    /// Send SQEs submitted (a GSO send counts once).
    pub sends_submitted: Counter,
}

/// Everything a reader (control socket, metrics, final report) can see of
/// one flow.
#[derive(Debug)]
pub struct FlowStats {
    pub name: String,
    pub input: Arc<FlowCounters>,
    /// Labels ("address:port") and counters of each output, in config order.
    pub outputs: Vec<(String, Arc<OutputCounters>)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_adds_and_reads() {
        let c = Counter::default();
        c.inc();
        c.add(41);
        assert_eq!(c.get(), 42);
    }
}
