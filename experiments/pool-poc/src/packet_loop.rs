//! Scenario 6: a packet-like loop to run under cachegrind. Per packet: get
//! memory, copy a 1316-byte payload from one of 64 receive slots, read it
//! back (checksum), keep it in flight behind 64 others as if awaiting egress
//! completions, then release it. `--with pool` takes from the pool;
//! `--with alloc` uses a fresh `Vec` per packet, as a naive relay does.

use std::collections::VecDeque;
use std::hint::black_box;

use mcrelay_pool::{PoolConfig, PoolSet};

use crate::Memory;

const PAYLOAD: usize = 1316;
const RX_SLOTS: usize = 64;
const IN_FLIGHT: usize = 64;

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().map(|&b| u64::from(b)).sum()
}

pub fn run(with: Memory, packets: usize) {
    let rx: Vec<Vec<u8>> = (0..RX_SLOTS)
        .map(|s| {
            (0..PAYLOAD)
                .map(|i| u8::try_from((s * 7 + i) % 251).unwrap_or(0))
                .collect()
        })
        .collect();
    let mut sum = 0u64;
    match with {
        Memory::Pool => {
            let mut pool = PoolSet::new(PoolConfig::default()).expect("pool fits in memory");
            let mut in_flight = VecDeque::with_capacity(IN_FLIGHT + 1);
            for n in 0..packets {
                let Some(b) = pool.take_filled(black_box(&rx[n % RX_SLOTS])) else {
                    continue;
                };
                sum += checksum(pool.bytes(&b));
                in_flight.push_back(b);
                if in_flight.len() > IN_FLIGHT {
                    if let Some(old) = in_flight.pop_front() {
                        let _ = pool.give(old);
                    }
                }
            }
        }
        Memory::Alloc => {
            let mut in_flight: VecDeque<Vec<u8>> = VecDeque::with_capacity(IN_FLIGHT + 1);
            for n in 0..packets {
                let src = black_box(&rx[n % RX_SLOTS]);
                let mut v = Vec::with_capacity(1500);
                v.extend_from_slice(src);
                sum += checksum(&v);
                in_flight.push_back(v);
                if in_flight.len() > IN_FLIGHT {
                    drop(in_flight.pop_front());
                }
            }
        }
    }
    println!("{packets} packets, checksum {sum}");
}
