//! How `loadgen send` wraps the checkable [`payload`] and how `loadgen
//! recv` unwraps it again: as it is (`loadgen`), after an RTP header
//! (`rtp`), or spread over the payloads of MPEG-TS packets after an RTP
//! header (`rtp-mpegts`, SMPTE 2022-2 / RFC 2250). The relay's stream-health
//! parsers then see a clean stream of the kind they parse, and the receiver
//! still checks every byte of it.
//!
//! * `rtp`: RTP header (version 2, payload type 96, a fixed SSRC, sequence
//!   number = the payload's sequence number mod 2^16, timestamp on a 90 kHz
//!   clock at the send rate), then a payload datagram of `size` bytes.
//! * `rtp-mpegts`: RTP header (payload type 33, MP2T), then `size / 188`
//!   TS packets, each a 4-byte header (sync byte 0x47, PID [`TS_PID`],
//!   payload only, the continuity counter counting on from packet to
//!   packet across datagrams, payload-unit start on a datagram's first
//!   packet) and 184 bytes: together the TS packets' payloads are one
//!   payload datagram of `size / 188 * 184` bytes.
//!
//! [`unwrap`] refuses anything else: a wrong RTP version, sequence number,
//! sync byte, PID or continuity counter, or a length that is not what
//! [`Framing::wire_len`] gives for the inner payload. Its caller counts
//! that as corrupt.

use crate::legs::{RTP_HEADER, parse_rtp, seq16, write_rtp_header};
use crate::payload;

/// Bytes of an MPEG-TS packet.
pub const TS_PACKET: usize = 188;
/// Bytes of a TS packet after its 4-byte header (no adaptation field).
pub const TS_PAYLOAD: usize = TS_PACKET - 4;
/// The PID every TS packet of the stream carries.
pub const TS_PID: u16 = 0x0100;
/// The RTP SSRC of the stream.
pub const SSRC: u32 = 0x4d43_524c;
/// RTP payload type of `rtp` (dynamic) and `rtp-mpegts` (MP2T, RFC 3551).
const PT_RTP: u8 = 96;
const PT_MP2T: u8 = 33;

/// What the payload datagram travels in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Framing {
    /// The payload datagram as it is.
    #[default]
    Loadgen,
    /// After an RTP header.
    Rtp,
    /// In MPEG-TS packets after an RTP header.
    RtpMpegts,
}

/// Why [`Framing::check_size`] refuses a size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeError {
    pub framing: Framing,
    pub size: usize,
}

impl std::fmt::Display for SizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.framing {
            Framing::RtpMpegts => write!(
                f,
                "--payload rtp-mpegts: --size {} is not a multiple of {TS_PACKET} (the RTP payload is whole TS packets; 1316 = 7 packets)",
                self.size
            ),
            _ => write!(
                f,
                "--payload rtp: --size {} is shorter than the {}-byte loadgen header",
                self.size,
                payload::HEADER_LEN
            ),
        }
    }
}

impl std::error::Error for SizeError {}

/// Why [`unwrap`] refused a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Not RTP version 2, or too short for its header.
    NotRtp,
    /// The RTP sequence number is not the payload's (mod 2^16).
    Sequence,
    /// The RTP payload is not whole TS packets.
    TsLength,
    /// TS packet `index` of the datagram: a wrong sync byte, PID, flags or
    /// continuity counter.
    TsHeader { index: usize },
    /// The inner payload does not check (its error is counted by kind).
    Payload(payload::PayloadError),
}

impl Framing {
    /// Bytes on the wire of a datagram whose `--size` is `size`: the RTP
    /// modes add the 12-byte RTP header to the RTP payload `size`.
    pub fn wire_len(self, size: usize) -> usize {
        match self {
            Self::Loadgen => size,
            Self::Rtp | Self::RtpMpegts => RTP_HEADER + size,
        }
    }

    /// Bytes of the inner payload datagram for `--size` `size`.
    fn inner_len(self, size: usize) -> usize {
        match self {
            Self::Loadgen | Self::Rtp => size,
            Self::RtpMpegts => size / TS_PACKET * TS_PAYLOAD,
        }
    }

    /// Whether `size` can be sent in this framing.
    pub fn check_size(self, size: usize) -> Result<(), SizeError> {
        let ok = match self {
            Self::Loadgen => true,
            Self::Rtp => size >= payload::HEADER_LEN,
            Self::RtpMpegts => size > 0 && size % TS_PACKET == 0,
        };
        if ok {
            Ok(())
        } else {
            Err(SizeError {
                framing: self,
                size,
            })
        }
    }
}

