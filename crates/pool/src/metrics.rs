//! Per-class pool counters: written only by the owning worker thread, read
//! by any thread without locks.
//!
//! The owner is the only writer, so it updates each counter with a relaxed
//! load and a relaxed store (plain moves on x86-64, no locked
//! read-modify-write). Each class's counters sit on their own cache line so
//! a reader touching one class never disturbs another. The owner also
//! publishes `in_use` itself: deriving it as `taken - given` from two
//! separate loads would let a reader see a value that was never true.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam_utils::CachePadded;

use crate::Class;

#[derive(Debug, Default)]
pub(crate) struct ClassCounters {
    capacity: AtomicU64,
    taken: AtomicU64,
    given: AtomicU64,
    in_use: AtomicU64,
    exhausted: AtomicU64,
    high_water: AtomicU64,
}

/// Bump a counter that only the calling thread writes.
#[inline(always)]
fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Relaxed).wrapping_add(1), Relaxed);
}

impl ClassCounters {
    #[inline(always)]
    pub(crate) fn on_take(&self, in_use_now: u64) {
        if cfg!(feature = "no-metrics") {
            return;
        }
        bump(&self.taken);
        self.in_use.store(in_use_now, Relaxed);
        if in_use_now > self.high_water.load(Relaxed) {
            self.high_water.store(in_use_now, Relaxed);
        }
    }

    #[inline(always)]
    pub(crate) fn on_give(&self, in_use_now: u64) {
        if !cfg!(feature = "no-metrics") {
            bump(&self.given);
            self.in_use.store(in_use_now, Relaxed);
        }
    }

    #[inline(always)]
    pub(crate) fn on_exhausted(&self) {
        if !cfg!(feature = "no-metrics") {
            bump(&self.exhausted);
        }
    }

    fn snapshot(&self) -> ClassStats {
        // Read `given` before `taken`: both only grow, so a reader never
        // sees more given back than taken.
        let given = self.given.load(Relaxed);
        let taken = self.taken.load(Relaxed);
        ClassStats {
            capacity: self.capacity.load(Relaxed),
            taken,
            given,
            exhausted: self.exhausted.load(Relaxed),
            in_use: self.in_use.load(Relaxed),
            high_water: self.high_water.load(Relaxed),
        }
    }
}

/// The counters of one pool set, shared between its owner and readers.
#[derive(Debug, Default)]
pub(crate) struct SharedCounters {
    pub(crate) classes: [CachePadded<ClassCounters>; 3],
    pub(crate) oversize: CachePadded<AtomicU64>,
}

impl SharedCounters {
    pub(crate) fn new(capacities: [u32; 3]) -> Arc<Self> {
        let counters = Self::default();
        for (c, cap) in counters.classes.iter().zip(capacities) {
            c.capacity.store(u64::from(cap), Relaxed);
        }
        Arc::new(counters)
    }

    #[inline(always)]
    pub(crate) fn on_oversize(&self) {
        if !cfg!(feature = "no-metrics") {
            bump(&self.oversize);
        }
    }
}

/// One class's counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Buffers in the class.
    pub capacity: u64,
    /// Successful takes since construction.
    pub taken: u64,
    /// Buffers given back since construction.
    pub given: u64,
    /// Takes that failed because the class had no free buffer.
    pub exhausted: u64,
    /// Buffers out of the pool right now.
    pub in_use: u64,
    /// Most buffers ever out at once.
    pub high_water: u64,
}

/// A pool set's counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// Indexed by [`Class::index`].
    pub classes: [ClassStats; 3],
    /// Takes refused because the length exceeded every class.
    pub oversize: u64,
}

impl PoolSnapshot {
    /// The counters of one class.
    pub fn class(&self, class: Class) -> &ClassStats {
        &self.classes[class.index()]
    }
}

/// A cheap, cloneable, thread-safe reader of one pool set's counters.
#[derive(Debug, Clone)]
pub struct PoolStatsHandle {
    pub(crate) counters: Arc<SharedCounters>,
}

impl PoolStatsHandle {
    /// Read every counter without locks; never slows the owner beyond the
    /// cache-line transfer of the lines it reads.
    pub fn snapshot(&self) -> PoolSnapshot {
        let c = &self.counters;
        PoolSnapshot {
            classes: [
                c.classes[0].snapshot(),
                c.classes[1].snapshot(),
                c.classes[2].snapshot(),
            ],
            oversize: c.oversize.load(Relaxed),
        }
    }
}
