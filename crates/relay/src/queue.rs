//! An output's queue of datagrams waiting for the end of the completion
//! batch, and how it is cut into runs for UDP GSO sends.

use super::ids::Slot;

/// Datagrams one GSO send carries at most (the kernel allows 64 on every
/// version with UDP GSO, 128 on newer ones).
pub const MAX_SEGMENTS: usize = 64;

/// Payload bytes one GSO send carries at most: the whole run travels as one
/// IP datagram up to segmentation, so it must stay below 64 KiB with IPv4
/// or IPv6 and UDP headers on top.
pub const MAX_GSO_BYTES: usize = 65_000;

/// Sends an output can have queued in one completion batch: one per
/// completion at most, and a batch has at most this many.
pub const QUEUE_CAPACITY: usize = 64;

/// One queued datagram: its in-flight slot and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    pub slot: Slot,
    pub len: usize,
}

/// The datagrams queued for one output in the current completion batch:
/// bounded by [`QUEUE_CAPACITY`].
#[derive(Debug)]
pub struct SendQueue {
    items: [Queued; QUEUE_CAPACITY],
    len: usize,
}

impl Default for SendQueue {
    fn default() -> Self {
        Self {
            items: [Queued { slot: 0, len: 0 }; QUEUE_CAPACITY],
            len: 0,
        }
    }
}

impl SendQueue {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Datagrams it can still take this batch.
    pub fn room(&self) -> usize {
        QUEUE_CAPACITY - self.len
    }

    /// Queue a datagram; `false` when full (the caller flushes first).
    pub fn push(&mut self, q: Queued) -> bool {
        match self.items.get_mut(self.len) {
            Some(item) => {
                *item = q;
                self.len += 1;
                true
            }
            None => false,
        }
    }

    /// Everything queued, in order.
    pub fn items(&self) -> &[Queued] {
        self.items.get(..self.len).unwrap_or_default()
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The length of the run starting at `at`: consecutive datagrams of
    /// one size, `gso_max` bytes or less each (0 disables grouping),
    /// optionally ended by one shorter non-empty datagram, within
    /// [`MAX_SEGMENTS`] and [`MAX_GSO_BYTES`]. A run of one is a plain
    /// send; 0 means nothing is left.
    pub fn run_len(&self, at: usize, gso_max: usize) -> usize {
        let rest = self.items().get(at..).unwrap_or_default();
        let Some(first) = rest.first() else {
            return 0;
        };
        let size = first.len;
        let mut n = 1;
        if size == 0 || size > gso_max {
            return n;
        }
        let mut bytes = size;
        for q in &rest[1..] {
            if n == MAX_SEGMENTS || bytes + q.len > MAX_GSO_BYTES {
                break;
            }
            if q.len == size {
                n += 1;
                bytes += q.len;
            } else {
                if q.len > 0 && q.len < size {
                    n += 1;
                }
                break;
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(lens: &[usize]) -> SendQueue {
        let mut q = SendQueue::default();
        for (i, &len) in lens.iter().enumerate() {
            assert!(q.push(Queued {
                slot: u32::try_from(i).expect("small"),
                len,
            }));
        }
        q
    }

    fn runs(lens: &[usize], gso_max: usize) -> Vec<Vec<usize>> {
        let q = queue(lens);
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let n = q.run_len(at, gso_max);
            if n == 0 {
                return out;
            }
            out.push(q.items()[at..at + n].iter().map(|q| q.len).collect());
            at += n;
        }
    }

    #[test]
    fn same_size_datagrams_group_and_a_shorter_one_ends_a_run() {
        assert_eq!(
            runs(&[100, 100, 100, 50, 100, 200], 9000),
            vec![vec![100, 100, 100, 50], vec![100], vec![200]]
        );
        assert_eq!(
            runs(&[100, 200, 200], 9000),
            vec![vec![100], vec![200, 200]]
        );
    }

    #[test]
    fn empty_datagrams_and_disabled_gso_are_sent_alone() {
        assert_eq!(runs(&[0, 0], 9000), vec![vec![0], vec![0]]);
        assert_eq!(runs(&[100, 0], 9000), vec![vec![100], vec![0]]);
        assert_eq!(runs(&[100, 100], 0), vec![vec![100], vec![100]]);
        assert_eq!(runs(&[1400, 1400], 1399), vec![vec![1400], vec![1400]]);
    }

    #[test]
    fn runs_respect_the_segment_and_byte_limits() {
        let many = vec![10; QUEUE_CAPACITY];
        let r = runs(&many, 9000);
        assert_eq!(r.iter().map(Vec::len).sum::<usize>(), QUEUE_CAPACITY);
        assert!(r.iter().all(|run| run.len() <= MAX_SEGMENTS));
        let jumbo = vec![9000; 10];
        let r = runs(&jumbo, 9000);
        assert_eq!(r[0].len(), MAX_GSO_BYTES / 9000);
        assert!(
            r.iter()
                .all(|run| run.iter().sum::<usize>() <= MAX_GSO_BYTES)
        );
    }

    #[test]
    fn queue_refuses_beyond_capacity() {
        let mut q = queue(&[1; QUEUE_CAPACITY]);
        assert!(!q.push(Queued { slot: 0, len: 1 }));
        q.clear();
        assert!(q.is_empty());
    }
}
