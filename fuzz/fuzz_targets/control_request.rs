//! The control socket's line framing and request parser
//! (`mcrelay_control::fuzz_request`, run over crates/control/tests/corpus
//! in the normal tests): any panic is a bug.
#![cfg_attr(feature = "libfuzzer", no_main)]
mcrelay_fuzz::fuzz_target!(mcrelay_control::fuzz_request);
