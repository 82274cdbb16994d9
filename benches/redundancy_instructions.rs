//! Instruction counts (callgrind, via gungraun) of the relay core per
//! delivered packet under each redundancy rule, next to a one-leg flow:
//! the scenarios of `benches/redundancy.rs` (see
//! `mcrelay_benches::redundancy_run`), stable on a loaded machine where
//! its times are not.
//!
//! Each run delivers one block of [`BLOCK`] sequence numbers (every copy
//! of every leg through `Core::receive_on`, a `Core::tick` after each,
//! the sends flushed and completed) after two blocks in setup (not
//! counted), so the merge state, the pool and the timers are past their
//! start. The count per delivered packet is the total divided by
//! [`BLOCK`]. The teardown (not counted) checks that the block delivered
//! each number once.

use std::hint::black_box;

use gungraun::{library_benchmark, library_benchmark_group, main};
use mcrelay_benches::redundancy_run::{BLOCK, Run, scenarios};

fn setup(index: usize) -> (Run, u64) {
    let s = &scenarios()[index];
    let mut run = Run::new(s);
    run.block();
    run.block();
    let before = run.out.packets_out.get();
    (run, before)
}

fn teardown((run, before): (Run, u64)) {
    assert_eq!(
        run.out.packets_out.get() - before,
        u64::try_from(BLOCK).unwrap_or(0)
    );
}

#[library_benchmark]
#[bench::single(args = (0), setup = setup, teardown = teardown)]
#[bench::merge(args = (1), setup = setup, teardown = teardown)]
#[bench::merge_lossy(args = (2), setup = setup, teardown = teardown)]
#[bench::merge_delay_lossy(args = (3), setup = setup, teardown = teardown)]
#[bench::failover(args = (4), setup = setup, teardown = teardown)]
#[bench::failover_rewrite(args = (5), setup = setup, teardown = teardown)]
fn block_x1000((mut run, before): (Run, u64)) -> (Run, u64) {
    run.block();
    black_box((run, before))
}

library_benchmark_group!(name = core; benchmarks = block_x1000);

main!(library_benchmark_groups = core);
