//! A RIST input's receiver side: finds gaps in the RTP numbering, NACKs
//! them to the sender until they arrive or their time is up, holds what
//! arrived after a gap for at most `buffer_ms`, and hands the flow an
//! in-order stream.
//!
//! Latency: a datagram that arrives in order while nothing is missing
//! goes straight on ([`Verdict::Deliver`], no copy); only datagrams
//! behind a gap wait, copied into the ring, until the gap is filled or
//! has waited `buffer_ms` (then it is skipped and counted unrecovered).
//! So a clean stream pays nothing and a lossy one at most `buffer_ms`.
//!
//! Retransmissions (TR-06-1: the media SSRC with its lowest bit set) are
//! repairs, not another stream: each is copied into the ring and handed
//! on with the media SSRC, byte-identical to the original, so the flow's
//! merge, health and outputs see one SSRC ([`RistReceiver::is_retransmitted`]
//! tells the caller's wire health which datagrams to leave out).
//!
//! NACK timing: a number is NACKed at the first [`RistReceiver::poll`]
//! after its gap is seen, then again every RTT × 1.25 (at least 10 ms;
//! 50 ms until a first RTT sample) for as long as a retransmission asked
//! for then can still arrive within `buffer_ms`: no fixed count, so a
//! sender that takes only some NACKs (librist's takes one per 4 RTT for
//! a number) is asked again until the buffer's end, and no NACK goes out
//! whose answer would come too late. The RTT is measured from a NACK to
//! the retransmission it brought back (only numbers NACKed once, as
//! Karn's rule for TCP).
//!
//! After an outage longer than `buffer_ms`, the gap's numbers sent
//! `buffer_ms` or more ago (spread evenly over the silence) are given up
//! at once (`unrecovered`, and `given_up`), never NACKed: the sender, who
//! keeps about what its receivers wait, no longer has them.
//!
//! Pure: no socket, no clock (`now_ns` is passed in), storage allocated
//! by [`RistReceiver::new`].

use super::rtcp::{self, Packet, ReportBlock, Writer};
use super::{MAX_DATAGRAM, slots_for};

/// Ranges one NACK datagram names, at most (more wait for the next poll).
pub const MAX_RANGES: usize = 64;

const MIN_RETRY_NS: u64 = 10_000_000;
const DEFAULT_RTT_NS: u64 = 40_000_000;

/// What to do with a datagram just received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Pass it on now, then drain [`RistReceiver::pop_ready`].
    Deliver,
    /// Kept behind a gap: drain [`RistReceiver::pop_ready`] later.
    Held,
    /// A number already received (a second retransmission, a network
    /// duplicate): dropped.
    Duplicate,
    /// Behind what was already handed on (arrived after its gap was
    /// skipped): dropped.
    Late,
    /// Far outside the window and not (yet) confirmed as a restart of
    /// the numbering: dropped.
    Stray,
    /// A confirmed restart: drain [`RistReceiver::pop_ready`] (it now
    /// hands on everything held), then call `receive` again with the
    /// same datagram.
    Flush,
    /// Not RTP, or longer than a slot: dropped.
    Rejected,
}

/// What a RIST receiver did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Sequence numbers NACKed (each NACK of each number).
    pub nacks_sent: u64,
    /// NACK datagrams written.
    pub nack_packets: u64,
    /// Datagrams marked as retransmissions (SSRC's lowest bit set).
    pub retransmissions: u64,
    /// Gaps filled after a NACK.
    pub recovered: u64,
    /// Gaps filled before any NACK (reordering).
    pub reordered: u64,
    /// Numbers neither received nor recovered in `buffer_ms`: skipped.
    pub unrecovered: u64,
    /// Of `unrecovered` (or `standby_skipped`): numbers given up at once
    /// when their gap opened, never NACKed, because they were sent
    /// `buffer_ms` or more before (a gap longer than the buffer, an
    /// outage; see `RistReceiver::give_up_count`).
    pub given_up: u64,
    /// Numbers skipped so while standing by (no NACK was sent for them:
    /// see [`RistReceiver::set_standby`]), not counted as unrecovered.
    pub standby_skipped: u64,
    pub duplicates: u64,
    pub late: u64,
    pub strays: u64,
    /// Restarts of the numbering (confirmed jumps).
    pub resets: u64,
    pub rejected: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    seq: u16,
    len: u16,
    present: bool,
    missing: bool,
    /// Handed on (not skipped): a later copy is a duplicate.
    delivered: bool,
    nacks: u8,
    /// When the gap was seen.
    since_ns: u64,
    next_nack_ns: u64,
    first_nack_ns: u64,
}

