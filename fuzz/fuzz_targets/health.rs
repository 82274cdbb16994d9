//! Arbitrary bytes, split into datagrams, fed to the stream-health trackers
//! of every payload mode (`mcrelay_wire::fuzz_health`): they must count,
//! never panic.
#![cfg_attr(feature = "libfuzzer", no_main)]
mcrelay_fuzz::fuzz_target!(mcrelay_wire::fuzz_health);
