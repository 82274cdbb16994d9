//! Scenario 4: a burst above the drain rate exhausts the class; the relay
//! drops (and counts) what doesn't fit, and recovers when the rate drops.
//!
//! Model, in loop turns ("ticks"): each tick the egress side completes up to
//! `drain` of the oldest in-flight buffers (they go back to the pool), then
//! `rate × drain` packets arrive and each takes a small buffer or is dropped.
//! 100 ticks at 1×, 50 ticks at the burst factor, then 0.5× until the
//! occupancy is back to its steady level. The seed's version ignored the
//! burst factor (98.41 % for 2×, 5× and 10×); here it is the input.

use std::collections::VecDeque;

use mcrelay_pool::{Buffer, Class, PoolConfig, PoolSet};

const WARM_TICKS: usize = 100;
const BURST_TICKS: usize = 50;
/// Per-core design rate of the seed (312.5 kpps), to turn ticks into time.
const DESIGN_PPS: f64 = 312_500.0;

struct Relay {
    pool: PoolSet,
    in_flight: VecDeque<Buffer>,
    drain: usize,
}

#[derive(Debug, Default)]
struct Tick {
    offered: usize,
    taken: usize,
}

impl Relay {
    fn new(buffers: u32, drain: usize) -> Self {
        let pool = PoolSet::new(PoolConfig {
            small: buffers,
            ..PoolConfig::default()
        })
        .expect("pool fits in memory");
        Self {
            pool,
            in_flight: VecDeque::with_capacity(buffers as usize),
            drain,
        }
    }

    fn tick(&mut self, offered: usize) -> Tick {
        for _ in 0..self.drain.min(self.in_flight.len()) {
            if let Some(b) = self.in_flight.pop_front() {
                let _ = self.pool.give(b);
            }
        }
        let mut t = Tick { offered, taken: 0 };
        for _ in 0..offered {
            if let Some(b) = self.pool.take(1316) {
                self.in_flight.push_back(b);
                t.taken += 1;
            }
        }
        t
    }
}

/// One run: success rate during the burst, ticks until the first tick with
/// no drop after it, ticks until occupancy is back to the 0.5× steady level.
fn run_one(buffers: u32, drain: usize, factor: usize) -> (f64, usize, usize, u64) {
    let mut r = Relay::new(buffers, drain);
    for _ in 0..WARM_TICKS {
        r.tick(drain);
    }
    let (mut offered, mut taken) = (0, 0);
    for _ in 0..BURST_TICKS {
        let t = r.tick(factor * drain);
        offered += t.offered;
        taken += t.taken;
    }
    let low = drain / 2;
    let (mut no_drop_after, mut steady_after) = (None, None);
    for tick in 1..=100_000 {
        let t = r.tick(low);
        if no_drop_after.is_none() && t.taken == t.offered {
            no_drop_after = Some(tick);
        }
        if r.pool.in_use(Class::Small) as usize <= low {
            steady_after = Some(tick);
            break;
        }
    }
    r.pool.publish_stats();
    let exhausted = r.pool.stats().snapshot().class(Class::Small).exhausted;
    (
        taken as f64 / offered as f64,
        no_drop_after.unwrap_or(usize::MAX),
        steady_after.unwrap_or(usize::MAX),
        exhausted,
    )
}

pub fn run() {
    println!(
        "# scenario 4: {WARM_TICKS} ticks at 1x, {BURST_TICKS} at the burst factor, then 0.5x; \
         a tick is `drain` packets at {} kpps",
        DESIGN_PPS / 1e3
    );
    println!(
        "| small buffers | drain/tick | burst | taken during burst | drops counted | \
         no drops again after | occupancy steady after |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (buffers, drain) in [(50u32, 10usize), (1000, 100)] {
        let tick_us = drain as f64 / DESIGN_PPS * 1e6;
        for factor in [2, 5, 10] {
            let (rate, first_ok, steady, drops) = run_one(buffers, drain, factor);
            println!(
                "| {buffers} | {drain} | {factor}x | {:.2} % | {drops} | {first_ok} tick ({:.0} µs) | {steady} ticks ({:.0} µs) |",
                rate * 100.0,
                first_ok as f64 * tick_us,
                steady as f64 * tick_us,
            );
        }
    }
}
