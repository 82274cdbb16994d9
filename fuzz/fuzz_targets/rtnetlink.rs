//! rtnetlink link messages as the daemon reads them from its
//! `NETLINK_ROUTE` socket (`mcrelay_wire::fuzz_rtnetlink`): never panic,
//! always advance, stop at a bad length.
#![cfg_attr(feature = "libfuzzer", no_main)]
mcrelay_fuzz::fuzz_target!(mcrelay_wire::fuzz_rtnetlink);
