//! Receiver-side accounting: a [`Tracker`] per stream of sequence numbers,
//! and [`Streams`], the set of them a receiver keeps plus the datagrams that
//! could not be attributed to a stream (short, corrupt, foreign).

use std::collections::BTreeMap;

use crate::payload::{self, PayloadError};

/// Sequence numbers tracked exactly per stream by default (1 bit each, the
/// bitmap grows on demand).
pub const DEFAULT_LIMIT: u64 = 1 << 28;

/// Counts what arrived of one stream against what should have.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tracker {
    /// Valid datagrams of this stream, duplicates included.
    pub received: u64,
    /// Sequence numbers seen more than once (each extra copy counts).
    pub duplicates: u64,
    /// Arrived after a higher sequence number had.
    pub reordered: u64,
    highest: Option<u64>,
    /// Bit per sequence number below `limit` seen (grown on demand).
    seen: Vec<u64>,
    unique: u64,
    limit: u64,
}

impl Tracker {
    /// Track sequence numbers below `limit` exactly; higher ones (only a
    /// hostile or very long run sends them) count as received and unique
    /// but are not checked for duplicates.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// One valid datagram with `sequence` arrived.
    pub fn on_sequence(&mut self, sequence: u64) {
        self.received += 1;
        if self.highest.is_some_and(|h| sequence < h) {
            self.reordered += 1;
        }
        self.highest = Some(self.highest.map_or(sequence, |h| h.max(sequence)));
        if sequence >= self.limit {
            self.unique += 1;
            return;
        }
        let (Ok(word), bit) = (usize::try_from(sequence / 64), sequence % 64) else {
            self.unique += 1;
            return;
        };
        if self.seen.len() <= word {
            self.seen.resize(word + 1, 0);
        }
        if self.seen[word] & (1 << bit) != 0 {
            self.duplicates += 1;
        } else {
            self.seen[word] |= 1 << bit;
            self.unique += 1;
        }
    }

    /// Distinct sequence numbers seen.
    pub fn unique(&self) -> u64 {
        self.unique
    }

    /// The highest sequence number seen.
    pub fn highest(&self) -> Option<u64> {
        self.highest
    }

    /// Sequence numbers missing below the highest one seen (senders start
    /// at 0): loss that is certain even without knowing how many were sent.
    pub fn gaps(&self) -> u64 {
        self.highest
            .map_or(0, |h| h.saturating_add(1).saturating_sub(self.unique))
    }

    /// Datagrams missing when `expected` were sent (0..expected).
    pub fn lost(&self, expected: u64) -> u64 {
        expected.saturating_sub(self.unique)
    }
}

/// Most streams tracked separately; datagrams of further streams count as
/// `untracked` (keeps a hostile sender from exhausting memory).
pub const MAX_STREAMS: usize = 1024;

/// Everything a receiver counts.
#[derive(Debug, Clone)]
pub struct Streams {
    /// Every datagram, whatever it held.
    pub received: u64,
    /// Passed [`payload::check`].
    pub valid: u64,
    /// Shorter than the header: received, unvalidated.
    pub short: u64,
    /// Bad magic, wrong length or a corrupt pattern byte.
    pub corrupt: u64,
    /// Well-formed headers of another run id.
    pub wrong_run: u64,
    /// Valid datagrams of streams beyond [`MAX_STREAMS`].
    pub untracked: u64,
    pub min_len: Option<usize>,
    pub max_len: usize,
    pub streams: BTreeMap<u32, Tracker>,
    limit: u64,
}

impl Streams {
    /// See [`Tracker::new`] for `limit`.
    pub fn new(limit: u64) -> Self {
        Self {
            received: 0,
            valid: 0,
            short: 0,
            corrupt: 0,
            wrong_run: 0,
            untracked: 0,
            min_len: None,
            max_len: 0,
            streams: BTreeMap::new(),
            limit,
        }
    }

    /// Check and count one received datagram of run `run_id`.
    pub fn on_datagram(&mut self, data: &[u8], run_id: u32) -> Result<(), PayloadError> {
        let len = data.len();
        self.received += 1;
        self.min_len = Some(self.min_len.map_or(len, |m| m.min(len)));
        self.max_len = self.max_len.max(len);
        match payload::check(data, run_id) {
            Ok(h) => {
                self.valid += 1;
                let n = self.streams.len();
                match self.streams.get_mut(&h.stream_id) {
                    Some(t) => t.on_sequence(h.sequence),
                    None if n < MAX_STREAMS => {
                        let mut t = Tracker::new(self.limit);
                        t.on_sequence(h.sequence);
                        self.streams.insert(h.stream_id, t);
                    }
                    None => self.untracked += 1,
                }
                Ok(())
            }
            Err(e) => {
                self.count_error(e);
                Err(e)
            }
        }
    }

