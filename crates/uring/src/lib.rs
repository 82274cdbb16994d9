//! The io_uring driver: where every packet meets the kernel. One [`worker`]
//! per core owns an io_uring, a pool set ([`mcrelay_pool`]), receive buffers
//! and the sockets of its flows. A datagram arrives by multishot receive, is
//! copied once into a pool buffer of the smallest fitting class, and is sent
//! to every output of its flow through the same io_uring; the last send's
//! completion gives the buffer back. Counters
//! ([`mcrelay_relay::counters`]) are written by the worker alone and read by
//! anyone without locks.
//!
//! Every relay rule — admission, pool class choice, bounded queues, GSO
//! runs and their fallback, completion accounting, pause and resume,
//! redundancy — is in the sans-I/O relay crate ([`mcrelay_relay`]: no
//! io_uring, fds, libc or socket crate; tested without sockets). This crate
//! is its io_uring driver: it turns completions into the core's events and
//! the core's send requests into SQEs.
//!
//! A flow's datagrams come from a UDP socket or, with `ingress = "packet"`,
//! as frames from an AF_PACKET socket ([`ingress`]) read through its
//! packet ring (`TPACKET_V2` frame slots, or `TPACKET_V3` blocks for
//! jumbo-capable inputs) and parsed by [`mcrelay_wire`] — the same copy
//! and sends follow.
//!
//! Every ingress hands what it read to the core in one call,
//! `Core::ingest` ([`mcrelay_relay::intake`]): the payload (or why the
//! frame parser rejected it), the flow's receiver it came in on and the
//! driver's clock reading (once per completion batch; the core has no
//! clock). The core counts a reject, feeds an FEC receiver's decoder, shows
//! a media datagram to its leg's stream health ([`mcrelay_relay::health`];
//! read, never changed) and admits it.
//!
//! `unsafe` lives in the modules that hand memory to the kernel:
//! `receive_buffers` (receive buffer memory shared with the kernel),
//! `packet_ring` (the mmap'd packet ring), `submit` (the SQE push, an
//! `unsafe fn`) and the driver modules calling it (`worker::driver`,
//! `worker::receive`). [`sockets`] and [`affinity`] hold none: they
//! re-export and wrap `mcrelay-sys`. Sockets arrive open: the privileged
//! helper opens them (`mcrelay_sockets::open_flow`).
#![deny(unsafe_code)]

pub mod affinity;
mod egress;
pub mod ingress;
mod packet_ring;
mod receive_buffers;
pub mod sockets;
mod submit;
pub mod worker;

pub use receive_buffers::RECEIVE_BUFFER_BYTES;

/// Internals the benchmarks drive directly (the packet path without the
/// kernel). Not a stable API; only with the `test-support` feature, never
/// in the product build.
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub mod bench_support {
    pub use crate::submit::UserData;
    pub use mcrelay_relay::{FlowId, InFlight, OutputId};
}
pub use ingress::IngressSocket;
pub use worker::{
    Command, Event, FecOutput, FecSocket, FlowSockets, OutputSocket, ReceiveMode, RistEnd,
    RistSocket, WorkerConfig, WorkerError, WorkerHandle, WorkerStats, spawn,
};
