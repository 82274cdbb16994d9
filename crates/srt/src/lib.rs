//! SRT outputs: where a flow leaves the building encrypted, to many
//! callers. Beside the packet path, not on it: the worker sends an SRT
//! output's datagrams into a bounded socket pair like to any output; the
//! SRT thread ([`service`]) reads them and hands each to every caller's
//! libsrt send buffer. libsrt (the reference implementation, OpenSSL for
//! AES) is reached through one module, [`ffi`], the only `unsafe` here.
#![deny(unsafe_code)]

pub mod ffi;
pub mod service;

pub use service::{CallerView, OutputSpec, RouteView, SrtService, feed_pair, input_pair};
