//! RTP (RFC 3550): the fixed header of a datagram, and a per-input tracker
//! counting loss, duplicates, reordering, SSRC changes and interarrival
//! jitter (§6.4.1) from the sequence numbers and timestamps it sees.
//!
//! Pure and bounded: [`RtpTracker::observe`] reads 12 bytes plus the CSRC
//! list and extension length, does a fixed amount of integer arithmetic
//! (one wrapping 64-bit multiply for the arrival time in clock units, no
//! division) and never allocates or panics.

use crate::rtp_seq::{LegSeq, Step};

/// The fields of an RTP fixed header, and where its payload is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtpHeader {
    pub marker: bool,
    pub payload_type: u8,
    pub sequence: u16,
    pub timestamp: u32,
    pub ssrc: u32,
    /// The payload: after the CSRC list and header extension, before any
    /// padding.
    pub payload: core::ops::Range<usize>,
}

/// Read the RTP header of `d`. `None` if it isn't RTP version 2 or its
/// CSRC list, extension or padding run past the datagram.
pub fn parse(d: &[u8]) -> Option<RtpHeader> {
    let [b0, b1, s0, s1, t0, t1, t2, t3, i0, i1, i2, i3, ..] = *d else {
        return None;
    };
    let sequence = u16::from_be_bytes([s0, s1]);
    let timestamp = u32::from_be_bytes([t0, t1, t2, t3]);
    let ssrc = u32::from_be_bytes([i0, i1, i2, i3]);
    if b0 == 0x80 {
        // The usual header: version 2, no padding, extension or CSRCs.
        return Some(RtpHeader {
            marker: b1 & 0x80 != 0,
            payload_type: b1 & 0x7f,
            sequence,
            timestamp,
            ssrc,
            payload: 12..d.len(),
        });
    }
    if b0 >> 6 != 2 {
        return None;
    }
    let mut start = 12 + 4 * usize::from(b0 & 0x0f);
    if b0 & 0x10 != 0 {
        // Extension: 16-bit profile, 16-bit length in 32-bit words.
        let len = d.get(start + 2..start + 4)?;
        start += 4 + 4 * usize::from(u16::from_be_bytes([len[0], len[1]]));
    }
    let mut end = d.len();
    if b0 & 0x20 != 0 {
        let pad = usize::from(*d.last()?);
        if pad == 0 {
            return None;
        }
        end = end.checked_sub(pad)?;
    }
    if start > end {
        return None;
    }
    Some(RtpHeader {
        marker: b1 & 0x80 != 0,
        payload_type: b1 & 0x7f,
        sequence,
        timestamp,
        ssrc,
        payload: start..end,
    })
}

/// The header fields [`RtpTracker`] counts from.
#[derive(Debug, Clone, Copy)]
struct Fields {
    payload_type: u8,
    sequence: u16,
    timestamp: u32,
    ssrc: u32,
}

impl RtpHeader {
    #[inline(always)]
    fn fields(&self) -> Fields {
        Fields {
            payload_type: self.payload_type,
            sequence: self.sequence,
            timestamp: self.timestamp,
            ssrc: self.ssrc,
        }
    }
}

