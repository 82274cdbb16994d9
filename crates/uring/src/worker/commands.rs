//! The commands of a reload, applied by the worker between loop turns:
//! flows added, removed (after their last send completes), replaced (the
//! new flow taking the old one's redundancy state over) and the standby
//! switch; the events it reports back.

use super::driver::Worker;
use super::flow::Flow;
use super::{Command, Event, FlowSockets};
use mcrelay_relay::{FlowId, Handover, LegId};

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
                Command::AddFlow(f) => self.add_flow(*f, |_, _| {}),
                Command::RemoveFlow(name) => self.remove_flow(name),
                Command::Replace { flow, kept } => self.replace_flow(*flow, kept),
                Command::SetStandby(standby) => self.set_standby(standby),
            }
        }
    }

    /// Add flow `f`; `placed` runs once it has its number, before its
    /// receives are armed.
    fn add_flow(&mut self, f: FlowSockets, placed: impl FnOnce(&mut Self, FlowId)) {
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
                placed(self, id);
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

    /// The running (not going) flow called `name`.
    fn running(&self, name: &str) -> Option<FlowId> {
        self.ids().find(|&f| {
            !self.core.is_removing(f)
                && self.flows[f.index()]
                    .as_ref()
                    .is_some_and(|fl| fl.name == name)
        })
    }

    /// [`Command::Replace`], in one loop turn: (a) the old flow's receives
    /// are cancelled (what they still complete is dropped by the core),
    /// (b) the new flow is placed and takes the old one's redundancy
    /// state over, (c) its receives are armed; the old flow goes once its
    /// sends have completed. Refused, the old flow goes all the same (as
    /// a remove and an add would have it).
    fn replace_flow(&mut self, f: FlowSockets, kept: u8) {
        let Some(old) = self.running(&f.name) else {
            let flow = f.name.clone();
            self.add_flow(f, |_, _| {});
            return self.report(Event::FlowUnknown {
                worker: self.index,
                flow,
            });
        };
        self.cancel_receives(old);
        // A one-leg flow keeps no sequence state in the core: its leg's
        // stream health saw the last number it forwarded.
        let last_rtp = self.flows[old.index()]
            .as_ref()
            .and_then(|fl| fl.legs.first())
            .and_then(|leg| leg.health.rtp_highest());
        let handover = Handover { kept, last_rtp };
        self.add_flow(f, |w, new| {
            w.core.take_over(old, new, handover, w.now_ns);
        });
        self.core.remove_flow(old);
        // Room reserved when the flow was placed.
        self.removing.push(old);
    }

    fn remove_flow(&mut self, name: String) {
        match self.running(&name) {
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

    /// Flip warm standby ([`mcrelay_relay::standby`]): the flows' sockets
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
