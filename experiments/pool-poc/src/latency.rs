//! Scenarios 1, 2, 3 and 5: how long a take+give pair takes.

use std::hint::black_box;
use std::time::Instant;

use mcrelay_pool::{Class, PoolConfig, PoolSet};

use crate::tsc;

/// Bytes written into each buffer: the length header, as in the Criterion
/// suite, so pool and allocator do the same work.
fn header(len: usize) -> [u8; 8] {
    (len as u64).to_le_bytes()
}

fn pool(small: u32) -> PoolSet {
    PoolSet::new(PoolConfig {
        small,
        ..PoolConfig::default()
    })
    .expect("pool fits in memory")
}

/// Operations per timed sample. The TSC of this VM advances in steps of
/// ~10 ns, coarser than one take+give, so each sample times a batch of
/// `BATCH` operations: the histogram is of per-operation cost averaged over
/// 10 operations (~1 ns resolution), and a stall still lands in the tail.
pub const BATCH: usize = 10;

/// Time `ops` operations in samples of [`BATCH`]; ticks per sample.
fn sample(ops: usize, mut op: impl FnMut()) -> Vec<u64> {
    let mut samples = Vec::with_capacity(ops / BATCH);
    for _ in 0..ops / BATCH {
        let t0 = tsc::now();
        for _ in 0..BATCH {
            op();
        }
        let t1 = tsc::now();
        samples.push(t1.saturating_sub(t0));
    }
    samples
}

/// The timer's own cost per sample (median of empty samples).
fn timer_overhead_ticks() -> u64 {
    let mut s = sample(10_000_000, || {});
    s.sort_unstable();
    s[s.len() / 2]
}

/// p50, p95, p99, p999 in ns per operation after subtracting the timer's
/// cost.
fn percentiles(mut ticks: Vec<u64>, overhead: u64, per_ns: f64) -> [f64; 4] {
    ticks.sort_unstable();
    [0.50, 0.95, 0.99, 0.999].map(|q| {
        // Nearest-rank index: `q` is in 0..1, so the product is in range.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let i = ((ticks.len() as f64 - 1.0) * q) as usize;
        ticks[i].saturating_sub(overhead) as f64 / per_ns / BATCH as f64
    })
}

fn row(name: &str, p: [f64; 4]) {
    println!(
        "| {name} | {:.1} | {:.1} | {:.1} | {:.1} |",
        p[0], p[1], p[2], p[3]
    );
}

fn payload_len(class: Class) -> usize {
    match class {
        Class::Small => 1000,
        Class::Standard => 4000,
        Class::Jumbo => 8000,
    }
}

pub fn histograms(pairs: usize) {
    let per_ns = tsc::ticks_per_ns();
    let overhead = timer_overhead_ticks();
    println!(
        "# scenario 1: {pairs} operations each, timed in batches of {BATCH}; \
         TSC {per_ns:.3} ticks/ns; timer overhead {:.1} ns per batch subtracted",
        overhead as f64 / per_ns
    );
    println!("| operation | p50 ns | p95 ns | p99 ns | p999 ns |");
    println!("|---|---|---|---|---|");
    let mut p = pool(1000);
    for class in Class::ALL {
        let len = payload_len(class);
        let s = sample(pairs, || {
            let mut b = p.take(black_box(len)).expect("free buffer");
            p.fill(&mut b, &header(len));
            black_box(&b);
            let _ = p.give(b);
        });
        row(
            &format!("pool take+give {} ({len} B)", class.name()),
            percentiles(s, overhead, per_ns),
        );
    }
    for class in Class::ALL {
        let len = payload_len(class);
        let s = sample(pairs, || {
            let mut v = Vec::<u8>::with_capacity(black_box(class.size()));
            v.extend_from_slice(&header(len));
            black_box(v);
        });
        row(
            &format!("Vec::with_capacity {}", class.size()),
            percentiles(s, overhead, per_ns),
        );
        let s = sample(pairs, || {
            let mut v = vec![0u8; black_box(class.size())];
            v[..8].copy_from_slice(&header(len));
            black_box(v);
        });
        row(
            &format!("vec![0; {}]", class.size()),
            percentiles(s, overhead, per_ns),
        );
    }
}

/// Pairs per second over `seconds`, checked in chunks so the clock isn't
/// read per pair.
fn ops_per_sec(seconds: f64, mut op: impl FnMut()) -> f64 {
    const CHUNK: usize = 10_000;
    let start = Instant::now();
    let mut done = 0usize;
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..CHUNK {
            op();
        }
        done += CHUNK;
    }
    done as f64 / start.elapsed().as_secs_f64()
}

pub fn throughput(seconds: f64) {
    let mut p = pool(1000);
    let metrics = if cfg!(feature = "no-metrics") {
        "without metrics"
    } else {
        "with metrics"
    };
    let pool_rate = ops_per_sec(seconds, || {
        let mut b = p.take(black_box(1000)).expect("free buffer");
        p.fill(&mut b, &header(1000));
        black_box(&b);
        let _ = p.give(b);
    });
    let vec_rate = ops_per_sec(seconds, || {
        let mut v = Vec::<u8>::with_capacity(black_box(1500));
        v.extend_from_slice(&header(1000));
        black_box(v);
    });
    println!("pool ({metrics}) {:.1} M pairs/s", pool_rate / 1e6);
    println!("Vec::with_capacity {:.1} M pairs/s", vec_rate / 1e6);
}

pub fn scaling(pairs: usize) {
    let per_ns = tsc::ticks_per_ns();
    let overhead = timer_overhead_ticks();
    println!("# scenario 3: small class of N buffers, {pairs} operations each");
    println!(
        "| N | take+give p50 ns | p99 ns | rotating (N/2 in flight, 1316 B written) p50 ns | p99 ns |"
    );
    println!("|---|---|---|---|---|");
    let payload = [0x5au8; 1316];
    for n in [100u32, 500, 1000, 5000] {
        let mut p = pool(n);
        let lifo = percentiles(
            sample(pairs, || {
                let b = p
                    .take_filled(black_box(&header(1316)))
                    .expect("free buffer");
                black_box(&b);
                let _ = p.give(b);
            }),
            overhead,
            per_ns,
        );
        // Half the pool in flight, handed back oldest first, as buffers wait
        // for egress completions: every buffer gets cycled through.
        let half = n as usize / 2;
        let mut ring = std::collections::VecDeque::with_capacity(half);
        for _ in 0..half {
            ring.push_back(p.take_filled(&payload).expect("free buffer"));
        }
        let rotating = percentiles(
            sample(pairs, || {
                if let Some(old) = ring.pop_front() {
                    let _ = p.give(old);
                }
                let b = p.take_filled(black_box(&payload)).expect("free buffer");
                ring.push_back(b);
            }),
            overhead,
            per_ns,
        );
        println!(
            "| {n} | {:.1} | {:.1} | {:.1} | {:.1} |",
            lifo[0], lifo[2], rotating[0], rotating[2]
        );
        for b in ring.drain(..) {
            let _ = p.give(b);
        }
    }
}
