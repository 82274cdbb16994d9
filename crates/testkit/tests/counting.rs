//! The counting allocator counts: installed as this binary's allocator,
//! an allocation shows in the global count and in its thread's. (The
//! no-allocation tests would pass vacuously if it didn't.)

use std::hint::black_box;
use std::sync::atomic::Ordering;

use mcrelay_testkit::counting::{ALLOCATIONS, Counting, on_this_thread};

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn allocations_are_counted_globally_and_per_thread() {
    let (all, mine) = (ALLOCATIONS.load(Ordering::Relaxed), on_this_thread());
    let v = black_box(vec![1u8; 100]);
    assert!(on_this_thread() > mine, "this thread's allocation counted");
    assert!(ALLOCATIONS.load(Ordering::Relaxed) > all);
    drop(v);

    // Another thread's allocations: in the global count, and in its own.
    let all = ALLOCATIONS.load(Ordering::Relaxed);
    let (theirs, theirs_after) = std::thread::spawn(|| {
        let before = on_this_thread();
        black_box(vec![2u8; 100]);
        (before, on_this_thread())
    })
    .join()
    .expect("thread");
    assert!(theirs_after > theirs, "the other thread counted its own");
    assert!(ALLOCATIONS.load(Ordering::Relaxed) > all);
}
