//! The RTP sequence engine: where each leg's stream is, and whether a
//! datagram's number belongs to it. Merge, failover and stream health
//! all ask it, so a stray datagram means the same thing to each.
//!
//! Per leg ([`LegSeq`], from [`mcrelay_wire::rtp_seq`], where stream
//! health's RTP tracker uses the same engine) it follows RFC 3550 A.1: a
//! number a little ahead of the leg's highest one ([`MAX_STEP`]) is the
//! next (after a gap), one a little behind ([`MAX_MISORDER`]) a
//! reordered copy or a duplicate; anything else — a jump, a step far
//! back, another SSRC — is not trusted until the leg confirms it (A.1's
//! `bad_seq`: its next datagram continues from it) or, across legs
//! ([`Frame`]), another leg agrees (the number is where the flow's
//! stream is). Until then the datagram is counted ([`Place::Stray`]
//! ahead, [`Place::Replay`] behind) and dropped, and nothing moves: an
//! isolated corrupt or stray datagram never shifts the stream. A
//! confirmed jump is a restart of that leg's numbering.
//!
//! Across legs ([`Frame`]) the flow follows one numbering, the frame: a
//! leg whose numbers are the frame's (whatever its SSRC) is in it; a leg
//! whose confirmed numbering is elsewhere is detached and its datagrams
//! dropped ([`Place::Behind`] or [`Place::Apart`]), never forwarded
//! beside the frame's. The frame restarts on a leg's confirmed numbering
//! only when no leg in the frame delivered within the hold time (the
//! merge window): an encoder restart reaches the output once the last
//! leg carrying the old numbering moved on, an independent encoder on a
//! second leg never does while the first lives.
//!
//! Numbers are extended to 64 bits: a leg's grow by its steps and jump
//! past everything before at a restart, the frame's likewise, so callers
//! index their state by them without wrap-around. Pure, fixed size, no
//! allocation, a few compares per datagram.

pub use mcrelay_wire::rtp_seq::{EXT_BASE, LegSeq, MAX_MISORDER, MAX_STEP, Step, extend};

/// Largest lead over the frame's top a leg may join with when the frame
/// has just restarted on another leg while this one had already moved to
/// the new numbering (the leading copy of a skewed pair after an encoder
/// restart). Any other leg joins only within [`MAX_STEP`]: a lone leg's
/// confirmed jump never advances a frame other legs carry.
pub const MAX_LEAD: u64 = 2048;
/// Where a datagram goes in a flow's numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// In the frame, at this extended number (above the previous top
    /// when it advances the frame).
    At(u64),
    /// The frame restarts at this extended number (past every earlier
    /// one) with this datagram.
    Restart(u64),
    /// A jump ahead of its leg not confirmed: dropped, nothing moved.
    Stray,
    /// A step far back on its leg not confirmed: dropped, nothing moved.
    Replay,
    /// Its leg is behind the frame by more than the caller keeps (later
    /// than the window): dropped, late.
    Behind,
    /// Its leg's numbering is not the frame's: dropped.
    Apart,
}

/// The legs of a flow and the numbering it follows.
#[derive(Debug, Clone)]
pub struct Frame {
    started: bool,
    /// The frame's highest number, extended, and its 16-bit value.
    top: u64,
    top_seq: u16,
    legs: [LegSeq; 4],
    /// Bit per leg: its numbering is the frame's.
    joined: u8,
    /// Each leg's latest datagram that was in the frame.
    last_ns: [u64; 4],
    /// Bit per leg: it had confirmed a numbering of its own when the
    /// frame last restarted, so it may join ahead of the top by up to
    /// [`MAX_LEAD`].
    leaders: u8,
    /// The SSRC of the datagram that last advanced the top.
    top_ssrc: u32,
    /// The frame (re)started on a datagram nothing confirmed (the flow's
    /// first, or the first after every leg was silent past the hold
    /// time): until a second datagram lands in it, a numbering a leg
    /// confirms elsewhere replaces it at once.
    provisional: bool,
}

impl Default for Frame {
    fn default() -> Self {
        Self::new()
    }
}

impl Frame {
    pub fn new() -> Self {
        Self {
            started: false,
            top: EXT_BASE,
            top_seq: 0,
            legs: [LegSeq::default(); 4],
            joined: 0,
            last_ns: [0; 4],
            leaders: 0,
            top_ssrc: 0,
            provisional: false,
        }
    }

    /// The SSRC of the datagram that last advanced the top.
    pub fn top_ssrc(&self) -> u32 {
        self.top_ssrc
    }

    /// Bit per leg: its numbering is the frame's.
    pub fn joined(&self) -> u8 {
        self.joined
    }

