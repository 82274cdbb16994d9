//! The privileged helper of mcrelay: the `mcrelay-helper` program.
//!
//! Where it sits: this is the only privileged process of mcrelay, and it
//! never touches a packet. The daemon starts it once, before dropping to
//! the service user with no capabilities, as the zygote ([`run_zygote`]):
//! a sanitized process (inherited fds closed, environment cleared,
//! [`sanitize_process`]) that keeps only the network capabilities and forks
//! a helper now and whenever one dies or stops answering. Whenever the
//! daemon starts a flow it asks the helper over a `SOCK_SEQPACKET` Unix
//! socket; the helper ([`serve`]) opens the sockets that flow needs
//! (`mcrelay_sockets::open_flow`, the same call the unprivileged daemon
//! makes) and passes them back with `SCM_RIGHTS`. It checks every request
//! against the configuration it loaded itself from the root-owned file it
//! was started with ([`Policy`]) — a request names a flow, never an
//! interface, group or port, and `Reload` re-reads that same file — so a
//! compromised daemon can obtain exactly the sockets the configuration
//! defines and nothing else: no raw sockets but the filtered packet socket
//! of an `ingress = "packet"` flow, no privileged ports, no other groups.
//!
//! Its code stays small on purpose: a text protocol of three requests
//! (`mcrelay_sockets::protocol`), no threads in the helper or the zygote,
//! no async runtime, no argument-parsing or logging framework (two options,
//! [`log`]); the daemon (io_uring, the control socket, the metrics
//! endpoint, the load generator) is not linked in.
#![deny(unsafe_code)]

pub mod log;
pub mod policy;
pub mod server;
pub mod zygote;

pub use policy::{Policy, Refusal};
pub use server::{ServeError, run_helper, sanitize_process, serve};
pub use zygote::run_zygote;