/// Whether a NACK for `slot`'s number sent at `at` can still bring its
/// retransmission back (one RTT later, when measured) before the gap's
/// `buffer_ns` are up.
fn in_time(slot: &Slot, at: u64, buffer_ns: u64, rtt_ns: Option<u64>) -> bool {
    at.saturating_add(rtt_ns.unwrap_or(0)) < slot.since_ns.saturating_add(buffer_ns)
}

/// One RIST input's reorder/recovery buffer and NACK state.
#[derive(Debug)]
pub struct RistReceiver {
    data: Box<[u8]>,
    slots: Box<[Slot]>,
    mask: usize,
    buffer_ns: u64,
    ssrc: u32,
    started: bool,
    /// The next number to hand on; `head..top` is the window.
    head: u16,
    top: u16,
    cycles: u32,
    missing: usize,
    flushing: bool,
    /// A far jump's number waiting for its successor to confirm it.
    candidate: Option<u16>,
    /// The stream's SSRC as NACKs name it (lowest bit clear).
    media_ssrc: u32,
    /// An original datagram (SSRC's lowest bit clear) told `media_ssrc`:
    /// `media_ssrc | 1` marks a retransmission ([`Self::is_retransmission`]).
    media_known: bool,
    /// When the highest number so far arrived: where a gap opened past
    /// it begins in time (`give_up_count`).
    top_ns: u64,
    /// The last sender report: its LSR and when it arrived.
    last_sr: Option<(u32, u64)>,
    rtt_ns: Option<u64>,
    ranges: [(u16, u16); MAX_RANGES],
    stats: ReceiverStats,
    /// Standing by: NACKs are not sent, so gaps skipped are not
    /// `unrecovered` (an alert on those stays quiet on a healthy standby).
    standby: bool,
}

impl RistReceiver {
    /// A receiver holding up to `buffer_ms` (and [`slots_for`] datagrams),
    /// writing RTCP as `ssrc`.
    pub fn new(buffer_ms: u32, ssrc: u32) -> Self {
        let n = slots_for(buffer_ms);
        Self {
            data: vec![0; n * MAX_DATAGRAM].into_boxed_slice(),
            slots: vec![Slot::default(); n].into_boxed_slice(),
            mask: n - 1,
            buffer_ns: u64::from(buffer_ms) * 1_000_000,
            ssrc,
            started: false,
            head: 0,
            top: 0,
            cycles: 0,
            missing: 0,
            flushing: false,
            candidate: None,
            media_ssrc: 0,
            media_known: false,
            top_ns: 0,
            last_sr: None,
            rtt_ns: None,
            ranges: [(0, 0); MAX_RANGES],
            stats: ReceiverStats::default(),
            standby: false,
        }
    }

    /// Stand by (`true`: the driver sends none of this receiver's RTCP,
    /// see `crate::standby`) or be active: gaps skipped while standing by
    /// count as `standby_skipped`, not `unrecovered`.
    pub fn set_standby(&mut self, standby: bool) {
        self.standby = standby;
    }

    pub fn stats(&self) -> &ReceiverStats {
        &self.stats
    }

