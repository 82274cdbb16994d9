//! RIST in the core: a RIST output's sender ([`crate::rist::RistSender`])
//! keeps a copy of what its output sent and queues retransmissions on
//! it; a RIST leg's receiver ([`crate::rist::RistReceiver`]) stands
//! between the leg and admission, handing on an in-order stream. The
//! RTCP itself (port + 1) is the driver's: it hands received RTCP in
//! ([`Core::rist_output_rtcp`], [`Core::rist_input_rtcp`]) and sends what
//! [`Core::rist_tick`] writes.

use mcrelay_pool::Buffer;

use crate::admission::Taken;
use crate::rist::{self, RistReceiver, RistSender, Verdict};
use crate::{Core, FlowId, LegId, OutputId, Parts, Received, Slot};

/// How often sender and receiver reports go out.
pub const REPORT_INTERVAL_NS: u64 = 100_000_000;

/// Where [`Core::rist_tick`]'s RTCP goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtcpTo {
    /// The receivers of output `output` of `flow` (its port + 1).
    Output(FlowId, OutputId),
    /// The sender feeding leg `leg` of `flow`.
    Leg(FlowId, LegId),
}

#[derive(Debug, Default)]
pub(crate) struct RistState {
    /// Senders and receivers in all flows.
    count: usize,
    next_report_ns: u64,
    /// A held datagram copied out of its receiver before admission.
    scratch: Vec<u8>,
    /// RTCP written by a tick.
    rtcp: Vec<u8>,
}

