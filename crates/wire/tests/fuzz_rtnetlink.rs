//! The rtnetlink fuzz entry point run without a fuzzer: over
//! `tests/rtnetlink-corpus/` (a link dump and link notifications captured
//! from a network namespace, plus what the fuzzer found) and over random
//! bytes. The same files seed fuzz/corpus/rtnetlink. The route and
//! neighbour answers' walk (`fuzz_neighbour`) runs over the same bytes.

use std::fs;
use std::path::Path;

use mcrelay_wire::rtnetlink::{Message, messages};
use mcrelay_wire::{fuzz_neighbour, fuzz_rtnetlink};
use proptest::prelude::*;

#[test]
fn corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rtnetlink-corpus");
    let (mut files, mut links) = (0, 0);
    for entry in fs::read_dir(&dir).expect("tests/rtnetlink-corpus") {
        let bytes = fs::read(entry.expect("entry").path()).expect("read");
        fuzz_rtnetlink(&bytes);
        fuzz_neighbour(&bytes);
        files += 1;
        links += messages(&bytes)
            .filter(|m| matches!(m, Ok(Message::Link(_))))
            .count();
    }
    assert!(files >= 5, "corpus has {files} datagrams");
    assert!(links >= 5, "corpus has {links} link messages");
}

proptest! {
    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        fuzz_rtnetlink(&data);
        fuzz_neighbour(&data);
    }
}
