//! Per-class pool counters. The owning worker counts in plain fields next
//! to the free stack (an increment in a cache line it already holds) and
//! publishes them to shared atomics with [`crate::PoolSet::publish_stats`]
//! once per loop turn; any thread reads the published values without
//! locks. Take and give thus pay no atomic and no extra cache line, and a
//! reader sees numbers at most one loop turn old — consistent with each
//! other, since they are published together by the only writer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam_utils::CachePadded;

use crate::Class;

/// The owner's running counts for one class. Only what can't be derived is
/// counted: given back = taken - in use (both exact when the owner
/// publishes), and high water is kept as the lowest the free-stack top has
/// been: `capacity - low_top`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalCounters {
    pub(crate) taken: u64,
    pub(crate) exhausted: u64,
    pub(crate) low_top: u32,
}

impl LocalCounters {
    pub(crate) fn new(slots: u32) -> Self {
        Self {
            taken: 0,
            exhausted: 0,
            low_top: slots,
        }
    }

    /// A take succeeded and left `top` free buffers.
    #[inline(always)]
    pub(crate) fn on_take(&mut self, top: u32) {
        if !cfg!(feature = "no-metrics") {
            self.taken += 1;
            if top < self.low_top {
                self.new_low(top);
            }
        }
    }

    /// A new high-water mark: rare once the pool has warmed up, so kept out
    /// of the take path's straight line.
    #[cold]
    #[inline(never)]
    fn new_low(&mut self, top: u32) {
        self.low_top = top;
    }

    #[inline(always)]
    pub(crate) fn on_exhausted(&mut self) {
        if !cfg!(feature = "no-metrics") {
            self.exhausted += 1;
        }
    }
}

/// The published counters of one class.
#[derive(Debug, Default)]
pub(crate) struct ClassCounters {
    capacity: AtomicU64,
    taken: AtomicU64,
    given: AtomicU64,
    in_use: AtomicU64,
    exhausted: AtomicU64,
    high_water: AtomicU64,
}

impl ClassCounters {
    /// Publish the owner's counts; `free` buffers are on the stack now.
    pub(crate) fn publish(&self, local: &LocalCounters, free: u32) {
        let capacity = self.capacity.load(Relaxed);
        let in_use = capacity - u64::from(free);
        self.given
            .store(local.taken.saturating_sub(in_use), Relaxed);
        self.in_use.store(in_use, Relaxed);
        self.exhausted.store(local.exhausted, Relaxed);
        self.high_water
            .store(capacity - u64::from(local.low_top), Relaxed);
        self.taken.store(local.taken, Relaxed);
    }

    fn snapshot(&self) -> ClassStats {
        let taken = self.taken.load(Relaxed);
        let given = self.given.load(Relaxed);
        ClassStats {
            capacity: self.capacity.load(Relaxed),
            taken,
            given: given.min(taken),
            exhausted: self.exhausted.load(Relaxed),
            in_use: self.in_use.load(Relaxed),
            high_water: self.high_water.load(Relaxed),
        }
    }
}

/// The published counters of one pool set, shared between its owner and
/// readers. Each class on its own cache line.
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