impl Core {
    /// Make output `media` of `flow` a RIST output keeping `buffer_ms`
    /// of what it sends. Allocates the ring (see
    /// [`rist::slots_for`]); `false` for an unknown output.
    pub fn enable_rist_output(&mut self, flow: FlowId, media: OutputId, buffer_ms: u32) -> bool {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return false;
        };
        let Some(o) = f.outputs.get_mut(media.index()) else {
            return false;
        };
        if o.rist.is_none() {
            self.rist.count += 1;
        }
        o.rist = Some(Box::new(RistSender::new(buffer_ms)));
        f.refresh_plain();
        self.rist.rtcp.reserve(1500);
        true
    }

    /// Make leg `leg` of `flow` a RIST input: gaps are NACKed (the
    /// driver sends what [`Core::rist_tick`] writes) and waited for up to
    /// `buffer_ms`, the flow gets the stream in order. `false` for an
    /// unknown leg.
    pub fn enable_rist_input(&mut self, flow: FlowId, leg: LegId, buffer_ms: u32) -> bool {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return false;
        };
        if leg.0 >= f.legs {
            return false;
        }
        if f.rist.is_empty() {
            f.rist.resize_with(usize::from(f.legs), || None);
        }
        let ssrc = 0x6d63_0000 | (u32::from(flow.get()) << 2) | u32::from(leg.0);
        if f.rist[leg.index()].is_none() {
            self.rist.count += 1;
        }
        let mut r = RistReceiver::new(buffer_ms, ssrc);
        r.set_standby(self.standby);
        f.rist[leg.index()] = Some(Box::new(r));
        f.refresh_plain();
        self.rist.scratch.reserve(rist::MAX_DATAGRAM);
        self.rist.rtcp.reserve(1500);
        true
    }

    /// Whether any flow of this core has a RIST input or output (the
    /// driver then ticks [`Core::rist_tick`] often).
    pub fn has_rist(&self) -> bool {
        self.rist.count > 0
    }

    /// RTCP from the receivers of RIST output `media` of `flow`: its
    /// NACKs are answered with retransmissions queued on the output.
    pub fn rist_output_rtcp(&mut self, flow: FlowId, media: OutputId, now_ns: u64, rtcp: &[u8]) {
        // A standby worker sends nothing (`crate::standby`): no
        // retransmissions either.
        if self.standby {
            return;
        }
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return;
        };
        let m = media.index();
        let Some(s) = f.outputs.get_mut(m).and_then(|o| o.rist.as_mut()) else {
            return;
        };
        s.receive_rtcp(now_ns, rtcp);
        let mut parts = Parts {
            pool: &mut self.pool,
            in_flight: &mut self.in_flight,
            reserve: &mut self.reserve,
            dirty: &mut self.dirty,
        };
        loop {
            let outputs = &mut f.outputs;
            let Some(data) = outputs[m]
                .rist
                .as_mut()
                .and_then(|s| s.next_retransmission())
            else {
                break;
            };
            let mut b: Buffer = match parts.reserve.take(parts.pool, &mut f.held, data.len()) {
                Taken::Fitting(b) | Taken::Fallback(b) => b,
                Taken::Exhausted => {
                    outputs[m].counters.drop_backlog.inc();
                    continue;
                }
            };
            let _ = parts.pool.fill(&mut b, data);
            parts.queue_one(flow, outputs, &mut f.held, m, b);
        }
        publish_outputs(f);
    }

    /// RTCP from the sender feeding RIST leg `leg` of `flow` (its sender
    /// reports: the receiver's reports then carry LSR and DLSR).
    pub fn rist_input_rtcp(&mut self, flow: FlowId, leg: LegId, now_ns: u64, rtcp: &[u8]) {
        if let Some(r) = self
            .flows
            .get_mut(flow.index())
            .and_then(Option::as_mut)
            .and_then(|f| f.rist.get_mut(leg.index()))
            .and_then(Option::as_mut)
        {
            r.receive_rtcp(now_ns, rtcp);
        }
    }

    /// A datagram on a RIST leg: in order, it goes on now; behind a gap,
    /// its receiver holds it; then whatever the receiver can hand on in
    /// order is admitted. Called by [`Core::receive_on`] for a leg with a
    /// receiver.
    #[cold]
    pub(crate) fn receive_rist(
        &mut self,
        flow: FlowId,
        leg: LegId,
        payload: &[u8],
        now_ns: u64,
    ) -> Received {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return Received::Dropped;
        };
        let Some(r) = f.rist.get_mut(leg.index()).and_then(Option::as_mut) else {
            return self.admit_on(flow, leg, payload, now_ns, true);
        };
        // While the outputs are full, what could go on waits in the ring
        // (released in order as they drain) rather than meeting them full,
        // and the flow pauses its receives as for `Received::Full` (the
        // socket buffer holds what comes meanwhile; `Core::resume`).
        let room = has_room(&f.outputs);
        let mut verdict = if room {
            r.receive(now_ns, payload)
        } else {
            r.receive_holding(now_ns, payload)
        };
        if verdict == Verdict::Flush {
            self.rist_release(flow, leg, now_ns);
            let Some(r) = self.receiver(flow, leg) else {
                return Received::Dropped;
            };
            verdict = r.receive(now_ns, payload);
        }
        let result = match verdict {
            Verdict::Deliver => self.admit_on(flow, leg, payload, now_ns, true),
            other => {
                // Arrived on the wire: counted in, then held or dropped.
                if let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) {
                    f.counters.packets_in.inc();
                    f.counters.bytes_in.add(payload.len() as u64);
                    if other != Verdict::Held {
                        f.counters.rist.dropped.inc();
                    } else if !room {
                        let newly = !f.paused;
                        f.paused = true;
                        return Received::Full { newly };
                    }
                }
                Received::Dropped
            }
        };
        // In order with nothing held (the common case): nothing to release
        // (the counters are published by the next `rist_tick`).
        if self.receiver(flow, leg).is_none_or(|r| r.window() == 0) {
            return result;
        }
        let released = self.rist_release(flow, leg, now_ns);
        if released == (Received::Full { newly: true }) {
            return released;
        }
        result
    }

    fn receiver(&mut self, flow: FlowId, leg: LegId) -> Option<&mut RistReceiver> {
        self.flows
            .get_mut(flow.index())
            .and_then(Option::as_mut)?
            .rist
            .get_mut(leg.index())?
            .as_deref_mut()
    }

    /// Admit what leg `leg`'s receiver can hand on in order now (held
    /// datagrams, gaps past `buffer_ms` skipped), as already counted in.
    fn rist_release(&mut self, flow: FlowId, leg: LegId, now_ns: u64) -> Received {
        let mut scratch = std::mem::take(&mut self.rist.scratch);
        let mut result = Received::Queued;
        while let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) {
            // Released only into queues with room, in flight and in this
            // batch's queue (the rest waits for the next turn, after the
            // sends were handed over), unless the ring is half full: then
            // admission drops and counts what finds no room.
            let room = has_room(&f.outputs);
            let Some(r) = f.rist.get_mut(leg.index()).and_then(Option::as_deref_mut) else {
                break;
            };
            if !room && r.window() < r.capacity() / 2 {
                break;
            }
            let Some(d) = r.pop_ready(now_ns) else {
                break;
            };
            // Sized by `enable_rist_input` to a slot: no allocation.
            scratch.clear();
            scratch.extend_from_slice(d);
            let got = self.admit_on(flow, leg, &scratch, now_ns, false);
            if got == Received::Queued {
                self.observe_output(flow, leg, &scratch, now_ns);
            }
            if got == (Received::Full { newly: true }) {
                result = got;
            }
        }
        self.rist.scratch = scratch;
        if let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) {
            publish_inputs(f);
        }
        result
    }

    /// The RIST loop turn at `now_ns` (`unix_ns`: the wall clock, for
    /// sender reports): senders take the time, held datagrams whose gap
    /// expired go on, due NACKs and (every [`REPORT_INTERVAL_NS`]) sender
    /// and receiver reports are written and handed to `send` with where
    /// they go. Returns a flow a released datagram paused (its outputs
    /// all full: the driver stops its receives as for
    /// [`Received::Full`]).
    pub fn rist_tick(
        &mut self,
        now_ns: u64,
        unix_ns: u64,
        mut send: impl FnMut(RtcpTo, &[u8]),
    ) -> Option<FlowId> {
        if self.rist.count == 0 {
            return None;
        }
        // A standby worker writes no RTCP (`crate::standby`): its legs
        // keep ordering what arrives and NACK what is still missing once
        // it takes over.
        let quiet = self.standby;
        let reports = now_ns >= self.rist.next_report_ns;
        if reports {
            self.rist.next_report_ns = now_ns + REPORT_INTERVAL_NS;
        }
        let ntp = rist::rtcp::ntp_from_unix_ns(unix_ns);
        let mut rtcp = std::mem::take(&mut self.rist.rtcp);
        rtcp.resize(1500, 0);
        let mut paused = None;
        for index in 0..self.flows.len() {
            let Some(flow) = FlowId::new(index) else {
                continue;
            };
            let Some(f) = self.flows[index].as_mut() else {
                continue;
            };
            for (i, o) in f.outputs.iter_mut().enumerate() {
                let Some(s) = o.rist.as_mut() else { continue };
                s.tick(now_ns);
                // The first report as soon as there is a stream: it tells
                // the receivers where to send their NACKs.
                if !quiet && (reports || !s.has_reported()) {
                    let n = s.sender_report(now_ns, ntp, &mut rtcp);
                    if n > 0 {
                        let id = OutputId(u16::try_from(i).unwrap_or(u16::MAX));
                        send(RtcpTo::Output(flow, id), &rtcp[..n]);
                    }
                }
            }
            for leg in 0..f.rist.len() {
                let Some(r) = self.flows[index]
                    .as_mut()
                    .and_then(|f| f.rist.get_mut(leg))
                    .and_then(Option::as_mut)
                else {
                    continue;
                };
                let id = LegId(u8::try_from(leg).unwrap_or(u8::MAX));
                if !quiet {
                    let n = r.poll(now_ns, &mut rtcp);
                    if n > 0 {
                        send(RtcpTo::Leg(flow, id), &rtcp[..n]);
                    } else if reports {
                        let n = r.receiver_report(now_ns, &mut rtcp);
                        if n > 0 {
                            send(RtcpTo::Leg(flow, id), &rtcp[..n]);
                        }
                    }
                }
                if self.rist_release(flow, id, now_ns) == (Received::Full { newly: true }) {
                    paused = Some(flow);
                }
            }
        }
        self.rist.rtcp = rtcp;
        paused
    }
}

