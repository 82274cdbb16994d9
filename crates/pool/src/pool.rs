//! [`PoolSet`]: one worker core's three class pools, the safe face of
//! `storage`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::metrics::{PoolStatsHandle, SharedCounters};
use crate::storage::{Buffer, ClassPool, SlabError};
use crate::{Class, MAX_PAYLOAD};

/// Largest count accepted per class: keeps slot numbers and the free stack
/// in `u32` with room to spare, and one class under ~9 GB.
pub const MAX_BUFFERS_PER_CLASS: u32 = 1_000_000;

/// Pool ids are handed out once per process and never reused, so a buffer
/// from a dropped pool can never be mistaken for one of a later pool.
/// The class index lives in the low two bits of the owner tag.
static NEXT_POOL_ID: AtomicU32 = AtomicU32::new(1);
const MAX_POOL_ID: u32 = u32::MAX >> 2;

/// Buffers per class for one worker core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// 1500-byte buffers.
    pub small: u32,
    /// 4096-byte buffers.
    pub standard: u32,
    /// 9000-byte buffers.
    pub jumbo: u32,
}

impl Default for PoolConfig {
    /// 1000 / 500 / 200: about 5.3 MB per core, the sizing of the seed
    /// experiment (`relay-buffer-pool-poc.md`).
    fn default() -> Self {
        Self {
            small: 1000,
            standard: 500,
            jumbo: 200,
        }
    }
}

impl PoolConfig {
    /// Count for one class.
    pub fn count(&self, class: Class) -> u32 {
        match class {
            Class::Small => self.small,
            Class::Standard => self.standard,
            Class::Jumbo => self.jumbo,
        }
    }

    /// Payload bytes this configuration holds (counts × class sizes).
    pub fn payload_bytes(&self) -> u64 {
        Class::ALL
            .iter()
            .map(|c| u64::from(self.count(*c)) * c.size() as u64)
            .sum()
    }
}

