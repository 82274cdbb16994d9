//! The layout of a `TPACKET_V3` ring block (linux/if_packet.h), read as
//! bytes: the frames the kernel copied into one block, each behind a
//! `tpacket3_hdr`; and of one `TPACKET_V2` frame slot ([`frame_v2`]). Pure: the data plane maps the ring and hands a block it
//! owns here as a slice; every offset and length found inside the block is
//! checked against the slice, so a corrupt block can't make this read
//! outside it or loop forever.

use crate::frame::Reject;

/// Offsets in `struct tpacket_block_desc` (its `hdr` is `tpacket_hdr_v1`).
pub const BLOCK_STATUS: usize = 8;
/// Frames in the block.
pub const NUM_PKTS: usize = 12;
/// Offset of the first frame's header from the block's start.
pub const FIRST_PKT: usize = 16;
/// Offsets in `struct tpacket3_hdr`.
pub const NEXT_OFFSET: usize = 0;
/// Bytes of the frame captured.
pub const SNAPLEN: usize = 12;
/// The frame's `tp_status`.
pub const STATUS: usize = 20;
/// Offset of the frame's first (Ethernet) byte from its header.
pub const MAC: usize = 24;

/// `TP_STATUS_CSUMNOTREADY | TP_STATUS_CSUM_VALID`: the kernel verified the
/// checksum, or it is not filled in yet (the frame came from this host).
const CHECKSUM_SETTLED: u32 = (1 << 3) | (1 << 7);

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let b = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_ne_bytes([b[0], b[1]]))
}

/// One frame of a block: its bytes, and whether its UDP checksum still
/// needs checking in software.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingFrame<'a> {
    /// From the Ethernet header on.
    pub bytes: &'a [u8],
    /// `false` when the kernel says the checksum is settled.
    pub verify_checksum: bool,
}

/// The frames of `block`, in order; a header that points outside the block
/// ends the walk with `Err(Reject::Truncated)`.
pub fn frames(block: &[u8]) -> Frames<'_> {
    let count = read_u32(block, NUM_PKTS).unwrap_or(0);
    let at = read_u32(block, FIRST_PKT).map_or(usize::MAX, |v| v as usize);
    Frames {
        block,
        left: count,
        at,
    }
}

/// Offsets in `struct tpacket2_hdr` (a `TPACKET_V2` frame slot starts
/// with it): `tp_status`, `tp_len`, `tp_snaplen`, `tp_mac`.
pub const V2_STATUS: usize = 0;
pub const V2_LEN: usize = 4;
pub const V2_SNAPLEN: usize = 8;
pub const V2_MAC: usize = 12;

/// The frame in one `TPACKET_V2` slot the kernel has handed over. A frame
/// the kernel cut short (longer than the slot: `tp_len` > `tp_snaplen`),
/// or a header pointing outside the slot, is `Err(Reject::Truncated)`.
pub fn frame_v2(slot: &[u8]) -> Result<RingFrame<'_>, Reject> {
    let (Some(status), Some(len), Some(snaplen), Some(mac)) = (
        read_u32(slot, V2_STATUS),
        read_u32(slot, V2_LEN),
        read_u32(slot, V2_SNAPLEN),
        read_u16(slot, V2_MAC),
    ) else {
        return Err(Reject::Truncated);
    };
    if len != snaplen {
        return Err(Reject::Truncated);
    }
    let start = usize::from(mac);
    let bytes = start
        .checked_add(snaplen as usize)
        .and_then(|end| slot.get(start..end))
        .ok_or(Reject::Truncated)?;
    Ok(RingFrame {
        bytes,
        verify_checksum: status & CHECKSUM_SETTLED == 0,
    })
}

/// A `TPACKET_V2` slot of `slot_bytes` as the kernel fills it: `frame` at
/// the kernel's Ethernet offset (66), `status`, `len` as `tp_len` (for
/// tests).
pub fn build_slot_v2(frame: &[u8], len: usize, status: u32, slot_bytes: usize) -> Vec<u8> {
    let mut b = vec![0u8; slot_bytes];
    let mac = 66usize;
    b[V2_STATUS..V2_STATUS + 4].copy_from_slice(&status.to_ne_bytes());
    b[V2_LEN..V2_LEN + 4].copy_from_slice(&u32::try_from(len).unwrap_or(0).to_ne_bytes());
    b[V2_SNAPLEN..V2_SNAPLEN + 4]
        .copy_from_slice(&u32::try_from(frame.len()).unwrap_or(0).to_ne_bytes());
    b[V2_MAC..V2_MAC + 2].copy_from_slice(&u16::try_from(mac).unwrap_or(0).to_ne_bytes());
    let end = (mac + frame.len()).min(slot_bytes);
    b[mac..end].copy_from_slice(&frame[..end - mac]);
    b
}

