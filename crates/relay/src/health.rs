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
//! ([`FlowCounters::leg_health`]), and one more for its output
//! ([`InputHealth::for_output`], into [`FlowCounters::output_health`]):
//! the datagrams its redundancy rule let through, so a merged flow's
//! health is that of what left, not of one leg.
//!
//! Cost per datagram: the tracker's bounded parse only. The monotonic
//! clock is read once per completion batch by the worker, and the counters
//! are published (a relaxed store each, plain moves) once per batch for
//! each flow that received in it. Nothing allocates: the tracker, with its
//! TS table, is built when the flow is added.

use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Instant;

pub use mcrelay_wire::health::is_silent;
use mcrelay_wire::health::{InputTracker, Payload};
pub use mcrelay_wire::rtp::jitter_ns;

use crate::counters::FlowCounters;
pub use crate::counters::{Gauge, HealthCounters};

/// A flow's stream-health settings: the config's `Health`, the same type.
pub use mcrelay_wire::health::HealthSettings;

/// Nanoseconds on the monotonic clock the workers stamp arrivals with
/// (since the first call in this process), so readers can compare.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Length of the fixed windows the longest gap is kept for
/// ([`HealthCounters::max_gap`]): one minute, longer than any usual
/// scrape interval, so every gap is seen by every scraper at least once.
pub const GAP_WINDOW_NS: u64 = 60_000_000_000;

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

    /// The longest gap between datagrams that ended in the current or
    /// the previous [`GAP_WINDOW_NS`] window at `now` (so over the last
    /// one to two minutes), counting the gap still open. Reading changes
    /// nothing: every reader (each scraper, `mcrelayctl top`) sees every
    /// gap for at least a full window.
    ///
    /// The three gauges are read one by one while the worker may move to
    /// a new window: a read at that instant may miss the window that just
    /// closed (or show it a moment longer), never invent a gap.
    pub fn max_gap(&self, now: u64) -> u64 {
        let open = self.last_arrival().map_or(0, |t| now.saturating_sub(t));
        let window = self.max_gap_window.get();
        let (current, previous) = (self.max_gap_ns.get(), self.max_gap_prev_ns.get());
        let closed = match (now / GAP_WINDOW_NS).saturating_sub(window) {
            0 => current.max(previous),
            1 => current,
            _ => 0,
        };
        closed.max(open)
    }

    /// The writer's side of [`Self::max_gap`]: a gap of `gap` ended at
    /// `at` (nanoseconds, [`now_ns`]).
    fn record_gap(&self, gap: u64, at: u64) {
        let window = at / GAP_WINDOW_NS;
        let stored = self.max_gap_window.get();
        if window == stored {
            if gap > self.max_gap_ns.get() {
                self.max_gap_ns.set(gap);
            }
            return;
        }
        if window < stored {
            // A clock step backwards can't happen on the monotonic clock;
            // keep the later window.
            return;
        }
        let previous = if window == stored + 1 {
            self.max_gap_ns.get()
        } else {
            0
        };
        self.max_gap_prev_ns.set(previous);
        self.max_gap_ns.set(gap);
        self.max_gap_window.set(window);
    }
}

/// How long an input is quiet before its missing RTP numbers are counted
/// lost without waiting for the stream to move on ([`InputHealth::settle`]).
pub const SETTLE_NS: u64 = 1_000_000_000;

/// The `leg` of an [`InputHealth`] that publishes a flow's output.
const OUTPUT: usize = usize::MAX;

/// Where an [`InputHealth`] of `leg` publishes.
fn target(counters: &FlowCounters, leg: usize) -> &HealthCounters {
    if leg == OUTPUT {
        &counters.output_health
    } else {
        counters.leg_health(leg).unwrap_or(&counters.health)
    }
}

/// Counter values when the tracker started: published values are these
/// plus the tracker's, so nothing goes back to zero when a flow is
/// paused and resumed, replaced by a reload or its tracker resyncs.
#[derive(Debug, Clone, Copy, Default)]
struct Base {
    rtp: [u64; 9],
    ts: [u64; 4],
}

