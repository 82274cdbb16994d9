//! A RIST output's sender side: the last `buffer_ms` of sent datagrams,
//! the NACKs receivers send back, the retransmissions they ask for, the
//! sender reports, and the round-trip time measured from the receivers'
//! reports (RFC 3550 §6.4.1: now − LSR − DLSR).
//!
//! Pure: no socket and no clock. The driver passes `now_ns` (monotonic)
//! and, for sender reports, the wall clock as an NTP timestamp. All
//! storage is allocated by [`RistSender::new`]; recording a datagram
//! copies it into its slot of a ring indexed by RTP sequence number.

use super::rtcp::{self, Packet, ReportBlock, Writer};
use super::{MAX_DATAGRAM, slots_for};

/// Retransmissions waiting for the driver, at most.
pub const PENDING: usize = 1024;

/// Sender reports remembered for the RTT (a receiver's LSR names one).
const REPORTS: usize = 8;

/// A second NACK for a number retransmitted less than this long ago (or
/// half the RTT, if larger) is ignored: the first retransmission is
/// still on its way.
const MIN_RESEND_GAP_NS: u64 = 5_000_000;

/// What a RIST sender did (plain numbers: the driver copies them into
/// the output's counters).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SenderStats {
    /// RTCP datagrams received.
    pub rtcp_received: u64,
    /// Sequence numbers NACKed by receivers.
    pub nacked: u64,
    /// Datagrams sent again.
    pub retransmitted: u64,
    /// NACKed numbers no longer (or never) in the buffer.
    pub unrecoverable: u64,
    /// NACKs for a number retransmitted moments ago (ignored).
    pub suppressed: u64,
    /// NACKed numbers dropped because [`PENDING`] were already waiting.
    pub queue_full: u64,
    /// Datagrams not kept (not RTP, or longer than a slot).
    pub not_buffered: u64,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    seq: u16,
    len: u16,
    /// When it was sent; `None`: empty.
    sent_ns: Option<u64>,
    /// When it was last retransmitted (0: never).
    resent_ns: u64,
}

/// One RIST output's retransmission buffer and RTCP state.
#[derive(Debug)]
pub struct RistSender {
    data: Box<[u8]>,
    slots: Box<[Slot]>,
    mask: usize,
    buffer_ns: u64,
    /// Sequence numbers to retransmit (a ring of [`PENDING`]).
    pending: Box<[u16]>,
    pending_head: usize,
    pending_len: usize,
    /// The stream's SSRC (its last datagram's), and RTP timestamp.
    ssrc: u32,
    rtp_timestamp: u32,
    packets: u32,
    octets: u32,
    /// Sender reports sent: (LSR, when).
    reports: [(u32, u64); REPORTS],
    next_report: usize,
    rtt_ns: Option<u64>,
    /// The driver's clock at its last [`RistSender::tick`].
    clock_ns: u64,
    stats: SenderStats,
}

impl RistSender {
    /// A sender keeping `buffer_ms` of datagrams (up to
    /// [`slots_for`]`(buffer_ms)` of them). Allocates
    /// [`RistSender::memory_bytes`].
    pub fn new(buffer_ms: u32) -> Self {
        let n = slots_for(buffer_ms);
        Self {
            data: vec![0; n * MAX_DATAGRAM].into_boxed_slice(),
            slots: vec![
                Slot {
                    seq: 0,
                    len: 0,
                    sent_ns: None,
                    resent_ns: 0,
                };
                n
            ]
            .into_boxed_slice(),
            mask: n - 1,
            buffer_ns: u64::from(buffer_ms) * 1_000_000,
            pending: vec![0; PENDING].into_boxed_slice(),
            pending_head: 0,
            pending_len: 0,
            ssrc: 0,
            rtp_timestamp: 0,
            packets: 0,
            octets: 0,
            reports: [(0, 0); REPORTS],
            next_report: 0,
            rtt_ns: None,
            clock_ns: 0,
            stats: SenderStats::default(),
        }
    }

    /// The bytes this sender holds (its ring and bookkeeping).
    pub fn memory_bytes(&self) -> usize {
        self.data.len() + self.slots.len() * std::mem::size_of::<Slot>() + PENDING * 2
    }

    pub fn stats(&self) -> &SenderStats {
        &self.stats
    }

    /// The round-trip time to the receivers, smoothed (7/8 old, 1/8
    /// new, as TCP's SRTT); `None` before the first receiver report
    /// naming one of this sender's reports.
    pub fn rtt_ns(&self) -> Option<u64> {
        self.rtt_ns
    }

    /// The driver's clock, read once per loop turn: what
    /// [`RistSender::record_now`] stamps datagrams with.
    pub fn tick(&mut self, now_ns: u64) {
        self.clock_ns = now_ns;
    }

    /// [`RistSender::record`] at the last [`RistSender::tick`]'s time (the
    /// packet path has no clock of its own; a datagram is stamped at most
    /// a loop turn early, so it may expire that much sooner).
    pub fn record_now(&mut self, d: &[u8]) {
        self.record(self.clock_ns, d);
    }

