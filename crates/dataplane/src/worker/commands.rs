//! The commands of a reload, applied by the worker between loop turns:
//! flows added, removed (after their last send completes) and the standby
//! switch; the events it reports back.

use super::driver::Worker;
use super::flow::Flow;
use super::{Command, Event, FlowSockets};
use crate::core::{FlowId, LegId};

impl Worker {
    /// Give a flow a number in the core and here; its name back when
    /// `limit` flows exist already.
    pub(super) fn place(&mut self, f: FlowSockets, limit: usize) -> Result<FlowId, String> {
        let (flow, specs, counters, redundancy) = Flow::new(f, self.gso_enabled);
        let legs = u8::try_from(flow.legs.len()).unwrap_or(u8::MAX);
        let Some(id) = self.core.add_flow(specs, counters, legs, redundancy, limit) else {
            return Err(flow.name);
        };
        if self.flows.len() <= id.index() {
            self.flows.resize_with(id.index() + 1, || None);
        }
        self.flows[id.index()] = Some(flow);
        let room = self.flows.len() * usize::from(LegId::MAX_LEGS);
        self.health_unpublished
            .reserve(room.saturating_sub(self.health_unpublished.len()));
        self.attention.reserve(self.flows.len());
        self.removing
            .reserve(self.flows.len().saturating_sub(self.removing.len()));
        Ok(id)
    }

    /// Apply the commands the control plane queued (a reload).
    pub(super) fn take_commands(&mut self) {
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::AddFlow(f) => self.add_flow(*f),
                Command::RemoveFlow(name) => self.remove_flow(name),
                Command::SetStandby(standby) => self.set_standby(standby),
            }
        }
    }

    fn add_flow(&mut self, f: FlowSockets) {
        let worker = self.index;
        if f.outputs.len() > usize::from(u16::MAX) {
            return self.report(Event::FlowRefused {
                worker,
                flow: f.name,
                reason: format!("more than {} outputs", u16::MAX),
            });
        }
        // Single receives name their buffer by flow number and leg.
        let limit = if self.multishot {
            FlowId::LIMIT - 1
        } else {
            self.receive_buffers.len() / usize::from(LegId::MAX_LEGS)
        };
        let outputs = f.outputs.len();
        let legs = f.legs.len();
        if legs == 0 || legs > usize::from(LegId::MAX_LEGS) {
            return self.report(Event::FlowRefused {
                worker,
                flow: f.name,
                reason: format!("{legs} inputs; a flow has 1 to {}", LegId::MAX_LEGS),
            });
        }
        match self.place(f, limit) {
            Ok(id) => {
                self.arm_receives(id);
                self.notice_if_needed(id);
                let name = self.flows[id.index()]
                    .as_ref()
                    .map(|f| f.name.clone())
                    .unwrap_or_default();
                tracing::info!(worker, flow = %name, legs, outputs, "flow added");
                self.report(Event::FlowAdded { worker, flow: name });
            }
            Err(name) => self.report(Event::FlowRefused {
                worker,
                flow: name,
                reason: format!("worker {worker} already has {limit} flows"),
            }),
        }
    }

    fn remove_flow(&mut self, name: String) {
        let found = self.ids().find(|&f| {
            !self.core.is_removing(f)
                && self.flows[f.index()]
                    .as_ref()
                    .is_some_and(|fl| fl.name == name)
        });
        match found {
            Some(f) => {
                self.core.remove_flow(f);
                self.cancel_receives(f);
                // Room reserved when the flow was placed.
                self.removing.push(f);
            }
            None => self.report(Event::FlowUnknown {
                worker: self.index,
                flow: name,
            }),
        }
    }

    /// Drop the flows whose remove has finished: nothing of theirs is left
    /// in the kernel, so their sockets can close.
    pub(super) fn finish_removals(&mut self) {
        let mut i = 0;
        while let Some(&f) = self.removing.get(i) {
            let done = self.flows[f.index()]
                .as_ref()
                .is_some_and(|fl| fl.legs.iter().all(|l| !l.armed))
                && self.core.is_removing(f)
                && self.core.is_quiet(f);
            if !done {
                i += 1;
                continue;
            }
            self.removing.swap_remove(i);
            if let Some(flow) = self.flows[f.index()].take() {
                self.core.forget(f);
                tracing::info!(worker = self.index, flow = %flow.name, "flow removed");
                self.report(Event::FlowRemoved {
                    worker: self.index,
                    flow: flow.name,
                });
            }
        }
    }

    /// Flip warm standby ([`crate::core::standby`]): the flows' sockets
    /// and receives stay as they are.
    fn set_standby(&mut self, standby: bool) {
        if self.core.is_standby() != standby {
            self.core.set_standby(standby);
            tracing::info!(
                worker = self.index,
                mode = if standby { "standby" } else { "active" },
                "mode changed"
            );
        }
        self.report(Event::ModeSet {
            worker: self.index,
            standby,
        });
    }

    fn report(&self, event: Event) {
        // The control plane may have stopped listening; the worker goes on.
        let _ = self.events.send(event);
    }
}
