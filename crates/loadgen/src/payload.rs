//! The test payload: a 24-byte header (magic "MCRL", run id, sequence,
//! stream id, total length; big-endian) followed by bytes that depend on the
//! sequence number and position, so a corrupted, truncated, stale or
//! misdelivered datagram is always detected. Datagrams shorter than the
//! header carry a prefix of it and are counted as "short" (not validated).

/// `b"MCRL"`.
pub const MAGIC: u32 = 0x4d43_524c;
pub const HEADER_LEN: usize = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub run_id: u32,
    pub sequence: u64,
    pub stream_id: u32,
    pub len: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadError {
    /// Shorter than the header: not checkable.
    Short,
    BadMagic,
    WrongRun(u32),
    /// The header's length differs from the datagram's.
    LengthMismatch {
        header: u32,
        actual: usize,
    },
    CorruptByte {
        offset: usize,
    },
}

/// The pattern byte at `offset` of datagram `sequence`.
#[inline]
fn pattern(sequence: u64, offset: usize) -> u8 {
    // Every bit of the sequence number reaches every byte position.
    let mixed = sequence.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29) ^ sequence;
    let o = offset.to_le_bytes();
    mixed.to_le_bytes()[offset % 8]
        .wrapping_add(o[0])
        .wrapping_add(o[1].wrapping_mul(7))
}

/// Fill `buf` (its whole length is the datagram) with datagram `sequence`.
pub fn write(buf: &mut [u8], run_id: u32, stream_id: u32, sequence: u64) {
    let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
    let mut header = [0u8; HEADER_LEN];
    header[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    header[4..8].copy_from_slice(&run_id.to_be_bytes());
    header[8..16].copy_from_slice(&sequence.to_be_bytes());
    header[16..20].copy_from_slice(&stream_id.to_be_bytes());
    header[20..24].copy_from_slice(&len.to_be_bytes());
    let n = buf.len().min(HEADER_LEN);
    buf[..n].copy_from_slice(&header[..n]);
    for (i, b) in buf.iter_mut().enumerate().skip(HEADER_LEN) {
        *b = pattern(sequence, i);
    }
}

/// Check a received datagram of run `run_id` byte by byte.
pub fn check(buf: &[u8], run_id: u32) -> Result<Header, PayloadError> {
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Err(PayloadError::Short);
    };
    let be32 = |r: std::ops::Range<usize>| {
        let mut a = [0u8; 4];
        a.copy_from_slice(&h[r]);
        u32::from_be_bytes(a)
    };
    if be32(0..4) != MAGIC {
        return Err(PayloadError::BadMagic);
    }
    let run = be32(4..8);
    if run != run_id {
        return Err(PayloadError::WrongRun(run));
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&h[8..16]);
    let header = Header {
        run_id: run,
        sequence: u64::from_be_bytes(seq),
        stream_id: be32(16..20),
        len: be32(20..24),
    };
    if usize::try_from(header.len).ok() != Some(buf.len()) {
        return Err(PayloadError::LengthMismatch {
            header: header.len,
            actual: buf.len(),
        });
    }
    if let Some(offset) = (HEADER_LEN..buf.len()).find(|&i| buf[i] != pattern(header.sequence, i)) {
        return Err(PayloadError::CorruptByte { offset });
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip_and_any_flip_is_caught(len in 24usize..=9000, seq: u64, run: u32, flip in any::<prop::sample::Index>()) {
            let mut buf = vec![0u8; len];
            write(&mut buf, run, 7, seq);
            let h = check(&buf, run).expect("valid");
            prop_assert_eq!((h.sequence, h.stream_id, h.len as usize), (seq, 7, len));
            prop_assert_eq!(check(&buf, run.wrapping_add(1)), Err(PayloadError::WrongRun(run)));
            // Magic, run id, length and every payload byte are checked; the
            // sequence and stream fields are data (a flip there reads as
            // another datagram, caught by the pattern when there is one).
            let checked: Vec<usize> = (0..8).chain(20..len).collect();
            let i = checked[flip.index(checked.len())];
            buf[i] ^= 0x40;
            prop_assert!(check(&buf, run).is_err(), "flip at {} undetected", i);
        }
    }

    #[test]
    fn short_and_truncated_datagrams() {
        let mut buf = vec![0u8; 100];
        write(&mut buf, 1, 0, 5);
        assert_eq!(check(&buf[..10], 1), Err(PayloadError::Short));
        assert_eq!(
            check(&buf[..60], 1),
            Err(PayloadError::LengthMismatch {
                header: 100,
                actual: 60
            })
        );
        let mut tiny = [0u8; 3];
        write(&mut tiny, 1, 0, 5);
        assert_eq!(&tiny, b"MCR");
    }
}
