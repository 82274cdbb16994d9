//! Receive buffers the kernel picks from (an io_uring provided-buffer ring):
//! a page-aligned ring of `BufRingEntry` descriptors plus the buffer memory
//! they point to. A multishot receive completes with the id of the buffer
//! it filled; the worker copies the datagram into a pool buffer and hands
//! the receive buffer straight back with [`ReceiveBuffers::recycle`].
//!
//! Ownership protocol (what the `unsafe` below relies on): a buffer id is
//! either in the ring (the kernel may write it at any time) or was reported
//! by exactly one completion and not yet recycled (the worker may read it).
//! Ids come from the kernel's completions, so each is checked `< entries`
//! before use.
#![allow(unsafe_code)]

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::Submitter;
use io_uring::types::BufRingEntry;

/// Bytes per receive buffer: above the largest pool class (9000 B), so a
/// datagram too large to relay is seen as such (and counted) rather than
/// silently truncated to a relayable size.
pub const RECEIVE_BUFFER_BYTES: usize = 9216;
#[allow(clippy::cast_possible_truncation)] // 9216 fits
pub(crate) const BUFFER_LEN: u32 = RECEIVE_BUFFER_BYTES as u32;

#[derive(Debug)]
pub struct ReceiveBuffers {
    ring: NonNull<BufRingEntry>,
    ring_layout: Layout,
    data: NonNull<u8>,
    data_layout: Layout,
    entries: u16,
    /// Our copy of the ring's tail; published to the kernel by `publish`.
    tail: u16,
    group: u16,
}