/// Iterator returned by [`frames`].
#[derive(Debug, Clone)]
pub struct Frames<'a> {
    block: &'a [u8],
    left: u32,
    at: usize,
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<RingFrame<'a>, Reject>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let header = self.block.get(self.at..).unwrap_or(&[]);
        let (Some(next), Some(snaplen), Some(status), Some(mac)) = (
            read_u32(header, NEXT_OFFSET),
            read_u32(header, SNAPLEN),
            read_u32(header, STATUS),
            read_u16(header, MAC),
        ) else {
            self.left = 0;
            return Some(Err(Reject::Truncated));
        };
        let start = usize::from(mac);
        let frame = start
            .checked_add(snaplen as usize)
            .and_then(|end| header.get(start..end));
        // A zero next offset ends the block; one that doesn't move forward
        // would loop.
        if next == 0 {
            self.left = 0;
        } else {
            self.at = self.at.saturating_add(next as usize);
        }
        Some(match frame {
            Some(bytes) => Ok(RingFrame {
                bytes,
                verify_checksum: status & CHECKSUM_SETTLED == 0,
            }),
            None => Err(Reject::Truncated),
        })
    }
}

/// A block as the kernel lays it out, holding `frames` with `status` each
/// (for tests and benchmarks).
pub fn build_block(frames: &[&[u8]], status: u32, block_bytes: usize) -> Vec<u8> {
    fn put(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
    let mut b = vec![0u8; block_bytes];
    let first = 48;
    put(&mut b, NUM_PKTS, u32::try_from(frames.len()).unwrap_or(0));
    put(&mut b, FIRST_PKT, first);
    let mut at = first as usize;
    for (k, f) in frames.iter().enumerate() {
        let mac = 68usize;
        let len = (mac + f.len()).next_multiple_of(16);
        let next = if k + 1 == frames.len() { 0 } else { len };
        put(&mut b, at + NEXT_OFFSET, u32::try_from(next).unwrap_or(0));
        put(&mut b, at + SNAPLEN, u32::try_from(f.len()).unwrap_or(0));
        put(&mut b, at + STATUS, status);
        b[at + MAC..at + MAC + 2].copy_from_slice(&u16::try_from(mac).unwrap_or(0).to_ne_bytes());
        b[at + mac..at + mac + f.len()].copy_from_slice(f);
        at += len;
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_walked_with_their_checksum_state() {
        let b = build_block(&[b"first", b"second"], 1 | (1 << 3), 4096);
        let got: Vec<_> = frames(&b).collect();
        assert_eq!(
            got,
            [
                Ok(RingFrame {
                    bytes: b"first",
                    verify_checksum: false
                }),
                Ok(RingFrame {
                    bytes: b"second",
                    verify_checksum: false
                }),
            ]
        );
        let b = build_block(&[b"x"], 1, 4096);
        assert!(frames(&b).all(|f| f.is_ok_and(|f| f.verify_checksum)));
    }

    #[test]
    fn v2_slots_are_read_with_their_checksum_state() {
        let s = build_slot_v2(b"frame bytes", 11, 1 | (1 << 7), 2048);
        assert_eq!(
            frame_v2(&s),
            Ok(RingFrame {
                bytes: b"frame bytes",
                verify_checksum: false
            })
        );
        let s = build_slot_v2(b"x", 1, 1, 2048);
        assert!(frame_v2(&s).is_ok_and(|f| f.verify_checksum));
        // Cut short by the kernel: longer on the wire than in the slot.
        let s = build_slot_v2(b"partial", 3000, 1, 2048);
        assert_eq!(frame_v2(&s), Err(Reject::Truncated));
        // A header pointing outside the slot.
        let mut s = build_slot_v2(b"abc", 3, 1, 128);
        s[V2_MAC..V2_MAC + 2].copy_from_slice(&200u16.to_ne_bytes());
        assert_eq!(frame_v2(&s), Err(Reject::Truncated));
        assert_eq!(frame_v2(&[0u8; 8]), Err(Reject::Truncated));
        assert_eq!(frame_v2(&[]), Err(Reject::Truncated));
    }

    #[test]
    fn corrupt_blocks_end_the_walk_inside_the_block() {
        let mut b = build_block(&[b"a", b"b"], 1, 4096);
        b[FIRST_PKT..FIRST_PKT + 4].copy_from_slice(&5000u32.to_ne_bytes());
        assert_eq!(frames(&b).collect::<Vec<_>>(), [Err(Reject::Truncated)]);
        let mut b = build_block(&[b"a"], 1, 4096);
        b[48 + SNAPLEN..48 + SNAPLEN + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(frames(&b).collect::<Vec<_>>(), [Err(Reject::Truncated)]);
        // A count far above what the block holds stops at the first bad header.
        let mut b = build_block(&[b"a"], 1, 4096);
        b[NUM_PKTS..NUM_PKTS + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(frames(&b).take(10).count() <= 2);
        assert_eq!(frames(&[]).count(), 0);
    }
}
