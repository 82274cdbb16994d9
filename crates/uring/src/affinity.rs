//! CPU affinity: which CPUs the process may use, and pinning a worker
//! thread to one of them (`mcrelay-sys`, through nix).

pub use mcrelay_sys::cpu::{allowed_cpus, pin_current_thread};
