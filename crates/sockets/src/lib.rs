//! A flow's sockets: where they are opened and how they reach the daemon.
//!
//! Where it sits: before a flow starts, never on the packet path. The one
//! [`open_flow`] opens a flow's ingress sockets ([`udp`], or an AF_PACKET
//! socket for `ingress = "packet"`, [`packet`]; an XDP program and an
//! AF_XDP socket for `ingress = "xdp"`, [`xdp`]) and its output sockets,
//! exactly as the configuration defines them. Two callers, one code path:
//! the privileged helper program (crate `mcrelay-helper`, binary
//! `mcrelay-helper`) for the flows its own configuration allows, and the
//! daemon itself when it runs without privileges.
//!
//! The rest is the daemon's side of the privilege split, shared with the
//! helper program: the text protocol of three requests ([`protocol`]),
//! passing fds with `SCM_RIGHTS` ([`fdpass`]), the daemon's bounded-wait
//! client ([`HelperClient`]) and starting and watching the zygote and its
//! helpers ([`spawn`]). The privileged server itself is not here: it lives
//! in the helper program, which the daemon never links.
#![deny(unsafe_code)]

pub mod client;
pub mod fdpass;
pub mod flow;
pub mod opened;
pub mod packet;
pub mod protocol;
pub mod spawn;
pub mod udp;
pub mod xdp;

pub use client::{HelperClient, HelperError};
pub use flow::{OpenFlowError, open_flow};
pub use opened::{OpenedFlow, OpenedLeg};
pub use protocol::{Reply, Request, fuzz_request};
pub use spawn::{HELPER_FD, Zygote, ZygoteError, hung_up, spawn_helper, watch_hangup};
pub use udp::{EGRESS_SEND_BUFFER_BYTES, Ingress, interface_index, open_egress, open_ingress};
