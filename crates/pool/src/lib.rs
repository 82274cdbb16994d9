//! Core-local, size-classed packet buffer pools: every datagram's payload is
//! copied into one of these buffers between ingress receive and the last
//! egress completion.
