//! Outputs that could not be connected when their flow opened (no route to
//! the destination yet, or the source address missing, e.g. an IPv6
//! address gone with a link flap). The flow starts anyway with every
//! output: the worker sends on the bad one's socket, which fails fast
//! (`EDESTADDRREQ`, counted as a send error) without touching the others.
//! The supervisor keeps a duplicate of that socket and retries binding and
//! connecting it ([`mcrelay_helper::sockets::connect_egress`], which needs
//! no privilege) every second and on every interface change; once connected
//! the worker's next send on it succeeds. Logged once when it fails, once
//! when it recovers; every failed attempt is counted.

use std::io;
use std::net::UdpSocket;

use mcrelay_config::{Flow, Output};
use mcrelay_helper::sockets::connect_egress;

/// An output still to connect: a duplicate of the socket its worker uses.
#[derive(Debug)]
pub struct Unconnected {
    /// Its index in the flow's outputs.
    pub index: usize,
    socket: UdpSocket,
    output: Output,
}

/// What readers see of one output's connection.
#[derive(Debug, Clone, Default)]
pub struct OutputState {
    /// Why it is not connected, while it isn't.
    pub not_connected: Option<String>,
    /// Failed attempts to open or connect it.
    pub connect_failures: u64,
    /// Why the last attempt failed, kept once it connects: the sends made
    /// meanwhile failed with `EDESTADDRREQ` because of it, and that send
    /// error is reported as this cause (one cause, one errno: issue 27).
    pub last_cause: Option<String>,
}

impl OutputState {
    /// Record a failed attempt; whether it is news (to log).
    pub fn failed(&mut self, e: &io::Error) -> bool {
        self.connect_failures = self.connect_failures.saturating_add(1);
        let why = e.to_string();
        let news = self.not_connected.as_deref() != Some(why.as_str());
        self.last_cause = Some(why.clone());
        self.not_connected = Some(why);
        news
    }

    /// Record that it is connected; whether it was not (to log).
    pub fn connected(&mut self) -> bool {
        self.not_connected.take().is_some()
    }
}

/// The outputs of `flow` that came back not connected (`unconnected`:
/// index and errno), each with a duplicate of its socket in `sockets`.
pub fn pending(
    flow: &Flow,
    sockets: &[UdpSocket],
    unconnected: &[(usize, i32)],
) -> Result<Vec<(Unconnected, io::Error)>, PendingError> {
    unconnected
        .iter()
        .map(|&(index, errno)| {
            let flow_name = || flow.name.clone();
            let socket = sockets.get(index).ok_or_else(|| PendingError::NoSocket {
                flow: flow_name(),
                index,
            })?;
            let output = flow
                .outputs
                .get(index)
                .ok_or_else(|| PendingError::NotInConfig {
                    flow: flow_name(),
                    index,
                })?;
            let socket = socket
                .try_clone()
                .map_err(|source| PendingError::Duplicate {
                    flow: flow_name(),
                    index,
                    source,
                })?;
            Ok((
                Unconnected {
                    index,
                    socket,
                    output: output.clone(),
                },
                io::Error::from_raw_os_error(errno),
            ))
        })
        .collect()
}

/// Why the not-yet-connected outputs of a flow could not be set aside.
#[derive(Debug, thiserror::Error)]
pub enum PendingError {
    #[error("flow {flow:?}: no output {index}")]
    NoSocket { flow: String, index: usize },
    #[error("flow {flow:?}: no output {index} in the config")]
    NotInConfig { flow: String, index: usize },
    #[error("flow {flow:?}: duplicating output {index}'s socket")]
    Duplicate {
        flow: String,
        index: usize,
        #[source]
        source: io::Error,
    },
}

/// Try to connect each of `pending`; those that connect leave the list.
/// The result of each attempt, by output index.
/// The local address of each that connected goes into `connected` (the
/// flow's loop guard names it).
pub fn retry(
    pending: &mut Vec<Unconnected>,
    connected: &mut Vec<std::net::SocketAddr>,
) -> Vec<(usize, io::Result<()>)> {
    let mut results = Vec::with_capacity(pending.len());
    pending.retain(|u| {
        let result = connect_egress(&u.socket, &u.output);
        let done = result.is_ok();
        if done {
            connected.extend(crate::loopguard::own_endpoints(std::iter::once(&u.socket)));
        }
        results.push((u.index, result));
        !done
    });
    results
}
