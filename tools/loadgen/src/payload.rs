//! The test payload.
//!
//! Every datagram starts with a 24-byte header, all fields big-endian:
//!
//! | offset | size | field                                   |
//! |--------|------|-----------------------------------------|
//! | 0      | 4    | magic `b"MCRL"` (`0x4d43524c`)          |
//! | 4      | 4    | run id                                  |
//! | 8      | 8    | sequence number                         |
//! | 16     | 4    | stream id                               |
//! | 20     | 4    | total datagram length (header included) |
//!
//! followed by a byte pattern that depends on the sequence number and the
//! byte's offset, so a corrupted, truncated, stale or misdelivered datagram
//! is detected by [`check`]. The pattern is defined on little-endian 64-bit
//! words at offsets that are multiples of 8 (cut short at the end): the
//! word at offset `8w` is `key(seq) ^ (w * 0x0101010101010101)`, where
//! `key` mixes every bit of the sequence number into every byte. Building
//! and checking it costs a few nanoseconds per 1 kB.
//!
//! Datagrams shorter than [`HEADER_LEN`] (sizes down to 1 byte are allowed,
//! for byte-exact size tests) carry only a prefix of the header. They cannot
//! be attributed to a sequence number, so [`check`] reports them as
//! [`PayloadError::Short`] and receivers count them as "short" (received but
//! unvalidated), never as corrupt.

/// `b"MCRL"`.
pub const MAGIC: u32 = 0x4d43_524c;
/// Bytes of header at the start of every full-size datagram.
pub const HEADER_LEN: usize = 24;

/// The decoded header of a valid datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub run_id: u32,
    pub sequence: u64,
    pub stream_id: u32,
    /// Total datagram length, header included.
    pub len: u32,
}

/// Why a datagram failed [`check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadError {
    /// Shorter than the header: received, but not checkable.
    Short,
    /// Not a loadgen datagram.
    BadMagic,
    /// A loadgen datagram of another run (carries that run's id).
    WrongRun(u32),
    /// The header's length differs from the datagram's (truncated or padded).
    LengthMismatch { header: u32, actual: usize },
    /// The first pattern byte that differs.
    CorruptByte { offset: usize },
}

impl std::fmt::Display for PayloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Short => write!(f, "shorter than the {HEADER_LEN}-byte header"),
            Self::BadMagic => write!(f, "bad magic"),
            Self::WrongRun(r) => write!(f, "datagram of run {r}"),
            Self::LengthMismatch { header, actual } => {
                write!(f, "header says {header} bytes, datagram has {actual}")
            }
            Self::CorruptByte { offset } => write!(f, "corrupt byte at offset {offset}"),
        }
    }
}

impl std::error::Error for PayloadError {}

/// Per-datagram key of the pattern: every bit of the sequence number
/// influences every byte of it.
#[inline]
fn key(sequence: u64) -> u64 {
    sequence.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29) ^ sequence
}

/// The pattern is built and checked 8 bytes at a time: bytes `8w..8w+8` of
/// a datagram (little-endian) are `word(key, w)`, from the first word after
/// the header on.
#[inline]
fn word(key: u64, w: u64) -> u64 {
    key ^ w.wrapping_mul(0x0101_0101_0101_0101)
}

/// Index of the first pattern word.
const FIRST_WORD: u64 = (HEADER_LEN / 8) as u64;

/// The header bytes of datagram `sequence` of total length `len`.
fn header_bytes(run_id: u32, stream_id: u32, sequence: u64, len: usize) -> [u8; HEADER_LEN] {
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&run_id.to_be_bytes());
    h[8..16].copy_from_slice(&sequence.to_be_bytes());
    h[16..20].copy_from_slice(&stream_id.to_be_bytes());
    h[20..24].copy_from_slice(&len.to_be_bytes());
    h
}

