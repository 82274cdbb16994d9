//! SMPTE 2022-7 merge of a flow's legs: each RTP sequence number is
//! forwarded once, the first copy to arrive from any leg; later copies
//! are duplicates.
//!
//! State per flow, allocated when the flow is added: a record per
//! sequence number for the last [`SPAN`] numbers (which legs delivered
//! it within the window, whether it was sent, held or skipped, and since
//! when it is expected), and, with a delay, a hold of as many buffer
//! slots. A number is expected from the moment it or a higher one first
//! arrives.
//!
//! - No delay: a new number is forwarded at once; one a leg delivers
//!   after a higher number was forwarded leaves late (by at most the
//!   legs' skew).
//! - Delay `d`: the next number in sequence leaves as soon as it is
//!   there; numbers after a gap are held until the gap is filled or has
//!   been missing for `d` (then it is skipped), so the output is in
//!   sequence order. A copy of a number already passed (skipped) is
//!   `late`. When a number arrives [`SPAN`] or more past the oldest one
//!   still held back, the hold is full: the numbers it pushes out leave
//!   at once, missing ones skipped early (`hold_overflows`).
//! - The window `w`: once a number has been expected for `w` (or falls
//!   out of the span), it is accounted: never forwarded = `lost`;
//!   forwarded, but not every leg delivered it = `recovered`. A copy
//!   after that is a duplicate if its number was sent, else late.
//! - An SSRC change, or a number [`SPAN`] or more away from the highest
//!   one, restarts the state (`resets`): held packets leave in order,
//!   the open window is not accounted, and the stream starts anew at
//!   that number. Numbers just below where a stream starts are taken
//!   when no delay is set (a leg behind the first one), late otherwise.
//!
//! Work per datagram: the RTP header read, a record update, and the
//! numbers its arrival newly covers (at most [`SPAN`], one in a steady
//! stream); no allocation.

use mcrelay_pool::Buffer;

use super::{LegId, SPAN};
use crate::counters::RedundancyCounters;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not yet forwarded.
    Missing,
    /// In the hold, waiting for its turn.
    Held,
    /// Forwarded.
    Sent,
    /// Passed over in sequence order without having arrived.
    Skipped,
    /// Below where the stream (re)started: not accounted.
    Before,
}

#[derive(Debug, Clone, Copy)]
struct Record {
    /// When this number was first expected.
    since_ns: u64,
    /// The restart it belongs to ([`Merge::epoch`]); any other value
    /// reads as [`State::Before`].
    epoch: u32,
    /// Legs that delivered it while its window was open (bit per leg).
    legs: u8,
    state: State,
}

const EMPTY: Record = Record {
    since_ns: 0,
    epoch: 0,
    legs: 0,
    state: State::Before,
};

/// What a datagram's sequence number makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not forwarded yet: this copy goes (its extended number).
    New(u64),
    /// Already forwarded or held.
    Duplicate,
    /// Its turn has passed without it.
    Late,
}

/// One flow's merge state.
#[derive(Debug)]
pub(crate) struct Merge {
    delay_ns: u64,
    window_ns: u64,
    /// Every leg's bit.
    all_legs: u8,
    /// The stream's SSRC; `None` before its first datagram.
    ssrc: Option<u32>,
    /// Restarts so far: tells this stream's records from older ones.
    epoch: u32,
    /// The highest number seen, extended past 16 bits, and its RTP value.
    top: u64,
    top_seq: u16,
    /// The oldest number whose window is still open.
    base: u64,
    /// With a delay: the next number to leave (or skip).
    next: u64,
    records: Box<[Record]>,
    /// With a delay: the held buffers, at their number's record index.
    hold: Box<[Option<Buffer>]>,
    held: usize,
}

fn at(ext: u64) -> usize {
    // SPAN is a power of two below 2^16: the remainder fits.
    usize::try_from(ext % SPAN).unwrap_or(0)
}

