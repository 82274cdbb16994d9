//! Property test: random take / fill / share / release / give sequences
//! against a simple model of what must be true — capacities, exhaustion,
//! refill, counters, and that every buffer reads back exactly what was
//! written into it, never bytes of an earlier packet.

use mcrelay_pool::{Class, PoolConfig, PoolSet, Released, SharedBuffer};
use proptest::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[derive(Debug, Clone)]
enum Op {
    /// Take a buffer for a payload of this length and fill it.
    Take(usize),
    /// Give back the held buffer at this index (modulo).
    Give(usize),
    /// Turn a held buffer into a shared one with this many uses.
    Share(usize, u32),
    /// Release one use of a shared buffer.
    Release(usize),
    /// Try to give a buffer of another pool set.
    GiveForeign,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop_oneof![0usize..=1500, 1501usize..=4096, 4097usize..=9000, 9001usize..=10000]
            .prop_map(Op::Take),
        3 => any::<usize>().prop_map(Op::Give),
        1 => (any::<usize>(), 1u32..5).prop_map(|(i, n)| Op::Share(i, n)),
        2 => any::<usize>().prop_map(Op::Release),
        1 => Just(Op::GiveForeign),
    ]
}

/// The byte pattern of the `n`th payload: differs from packet to packet.
fn payload(n: u64, len: usize) -> Vec<u8> {
    let start = n.to_le_bytes()[0].wrapping_mul(31);
    (0..len)
        .map(|i| start.wrapping_add(i.to_le_bytes()[0]))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_model(
        counts in (1u32..6, 1u32..6, 1u32..4),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let config = PoolConfig { small: counts.0, standard: counts.1, jumbo: counts.2 };
        let mut pool = PoolSet::new(config).expect("pool");
        let mut other = PoolSet::new(config).expect("other pool");
        let stats = pool.stats();
        let mut held: Vec<(mcrelay_pool::Buffer, Vec<u8>)> = Vec::new();
        let mut shared: Vec<(SharedBuffer, Vec<u8>)> = Vec::new();
        let mut in_use = [0u32; 3];
        let (mut taken, mut given, mut exhausted, mut oversize) = ([0u64; 3], [0u64; 3], [0u64; 3], 0u64);
        let mut high = [0u64; 3];
        let mut seq = 0u64;

        for op in ops {
            match op {
                Op::Take(len) => {
                    seq += 1;
                    let data = payload(seq, len);
                    match Class::for_len(len) {
                        None => {
                            prop_assert!(pool.take_filled(&data).is_none());
                            oversize += 1;
                        }
                        Some(class) => {
                            let i = class.index();
                            let got = pool.take_filled(&data);
                            if in_use[i] == config.count(class) {
                                prop_assert!(got.is_none(), "class must be exhausted");
                                exhausted[i] += 1;
                            } else {
                                let b = got.expect("a free buffer exists");
                                prop_assert_eq!(b.class(), class);
                                prop_assert_eq!(pool.bytes(&b), &data[..]);
                                in_use[i] += 1;
                                taken[i] += 1;
                                high[i] = high[i].max(u64::from(in_use[i]));
                                held.push((b, data));
                            }
                        }
                    }
                }
                Op::Give(k) if !held.is_empty() => {
                    let (b, data) = held.swap_remove(k % held.len());
                    prop_assert_eq!(pool.bytes(&b), &data[..], "contents intact until give");
                    let i = b.class().index();
                    prop_assert!(pool.give(b).is_ok());
                    in_use[i] -= 1;
                    given[i] += 1;
                }
                Op::Share(k, uses) if !held.is_empty() => {
                    let (b, data) = held.swap_remove(k % held.len());
                    shared.push((SharedBuffer::new(b, uses).expect("uses > 0"), data));
                }
                Op::Release(k) if !shared.is_empty() => {
                    let (s, data) = shared.swap_remove(k % shared.len());
                    prop_assert_eq!(pool.bytes(s.buffer()), &data[..]);
                    match s.release() {
                        Released::Pending(s) => shared.push((s, data)),
                        Released::Last(b) => {
                            let i = b.class().index();
                            prop_assert!(pool.give(b).is_ok());
                            in_use[i] -= 1;
                            given[i] += 1;
                        }
                    }
                }
                Op::GiveForeign => {
                    if let Some(b) = other.take(10) {
                        let b = pool.give(b).expect_err("foreign buffer must be refused");
                        prop_assert!(other.give(b).is_ok());
                    }
                }
                _ => {}
            }
            pool.publish_stats();
            let snap = stats.snapshot();
            prop_assert_eq!(snap.oversize, oversize);
            for class in Class::ALL {
                let i = class.index();
                let c = snap.class(class);
                prop_assert_eq!(pool.in_use(class), in_use[i]);
                prop_assert_eq!(c.in_use, u64::from(in_use[i]));
                prop_assert_eq!(c.taken, taken[i]);
                prop_assert_eq!(c.given, given[i]);
                prop_assert_eq!(c.exhausted, exhausted[i]);
                prop_assert_eq!(c.high_water, high[i]);
                prop_assert_eq!(c.capacity, u64::from(config.count(class)));
            }
        }

        // Drain everything: the pool refills completely and every buffer
        // can be taken again.
        for (b, _) in held.drain(..) {
            prop_assert!(pool.give(b).is_ok());
        }
        for (mut s, _) in shared.drain(..) {
            loop {
                match s.release() {
                    Released::Pending(next) => s = next,
                    Released::Last(b) => { prop_assert!(pool.give(b).is_ok()); break; }
                }
            }
        }
        for class in Class::ALL {
            prop_assert_eq!(pool.in_use(class), 0);
            let all: Vec<_> = (0..config.count(class)).map(|_| pool.take(class.size()).expect("refilled")).collect();
            prop_assert!(pool.take(class.size()).is_none());
            for b in all {
                prop_assert!(pool.give(b).is_ok());
            }
        }
    }
}

#[test]
fn reader_thread_sees_consistent_counters() {
    let mut pool = PoolSet::new(PoolConfig {
        small: 8,
        standard: 1,
        jumbo: 1,
    })
    .expect("pool");
    let stats = pool.stats();
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, reads) = (stop.clone(), reads.clone());
        std::thread::spawn(move || {
            let mut last = stats.snapshot().classes[0];
            while !stop.load(Ordering::Relaxed) {
                let c = *stats.snapshot().class(Class::Small);
                assert!(c.given <= c.taken, "given never overtakes taken: {c:?}");
                assert!(
                    c.taken >= last.taken && c.given >= last.given,
                    "counters only grow"
                );
                last = c;
                assert!(c.in_use <= c.capacity, "in use within capacity: {c:?}");
                assert!(c.high_water <= c.capacity);
                reads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // The writer keeps going until the reader has overlapped it for a while:
    // under valgrind (which serialises threads) the reader may not be
    // scheduled at all during a fixed number of iterations.
    let mut turns = 0u64;
    while turns < 200_000 || reads.load(Ordering::Relaxed) < 1_000 {
        let a = pool.take(100).expect("a");
        let b = pool.take(100).expect("b");
        pool.give(a).expect("give a");
        pool.give(b).expect("give b");
        pool.publish_stats(); // once per "loop turn"
        turns += 1;
        if turns % 1024 == 0 {
            std::thread::yield_now();
        }
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader saw consistent counters");
    let c = *pool.stats().snapshot().class(Class::Small);
    assert_eq!(
        (c.taken, c.given, c.in_use, c.high_water),
        (2 * turns, 2 * turns, 0, 2)
    );
}
