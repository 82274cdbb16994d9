//! The fuzz entry point run without a fuzzer (stable Rust has no
//! cargo-fuzz): over the committed corpus in `tests/corpus/` (frames
//! captured in the namespace tests plus hand-built edge cases), and over
//! proptest-generated frames — random bytes, and valid frames with a byte
//! changed or cut short.

use std::fs;
use std::path::Path;

use mcrelay_wire::testframes::{ipv4_udp, ipv6_udp, vlan};
use mcrelay_wire::{FlowMatch, fuzz_frame, parse};
use proptest::prelude::*;

#[test]
fn corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut n = 0;
    for entry in fs::read_dir(&dir).expect("tests/corpus") {
        let bytes = fs::read(entry.expect("entry").path()).expect("read");
        fuzz_frame(&bytes);
        n += 1;
    }
    assert!(n >= 5, "corpus has {n} frames");
}

fn v4() -> FlowMatch {
    FlowMatch {
        destination: "239.1.1.1".parse().unwrap(),
        port: 5000,
        source: None,
    }
}

fn valid_frame(payload: &[u8], kind: u8) -> Vec<u8> {
    match kind % 4 {
        0 => ipv4_udp("10.0.0.1", "239.1.1.1", 5000, payload),
        1 => vlan(
            &ipv4_udp("10.0.0.1", "239.1.1.1", 5000, payload),
            &[(0x8100, 5)],
        ),
        2 => ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[], payload),
        _ => ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[(0, 8), (60, 8)], payload),
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        fuzz_frame(&data);
    }

    #[test]
    fn valid_frames_yield_their_payload(payload in proptest::collection::vec(any::<u8>(), 0..1600), kind in 0u8..4) {
        let frame = valid_frame(&payload, kind);
        let flow = if kind % 4 < 2 { v4() } else {
            FlowMatch { destination: "ff3e::1:1".parse().unwrap(), ..v4() }
        };
        let d = parse(&frame, &flow, true).expect("valid frame");
        prop_assert_eq!(&frame[d.payload], &payload[..]);
    }

    #[test]
    fn damaged_frames_never_panic(
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        kind in 0u8..4,
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut frame = valid_frame(&payload, kind);
        let i = at.index(frame.len());
        frame[i] = byte;
        fuzz_frame(&frame);
        let keep = cut.index(frame.len());
        fuzz_frame(&frame[..keep]);
    }
}