/// Builds datagrams of one framing; keeps the scratch buffer `rtp-mpegts`
/// assembles its inner payload in.
#[derive(Debug, Default)]
pub struct Framer {
    framing: Framing,
    scratch: Vec<u8>,
}

impl Framer {
    pub fn new(framing: Framing) -> Self {
        Self {
            framing,
            scratch: Vec::new(),
        }
    }

    /// Make `buf` datagram `seq` of stream `stream` of run `run` for a
    /// `--size` of `size` (checked with [`Framing::check_size`]) at `rate`
    /// datagrams a second (the RTP timestamp's clock).
    pub fn build(
        &mut self,
        buf: &mut Vec<u8>,
        size: usize,
        run: u32,
        stream: u32,
        seq: u64,
        rate: u64,
    ) {
        let f = self.framing;
        buf.resize(f.wire_len(size), 0);
        if f == Framing::Loadgen {
            payload::write(buf, run, stream, seq);
            return;
        }
        let ticks = u128::from(seq) * 90_000 / u128::from(rate.max(1));
        let timestamp = u32::try_from(ticks & 0xffff_ffff).unwrap_or(0);
        let pt = if f == Framing::Rtp { PT_RTP } else { PT_MP2T };
        write_rtp_header(buf, pt, seq16(seq), timestamp, SSRC);
        let body = &mut buf[RTP_HEADER..];
        if f == Framing::Rtp {
            payload::write(body, run, stream, seq);
            return;
        }
        self.scratch.resize(f.inner_len(size), 0);
        payload::write(&mut self.scratch, run, stream, seq);
        let per = (size / TS_PACKET) as u64;
        for (k, (ts, inner)) in body
            .chunks_exact_mut(TS_PACKET)
            .zip(self.scratch.chunks_exact(TS_PAYLOAD))
            .enumerate()
        {
            ts[..4].copy_from_slice(&ts_header(k == 0, cc(seq, per, k)));
            ts[4..].copy_from_slice(inner);
        }
    }
}

/// The continuity counter of TS packet `k` of datagram `seq` (`per`
/// packets a datagram): the stream's packets count on 0..15 in order.
fn cc(seq: u64, per: u64, k: usize) -> u8 {
    u8::try_from((seq.wrapping_mul(per).wrapping_add(k as u64)) & 0x0f).unwrap_or(0)
}

fn ts_header(unit_start: bool, cc: u8) -> [u8; 4] {
    let [hi, lo] = TS_PID.to_be_bytes();
    [
        0x47,
        (u8::from(unit_start) << 6) | (hi & 0x1f),
        lo,
        0x10 | (cc & 0x0f),
    ]
}

