//! The GSO runs in flight: which in-flight slots each GSO send carries and
//! its segment size, by record number (what a GSO send's completion
//! names). The kernel-facing message of each record (its `msghdr`) lives
//! beside it in the driver, at the same number.

use super::ids::Slot;
use super::queue::MAX_SEGMENTS;

#[derive(Debug, Clone, Copy)]
struct Run {
    slots: [Slot; MAX_SEGMENTS],
    count: usize,
    segment_size: u16,
}

/// A fixed table of GSO runs, allocated when the worker starts.
#[derive(Debug)]
pub struct GsoRuns {
    runs: Box<[Run]>,
    free: Vec<u32>,
}

impl GsoRuns {
    pub fn with_capacity(capacity: u32) -> Self {
        Self {
            runs: (0..capacity)
                .map(|_| Run {
                    slots: [0; MAX_SEGMENTS],
                    count: 0,
                    segment_size: 0,
                })
                .collect(),
            free: (0..capacity).rev().collect(),
        }
    }

    /// Records a table of this many runs holds.
    pub fn capacity(&self) -> usize {
        self.runs.len()
    }

    /// Take a free record for `slots` (at most [`MAX_SEGMENTS`], at least
    /// one); `None` when every record is in flight (the caller sends the
    /// datagrams one by one).
    pub fn start(
        &mut self,
        segment_size: u16,
        slots: impl ExactSizeIterator<Item = Slot>,
    ) -> Option<u32> {
        let n = slots.len();
        if n == 0 || n > MAX_SEGMENTS {
            return None;
        }
        let index = self.free.pop()?;
        let run = self.runs.get_mut(index as usize)?;
        for (dst, slot) in run.slots.iter_mut().zip(slots) {
            *dst = slot;
        }
        run.count = n;
        run.segment_size = segment_size;
        Some(index)
    }

    /// The slots of a record in flight (empty for a free or unknown one).
    pub fn slots(&self, record: u32) -> &[Slot] {
        self.runs
            .get(record as usize)
            .map_or(&[][..], |r| &r.slots[..r.count])
    }

    /// The segment size of a record in flight.
    pub fn segment_size(&self, record: u32) -> usize {
        self.runs
            .get(record as usize)
            .map_or(0, |r| usize::from(r.segment_size))
    }

    /// Hand a record back once its send completed (or was never
    /// submitted). Twice is harmless.
    pub fn finish(&mut self, record: u32) {
        if let Some(r) = self.runs.get_mut(record as usize)
            && r.count > 0
        {
            r.count = 0;
            self.free.push(record);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_once() {
        let mut t = GsoRuns::with_capacity(1);
        let r = t.start(100, [4u32, 9, 2].into_iter()).expect("free record");
        assert!(t.start(100, [1u32].into_iter()).is_none(), "table full");
        assert_eq!(t.slots(r), &[4, 9, 2]);
        assert_eq!(t.segment_size(r), 100);
        t.finish(r);
        assert!(t.slots(r).is_empty());
        t.finish(r);
        assert!(t.start(1, [1u32].into_iter()).is_some(), "reused once");
        assert!(
            t.start(1, [1u32].into_iter()).is_none(),
            "finish twice frees once"
        );
        assert!(t.start(1, std::iter::empty()).is_none(), "empty run");
    }
}
