//! Core-local, size-classed packet buffer pools — the memory every datagram
//! lives in between ingress and egress. A worker receives a datagram, takes a
//! buffer of the smallest fitting class (small 1500 B, standard 4096 B,
//! jumbo 9000 B) from its own [`PoolSet`], copies the payload in (the data
//! plane's one copy), holds it as a [`SharedBuffer`] across the egress sends
//! of every output, and gives it back when the last send completes.
//!
//! All memory is allocated and touched when the pool set is built; take and
//! give are O(1) with no allocation, lock or atomic read-modify-write. A
//! [`Buffer`] is a move-only handle tagged with its pool and class, so it
//! can't be used after it's given back, given back twice, or given to the
//! wrong class or core. Exhaustion returns `None` and is counted; the
//! counters ([`PoolStatsHandle`]) are readable from any thread.
//!
//! `unsafe` lives only in the `storage` module.

mod class;
mod metrics;
mod pool;
mod storage;

pub use class::{Class, MAX_PAYLOAD};
pub use metrics::{ClassStats, PoolSnapshot, PoolStatsHandle};
pub use pool::{MAX_BUFFERS_PER_CLASS, PoolConfig, PoolError, PoolSet, Released, SharedBuffer};
pub use storage::Buffer;
