//! The packet path: one pinned worker per core with its own io_uring ring,
//! pools, sockets and counters.
