//! The RTCP packets RIST's simple profile (VSF TR-06-1) uses, read from a
//! compound datagram and written into a caller's buffer:
//!
//! - sender report (SR, RFC 3550 §6.4.1) and receiver report (RR, §6.4.2)
//!   with at most the first report block read (RIST has one stream);
//! - SDES with a CNAME (§6.5), which every compound packet carries;
//! - generic NACK (RTPFB, FMT 1, RFC 4585 §6.2.1): a packet ID and a
//!   16-bit mask of the following ones;
//! - RIST range NACK (APP, subtype 0, name `RIST`, TR-06-1 §5.3.2.2):
//!   pairs of a first sequence number and how many follow it.
//!
//! Reading never panics or allocates: every field access is checked
//! against the datagram's length, and a malformed packet ends the walk.

/// RTCP packet types.
pub const SR: u8 = 200;
pub const RR: u8 = 201;
pub const SDES: u8 = 202;
pub const APP: u8 = 204;
pub const RTPFB: u8 = 205;

/// `RIST` in an APP packet's name field.
const RIST_NAME: [u8; 4] = *b"RIST";

/// The most sequence numbers one range of a range NACK may name here (a
/// larger range is clipped): bounds the work one datagram can cause.
pub const MAX_RANGE: u16 = 1024;

/// The CNAME this side writes in its SDES.
pub const CNAME: &[u8] = b"mcrelay";

/// A report block's fields RIST needs (RFC 3550 §6.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportBlock {
    pub ssrc: u32,
    /// Extended highest sequence number received.
    pub highest: u32,
    /// The middle 32 bits of the last SR's NTP time (0: none yet).
    pub lsr: u32,
    /// Delay since that SR, in 1/65536 s.
    pub dlsr: u32,
}

/// One packet of a compound RTCP datagram, as far as RIST reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packet<'a> {
    SenderReport {
        ssrc: u32,
        ntp: u64,
        rtp_timestamp: u32,
        report: Option<ReportBlock>,
    },
    ReceiverReport {
        ssrc: u32,
        report: Option<ReportBlock>,
    },
    /// Generic NACK: its FCI entries (4 bytes each: PID, BLP).
    GenericNack { media_ssrc: u32, fci: &'a [u8] },
    /// RIST range NACK: its entries (4 bytes each: start, extra).
    RangeNack { media_ssrc: u32, fci: &'a [u8] },
    /// Anything else well-formed (SDES, BYE, other APP or feedback).
    Other(u8),
}

/// The packets of compound datagram `d`, in order; stops at the first
/// malformed one (wrong version, a length past the end).
pub fn packets(d: &[u8]) -> impl Iterator<Item = Packet<'_>> {
    let mut rest = d;
    std::iter::from_fn(move || {
        let [b0, pt, l0, l1, ..] = *rest else {
            return None;
        };
        if b0 >> 6 != 2 {
            rest = &[];
            return None;
        }
        let len = 4 * (usize::from(u16::from_be_bytes([l0, l1])) + 1);
        let Some(p) = rest.get(..len) else {
            rest = &[];
            return None;
        };
        rest = &rest[len..];
        Some(parse_one(b0 & 0x1f, pt, p))
    })
}

fn be32(p: &[u8], at: usize) -> Option<u32> {
    let b = p.get(at..at + 4)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn report(p: &[u8], at: usize, count: u8) -> Option<ReportBlock> {
    if count == 0 {
        return None;
    }
    Some(ReportBlock {
        ssrc: be32(p, at)?,
        highest: be32(p, at + 8)?,
        lsr: be32(p, at + 16)?,
        dlsr: be32(p, at + 20)?,
    })
}

fn parse_one(count: u8, pt: u8, p: &[u8]) -> Packet<'_> {
    let other = Packet::Other(pt);
    match pt {
        SR => {
            let (Some(ssrc), Some(hi), Some(lo), Some(ts)) =
                (be32(p, 4), be32(p, 8), be32(p, 12), be32(p, 16))
            else {
                return other;
            };
            Packet::SenderReport {
                ssrc,
                ntp: (u64::from(hi) << 32) | u64::from(lo),
                rtp_timestamp: ts,
                report: report(p, 28, count),
            }
        }
        RR => match be32(p, 4) {
            Some(ssrc) => Packet::ReceiverReport {
                ssrc,
                report: report(p, 8, count),
            },
            None => other,
        },
        RTPFB if count == 1 => match (be32(p, 8), p.get(12..)) {
            (Some(media_ssrc), Some(fci)) => Packet::GenericNack { media_ssrc, fci },
            _ => other,
        },
        APP if count == 0 && p.get(8..12) == Some(&RIST_NAME[..]) => {
            match (be32(p, 4), p.get(12..)) {
                (Some(media_ssrc), Some(fci)) => Packet::RangeNack { media_ssrc, fci },
                _ => other,
            }
        }
        _ => other,
    }
}