/// The inner payload datagram of `d`, checked against its framing;
/// `scratch` holds it for `rtp-mpegts`. For [`Framing::Loadgen`], `d`
/// itself (its payload is checked by the caller, as before).
pub fn unwrap<'a>(
    framing: Framing,
    d: &'a [u8],
    scratch: &'a mut Vec<u8>,
    run: u32,
) -> Result<&'a [u8], FrameError> {
    if framing == Framing::Loadgen {
        return Ok(d);
    }
    let rtp = parse_rtp(d).ok_or(FrameError::NotRtp)?;
    let body = &d[rtp.payload];
    let inner: &[u8] = if framing == Framing::Rtp {
        body
    } else {
        if body.is_empty() || body.len() % TS_PACKET != 0 {
            return Err(FrameError::TsLength);
        }
        scratch.clear();
        for ts in body.chunks_exact(TS_PACKET) {
            scratch.extend_from_slice(&ts[4..]);
        }
        scratch
    };
    let h = payload::check(inner, run).map_err(FrameError::Payload)?;
    if seq16(h.sequence) != rtp.sequence {
        return Err(FrameError::Sequence);
    }
    if framing == Framing::RtpMpegts {
        let per = (body.len() / TS_PACKET) as u64;
        for (k, ts) in body.chunks_exact(TS_PACKET).enumerate() {
            if ts[..4] != ts_header(k == 0, cc(h.sequence, per, k)) {
                return Err(FrameError::TsHeader { index: k });
            }
        }
    }
    Ok(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(framing: Framing, size: usize, seq: u64) -> Vec<u8> {
        let mut buf = Vec::new();
        Framer::new(framing).build(&mut buf, size, 7, 0, seq, 100_000);
        buf
    }

    #[test]
    fn every_framing_round_trips_and_keeps_the_payload_checkable() {
        for (framing, size, wire) in [
            (Framing::Loadgen, 1316, 1316),
            (Framing::Rtp, 1316, 1328),
            (Framing::RtpMpegts, 1316, 1328),
        ] {
            for seq in [0, 1, 65_535, 65_536, 1 << 40] {
                let d = built(framing, size, seq);
                assert_eq!(d.len(), wire, "{framing:?}");
                let mut scratch = Vec::new();
                let inner = unwrap(framing, &d, &mut scratch, 7).expect("a built datagram unwraps");
                let h = payload::check(inner, 7).expect("its payload checks");
                assert_eq!(h.sequence, seq);
            }
        }
    }

    #[test]
    fn rtp_mpegts_is_seven_ts_packets_whose_counters_count_on_across_datagrams() {
        let mut last: Option<u8> = None;
        for seq in 0..5u64 {
            let d = built(Framing::RtpMpegts, 1316, seq);
            assert_eq!(d[1] & 0x7f, PT_MP2T);
            assert_eq!(u16::from_be_bytes([d[2], d[3]]), seq16(seq));
            let packets: Vec<&[u8]> = d[RTP_HEADER..].chunks(TS_PACKET).collect();
            assert_eq!(packets.len(), 7);
            for (k, ts) in packets.iter().enumerate() {
                assert_eq!(ts.len(), TS_PACKET);
                assert_eq!(ts[0], 0x47, "sync byte");
                assert_eq!(u16::from_be_bytes([ts[1] & 0x1f, ts[2]]), TS_PID);
                assert_eq!(
                    ts[1] & 0x40 != 0,
                    k == 0,
                    "payload-unit start on the first only"
                );
                assert_eq!(ts[1] & 0x80, 0, "no transport error");
                assert_eq!(ts[3] & 0x30, 0x10, "payload only");
                let c = ts[3] & 0x0f;
                if let Some(p) = last {
                    assert_eq!(
                        c,
                        (p + 1) & 0x0f,
                        "continuity counter of seq {seq} packet {k}"
                    );
                }
                last = Some(c);
            }
        }
    }

    #[test]
    fn damage_to_any_layer_is_refused() {
        let mut scratch = Vec::new();
        let d = built(Framing::Rtp, 200, 3);
        let mut bad = d.clone();
        bad[0] = 0x40; // RTP version 1
        assert_eq!(
            unwrap(Framing::Rtp, &bad, &mut scratch, 7),
            Err(FrameError::NotRtp)
        );
        let mut bad = d.clone();
        bad[3] ^= 1; // sequence number
        assert_eq!(
            unwrap(Framing::Rtp, &bad, &mut scratch, 7),
            Err(FrameError::Sequence)
        );
        let mut bad = d.clone();
        bad[150] ^= 1;
        assert!(matches!(
            unwrap(Framing::Rtp, &bad, &mut scratch, 7),
            Err(FrameError::Payload(
                payload::PayloadError::CorruptByte { .. }
            ))
        ));

        let d = built(Framing::RtpMpegts, 1316, 9);
        for (at, want) in [
            (
                RTP_HEADER + 2 * TS_PACKET,
                FrameError::TsHeader { index: 2 },
            ), // sync byte
            (
                RTP_HEADER + 3 * TS_PACKET + 2,
                FrameError::TsHeader { index: 3 },
            ), // PID
            (
                RTP_HEADER + 6 * TS_PACKET + 3,
                FrameError::TsHeader { index: 6 },
            ), // counter
        ] {
            let mut bad = d.clone();
            bad[at] ^= 1;
            assert_eq!(unwrap(Framing::RtpMpegts, &bad, &mut scratch, 7), Err(want));
        }
        let mut bad = d.clone();
        bad[RTP_HEADER + 5 * TS_PACKET + 100] ^= 0x80; // inside a TS payload
        assert!(matches!(
            unwrap(Framing::RtpMpegts, &bad, &mut scratch, 7),
            Err(FrameError::Payload(
                payload::PayloadError::CorruptByte { .. }
            ))
        ));
        assert_eq!(
            unwrap(Framing::RtpMpegts, &d[..d.len() - 1], &mut scratch, 7),
            Err(FrameError::TsLength)
        );
        // The plain framing does not look inside.
        assert_eq!(unwrap(Framing::Loadgen, &d, &mut scratch, 7), Ok(&d[..]));
    }

    #[test]
    fn sizes_that_do_not_fit_the_framing_are_refused() {
        assert!(Framing::RtpMpegts.check_size(1316).is_ok());
        assert!(Framing::RtpMpegts.check_size(1328).is_err());
        assert!(Framing::RtpMpegts.check_size(0).is_err());
        assert!(Framing::Rtp.check_size(24).is_ok());
        assert!(Framing::Rtp.check_size(23).is_err());
        assert!(Framing::Loadgen.check_size(1).is_ok());
    }
}
