//! Instruction counts (callgrind, via gungraun) of SMPTE 2022-1 FEC and
//! RIST, per 1328-byte RTP datagram (1000 of them, after warm-up in
//! setup), beside the plain one-leg relay of `core_instructions` in the
//! same run:
//!
//! - `plain`: `Core::receive_on`, `flush`, `complete` of each datagram;
//! - `fec_decode_no_loss`: the same on a leg with `fec = "2022-1"`
//!   (`Core::enable_fec`), with the 5 × 5 column and row FEC datagrams of
//!   the stream (400 of them) through `Core::receive_fec`, none lost;
//! - `fec_output_10x10`: the same relay to an output with `fec = {
//!   columns = 10, rows = 10 }` (`Core::enable_fec_output`): the parity
//!   computed and the 200 column and row packets queued and sent;
//! - `rist_output_no_loss`: the same relay to a RIST output
//!   (`Core::enable_rist_output`, 1000 ms): each datagram copied into the
//!   retransmission ring, no NACK;
//! - `rist_input_no_loss`: the same on a RIST leg
//!   (`Core::enable_rist_input`), every datagram in order;
//! - `fec_encode_10x10`: `FecEncoder::push` of each datagram alone, 10
//!   columns by 10 rows.
//!
//! `cargo bench -p mcrelay-benches --bench fec_instructions`; the figure
//! is the total / 1000.

use std::hint::black_box;
use std::sync::Arc;

use gungraun::{library_benchmark, library_benchmark_group, main};
use mcrelay_pool::{PoolConfig, PoolSet};
use mcrelay_relay::fec::{FecEncoder, FecLayout};
use mcrelay_relay::{Core, FlowId, LegId, OutputId, OutputSpec, Redundancy, SendToken};

const N: u16 = 1000;
const LEN: usize = 1328;
const LEN_I32: i32 = 1328;

fn packet(seq: u16) -> Vec<u8> {
    let mut p = vec![0x47u8; LEN];
    p[0] = 0x80;
    p[1] = 33;
    p[2..4].copy_from_slice(&seq.to_be_bytes());
    p[4..8].copy_from_slice(&(u32::from(seq) * 3600).to_be_bytes());
    p[8..12].copy_from_slice(&0x0102_0304u32.to_be_bytes());
    p
}

/// A datagram in, on the media leg or a FEC port.
enum Item {
    Media(Vec<u8>),
    Fec(Vec<u8>),
}

type State = (Core, FlowId, Vec<Item>, Vec<SendToken>);

/// The stream from `first`: `n` datagrams, and with `fec` the 5 × 5 FEC
/// an ffmpeg sender adds.
fn stream(first: u16, n: u16, fec: bool) -> Vec<Item> {
    let mut enc = FecEncoder::new(FecLayout {
        columns: 5,
        rows: 5,
        row_stream: true,
    });
    let mut items = Vec::new();
    for i in 0..n {
        let p = packet(first.wrapping_add(i));
        let mut f = Vec::new();
        if fec {
            enc.push(&p, |_, d| f.push(d.to_vec()));
        }
        items.push(Item::Media(p));
        items.extend(f.into_iter().map(Item::Fec));
    }
    items
}

fn relay(core: &mut Core, flow: FlowId, items: &[Item], sent: &mut Vec<SendToken>) {
    for item in items {
        match item {
            Item::Media(p) => {
                black_box(core.receive_on(flow, LegId(0), black_box(p), 0));
            }
            Item::Fec(d) => {
                black_box(core.receive_fec(flow, LegId(0), black_box(d), 0));
            }
        }
        core.flush(&mut |req, _| {
            sent.push(req.token());
            true
        });
        for token in sent.drain(..) {
            core.complete(token, LEN_I32, &mut |_, _| true);
        }
    }
}

/// What the measured flow does beyond relaying.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    FecDecode,
    FecOutput,
    RistOutput,
    RistInput,
}

fn setup_kind(kind: Kind) -> State {
    let fec = kind == Kind::FecDecode;
    let mut core = Core::new(PoolSet::new(PoolConfig::default()).expect("pool fits"));
    let spec = || OutputSpec {
        depth: 256,
        gso: false,
        counters: Arc::default(),
        resume_after: None,
    };
    let outputs = if kind == Kind::FecOutput { 3 } else { 1 };
    let flow = core
        .add_flow(
            (0..outputs).map(|_| spec()),
            Arc::default(),
            1,
            Redundancy::Single,
            1,
        )
        .expect("an empty core takes a flow");
    match kind {
        Kind::Plain => {}
        Kind::FecDecode => {
            core.enable_fec(flow, LegId(0));
        }
        Kind::FecOutput => {
            let layout = FecLayout {
                columns: 10,
                rows: 10,
                row_stream: true,
            };
            core.enable_fec_output(flow, OutputId(0), OutputId(1), OutputId(2), layout);
        }
        Kind::RistOutput => {
            core.enable_rist_output(flow, OutputId(0), 1000);
        }
        Kind::RistInput => {
            core.enable_rist_input(flow, LegId(0), 1000);
        }
    }
    let mut sent = Vec::with_capacity(4);
    // Warm-up: a whole window, so the measured run overwrites slots.
    relay(&mut core, flow, &stream(0, 600, fec), &mut sent);
    (core, flow, stream(600, N, fec), sent)
}

fn setup_plain() -> State {
    setup_kind(Kind::Plain)
}

fn setup_fec() -> State {
    setup_kind(Kind::FecDecode)
}

fn setup_fec_output() -> State {
    setup_kind(Kind::FecOutput)
}

fn setup_rist_output() -> State {
    setup_kind(Kind::RistOutput)
}

fn setup_rist_input() -> State {
    setup_kind(Kind::RistInput)
}

#[library_benchmark]
#[bench::plain(setup = setup_plain)]
#[bench::fec_decode_no_loss(setup = setup_fec)]
#[bench::fec_output_10x10(setup = setup_fec_output)]
#[bench::rist_output_no_loss(setup = setup_rist_output)]
#[bench::rist_input_no_loss(setup = setup_rist_input)]
fn receive_x1000(s: State) -> State {
    let (mut core, flow, items, mut sent) = s;
    relay(&mut core, flow, &items, &mut sent);
    (core, flow, items, sent)
}

fn setup_encoder() -> (FecEncoder, Vec<Vec<u8>>) {
    let mut enc = FecEncoder::new(FecLayout {
        columns: 10,
        rows: 10,
        row_stream: true,
    });
    for seq in 0..200u16 {
        enc.push(&packet(seq), |_, _| {});
    }
    (enc, (200..200 + N).map(packet).collect())
}

#[library_benchmark]
#[bench::fec_encode_10x10(setup = setup_encoder)]
fn encode_x1000(s: (FecEncoder, Vec<Vec<u8>>)) -> FecEncoder {
    let (mut enc, packets) = s;
    for p in &packets {
        enc.push(black_box(p), |_, d| {
            black_box(d);
        });
    }
    enc
}

library_benchmark_group!(name = fec; benchmarks = receive_x1000, encode_x1000);

main!(library_benchmark_groups = fec);