/// One input's (leg's) health tracker and where it publishes. Lives in
/// its flow's intake in the core ([`crate::intake`]).
///
/// The packet path only updates the tracker ([`InputHealth::observe_at`]);
/// the worker publishes once per completion batch ([`InputHealth::publish`],
/// through [`crate::Core::publish_health`])
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
        let leg = if leg == OUTPUT || counters.leg_health(leg).is_some() {
            leg
        } else {
            0
        };
        let h = target(&counters, leg);
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
                h.rtp_resyncs.get(),
                h.rtp_strays.get(),
                h.rtp_replays.get(),
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

    /// The health of a flow's output: shown the datagrams its redundancy
    /// rule let through, publishing into [`FlowCounters::output_health`].
    pub fn for_output(settings: HealthSettings, counters: Arc<FlowCounters>) -> Self {
        Self::for_leg(settings, counters, OUTPUT)
    }

    /// Where it publishes.
    #[inline]
    pub fn counters(&self) -> &HealthCounters {
        target(&self.counters, self.leg)
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

    /// Off the packet path, once per worker tick: an input quiet for
    /// [`SETTLE_NS`] at `now` has its RTP numbers still missing counted
    /// lost and published (they would otherwise wait for the stream to
    /// move a window on, or forever if it ended).
    pub fn settle(&mut self, now: u64) {
        let last = self.batch_last_ns;
        if self.unpublished || last == 0 || now.saturating_sub(last) < SETTLE_NS {
            return;
        }
        if self.tracker.settle() {
            self.unpublished = true;
            self.publish();
        }
    }

    /// Publish what the datagrams observed since the last call changed:
    /// once per completion batch, off the per-datagram path.
    pub fn publish(&mut self) {
        if !core::mem::take(&mut self.unpublished) {
            return;
        }
        let h = target(&self.counters, self.leg);
        h.last_arrival_ns.set(self.batch_last_ns.saturating_add(1));
        h.record_gap(self.batch_max_gap, self.batch_last_ns);
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
            h.rtp_resyncs.set(b[6] + r.resyncs);
            h.rtp_strays.set(b[7] + r.strays);
            h.rtp_replays.set(b[8] + r.replays);
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
        // 2 is lost once the stream is a window past it.
        for s in 4..=140 {
            h.observe_at(&pkt(s), 51);
        }
        // A jump, confirmed by the next number: a resync.
        h.observe_at(&pkt(5000), 55);
        h.observe_at(&pkt(5001), 56);
        h.publish();
        assert_eq!(
            (
                c.rtp_packets.get(),
                c.rtp_lost.get(),
                c.rtp_duplicates.get(),
                c.rtp_resyncs.get()
            ),
            (142, 1, 1, 1)
        );
        assert_eq!(c.last_arrival(), Some(56));
        assert_eq!(c.max_gap(60), 40);
        assert_eq!(c.max_gap(60), 40, "reading resets nothing");
        assert_eq!(c.max_gap(100), 44, "the open gap counts");
        // The flow is paused and re-added: a new tracker, same counters,
        // none of them back to zero.
        let mut h = InputHealth::new(settings, Arc::clone(&counters));
        h.observe_at(&pkt(100), 1000);
        h.observe_at(&pkt(102), 1010);
        // A confirmed jump: 101, still missing, is lost then.
        h.observe_at(&pkt(40_000), 1011);
        h.observe_at(&pkt(40_001), 1012);
        h.publish();
        assert_eq!(
            (c.rtp_packets.get(), c.rtp_lost.get(), c.rtp_resyncs.get()),
            (146, 2, 2)
        );
    }

    #[test]
    fn the_longest_gap_is_kept_for_a_window_whoever_reads() {
        let c = HealthCounters::default();
        let w = GAP_WINDOW_NS;
        c.record_gap(5, 10);
        c.last_arrival_ns.set(11);
        assert_eq!(c.max_gap(10), 5);
        c.record_gap(3, 20);
        c.last_arrival_ns.set(21);
        assert_eq!(c.max_gap(21), 5, "the longer one stays");
        // The next window: the last one's longest is still shown.
        c.record_gap(2, w + 1);
        c.last_arrival_ns.set(w + 2);
        assert_eq!(c.max_gap(w + 2), 5);
        assert_eq!(c.max_gap(w + 2), 5, "a second reader sees it too");
        // Two windows on, it is gone; the newer window's gap stays.
        c.record_gap(1, 2 * w + 1);
        c.last_arrival_ns.set(2 * w + 2);
        assert_eq!(c.max_gap(2 * w + 2), 2);
        // Nothing written for a while: the open gap is the longest.
        assert_eq!(c.max_gap(5 * w), 5 * w - (2 * w + 1));
        // A jump of several windows forgets the old ones.
        c.record_gap(4, 9 * w);
        assert_eq!(c.max_gap_prev_ns.get(), 0);
        c.last_arrival_ns.set(9 * w + 1);
        assert_eq!(c.max_gap(9 * w), 4);
    }

    #[test]
    fn a_quiet_input_settles_its_missing_numbers() {
        let counters = Arc::new(FlowCounters::default());
        let settings = HealthSettings {
            payload: Payload::Rtp,
            rtp_clock_hz: 90_000,
            silence_ms: 100,
        };
        let mut h = InputHealth::new(settings, Arc::clone(&counters));
        h.observe_at(&pkt(1), 10);
        h.observe_at(&pkt(4), 20);
        h.publish();
        assert_eq!(counters.health.rtp_lost.get(), 0, "2 and 3 may come");
        h.settle(20 + SETTLE_NS - 1);
        assert_eq!(counters.health.rtp_lost.get(), 0);
        h.settle(20 + SETTLE_NS);
        assert_eq!(counters.health.rtp_lost.get(), 2);
        h.settle(30 + SETTLE_NS);
        assert_eq!(counters.health.rtp_lost.get(), 2, "once");
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
        let mut out = InputHealth::for_output(settings, Arc::clone(&counters));
        out.observe_at(&pkt(2), 5);
        out.publish();
        assert_eq!(counters.output_health.rtp_packets.get(), 1);
        assert_eq!(counters.output_health.settings(), Some(settings));
        assert_eq!(leg(0).rtp_packets.get(), 2, "the legs' own are apart");
    }
}
