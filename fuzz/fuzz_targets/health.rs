//! Feeds arbitrary bytes, split into datagrams, to the stream-health
//! trackers of every payload mode (`mcrelay_wire::fuzz_health`): they
//! must count, never panic. The same entry point runs on stable over
//! crates/wire/tests/health_corpus and proptest inputs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mcrelay_wire::fuzz_health(data);
});