impl ReceiveBuffers {
    /// Allocate `entries` (a power of two, at most 32768) buffers and fill
    /// the ring with all of them.
    pub fn new(entries: u16, group: u16) -> io::Result<Self> {
        if !entries.is_power_of_two() || entries > 32768 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "provided buffer count must be a power of two up to 32768",
            ));
        }
        let n = usize::from(entries);
        let ring_layout = Layout::from_size_align(n * size_of::<BufRingEntry>(), 4096)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let data_layout = Layout::from_size_align(n * RECEIVE_BUFFER_BYTES, 4096)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: both layouts have a non-zero size (entries >= 1).
        let ring = NonNull::new(unsafe { alloc_zeroed(ring_layout) })
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        // SAFETY: as above.
        let Some(data) = NonNull::new(unsafe { alloc_zeroed(data_layout) }) else {
            // SAFETY: `ring` came from `alloc_zeroed(ring_layout)` just above.
            unsafe { dealloc(ring.as_ptr(), ring_layout) };
            return Err(io::ErrorKind::OutOfMemory.into());
        };
        let mut bufs = Self {
            ring: ring.cast(),
            ring_layout,
            data,
            data_layout,
            entries,
            tail: 0,
            group,
        };
        for id in 0..entries {
            bufs.recycle(id);
        }
        bufs.publish();
        Ok(bufs)
    }

    /// How many buffers there are.
    pub fn len(&self) -> usize {
        usize::from(self.entries)
    }

    /// The buffer group id to put in receive SQEs.
    pub fn group(&self) -> u16 {
        self.group
    }

    /// Hand the ring to the kernel.
    pub fn register(&self, submitter: &Submitter<'_>) -> io::Result<()> {
        // SAFETY: the ring memory is ours, page-aligned, `entries` long, and
        // lives until `self` is dropped; the worker drops its io_uring (which
        // unregisters every buffer ring) before its `ReceiveBuffers`.
        unsafe {
            submitter.register_buf_ring_with_flags(
                self.ring.as_ptr() as u64,
                self.entries,
                self.group,
                0,
            )
        }
    }

    /// The first `len` bytes of buffer `id`, just reported filled by a
    /// completion. `None` for an id the ring never had.
    pub fn filled(&self, id: u16, len: usize) -> Option<&[u8]> {
        if id >= self.entries {
            return None;
        }
        let len = len.min(RECEIVE_BUFFER_BYTES);
        let start = self.buffer_start(id);
        // SAFETY: `start` begins buffer `id` (`id < entries`), which has
        // `RECEIVE_BUFFER_BYTES >= len` initialised (zeroed, then written by
        // the kernel) bytes inside `data`. Per the module's protocol the
        // kernel reported it filled and it is not back in the ring, so
        // nothing writes it while this borrow lives (the borrow of `self`
        // also keeps `recycle` from running).
        Some(unsafe { std::slice::from_raw_parts(start, len) })
    }

    /// Start of buffer `id`; the caller checked `id < entries`.
    fn buffer_start(&self, id: u16) -> *mut u8 {
        debug_assert!(id < self.entries);
        // SAFETY: callers pass `id < entries`, so the offset is within the
        // `entries * RECEIVE_BUFFER_BYTES` bytes of `data`.
        unsafe {
            self.data
                .as_ptr()
                .add(usize::from(id) * RECEIVE_BUFFER_BYTES)
        }
    }

    /// Start of buffer `id`, for a single (non-multishot) receive that
    /// names its buffer itself. `None` for an id outside the ring.
    pub fn receive_ptr(&mut self, id: u16) -> Option<*mut u8> {
        (id < self.entries).then(|| self.buffer_start(id))
    }

    /// Put buffer `id` back in the ring (seen by the kernel after the next
    /// [`ReceiveBuffers::publish`]). Ids outside the ring are ignored.
    pub fn recycle(&mut self, id: u16) {
        if id >= self.entries {
            return;
        }
        let slot = usize::from(self.tail & (self.entries - 1));
        let addr = self.buffer_start(id) as u64;
        // SAFETY: `slot < entries`: the offset stays inside the ring.
        let entry = unsafe { self.ring.as_ptr().add(slot) };
        // SAFETY: `entry` is a valid, aligned ring slot. The kernel only
        // reads entries between its head and our published tail; this one is
        // past the published tail, so it is ours to write.
        let entry = unsafe { &mut *entry };
        entry.set_addr(addr);
        entry.set_len(BUFFER_LEN);
        entry.set_bid(id);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Make every recycled buffer visible to the kernel (once per loop turn).
    pub fn publish(&self) {
        // SAFETY: `tail` points at the `resv` field of the ring's first entry,
        // which the kernel reads as the ring tail; it is 2-byte aligned and
        // lives as long as `self`. The store is a release so the entries
        // written before it are visible to the kernel first.
        let tail = unsafe { BufRingEntry::tail(self.ring.as_ptr()) }.cast_mut();
        // SAFETY: `tail` is valid and aligned for a u16 for as long as
        // `self` lives, and the kernel accesses it only atomically.
        let tail = unsafe { AtomicU16::from_ptr(tail) };
        tail.store(self.tail, Ordering::Release);
    }
}

impl Drop for ReceiveBuffers {
    fn drop(&mut self) {
        // SAFETY: it came from `alloc_zeroed` with this layout. The kernel
        // no longer uses it: the worker tears its io_uring down (unregistering
        // the ring) before dropping this, or leaks this when requests are
        // still pending.
        unsafe { dealloc(self.ring.as_ptr().cast(), self.ring_layout) };
        // SAFETY: as above, for the buffer memory.
        unsafe { dealloc(self.data.as_ptr(), self.data_layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_starts_full_and_reads_are_bounded() {
        let bufs = ReceiveBuffers::new(8, 3).expect("alloc");
        assert_eq!(bufs.group(), 3);
        assert_eq!(bufs.tail, 8);
        assert_eq!(
            bufs.filled(7, 100_000).map(<[u8]>::len),
            Some(RECEIVE_BUFFER_BYTES)
        );
        assert!(bufs.filled(8, 1).is_none(), "id outside the ring");
        assert!(ReceiveBuffers::new(6, 0).is_err(), "not a power of two");
    }
}
