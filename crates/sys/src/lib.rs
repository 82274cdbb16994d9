//! The Linux syscall glue that more than one mcrelay crate needs, in one
//! place: socket options and multicast joins (`sockopt`), interface lookup
//! (`net`), CPU affinity (`cpu`), network namespaces (`ns`), process
//! controls (`prctl`) and credentials and capabilities (`privileges`). It sits beside the packet path, not on it: the
//! privileged helper opens and joins sockets with it, the data plane probes
//! GSO and reads kernel drop counters with it, the daemon and the load
//! generator pin threads and enter namespaces with it.
//!
//! Calls go through [`nix`] where nix has them; the few that nix cannot
//! express (socket options it has no type for, getsockopt replies whose
//! length varies by kernel) are raw `libc` calls in [`sockopt`], each
//! `unsafe` block with its invariant. Errors keep the OS error: a nix
//! [`nix::errno::Errno`] becomes the same `io::Error` as
//! `io::Error::last_os_error()` would have been.
#![deny(unsafe_code)]

pub mod cpu;
pub mod journal;
pub mod net;
pub mod ns;
pub mod prctl;
pub mod privileges;
pub mod sockopt;
pub mod xdp;
