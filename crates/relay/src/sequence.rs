//! The RTP sequence engine: where each leg's stream is, and whether a
//! datagram's number belongs to it. Merge, failover and stream health
//! all ask it, so a stray datagram means the same thing to each.
//!
//! Per leg ([`LegSeq`]) it follows RFC 3550 A.1: a number a little ahead
//! of the leg's highest one ([`MAX_STEP`]) is the next (after a gap), one
//! a little behind ([`MAX_MISORDER`]) a reordered copy or a duplicate;
//! anything else — a jump, a step far back, another SSRC — is not
//! trusted until the leg confirms it (A.1's `bad_seq`: its next datagram
//! continues from it) or, across legs ([`Frame`]), another leg agrees
//! (the number is where the flow's stream is). Until then the datagram
//! is counted ([`Place::Stray`] ahead, [`Place::Replay`] behind) and
//! dropped, and nothing moves: an isolated corrupt or stray datagram
//! never shifts the stream. A confirmed jump is a restart of that leg's
//! numbering.
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

/// Largest step ahead of a leg's highest number taken as its next (the
/// numbers between lost). Larger jumps wait for confirmation: at 1 kpps
/// 64 numbers are 64 ms, within a merge window, so a jump this short
/// opens no gap the window cannot fill.
pub const MAX_STEP: u64 = 64;
/// Largest step behind a leg's highest number taken as a reordered copy
/// or a duplicate (RFC 3550 A.1's `MAX_MISORDER`).
pub const MAX_MISORDER: u64 = 100;
/// Largest lead over the frame's top a leg may join with when the frame
/// has just restarted on another leg while this one had already moved to
/// the new numbering (the leading copy of a skewed pair after an encoder
/// restart). Any other leg joins only within [`MAX_STEP`]: a lone leg's
/// confirmed jump never advances a frame other legs carry.
pub const MAX_LEAD: u64 = 2048;
/// A leg's or the frame's first extended number: room below it for a
/// step back from the first datagram.
pub const EXT_BASE: u64 = 1 << 32;

/// The 16-bit number `seq` nearest to extended number `near`.
#[inline(always)]
pub fn extend(near: u64, seq: u16) -> u64 {
    let low = u16::try_from(near & 0xffff).unwrap_or(0);
    let d = i64::from(i16::from_ne_bytes(seq.wrapping_sub(low).to_ne_bytes()));
    near.saturating_add_signed(d)
}

/// What a leg's datagram is to the leg's own stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The leg's first datagram: its numbering starts here.
    Start(u64),
    /// Ahead of the highest number by at most [`MAX_STEP`]; `gap`
    /// numbers skipped before it.
    Ahead { ext: u64, gap: u64 },
    /// At or behind the highest number by at most [`MAX_MISORDER`]
    /// (a reordered datagram or a duplicate: the caller tells which).
    Behind(u64),
    /// A jump (or new SSRC) the leg confirmed: its numbering restarts.
    Restart(u64),
    /// A jump ahead (or another SSRC) not confirmed yet: dropped.
    Stray,
    /// A step far back not confirmed as a restart: dropped.
    Replay,
}

/// One leg's stream (RFC 3550 A.1, extended numbers).
#[derive(Debug, Clone, Copy, Default)]
pub struct LegSeq {
    synced: bool,
    ssrc: u32,
    /// The highest number, extended.
    max: u64,
    /// A jump on probation: the number and SSRC that confirm it.
    cand: Option<(u16, u32)>,
}

impl LegSeq {
    /// Whether the leg has a stream yet.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Its highest number (extended) and SSRC, once synced.
    pub fn highest(&self) -> Option<(u64, u32)> {
        self.synced.then_some((self.max, self.ssrc))
    }

    /// Place `seq` of `ssrc` in the leg's stream.
    #[inline]
    pub fn check(&mut self, seq: u16, ssrc: u32) -> Step {
        if self.synced && ssrc == self.ssrc {
            let low = u16::try_from(self.max & 0xffff).unwrap_or(0);
            let d = i64::from(i16::from_ne_bytes(seq.wrapping_sub(low).to_ne_bytes()));
            if d > 0 && d.unsigned_abs() <= MAX_STEP {
                let d = d.unsigned_abs();
                self.max += d;
                self.cand = None;
                return Step::Ahead {
                    ext: self.max,
                    gap: d - 1,
                };
            }
            if d <= 0 && d.unsigned_abs() <= MAX_MISORDER {
                return Step::Behind(self.max - d.unsigned_abs());
            }
        }
        self.jump(seq, ssrc)
    }

