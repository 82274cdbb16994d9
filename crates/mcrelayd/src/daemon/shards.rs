//! A flow's shards. A flow with `spread = N` runs as N shards on N
//! distinct workers (see [`super::placement`]); shard `k` has its own
//! ingress socket on every leg (its own membership: the kernel delivers a
//! copy of each datagram to every socket bound to the group and joined) and
//! the outputs `k`, `k + N`, ... ([`mcrelay_config::Flow::shard_of`]). Each
//! output has exactly one shard, so its datagrams leave in order, and no
//! buffer crosses cores. All shards have the flow's name: each worker
//! knows its shard by it, and readers see one flow.
//!
//! Every shard is opened like the whole flow (the helper opens flows by
//! name); the output sockets a shard does not serve are closed at once.

use std::sync::Arc;

use mcrelay_config::Flow;
use mcrelay_relay::counters::{FlowCounters, FlowStats};
use mcrelay_uring::FlowSockets;
use mcrelay_uring::sockets::KernelDrops;

use crate::outputs::Unconnected;
use crate::sockets::{OpenError, Opener};

/// A flow's sockets, one set per shard, with its readers' counters.
pub(super) struct Opened {
    /// Shard `k`'s sockets, for the flow's `k`th worker.
    pub(super) shards: Vec<FlowSockets>,
    /// Outputs not connected yet, over every shard.
    pub(super) pending: Vec<(Unconnected, std::io::Error)>,
    /// The kernel's drops at every shard's ingress sockets: shard 0's legs
    /// first, so its leg `i` is leg `i`.
    pub(super) ingress: KernelDrops,
    /// The local addresses of the flow's connected outputs, which its
    /// ingress sockets' loop guard names ([`crate::loopguard`]).
    pub(super) own: Vec<std::net::SocketAddr>,
}

/// Why a flow's shards could not be opened.
#[derive(Debug, thiserror::Error)]
pub(super) enum OpenShardsError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("duplicating the ingress socket for its drop counter")]
    Ingress(#[source] std::io::Error),
}

/// Open `flow`'s shards. Shard 0's input counts into `stats.input` (what
/// readers show as the flow's input), shard `k > 0`'s into `more[k - 1]`;
/// each output into its own counters in `stats`.
pub(super) fn open(
    opener: &mut Opener,
    flow: &Flow,
    stats: &FlowStats,
    more: &[Arc<FlowCounters>],
) -> Result<Opened, OpenShardsError> {
    let n = flow.spread.max(1);
    let mut shards = Vec::with_capacity(n);
    let mut all_pending = Vec::new();
    let mut fds = Vec::new();
    for k in 0..n {
        let (mut opened, pending) = opener.open(flow)?;
        opened.counters = match k.checked_sub(1) {
            None => Arc::clone(&stats.input),
            Some(j) => more.get(j).map_or_else(Arc::default, Arc::clone),
        };
        let outputs = std::mem::take(&mut opened.outputs);
        opened.outputs = outputs
            .into_iter()
            .zip(&stats.outputs)
            .enumerate()
            .filter(|&(i, _)| flow.shard_of(i) == k)
            .map(|(_, (mut o, (_, c)))| {
                o.counters = Arc::clone(c);
                o
            })
            .collect();
        all_pending.extend(
            pending
                .into_iter()
                .filter(|(u, _)| flow.shard_of(u.index) == k),
        );
        for leg in &opened.legs {
            fds.push(leg.try_clone_fd().map_err(OpenShardsError::Ingress)?);
        }
        shards.push(opened);
    }
    crate::loopguard::arm(&flow.name, &shards);
    let own = crate::loopguard::own_endpoints(
        shards
            .iter()
            .flat_map(|s| s.outputs.iter().map(|o| &o.socket)),
    );
    Ok(Opened {
        shards,
        pending: all_pending,
        ingress: KernelDrops::legs(fds),
        own,
    })
}

impl From<OpenShardsError> for super::StartError {
    fn from(e: OpenShardsError) -> Self {
        match e {
            OpenShardsError::Open(e) => Self::Open(e),
            OpenShardsError::Ingress(e) => Self::Ingress(e),
        }
    }
}

impl From<OpenShardsError> for super::error::FlowCommandError {
    fn from(e: OpenShardsError) -> Self {
        match e {
            OpenShardsError::Open(e) => Self::Open(e),
            OpenShardsError::Ingress(e) => Self::Ingress(e),
        }
    }
}
