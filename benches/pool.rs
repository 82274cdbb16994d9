//! Criterion suite for the buffer pool, with the allocator baselines it must
//! beat measured in the same run (ratios hold on a noisy shared VM where
//! absolute times don't).
//!
//! IDs: `pool/take_give/{small,standard,jumbo}`,
//! `alloc/vec_zeroed/{..}`, `alloc/vec_with_capacity/{..}`,
//! `pool/copy/{1316,8000}`, `alloc/copy/{1316,8000}`,
//! `pool/burst/{10,50,100,500}`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mcrelay_pool::{Class, PoolConfig, PoolSet};

/// Payload length written into each class in the take/give benches.
fn payload_len(class: Class) -> usize {
    match class {
        Class::Small => 1000,
        Class::Standard => 4000,
        Class::Jumbo => 8000,
    }
}

/// "Write the payload length into it": the 8-byte length header every
/// variant writes, so the pool and the allocator do the same work.
#[inline(always)]
fn len_header(len: usize) -> [u8; 8] {
    (len as u64).to_le_bytes()
}

fn take_give(c: &mut Criterion) {
    let mut pool = PoolSet::new(PoolConfig::default()).expect("pool fits in memory");
    let mut group = c.benchmark_group("pool");
    group.throughput(Throughput::Elements(1));
    for class in Class::ALL {
        let len = payload_len(class);
        group.bench_function(BenchmarkId::new("take_give", class.name()), |b| {
            b.iter(|| {
                let len = black_box(len);
                let mut buf = pool.take(len).expect("pool has free buffers");
                pool.fill(&mut buf, &len_header(len));
                black_box(&buf);
                let _ = pool.give(buf);
            });
        });
    }
    group.finish();

    let mut group = c.benchmark_group("alloc");
    group.throughput(Throughput::Elements(1));
    for class in Class::ALL {
        let len = payload_len(class);
        group.bench_function(BenchmarkId::new("vec_zeroed", class.name()), |b| {
            b.iter(|| {
                let len = black_box(len);
                let mut v = vec![0u8; black_box(class.size())];
                v[..8].copy_from_slice(&len_header(len));
                black_box(v);
            });
        });
        group.bench_function(BenchmarkId::new("vec_with_capacity", class.name()), |b| {
            b.iter(|| {
                let len = black_box(len);
                let mut v = Vec::<u8>::with_capacity(black_box(class.size()));
                v.extend_from_slice(&len_header(len));
                black_box(v);
            });
        });
    }
    group.finish();
}

fn copy(c: &mut Criterion) {
    let mut pool = PoolSet::new(PoolConfig::default()).expect("pool fits in memory");
    let payloads: Vec<Vec<u8>> = [1316usize, 8000]
        .iter()
        .map(|&n| (0..n).map(|i| u8::try_from(i % 251).unwrap_or(0)).collect())
        .collect();
    let mut pool_group = c.benchmark_group("pool");
    for payload in &payloads {
        pool_group.throughput(Throughput::Bytes(payload.len() as u64));
        pool_group.bench_function(BenchmarkId::new("copy", payload.len()), |b| {
            b.iter(|| {
                let buf = pool.take_filled(black_box(payload)).expect("free buffer");
                black_box(pool.bytes(&buf));
                let _ = pool.give(buf);
            });
        });
    }
    pool_group.finish();
    let mut alloc_group = c.benchmark_group("alloc");
    for payload in &payloads {
        alloc_group.throughput(Throughput::Bytes(payload.len() as u64));
        alloc_group.bench_function(BenchmarkId::new("copy", payload.len()), |b| {
            b.iter(|| {
                // A relay that allocates per packet: allocate the class size,
                // copy the payload in. black_box keeps the allocation alive.
                let payload = black_box(payload.as_slice());
                let mut v = Vec::with_capacity(black_box(
                    Class::for_len(payload.len()).map_or(0, Class::size),
                ));
                v.extend_from_slice(payload);
                black_box(&v);
                drop(black_box(v));
            });
        });
    }
    alloc_group.finish();
}

fn burst(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool");
    for n in [10usize, 50, 100, 500] {
        let mut pool = PoolSet::new(PoolConfig::default()).expect("pool fits in memory");
        let mut held = Vec::with_capacity(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::new("burst", n), |b| {
            b.iter(|| {
                for _ in 0..n {
                    held.push(
                        pool.take(black_box(1316))
                            .expect("burst fits the small class"),
                    );
                }
                for buf in held.drain(..) {
                    let _ = pool.give(buf);
                }
            });
        });
    }
    group.finish();
}

criterion_group!(benches, take_give, copy, burst);
criterion_main!(benches);
