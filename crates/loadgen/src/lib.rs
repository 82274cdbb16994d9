//! Test and benchmark tooling, not on mcrelay's packet path: the payload
//! format every test datagram carries (run id, stream, sequence number and a
//! sequence-dependent byte pattern), the receiver-side [`tracker::Tracker`]
//! that checks every byte and counts loss, duplicates and reordering, and
//! the socket glue ([`net`]) of the `loadgen` binary's paced sender,
//! validating receiver and baseline recvmmsg/sendmmsg relay.
#![deny(unsafe_code)]

pub mod net;
pub mod payload;
pub mod tracker;
