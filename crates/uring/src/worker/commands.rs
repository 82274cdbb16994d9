//! The commands of a reload, applied by the worker between loop turns:
//! flows added, removed (after their last send completes), replaced (the
//! new flow taking the old one's redundancy state over) and the standby
//! switch; the events it reports back.

use super::driver::Worker;
use super::flow::Flow;
use super::{Command, Event, FlowSockets};
use mcrelay_relay::{FlowId, Handover, LegId, Received};

/// Datagrams read per leg from a removed flow's socket ([`Worker::drain`]):
/// far more than a loop turn's lag, far less than a full receive buffer.
const DRAIN_MAX: usize = 1024;
/// Room for the largest datagram the pool takes, and a byte to spot a
/// larger one (dropped as oversize).
const DRAIN_BUFFER: usize = mcrelay_pool::MAX_PAYLOAD + 1;

impl Worker {
    /// Give a flow a number in the core and here; its name back when
    /// `limit` flows exist already.
    pub(super) fn place(&mut self, f: FlowSockets, limit: usize) -> Result<FlowId, String> {
        let (flow, c) = Flow::new(f, self.gso_enabled);
        let legs = flow.media_legs;
        let xsk_depth: usize = flow
            .xsk_outputs
            .iter()
            .zip(c.outputs.iter())
            .filter(|(x, _)| x.is_some())
            .map(|(_, o)| o.depth as usize)
            .sum();
        let Some(id) = self
            .core
            .add_flow(c.outputs, c.counters, legs, c.redundancy, limit)
        else {
            return Err(flow.name);
        };
        // Checked by `add_flow`'s caller: every FEC socket names a leg,
        // and they fit.
        if !self.core.set_intake(id, c.health, &c.fec) {
            tracing::warn!(flow = %flow.name, "FEC sockets refused: the flow receives no FEC");
        }
        for &(media, column, row, layout) in &flow.fec_outputs {
            if !self.core.enable_fec_output(id, media, column, row, layout) {
                tracing::warn!(flow = %flow.name, output = media.0, "FEC matrix refused: the output sends no FEC");
            }
        }
        for r in &flow.rist {
            let enabled = match r.end {
                super::RistEnd::Leg(leg) => self.core.enable_rist_input(id, leg, r.buffer_ms),
                super::RistEnd::Output(o) => self.core.enable_rist_output(
                    id,
                    mcrelay_relay::OutputId(u16::try_from(o).unwrap_or(u16::MAX)),
                    r.buffer_ms,
                ),
            };
            if !enabled {
                tracing::warn!(flow = %flow.name, end = ?r.end, "RIST refused: no such input or output");
            }
        }
        if self.flows.len() <= id.index() {
            self.flows.resize_with(id.index() + 1, || None);
        }
        // Room for every xdp output's completions of one flush (at most
        // its queue depth in flight): reserved now, never grown per packet.
        let xsk = flow.xsk_outputs.iter().filter(|x| x.is_some()).count();
        if xsk > 0 {
            self.xsk_outputs += xsk;
            self.xsk_done_room += xsk_depth;
            self.xsk_done
                .reserve(self.xsk_done_room.saturating_sub(self.xsk_done.len()));
        }
        if flow.busy_poll {
            self.busy_flows += 1;
            if self.busy_flows == 1 {
                tracing::info!(worker = self.index, flow = %flow.name, "latency = \"low\": busy polling, this worker's core stays busy");
            }
        }
        self.flows[id.index()] = Some(flow);
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
            self.receive_buffers.len() / usize::from(LegId::MAX_RECEIVERS)
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
        if f.fec.iter().any(|s| s.leg.index() >= legs)
            || legs + f.fec.len() > usize::from(LegId::MAX_RECEIVERS)
        {
            return self.report(Event::FlowRefused {
                worker,
                flow: f.name,
                reason: "FEC sockets naming no input, or too many".into(),
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
        let last_rtp = self.core.leg_rtp_highest(old, LegId(0));
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
    /// in the kernel, so their sockets can close. Once a removed flow's
    /// receives have ended, what its sockets still hold is read and
    /// relayed first ([`Worker::drain`]).
    pub(super) fn finish_removals(&mut self) {
        let mut i = 0;
        while let Some(&f) = self.removing.get(i) {
            let disarmed = self.flows[f.index()]
                .as_ref()
                .is_some_and(|fl| fl.legs.iter().all(|l| !l.armed));
            if disarmed
                && self.core.is_removing(f)
                && self.last_rtp(f).is_some()
                && let Some(fl) = self.flows[f.index()].as_mut()
                && !fl.drained
            {
                fl.drained = true;
                self.drain(f);
                i += 1;
                continue;
            }
            let done = disarmed && self.core.is_removing(f) && self.core.is_quiet(f);
            if !done {
                i += 1;
                continue;
            }
            self.removing.swap_remove(i);
            // Every receive has completed: what the flow relayed is final,
            // and so is the last number it saw.
            let last_rtp = self.last_rtp(f);
            if let Some(flow) = self.flows[f.index()].take() {
                let xsk = flow.xsk_outputs.iter().filter(|x| x.is_some()).count();
                self.xsk_outputs = self.xsk_outputs.saturating_sub(xsk);
                if flow.busy_poll {
                    self.busy_flows = self.busy_flows.saturating_sub(1);
                }
                self.core.forget(f);
                tracing::info!(worker = self.index, flow = %flow.name, "flow removed");
                self.report(Event::FlowRemoved {
                    worker: self.index,
                    flow: flow.name,
                    last_rtp,
                });
            }
        }
    }

    /// The highest RTP number (and SSRC) flow `f` relayed: its merge's or
    /// failover's, else its first leg's stream health's.
    fn last_rtp(&self, f: FlowId) -> Option<(u16, u32)> {
        self.core
            .last_sent(f)
            .or_else(|| self.core.leg_rtp_highest(f, LegId(0)))
    }

    /// Read and relay what a removed RTP flow's sockets still hold now that
    /// its receives have ended: datagrams that arrived before its
    /// successor's sockets joined (a reload moving it to another worker)
    /// are in no other socket, and dropping them with the socket would
    /// lose them. Its successor resumes after the last RTP number this
    /// flow saw, these included ([`Event::FlowRemoved`]), so what both
    /// hold leaves once. A flow with no RTP number is not drained: its
    /// successor has no mark to skip by, and reading on would only repeat
    /// more of what the successor sends anyway. Non-blocking
    /// reads, at most [`DRAIN_MAX`] per leg, once per removal: the
    /// control plane's cost, not the packet path's. Packet-ring legs keep
    /// what their ring holds (not read here).
    fn drain(&mut self, f: FlowId) {
        let mut buf = vec![0u8; DRAIN_BUFFER];
        let legs = self.flows[f.index()].as_ref().map_or(0, |fl| fl.legs.len());
        for (l, leg_id) in (0..legs).zip((0..=u8::MAX).map(LegId)) {
            // No more than every output has room for: completions aren't
            // reaped here, and a datagram that found the outputs full
            // would be lost (its successor skips it). What is left in the
            // socket is the newest, which the successor's sockets hold.
            let room = usize::try_from(self.core.room(f)).unwrap_or(0);
            for n in 0..DRAIN_MAX.min(room) {
                let Some(leg) = self.flows[f.index()]
                    .as_mut()
                    .and_then(|fl| fl.legs.get_mut(l))
                    .filter(|leg| leg.packet.is_none())
                else {
                    break;
                };
                let Ok(len) = nix::sys::socket::recv(
                    leg.fd,
                    &mut buf,
                    nix::sys::socket::MsgFlags::MSG_DONTWAIT,
                ) else {
                    break;
                };
                let bytes = buf.get(..len).unwrap_or(&buf);
                if matches!(
                    self.core.ingest(f, leg_id, Ok(bytes), self.now_ns),
                    Received::Full { .. }
                ) {
                    break;
                }
                if n % 32 == 31 {
                    self.flush_sends();
                }
            }
        }
        self.flush_sends();
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
