//! The one module with `unsafe`: a class's pre-allocated, pre-faulted slab of
//! fixed-size slots, its stack of free slot addresses, and the [`Buffer`]
//! handle that stands for exactly one slot taken from it.
//!
//! Invariant that every `unsafe` below leans on: for a [`ClassPool`], each
//! slot's start address is at any moment in exactly one place — on the free
//! stack, or inside exactly one live [`Buffer`] whose `owner` tag is this
//! pool's. It holds because a `Buffer` is created only by
//! [`ClassPool::take`] from an address popped off the stack, has private
//! fields, is neither `Clone` nor `Copy`, and is consumed by
//! [`ClassPool::give`], which accepts only buffers carrying this pool's tag
//! (pool ids are never reused, see `crate::pool`). So the stack never holds
//! more than `slots` entries and every address on it or in a tagged
//! `Buffer` starts a slot of this slab, `class.size()` bytes long.

#![allow(unsafe_code)]

use std::alloc::{Layout, alloc, dealloc};
use std::ptr::NonNull;

use crate::Class;
use crate::metrics::LocalCounters;

/// Slots are laid out on cache-line boundaries so a payload copy never
/// starts mid-line.
const SLOT_ALIGN: usize = 64;

/// One payload buffer on loan from a pool: move-only, tagged with the pool
/// and class it came from. It can be read or written only through the pool
/// that owns it, and goes back with `PoolSet::give`, which consumes it.
///
/// A `Buffer` is `!Send` and `!Sync` (it holds a raw pointer), so it cannot
/// leave the thread whose pool made it.
#[must_use = "a buffer that is dropped instead of given back is lost to the pool"]
#[derive(Debug)]
pub struct Buffer {
    ptr: NonNull<u8>,
    len: u32,
    /// The owning pool's tag: `(pool id << 2) | class index`.
    owner: u32,
}

impl Buffer {
    /// Bytes written into this buffer (the readable part).
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether nothing has been written.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size class this buffer belongs to.
    #[inline]
    pub fn class(&self) -> Class {
        Class::from_index(self.owner)
    }

    /// [`Class::index`] of this buffer's class, straight from the tag.
    #[inline(always)]
    pub(crate) fn class_index(&self) -> usize {
        (self.owner & 3) as usize
    }

    /// Most bytes this buffer can hold.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.class().size()
    }

    /// Start of the buffer, for handing to the kernel (an io_uring send).
    /// The memory stays valid while the owning `PoolSet` lives and this
    /// buffer has not been given back; the caller keeps both true until the
    /// kernel's completion arrives.
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

/// One size class of one pool set: slab, free stack and counters.
#[derive(Debug)]
pub(crate) struct ClassPool {
    /// Free slot addresses; `free[..top]` are valid. Storing addresses, not
    /// slot numbers, saves a multiply on every take.
    free: Box<[NonNull<u8>]>,
    top: u32,
    slots: u32,
    /// `(pool id << 2) | class index`; unique across the process.
    owner: u32,
    class: Class,
    /// Plain counters, published by `PoolSet::publish_stats`.
    pub(crate) counters: LocalCounters,
    base: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a `ClassPool` exclusively owns its slab allocation and free stack;
// nothing else holds a reference to them (outstanding `Buffer`s hold a raw
// pointer, but they are `!Send` and give no access to the memory except
// through this pool). Moving the pool to another thread moves that sole
// ownership with it; it is not `Sync`, so it is never shared.
unsafe impl Send for ClassPool {}

/// Why a class's memory could not be set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlabError {
    /// The slab's size overflows the address space.
    Layout,
    /// The allocator returned null.
    Alloc(usize),
}

impl ClassPool {
    /// Allocate `slots` buffers of `class` and touch every byte once, so
    /// that no page fault happens later on the packet path.
    pub(crate) fn new(class: Class, slots: u32, owner: u32) -> Result<Self, SlabError> {
        let stride = class.size().next_multiple_of(SLOT_ALIGN);
        let bytes = stride
            .checked_mul(slots as usize)
            .ok_or(SlabError::Layout)?
            .max(SLOT_ALIGN);
        let layout = Layout::from_size_align(bytes, 4096).map_err(|_| SlabError::Layout)?;
        // SAFETY: `layout` has a non-zero size (at least SLOT_ALIGN).
        let raw = unsafe { alloc(layout) };
        let base = NonNull::new(raw).ok_or(SlabError::Alloc(bytes))?;
        // SAFETY: `base` points to a fresh allocation of exactly `bytes`
        // bytes that nothing else references. Writing zeros both pre-faults
        // every page and leaves the memory initialised, so any later slice
        // over it reads initialised bytes.
        unsafe { base.as_ptr().write_bytes(0, bytes) };
        // Slot 0 on top, so takes start at the slab's start (cache-friendly
        // order, and the untouched part of the stack stays at the bottom).
        let free: Box<[NonNull<u8>]> = (0..slots as usize)
            .rev()
            // SAFETY: `slot < slots`, so `slot * stride < bytes`: the offset
            // stays inside the allocation.
            .map(|slot| unsafe { base.add(slot * stride) })
            .collect();
        Ok(Self {
            free,
            top: slots,
            slots,
            owner,
            class,
            counters: LocalCounters::new(slots),
            base,
            layout,
        })
    }

