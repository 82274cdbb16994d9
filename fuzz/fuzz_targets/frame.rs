//! Feeds arbitrary bytes to the AF_PACKET frame parser
//! (`mcrelay_wire::fuzz_frame`): it must reject or return a payload inside
//! the frame, never panic. The same entry point runs on stable over
//! crates/wire/tests/corpus and proptest inputs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mcrelay_wire::fuzz_frame(data);
});