    /// The frame's highest number (extended) and its 16-bit value;
    /// `None` before the first datagram.
    pub fn top(&self) -> Option<(u64, u16)> {
        self.started.then_some((self.top, self.top_seq))
    }

    /// The legs whose numbering is not the frame's, among `0..legs`
    /// (bit per leg; a leg that never delivered is not counted).
    pub fn detached(&self, legs: u8) -> u8 {
        let all = u8::try_from((1u16 << legs.min(4)) - 1).unwrap_or(0x0f);
        let synced = self
            .legs
            .iter()
            .enumerate()
            .filter(|(_, l)| l.synced())
            .fold(0u8, |m, (i, _)| m | 1 << i);
        synced & !self.joined & all
    }

    /// Start the frame at `seq` (a flow replacing one that kept no
    /// frame): its extended number.
    pub fn seed(&mut self, seq: u16, ssrc: u32) -> u64 {
        self.started = true;
        self.top_ssrc = ssrc;
        self.top = ((self.top >> 16) + 2) << 16 | u64::from(seq);
        self.top_seq = seq;
        self.joined = 0;
        self.top
    }

    /// Place datagram `seq` of `ssrc` from leg `leg` at `now`. `low`: the
    /// lowest extended number the caller still keeps state for (a number
    /// below it is behind the frame); `hold_ns`: how long a leg in the
    /// frame keeps it after its latest datagram against a restart.
    #[inline]
    pub fn place(
        &mut self,
        leg: usize,
        seq: u16,
        ssrc: u32,
        now: u64,
        low: u64,
        hold_ns: u64,
    ) -> Place {
        let bit = 1u8 << (leg & 3);
        let Some(l) = self.legs.get_mut(leg) else {
            return Place::Apart;
        };
        let step = l.check(seq, ssrc);
        // The usual datagram: a leg in the frame, a step in its stream.
        if self.joined & bit != 0
            && let Step::Ahead { .. } | Step::Behind(_) = step
        {
            let ext = extend(self.top, seq);
            if ext < low {
                return Place::Behind;
            }
            return self.at(leg, ext, seq, ssrc, now);
        }
        self.place_slow(leg, bit, seq, ssrc, step, now, low, hold_ns)
    }

    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn place_slow(
        &mut self,
        leg: usize,
        bit: u8,
        seq: u16,
        ssrc: u32,
        step: Step,
        now: u64,
        low: u64,
        hold_ns: u64,
    ) -> Place {
        if !self.started {
            self.started = true;
            self.top = EXT_BASE + u64::from(seq);
            self.top_seq = seq;
            self.top_ssrc = ssrc;
            self.joined = bit;
            self.last_ns[leg & 3] = now;
            self.provisional = true;
            return Place::Restart(self.top);
        }
        let ext = extend(self.top, seq);
        // Another leg agrees: the number is where the frame is (from the
        // oldest one kept to a step past the top, a lead for a leg whose
        // own numbering is confirmed), whatever the SSRC.
        let lead = match step {
            Step::Ahead { .. } | Step::Behind(_) | Step::Restart(_) if self.leaders & bit != 0 => {
                MAX_LEAD
            }
            _ => MAX_STEP,
        };
        let agrees = ext >= low && ext <= self.top + lead;
        match step {
            Step::Stray | Step::Replay if agrees => {
                // The leg takes the frame's numbering. Its own highest
                // number stays only where it is the frame's too (a
                // reordered copy from far back); one elsewhere (a
                // numbering of its own it had confirmed, or stray
                // continuations of one) is given up, so what continues
                // it stays apart.
                let (lo, hi) = (low, self.top + MAX_STEP);
                if let Some(l) = self.legs.get_mut(leg) {
                    let keep = l
                        .highest()
                        .map(|(max, _)| extend(self.top, u16::try_from(max & 0xffff).unwrap_or(0)))
                        .is_some_and(|e| e >= lo && e <= hi);
                    l.rejoin(seq, ssrc, keep);
                }
                self.joined |= bit;
                self.leaders &= !bit;
                self.at(leg, ext, seq, ssrc, now)
            }
            Step::Stray | Step::Replay if !self.held(now, hold_ns) => {
                // Every leg silent past the hold: nothing to protect, the
                // stream starts afresh here as at the flow's first
                // datagram (an encoder restarted after a pause loses
                // nothing), provisionally.
                if let Some(l) = self.legs.get_mut(leg) {
                    l.restart(seq, ssrc);
                }
                self.restart_at(leg, seq, ssrc, now);
                self.provisional = true;
                Place::Restart(self.top)
            }
            Step::Stray => Place::Stray,
            Step::Replay => Place::Replay,
            _ if agrees => {
                self.joined |= bit;
                self.leaders &= !bit;
                self.at(leg, ext, seq, ssrc, now)
            }
            Step::Restart(_) | Step::Start(_) | Step::Ahead { .. } | Step::Behind(_) => {
                self.joined &= !bit;
                if !self.provisional && self.held(now, hold_ns) {
                    // Behind the frame (a late leg) or elsewhere.
                    let back = ext < self.top && self.top - ext < 1 << 14;
                    return if back { Place::Behind } else { Place::Apart };
                }
                // No leg carries the frame's numbering any more: this
                // leg's (confirmed) numbering becomes the flow's; legs
                // already in a numbering of their own may join it ahead.
                self.leaders = self.detached(4) & !bit;
                self.restart_at(leg, seq, ssrc, now);
                self.provisional = false;
                Place::Restart(self.top)
            }
        }
    }