/// Every sequence number `packet` NACKs, in order, to `each` (nothing
/// for a packet that is not a NACK). A range is clipped to
/// [`MAX_RANGE`] numbers.
pub fn nacked(packet: &Packet<'_>, mut each: impl FnMut(u16)) {
    match *packet {
        Packet::GenericNack { fci, .. } => {
            for e in fci.chunks_exact(4) {
                let pid = u16::from_be_bytes([e[0], e[1]]);
                let blp = u16::from_be_bytes([e[2], e[3]]);
                each(pid);
                for bit in 0..16u16 {
                    if blp & (1 << bit) != 0 {
                        each(pid.wrapping_add(bit + 1));
                    }
                }
            }
        }
        Packet::RangeNack { fci, .. } => {
            for e in fci.chunks_exact(4) {
                let start = u16::from_be_bytes([e[0], e[1]]);
                let extra = u16::from_be_bytes([e[2], e[3]]).min(MAX_RANGE - 1);
                for k in 0..=extra {
                    each(start.wrapping_add(k));
                }
            }
        }
        _ => {}
    }
}

/// Writes RTCP packets one after another into a buffer; a packet that
/// does not fit is left out (and [`Writer::overflowed`] says so).
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
    overflowed: bool,
}

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self {
            buf,
            len: 0,
            overflowed: false,
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A packet was left out for want of room.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Room for `n` more bytes, or mark the overflow.
    fn room(&mut self, n: usize) -> Option<&mut [u8]> {
        match self.buf.get_mut(self.len..self.len + n) {
            Some(b) => Some(b),
            None => {
                self.overflowed = true;
                None
            }
        }
    }

    /// A packet header: count, type, length of `words` 32-bit words
    /// after it.
    fn header(b: &mut [u8], count: u8, pt: u8, words: usize) {
        b[0] = 0x80 | (count & 0x1f);
        b[1] = pt;
        let w = u16::try_from(words).unwrap_or(u16::MAX);
        b[2..4].copy_from_slice(&w.to_be_bytes());
    }

    fn report_block(b: &mut [u8], r: &ReportBlock) {
        b[0..4].copy_from_slice(&r.ssrc.to_be_bytes());
        // Fraction lost and cumulative lost: 0 (RIST repairs them).
        b[4..8].fill(0);
        b[8..12].copy_from_slice(&r.highest.to_be_bytes());
        // Interarrival jitter: not measured here.
        b[12..16].fill(0);
        b[16..20].copy_from_slice(&r.lsr.to_be_bytes());
        b[20..24].copy_from_slice(&r.dlsr.to_be_bytes());
    }

    /// A sender report (no report block).
    pub fn sender_report(
        &mut self,
        ssrc: u32,
        ntp: u64,
        rtp_timestamp: u32,
        packets: u32,
        octets: u32,
    ) {
        let Some(b) = self.room(28) else { return };
        Self::header(b, 0, SR, 6);
        b[4..8].copy_from_slice(&ssrc.to_be_bytes());
        b[8..16].copy_from_slice(&ntp.to_be_bytes());
        b[16..20].copy_from_slice(&rtp_timestamp.to_be_bytes());
        b[20..24].copy_from_slice(&packets.to_be_bytes());
        b[24..28].copy_from_slice(&octets.to_be_bytes());
        self.len += 28;
    }

    /// A receiver report with one report block, or none.
    pub fn receiver_report(&mut self, ssrc: u32, report: Option<&ReportBlock>) {
        let n = if report.is_some() { 32 } else { 8 };
        let Some(b) = self.room(n) else { return };
        Self::header(b, u8::from(report.is_some()), RR, n / 4 - 1);
        b[4..8].copy_from_slice(&ssrc.to_be_bytes());
        if let Some(r) = report {
            Self::report_block(&mut b[8..32], r);
        }
        self.len += n;
    }

    /// An SDES packet with one chunk: `ssrc`'s [`CNAME`].
    pub fn sdes_cname(&mut self, ssrc: u32) {
        // Chunk: SSRC, CNAME item (type, length, text), end item, padded
        // to a 32-bit boundary.
        let chunk = 4 + 2 + CNAME.len() + 1;
        let padded = chunk.div_ceil(4) * 4;
        let Some(b) = self.room(4 + padded) else {
            return;
        };
        Self::header(b, 1, SDES, padded / 4);
        b[4..8].copy_from_slice(&ssrc.to_be_bytes());
        b[8] = 1;
        b[9] = u8::try_from(CNAME.len()).unwrap_or(0);
        b[10..10 + CNAME.len()].copy_from_slice(CNAME);
        b[10 + CNAME.len()..4 + padded].fill(0);
        self.len += 4 + padded;
    }

    /// A RIST range NACK of `ranges` (first number, how many follow)
    /// for the stream `media_ssrc` (the APP packet's SSRC field).
    pub fn range_nack(&mut self, media_ssrc: u32, ranges: &[(u16, u16)]) {
        if ranges.is_empty() {
            return;
        }
        let n = 12 + 4 * ranges.len();
        let Some(b) = self.room(n) else { return };
        Self::header(b, 0, APP, n / 4 - 1);
        b[4..8].copy_from_slice(&media_ssrc.to_be_bytes());
        b[8..12].copy_from_slice(&RIST_NAME);
        for (e, &(start, extra)) in b[12..].chunks_exact_mut(4).zip(ranges) {
            e[0..2].copy_from_slice(&start.to_be_bytes());
            e[2..4].copy_from_slice(&extra.to_be_bytes());
        }
        self.len += n;
    }

    /// A generic NACK (RFC 4585) of `entries` (PID, BLP).
    pub fn generic_nack(&mut self, ssrc: u32, media_ssrc: u32, entries: &[(u16, u16)]) {
        if entries.is_empty() {
            return;
        }
        let n = 12 + 4 * entries.len();
        let Some(b) = self.room(n) else { return };
        Self::header(b, 1, RTPFB, n / 4 - 1);
        b[4..8].copy_from_slice(&ssrc.to_be_bytes());
        b[8..12].copy_from_slice(&media_ssrc.to_be_bytes());
        for (e, &(pid, blp)) in b[12..].chunks_exact_mut(4).zip(entries) {
            e[0..2].copy_from_slice(&pid.to_be_bytes());
            e[2..4].copy_from_slice(&blp.to_be_bytes());
        }
        self.len += n;
    }
}

