//! The SMPTE 2022-1 FEC packet (Pro-MPEG COP3, RFC 2733's XOR parity with
//! a block descriptor): a 12-byte RTP header whose byte 0 carries the
//! XOR of the protected packets' P/X/CC bits and whose marker bit carries
//! the XOR of their marker bits, then the 16-byte FEC header, then the
//! XOR of the protected payloads (everything after each packet's 12-byte
//! fixed header, zero-padded to the longest).
//!
//! ```text
//!  0                   1                   2                   3
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |      SNBase low bits          |        Length recovery        |
//! |E| PT recovery |                    Mask (0)                   |
//! |                          TS recovery                          |
//! |N|D|type |index|    Offset     |       NA      |SNBase ext bits|
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! A column packet (`D = 0`, sent to the media port + 2) protects `NA = D`
//! packets `Offset = L` apart; a row packet (`D = 1`, port + 4) protects
//! `NA = L` consecutive packets (`Offset = 1`). 2022-1 bounds the matrix:
//! `L` and `D` at most 20, `L × D` at most 100. Parsing is bounded and
//! never panics or allocates.

/// The RTP fixed header before the FEC header (2022-1 FEC packets carry
/// no CSRCs or extension).
pub const RTP_HEADER: usize = 12;
/// The FEC header's length.
pub const FEC_HEADER: usize = 16;
/// 2022-1's largest `L` (columns) and `D` (rows).
pub const MAX_DIMENSION: u8 = 20;
/// 2022-1's largest matrix, `L × D`.
pub const MAX_MATRIX: u16 = 100;
/// The payload type ffmpeg and GStreamer put on FEC packets.
pub const FEC_PAYLOAD_TYPE: u8 = 96;

/// Which FEC stream a packet belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// `D` packets `L` apart; port + 2.
    Column,
    /// `L` consecutive packets; port + 4.
    Row,
}

impl Direction {
    /// The port offset from the media port (the 2022-1 convention).
    pub fn port_offset(self) -> u16 {
        match self {
            Self::Column => 2,
            Self::Row => 4,
        }
    }
}

/// Why a datagram on a FEC port is not a usable 2022-1 FEC packet (each
/// counted as `fec_rejected`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Shorter than the RTP and FEC headers.
    Short,
    /// Not RTP version 2.
    NotRtp,
    /// `E` is 0 (an RFC 2733 header without the 2022-1 extension).
    NoExtension,
    /// `type` is not XOR or `index` is not 0.
    NotXor,
    /// `L`, `D` or the matrix outside 2022-1's limits, or a row packet
    /// whose offset is not 1.
    Matrix,
}

/// The fields of a FEC packet a decoder needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FecHeader {
    /// The first protected sequence number.
    pub sn_base: u16,
    /// XOR of the protected packets' payload lengths.
    pub length_recovery: u16,
    /// XOR of the protected packets' RTP byte 0, low 6 bits (P, X, CC).
    pub pxcc_recovery: u8,
    /// XOR of the protected packets' marker bits (0x80 or 0).
    pub marker_recovery: u8,
    /// XOR of the protected packets' payload types.
    pub pt_recovery: u8,
    /// XOR of the protected packets' timestamps.
    pub ts_recovery: u32,
    pub direction: Direction,
    /// Distance between protected sequence numbers (`L` for a column, 1
    /// for a row).
    pub offset: u8,
    /// Packets protected (`D` for a column, `L` for a row).
    pub na: u8,
}

impl FecHeader {
    /// The `i`-th protected sequence number.
    #[inline]
    pub fn member(&self, i: u8) -> u16 {
        self.sn_base
            .wrapping_add(u16::from(i).wrapping_mul(u16::from(self.offset)))
    }

    /// The position of `seq` in this packet's group, if it is a member.
    #[inline]
    pub fn position(&self, seq: u16) -> Option<u8> {
        let d = seq.wrapping_sub(self.sn_base);
        let offset = u16::from(self.offset.max(1));
        if d % offset != 0 {
            return None;
        }
        let i = d / offset;
        if i < u16::from(self.na) {
            u8::try_from(i).ok()
        } else {
            None
        }
    }
}

