//! Test and benchmark tooling for mcrelay, **not** on mcrelay's packet
//! path: the library half of the `loadgen` binary (paced sender, validating
//! receiver and the baseline recvmmsg/sendmmsg relay mcrelay is measured
//! against), shared so integration tests in other crates and `mcrelayd demo`
//! can build and check the same datagrams:
//!
//! * [`payload`]: the datagram format (header with run id, stream, sequence
//!   number and length, then a sequence-dependent byte pattern) and its
//!   byte-by-byte checker;
//! * [`framing`]: the payload as it is, after an RTP header, or in
//!   MPEG-TS packets after an RTP header (the stream-health benchmarks);
//! * [`tracker`]: receiver-side accounting per stream (duplicates,
//!   reordering, gaps, loss) and of short / corrupt / foreign datagrams;
//! * [`many`]: many groups at once (the scale experiment's round-robin
//!   sender over N groups and the receiver that joins them all);
//! * [`pacer`]: the sender's token bucket on the monotonic clock;
//! * [`legs`]: one RTP stream played onto several legs with planted,
//!   disjoint losses and delays (the SMPTE 2022-7 tests), and what a
//!   receiver saw of it;
//! * [`latency`]: one-way delay: the sender's `CLOCK_MONOTONIC` stamp in
//!   the payload, the receiver's histogram and percentiles;
//! * [`sock`]: the libc glue (sendmmsg / recvmmsg batches, joins, TTL
//!   control messages), the only module with `unsafe`.
#![deny(unsafe_code)]

pub mod framing;
pub mod latency;
pub mod legs;
pub mod many;
pub mod pacer;
pub mod payload;
pub mod sock;
pub mod tracker;