/// What an input's RTP headers said so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RtpStats {
    /// Datagrams with a valid RTP header.
    pub packets: u64,
    /// Sequence numbers that never arrived: counted once the stream is
    /// [`WINDOW`] numbers past them (a late copy can no longer come), at
    /// a restart or SSRC change, or when the input settles
    /// ([`RtpTracker::settle`], after a quiet spell). Never decreases: a
    /// number that arrives late within the window is `reordered`, and
    /// was never counted here.
    pub lost: u64,
    /// A sequence number seen again (within the last [`WINDOW`]).
    pub duplicates: u64,
    /// Arrived after a higher sequence number.
    pub reordered: u64,
    /// The SSRC differs from the previous packet's (a new source).
    pub ssrc_changes: u64,
    /// A sequence number jumped more than [`MAX_DROPOUT`] ahead or
    /// [`MAX_MISORDER`] back, and the next datagram confirmed it (RFC 3550
    /// A.1's `bad_seq`): counting restarts from it, the skipped numbers
    /// are not counted lost. (A confirmed jump of at most [`MAX_DROPOUT`]
    /// is loss.)
    pub resyncs: u64,
    /// Datagrams that aren't RTP version 2 (too short, wrong version, CSRC
    /// list, extension or padding past the end).
    pub malformed: u64,
    /// A jump ahead (or another SSRC) the stream did not confirm with its
    /// next datagram ([`crate::rtp_seq`]): a corrupt header, a stray
    /// sender, or the first datagram of a restart. Nothing else counted.
    pub strays: u64,
    /// A step far back (more than [`MAX_MISORDER`]) the stream did not
    /// confirm: a replayed old datagram. Nothing else counted.
    pub replays: u64,
    /// The latest packet's payload type (0 before any).
    pub payload_type: u8,
    /// The latest SSRC (0 before any).
    pub ssrc: u32,
    /// Interarrival jitter in RTP clock units, times 16 (RFC 3550 A.8).
    pub jitter_x16: u64,
}

impl RtpStats {
    /// The jitter in nanoseconds for a clock of `clock_hz`.
    pub fn jitter_ns(&self, clock_hz: u32) -> u64 {
        jitter_ns(self.jitter_x16, clock_hz)
    }
}

