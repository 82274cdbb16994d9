//! Feeds arbitrary bytes, in arbitrary chunks, through the control socket's
//! line framing and request parser (`mcrelay_control::fuzz_request`): any
//! panic is a bug. The same entry point runs on stable over
//! crates/control/tests/corpus and proptest inputs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mcrelay_control::fuzz_request(data);
});