impl Parts<'_> {
    /// A datagram in `slot` went to RIST outputs (the bit set `keep`):
    /// their senders keep a copy.
    #[cold]
    pub(crate) fn keep_for_rist(
        &mut self,
        outputs: &mut [crate::Output],
        slot: Slot,
        mut keep: u64,
    ) {
        let Some(buf) = self.in_flight.buffer(slot) else {
            return;
        };
        let bytes = self.pool.bytes(buf);
        while keep != 0 {
            let i = keep.trailing_zeros() as usize;
            keep &= keep - 1;
            if let Some(s) = outputs.get_mut(i).and_then(|o| o.rist.as_mut()) {
                s.record_now(bytes);
            }
        }
    }
}

/// Whether every output (parity outputs aside) has room for one more
/// datagram, in flight and in this batch's queue.
fn has_room(outputs: &[crate::Output]) -> bool {
    outputs.iter().all(|o| {
        o.parity || (o.in_flight < o.depth && o.queue.len() < crate::queue::QUEUE_CAPACITY)
    })
}

/// Copy a flow's RIST receivers' numbers into its counters: each leg's
/// own ([`crate::counters::FlowCounters::leg_rist`]) and the flow's
/// ([`crate::counters::RistCounters`]). NACKs and recoveries add up over
/// the legs; what the flow lost after RIST does not: on merged legs a
/// number one leg never recovered but another delivered is not lost, so
/// a merged flow's `unrecovered` is what no leg delivered (the merge's
/// `lost`), a failover flow's what its active leg skipped.
fn publish_inputs(f: &crate::Flow) {
    let (mut nacks, mut recovered, mut rtt) = (0, 0, 0);
    let c = &f.counters.rist;
    for (leg, r) in f.rist.iter().enumerate() {
        let Some(r) = r else { continue };
        let s = r.stats();
        let leg_rtt = r.rtt_ns().unwrap_or(0) / 1000;
        nacks += s.nacks_sent;
        recovered += s.recovered;
        rtt = rtt.max(leg_rtt);
        let Some(l) = f.counters.leg_rist.get(leg) else {
            continue;
        };
        // The leg's skips since the last call (its receiver only counts up).
        let new = s.unrecovered.saturating_sub(l.unrecovered.get());
        let counts_for_flow = match &f.mode {
            crate::redundancy::Mode::Single | crate::redundancy::Mode::Replaced => true,
            crate::redundancy::Mode::Failover(fo) => fo.active().index() == leg,
            crate::redundancy::Mode::Merge(_) => false,
        };
        if counts_for_flow {
            c.unrecovered.add(new);
        }
        l.nacks_sent.set(s.nacks_sent);
        l.recovered.set(s.recovered);
        l.unrecovered.set(s.unrecovered);
        l.rtt_us.set(leg_rtt);
    }
    if let crate::redundancy::Mode::Merge(_) = &f.mode {
        c.unrecovered.set(f.counters.redundancy.lost.get());
    }
    c.nacks_sent.set(nacks);
    c.recovered.set(recovered);
    c.input_rtt_us.set(rtt);
}

/// Copy a flow's RIST senders' numbers into its counters.
fn publish_outputs(f: &crate::Flow) {
    let (mut nacked, mut resent, mut gone, mut rtt) = (0, 0, 0, 0);
    for s in f.outputs.iter().filter_map(|o| o.rist.as_ref()) {
        let st = s.stats();
        nacked += st.nacked;
        resent += st.retransmitted;
        gone += st.unrecoverable;
        rtt = rtt.max(s.rtt_ns().unwrap_or(0) / 1000);
    }
    let c = &f.counters.rist;
    c.nacks_received.set(nacked);
    c.retransmitted.set(resent);
    c.unrecoverable.set(gone);
    c.output_rtt_us.set(rtt);
}