/// Convert a [`RtpStats::jitter_x16`] value to nanoseconds.
pub fn jitter_ns(jitter_x16: u64, clock_hz: u32) -> u64 {
    if clock_hz == 0 {
        return 0;
    }
    let ns = u128::from(jitter_x16) * 1_000_000_000 / (16 * u128::from(clock_hz));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// How many sequence numbers behind the highest one are remembered, to
/// tell a duplicate from a late arrival.
pub const WINDOW: u64 = 128;
/// Largest forward jump counted as loss (RFC 3550 A.1).
pub const MAX_DROPOUT: i64 = 3000;
/// Largest backward step counted as reordering (RFC 3550 A.1).
pub const MAX_MISORDER: i64 = 100;

/// Per-input RTP state: a fixed-size value, created with the flow.
#[derive(Debug, Clone)]
pub struct RtpTracker {
    stats: RtpStats,
    /// Multiplier taking nanoseconds to clock units, as a 32.32 fixed-point.
    units_per_ns_q32: u64,
    /// Where the stream is: the sequence engine decides what each number
    /// is ([`crate::rtp_seq`]).
    seq: LegSeq,
    /// The extended number counting (re)started at: older ones weren't
    /// counted lost, so their late arrival doesn't uncount them.
    base_ext: u64,
    /// Bit `i` set: the highest number (the engine's, [`LegSeq::max`])
    /// minus `i` arrived.
    seen: u128,
    /// `arrival - timestamp` of the previous in-order packet, clock units.
    transit: Option<u32>,
}

impl RtpTracker {
    /// A tracker for a stream whose RTP clock runs at `clock_hz`.
    pub fn new(clock_hz: u32) -> Self {
        Self {
            stats: RtpStats::default(),
            units_per_ns_q32: (u64::from(clock_hz) << 32) / 1_000_000_000,
            seq: LegSeq::default(),
            base_ext: 0,
            seen: 0,
            transit: None,
        }
    }

    pub fn stats(&self) -> &RtpStats {
        &self.stats
    }

    /// The highest sequence number seen and its SSRC (`None` before the
    /// first RTP datagram): where a flow taking over from this input's
    /// flow starts (`Core::take_over` in the data plane).
    pub fn highest(&self) -> Option<(u16, u32)> {
        self.seq
            .synced()
            .then(|| (low16(self.seq.max()), self.stats.ssrc))
    }

    /// Read `d`'s RTP header, arrived at `now_ns`, and count what it says.
    /// Returns the header, `None` (counted malformed) if it isn't RTP.
    #[inline]
    pub fn observe(&mut self, d: &[u8], now_ns: u64) -> Option<RtpHeader> {
        let Some(h) = parse(d) else {
            self.stats.malformed += 1;
            return None;
        };
        self.observe_header(&h, now_ns);
        Some(h)
    }

    /// Count an already parsed header.
    #[inline]
    pub fn observe_header(&mut self, h: &RtpHeader, now_ns: u64) {
        // The usual packet: the same source, the next sequence number.
        // What [`Self::observe_general`] does for a step of one, without
        // its shift by a variable amount and range checks.
        if self.seq.next(h.sequence, h.ssrc) {
            self.stats.packets += 1;
            self.stats.payload_type = h.payload_type;
            // The number leaving the window: lost if it never came.
            self.stats.lost += u64::from(self.seen >> 127 == 0);
            self.seen = self.seen << 1 | 1;
            self.update_jitter(h.timestamp, now_ns);
            return;
        }
        self.observe_general(h.fields(), now_ns);
    }

    /// Count any header: a new source, a gap, a duplicate, a late or
    /// far-off sequence number, or the next one — as the sequence engine
    /// places it ([`LegSeq::check`]). Out of line, and given the fields by
    /// value, so the fast path above stays small and keeps the header in
    /// registers.
    #[inline(never)]
    fn observe_general(&mut self, h: Fields, now_ns: u64) {
        let s = &mut self.stats;
        s.packets += 1;
        s.payload_type = h.payload_type;
        // The highest number before this datagram (the engine moves it).
        let max_ext = self.seq.max();
        match self.seq.check(h.sequence, h.ssrc) {
            Step::Start(ext) => {
                s.ssrc = h.ssrc;
                self.resync(ext);
            }
            Step::Ahead { gap, .. } => {
                let d = gap + 1;
                s.lost += leaving_unseen(self.seen, d);
                self.seen = if d >= 128 { 0 } else { self.seen << d } | 1;
            }
            Step::Behind(ext) => {
                let back = max_ext.saturating_sub(ext);
                if back == 0 {
                    s.duplicates += 1;
                } else if ext < self.base_ext {
                    // Older than where counting started: late, never counted.
                    s.reordered += 1;
                } else if back >= 128 || self.seen & (1u128 << back) != 0 {
                    s.duplicates += 1;
                } else {
                    self.seen |= 1u128 << back;
                    s.reordered += 1;
                }
                return;
            }
            Step::Restart(ext) => {
                // The stream confirmed a jump. One of at most MAX_DROPOUT
                // ahead (same SSRC) is loss, as a step ahead is: the
                // window moves with it and its numbers still missing
                // count lost as they leave it (a late copy of one within
                // the window is reordered, not lost); the jump's first
                // datagram, held a stray until this one confirmed it,
                // arrived.
                let d = i64::from(i16::from_ne_bytes(
                    h.sequence.wrapping_sub(low16(max_ext)).to_ne_bytes(),
                ));
                if h.ssrc == s.ssrc && d > 1 && d <= MAX_DROPOUT + 1 {
                    let d = d.unsigned_abs();
                    s.lost += leaving_unseen(self.seen, d);
                    self.seen = if d >= 128 { 0 } else { self.seen << d } | 0b11;
                    // The engine's numbers moved past every earlier one:
                    // the window's start moves with them.
                    let shift = ext.saturating_sub(d).saturating_sub(max_ext);
                    self.base_ext = self.base_ext.saturating_add(shift);
                } else {
                    // The old numbering's numbers still missing in the
                    // window will not come.
                    s.lost += u64::from(self.seen.count_zeros());
                    if h.ssrc == s.ssrc {
                        s.resyncs += 1;
                    } else {
                        s.ssrc_changes += 1;
                    }
                    s.ssrc = h.ssrc;
                    self.resync(ext);
                }
            }
            Step::Stray => {
                s.strays += 1;
                return;
            }
            Step::Replay => {
                s.replays += 1;
                return;
            }
        }
        self.update_jitter(h.timestamp, now_ns);
    }

    /// The stream has been quiet for a while (the caller's judgement):
    /// count the numbers still missing in the window as lost now, rather
    /// than when (if ever) the stream moves [`WINDOW`] numbers on. One of
    /// them arriving after this is a duplicate. `true` when it counted
    /// any.
    pub fn settle(&mut self) -> bool {
        if !self.seq.synced() {
            return false;
        }
        let missing = self.seen.count_zeros();
        self.stats.lost += u64::from(missing);
        self.seen = u128::MAX;
        missing > 0
    }

    fn resync(&mut self, ext: u64) {
        self.base_ext = ext;
        // Numbers below the start are owed nothing: set, so they never
        // count lost when they leave the window.
        self.seen = u128::MAX;
        self.transit = None;
    }

    /// RFC 3550 §6.4.1: J += (|D| - J) / 16, kept times 16 in integers
    /// (A.8).
    #[inline(always)]
    fn update_jitter(&mut self, timestamp: u32, now_ns: u64) {
        let arrival = arrival_units(now_ns, self.units_per_ns_q32);
        let transit = arrival.wrapping_sub(timestamp);
        if let Some(prev) = self.transit {
            let d = u64::from(
                i32::from_ne_bytes(transit.wrapping_sub(prev).to_ne_bytes()).unsigned_abs(),
            );
            let j = &mut self.stats.jitter_x16;
            *j = (*j + d).saturating_sub((*j + 8) >> 4);
        }
        self.transit = Some(transit);
    }
}

/// Of the window `seen` (bit `i`: the highest number minus `i` arrived), how many
/// numbers leave it unseen when the highest advances by `d`: the top `d`
/// bits that are clear, and, past the window's width, the numbers the
/// jump skips that fall out of it at once.
#[inline]
fn leaving_unseen(seen: u128, d: u64) -> u64 {
    if d >= 128 {
        u64::from(seen.count_zeros()) + (d - 128)
    } else {
        let leaving = u32::try_from(d).unwrap_or(0);
        u64::from(leaving - (seen >> (128 - leaving)).count_ones())
    }
}

/// The low 32 bits of `now_ns` in clock units (`units_per_ns_q32` a
/// 32.32 fixed-point multiplier): only those matter, as the RTP timestamp
/// wraps at 2^32 too. They are bits 32..63 of the product, so the low 64
/// bits of it (a wrapping 64-bit multiply) are enough.
#[inline(always)]
fn arrival_units(now_ns: u64, units_per_ns_q32: u64) -> u32 {
    low32(now_ns.wrapping_mul(units_per_ns_q32) >> 32)
}

#[inline(always)]
fn low16(v: u64) -> u16 {
    u16::try_from(v & 0xffff).unwrap_or(0)
}

#[inline(always)]
fn low32(v: u64) -> u32 {
    u32::try_from(v & 0xffff_ffff).unwrap_or(0)
}

/// Build an RTP datagram (tests, benchmarks, the load generator).
pub fn build(
    out: &mut [u8],
    payload_type: u8,
    sequence: u16,
    timestamp: u32,
    ssrc: u32,
) -> Option<&mut [u8]> {
    let h = out.get_mut(..12)?;
    h[0] = 0x80;
    h[1] = payload_type & 0x7f;
    h[2..4].copy_from_slice(&sequence.to_be_bytes());
    h[4..8].copy_from_slice(&timestamp.to_be_bytes());
    h[8..12].copy_from_slice(&ssrc.to_be_bytes());
    out.get_mut(12..)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(seq: u16, ts: u32, ssrc: u32) -> [u8; 16] {
        let mut b = [0u8; 16];
        let _ = build(&mut b, 33, seq, ts, ssrc);
        b
    }

    fn run(seqs: &[u16]) -> RtpStats {
        let mut t = RtpTracker::new(90_000);
        for (i, &s) in seqs.iter().enumerate() {
            t.observe(&pkt(s, 0, 7), i as u64 * 1_000_000);
        }
        *t.stats()
    }

    /// [`run`], then [`WINDOW`] numbers in order after the highest, so
    /// every number still missing has left the window.
    fn run_flushed(seqs: &[u16]) -> RtpStats {
        let mut t = RtpTracker::new(90_000);
        for (i, &s) in seqs.iter().enumerate() {
            t.observe(&pkt(s, 0, 7), i as u64 * 1_000_000);
        }
        let (top, _) = t.highest().unwrap();
        for k in 1..=u16::try_from(WINDOW).unwrap() {
            t.observe(&pkt(top.wrapping_add(k), 0, 7), 0);
        }
        *t.stats()
    }

    #[test]
    fn settling_counts_what_is_still_missing() {
        let mut t = RtpTracker::new(90_000);
        for (i, s) in [1u16, 2, 5, 6].into_iter().enumerate() {
            t.observe(&pkt(s, 0, 7), i as u64);
        }
        assert_eq!(t.stats().lost, 0);
        assert!(t.settle());
        assert_eq!(t.stats().lost, 2);
        assert!(!t.settle(), "once");
        t.observe(&pkt(7, 0, 7), 10);
        t.observe(&pkt(3, 0, 7), 11);
        assert_eq!((t.stats().lost, t.stats().duplicates), (2, 1));
        // Settled, the window goes on as before.
        t.observe(&pkt(9, 0, 7), 12);
        assert!(t.settle());
        assert_eq!(t.stats().lost, 3);
    }

    #[test]
    fn reordering_never_moves_lost_either_way() {
        let mut order: Vec<u16> = Vec::new();
        for s in 0..3000u16 {
            if s % 10 != 5 || s >= 2950 {
                order.push(s);
            }
            if s >= 55 && (s - 55) % 10 == 0 {
                order.push(s - 50);
            }
        }
        let mut t = RtpTracker::new(90_000);
        let mut lost = 0;
        for (i, &s) in order.iter().enumerate() {
            t.observe(&pkt(s, 0, 7), i as u64);
            assert!(t.stats().lost >= lost, "lost went down at {s}");
            lost = t.stats().lost;
        }
        assert_eq!((t.stats().lost, t.stats().reordered), (0, 295));
    }

    #[test]
    fn highest_is_the_top_number_not_the_latest() {
        let mut t = RtpTracker::new(90_000);
        assert_eq!(t.highest(), None);
        for (i, s) in [65_534u16, 65_535, 1, 0].into_iter().enumerate() {
            t.observe(&pkt(s, 0, 7), i as u64);
        }
        assert_eq!(t.highest(), Some((1, 7)), "wrapped, and 0 came late");
    }

    #[test]
    fn header_fields() {
        let h = parse(&pkt(0x1234, 0xdead_beef, 0x0102_0304)).unwrap();
        assert_eq!(
            (h.payload_type, h.sequence, h.timestamp, h.ssrc, h.payload),
            (33, 0x1234, 0xdead_beef, 0x0102_0304, 12..16)
        );
    }

    #[test]
    fn csrc_extension_and_padding() {
        let mut b = [0u8; 40];
        let _ = build(&mut b, 96, 1, 2, 3);
        b[0] = 0x80 | 0x20 | 0x10 | 2; // padding, extension, 2 CSRCs
        // Extension at 20: profile, length 1 word.
        b[22..24].copy_from_slice(&1u16.to_be_bytes());
        b[39] = 4; // 4 bytes of padding
        assert_eq!(parse(&b).unwrap().payload, 28..36);
    }

    #[test]
    fn malformed_headers() {
        let good = pkt(1, 2, 3);
        assert!(parse(&good[..11]).is_none(), "short");
        let mut v1 = good;
        v1[0] = 0x40;
        assert!(parse(&v1).is_none(), "version 1");
        let mut csrc = good;
        csrc[0] = 0x81; // one CSRC: 16 bytes, no payload left: fine
        assert!(parse(&csrc).is_some());
        csrc[0] = 0x82; // two: past the end
        assert!(parse(&csrc).is_none());
        let mut ext = good;
        ext[0] = 0x90; // extension header at 12..16, length 0
        assert!(parse(&ext).is_some());
        ext[14..16].copy_from_slice(&1u16.to_be_bytes());
        assert!(parse(&ext).is_none(), "extension past the end");
        let mut pad = good;
        pad[0] = 0xa0;
        pad[15] = 0;
        assert!(parse(&pad).is_none(), "zero padding");
        pad[15] = 5;
        assert!(parse(&pad).is_none(), "padding into the header");
        pad[15] = 4;
        assert_eq!(parse(&pad).unwrap().payload, 12..12);
        let mut t = RtpTracker::new(90_000);
        assert!(t.observe(&good[..5], 0).is_none());
        assert_eq!(t.stats().malformed, 1);
        assert_eq!(t.stats().packets, 0);
    }

    #[test]
    fn in_order_is_clean() {
        let s = run(&[1, 2, 3, 4, 5]);
        assert_eq!((s.packets, s.lost, s.duplicates, s.reordered), (5, 0, 0, 0));
    }

    #[test]
    fn gap_counts_lost() {
        let s = run(&[1, 2, 5, 6, 10]);
        assert_eq!(s.lost, 0, "not yet: a late copy may still come");
        let s = run_flushed(&[1, 2, 5, 6, 10]);
        assert_eq!((s.lost, s.reordered), (2 + 3, 0));
    }

    #[test]
    fn wrap_is_not_loss() {
        let s = run(&[65534, 65535, 0, 1]);
        assert_eq!((s.lost, s.duplicates, s.reordered, s.resyncs), (0, 0, 0, 0));
        let s = run_flushed(&[65535, 1]);
        assert_eq!(s.lost, 1);
    }

    #[test]
    fn duplicates() {
        let s = run(&[1, 2, 2, 3, 1, 3]);
        assert_eq!((s.duplicates, s.lost, s.reordered), (3, 0, 0));
    }

    #[test]
    fn late_arrival_is_reordered_not_lost() {
        let s = run(&[1, 2, 4, 3, 5]);
        assert_eq!((s.lost, s.reordered, s.duplicates), (0, 1, 0));
        let s = run(&[1, 2, 4, 3, 3, 5]);
        assert_eq!((s.lost, s.reordered, s.duplicates), (0, 1, 1));
        // Across the wrap.
        let s = run(&[65534, 0, 65535, 1]);
        assert_eq!((s.lost, s.reordered), (0, 1));
    }

    #[test]
    fn before_the_first_packet_is_reordered_only() {
        let s = run(&[10, 9, 11]);
        assert_eq!((s.lost, s.reordered, s.duplicates), (0, 1, 0));
    }

    #[test]
    fn big_jumps_resync_once_confirmed_and_a_lone_one_moves_nothing() {
        // 10 000 is confirmed by 10 001 (a resync); the lone 1 after it is
        // a replay (it used to resync twice).
        let s = run(&[1, 2, 10_000, 10_001, 1, 10_002]);
        assert_eq!((s.lost, s.resyncs, s.replays, s.strays), (0, 1, 1, 1));
        // A lone jump ahead (a corrupt header) moves nothing either.
        let s = run(&[1, 2, 3, 4_098, 4, 5]);
        assert_eq!((s.lost, s.resyncs, s.strays, s.duplicates), (0, 0, 1, 0));
    }

    #[test]
    fn a_replay_of_the_datagram_of_2_s_ago_counts_no_loss() {
        // 1 kpps: the datagram of 2 s ago is 2000 numbers back (issue 26:
        // that leg's lost read 13 998 000 for 17 000 datagrams).
        let mut seqs: Vec<u16> = (0..5000).collect();
        seqs.insert(4000, 2000);
        seqs.extend(5000..17_000);
        let s = run(&seqs);
        assert_eq!((s.lost, s.resyncs, s.replays, s.duplicates), (0, 0, 1, 0));
        assert_eq!(s.packets, 17_001);
    }

    #[test]
    fn a_confirmed_burst_loss_longer_than_a_step_is_loss_not_a_resync() {
        // 200 lost: 301 is a jump (a stray until 302 confirms it).
        let seqs: Vec<u16> = (0..=100).chain(301..400).collect();
        let s = run_flushed(&seqs);
        assert_eq!((s.lost, s.resyncs, s.strays), (200, 0, 1));
        // Numbers of the jumped-over run that come late, within the
        // window, are reordered, not lost (issue 26's probe: a 300 ms
        // gap with every 10th datagram 50 late).
        let late: Vec<u16> = (0..=100)
            .chain(301..320)
            .chain([250, 260, 270])
            .chain(320..400)
            .collect();
        let s = run_flushed(&late);
        assert_eq!((s.lost, s.reordered, s.resyncs), (197, 3, 0));
    }

    #[test]
    fn ssrc_change_restarts_sequence() {
        let mut t = RtpTracker::new(90_000);
        t.observe(&pkt(100, 0, 1), 0);
        t.observe(&pkt(101, 0, 1), 0);
        t.observe(&pkt(5, 0, 2), 0);
        t.observe(&pkt(6, 0, 2), 0);
        let s = t.stats();
        // The new SSRC's first datagram is a stray until its second
        // confirms it.
        assert_eq!((s.ssrc_changes, s.lost, s.ssrc, s.resyncs), (1, 0, 2, 0));
        assert_eq!(s.strays, 1);
    }

    #[test]
    fn jitter_zero_when_paced_and_grows_with_variation() {
        // 90 kHz, one packet per 10 ms = 900 units.
        let mut t = RtpTracker::new(90_000);
        for i in 0..100u16 {
            t.observe(
                &pkt(i, u32::from(i) * 900, 1),
                1_000_000_000 + u64::from(i) * 10_000_000,
            );
        }
        assert!(t.stats().jitter_ns(90_000) < 50_000, "{:?}", t.stats());
        // Alternate 2 ms early/late: |D| = 4 ms = 360 units, J -> 360.
        let mut t = RtpTracker::new(90_000);
        for i in 0..2000u16 {
            let skew = if i % 2 == 0 { 0 } else { 4_000_000 };
            t.observe(
                &pkt(i, u32::from(i) * 900, 1),
                u64::from(i) * 10_000_000 + skew,
            );
        }
        let j = t.stats().jitter_ns(90_000);
        assert!((3_900_000..=4_000_000).contains(&j), "{j}");
    }

    /// The arrival in clock units from the wrapping 64-bit multiply is
    /// the full 128-bit product's bits 32..63, for any time and clock.
    #[test]
    fn arrival_units_is_the_full_product() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for clock_hz in [8_000u32, 48_000, 90_000, 1_000_000, u32::MAX] {
            let q = RtpTracker::new(clock_hz).units_per_ns_q32;
            for _ in 0..10_000 {
                // xorshift: times all over the 64-bit range.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let full = (u128::from(x) * u128::from(q)) >> 32;
                assert_eq!(u128::from(arrival_units(x, q)), full & 0xffff_ffff);
            }
        }
    }

    /// Every arrival (in order, gaps, duplicates, reorders, resyncs, SSRC
    /// changes) counted with the in-order fast path as the general path
    /// alone counts it.
    #[test]
    fn in_order_fast_path_is_the_general_path() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200 {
            let mut t = RtpTracker::new(90_000);
            let mut u = RtpTracker::new(90_000);
            let (mut seq, mut ssrc) = (0u16, 1u32);
            for i in 0..500u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                seq = seq.wrapping_add(match x % 16 {
                    0 => 0,
                    1 => 2,
                    2 => 0u16.wrapping_sub(2),
                    3 => 5000,
                    _ => 1,
                });
                if x % 97 == 0 {
                    ssrc += 1;
                }
                let h = parse(&pkt(seq, (x >> 32) as u32, ssrc)).unwrap();
                let now = i * 1_000_000 + (x >> 40);
                t.observe_header(&h, now);
                u.observe_general(h.fields(), now);
                assert_eq!(t.stats(), u.stats());
                assert_eq!(
                    (t.seq.max(), t.seen, t.transit),
                    (u.seq.max(), u.seen, u.transit)
                );
            }
        }
    }

    #[test]
    fn jitter_conversion() {
        assert_eq!(jitter_ns(16 * 90, 90_000), 1_000_000);
        assert_eq!(jitter_ns(1, 0), 0);
    }
}
