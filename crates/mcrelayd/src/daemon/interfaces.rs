//! Flows and their interfaces: a flow whose interface goes down is
//! paused, and started again once every interface it needs is back.

use std::time::Instant;

use mcrelay_config::FlowKey;

use super::report::log_output;
use super::{Daemon, Flow, FlowState, RETRY_FIRST, RETRY_MAX, lock};
use crate::links::{self, Blocked, LinkTable};

/// Why `flow` can't run with the interfaces in `links`; `None` if it can,
/// or if interfaces are not watched. `running`: whether it runs now.
///
/// Every output's interface must be up. Of the legs (inputs), one up is
/// enough: a flow with several legs keeps running on the others while
/// one leg's interface is down or gone (its sockets stay open and the
/// leg receives again when the interface is back), and it starts while
/// one is down, as long as every leg's interface exists (its sockets
/// can't be opened otherwise).
pub(super) fn blocked(links: Option<&LinkTable>, flow: &Flow, running: bool) -> Option<FlowState> {
    let links = links?;
    let state = |b: Blocked| match b {
        Blocked::Down(interface) => FlowState::InterfaceDown { interface },
        Blocked::Missing(interface) => FlowState::WaitingForInterface { interface },
    };
    let outputs = flow.udp_outputs().map(|o| o.interface.as_str());
    if let Some(b) = links::blocked(links, outputs) {
        return Some(state(b));
    }
    // An SRT leg names no interface: never blocked here (its connection
    // comes and goes on its own).
    let legs: Vec<Option<Blocked>> = flow
        .inputs
        .iter()
        .map(|i| match i.srt {
            Some(_) => None,
            None => links::blocked(links, [i.interface.as_str()]),
        })
        .collect();
    if legs.iter().all(Option::is_some) {
        return legs.into_iter().flatten().next().map(state);
    }
    if !running {
        return legs
            .into_iter()
            .flatten()
            .find(|b| matches!(b, Blocked::Missing(_)))
            .map(state);
    }
    None
}

impl Daemon {
    /// Netlink reported a change of the interfaces: pause the flows that
    /// lost one, resume those whose interfaces are all back.
    /// A running flow with a leg on an interface that was deleted and
    /// created again (a new index) is replaced to rejoin that leg's group
    /// ([`super::rejoin`]).
    pub fn links_changed(&mut self, table: LinkTable) {
        let recreated = self.rejoin.note(&table);
        self.links = Some(table);
        self.reconcile();
        self.rejoin_legs(&recreated);
    }

    /// Bring every flow in line with its interfaces: a running flow with
    /// an interface down or missing is paused (counted, logged once); a
    /// stopped flow whose interfaces are all up is started (a failed start
    /// is retried with a growing delay). Other flows are not touched.
    pub fn reconcile(&mut self) {
        self.retry_outputs();
        // By position: nothing here adds or removes a flow.
        for i in 0..self.flows.len() {
            let Some(m) = self.flows.at(i) else { break };
            let key = m.key();
            match (m.running, blocked(self.links.as_ref(), &m.flow, m.running)) {
                (true, None) => {}
                (true, Some(state)) => self.pause(key, state),
                (false, Some(state)) => {
                    let name = m.flow.name.clone();
                    if let Some(m) = self.flows.get_mut(key) {
                        m.retry = None;
                    }
                    if self.set_flow_state(key, state.clone()) {
                        tracing::warn!(flow = %name, "{state}");
                    }
                }
                (false, None) => {
                    if m.retry.is_some_and(|(at, _)| Instant::now() < at) {
                        continue;
                    }
                    self.resume(key);
                }
            }
        }
        self.refresh_state();
    }

    /// Try again to connect the outputs of running flows that aren't.
    pub(super) fn retry_outputs(&mut self) {
        for i in 0..self.flows.len() {
            let Some(key) = self
                .flows
                .at(i)
                .filter(|m| !m.unconnected.is_empty())
                .map(|m| m.key())
            else {
                continue;
            };
            let Some(m) = self.flows.get_mut(key) else {
                continue;
            };
            let mut connected = Vec::new();
            let results = crate::outputs::retry(&mut m.unconnected, &mut connected);
            let mut shared = lock(&self.shared);
            let Some((m, e)) = self.flows.both_mut(&mut shared.flows, key) else {
                continue;
            };
            if !connected.is_empty() {
                // Its loop guard now names the late outputs too.
                e.own.extend(connected);
                if let Some(ingress) = &e.ingress {
                    for fd in ingress.fds() {
                        crate::loopguard::arm_socket(&m.flow.name, fd, &e.own);
                    }
                }
            }
            for (index, result) in results {
                log_output(e, index, result);
            }
        }
    }

    /// Set flow `key`'s published state; whether it changed.
    pub(super) fn set_flow_state(&self, key: FlowKey, state: FlowState) -> bool {
        let mut shared = lock(&self.shared);
        match self.flows.entry_mut(&mut shared.flows, key) {
            Some(e) if e.state != state => {
                e.state = state;
                true
            }
            _ => false,
        }
    }

    /// Take running flow `key` off its worker because of `state`.
    pub(super) fn pause(&mut self, key: FlowKey, state: FlowState) {
        let Some(m) = self.flows.get(key) else { return };
        let name = m.flow.name.clone();
        if let Err(e) = self.remove_shards(&name, &m.workers) {
            tracing::error!(flow = %name, "pausing: {}", crate::chain::Chain(&e));
        }
        let mut shared = lock(&self.shared);
        if let Some((m, e)) = self.flows.both_mut(&mut shared.flows, key) {
            m.running = false;
            m.retry = None;
            m.unconnected.clear();
            e.close_ingress();
            e.interface_pauses += 1;
            e.state = state.clone();
        }
        tracing::warn!(flow = %name, "{state}; the flow resumes when the interface is up");
    }

    /// Start stopped flow `key`; on failure, publish why (logged when the
    /// reason changes) and schedule a retry.
    pub(super) fn resume(&mut self, key: FlowKey) {
        let Some(m) = self.flows.get(key) else { return };
        let name = m.flow.name.clone();
        match self.start_on_worker(key) {
            Ok(before) => {
                if let Some(m) = self.flows.get_mut(key) {
                    m.retry = None;
                }
                if before.is_running() {
                    tracing::info!(flow = %name, "started");
                } else {
                    tracing::info!(flow = %name, "relaying again (was {before})");
                }
            }
            Err(e) => {
                let delay = if let Some(m) = self.flows.get_mut(key) {
                    let delay = m.retry.map_or(RETRY_FIRST, |(_, d)| (d * 2).min(RETRY_MAX));
                    m.retry = Some((Instant::now() + delay, delay));
                    delay
                } else {
                    RETRY_FIRST
                };
                let state = FlowState::OpenFailed {
                    error: crate::chain::Chain(&e).to_string(),
                };
                if self.set_flow_state(key, state) {
                    tracing::error!(
                        flow = %name,
                        "not started: {}; retrying in {delay:?}, then less often",
                        crate::chain::Chain(&e)
                    );
                }
            }
        }
    }
}