/// Read a FEC datagram: its header and the XOR of the payloads.
pub fn parse(d: &[u8]) -> Result<(FecHeader, &[u8]), Reject> {
    if d.len() < RTP_HEADER + FEC_HEADER {
        return Err(Reject::Short);
    }
    let (head, recovery) = d.split_at(RTP_HEADER + FEC_HEADER);
    let [b0, b1, ..] = *head else {
        return Err(Reject::Short);
    };
    if b0 >> 6 != 2 {
        return Err(Reject::NotRtp);
    }
    let f = &head[RTP_HEADER..];
    let [
        s0,
        s1,
        l0,
        l1,
        e_pt,
        _m0,
        _m1,
        _m2,
        t0,
        t1,
        t2,
        t3,
        ndti,
        offset,
        na,
        _ext,
    ] = *f
    else {
        return Err(Reject::Short);
    };
    if e_pt & 0x80 == 0 {
        return Err(Reject::NoExtension);
    }
    if (ndti >> 3) & 0x07 != 0 || ndti & 0x07 != 0 {
        return Err(Reject::NotXor);
    }
    let direction = if ndti & 0x40 != 0 {
        Direction::Row
    } else {
        Direction::Column
    };
    let fits = match direction {
        Direction::Column => {
            (1..=MAX_DIMENSION).contains(&offset)
                && (1..=MAX_DIMENSION).contains(&na)
                && u16::from(offset) * u16::from(na) <= MAX_MATRIX
        }
        Direction::Row => offset == 1 && (1..=MAX_DIMENSION).contains(&na),
    };
    if !fits {
        return Err(Reject::Matrix);
    }
    Ok((
        FecHeader {
            sn_base: u16::from_be_bytes([s0, s1]),
            length_recovery: u16::from_be_bytes([l0, l1]),
            pxcc_recovery: b0 & 0x3f,
            marker_recovery: b1 & 0x80,
            pt_recovery: e_pt & 0x7f,
            ts_recovery: u32::from_be_bytes([t0, t1, t2, t3]),
            direction,
            offset,
            na,
        },
        recovery,
    ))
}

/// Write the RTP and FEC headers of a FEC packet into `out` (at least
/// [`RTP_HEADER`] + [`FEC_HEADER`] bytes; shorter writes nothing).
/// The FEC packet's own RTP header: version 2, the P/X/CC and marker
/// recovery bits, payload type 96, its stream's sequence number, the
/// given timestamp, SSRC 0 (as ffmpeg sends).
pub fn write(out: &mut [u8], h: &FecHeader, sequence: u16, timestamp: u32) {
    let Some(out) = out.get_mut(..RTP_HEADER + FEC_HEADER) else {
        return;
    };
    out[0] = 0x80 | (h.pxcc_recovery & 0x3f);
    out[1] = (h.marker_recovery & 0x80) | FEC_PAYLOAD_TYPE;
    out[2..4].copy_from_slice(&sequence.to_be_bytes());
    out[4..8].copy_from_slice(&timestamp.to_be_bytes());
    out[8..12].copy_from_slice(&0u32.to_be_bytes());
    let f = &mut out[RTP_HEADER..];
    f[0..2].copy_from_slice(&h.sn_base.to_be_bytes());
    f[2..4].copy_from_slice(&h.length_recovery.to_be_bytes());
    f[4] = 0x80 | (h.pt_recovery & 0x7f);
    f[5..8].fill(0);
    f[8..12].copy_from_slice(&h.ts_recovery.to_be_bytes());
    f[12] = match h.direction {
        Direction::Column => 0,
        Direction::Row => 0x40,
    };
    f[13] = h.offset;
    f[14] = h.na;
    f[15] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(direction: Direction, offset: u8, na: u8) -> FecHeader {
        FecHeader {
            sn_base: 65530,
            length_recovery: 0x1234,
            pxcc_recovery: 0x21,
            marker_recovery: 0x80,
            pt_recovery: 33,
            ts_recovery: 0xdead_beef,
            direction,
            offset,
            na,
        }
    }

    #[test]
    fn write_then_parse_is_identity() {
        for (dir, offset, na) in [(Direction::Column, 5, 5), (Direction::Row, 1, 20)] {
            let h = header(dir, offset, na);
            let mut buf = [0u8; 40];
            write(&mut buf, &h, 7, 9);
            buf[28..].fill(0xab);
            let (got, rest) = parse(&buf).expect("valid");
            assert_eq!(got, h);
            assert_eq!(rest, &[0xab; 12]);
            assert_eq!(u16::from_be_bytes([buf[2], buf[3]]), 7);
        }
    }

    #[test]
    fn members_wrap_and_positions_invert() {
        let h = header(Direction::Column, 5, 4);
        let members: Vec<u16> = (0..4).map(|i| h.member(i)).collect();
        assert_eq!(members, [65530, 65535, 4, 9]);
        for (i, &m) in (0u8..).zip(&members) {
            assert_eq!(h.position(m), Some(i));
        }
        assert_eq!(h.position(65531), None);
        assert_eq!(h.position(14), None);
    }

    #[test]
    fn rejects_what_2022_1_does_not_allow() {
        let mut buf = [0u8; 28];
        write(&mut buf, &header(Direction::Column, 5, 5), 0, 0);
        assert!(parse(&buf).is_ok());
        assert_eq!(parse(&buf[..27]), Err(Reject::Short));
        let mut b = buf;
        b[0] = 0x40;
        assert_eq!(parse(&b), Err(Reject::NotRtp));
        let mut b = buf;
        b[16] &= 0x7f;
        assert_eq!(parse(&b), Err(Reject::NoExtension));
        let mut b = buf;
        b[24] |= 0x08;
        assert_eq!(parse(&b), Err(Reject::NotXor));
        for (dir, offset, na) in [
            (Direction::Column, 21, 4),
            (Direction::Column, 11, 10),
            (Direction::Column, 0, 4),
            (Direction::Row, 2, 5),
            (Direction::Row, 1, 21),
        ] {
            write(&mut b, &header(dir, offset, na), 0, 0);
            assert_eq!(parse(&b), Err(Reject::Matrix), "{dir:?} {offset} {na}");
        }
    }
}