    /// The RTT measured from NACKs to their retransmissions (smoothed).
    pub fn rtt_ns(&self) -> Option<u64> {
        self.rtt_ns
    }

    /// Numbers missing in the window right now.
    pub fn missing(&self) -> usize {
        self.missing
    }

    /// Datagrams and gaps in the window right now.
    pub fn window(&self) -> usize {
        usize::from(self.top.wrapping_sub(self.head))
    }

    /// Datagrams the ring holds.
    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    fn retry_ns(&self) -> u64 {
        let rtt = self.rtt_ns.unwrap_or(DEFAULT_RTT_NS);
        (rtt + rtt / 4).max(MIN_RETRY_NS)
    }

    /// Datagram `d` arrived at `now_ns`.
    pub fn receive(&mut self, now_ns: u64, d: &[u8]) -> Verdict {
        self.receive_or_hold(now_ns, d, false)
    }

    /// Datagram `d` arrived at `now_ns` while what it would go on to has
    /// no room: one that could go on now is held (copied into the ring,
    /// [`Verdict::Held`]) and leaves in order through
    /// [`RistReceiver::pop_ready`].
    pub fn receive_holding(&mut self, now_ns: u64, d: &[u8]) -> Verdict {
        self.receive_or_hold(now_ns, d, true)
    }

    fn receive_or_hold(&mut self, now_ns: u64, d: &[u8], hold: bool) -> Verdict {
        let Some(h) = mcrelay_wire::rtp::parse(d) else {
            self.stats.rejected += 1;
            return Verdict::Rejected;
        };
        let Ok(len) = u16::try_from(d.len()) else {
            self.stats.rejected += 1;
            return Verdict::Rejected;
        };
        if d.len() > MAX_DATAGRAM {
            self.stats.rejected += 1;
            return Verdict::Rejected;
        }
        // A retransmission is a repair of the stream, not another one: it
        // is handed on with the media SSRC (copied, so never on the
        // no-copy paths), byte-identical to the original.
        let retransmission = self.is_retransmission(h.ssrc);
        if retransmission {
            self.stats.retransmissions += 1;
        } else {
            self.media_ssrc = h.ssrc & !1;
            self.media_known = h.ssrc & 1 == 0;
        }
        let seq = h.sequence;
        if !self.started {
            self.restart(seq, now_ns);
            return Verdict::Deliver;
        }
        let window = self.window();
        let d_ahead = usize::from(seq.wrapping_sub(self.head));
        if d_ahead >= 0x8000 {
            // Behind the head: already handed on or skipped, unless it is
            // far behind and confirmed as a restart.
            let behind = 0x1_0000 - d_ahead;
            if behind <= self.capacity() {
                let s = &self.slots[usize::from(seq) & self.mask];
                if s.seq == seq && s.delivered {
                    self.stats.duplicates += 1;
                    return Verdict::Duplicate;
                }
                self.stats.late += 1;
                return Verdict::Late;
            }
            return self.far(seq, now_ns);
        }
        if d_ahead < window {
            let i = usize::from(seq) & self.mask;
            let s = self.slots[i];
            if !s.missing {
                if !s.present {
                    // Given up when its gap opened (`give_up_count`).
                    self.stats.late += 1;
                    return Verdict::Late;
                }
                self.stats.duplicates += 1;
                return Verdict::Duplicate;
            }
            self.missing -= 1;
            if s.nacks > 0 {
                self.stats.recovered += 1;
                if s.nacks == 1 {
                    self.rtt_sample(now_ns.saturating_sub(s.first_nack_ns));
                }
            } else {
                self.stats.reordered += 1;
            }
            if d_ahead == 0 && !hold && !retransmission {
                self.slots[i].missing = false;
                self.slots[i].delivered = true;
                self.head = self.head.wrapping_add(1);
                return Verdict::Deliver;
            }
            self.store(i, seq, len, d, retransmission);
            return Verdict::Held;
        }
        if d_ahead >= self.capacity() {
            return self.far(seq, now_ns);
        }
        self.candidate = None;
        if window == 0 && d_ahead == 0 && !hold && !retransmission {
            // The fast path: in order, nothing missing, no copy.
            self.slots[usize::from(seq) & self.mask] = Slot {
                seq,
                delivered: true,
                ..Slot::default()
            };
            self.advance_top(seq, now_ns);
            self.head = self.top;
            return Verdict::Deliver;
        }
        // New numbers past the top: the ones skipped are missing, but
        // those sent `buffer_ms` or more ago (a gap longer than the
        // buffer: an outage) are given up at once, never NACKed.
        let gap = seq.wrapping_sub(self.top);
        let give_up = self.give_up_count(gap, now_ns);
        let mut s = self.top;
        let mut k = 0u16;
        while s != seq {
            let i = usize::from(s) & self.mask;
            self.slots[i] = if k < give_up {
                Slot {
                    seq: s,
                    ..Slot::default()
                }
            } else {
                self.missing += 1;
                Slot {
                    seq: s,
                    missing: true,
                    since_ns: now_ns,
                    next_nack_ns: now_ns,
                    ..Slot::default()
                }
            };
            k = k.wrapping_add(1);
            s = s.wrapping_add(1);
        }
        if give_up > 0 {
            self.stats.given_up += u64::from(give_up);
            if self.standby {
                self.stats.standby_skipped += u64::from(give_up);
            } else {
                self.stats.unrecovered += u64::from(give_up);
            }
        }
        self.advance_top(seq, now_ns);
        let i = usize::from(seq) & self.mask;
        self.store(i, seq, len, d, retransmission);
        Verdict::Held
    }