    /// Whether a leg in the frame delivered within `hold_ns` of `now`.
    fn held(&self, now: u64, hold_ns: u64) -> bool {
        (0..4).any(|i| self.joined & (1 << i) != 0 && self.last_ns[i].saturating_add(hold_ns) > now)
    }

    /// The frame restarts at `seq` of `ssrc` (past every earlier number),
    /// carried by `leg` alone.
    fn restart_at(&mut self, leg: usize, seq: u16, ssrc: u32, now: u64) {
        self.top = ((self.top >> 16) + 2) << 16 | u64::from(seq);
        self.top_seq = seq;
        self.top_ssrc = ssrc;
        self.joined = 1 << (leg & 3);
        self.last_ns[leg & 3] = now;
    }

    #[inline(always)]
    fn at(&mut self, leg: usize, ext: u64, seq: u16, ssrc: u32, now: u64) -> Place {
        self.last_ns[leg & 3] = now;
        self.provisional = false;
        if ext > self.top {
            self.top = ext;
            self.top_seq = seq;
            self.top_ssrc = ssrc;
        }
        Place::At(ext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_takes_an_agreeing_leg_and_keeps_a_disagreeing_one_apart() {
        let mut f = Frame::new();
        let hold = 50;
        assert!(matches!(f.place(0, 100, 1, 0, 0, hold), Place::Restart(_)));
        let (top, _) = f.top().expect("started");
        let low = top - 100;
        // Another SSRC, the same numbering: joins at once.
        assert_eq!(f.place(1, 101, 2, 1, low, hold), Place::At(top + 1));
        // Numbered far off: apart while leg 0 lives.
        f.place(2, 40_000, 3, 2, low, hold);
        assert_eq!(f.place(2, 40_001, 3, 3, low, hold), Place::Apart);
        assert_eq!(f.detached(3), 0b100);
        // Legs 0 and 1 silent past the hold: leg 2's numbering takes over.
        assert!(matches!(
            f.place(2, 40_002, 3, 100, low, hold),
            Place::Restart(_)
        ));
        assert_eq!(f.detached(3), 0b011);
    }

    #[test]
    fn after_every_leg_was_silent_past_the_hold_the_stream_starts_afresh_at_once() {
        let mut f = Frame::new();
        let hold = 50;
        f.place(0, 4999, 1, 0, 0, hold);
        let (top, _) = f.top().expect("started");
        // Within the hold a step far back is a replay, dropped.
        assert_eq!(f.place(0, 0, 1, 10, top - 100, hold), Place::Replay);
        // Past it (an encoder restarted from 0 after a pause) the first
        // datagram restarts the frame: nothing of the new stream lost.
        let Place::Restart(start) = f.place(0, 0, 1, 100, top - 100, hold) else {
            panic!("a restart")
        };
        assert_eq!(f.place(0, 1, 1, 101, start, hold), Place::At(start + 1));
        // A stray alone after the pause starts a provisional frame, which
        // the real stream, once its leg confirms it, replaces at once.
        let mut f = Frame::new();
        let low = |f: &Frame| f.top().map_or(0, |(top, _)| top - 4095);
        f.place(0, 100, 1, 0, 0, hold);
        assert!(matches!(
            f.place(0, 30_000, 1, 200, low(&f), hold),
            Place::Restart(_)
        ));
        assert_eq!(f.place(0, 101, 1, 201, low(&f), hold), Place::Replay);
        assert!(matches!(
            f.place(0, 102, 1, 202, low(&f), hold),
            Place::Restart(_)
        ));
        let (_, seq) = f.top().expect("started");
        assert_eq!(seq, 102);
    }
}
