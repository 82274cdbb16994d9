//! The configuration parser (`mcrelay_config::fuzz_parse`, run over
//! crates/config/tests/corpus in the normal tests): it panics if the
//! parser's contract is broken (an `Err` with no errors, or an error
//! without a position), and any other panic is a bug too.
#![cfg_attr(feature = "libfuzzer", no_main)]
mcrelay_fuzz::fuzz_target!(mcrelay_config::fuzz_parse);