    /// Whether `ssrc` marks a retransmission of this receiver's stream:
    /// TR-06-1 sends them with the media SSRC's lowest bit set. Known
    /// once an original (lowest bit clear) named the media SSRC, so a
    /// sender whose own SSRC is odd is not taken for retransmitting
    /// everything.
    pub fn is_retransmission(&self, ssrc: u32) -> bool {
        ssrc & 1 == 1 && self.media_known && ssrc & !1 == self.media_ssrc
    }

    /// [`Self::is_retransmission`] for datagram `d` (RTP version 2 and
    /// long enough for an SSRC; anything else is not).
    pub fn is_retransmitted(&self, d: &[u8]) -> bool {
        match (d.first(), d.get(8..12)) {
            (Some(&b0), Some(&[s0, s1, s2, s3])) if b0 >> 6 == 2 => {
                self.is_retransmission(u32::from_be_bytes([s0, s1, s2, s3]))
            }
            _ => false,
        }
    }

    /// Of a gap of `gap` numbers past the top seen at `now_ns`, how many
    /// at its start were sent `buffer_ms` or more ago, taking them as
    /// sent evenly between the top's arrival (`top_ns`) and now. A sender
    /// keeps about what its receivers wait (`buffer_ms`), so it no longer
    /// has them (NACKs for them are wasted: after a 5 s outage a leg once
    /// NACKed 24 187 numbers), and an answer would come later than the
    /// buffer's latency anyway. 0 unless the gap lasted longer than the
    /// buffer.
    fn give_up_count(&self, gap: u16, now_ns: u64) -> u16 {
        let span = u128::from(now_ns.saturating_sub(self.top_ns));
        let buffer = u128::from(self.buffer_ns);
        if gap == 0 || span <= buffer {
            return 0;
        }
        // Number `top + j` (j < gap) was sent about `(gap - j) / (gap + 1)`
        // of the span before now: given up when that is `buffer` or more,
        // so for `gap - j` from `buffer * (gap + 1) / span` (rounded up,
        // at least 1) to `gap`.
        let steps = u128::from(gap) + 1;
        let from = (buffer * steps).div_ceil(span).max(1);
        u16::try_from(steps.saturating_sub(from)).map_or(gap, |n| n.min(gap))
    }

