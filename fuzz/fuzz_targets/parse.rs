//! Feeds arbitrary bytes to the configuration parser. `fuzz_parse` panics
//! if the parser's contract is broken (an `Err` with no errors, or an error
//! without a position), and any other panic is a bug too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mcrelay_config::fuzz_parse(data);
});
