//! The core's vocabulary with the driver: what it is given about an
//! output, what it asks to send, what a completion names, and what became
//! of a received datagram.

use std::sync::Arc;

use super::ids::{FlowId, OutputId, Slot};
use crate::counters::OutputCounters;

/// Linux errno values the core's rules look at (the core has no libc; the
/// driver's tests check these against it).
pub mod errno {
    pub const EIO: i32 = 5;
    pub const EINVAL: i32 = 22;
    pub const EMSGSIZE: i32 = 90;
    pub const ENOPROTOOPT: i32 = 92;
    pub const EOPNOTSUPP: i32 = 95;
}

/// Errors of a GSO send that mean "not like this" rather than "not now":
/// the datagrams are resent one by one.
pub fn refuses_gso(errno: i32) -> bool {
    use errno::*;
    matches!(errno, EINVAL | EMSGSIZE | EIO | EOPNOTSUPP | ENOPROTOOPT)
}

/// One output as the core sees it.
#[derive(Debug)]
pub struct OutputSpec {
    /// Datagrams in flight (queued or in the kernel) before more are
    /// dropped as backlog.
    pub depth: u32,
    /// Its socket takes `UDP_SEGMENT` and GSO is on.
    pub gso: bool,
    pub counters: Arc<OutputCounters>,
}

/// A send for the driver to hand to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendRequest<'a> {
    pub flow: FlowId,
    pub output: OutputId,
    pub kind: SendKind<'a>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendKind<'a> {
    /// One datagram: the buffer in in-flight `slot`.
    Plain { slot: Slot },
    /// A UDP GSO send of `slots` (every datagram `segment_size` bytes but
    /// a shorter last one); its completion names `record`.
    Gso {
        record: u32,
        segment_size: u16,
        slots: &'a [Slot],
    },
}

/// What a completion names: the token the driver encodes in `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendToken {
    Plain {
        slot: Slot,
        flow: FlowId,
        output: OutputId,
    },
    Gso {
        record: u32,
        flow: FlowId,
        output: OutputId,
    },
}

impl SendRequest<'_> {
    /// The token its completion will carry.
    pub fn token(&self) -> SendToken {
        let (flow, output) = (self.flow, self.output);
        match self.kind {
            SendKind::Plain { slot } => SendToken::Plain { slot, flow, output },
            SendKind::Gso { record, .. } => SendToken::Gso {
                record,
                flow,
                output,
            },
        }
    }
}

/// What became of a received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Copied and queued on every output with room (or, merging with a
    /// delay, held until its turn).
    Queued,
    /// Dropped and counted (oversize, pool exhausted, unknown flow, or by
    /// the flow's redundancy rule: duplicate, late, standby leg, ...).
    Dropped,
    /// Discarded because the worker is in standby (counted as
    /// `standby_discarded`, not as a drop).
    Standby,
    /// Every output was full: dropped, counted per output, and the flow is
    /// paused; `newly` when this datagram paused it (the driver stops its
    /// receive then).
    Full { newly: bool },
}