    /// Datagram `d` was sent at `now_ns`: keep a copy for
    /// retransmission. The copy's SSRC has its lowest bit set, as
    /// TR-06-1 marks retransmitted packets.
    pub fn record(&mut self, now_ns: u64, d: &[u8]) {
        let Some(h) = mcrelay_wire::rtp::parse(d) else {
            self.stats.not_buffered += 1;
            return;
        };
        self.ssrc = h.ssrc & !1;
        self.rtp_timestamp = h.timestamp;
        self.packets = self.packets.wrapping_add(1);
        self.octets = self
            .octets
            .wrapping_add(u32::try_from(h.payload.len()).unwrap_or(u32::MAX));
        let (Ok(len), true) = (u16::try_from(d.len()), d.len() <= MAX_DATAGRAM) else {
            self.stats.not_buffered += 1;
            return;
        };
        let i = usize::from(h.sequence) & self.mask;
        let at = i * MAX_DATAGRAM;
        let copy = &mut self.data[at..at + d.len()];
        copy.copy_from_slice(d);
        copy[11] |= 1;
        self.slots[i] = Slot {
            seq: h.sequence,
            len,
            sent_ns: Some(now_ns),
            resent_ns: 0,
        };
    }

    /// An RTCP datagram from a receiver: its NACKs queue retransmissions
    /// ([`RistSender::next_retransmission`]), its report's LSR and DLSR
    /// give an RTT sample.
    pub fn receive_rtcp(&mut self, now_ns: u64, d: &[u8]) {
        self.stats.rtcp_received += 1;
        for p in rtcp::packets(d) {
            match p {
                Packet::ReceiverReport {
                    report: Some(r), ..
                }
                | Packet::SenderReport {
                    report: Some(r), ..
                } => self.report_block(now_ns, &r),
                Packet::GenericNack { .. } | Packet::RangeNack { .. } => {
                    rtcp::nacked(&p, |seq| self.nack(now_ns, seq));
                }
                _ => {}
            }
        }
    }

    fn report_block(&mut self, now_ns: u64, r: &ReportBlock) {
        if r.lsr == 0 {
            return;
        }
        let Some(&(_, sent)) = self
            .reports
            .iter()
            .find(|(lsr, at)| *lsr == r.lsr && *at != 0)
        else {
            return;
        };
        // DLSR is in 1/65536 s.
        let held = (u64::from(r.dlsr) * 1_000_000_000) >> 16;
        let Some(sample) = now_ns.checked_sub(sent).and_then(|d| d.checked_sub(held)) else {
            return;
        };
        self.rtt_ns = Some(match self.rtt_ns {
            None => sample,
            Some(old) => old - old / 8 + sample / 8,
        });
    }

    fn nack(&mut self, now_ns: u64, seq: u16) {
        self.stats.nacked += 1;
        let i = usize::from(seq) & self.mask;
        let s = &mut self.slots[i];
        // Kept `buffer_ms` plus two RTTs: a receiver with the same buffer
        // asks until its buffer's end, which is `buffer_ms` plus one RTT
        // after the datagram left when both legs take their usual time;
        // the second RTT is margin for a leg that took longer (one NACK
        // arriving just past `buffer_ms` + RTT was the one number
        // `ristreceiver -b 200` missed in some 60 s runs).
        let keep_ns = self.buffer_ns + 2 * self.rtt_ns.unwrap_or(0);
        let kept = s.seq == seq
            && s.sent_ns
                .is_some_and(|t| now_ns.saturating_sub(t) <= keep_ns);
        if !kept {
            self.stats.unrecoverable += 1;
            return;
        }
        let gap = MIN_RESEND_GAP_NS.max(self.rtt_ns.unwrap_or(0) / 2);
        if s.resent_ns != 0 && now_ns.saturating_sub(s.resent_ns) < gap {
            self.stats.suppressed += 1;
            return;
        }
        if self.pending_len == PENDING {
            self.stats.queue_full += 1;
            return;
        }
        s.resent_ns = now_ns.max(1);
        self.pending[(self.pending_head + self.pending_len) % PENDING] = seq;
        self.pending_len += 1;
    }

    /// A sender report was written.
    pub fn has_reported(&self) -> bool {
        self.reports[0].1 != 0
    }

    /// Retransmissions are waiting.
    pub fn has_retransmissions(&self) -> bool {
        self.pending_len > 0
    }

    /// The next datagram to send again (the copy with its SSRC's lowest
    /// bit set), counted as retransmitted; `None` when none waits.
    pub fn next_retransmission(&mut self) -> Option<&[u8]> {
        while self.pending_len > 0 {
            let seq = self.pending[self.pending_head];
            self.pending_head = (self.pending_head + 1) % PENDING;
            self.pending_len -= 1;
            let i = usize::from(seq) & self.mask;
            let s = self.slots[i];
            if s.seq != seq || s.sent_ns.is_none() {
                // Overwritten by a newer datagram since the NACK.
                self.stats.unrecoverable += 1;
                continue;
            }
            self.stats.retransmitted += 1;
            let at = i * MAX_DATAGRAM;
            return Some(&self.data[at..at + usize::from(s.len)]);
        }
        None
    }

    /// Write a sender report and SDES into `buf` (the compound RTCP
    /// datagram to send to the receivers' port + 1); `ntp` is the wall
    /// clock now. Returns its length (0: nothing sent yet, or `buf` too
    /// small).
    pub fn sender_report(&mut self, now_ns: u64, ntp: u64, buf: &mut [u8]) -> usize {
        if self.packets == 0 {
            return 0;
        }
        let mut w = Writer::new(buf);
        w.sender_report(
            self.ssrc,
            ntp,
            self.rtp_timestamp,
            self.packets,
            self.octets,
        );
        w.sdes_cname(self.ssrc);
        if w.overflowed() {
            return 0;
        }
        self.reports[self.next_report] = (rtcp::ntp_middle(ntp), now_ns.max(1));
        self.next_report = (self.next_report + 1) % REPORTS;
        w.len()
    }
}