    fn advance_top(&mut self, seq: u16, now_ns: u64) {
        let next = seq.wrapping_add(1);
        if next < self.top || next == 0 {
            self.cycles = self.cycles.wrapping_add(1);
        }
        self.top = next;
        self.top_ns = now_ns;
    }

    /// Keep `d` (number `seq`, `len` bytes) in slot `i`; a retransmission
    /// with the media SSRC (its lowest bit cleared), as it was first sent.
    fn store(&mut self, i: usize, seq: u16, len: u16, d: &[u8], retransmission: bool) {
        let at = i * MAX_DATAGRAM;
        self.data[at..at + d.len()].copy_from_slice(d);
        if retransmission {
            // An RTP header (parsed by the caller) is at least 12 bytes.
            if let Some(b) = self.data.get_mut(at + 11) {
                *b &= !1;
            }
        }
        self.slots[i] = Slot {
            seq,
            len,
            present: true,
            ..Slot::default()
        };
    }

    fn restart(&mut self, seq: u16, now_ns: u64) {
        if self.started {
            self.stats.resets += 1;
        }
        self.slots[usize::from(seq) & self.mask] = Slot {
            seq,
            delivered: true,
            ..Slot::default()
        };
        self.started = true;
        self.candidate = None;
        self.head = seq.wrapping_add(1);
        self.top = self.head;
        self.top_ns = now_ns;
        self.cycles = 0;
    }

    /// A number far from the window: a restart once its successor
    /// follows it, a stray until then.
    fn far(&mut self, seq: u16, now_ns: u64) -> Verdict {
        let confirmed = self.candidate == Some(seq.wrapping_sub(1));
        self.candidate = Some(seq);
        if !confirmed {
            self.stats.strays += 1;
            return Verdict::Stray;
        }
        if self.window() > 0 {
            self.flushing = true;
            return Verdict::Flush;
        }
        self.restart(seq, now_ns);
        Verdict::Deliver
    }

    fn rtt_sample(&mut self, sample: u64) {
        self.rtt_ns = Some(match self.rtt_ns {
            None => sample,
            Some(old) => old - old / 8 + sample / 8,
        });
    }

    /// The next datagram to hand on in order, if it may leave now: a
    /// gap at the head that has waited `buffer_ms` is skipped (counted
    /// unrecovered). Drain until `None` after every `receive` and
    /// periodically.
    pub fn pop_ready(&mut self, now_ns: u64) -> Option<&[u8]> {
        loop {
            if self.head == self.top {
                if self.flushing {
                    self.flushing = false;
                    // The window is empty: the held restart datagram
                    // starts the new numbering when it comes back.
                    self.started = false;
                    self.stats.resets += 1;
                }
                return None;
            }
            let i = usize::from(self.head) & self.mask;
            let s = self.slots[i];
            if s.present {
                self.slots[i].present = false;
                self.slots[i].delivered = true;
                self.head = self.head.wrapping_add(1);
                let at = i * MAX_DATAGRAM;
                return Some(&self.data[at..at + usize::from(s.len)]);
            }
            if self.flushing || !s.missing || now_ns.saturating_sub(s.since_ns) >= self.buffer_ns {
                if s.missing {
                    self.missing -= 1;
                    if self.standby {
                        self.stats.standby_skipped += 1;
                    } else {
                        self.stats.unrecovered += 1;
                    }
                }
                self.slots[i].missing = false;
                self.head = self.head.wrapping_add(1);
                continue;
            }
            return None;
        }
    }

