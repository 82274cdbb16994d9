//! SRT outputs and inputs: where a flow leaves the building encrypted, to
//! many callers, or comes in over SRT. Beside the packet path, not on it: the worker sends an SRT
//! output's datagrams into a bounded socket pair like to any output; the
//! SRT thread ([`service`]) reads them and hands each to every caller's
//! libsrt send buffer. SRT inputs are the same the other way: the SRT
//! thread writes what an input's peer sends into a pair whose other end
//! is the leg's socket the worker receives on. libsrt (the reference
//! implementation, OpenSSL for AES) is reached through one module,
//! [`ffi`], the only `unsafe` here.
#![deny(unsafe_code)]

pub mod ffi;
pub mod late;
pub mod service;

pub use service::{CallerView, OutputSpec, RouteView, SrtService, feed_pair, input_pair};