    /// Anything but the next or a reordered number: start, confirm, or
    /// put on probation.
    #[inline(never)]
    fn jump(&mut self, seq: u16, ssrc: u32) -> Step {
        if !self.synced {
            self.synced = true;
            self.ssrc = ssrc;
            self.max = EXT_BASE + u64::from(seq);
            self.cand = None;
            return Step::Start(self.max);
        }
        if self.cand == Some((seq, ssrc)) {
            return Step::Restart(self.restart(seq, ssrc));
        }
        let back = ssrc == self.ssrc
            && i16::from_ne_bytes(
                seq.wrapping_sub(u16::try_from(self.max & 0xffff).unwrap_or(0))
                    .to_ne_bytes(),
            ) < 0;
        self.cand = Some((seq.wrapping_add(1), ssrc));
        if back { Step::Replay } else { Step::Stray }
    }

    /// The leg's numbering restarts at `seq` of `ssrc`: its extended
    /// number is past every earlier one.
    pub fn restart(&mut self, seq: u16, ssrc: u32) -> u64 {
        self.synced = true;
        self.ssrc = ssrc;
        self.max = ((self.max >> 16) + 2) << 16 | u64::from(seq);
        self.cand = None;
        self.max
    }

    /// The leg joins a stream another leg carries: `seq` of `ssrc` is the
    /// leg's new highest number (its extension follows its own).
    fn rejoin(&mut self, seq: u16, ssrc: u32) {
        if self.synced && ssrc == self.ssrc {
            let e = extend(self.max, seq);
            self.max = self.max.max(e);
        } else {
            self.restart(seq, ssrc);
        }
        self.cand = None;
    }
}

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
            .filter(|(_, l)| l.synced)
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
                if let Some(l) = self.legs.get_mut(leg) {
                    l.rejoin(seq, ssrc);
                }
                self.joined |= bit;
                self.leaders &= !bit;
                self.at(leg, ext, seq, ssrc, now)
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
                let held = (0..4).any(|i| {
                    self.joined & (1 << i) != 0 && self.last_ns[i].saturating_add(hold_ns) > now
                });
                if held {
                    // Behind the frame (a late leg) or elsewhere.
                    let back = ext < self.top && self.top - ext < 1 << 14;
                    return if back { Place::Behind } else { Place::Apart };
                }
                // No leg carries the frame's numbering any more: this
                // leg's (confirmed) numbering becomes the flow's; legs
                // already in a numbering of their own may join it ahead.
                self.leaders = self.detached(4) & !bit;
                self.top = ((self.top >> 16) + 2) << 16 | u64::from(seq);
                self.top_seq = seq;
                self.top_ssrc = ssrc;
                self.joined = bit;
                self.last_ns[leg & 3] = now;
                Place::Restart(self.top)
            }
        }
    }

    #[inline(always)]
    fn at(&mut self, leg: usize, ext: u64, seq: u16, ssrc: u32, now: u64) -> Place {
        self.last_ns[leg & 3] = now;
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
    fn a_leg_follows_a1_with_probation_for_jumps() {
        let mut l = LegSeq::default();
        assert_eq!(l.check(10, 1), Step::Start(EXT_BASE + 10));
        assert_eq!(
            l.check(11, 1),
            Step::Ahead {
                ext: EXT_BASE + 11,
                gap: 0
            }
        );
        assert_eq!(
            l.check(15, 1),
            Step::Ahead {
                ext: EXT_BASE + 15,
                gap: 3
            }
        );
        assert_eq!(l.check(13, 1), Step::Behind(EXT_BASE + 13));
        // A stray jump: dropped, the stream goes on.
        assert_eq!(l.check(2015, 1), Step::Stray);
        assert_eq!(
            l.check(16, 1),
            Step::Ahead {
                ext: EXT_BASE + 16,
                gap: 0
            }
        );
        // A replay far back: the same.
        assert_eq!(l.check(65_000, 1), Step::Replay);
        assert_eq!(
            l.check(17, 1).clone(),
            Step::Ahead {
                ext: EXT_BASE + 17,
                gap: 0
            }
        );
        // A confirmed jump back (a restart keeping the SSRC).
        assert_eq!(l.check(5000, 1), Step::Stray);
        let Step::Restart(e) = l.check(5001, 1) else {
            panic!("confirmed")
        };
        assert!(e > EXT_BASE + 17, "past everything before");
        assert_eq!(e & 0xffff, 5001);
        // A new SSRC: confirmed by its next datagram.
        assert_eq!(l.check(7, 2), Step::Stray);
        assert!(matches!(l.check(8, 2), Step::Restart(_)));
        // Wrap.
        let mut l = LegSeq::default();
        l.check(65_535, 1);
        assert!(matches!(l.check(0, 1), Step::Ahead { gap: 0, .. }));
    }

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
}
