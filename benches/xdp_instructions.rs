//! Instruction counts (callgrind, via gungraun) of the XDP path's own
//! per-frame work, without the kernel: what `egress = "xdp"` does for
//! each datagram — fill the output's prebuilt Ethernet/IPv4/UDP header
//! (two lengths and the IP checksum) and copy header and payload into a
//! UMEM frame (`Template::write_frame`) — and what `ingress = "xdp"` does
//! for each received frame before the core's ingest — parse it in place
//! (`mcrelay_wire::parse`, no UDP checksum, as the worker calls it). A
//! plain copy of the payload into a frame is the yardstick: the part of
//! the egress figure beyond it is the header. 1316-byte payloads, 1000
//! per run, into 64 frames of 2048 bytes used in turn (a UMEM's worth of
//! cache behaviour is not modelled: callgrind counts instructions).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use gungraun::{library_benchmark, library_benchmark_group, main};
use mcrelay_wire::FlowMatch;
use mcrelay_wire::egress::{Endpoints, Template, multicast_mac};

const N: usize = 1000;
const FRAMES: usize = 64;
const FRAME: usize = 2048;
const PAYLOAD: usize = 1316;
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 2, 2, 2);
const SOURCE: Ipv4Addr = Ipv4Addr::new(10, 10, 2, 1);

struct State {
    template: Template,
    umem: Vec<u8>,
    payload: Vec<u8>,
    /// One frame as the egress writes it (the ingress bench parses it).
    frame: Vec<u8>,
    flow: FlowMatch,
}

fn state() -> State {
    let template = Template::new(&Endpoints {
        source_mac: [2, 0, 0, 0, 0, 1],
        source: SOURCE,
        source_port: 40000,
        destination: GROUP,
        destination_mac: multicast_mac(GROUP),
        port: 6000,
        ttl: 1,
    });
    let payload: Vec<u8> = (0..PAYLOAD)
        .map(|i| u8::try_from(i % 251).unwrap_or(0))
        .collect();
    let mut frame = vec![0u8; FRAME];
    let len = template.write_frame(&mut frame, &payload).expect("fits");
    frame.truncate(len);
    State {
        template,
        umem: vec![0u8; FRAMES * FRAME],
        payload,
        frame,
        flow: FlowMatch {
            destination: IpAddr::V4(GROUP),
            port: 6000,
            source: None,
        },
    }
}

fn teardown(s: State) {
    black_box(s.umem);
}

#[library_benchmark]
#[bench::multicast(setup = state, teardown = teardown)]
fn egress_frame_build_x1000(mut s: State) -> State {
    for i in 0..N {
        let at = (i % FRAMES) * FRAME;
        let frame = &mut s.umem[at..at + FRAME];
        black_box(s.template.write_frame(frame, black_box(&s.payload)));
    }
    s
}

#[library_benchmark]
#[bench::multicast(setup = state, teardown = teardown)]
fn payload_copy_only_x1000(mut s: State) -> State {
    for i in 0..N {
        let at = (i % FRAMES) * FRAME + mcrelay_wire::egress::HEADER_LEN;
        s.umem[at..at + PAYLOAD].copy_from_slice(black_box(&s.payload));
        black_box(&s.umem[at]);
    }
    s
}

#[library_benchmark]
#[bench::multicast(setup = state, teardown = teardown)]
fn ingress_frame_parse_x1000(s: State) -> State {
    for _ in 0..N {
        let d = mcrelay_wire::parse(black_box(&s.frame), &s.flow, false);
        black_box(d.map(|d| d.payload.len()).ok());
    }
    s
}

library_benchmark_group!(
    name = xdp;
    benchmarks = egress_frame_build_x1000, payload_copy_only_x1000, ingress_frame_parse_x1000
);

main!(library_benchmark_groups = xdp);
