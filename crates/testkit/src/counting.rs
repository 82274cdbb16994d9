//! A counting allocator for the no-allocation tests: every allocation and
//! reallocation on any thread of the test binary bumps [`ALLOCATIONS`],
//! and the calling thread's own count ([`on_this_thread`]), for tests
//! whose code under test runs on the test's thread while the harness's
//! other threads may allocate. A test binary installs it itself (a
//! library must not choose every binary's allocator):
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: mcrelay_testkit::counting::Counting = mcrelay_testkit::counting::Counting;
//! ```
#![allow(unsafe_code)] // the allocator

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counting.
#[derive(Debug)]
pub struct Counting;

/// Allocations (and reallocations) so far, by every thread.
pub static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    // A const-initialised Cell with no destructor: reading or bumping it
    // never allocates, so the allocator may use it.
    static THIS_THREAD: Cell<u64> = const { Cell::new(0) };
}

/// Allocations (and reallocations) so far by the calling thread.
pub fn on_this_thread() -> u64 {
    THIS_THREAD.with(Cell::get)
}

fn count() {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    let _ = THIS_THREAD.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards every call to the system allocator unchanged; the only
// addition is counting (a relaxed increment and a thread-local Cell), which
// cannot allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
