//! The pure configuration layer: TOML schema, validation and the flow table
//! that the data plane and the helper consume. No sockets, no clock.

pub mod model;

pub use model::*;
