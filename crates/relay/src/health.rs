//! Stream health on the packet path: each flow's [`InputHealth`] reads
//! every datagram it receives with [`mcrelay_wire::health::InputTracker`]
//! (the RTP and TS headers for `payload = "rtp" | "mpegts" |
//! "rtp-mpegts"`, arrival for every mode) and publishes what it learnt
//! into the flow's [`HealthCounters`]: relaxed atomics written only by
//! the worker, read by the supervisor. The datagram is never changed, and
//! is relayed whatever this says.
//!
//! A flow with several inputs (legs) has one [`InputHealth`] per leg,
//! each publishing into its leg's [`HealthCounters`]
//! ([`FlowCounters::leg_health`]).
//!
//! Cost per datagram: the tracker's bounded parse only. The monotonic
//! clock is read once per completion batch by the worker, and the counters
//! are published (a relaxed store each, plain moves) once per batch for
//! each flow that received in it. Nothing allocates: the tracker, with its
//! TS table, is built when the flow is added.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

pub use mcrelay_wire::health::is_silent;
use mcrelay_wire::health::{InputTracker, Payload};
pub use mcrelay_wire::rtp::jitter_ns;

use crate::counters::FlowCounters;

/// A flow's stream-health settings (from its config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthSettings {
    pub payload: Payload,
    pub rtp_clock_hz: u32,
    pub silence_ms: u32,
}

impl Default for HealthSettings {
    fn default() -> Self {
        Self {
            payload: Payload::Udp,
            rtp_clock_hz: 90_000,
            silence_ms: 1000,
        }
    }
}