/// The middle 32 bits of an NTP timestamp (RFC 3550's LSR).
pub fn ntp_middle(ntp: u64) -> u32 {
    u32::try_from((ntp >> 16) & 0xffff_ffff).unwrap_or(0)
}

/// Seconds between 1900 (NTP) and 1970 (Unix).
const NTP_UNIX_OFFSET: u64 = 2_208_988_800;

/// A Unix time in nanoseconds as a 64-bit NTP timestamp.
pub fn ntp_from_unix_ns(ns: u64) -> u64 {
    let secs = ns / 1_000_000_000 + NTP_UNIX_OFFSET;
    let frac = ((ns % 1_000_000_000) << 32) / 1_000_000_000;
    (secs << 32) | frac
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compound_round_trips() {
        let mut buf = [0u8; 256];
        let mut w = Writer::new(&mut buf);
        w.sender_report(0x1234, 0xaabb_ccdd_1122_3344, 90_000, 7, 700);
        w.sdes_cname(0x1234);
        w.range_nack(0x5678, &[(10, 2), (65535, 1)]);
        w.generic_nack(0x1234, 0x5678, &[(100, 0b101)]);
        let r = ReportBlock {
            ssrc: 0x5678,
            highest: 99,
            lsr: 0xccdd_1122,
            dlsr: 65536,
        };
        w.receiver_report(0x9, Some(&r));
        let n = w.len();
        assert!(!w.overflowed());
        let all: Vec<_> = packets(&buf[..n]).collect();
        assert_eq!(all.len(), 5);
        assert_eq!(
            all[0],
            Packet::SenderReport {
                ssrc: 0x1234,
                ntp: 0xaabb_ccdd_1122_3344,
                rtp_timestamp: 90_000,
                report: None
            }
        );
        assert_eq!(all[1], Packet::Other(SDES));
        let mut seqs = Vec::new();
        nacked(&all[2], |s| seqs.push(s));
        assert_eq!(seqs, [10, 11, 12, 65535, 0]);
        seqs.clear();
        nacked(&all[3], |s| seqs.push(s));
        assert_eq!(seqs, [100, 101, 103]);
        assert_eq!(
            all[4],
            Packet::ReceiverReport {
                ssrc: 9,
                report: Some(r)
            }
        );
    }

    #[test]
    fn malformed_input_ends_the_walk_without_panicking() {
        for d in [
            &[][..],
            &[0x80],
            &[0x80, 200, 0, 9, 1, 2],
            &[0x40, 200, 0, 0],
            &[0x80, 205, 0, 0],
        ] {
            for p in packets(d) {
                nacked(&p, |_| {});
            }
        }
        // A huge range is clipped.
        let mut buf = [0u8; 64];
        let mut w = Writer::new(&mut buf);
        w.range_nack(2, &[(0, u16::MAX)]);
        let n = w.len();
        let mut count = 0;
        for p in packets(&buf[..n]) {
            nacked(&p, |_| count += 1);
        }
        assert_eq!(count, usize::from(MAX_RANGE));
    }

    #[test]
    fn a_full_buffer_leaves_packets_out() {
        let mut buf = [0u8; 30];
        let mut w = Writer::new(&mut buf);
        w.sender_report(1, 2, 3, 4, 5);
        w.sdes_cname(1);
        assert_eq!(w.len(), 28);
        assert!(w.overflowed());
    }

    #[test]
    fn ntp_conversion() {
        let ntp = ntp_from_unix_ns(1_500_000_000);
        assert_eq!(ntp >> 32, 1 + NTP_UNIX_OFFSET);
        assert_eq!(ntp & 0xffff_ffff, 1 << 31);
        assert_eq!(ntp_middle(0x0001_0002_0003_0004), 0x0002_0003);
    }
}
