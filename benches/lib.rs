//! mcrelay's benchmark suites are the `[[bench]]` targets beside this file
//! in `benches/` (see `Cargo.toml`); this library only holds what several
//! of them share.

pub mod redundancy_run;

use std::sync::Arc;

use mcrelay_pool::{PoolConfig, PoolSet};
use mcrelay_relay::counters::OutputCounters;
use mcrelay_relay::{Core, OutputSpec};
use mcrelay_wire::health::Payload;
use mcrelay_wire::{rtp, ts};

/// A core with the default pools, and the one output the core benches
/// relay to (depth 256, no GSO) with its counters.
pub fn core_and_output() -> (Core, OutputSpec, Arc<OutputCounters>) {
    let core = Core::new(PoolSet::new(PoolConfig::default()).expect("pool fits"));
    let out = Arc::<OutputCounters>::default();
    let spec = OutputSpec {
        depth: 256,
        gso: false,
        counters: Arc::clone(&out),
        resume_after: None,
    };
    (core, spec, out)
}

/// Datagram `i` of a clean stream in `payload`'s framing: seven TS packets
/// (1316 B) on PID 0x100 whose continuity counters run on from datagram
/// `i - 1`, behind an RTP header (sequence number `i`, timestamp `i` x 900)
/// in the RTP modes. In the non-TS modes the TS bytes are just payload.
pub fn health_datagram(payload: Payload, i: usize) -> Vec<u8> {
    let seq = u16::try_from(i % 65536).unwrap_or(0);
    let mut tsd = vec![0xffu8; 7 * ts::PACKET];
    for (k, p) in tsd.chunks_exact_mut(ts::PACKET).enumerate() {
        let cc = u8::try_from((i * 7 + k) % 16).unwrap_or(0);
        ts::build(p, 0x100, cc, true, None);
    }
    if payload.has_rtp() {
        let mut d = vec![0u8; 12];
        let _ = rtp::build(&mut d, 33, seq, u32::from(seq).wrapping_mul(900), 1);
        d.extend_from_slice(&tsd);
        d
    } else {
        tsd
    }
}
