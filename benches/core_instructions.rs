//! Instruction counts (callgrind, via gungraun) of the relay core's
//! one-leg packet path, the API every tree since issue 15 has:
//! `Core::receive` of a 1316-byte datagram, `Core::flush`, and
//! `Core::complete` of its send, 1000 times (one output, no GSO), after
//! 16 in setup. Run in two trees to compare them (the figure is the
//! total / 1000): against a tree from before issue 17, drop `add_flow`'s
//! leg count and rule (`1, Redundancy::Single`).

use std::hint::black_box;
use std::sync::Arc;

use gungraun::{library_benchmark, library_benchmark_group, main};
use mcrelay_pool::{PoolConfig, PoolSet};
use mcrelay_relay::counters::OutputCounters;
use mcrelay_relay::{Core, FlowId, OutputSpec, Redundancy, SendToken};

const WARM: usize = 16;
const N: usize = 1000;

type State = (Core, FlowId, Arc<OutputCounters>, Vec<u8>, Vec<SendToken>);

fn relay(s: &mut State, n: usize) {
    let (core, flow, _, payload, sent) = s;
    for _ in 0..n {
        black_box(core.receive(*flow, black_box(payload.as_slice())));
        core.flush(&mut |req, _| {
            sent.push(req.token());
            true
        });
        for token in sent.drain(..) {
            core.complete(token, 1316, &mut |_, _| true);
        }
    }
}

fn setup() -> State {
    let mut core = Core::new(PoolSet::new(PoolConfig::default()).expect("pool fits"));
    let out = Arc::<OutputCounters>::default();
    let spec = OutputSpec {
        depth: 256,
        gso: false,
        counters: Arc::clone(&out),
    };
    let flow = add(&mut core, spec);
    let mut s = (core, flow, out, vec![0x47u8; 1316], Vec::with_capacity(4));
    relay(&mut s, WARM);
    s
}

fn add(core: &mut Core, spec: OutputSpec) -> FlowId {
    core.add_flow([spec], Arc::default(), 1, Redundancy::Single, 1)
        .expect("an empty core takes a flow")
}

fn teardown(s: State) {
    assert_eq!(s.2.packets_out.get(), (WARM + N) as u64);
}

#[library_benchmark]
#[bench::one_output(setup = setup, teardown = teardown)]
fn receive_x1000(mut s: State) -> State {
    relay(&mut s, N);
    s
}

library_benchmark_group!(name = core; benchmarks = receive_x1000);

main!(library_benchmark_groups = core);