    /// Count a datagram of `len` bytes that failed its check before
    /// [`Self::on_datagram`] could see it (its RTP or TS framing, or the
    /// payload inside it), by the kind of `e`.
    pub fn on_unchecked(&mut self, len: usize, e: PayloadError) {
        self.received += 1;
        self.min_len = Some(self.min_len.map_or(len, |m| m.min(len)));
        self.max_len = self.max_len.max(len);
        self.count_error(e);
    }

    fn count_error(&mut self, e: PayloadError) {
        match e {
            PayloadError::Short => self.short += 1,
            PayloadError::WrongRun(_) => self.wrong_run += 1,
            PayloadError::BadMagic
            | PayloadError::LengthMismatch { .. }
            | PayloadError::CorruptByte { .. } => self.corrupt += 1,
        }
    }

    fn sum(&self, f: impl Fn(&Tracker) -> u64) -> u64 {
        self.streams.values().map(f).sum()
    }

    pub fn unique(&self) -> u64 {
        self.sum(Tracker::unique) + self.untracked
    }

    pub fn duplicates(&self) -> u64 {
        self.sum(|t| t.duplicates)
    }

    pub fn reordered(&self) -> u64 {
        self.sum(|t| t.reordered)
    }

    pub fn gaps(&self) -> u64 {
        self.sum(Tracker::gaps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn counts_duplicates_reorders_and_gaps() {
        let mut t = Tracker::new(1000);
        for s in [0, 1, 2, 2, 5, 3, 4, 9] {
            t.on_sequence(s);
        }
        assert_eq!(
            (t.received, t.duplicates, t.reordered, t.unique(), t.gaps()),
            (8, 1, 2, 7, 3)
        );
        assert_eq!(t.lost(12), 5);
    }

    #[test]
    fn streams_sort_out_what_arrives() {
        let mut s = Streams::new(1000);
        let mut buf = vec![0u8; 100];
        for (stream, seq) in [(0, 0), (0, 1), (1, 0), (1, 0)] {
            payload::write(&mut buf, 7, stream, seq);
            assert!(s.on_datagram(&buf, 7).is_ok());
        }
        payload::write(&mut buf, 8, 0, 2);
        assert!(s.on_datagram(&buf, 7).is_err());
        buf[50] ^= 1;
        assert!(s.on_datagram(&buf, 8).is_err());
        assert!(s.on_datagram(&buf[..5], 7).is_err());
        assert_eq!(
            (
                s.received,
                s.valid,
                s.wrong_run,
                s.corrupt,
                s.short,
                s.unique(),
                s.duplicates()
            ),
            (7, 4, 1, 1, 1, 3, 1)
        );
        assert_eq!((s.min_len, s.max_len), (Some(5), 100));
    }

    proptest! {
        /// The tracker against a set-based model.
        #[test]
        fn tracker_matches_model(seqs in prop::collection::vec(0u64..300, 0..600), limit in prop::sample::select(vec![0u64, 64, 150, 1000])) {
            let mut t = Tracker::new(limit);
            let mut seen = HashSet::new();
            let (mut dups, mut reordered, mut high) = (0u64, 0u64, None::<u64>);
            let mut unique_above = 0u64;
            for &s in &seqs {
                t.on_sequence(s);
                if high.is_some_and(|h| s < h) {
                    reordered += 1;
                }
                high = high.max(Some(s));
                if s >= limit {
                    unique_above += 1;
                } else if !seen.insert(s) {
                    dups += 1;
                }
            }
            let unique = seen.len() as u64 + unique_above;
            prop_assert_eq!(t.received, seqs.len() as u64);
            prop_assert_eq!(t.duplicates, dups);
            prop_assert_eq!(t.reordered, reordered);
            prop_assert_eq!(t.unique(), unique);
            prop_assert_eq!(t.highest(), high);
            prop_assert_eq!(t.lost(300), 300u64.saturating_sub(unique));
            if limit >= 300 {
                // Exact: the gaps are the numbers below the highest never seen.
                let gaps = high.map_or(0, |h| (0..=h).filter(|s| !seen.contains(s)).count() as u64);
                prop_assert_eq!(t.gaps(), gaps);
            }
        }
    }
}
