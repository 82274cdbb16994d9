//! The per-leg half of the RTP sequence engine (RFC 3550 A.1 with 64-bit
//! extended numbers): where one input's RTP stream is, and whether a
//! datagram's number belongs to it. A number a little ahead of the
//! highest one ([`MAX_STEP`]) is the next (after a gap), one a little
//! behind ([`MAX_MISORDER`]) a reordered copy or a duplicate; anything
//! else — a jump, a step far back, another SSRC — is not trusted until
//! the input confirms it (A.1's `bad_seq`: its next datagram continues
//! from it). Until then the datagram is a [`Step::Stray`] (ahead, or
//! another SSRC) or a [`Step::Replay`] (far behind) and nothing moves, so
//! an isolated corrupt or stray datagram never shifts the stream.
//!
//! Stream health ([`crate::rtp::RtpTracker`]) uses it per input; the
//! relay core's `mcrelay_relay::sequence` builds the multi-leg frame that merge
//! and failover follow on it (it lives here, below the core, so the
//! health tracker in this crate and the core share one engine). Pure,
//! fixed size, no allocation, a few compares per datagram.

/// Largest step ahead of a leg's highest number taken as its next (the
/// numbers between lost). Larger jumps wait for confirmation: at 1 kpps
/// 64 numbers are 64 ms, within a merge window, so a jump this short
/// opens no gap the window cannot fill.
pub const MAX_STEP: u64 = 64;
/// Largest step behind a leg's highest number taken as a reordered copy
/// or a duplicate (RFC 3550 A.1's `MAX_MISORDER`).
pub const MAX_MISORDER: u64 = 100;
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
#[derive(Debug, Clone, Copy)]
pub struct LegSeq {
    synced: bool,
    ssrc: u32,
    /// The highest number, extended.
    max: u64,
    /// The number after the highest, as a `u32` ([`NONE`] before the
    /// first datagram, which no 16-bit number equals): the fast path's
    /// one compare.
    next: u32,
    /// A jump on probation: the number and SSRC that confirm it, valid
    /// while the highest number is still `cand_max` (the stream moving
    /// on ends the probation without a store on the fast path).
    cand: Option<(u16, u32)>,
    cand_max: u64,
}

/// [`LegSeq::next`]'s value before the first datagram.
const NONE: u32 = 1 << 16;

impl Default for LegSeq {
    fn default() -> Self {
        Self {
            synced: false,
            ssrc: 0,
            max: 0,
            next: NONE,
            cand: None,
            cand_max: 0,
        }
    }
}

impl LegSeq {
    /// Whether the leg has a stream yet.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Its highest number, extended (0 before the first datagram).
    #[inline(always)]
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Its highest number (extended) and SSRC, once synced.
    pub fn highest(&self) -> Option<(u64, u32)> {
        self.synced.then_some((self.max, self.ssrc))
    }

    /// The usual datagram: the same SSRC and the number after the
    /// highest. `true` (and the leg moved on) when it is; otherwise
    /// nothing changed and [`Self::check`] says what it is.
    #[inline(always)]
    pub fn next(&mut self, seq: u16, ssrc: u32) -> bool {
        if u32::from(seq) == self.next && ssrc == self.ssrc {
            self.max += 1;
            self.next = u32::from(seq.wrapping_add(1));
            return true;
        }
        false
    }

    /// The highest number is now `max`.
    #[inline(always)]
    fn set_max(&mut self, max: u64) {
        self.max = max;
        self.next = u32::from(u16::try_from(max.wrapping_add(1) & 0xffff).unwrap_or(0));
    }

    /// Place `seq` of `ssrc` in the leg's stream.
    #[inline]
    pub fn check(&mut self, seq: u16, ssrc: u32) -> Step {
        if self.synced && ssrc == self.ssrc {
            let low = u16::try_from(self.max & 0xffff).unwrap_or(0);
            let d = i64::from(i16::from_ne_bytes(seq.wrapping_sub(low).to_ne_bytes()));
            if d > 0 && d.unsigned_abs() <= MAX_STEP {
                let d = d.unsigned_abs();
                self.set_max(self.max + d);
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
            self.set_max(EXT_BASE + u64::from(seq));
            self.cand = None;
            return Step::Start(self.max);
        }
        if self.cand == Some((seq, ssrc)) && self.cand_max == self.max {
            return Step::Restart(self.restart(seq, ssrc));
        }
        let back = ssrc == self.ssrc
            && i16::from_ne_bytes(
                seq.wrapping_sub(u16::try_from(self.max & 0xffff).unwrap_or(0))
                    .to_ne_bytes(),
            ) < 0;
        self.cand = Some((seq.wrapping_add(1), ssrc));
        self.cand_max = self.max;
        if back { Step::Replay } else { Step::Stray }
    }

    /// The leg's numbering restarts at `seq` of `ssrc`: its extended
    /// number is past every earlier one.
    pub fn restart(&mut self, seq: u16, ssrc: u32) -> u64 {
        self.synced = true;
        self.ssrc = ssrc;
        self.set_max(((self.max >> 16) + 2) << 16 | u64::from(seq));
        self.cand = None;
        self.max
    }

    /// The leg joins a stream another leg carries at `seq` of `ssrc`.
    /// With `keep_max` (its highest number is in that stream too) the
    /// highest of the two stays; otherwise `seq` is its new highest
    /// number, whatever the leg had reached.
    pub fn rejoin(&mut self, seq: u16, ssrc: u32, keep_max: bool) {
        if keep_max && self.synced && ssrc == self.ssrc {
            let e = extend(self.max, seq);
            self.set_max(self.max.max(e));
        } else {
            self.restart(seq, ssrc);
        }
        self.cand = None;
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
}
