//! Cycle-accurate timestamps for per-operation latency: `Instant::now()`
//! costs ~20 ns here, more than the operation being measured.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

/// Read the time-stamp counter.
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: RDTSC has no memory effects and exists on every x86-64 CPU;
    // the intrinsic is `unsafe` only because it is a raw instruction.
    unsafe { std::arch::x86_64::_rdtsc() }
}

/// TSC ticks per nanosecond, calibrated against the monotonic clock.
pub fn ticks_per_ns() -> f64 {
    let (t0, c0) = (Instant::now(), now());
    while t0.elapsed() < Duration::from_millis(200) {
        std::hint::spin_loop();
    }
    let (ns, ticks) = (t0.elapsed().as_nanos(), now() - c0);
    ticks as f64 / ns as f64
}
