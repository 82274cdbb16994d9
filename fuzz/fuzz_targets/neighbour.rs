//! rtnetlink route and neighbour answers and neighbour notifications as
//! the daemon reads them for a unicast `egress = "xdp"` output
//! (`mcrelay_wire::fuzz_neighbour`): never panic, always advance, stop at
//! a bad length.
#![cfg_attr(feature = "libfuzzer", no_main)]
mcrelay_fuzz::fuzz_target!(mcrelay_wire::fuzz_neighbour);
