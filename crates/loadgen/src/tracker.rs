//! Receiver-side accounting of one stream of sequence numbers.

/// Counts what arrived against what should have.
#[derive(Debug, Default, Clone)]
pub struct Tracker {
    pub received: u64,
    pub valid: u64,
    pub corrupt: u64,
    pub short: u64,
    pub duplicates: u64,
    /// Arrived after a higher sequence number had.
    pub reordered: u64,
    pub min_len: Option<usize>,
    pub max_len: usize,
    highest: Option<u64>,
    /// Bit per sequence number seen (grown on demand, bounded by `limit`).
    seen: Vec<u64>,
    limit: u64,
}

impl Tracker {
    /// Track sequence numbers below `limit` exactly (duplicates included);
    /// higher ones count as received but not for duplicate detection.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    pub fn on_invalid(&mut self, len: usize, short: bool) {
        self.on_len(len);
        self.received += 1;
        if short {
            self.short += 1
        } else {
            self.corrupt += 1
        }
    }

    fn on_len(&mut self, len: usize) {
        self.min_len = Some(self.min_len.map_or(len, |m| m.min(len)));
        self.max_len = self.max_len.max(len);
    }

    pub fn on_valid(&mut self, sequence: u64, len: usize) {
        self.on_len(len);
        self.received += 1;
        self.valid += 1;
        if self.highest.is_some_and(|h| sequence < h) {
            self.reordered += 1;
        }
        self.highest = Some(self.highest.map_or(sequence, |h| h.max(sequence)));
        if sequence < self.limit {
            let (word, bit) = (
                usize::try_from(sequence / 64).unwrap_or(usize::MAX),
                sequence % 64,
            );
            if self.seen.len() <= word {
                self.seen.resize(word + 1, 0);
            }
            if self.seen[word] & (1 << bit) != 0 {
                self.duplicates += 1;
            }
            self.seen[word] |= 1 << bit;
        }
    }

    /// Distinct valid sequence numbers seen.
    pub fn unique(&self) -> u64 {
        self.valid - self.duplicates
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_duplicates_and_reorders() {
        let mut t = Tracker::new(1000);
        for s in [0, 1, 2, 2, 5, 3, 4] {
            t.on_valid(s, 100);
        }
        t.on_invalid(10, true);
        assert_eq!(
            (
                t.received,
                t.valid,
                t.duplicates,
                t.reordered,
                t.unique(),
                t.short
            ),
            (8, 7, 1, 2, 6, 1)
        );
        assert_eq!((t.min_len, t.max_len), (Some(10), 100));
    }
}
