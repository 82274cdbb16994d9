//! Stream health of one input: what the worker learns from each datagram
//! of a flow without changing it. Every payload mode tracks arrival (the
//! longest gap between datagrams, silence); `rtp`, `mpegts` and
//! `rtp-mpegts` also read the RTP header ([`crate::rtp`]) and/or the TS
//! packet headers ([`crate::ts`]). A datagram that fails to parse is only
//! counted: the caller relays it unchanged whatever this says.
//!
//! Time is a parameter (nanoseconds on any monotonic clock), so tests drive
//! it with a fake clock. [`InputTracker::observe`] is bounded (a header per
//! RTP datagram, a header per TS packet), never allocates and never panics;
//! the tracker's state — 8 KiB of TS continuity table in the TS modes — is
//! allocated by [`InputTracker::new`], when the flow is added.

use crate::rtp::{RtpStats, RtpTracker};
use crate::ts::{TsStats, TsTracker};

/// What a flow's datagrams carry (`payload` in the config).
/// A flow's stream-health settings: what it carries and how to judge it.
/// The config parses them (`payload`, `silence_ms`, `rtp_clock_hz` of a
/// `[[flow]]`, as `mcrelay_config::Health`) and the relay core's tracker
/// uses the same value: one type end to end, nothing copied field by field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HealthSettings {
    /// `"udp"` (opaque, the default), `"rtp"`, `"mpegts"` or `"rtp-mpegts"`.
    pub payload: Payload,
    /// An input with no datagram for this long is silent.
    pub silence_ms: u32,
    /// The RTP timestamp clock, for jitter.
    pub rtp_clock_hz: u32,
}

/// Default `silence_ms`.
pub const DEFAULT_SILENCE_MS: u32 = 1000;
/// Default `rtp_clock_hz` (video, RFC 3551).
pub const DEFAULT_RTP_CLOCK_HZ: u32 = 90_000;