/// Nanoseconds on the monotonic clock the workers stamp arrivals with
/// (since the first call in this process), so readers can compare.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A value with one writer at a time (the worker; for `max_gap_ns` a
/// reader may reset it).
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    #[inline(always)]
    fn set(&self, v: u64) {
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
    /// [`Payload`] as its index in [`Payload::ALL`], plus one; 0 until the
    /// flow is first added to a worker.
    pub payload: Gauge,
    pub rtp_clock_hz: Gauge,
    pub silence_ms: Gauge,
    /// When the flow was last added to its worker ([`now_ns`]).
    pub added_ns: Gauge,
    /// When its latest datagram arrived ([`now_ns`]), plus one; 0 before
    /// any.
    pub last_arrival_ns: Gauge,
    /// Longest gap between two datagrams since a reader last reset it.
    pub max_gap_ns: Gauge,
    pub rtp_packets: Gauge,
    pub rtp_lost: Gauge,
    pub rtp_duplicates: Gauge,
    pub rtp_reordered: Gauge,
    pub rtp_ssrc_changes: Gauge,
    pub rtp_resyncs: Gauge,
    pub rtp_malformed: Gauge,
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

impl HealthCounters {
    /// The flow's settings, once it has been added to a worker.
    pub fn settings(&self) -> Option<HealthSettings> {
        let i = usize::try_from(self.payload.get().checked_sub(1)?).ok()?;
        Some(HealthSettings {
            payload: *Payload::ALL.get(i)?,
            rtp_clock_hz: u32::try_from(self.rtp_clock_hz.get()).unwrap_or(90_000),
            silence_ms: u32::try_from(self.silence_ms.get()).unwrap_or(1000),
        })
    }

    /// When the latest datagram arrived, if any did.
    pub fn last_arrival(&self) -> Option<u64> {
        self.last_arrival_ns.get().checked_sub(1)
    }

    /// The longest gap since the previous call (counting the one open at
    /// `now`), and start the next period. A reader's reset; a gap the
    /// worker records between this read and the reset (the same
    /// microsecond) is lost.
    pub fn take_max_gap(&self, now: u64) -> u64 {
        let open = self.last_arrival().map_or(0, |t| now.saturating_sub(t));
        self.max_gap_ns.0.swap(0, Relaxed).max(open)
    }

    /// The longest gap since the last reset, counting the open one, without
    /// resetting.
    pub fn max_gap(&self, now: u64) -> u64 {
        let open = self.last_arrival().map_or(0, |t| now.saturating_sub(t));
        self.max_gap_ns.get().max(open)
    }
}

/// Counter values when the tracker started: published values are these
/// plus the tracker's.
#[derive(Debug, Clone, Copy, Default)]
struct Base {
    rtp: [u64; 6],
    ts: [u64; 4],
}

/// One input's (leg's) health tracker and where it publishes. Lives in
/// the worker.
///
/// The packet path only updates the tracker ([`InputHealth::observe_at`]);
/// the worker publishes once per completion batch ([`InputHealth::publish`])
/// what a batch of datagrams changed, so the relaxed stores are paid per
/// batch, not per datagram.
#[derive(Debug)]
pub struct InputHealth {
    tracker: InputTracker,
    counters: Arc<FlowCounters>,
    /// Which of the flow's legs: where in `counters` it publishes.
    leg: usize,
    base: Base,
    /// Datagrams observed since the last publish.
    unpublished: bool,
    /// The longest gap among them, and the latest arrival.
    batch_max_gap: u64,
    batch_last_ns: u64,
}

impl InputHealth {
    /// Called when the flow is added to its worker (not on the packet
    /// path): allocates the tracker and records the settings.
    pub fn new(settings: HealthSettings, counters: Arc<FlowCounters>) -> Self {
        Self::for_leg(settings, counters, 0)
    }

    /// [`InputHealth::new`] for leg `leg` (0 to 3; a larger one publishes
    /// as leg 0) of a flow with several inputs.
    pub fn for_leg(settings: HealthSettings, counters: Arc<FlowCounters>, leg: usize) -> Self {
        let leg = if counters.leg_health(leg).is_some() {
            leg
        } else {
            0
        };
        let h = counters.leg_health(leg).unwrap_or(&counters.health);
        let index = Payload::ALL
            .iter()
            .position(|&p| p == settings.payload)
            .unwrap_or(0);
        h.payload.set(index as u64 + 1);
        h.rtp_clock_hz.set(u64::from(settings.rtp_clock_hz));
        h.silence_ms.set(u64::from(settings.silence_ms));
        h.added_ns.set(now_ns());
        let base = Base {
            rtp: [
                h.rtp_packets.get(),
                h.rtp_lost.get(),
                h.rtp_duplicates.get(),
                h.rtp_reordered.get(),
                h.rtp_ssrc_changes.get(),
                h.rtp_malformed.get(),
            ],
            ts: [
                h.ts_packets.get(),
                h.ts_sync_errors.get(),
                h.ts_continuity_errors.get(),
                h.ts_transport_errors.get(),
            ],
        };
        Self {
            tracker: InputTracker::new(settings.payload, settings.rtp_clock_hz),
            counters,
            leg,
            base,
            unpublished: false,
            batch_max_gap: 0,
            batch_last_ns: 0,
        }
    }

    /// Where it publishes.
    #[inline]
    pub fn counters(&self) -> &HealthCounters {
        self.counters
            .leg_health(self.leg)
            .unwrap_or(&self.counters.health)
    }

    /// The highest RTP sequence number this input saw and its SSRC (a
    /// replaced one-leg flow's last forwarded number, for its successor).
    pub fn rtp_highest(&self) -> Option<(u16, u32)> {
        self.tracker.rtp_highest()
    }

    /// The packet path: read `d`, arrived at `now` ([`now_ns`], read once
    /// per batch by the worker). `true` when this is the first datagram
    /// since the last [`Self::publish`]: the caller remembers to publish.
    #[inline]
    pub fn observe_at(&mut self, d: &[u8], now: u64) -> bool {
        let gap = self.tracker.observe(d, now);
        self.batch_max_gap = self.batch_max_gap.max(gap);
        self.batch_last_ns = now;
        !core::mem::replace(&mut self.unpublished, true)
    }

    /// Publish what the datagrams observed since the last call changed:
    /// once per completion batch, off the per-datagram path.
    pub fn publish(&mut self) {
        if !core::mem::take(&mut self.unpublished) {
            return;
        }
        let h = self
            .counters
            .leg_health(self.leg)
            .unwrap_or(&self.counters.health);
        h.last_arrival_ns.set(self.batch_last_ns.saturating_add(1));
        if self.batch_max_gap > h.max_gap_ns.get() {
            h.max_gap_ns.set(self.batch_max_gap);
        }
        self.batch_max_gap = 0;
        let payload = self.tracker.payload();
        if payload.has_rtp() {
            let r = self.tracker.rtp();
            let b = &self.base.rtp;
            h.rtp_packets.set(b[0] + r.packets);
            h.rtp_lost.set(b[1] + r.lost);
            h.rtp_duplicates.set(b[2] + r.duplicates);
            h.rtp_reordered.set(b[3] + r.reordered);
            h.rtp_ssrc_changes.set(b[4] + r.ssrc_changes);
            h.rtp_malformed.set(b[5] + r.malformed);
            h.rtp_resyncs.set(r.resyncs);
            h.rtp_payload_type.set(u64::from(r.payload_type));
            h.rtp_ssrc.set(u64::from(r.ssrc));
            h.rtp_jitter_x16.set(r.jitter_x16);
        }
        if payload.has_ts() {
            let t = self.tracker.ts();
            let b = &self.base.ts;
            h.ts_packets.set(b[0] + t.packets);
            h.ts_sync_errors.set(b[1] + t.sync_errors);
            h.ts_continuity_errors.set(b[2] + t.continuity_errors);
            h.ts_transport_errors.set(b[3] + t.transport_errors);
            h.ts_pids.set(t.pids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcrelay_wire::rtp;

    fn pkt(seq: u16) -> [u8; 20] {
        let mut b = [0u8; 20];
        let _ = rtp::build(&mut b, 96, seq, 0, 5);
        b
    }

    #[test]
    fn publishes_and_resumes_from_where_it_stood() {
        let counters = Arc::new(FlowCounters::default());
        assert_eq!(counters.health.settings(), None);
        let settings = HealthSettings {
            payload: Payload::Rtp,
            rtp_clock_hz: 48_000,
            silence_ms: 250,
        };
        let mut h = InputHealth::new(settings, Arc::clone(&counters));
        assert_eq!(counters.health.settings(), Some(settings));
        assert_eq!(counters.health.last_arrival(), None);
        assert!(h.observe_at(&pkt(1), 0), "the first one asks for a publish");
        assert!(!h.observe_at(&pkt(3), 10), "later ones don't");
        h.publish();
        let c = &counters.health;
        assert_eq!((c.rtp_packets.get(), c.last_arrival()), (2, Some(10)));
        assert!(h.observe_at(&pkt(3), 50), "asks again after a publish");
        h.publish();
        assert_eq!(
            (
                c.rtp_packets.get(),
                c.rtp_lost.get(),
                c.rtp_duplicates.get()
            ),
            (3, 1, 1)
        );
        assert_eq!(c.last_arrival(), Some(50));
        assert_eq!(c.max_gap(60), 40);
        assert_eq!(c.take_max_gap(60), 40);
        assert_eq!(c.take_max_gap(70), 20, "the open gap counts");
        // The flow is paused and re-added: a new tracker, same counters.
        let mut h = InputHealth::new(settings, Arc::clone(&counters));
        h.observe_at(&pkt(100), 1000);
        h.observe_at(&pkt(102), 1010);
        h.publish();
        assert_eq!((c.rtp_packets.get(), c.rtp_lost.get()), (5, 2));
    }

    #[test]
    fn each_leg_publishes_its_own_health() {
        let counters = Arc::new(FlowCounters::default());
        let settings = HealthSettings {
            payload: Payload::Rtp,
            rtp_clock_hz: 90_000,
            silence_ms: 100,
        };
        let mut a = InputHealth::for_leg(settings, Arc::clone(&counters), 0);
        let mut b = InputHealth::for_leg(settings, Arc::clone(&counters), 3);
        a.observe_at(&pkt(1), 0);
        a.observe_at(&pkt(2), 1);
        b.observe_at(&pkt(2), 5);
        a.publish();
        b.publish();
        let leg = |i| counters.leg_health(i).expect("leg");
        assert_eq!(leg(0).rtp_packets.get(), 2);
        assert_eq!(leg(3).rtp_packets.get(), 1);
        assert_eq!(leg(3).last_arrival(), Some(5));
        assert_eq!(leg(1).settings(), None, "leg 1 never added");
        assert_eq!(leg(3).settings(), Some(settings));
        assert!(counters.leg_health(4).is_none());
        assert!(std::ptr::eq(b.counters(), leg(3)));
    }
}