    /// When [`RistReceiver::poll`] or [`RistReceiver::pop_ready`] next
    /// has something to do (a NACK due, a gap to skip); `None` with
    /// nothing missing.
    pub fn next_deadline(&self) -> Option<u64> {
        if self.missing == 0 {
            return None;
        }
        let head = self.slots[usize::from(self.head) & self.mask];
        let mut at = if head.missing {
            head.since_ns + self.buffer_ns
        } else {
            u64::MAX
        };
        let mut s = self.head;
        while s != self.top {
            let slot = &self.slots[usize::from(s) & self.mask];
            if slot.missing && in_time(slot, slot.next_nack_ns, self.buffer_ns, self.rtt_ns) {
                at = at.min(slot.next_nack_ns);
            }
            s = s.wrapping_add(1);
        }
        Some(at)
    }

    /// Write the NACKs due at `now_ns` (a receiver report, SDES and a
    /// RIST range NACK) into `buf`; returns the length (0: none due).
    pub fn poll(&mut self, now_ns: u64, buf: &mut [u8]) -> usize {
        if self.missing == 0 {
            return 0;
        }
        let retry = self.retry_ns();
        let mut n = 0usize;
        let mut numbers = 0u64;
        let mut s = self.head;
        while s != self.top && n < MAX_RANGES {
            let i = usize::from(s) & self.mask;
            let slot = &mut self.slots[i];
            let due = slot.missing
                && slot.next_nack_ns <= now_ns
                && in_time(slot, now_ns, self.buffer_ns, self.rtt_ns);
            if due {
                if slot.nacks == 0 {
                    slot.first_nack_ns = now_ns;
                }
                slot.nacks = slot.nacks.saturating_add(1);
                slot.next_nack_ns = now_ns + retry;
                numbers += 1;
                match n.checked_sub(1).map(|last| &mut self.ranges[last]) {
                    Some((start, extra)) if start.wrapping_add(*extra).wrapping_add(1) == s => {
                        *extra += 1
                    }
                    _ => {
                        self.ranges[n] = (s, 0);
                        n += 1;
                    }
                }
            }
            s = s.wrapping_add(1);
        }
        if n == 0 {
            return 0;
        }
        let report = self.report_block(now_ns);
        let mut w = Writer::new(buf);
        w.receiver_report(self.ssrc, self.last_sr.is_some().then_some(&report));
        w.sdes_cname(self.ssrc);
        w.range_nack(self.media_ssrc, &self.ranges[..n]);
        if w.overflowed() {
            return 0;
        }
        self.stats.nacks_sent += numbers;
        self.stats.nack_packets += 1;
        w.len()
    }

    fn report_block(&self, now_ns: u64) -> ReportBlock {
        let (lsr, dlsr) = match self.last_sr {
            Some((lsr, at)) => {
                let d = (now_ns.saturating_sub(at) << 16) / 1_000_000_000;
                (lsr, u32::try_from(d).unwrap_or(u32::MAX))
            }
            None => (0, 0),
        };
        ReportBlock {
            ssrc: self.media_ssrc,
            highest: (self.cycles << 16) | u32::from(self.top.wrapping_sub(1)),
            lsr,
            dlsr,
        }
    }

    /// A receiver report and SDES (sent periodically: it tells the
    /// sender where this receiver is and lets it measure the RTT).
    pub fn receiver_report(&self, now_ns: u64, buf: &mut [u8]) -> usize {
        let report = self.report_block(now_ns);
        let mut w = Writer::new(buf);
        // A report block only once a sender report came: an LSR of 0 is
        // no RTT sample, and some senders take it for one.
        w.receiver_report(
            self.ssrc,
            (self.started && self.last_sr.is_some()).then_some(&report),
        );
        w.sdes_cname(self.ssrc);
        if w.overflowed() { 0 } else { w.len() }
    }

    /// An RTCP datagram from the sender (its sender reports).
    pub fn receive_rtcp(&mut self, now_ns: u64, d: &[u8]) {
        for p in rtcp::packets(d) {
            if let Packet::SenderReport { ntp, .. } = p {
                self.last_sr = Some((rtcp::ntp_middle(ntp), now_ns));
            }
        }
    }
}
