//! Feeds arbitrary bytes to the privileged helper's request decoder
//! (`mcrelay_helper::fuzz_request`): it must refuse, never panic. The same
//! entry point runs on stable over crates/helper/tests/corpus and proptest
//! inputs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mcrelay_helper::fuzz_request(data);
});