/// Why a pool set could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PoolError {
    #[error("pool class {class} has 0 buffers; give it at least 1")]
    ZeroCount { class: &'static str },
    #[error("pool class {class} has {count} buffers; the most is {MAX_BUFFERS_PER_CLASS}")]
    TooMany { class: &'static str, count: u32 },
    #[error("could not allocate {bytes} bytes for pool class {class}")]
    Alloc { class: &'static str, bytes: usize },
    #[error("pool class {class} is too large for this address space")]
    Layout { class: &'static str },
    #[error("this process has created too many pools")]
    IdsExhausted,
}

/// One worker core's buffer pools: three classes, all memory allocated and
/// touched at construction, O(1) take and give with no allocation, locks or
/// atomics read-modify-writes afterwards.
///
/// `Send` so it can be built and then moved into its worker thread; not
/// `Sync`: only that thread touches it. Readers use [`PoolSet::stats`].
#[derive(Debug)]
pub struct PoolSet {
    classes: [ClassPool; 3],
    /// Takes refused because the length exceeded every class.
    oversize: u64,
    counters: Arc<SharedCounters>,
    id: u32,
}

impl PoolSet {
    /// Allocate and pre-fault every buffer.
    pub fn new(config: PoolConfig) -> Result<Self, PoolError> {
        for class in Class::ALL {
            let count = config.count(class);
            if count == 0 {
                return Err(PoolError::ZeroCount {
                    class: class.name(),
                });
            }
            if count > MAX_BUFFERS_PER_CLASS {
                return Err(PoolError::TooMany {
                    class: class.name(),
                    count,
                });
            }
        }
        let id = NEXT_POOL_ID
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| {
                (id < MAX_POOL_ID).then_some(id + 1)
            })
            .map_err(|_| PoolError::IdsExhausted)?;
        let make = |class: Class| {
            let tag = (id << 2) | class as u32;
            ClassPool::new(class, config.count(class), tag).map_err(|e| match e {
                SlabError::Layout => PoolError::Layout {
                    class: class.name(),
                },
                SlabError::Alloc(bytes) => PoolError::Alloc {
                    class: class.name(),
                    bytes,
                },
            })
        };
        let classes = [
            make(Class::Small)?,
            make(Class::Standard)?,
            make(Class::Jumbo)?,
        ];
        let counters = SharedCounters::new([config.small, config.standard, config.jumbo]);
        Ok(Self {
            classes,
            oversize: 0,
            counters,
            id,
        })
    }

    /// This pool set's process-unique id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Take a buffer from the smallest class that holds `len` bytes. `None`
    /// — never a panic, never a fallback allocation — when `len` exceeds
    /// [`MAX_PAYLOAD`](crate::MAX_PAYLOAD) or that class has no free buffer (both counted).
    #[inline]
    pub fn take(&mut self, len: usize) -> Option<Buffer> {
        if len > MAX_PAYLOAD {
            if !cfg!(feature = "no-metrics") {
                self.oversize += 1;
            }
            return None;
        }
        // `Class::for_len` without its branch chain: the same cost for
        // every class.
        let i = usize::from(len > Class::Small.size()) + usize::from(len > Class::Standard.size());
        self.classes[i].take()
    }

    /// Take a buffer of `class` exactly (no class choice): the caller picked
    /// it, e.g. a larger class when the fitting one ran dry. `None`, counted
    /// as that class's exhaustion, when it has no free buffer.
    #[inline]
    pub fn take_class(&mut self, class: Class) -> Option<Buffer> {
        self.classes[class.index()].take()
    }

    /// Free buffers of `class` right now (owner's exact view).
    #[inline]
    pub fn free(&self, class: Class) -> u32 {
        self.classes[class.index()].free_count()
    }

    /// Take a buffer that fits `payload` and copy it in: the data plane's one
    /// copy. `None` as for [`PoolSet::take`].
    #[inline]
    pub fn take_filled(&mut self, payload: &[u8]) -> Option<Buffer> {
        let mut buf = self.take(payload.len())?;
        let filled = self.fill(&mut buf, payload);
        debug_assert!(filled, "take(len) returned a buffer that holds len");
        Some(buf)
    }

    /// Give a buffer back. `Err(buf)` — the buffer untouched, the pool
    /// unchanged — if it came from another pool set.
    #[inline]
    pub fn give(&mut self, buf: Buffer) -> Result<(), Buffer> {
        match self.classes.get_mut(buf.class_index()) {
            Some(class) => class.give(buf),
            None => Err(buf),
        }
    }

    /// Exactly the bytes written into `buf`, never bytes of an earlier
    /// packet. Empty for a buffer of another pool set.
    #[inline]
    pub fn bytes(&self, buf: &Buffer) -> &[u8] {
        self.classes[buf.class().index()]
            .bytes(buf)
            .unwrap_or_default()
    }

    /// The written bytes of `buf`, for editing in place. Empty for a buffer
    /// of another pool set.
    #[inline]
    pub fn bytes_mut<'a>(&'a mut self, buf: &'a mut Buffer) -> &'a mut [u8] {
        let i = buf.class().index();
        self.classes[i].bytes_mut(buf).unwrap_or_default()
    }

    /// Replace the contents of `buf` with `payload`. `false`, with nothing
    /// written, if `payload` is longer than the buffer's class or the buffer
    /// belongs to another pool set.
    #[inline]
    pub fn fill(&mut self, buf: &mut Buffer, payload: &[u8]) -> bool {
        self.classes[buf.class().index()].fill(buf, payload)
    }

    /// Buffers of `class` out of the pool right now (owner's exact view).
    pub fn in_use(&self, class: Class) -> u32 {
        self.classes[class.index()].in_use()
    }

    /// Buffers of `class` in total.
    pub fn capacity(&self, class: Class) -> u32 {
        self.classes[class.index()].capacity()
    }

    /// Bytes of buffer memory this set holds (slot strides included).
    pub fn memory_bytes(&self) -> usize {
        self.classes.iter().map(ClassPool::memory_bytes).sum()
    }

    /// Publish this set's counters to its [`PoolStatsHandle`]s. The owner
    /// calls it once per loop turn (and after any batch of work it wants
    /// seen): takes and gives only bump plain fields, so readers see the
    /// numbers as of the last publish.
    pub fn publish_stats(&self) {
        for (pool, shared) in self.classes.iter().zip(&self.counters.classes) {
            shared.publish(&pool.counters, pool.free_count());
        }
        self.counters
            .oversize
            .store(self.oversize, std::sync::atomic::Ordering::Relaxed);
    }

    /// A thread-safe reader of this set's counters as of the last
    /// [`PoolSet::publish_stats`].
    pub fn stats(&self) -> PoolStatsHandle {
        PoolStatsHandle {
            counters: Arc::clone(&self.counters),
        }
    }
}

/// A buffer held by several pending uses (one per egress send of a
/// fan-out). It becomes a plain [`Buffer`] again when the last use is
/// released, so it is given back exactly once. No allocation: the count
/// lives beside the handle.
#[must_use = "a shared buffer must be released down to its last use and given back"]
#[derive(Debug)]
pub struct SharedBuffer {
    buf: Buffer,
    pending: u32,
}

/// What [`SharedBuffer::release`] leaves.
#[derive(Debug)]
#[must_use]
pub enum Released {
    /// Other uses are still pending.
    Pending(SharedBuffer),
    /// That was the last use: give the buffer back to its pool.
    Last(Buffer),
}

impl SharedBuffer {
    /// Hold `buf` for `uses` pending uses; `Err(buf)` if `uses` is 0 (there
    /// is nothing to wait for: give it back).
    pub fn new(buf: Buffer, uses: u32) -> Result<Self, Buffer> {
        if uses == 0 {
            return Err(buf);
        }
        Ok(Self { buf, pending: uses })
    }

    /// The held buffer (read-only: its bytes may be in flight).
    #[inline]
    pub fn buffer(&self) -> &Buffer {
        &self.buf
    }

    /// Uses still pending.
    #[inline]
    pub fn pending(&self) -> u32 {
        self.pending
    }

    /// The buffer back, whatever uses are still counted: for a buffer none
    /// of whose uses was ever started (nothing else can be reading it).
    #[inline]
    pub fn into_buffer(self) -> Buffer {
        self.buf
    }

    /// One use has completed.
    #[inline]
    pub fn release(mut self) -> Released {
        self.pending -= 1;
        if self.pending == 0 {
            Released::Last(self.buf)
        } else {
            Released::Pending(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_set() -> PoolSet {
        PoolSet::new(PoolConfig {
            small: 2,
            standard: 2,
            jumbo: 1,
        })
        .expect("pool")
    }

    #[test]
    fn default_is_the_seed_sizing() {
        let c = PoolConfig::default();
        assert_eq!((c.small, c.standard, c.jumbo), (1000, 500, 200));
        assert_eq!(c.payload_bytes(), 1000 * 1500 + 500 * 4096 + 200 * 9000);
    }

    #[test]
    fn zero_and_huge_counts_are_refused() {
        let zero = PoolConfig {
            standard: 0,
            ..PoolConfig::default()
        };
        assert_eq!(
            PoolSet::new(zero).unwrap_err(),
            PoolError::ZeroCount { class: "standard" }
        );
        let huge = PoolConfig {
            jumbo: MAX_BUFFERS_PER_CLASS + 1,
            ..PoolConfig::default()
        };
        assert!(matches!(
            PoolSet::new(huge),
            Err(PoolError::TooMany { class: "jumbo", .. })
        ));
    }

    #[test]
    fn take_class_takes_that_class_and_free_counts_it() {
        let mut p = small_set();
        let free = p.free(Class::Jumbo);
        let b = p.take_class(Class::Jumbo).expect("jumbo");
        assert_eq!(b.class(), Class::Jumbo);
        assert_eq!(p.free(Class::Jumbo), free - 1);
        let mut b = b;
        assert!(
            p.fill(&mut b, &[1; 100]),
            "a small payload fits a jumbo buffer"
        );
        p.give(b).expect("home");
        assert_eq!(p.free(Class::Jumbo), free);
    }

    #[test]
    fn take_picks_smallest_fitting_class_and_refuses_oversize() {
        let mut p = small_set();
        let a = p.take(1).expect("small");
        let b = p.take(1501).expect("standard");
        let c = p.take(9000).expect("jumbo");
        assert_eq!(a.class(), Class::Small);
        assert_eq!(b.class(), Class::Standard);
        assert_eq!(c.class(), Class::Jumbo);
        assert!(p.take(9001).is_none());
        assert!(p.take(5000).is_none(), "jumbo exhausted, no fallback");
        assert_eq!(p.stats().snapshot().oversize, 0, "nothing published yet");
        p.publish_stats();
        let s = p.stats().snapshot();
        assert_eq!(s.oversize, 1);
        assert_eq!(s.class(Class::Jumbo).exhausted, 1);
        for b in [a, b, c] {
            p.give(b).expect("give");
        }
        p.publish_stats();
        let jumbo = *p.stats().snapshot().class(Class::Jumbo);
        assert_eq!((jumbo.in_use, jumbo.high_water, jumbo.taken), (0, 1, 1));
    }

    #[test]
    fn no_stale_bytes_after_reuse() {
        let mut p = PoolSet::new(PoolConfig {
            small: 1,
            standard: 1,
            jumbo: 1,
        })
        .expect("pool");
        let big = p.take_filled(&[0xAB; 9000]).expect("jumbo");
        p.give(big).expect("give");
        let mut again = p.take(8000).expect("same jumbo slot");
        assert!(p.bytes(&again).is_empty(), "nothing written yet");
        assert!(p.fill(&mut again, b"hello"));
        assert_eq!(p.bytes(&again), b"hello");
        assert!(!p.fill(&mut again, &[0u8; 9001]));
        assert_eq!(p.bytes(&again), b"hello", "failed fill changes nothing");
        p.bytes_mut(&mut again)[0] = b'j';
        assert_eq!(p.bytes(&again), b"jello");
        p.give(again).expect("give");
    }

    #[test]
    fn buffers_of_another_set_are_refused() {
        let mut p = small_set();
        let mut q = small_set();
        let mut b = q.take_filled(b"from q").expect("take");
        assert!(p.bytes(&b).is_empty());
        assert!(!p.fill(&mut b, b"x"));
        let b = p.give(b).expect_err("foreign buffer refused");
        assert_eq!(q.bytes(&b), b"from q");
        q.give(b).expect("home");
        p.publish_stats();
        assert_eq!(p.stats().snapshot().class(Class::Small).given, 0);
    }

    #[test]
    fn shared_buffer_returns_after_last_use() {
        let mut p = small_set();
        let b = p.take_filled(b"fan-out").expect("take");
        let mut shared = SharedBuffer::new(b, 3).expect("3 uses");
        for left in [2, 1] {
            shared = match shared.release() {
                Released::Pending(s) => {
                    assert_eq!(s.pending(), left);
                    s
                }
                Released::Last(_) => panic!("released too early"),
            };
        }
        match shared.release() {
            Released::Last(b) => p.give(b).expect("give"),
            Released::Pending(_) => panic!("not released"),
        }
        assert_eq!(p.in_use(Class::Small), 0);
        let b = p.take(1).expect("take");
        let b = SharedBuffer::new(b, 0).expect_err("0 uses");
        p.give(b).expect("give");
    }

    #[test]
    fn pool_set_moves_to_its_worker_thread() {
        let mut p = small_set();
        let stats = p.stats();
        std::thread::spawn(move || {
            let b = p.take(10).expect("take");
            p.give(b).expect("give");
            p.publish_stats();
        })
        .join()
        .expect("worker");
        assert_eq!(stats.snapshot().class(Class::Small).given, 1);
    }
}