impl Default for HealthSettings {
    fn default() -> Self {
        Self {
            payload: Payload::Udp,
            silence_ms: DEFAULT_SILENCE_MS,
            rtp_clock_hz: DEFAULT_RTP_CLOCK_HZ,
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Payload {
    /// Opaque datagrams: only arrival is tracked.
    #[default]
    Udp,
    /// RTP (RFC 3550), any payload.
    Rtp,
    /// MPEG-TS packets directly in UDP.
    Mpegts,
    /// MPEG-TS in RTP (SMPTE 2022-2, RFC 2250).
    RtpMpegts,
}

impl Payload {
    /// Every mode, in config spelling.
    pub const ALL: [Payload; 4] = [
        Payload::Udp,
        Payload::Rtp,
        Payload::Mpegts,
        Payload::RtpMpegts,
    ];

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Payload::Udp => "udp",
            Payload::Rtp => "rtp",
            Payload::Mpegts => "mpegts",
            Payload::RtpMpegts => "rtp-mpegts",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    pub fn has_rtp(self) -> bool {
        matches!(self, Payload::Rtp | Payload::RtpMpegts)
    }

    pub fn has_ts(self) -> bool {
        matches!(self, Payload::Mpegts | Payload::RtpMpegts)
    }
}

impl core::fmt::Display for Payload {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Arrival of an input's datagrams, for every payload mode: what the
/// gap to the next one is measured from. (Datagram and byte counts, and
/// the longest gap per publish, are the caller's: the relay's flow
/// counters and its health hook keep them, so the tracker does not count
/// them a second time per datagram.)
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// When the latest datagram arrived; `None` before the first.
    pub last_ns: Option<u64>,
}

/// One input's health state. Created when its flow is added.
#[derive(Debug, Clone)]
pub struct InputTracker {
    payload: Payload,
    arrival: Arrival,
    rtp: RtpTracker,
    ts: Option<TsTracker>,
}

impl InputTracker {
    /// A tracker for `payload`, with an RTP clock of `rtp_clock_hz` for
    /// jitter. Allocates the TS table in the TS modes.
    pub fn new(payload: Payload, rtp_clock_hz: u32) -> Self {
        Self {
            payload,
            arrival: Arrival::default(),
            rtp: RtpTracker::new(rtp_clock_hz),
            ts: payload.has_ts().then(TsTracker::new),
        }
    }

    pub fn payload(&self) -> Payload {
        self.payload
    }

    /// Count datagram `d`, arrived at `now_ns`. Returns the gap since the
    /// previous datagram (0 for the first).
    #[inline]
    pub fn observe(&mut self, d: &[u8], now_ns: u64) -> u64 {
        let a = &mut self.arrival;
        let gap = a.last_ns.map_or(0, |last| now_ns.saturating_sub(last));
        a.last_ns = Some(now_ns);
        match self.payload {
            Payload::Udp => {}
            Payload::Rtp => {
                self.rtp.observe(d, now_ns);
            }
            Payload::Mpegts => {
                if let Some(ts) = &mut self.ts {
                    ts.observe(d);
                }
            }
            Payload::RtpMpegts => {
                if let (Some(h), Some(ts)) = (self.rtp.observe(d, now_ns), &mut self.ts) {
                    ts.observe(d.get(h.payload).unwrap_or_default());
                }
            }
        }
        gap
    }

    pub fn arrival(&self) -> &Arrival {
        &self.arrival
    }

    /// RTP counters (all zero unless the mode carries RTP).
    pub fn rtp(&self) -> &RtpStats {
        self.rtp.stats()
    }

    /// The highest RTP sequence number seen and its SSRC
    /// ([`RtpTracker::highest`]; `None` unless the mode carries RTP).
    pub fn rtp_highest(&self) -> Option<(u16, u32)> {
        self.rtp.highest()
    }

    /// The input has been quiet a while: count the RTP numbers still
    /// missing as lost ([`RtpTracker::settle`]). `true` when it counted
    /// any.
    pub fn settle(&mut self) -> bool {
        self.payload.has_rtp() && self.rtp.settle()
    }

    /// TS counters (all zero unless the mode carries TS).
    pub fn ts(&self) -> TsStats {
        self.ts.as_ref().map(|t| *t.stats()).unwrap_or_default()
    }
}

/// Whether an input is silent at `now_ns`: no datagram for `silence_ns`
/// since the later of its latest datagram (`last_ns`) and when watching
/// started (`since_ns`, when the flow was added: an input that never
/// received goes silent `silence_ns` after it). The reader (the
/// supervisor) asks; the worker only publishes `last_ns`.
pub fn is_silent(last_ns: Option<u64>, since_ns: u64, now_ns: u64, silence_ns: u64) -> bool {
    let quiet_since = last_ns.unwrap_or(since_ns).max(since_ns);
    now_ns.saturating_sub(quiet_since) >= silence_ns
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{rtp, ts};

    const MS: u64 = 1_000_000;

    fn rtp_ts(seq: u16, ccs: &[u8]) -> Vec<u8> {
        let mut d = vec![0u8; 12 + ts::PACKET * ccs.len()];
        let _ = rtp::build(&mut d, 33, seq, u32::from(seq) * 90, 1);
        for (p, &cc) in d[12..].chunks_exact_mut(ts::PACKET).zip(ccs) {
            ts::build(p, 0x100, cc, true, None);
        }
        d
    }

    #[test]
    fn payload_names_round_trip() {
        for p in Payload::ALL {
            assert_eq!(Payload::from_name(p.as_str()), Some(p));
        }
        assert_eq!(Payload::from_name("rtp_mpegts"), None);
    }

    #[test]
    fn udp_only_tracks_arrival() {
        let mut t = InputTracker::new(Payload::Udp, 90_000);
        assert_eq!(t.observe(b"not rtp", 10 * MS), 0);
        assert_eq!(t.observe(b"x", 30 * MS), 20 * MS);
        assert_eq!(t.observe(b"x", 35 * MS), 5 * MS);
        assert_eq!(t.rtp().malformed, 0);
        assert_eq!(t.ts(), TsStats::default());
        assert_eq!(t.arrival().last_ns, Some(35 * MS));
    }

    #[test]
    fn rtp_mpegts_reads_both_layers() {
        let mut t = InputTracker::new(Payload::RtpMpegts, 90_000);
        t.observe(&rtp_ts(1, &[0, 1, 2, 3, 4, 5, 6]), 0);
        t.observe(&rtp_ts(2, &[7, 8, 9, 10, 11, 12, 13]), MS);
        t.observe(&rtp_ts(4, &[15, 0, 1, 2, 3, 4, 5]), 2 * MS);
        assert_eq!(t.rtp().lost, 0, "3 is not lost while it may still come");
        assert_eq!(t.ts().continuity_errors, 1);
        assert_eq!(t.ts().packets, 21);
        // Not RTP: malformed, and its TS isn't read.
        t.observe(&[0x47; 188], 3 * MS);
        assert_eq!((t.rtp().malformed, t.ts().packets), (1, 21));
        // RTP but not whole TS packets: a sync error.
        t.observe(&rtp_ts(5, &[6])[..100], 4 * MS);
        assert_eq!(t.ts().sync_errors, 1);
    }

    #[test]
    fn mpegts_reads_the_whole_datagram() {
        let mut t = InputTracker::new(Payload::Mpegts, 90_000);
        let d = rtp_ts(1, &[0, 1]);
        t.observe(&d[12..], 0);
        assert_eq!((t.ts().packets, t.ts().sync_errors), (2, 0));
        t.observe(&d, MS);
        assert_eq!(t.ts().sync_errors, 1);
        assert_eq!(t.rtp(), &RtpStats::default());
    }

    #[test]
    fn silence() {
        let ms = MS;
        assert!(!is_silent(None, 0, 999 * ms, 1000 * ms));
        assert!(is_silent(None, 0, 1000 * ms, 1000 * ms));
        assert!(!is_silent(Some(2100 * ms), 0, 2200 * ms, 1000 * ms));
        assert!(!is_silent(Some(2100 * ms), 0, 3099 * ms, 1000 * ms));
        assert!(is_silent(Some(2100 * ms), 0, 3100 * ms, 1000 * ms));
        // A datagram from before watching started doesn't count.
        assert!(!is_silent(Some(5), 100, 105, 10));
        assert!(is_silent(Some(5), 100, 110, 10));
    }
}
