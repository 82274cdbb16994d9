//! An output that another flow sent to until now (a reload that moved it
//! to this flow: `spread` or `core` changed, or the flow replaced in place)
//! resumes after the last RTP sequence number its predecessor relayed:
//! the new flow's sockets were joined before the old one stopped (make
//! before break), so what they queued in the overlap starts with numbers
//! the output already has. Each such number is skipped for that output;
//! the first number past the mark ends the guard, and from then on the
//! output costs one `is_none` per datagram, as before.
//!
//! Bounds: only a number within [`SPAN`] behind the mark (or at it) of
//! the same SSRC is skipped; anything else — a new SSRC, a number further
//! back (a sender restarted its numbering) or not RTP at all — is sent,
//! and only an RTP datagram past the mark ends the guard.

use std::cell::Cell;

use super::redundancy::SPAN;

/// Where an output resumes: after `seq` of stream `ssrc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Resume {
    pub(super) seq: u16,
    pub(super) ssrc: u32,
}

/// What a resuming output does with one datagram.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Send it; the guard stays (not RTP: it says nothing of the mark).
    #[default]
    Pass,
    /// The output already has it: not sent to this output.
    Skip,
    /// Send it; it is past the mark (or another stream), the guard ends.
    PassAndEnd,
}

/// The verdict of `mark` on datagram `bytes`.
pub(super) fn verdict(mark: Resume, bytes: &[u8]) -> Verdict {
    let Some(h) = mcrelay_wire::rtp::parse(bytes) else {
        return Verdict::Pass;
    };
    if h.ssrc != mark.ssrc {
        return Verdict::PassAndEnd;
    }
    let behind = mark.seq.wrapping_sub(h.sequence);
    if u64::from(behind) < SPAN {
        Verdict::Skip
    } else {
        Verdict::PassAndEnd
    }
}

/// An output's guard and the verdict on the datagram being admitted
/// (set by [`Guard::admits`], read by the enqueue that follows it).
#[derive(Debug, Default)]
pub(super) struct Guard {
    pub(super) mark: Option<Resume>,
    verdict: Cell<Verdict>,
}

impl Guard {
    pub(super) fn new(mark: Option<(u16, u32)>) -> Self {
        Self {
            mark: mark.map(|(seq, ssrc)| Resume { seq, ssrc }),
            verdict: Cell::default(),
        }
    }

    /// `false` when the output already has this datagram. Decided once
    /// per datagram, before the enqueue, which reads it back
    /// ([`Guard::take`]).
    #[inline(always)]
    pub(super) fn admits(&self, bytes: &[u8]) -> bool {
        match self.mark {
            None => true,
            Some(mark) => self.decide(mark, bytes),
        }
    }

    #[cold]
    #[inline(never)]
    fn decide(&self, mark: Resume, bytes: &[u8]) -> bool {
        let v = verdict(mark, bytes);
        self.verdict.set(v);
        v != Verdict::Skip
    }

    /// At the enqueue of the datagram [`Guard::admits`] just judged:
    /// `false` to skip it; a datagram past the mark ends the guard.
    #[inline(always)]
    pub(super) fn take(&mut self) -> bool {
        if self.mark.is_none() {
            return true;
        }
        match self.verdict.get() {
            Verdict::Skip => false,
            Verdict::Pass => true,
            Verdict::PassAndEnd => {
                self.mark = None;
                true
            }
        }
    }

    /// Set (or end) the mark: the output resumes after `mark`.
    pub(super) fn set(&mut self, mark: Option<(u16, u32)>) {
        *self = Self::new(mark);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rtp(seq: u16, ssrc: u32) -> Vec<u8> {
        let mut d = vec![0u8; 40];
        let _ = mcrelay_wire::rtp::build(&mut d, 96, seq, 0, ssrc);
        d
    }

    #[test]
    fn numbers_up_to_the_mark_are_skipped_and_the_next_ends_the_guard() {
        let mut g = Guard::new(Some((100, 7)));
        for seq in [90, 99, 100] {
            assert!(!g.admits(&rtp(seq, 7)), "{seq}");
            assert!(!g.take());
        }
        // Not RTP: sent, the guard stays.
        assert!(g.admits(b"plain"));
        assert!(g.take());
        assert!(!g.admits(&rtp(100, 7)));
        assert!(!g.take());
        assert!(g.admits(&rtp(101, 7)));
        assert!(g.take());
        assert_eq!(g.mark, None);
        // Over: even an old number goes (the network reordered it).
        assert!(g.admits(&rtp(95, 7)));
        assert!(g.take());
    }

    #[test]
    fn the_mark_wraps_and_is_bounded() {
        // Across the wrap: 65 530 is before 3.
        let mut g = Guard::new(Some((3, 1)));
        assert!(!g.admits(&rtp(65_530, 1)));
        assert!(!g.take());
        assert!(g.admits(&rtp(4, 1)));
        assert!(g.take());
        // Further back than SPAN: a restarted sender, sent.
        let span = u16::try_from(SPAN).expect("span");
        let mut g = Guard::new(Some((50_000, 1)));
        assert!(!g.admits(&rtp(50_000 - (span - 1), 1)));
        assert!(g.admits(&rtp(50_000 - span, 1)));
        assert!(g.take());
        assert_eq!(g.mark, None);
        // Another SSRC: a new stream, sent.
        let mut g = Guard::new(Some((10, 1)));
        assert!(g.admits(&rtp(5, 2)));
        assert!(g.take());
        assert_eq!(g.mark, None);
    }
}