/// Fill `buf` (its whole length is the datagram) with datagram `sequence`
/// of stream `stream_id` of run `run_id`. Buffers shorter than the header
/// get its prefix.
pub fn write(buf: &mut [u8], run_id: u32, stream_id: u32, sequence: u64) {
    let header = header_bytes(run_id, stream_id, sequence, buf.len());
    let n = buf.len().min(HEADER_LEN);
    buf[..n].copy_from_slice(&header[..n]);
    let k = key(sequence);
    if let Some(body) = buf.get_mut(HEADER_LEN..) {
        let mut chunks = body.chunks_exact_mut(8);
        let mut w = FIRST_WORD;
        for chunk in &mut chunks {
            chunk.copy_from_slice(&word(k, w).to_le_bytes());
            w += 1;
        }
        let tail = chunks.into_remainder();
        tail.copy_from_slice(&word(k, w).to_le_bytes()[..tail.len()]);
    }
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

/// Check a received datagram of run `run_id` byte by byte. Never panics,
/// whatever `buf` holds.
pub fn check(buf: &[u8], run_id: u32) -> Result<Header, PayloadError> {
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Err(PayloadError::Short);
    };
    if be32(h, 0) != MAGIC {
        return Err(PayloadError::BadMagic);
    }
    let run = be32(h, 4);
    if run != run_id {
        return Err(PayloadError::WrongRun(run));
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&h[8..16]);
    let header = Header {
        run_id: run,
        sequence: u64::from_be_bytes(seq),
        stream_id: be32(h, 16),
        len: be32(h, 20),
    };
    if usize::try_from(header.len).ok() != Some(buf.len()) {
        return Err(PayloadError::LengthMismatch {
            header: header.len,
            actual: buf.len(),
        });
    }
    let k = key(header.sequence);
    let body = &buf[HEADER_LEN..];
    let mut chunks = body.chunks_exact(8);
    let mut w = FIRST_WORD;
    let mut at = HEADER_LEN;
    for chunk in &mut chunks {
        let mut got = [0u8; 8];
        got.copy_from_slice(chunk);
        let diff = u64::from_le_bytes(got) ^ word(k, w);
        if diff != 0 {
            let byte = usize::try_from(diff.trailing_zeros() / 8).unwrap_or(0);
            return Err(PayloadError::CorruptByte { offset: at + byte });
        }
        w += 1;
        at += 8;
    }
    let expected = word(k, w).to_le_bytes();
    if let Some(byte) = chunks
        .remainder()
        .iter()
        .zip(expected)
        .position(|(&b, e)| b != e)
    {
        return Err(PayloadError::CorruptByte { offset: at + byte });
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn write_check_round_trip(len in 1usize..=9000, seq: u64, run: u32, stream: u32) {
            let mut buf = vec![0u8; len];
            write(&mut buf, run, stream, seq);
            if len < HEADER_LEN {
                prop_assert_eq!(check(&buf, run), Err(PayloadError::Short));
                let full = header_bytes(run, stream, seq, len);
                prop_assert_eq!(&buf[..], &full[..len]);
            } else {
                let h = check(&buf, run).expect("valid");
                prop_assert_eq!(h, Header { run_id: run, sequence: seq, stream_id: stream, len: u32::try_from(len).expect("small") });
                prop_assert_eq!(check(&buf, run.wrapping_add(1)), Err(PayloadError::WrongRun(run)));
            }
        }

        #[test]
        fn any_payload_flip_is_caught(len in 25usize..=9000, seq: u64, run: u32, at: prop::sample::Index, bits in 1u8..=255) {
            let mut buf = vec![0u8; len];
            write(&mut buf, run, 3, seq);
            let offset = HEADER_LEN + at.index(len - HEADER_LEN);
            buf[offset] ^= bits;
            prop_assert_eq!(check(&buf, run), Err(PayloadError::CorruptByte { offset }));
        }

        #[test]
        fn magic_run_and_length_flips_are_caught(len in 24usize..=2000, seq: u64, run: u32, at in prop::sample::select(vec![0usize, 1, 2, 3, 4, 5, 6, 7, 20, 21, 22, 23]), bits in 1u8..=255) {
            let mut buf = vec![0u8; len];
            write(&mut buf, run, 3, seq);
            buf[at] ^= bits;
            prop_assert!(check(&buf, run).is_err());
        }

        #[test]
        fn another_sequence_is_caught(len in 40usize..=2000, seq: u64, other: u64) {
            prop_assume!(seq != other);
            let mut a = vec![0u8; len];
            let mut b = vec![0u8; len];
            write(&mut a, 1, 0, seq);
            write(&mut b, 1, 0, other);
            // A stale header on another datagram's body.
            a[8..16].copy_from_slice(&other.to_be_bytes());
            let caught = matches!(check(&a, 1), Err(PayloadError::CorruptByte { .. }));
            prop_assert!(caught || a == b, "stale header undetected");
        }

        #[test]
        fn garbage_never_panics(buf in prop::collection::vec(any::<u8>(), 0..300), run: u32) {
            let _ = check(&buf, run);
        }
    }

    #[test]
    fn short_and_truncated_datagrams() {
        let mut buf = vec![0u8; 100];
        write(&mut buf, 1, 0, 5);
        assert_eq!(check(&buf, 1).map(|h| h.sequence), Ok(5));
        assert_eq!(check(&buf[..10], 1), Err(PayloadError::Short));
        assert_eq!(
            check(&buf[..60], 1),
            Err(PayloadError::LengthMismatch {
                header: 100,
                actual: 60
            })
        );
        assert_eq!(check(&[0u8; 40], 1), Err(PayloadError::BadMagic));
        let mut tiny = [0u8; 3];
        write(&mut tiny, 1, 0, 5);
        assert_eq!(&tiny, b"MCR");
    }
}