impl Merge {
    pub(crate) fn new(legs: u8, delay_ns: u64, window_ns: u64) -> Self {
        let span = usize::try_from(SPAN).unwrap_or(4096);
        Self {
            delay_ns,
            window_ns,
            all_legs: u8::try_from((1u16 << legs.min(LegId::MAX_LEGS)) - 1).unwrap_or(0x0f),
            ssrc: None,
            epoch: 0,
            top: SPAN,
            top_seq: 0,
            base: SPAN + 1,
            next: SPAN + 1,
            records: vec![EMPTY; span].into_boxed_slice(),
            hold: if delay_ns > 0 {
                (0..span).map(|_| None).collect()
            } else {
                Box::default()
            },
            held: 0,
        }
    }

    pub(crate) fn delays(&self) -> bool {
        self.delay_ns > 0
    }

    /// Buffers in the hold.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    fn record(&self, ext: u64) -> Record {
        let r = self.records.get(at(ext)).copied().unwrap_or(EMPTY);
        if r.epoch == self.epoch { r } else { EMPTY }
    }

    fn record_mut(&mut self, ext: u64) -> Option<&mut Record> {
        self.records.get_mut(at(ext))
    }

    /// Classify a copy of `seq` from `leg` at `now`, advancing the
    /// stream; buffers the hold must let go of now (a restart, a full
    /// hold) go to `release`, in sequence order.
    pub(crate) fn classify(
        &mut self,
        leg: LegId,
        seq: u16,
        ssrc: u32,
        now: u64,
        counters: &RedundancyCounters,
        release: &mut impl FnMut(Buffer),
    ) -> Verdict {
        let span = i64::try_from(SPAN).unwrap_or(i64::MAX);
        // Two's complement: the signed distance from the highest number.
        let mut delta = i64::from(i16::from_ne_bytes(
            seq.wrapping_sub(self.top_seq).to_ne_bytes(),
        ));
        if self.ssrc != Some(ssrc) || delta >= span || delta <= -span {
            if self.ssrc.is_some() {
                counters.resets.inc();
            }
            self.restart(seq, ssrc, now, release);
            delta = 0;
        }
        let ext = self.top.saturating_add_signed(delta);
        if delta > 0 {
            self.advance(ext, seq, now, counters, release);
        }
        let bit = 1u8 << leg.0.min(7);
        let before = self.record(ext);
        let mut r = before;
        let verdict = match r.state {
            State::Sent | State::Held => Verdict::Duplicate,
            State::Skipped => Verdict::Late,
            State::Missing if ext < self.base => Verdict::Late,
            State::Missing => {
                r.legs |= bit;
                Verdict::New(ext)
            }
            State::Before if self.delays() => Verdict::Late,
            State::Before => {
                // Below the stream's start: not accounted.
                r = Record {
                    since_ns: now,
                    epoch: self.epoch,
                    legs: bit,
                    state: State::Before,
                };
                Verdict::New(ext)
            }
        };
        if matches!(r.state, State::Sent | State::Held) && ext >= self.base {
            r.legs |= bit;
        }
        if (r.legs, r.state, r.epoch) != (before.legs, before.state, before.epoch)
            && let Some(slot) = self.record_mut(ext)
        {
            *slot = r;
        }
        verdict
    }

    /// The copy of `ext` classified [`Verdict::New`] took a buffer: it
    /// leaves now (returned) or waits in the hold.
    pub(crate) fn commit(&mut self, ext: u64, buf: Buffer) -> Option<Buffer> {
        let r = self.record(ext);
        let leaves = !self.delays() || r.state == State::Before || ext == self.next;
        if leaves && ext == self.next && self.delays() {
            self.next += 1;
        }
        let epoch = self.epoch;
        let Some(slot) = self.records.get_mut(at(ext)) else {
            return Some(buf);
        };
        *slot = Record {
            epoch,
            state: if leaves { State::Sent } else { State::Held },
            ..r
        };
        if leaves {
            return Some(buf);
        }
        match self.hold.get_mut(at(ext)) {
            Some(h) => {
                self.held += 1;
                *h = Some(buf);
                None
            }
            None => Some(buf),
        }
    }

    /// With a delay: the next buffer whose turn has come at `now`
    /// (skipping numbers missing for the delay), in sequence order.
    pub(crate) fn pop_ready(&mut self, now: u64) -> Option<Buffer> {
        while self.delays() && self.next <= self.top {
            let r = self.record(self.next);
            match r.state {
                State::Held => return self.pass(false, None),
                State::Missing if r.since_ns.saturating_add(self.delay_ns) <= now => {
                    let _ = self.pass(false, None);
                }
                State::Missing => return None,
                _ => self.next += 1,
            }
        }
        None
    }

    /// A buffer (or a skip) is due at `now`: [`Merge::pop_ready`] would
    /// return something or move on.
    pub(crate) fn has_ready(&self, now: u64) -> bool {
        self.delays()
            && self.next <= self.top
            && match self.record(self.next) {
                Record {
                    state: State::Missing,
                    since_ns,
                    ..
                } => since_ns.saturating_add(self.delay_ns) <= now,
                _ => true,
            }
    }

    /// Move `next` on by one whatever its turn: a held buffer is returned,
    /// a missing number skipped (counted as a hold overflow when
    /// `overflows` says so).
    fn pass(&mut self, overflow: bool, counters: Option<&RedundancyCounters>) -> Option<Buffer> {
        let ext = self.next;
        self.next += 1;
        let epoch = self.epoch;
        let r = self.records.get_mut(at(ext))?;
        if r.epoch != epoch {
            return None;
        }
        match r.state {
            State::Held => {
                r.state = State::Sent;
                let buf = self.hold.get_mut(at(ext)).and_then(Option::take);
                if buf.is_some() {
                    self.held -= 1;
                }
                buf
            }
            State::Missing => {
                r.state = State::Skipped;
                if overflow && let Some(c) = counters {
                    c.hold_overflows.inc();
                }
                None
            }
            _ => None,
        }
    }

    /// Let every held buffer go, in order (a restart, the flow going).
    pub(crate) fn drain(&mut self, release: &mut impl FnMut(Buffer)) {
        if !self.delays() {
            return;
        }
        while self.next <= self.top {
            if let Some(buf) = self.pass(false, None) {
                release(buf);
            }
        }
    }

    fn restart(&mut self, seq: u16, ssrc: u32, now: u64, release: &mut impl FnMut(Buffer)) {
        self.drain(release);
        self.epoch = self.epoch.wrapping_add(1);
        self.ssrc = Some(ssrc);
        let ext = self.top + 1;
        self.top = ext;
        self.top_seq = seq;
        self.base = ext;
        self.next = ext;
        let epoch = self.epoch;
        if let Some(r) = self.record_mut(ext) {
            *r = Record {
                since_ns: now,
                epoch,
                legs: 0,
                state: State::Missing,
            };
        }
    }

    /// `ext` is the new highest number: every number up to it is
    /// expected from `now`. Numbers whose record it reuses are passed
    /// (the hold is full) and accounted first.
    fn advance(
        &mut self,
        ext: u64,
        seq: u16,
        now: u64,
        counters: &RedundancyCounters,
        release: &mut impl FnMut(Buffer),
    ) {
        let keep = ext.saturating_sub(SPAN) + 1;
        if self.delays() {
            while self.next < keep {
                if let Some(buf) = self.pass(true, Some(counters)) {
                    release(buf);
                }
            }
        }
        while self.base < keep {
            self.account(counters);
        }
        let epoch = self.epoch;
        for e in self.top + 1..=ext {
            if let Some(r) = self.record_mut(e) {
                *r = Record {
                    since_ns: now,
                    epoch,
                    legs: 0,
                    state: State::Missing,
                };
            }
        }
        self.top = ext;
        self.top_seq = seq;
    }

    /// Take over the state of `old`, the merge of the flow this one
    /// replaces (a reload): a number `old` forwarded or holds is not
    /// forwarded again, and its held buffers move into this hold in their
    /// order — or, when this merge has no delay, leave now through
    /// `release`, in order. This merge's own settings (legs, delay,
    /// window) stay. Control plane: O([`SPAN`]) at most.
    pub(crate) fn take_over(&mut self, old: &mut Merge, release: &mut impl FnMut(Buffer)) {
        if !self.delays() {
            old.release_held(release);
        }
        self.ssrc = old.ssrc;
        self.epoch = old.epoch;
        self.top = old.top;
        self.top_seq = old.top_seq;
        self.base = old.base;
        std::mem::swap(&mut self.records, &mut old.records);
        if !self.delays() {
            return;
        }
        if old.delays() {
            std::mem::swap(&mut self.hold, &mut old.hold);
            self.held = std::mem::take(&mut old.held);
            self.next = old.next;
        } else {
            // Everything `old` sent has left; the hold starts at the
            // first number still missing in the window (it waits up to
            // the delay, as any gap does), or after the highest one.
            let top = self.top;
            self.next = (self.base..=top)
                .find(|&e| self.record(e).state == State::Missing)
                .unwrap_or(top + 1);
        }
    }

    /// Let every held buffer go now, in order, leaving the numbers still
    /// missing open (for a merge without delay taking over: their first
    /// copy still goes).
    fn release_held(&mut self, release: &mut impl FnMut(Buffer)) {
        if !self.delays() {
            return;
        }
        for ext in self.next..=self.top {
            let epoch = self.epoch;
            let Some(r) = self.records.get_mut(at(ext)) else {
                continue;
            };
            if r.epoch == epoch && r.state == State::Held {
                r.state = State::Sent;
                if let Some(buf) = self.hold.get_mut(at(ext)).and_then(Option::take) {
                    self.held -= 1;
                    release(buf);
                }
            }
        }
        self.next = self.top + 1;
    }

    /// Start as though every number up to `seq` of stream `ssrc` had been
    /// forwarded (a fresh merge replacing a flow that kept no merge state:
    /// a one-leg flow or a failover): copies of those numbers are
    /// duplicates, none is accounted.
    pub(crate) fn seed(&mut self, seq: u16, ssrc: u32, now: u64) {
        self.epoch = self.epoch.wrapping_add(1);
        self.ssrc = Some(ssrc);
        let top = self.top + SPAN;
        self.top = top;
        self.top_seq = seq;
        self.base = top + 1;
        self.next = top + 1;
        let (epoch, legs) = (self.epoch, self.all_legs);
        for e in top + 1 - SPAN..=top {
            if let Some(r) = self.record_mut(e) {
                *r = Record {
                    since_ns: now,
                    epoch,
                    legs,
                    state: State::Sent,
                };
            }
        }
    }

    /// The highest number and the SSRC of the stream (`None` before its
    /// first datagram): where a failover replacing this flow starts.
    pub(crate) fn highest(&self) -> Option<(u16, u32)> {
        self.ssrc.map(|ssrc| (self.top_seq, ssrc))
    }

    /// The classes of the buffers in the hold.
    pub(crate) fn held_classes(&self) -> impl Iterator<Item = mcrelay_pool::Class> + '_ {
        self.hold.iter().flatten().map(Buffer::class)
    }

    /// Close the window of the oldest open number.
    fn account(&mut self, counters: &RedundancyCounters) {
        let r = self.record(self.base);
        match r.state {
            State::Sent if r.legs & self.all_legs != self.all_legs => counters.recovered.inc(),
            State::Missing | State::Skipped => counters.lost.inc(),
            _ => {}
        }
        self.base += 1;
    }

    /// The last number whose window may close: every number below `next`
    /// with a delay (the rest wait for their turn), up to `top` without.
    fn settled(&self) -> u64 {
        if self.delays() {
            self.next
        } else {
            self.top + 1
        }
    }

    /// Close the windows that have run out at `now`.
    pub(crate) fn finalise(&mut self, now: u64, counters: &RedundancyCounters) {
        while self.base < self.settled()
            && self
                .record(self.base)
                .since_ns
                .saturating_add(self.window_ns)
                <= now
        {
            self.account(counters);
        }
    }

    /// When something is next due (a skip, a window closing); `None` when
    /// nothing is pending.
    pub(crate) fn deadline(&self) -> Option<u64> {
        let skip = (self.delays() && self.next <= self.top)
            .then(|| self.record(self.next))
            .filter(|r| r.state == State::Missing)
            .map(|r| r.since_ns.saturating_add(self.delay_ns));
        let close = (self.base < self.settled()).then(|| {
            self.record(self.base)
                .since_ns
                .saturating_add(self.window_ns)
        });
        match (skip, close) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
