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
    pub(crate) fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    #[inline(always)]
    pub(crate) fn inc(&self) {
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

/// Why an ingress datagram was not relayed.
#[derive(Debug, Default)]
pub struct IngressDrops {
    /// Payload above 9000 bytes (the largest pool class).
    pub oversize: Counter,
    /// The pool class that fits the payload had no free buffer.
    pub pool_exhausted: Counter,
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
    pub(crate) fn count(&self, reason: mcrelay_wire::Reject) {
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
    /// discarded on purpose (not a drop; see [`crate::core::standby`]).
    pub standby_discarded: Counter,
    /// Stream health of the input (see [`crate::health`]).
    pub health: crate::health::HealthCounters,
}

/// Counters of one output of a flow.
#[derive(Debug, Default)]
pub struct OutputCounters {
    pub packets_out: Counter,
    pub bytes_out: Counter,
    /// The output already had its maximum sends in flight.
    pub drop_backlog: Counter,
    /// The send completed with an error (`ENOBUFS`, `ECONNREFUSED` from an
    /// unreachable unicast host, ...).
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