    /// Bytes of memory this class holds.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.layout.size()
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.slots
    }

    /// Buffers out of the pool right now.
    pub(crate) fn in_use(&self) -> u32 {
        self.slots - self.top
    }

    /// Free buffers right now.
    pub(crate) fn free_count(&self) -> u32 {
        self.top
    }

    /// Take a free slot, or `None` when the class is exhausted. O(1).
    #[inline(always)]
    pub(crate) fn take(&mut self) -> Option<Buffer> {
        if self.top == 0 {
            self.counters.on_exhausted();
            return None;
        }
        self.top -= 1;
        // SAFETY: `top` was > 0 and is now < `free.len()` (== slots, since
        // the stack never holds more than `slots` entries, module invariant).
        let ptr = unsafe { *self.free.get_unchecked(self.top as usize) };
        self.counters.on_take(self.top);
        Some(Buffer {
            ptr,
            len: 0,
            owner: self.owner,
        })
    }

    /// Put a buffer back; `Err(buf)` if it belongs to another pool or class.
    #[inline(always)]
    pub(crate) fn give(&mut self, buf: Buffer) -> Result<(), Buffer> {
        if buf.owner != self.owner {
            return Err(buf);
        }
        // SAFETY: the buffer carries this pool's tag, so its slot is not on
        // the stack and the stack holds fewer than `slots` entries (module
        // invariant): `top < slots == free.len()`.
        unsafe { *self.free.get_unchecked_mut(self.top as usize) = buf.ptr };
        self.top += 1;
        Ok(())
    }

    /// The written part of a buffer of this pool.
    #[inline(always)]
    pub(crate) fn bytes<'a>(&'a self, buf: &Buffer) -> Option<&'a [u8]> {
        if buf.owner != self.owner {
            return None;
        }
        // SAFETY: the tag proves `buf.ptr` points at one of this slab's slots
        // (alive for as long as `&self`), `len <= class size <= stride` (set
        // only by `fill`), and the memory is initialised (zeroed in `new`).
        // Only the live `Buffer` grants access to its slot and we hold a
        // shared borrow of it, so no `&mut` to these bytes exists.
        Some(unsafe { std::slice::from_raw_parts(buf.ptr.as_ptr(), buf.len as usize) })
    }

    /// Mutable access to the written part of a buffer of this pool.
    #[inline(always)]
    pub(crate) fn bytes_mut<'a>(&'a mut self, buf: &'a mut Buffer) -> Option<&'a mut [u8]> {
        if buf.owner != self.owner {
            return None;
        }
        // SAFETY: as in `bytes`; we hold the only `&mut` to the Buffer that
        // grants access to this slot, so the slice is unaliased.
        Some(unsafe { std::slice::from_raw_parts_mut(buf.ptr.as_ptr(), buf.len as usize) })
    }

    /// Copy `payload` into the buffer and make exactly those bytes readable.
    /// `false` (nothing written) if the buffer is not this pool's or the
    /// payload does not fit.
    #[inline(always)]
    pub(crate) fn fill(&mut self, buf: &mut Buffer, payload: &[u8]) -> bool {
        if buf.owner != self.owner || payload.len() > self.class.size() {
            return false;
        }
        // SAFETY: the tag proves `buf.ptr` is one of this slab's slots, which
        // has `stride >= class size >= payload.len()` bytes; `payload` is a
        // caller's slice and cannot overlap a slot that only this unique
        // Buffer grants access to (we hold `&mut` to it).
        unsafe {
            std::ptr::copy_nonoverlapping(payload.as_ptr(), buf.ptr.as_ptr(), payload.len());
        }
        #[allow(clippy::cast_possible_truncation)] // <= class size, checked above
        let len = payload.len() as u32;
        buf.len = len;
        true
    }
}

impl Drop for ClassPool {
    fn drop(&mut self) {
        // SAFETY: `base` came from `alloc(self.layout)` in `new` and is freed
        // only here, once. Outstanding buffers keep a dangling pointer, but
        // no code path dereferences a Buffer's pointer without its pool, and
        // pool ids are never reused, so none can reach this memory again.
        unsafe { dealloc(self.base.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_is_zeroed_and_slots_distinct() {
        let mut p = ClassPool::new(Class::Small, 3, 4).expect("alloc");
        let a = p.take().expect("a");
        let b = p.take().expect("b");
        assert_ne!(a.as_ptr(), b.as_ptr());
        assert_eq!(b.as_ptr() as usize - a.as_ptr() as usize, 1536);
        assert_eq!(p.in_use(), 2);
        p.give(a).expect("give a");
        p.give(b).expect("give b");
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn foreign_buffer_is_refused_everywhere() {
        let mut p = ClassPool::new(Class::Small, 1, 4).expect("alloc");
        let mut q = ClassPool::new(Class::Small, 1, 8).expect("alloc");
        let mut b = q.take().expect("take");
        assert!(!p.fill(&mut b, b"x"));
        assert!(p.bytes(&b).is_none());
        assert!(p.bytes_mut(&mut b).is_none());
        let b = p.give(b).expect_err("foreign");
        q.give(b).expect("home");
    }
}
