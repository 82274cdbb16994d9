//! The redundancy benchmarks' driver: one flow in a relay core under a
//! scenario (a rule, its legs' skew and losses), fed a block of
//! sequence numbers at a time through `Core::receive_on`, `Core::tick`,
//! `Core::flush` and `Core::complete`, as the worker's driver would.

use std::hint::black_box;
use std::sync::Arc;

use mcrelay_relay::counters::OutputCounters;
use mcrelay_relay::{Core, FlowId, LegId, Redundancy, SendToken};

/// Sequence numbers (delivered packets) per iteration.
pub const BLOCK: i32 = 1000;
/// Fake time between two numbers (10 kpps).
const PERIOD_NS: u64 = 100_000;
const MS: u64 = 1_000_000;

#[derive(Debug)]
pub struct Scenario {
    pub name: &'static str,
    legs: u8,
    redundancy: Redundancy,
    /// Leg 1's lag, in packets.
    skew: i32,
    /// Each leg loses a disjoint 5 %.
    lossy: bool,
}

/// One block's arrivals in time order: (time slot, leg, offset of its
/// number from the block's first).
fn schedule(s: &Scenario) -> Vec<(u64, u8, i32)> {
    let mut events = Vec::new();
    for k in 0..BLOCK {
        let slot = u64::try_from(k).unwrap_or(0);
        for leg in 0..s.legs {
            let j = if leg == 1 { k - s.skew } else { k };
            let lost = s.lossy && j.rem_euclid(20) == if leg == 0 { 3 } else { 13 };
            if !lost {
                events.push((slot, leg, j));
            }
        }
    }
    events
}

pub fn scenarios() -> [Scenario; 6] {
    let merge = |delay_ns| Redundancy::Merge {
        delay_ns,
        window_ns: 50 * MS,
    };
    [
        Scenario {
            name: "single",
            legs: 1,
            redundancy: Redundancy::Single,
            skew: 0,
            lossy: false,
        },
        Scenario {
            name: "merge",
            legs: 2,
            redundancy: merge(0),
            skew: 0,
            lossy: false,
        },
        Scenario {
            name: "merge-lossy",
            legs: 2,
            redundancy: merge(0),
            skew: 20,
            lossy: true,
        },
        Scenario {
            name: "merge-delay-lossy",
            legs: 2,
            redundancy: merge(50 * MS),
            skew: 20,
            lossy: true,
        },
        Scenario {
            name: "failover",
            legs: 2,
            redundancy: Redundancy::Failover {
                after_ns: 100 * MS,
                revert_after_ns: Some(10_000 * MS),
                rtp: true,
                rtp_rewrite: None,
                gap_factor: 4,
            },
            skew: 0,
            lossy: false,
        },
        Scenario {
            name: "failover-rewrite",
            legs: 2,
            redundancy: Redundancy::Failover {
                after_ns: 100 * MS,
                revert_after_ns: Some(10_000 * MS),
                rtp: true,
                rtp_rewrite: Some(90_000),
                gap_factor: 4,
            },
            skew: 0,
            lossy: false,
        },
    ]
}

/// A flow under one scenario, delivering block after block.
#[derive(Debug)]
pub struct Run {
    pub core: Core,
    pub flow: FlowId,
    pub out: Arc<OutputCounters>,
    events: Vec<(u64, u8, i32)>,
    datagram: Vec<u8>,
    sent: Vec<SendToken>,
    base: u16,
    now: u64,
}

impl Run {
    pub fn new(s: &Scenario) -> Self {
        let (mut core, spec, out) = crate::core_and_output();
        let flow = core
            .add_flow([spec], Arc::default(), s.legs, s.redundancy, 1)
            .expect("an empty core takes a flow");
        let mut datagram = vec![0x47u8; 12 + 1316];
        let _ = mcrelay_wire::rtp::build(&mut datagram, 33, 0, 0, 0x2022_0007);
        Self {
            core,
            flow,
            out,
            events: schedule(s),
            datagram,
            sent: Vec::with_capacity(64),
            base: 0,
            now: 1_000 * MS,
        }
    }

    /// Deliver the next block of numbers.
    pub fn block(&mut self) {
        let result = i32::try_from(self.datagram.len()).unwrap_or(0);
        let start = self.now;
        for &(slot, leg, j) in &self.events {
            let seq = self.base.wrapping_add_signed(i16::try_from(j).unwrap_or(0));
            self.datagram[2..4].copy_from_slice(&seq.to_be_bytes());
            let now = start + slot * PERIOD_NS;
            let core = &mut self.core;
            black_box(core.receive_on(self.flow, LegId(leg), black_box(&self.datagram), now));
            core.tick(now);
            let sent = &mut self.sent;
            core.flush(&mut |req, _| {
                sent.push(req.token());
                true
            });
            for token in sent.drain(..) {
                core.complete(token, result, &mut |_, _| true);
            }
        }
        self.now = start + u64::try_from(BLOCK).unwrap_or(0) * PERIOD_NS;
        self.base = self.base.wrapping_add(u16::try_from(BLOCK).unwrap_or(0));
    }
}
