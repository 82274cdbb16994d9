//! AF_PACKET frames and TPACKET_V3 ring blocks (`mcrelay_wire::fuzz_frame`,
//! run over crates/wire/tests/corpus in the normal tests): reject or return
//! a payload inside the frame, never panic.
#![cfg_attr(feature = "libfuzzer", no_main)]
mcrelay_fuzz::fuzz_target!(mcrelay_wire::fuzz_frame);
