//! Instruction counts (callgrind, via gungraun) of the pool's hot path:
//! stable on a shared VM, so `.ci/steps/40-instruction-counts.sh` gates them
//! against `benches/baselines/pool_instructions.json`.
//!
//! Each benchmark runs `PAIRS` take+give pairs on a pool built in setup (not
//! counted), so the count per pair is the total divided by `PAIRS`, with the
//! loop's own few instructions and the `black_box` that keeps the buffer
//! handle alive included.
//!
//! The `alloc` group runs the same loop with the allocator instead of the
//! pool (a `Vec` of the class's size, as `benches/pool.rs` does): what the
//! pool is compared with. It is not gated (its count is glibc's, not
//! ours); `benches/results/pool_instructions.json` records both groups for
//! the plot in `docs/plots/` (see `docs/benchmarks.md`).

use std::hint::black_box;

use gungraun::{library_benchmark, library_benchmark_group, main};
use mcrelay_pool::{Class, PoolConfig, PoolSet};

/// Take+give pairs per benchmark run.
const PAIRS: usize = 1000;

fn new_pool() -> PoolSet {
    PoolSet::new(PoolConfig::default()).expect("pool fits in memory")
}

fn setup(len: usize) -> (PoolSet, usize) {
    (new_pool(), len)
}

#[library_benchmark]
#[bench::small(args = (1000), setup = setup)]
#[bench::standard(args = (4000), setup = setup)]
#[bench::jumbo(args = (8000), setup = setup)]
fn take_give_x1000((mut pool, len): (PoolSet, usize)) -> PoolSet {
    for _ in 0..PAIRS {
        let buf = pool.take(black_box(len)).expect("pool has free buffers");
        black_box(&buf);
        let _ = pool.give(buf);
    }
    pool
}

// The same loop with the pool calls replaced by a plain value: what the
// loop and the `black_box`es cost on their own, to subtract.
#[library_benchmark]
#[bench::empty(args = (1000), setup = setup)]
fn loop_only_x1000((pool, len): (PoolSet, usize)) -> PoolSet {
    for _ in 0..PAIRS {
        let fake = (black_box(len), 0u32, 0u32);
        black_box(&fake);
    }
    pool
}

library_benchmark_group!(name = pool; benchmarks = take_give_x1000, loop_only_x1000);

// The allocator doing the pool's job: allocate a buffer of the class's size
// and free it. (Not `vec![0; size]` as well: glibc zeroes 2 KiB and more
// with `rep stosb`, which callgrind counts once per byte, so its count says
// nothing about its time; the Criterion suite `benches/pool.rs` times it.)
#[library_benchmark]
#[bench::small(args = (Class::Small.size()))]
#[bench::standard(args = (Class::Standard.size()))]
#[bench::jumbo(args = (Class::Jumbo.size()))]
fn vec_with_capacity_x1000(size: usize) {
    for _ in 0..PAIRS {
        let v = Vec::<u8>::with_capacity(black_box(size));
        black_box(&v);
    }
}

library_benchmark_group!(name = alloc; benchmarks = vec_with_capacity_x1000);

main!(library_benchmark_groups = pool, alloc);
