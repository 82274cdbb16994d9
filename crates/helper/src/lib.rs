//! The privileged helper of mcrelay, and the daemon's side of talking to it.
//!
//! Where it sits: this is the only privileged process of mcrelay, and it never
//! touches a packet. The daemon starts its parent, the zygote
//! ([`zygote::Zygote`]), before dropping to the service user with no
//! capabilities ([`drop_to_user`], [`drop_all_capabilities`]); the zygote
//! keeps only the network capabilities ([`keep_only_capabilities`]) and
//! forks a helper now and whenever one dies. Whenever the daemon starts a flow
//! it asks the helper over a `SOCK_SEQPACKET` Unix socket ([`HelperClient`]).
//! The helper ([`serve`]) opens, configures, binds and joins the sockets that
//! flow needs ([`sockets`]) and passes them back with `SCM_RIGHTS`
//! ([`fdpass`]). It checks every request against the configuration it loaded
//! itself from the root-owned file it was started with ([`Policy`]) — a
//! request names a flow, never an interface, group or port, and `Reload`
//! re-reads that same file — so a compromised daemon can obtain exactly the
//! sockets the configuration defines and nothing else: no raw sockets but
//! the filtered packet socket of an `ingress = "packet"` flow ([`packet`]),
//! no privileged ports, no other groups. Its code stays small on purpose: a
//! text protocol of three requests ([`protocol`]), no threads in the
//! helper or the zygote, no async
//! runtime, six dependencies (one of them the pure frame and BPF crate).
#![deny(unsafe_code)]

pub mod client;
pub mod fdpass;
pub mod opened;
pub mod packet;
pub mod policy;
pub mod privileges;
pub mod protocol;
pub mod server;
pub mod sockets;
pub mod zygote;

pub use client::{HelperClient, HelperError};
pub use opened::{OpenedFlow, OpenedLeg};
pub use policy::{Policy, Refusal};
pub use privileges::{
    HELPER_CAPABILITIES, ProcStatus, User, drop_all_capabilities, drop_to_user,
    keep_only_capabilities, lookup_user, spawn_helper, status_of,
};
pub use protocol::{Reply, Request, fuzz_request};
pub use server::{HELPER_FD, ServeError, run_helper, sanitize_process, serve};
pub use sockets::{EGRESS_SEND_BUFFER_BYTES, Ingress, interface_index, open_egress, open_ingress};
pub use zygote::{Zygote, ZygoteError, hung_up, run_zygote, watch_hangup};
