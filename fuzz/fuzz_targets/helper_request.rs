//! The privileged helper's request decoder (`mcrelay_sockets::fuzz_request`,
//! run over crates/helper/tests/corpus in the normal tests): refuse, never
//! panic.
#![cfg_attr(feature = "libfuzzer", no_main)]
mcrelay_fuzz::fuzz_target!(mcrelay_sockets::fuzz_request);
