//! Admission: a datagram in on a flow's leg, its redundancy rule, and
//! the loop turn that serves what the rules have due.

use mcrelay_pool::MAX_PAYLOAD;

use super::fec::MediaVerdict;
use super::redundancy::Mode;
use super::redundancy::failover::Pass;
use super::redundancy::merge::Verdict;
use super::redundancy::rewrite::{self, Mapped};
use super::{Core, Flow, FlowId, LegId, Parts, Received};

impl Core {
    /// [`Core::receive_on`] for a flow's first leg at time 0 (a
    /// `Single` flow reads no clock).
    #[inline]
    pub fn receive(&mut self, flow: FlowId, payload: &[u8]) -> Received {
        self.receive_on(flow, LegId(0), payload, 0)
    }

    /// Admission, the packet path: count, apply the flow's redundancy rule
    /// (which may drop the datagram, counted, before it takes a buffer),
    /// classify, take a pool buffer, copy `payload` into it once, and
    /// queue it on every output of `flow` that has room (or, merging with
    /// a delay, hold it until its turn). `leg` is the input it came from,
    /// `now_ns` the driver's clock.
    ///
    /// On a leg with 2022-1 FEC ([`Core::enable_fec`]) the decoder keeps
    /// a copy first, and a packet it has already repaired is dropped
    /// (counted as `fec.duplicates`).
    #[inline]
    pub fn receive_on(
        &mut self,
        flow: FlowId,
        leg: LegId,
        payload: &[u8],
        now_ns: u64,
    ) -> Received {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return Received::Dropped;
        };
        let mut parts = Parts {
            pool: &mut self.pool,
            in_flight: &mut self.in_flight,
            reserve: &mut self.reserve,
            dirty: &mut self.dirty,
        };
        // The one-leg relay nearly every flow is: admission and queueing
        // as before redundancy, resume guards, FEC and RIST existed
        // (nothing of theirs asked per datagram or per output).
        if f.plain {
            if let Err(dropped) = f.count_in(leg, payload.len(), self.standby, true) {
                return dropped;
            }
            let (buf, uses) = match parts.admit_as::<true>(
                &f.outputs,
                &f.counters,
                &mut f.held,
                &mut f.paused,
                payload,
            ) {
                Ok(admitted) => admitted,
                Err(dropped) => return dropped,
            };
            if let Some(c) = f.counters.redundancy.forwarded.get(leg.index()) {
                c.inc();
            }
            parts.enqueue_as::<true>(flow, &mut f.outputs, &mut f.held, buf, uses);
            return Received::Queued;
        }
        if !f.fec.is_empty() {
            return self.receive_fec_media(flow, leg, payload, now_ns);
        }
        if !f.rist.is_empty() {
            return self.receive_rist(flow, leg, payload, now_ns);
        }
        self.admit_on(flow, leg, payload, now_ns, true)
    }

    /// [`Core::receive_on`] for a flow with FEC on some leg: on such a
    /// leg the decoder keeps a copy first and drops (counted) a packet it
    /// already repaired; then the packet goes on, followed by any packet
    /// the waiting FEC packets it completes repair.
    #[inline(never)]
    fn receive_fec_media(
        &mut self,
        flow: FlowId,
        leg: LegId,
        payload: &[u8],
        now_ns: u64,
    ) -> Received {
        let Core {
            flows,
            fec_scratch: scratch,
            fec_ends: ends,
            ..
        } = self;
        let Some(f) = flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return Received::Dropped;
        };
        // `ends` is empty between datagrams: nothing to set up unless a
        // repair comes.
        let duplicate = f.fec_duplicate(leg, payload, |p| {
            if ends.is_empty() {
                scratch.clear();
            }
            // Sized for every repair one packet can chain
            // (`Core::enable_fec`): no allocation.
            if scratch.capacity() - scratch.len() >= p.len() && ends.len() < ends.capacity() {
                scratch.extend_from_slice(p);
                ends.push(scratch.len());
            }
        });
        let mut result = if duplicate {
            Received::Dropped
        } else if !f.rist.is_empty() {
            self.receive_rist(flow, leg, payload, now_ns)
        } else {
            self.admit_on(flow, leg, payload, now_ns, true)
        };
        if self.fec_ends.is_empty() {
            return result;
        }
        self.sum_fec_stats(flow);
        let scratch = std::mem::take(&mut self.fec_scratch);
        let mut ends = std::mem::take(&mut self.fec_ends);
        result = self.admit_repaired(flow, leg, &scratch, &ends, now_ns, result);
        ends.clear();
        self.fec_scratch = scratch;
        self.fec_ends = ends;
        result
    }

    /// Admit on `leg` what FEC repaired (`scratch`, cut at `ends`), each
    /// one queued also shown to the output's health (delivered, not
    /// lost); `result`, or `Full { newly: true }` when a repair found the
    /// outputs full.
    fn admit_repaired(
        &mut self,
        flow: FlowId,
        leg: LegId,
        scratch: &[u8],
        ends: &[usize],
        now_ns: u64,
        mut result: Received,
    ) -> Received {
        let mut start = 0;
        for &end in ends {
            let repaired = &scratch[start..end];
            let r = self.admit_on(flow, leg, repaired, now_ns, false);
            if r == Received::Queued {
                self.observe_output(flow, leg, repaired, now_ns);
            }
            if r == (Received::Full { newly: true }) {
                result = r;
            }
            start = end;
        }
        result
    }

    /// Copy the flow's FEC decoders' numbers (at most 4) into its
    /// counters: each leg's own ([`crate::counters::FlowCounters::leg_fec`])
    /// and the flow's ([`crate::counters::FecCounters`]). Repairs and
    /// rejects add up over the legs; what the flow lost after FEC does
    /// not: on merged legs a number one leg could not repair but another
    /// delivered is not lost, so a merged flow's `unrecoverable` is what
    /// no leg delivered (the merge's `lost`), a failover flow's what its
    /// active leg could not repair (as RIST's `unrecovered`).
    fn sum_fec_stats(&mut self, flow: FlowId) {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return;
        };
        let (mut recovered, mut rejected) = (0, 0);
        let c = &f.counters.fec;
        for (leg, d) in f.fec.iter().enumerate() {
            let Some(d) = d else { continue };
            let s = d.stats();
            recovered += s.recovered;
            rejected += s.fec_rejected;
            let Some(l) = f.counters.leg_fec.get(leg) else {
                continue;
            };
            // The leg's losses since the last call (its decoder only
            // counts up).
            let new = s.unrecoverable.saturating_sub(l.unrecoverable.get());
            let counts_for_flow = match &f.mode {
                Mode::Single | Mode::Replaced => true,
                Mode::Failover(fo) => fo.active().index() == leg,
                Mode::Merge(_) => false,
            };
            if counts_for_flow {
                c.unrecoverable.add(new);
            }
            l.recovered.set(s.recovered);
            l.unrecoverable.set(s.unrecoverable);
            l.duplicates.set(s.duplicates);
            l.rejected.set(s.fec_rejected);
        }
        if let Mode::Merge(_) = &f.mode {
            c.unrecoverable.set(f.counters.redundancy.lost.get());
        }
        c.recovered.set(recovered);
        c.rejected.set(rejected);
    }

    /// A datagram on one of leg `leg`'s FEC ports: the packets it
    /// repairs (directly, or by the waiting FEC packets it completes) go
    /// on like received ones, on the same leg, before any other packet.
    /// `Full { newly: true }` when one of them found every output full.
    pub fn receive_fec(
        &mut self,
        flow: FlowId,
        leg: LegId,
        datagram: &[u8],
        now_ns: u64,
    ) -> Received {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return Received::Dropped;
        };
        let Some(Some(d)) = f.fec.get_mut(leg.index()) else {
            return Received::Dropped;
        };
        f.counters.fec.packets.inc();
        if let Some(l) = f.counters.leg_fec.get(leg.index()) {
            l.packets.inc();
        }
        let mut scratch = std::mem::take(&mut self.fec_scratch);
        let mut ends = std::mem::take(&mut self.fec_ends);
        scratch.clear();
        ends.clear();
        d.repair(datagram, |p| {
            // Sized for every repair one datagram can chain
            // (`Core::enable_fec`): no allocation.
            if scratch.capacity() - scratch.len() >= p.len() && ends.len() < ends.capacity() {
                scratch.extend_from_slice(p);
                ends.push(scratch.len());
            }
        });
        self.sum_fec_stats(flow);
        let result = self.admit_repaired(flow, leg, &scratch, &ends, now_ns, Received::Queued);
        self.fec_scratch = scratch;
        ends.clear();
        self.fec_ends = ends;
        result
    }

    /// [`Core::receive_on`] after FEC: `wire` is false for a packet FEC
    /// repaired (not counted as received).
    #[inline(always)]
    pub(crate) fn admit_on(
        &mut self,
        flow: FlowId,
        leg: LegId,
        payload: &[u8],
        now_ns: u64,
        wire: bool,
    ) -> Received {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return Received::Dropped;
        };
        // A one-leg flow: one branch on the rule, then admission and
        // queueing (no ticket, no timer, no second look at the outputs,
        // nothing of the other rules' state live in its registers).
        if !matches!(f.mode, Mode::Single) {
            return self.receive_redundant(flow, leg, payload, now_ns, wire);
        }
        if let Err(dropped) = f.count_in(leg, payload.len(), self.standby, wire) {
            return dropped;
        }
        let mut parts = Parts {
            pool: &mut self.pool,
            in_flight: &mut self.in_flight,
            reserve: &mut self.reserve,
            dirty: &mut self.dirty,
        };
        let (buf, uses) =
            match parts.admit(&f.outputs, &f.counters, &mut f.held, &mut f.paused, payload) {
                Ok(admitted) => admitted,
                Err(dropped) => return dropped,
            };
        // `legs` is at most the counters' length.
        if let Some(c) = f.counters.redundancy.forwarded.get(leg.index()) {
            c.inc();
        }
        parts.enqueue_uses(flow, &mut f.outputs, &mut f.held, buf, uses);
        if f.resuming {
            // A guard may have ended with this datagram.
            f.refresh_plain();
        }
        Received::Queued
    }

    /// [`Core::receive_on`] for a merge or failover flow. Inlined: out of
    /// line (`#[inline(never)]` or `#[cold]`) merge and failover cost
    /// ~100 instructions more per delivered packet
    /// (`benches/redundancy_instructions.rs`).
    #[inline(always)]
    fn receive_redundant(
        &mut self,
        flow: FlowId,
        leg: LegId,
        payload: &[u8],
        now_ns: u64,
        wire: bool,
    ) -> Received {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return Received::Dropped;
        };
        if let Err(dropped) = f.count_in(leg, payload.len(), self.standby, wire) {
            return dropped;
        }
        let red = &f.counters.redundancy;
        // Looked up once admitted (`legs` is at most the counters' length).
        let forwarded = || red.forwarded.get(leg.index());
        let counters = &*f.counters;
        let Flow {
            outputs,
            paused,
            held,
            mode,
            ready,
            rewrite,
            ..
        } = f;
        let fo_or_merge = mode;
        let mut parts = Parts {
            pool: &mut self.pool,
            in_flight: &mut self.in_flight,
            reserve: &mut self.reserve,
            dirty: &mut self.dirty,
        };
        // The rule's verdict, before any buffer is taken.
        let ticket = match fo_or_merge {
            Mode::Single => return Received::Dropped,
            Mode::Replaced => return drop(&red.duplicates),
            Mode::Failover(fo) => {
                match fo.admit(leg, payload, now_ns, red) {
                    Pass::Forward(seq) => {
                        // The active leg's silence (or a revert) is next;
                        // a standby datagram changes neither.
                        if let Some(deadline) = fo.deadline(now_ns) {
                            self.timers.arm(flow, deadline);
                        }
                        Ticket::Failover(seq)
                    }
                    Pass::Standby => match red.standby.get(leg.index()) {
                        Some(c) => return drop(c),
                        None => return Received::Dropped,
                    },
                    Pass::Duplicate => return drop(&red.duplicates),
                    Pass::Late => return drop(&red.late),
                    Pass::NotRtp => return drop(&red.not_rtp),
                    Pass::Stray => return drop(&red.strays),
                    Pass::Replay => return drop(&red.replays),
                }
            }
            Mode::Merge(m) => {
                let Some(h) = mcrelay_wire::rtp::parse(payload) else {
                    return drop(&red.not_rtp);
                };
                let verdict = m.classify(leg, h.sequence, h.ssrc, now_ns, red, &mut |buf| {
                    parts.enqueue(flow, outputs, held, buf);
                });
                if let Some(deadline) = m.deadline() {
                    self.timers.arm(flow, deadline);
                }
                match verdict {
                    Verdict::New(ext) => Ticket::Merge(ext),
                    Verdict::Duplicate => return drop(&red.duplicates),
                    Verdict::Late => return drop(&red.late),
                    Verdict::Stray => return drop(&red.strays),
                    Verdict::Replay => return drop(&red.replays),
                    Verdict::Apart => return drop(&red.mismatched),
                }
            }
        };
        // `rtp_rewrite`: the header this one leaves with (failover only).
        let rewritten = match (rewrite, ticket) {
            (Some(rw), Ticket::Failover(_)) => {
                let Some(h) = mcrelay_wire::rtp::parse(payload) else {
                    return drop(&red.not_rtp);
                };
                match rw.map(leg, &h, now_ns) {
                    Mapped::Out {
                        seq,
                        timestamp,
                        ssrc,
                    } => Some((seq, timestamp, ssrc)),
                    Mapped::Late => return drop(&red.late),
                }
            }
            _ => None,
        };
        let (mut buf, uses) = match parts.admit(outputs, counters, held, paused, payload) {
            Ok(admitted) => admitted,
            Err(dropped) => return dropped,
        };
        if let Some((seq, timestamp, ssrc)) = rewritten {
            // In the pool buffer, before any send is queued.
            rewrite::write(parts.pool.bytes_mut(&mut buf), seq, timestamp, ssrc);
        }
        if let Some(c) = forwarded() {
            c.inc();
        }
        let buf = match (ticket, fo_or_merge) {
            (Ticket::Failover(seq), Mode::Failover(fo)) => {
                fo.sent(seq, red);
                Some(buf)
            }
            (Ticket::Merge(ext), Mode::Merge(m)) => {
                let buf = m.commit(ext, buf);
                if m.delays() {
                    if let Some(buf) = buf {
                        parts.enqueue(flow, outputs, held, buf);
                    }
                    if parts.release_ready(flow, m, outputs, held, now_ns) && !*ready {
                        *ready = true;
                        self.ready.push(flow);
                    }
                    // Its turn may have opened windows to close.
                    if let Some(deadline) = m.deadline() {
                        self.timers.arm(flow, deadline);
                    }
                    None
                } else {
                    buf
                }
            }
            _ => Some(buf),
        };
        if let Some(buf) = buf {
            // Nothing was queued since admission counted the outputs with
            // room.
            parts.enqueue_uses(flow, outputs, held, buf, uses);
        }
        Received::Queued
    }

    /// A loop turn at `now_ns`: what the redundancy rules have due —
    /// held packets whose turn came (also those stopped by full queues
    /// last turn), numbers missing for the merge delay skipped, merge
    /// windows accounted, the failover rule. O(flows with something
    /// due). Call it before flushing.
    pub fn tick(&mut self, now_ns: u64) {
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        self.timers.expire(now_ns, &mut due);
        due.append(&mut self.ready);
        for &flow in &due {
            self.serve(flow, now_ns);
        }
        due.clear();
        self.due = due;
    }

    /// When the driver should tick next at the latest (its wait's
    /// timeout): now when held packets are ready, the next timer slot when
    /// a timer is armed, `None` when nothing is pending.
    pub fn next_tick_ns(&self) -> Option<u64> {
        if !self.ready.is_empty() {
            return Some(0);
        }
        self.timers.next_ns()
    }

    fn serve(&mut self, flow: FlowId, now_ns: u64) {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return;
        };
        let red = &f.counters.redundancy;
        f.ready = false;
        let deadline = match &mut f.mode {
            Mode::Single | Mode::Replaced => None,
            Mode::Failover(fo) => {
                fo.evaluate(now_ns, red);
                fo.deadline(now_ns)
            }
            Mode::Merge(m) => {
                let mut parts = Parts {
                    pool: &mut self.pool,
                    in_flight: &mut self.in_flight,
                    reserve: &mut self.reserve,
                    dirty: &mut self.dirty,
                };
                if parts.release_ready(flow, m, &mut f.outputs, &mut f.held, now_ns) {
                    f.ready = true;
                    self.ready.push(flow);
                }
                m.finalise(now_ns, red);
                if !f.fec.is_empty() {
                    // What the merge lost is the flow's loss after FEC
                    // (`sum_fec_stats`): kept current when no FEC
                    // datagram comes after the last window closed.
                    f.counters.fec.unrecoverable.set(red.lost.get());
                }
                m.deadline()
            }
        };
        if let Some(deadline) = deadline {
            self.timers.arm(flow, deadline);
        }
    }
}

/// What a flow's redundancy rule let through, to complete once the
/// datagram has a buffer.
#[derive(Debug, Clone, Copy)]
enum Ticket {
    /// With the number to mark as sent.
    Failover(Option<(u16, u32, bool)>),
    /// Its extended sequence number.
    Merge(u64),
}

/// Count a datagram a redundancy rule dropped.
fn drop(counter: &crate::counters::Counter) -> Received {
    counter.inc();
    Received::Dropped
}

impl Flow {
    /// On a leg with 2022-1 FEC, the decoder keeps a copy of `payload`
    /// (and `recovered` gets what the waiting FEC packets it completes
    /// repair); `true` (counted) when it had already repaired it: then
    /// it is dropped.
    #[inline(always)]
    pub(crate) fn fec_duplicate(
        &mut self,
        leg: LegId,
        payload: &[u8],
        recovered: impl FnMut(&[u8]),
    ) -> bool {
        if let Some(Some(d)) = self.fec.get_mut(leg.index())
            && d.media(payload, recovered) == MediaVerdict::Duplicate
        {
            self.counters.packets_in.inc();
            self.counters.bytes_in.add(payload.len() as u64);
            self.counters.fec.duplicates.inc();
            return true;
        }
        false
    }

    /// Count a datagram in on `leg`; why it is dropped (counted) before
    /// its rule sees it: a leg the flow does not have, a standby worker
    /// (discarded, not dropped), or too large.
    #[inline(always)]
    fn count_in(&self, leg: LegId, len: usize, standby: bool, wire: bool) -> Result<(), Received> {
        if wire {
            self.counters.packets_in.inc();
            self.counters.bytes_in.add(len as u64);
        }
        if leg.0 >= self.legs {
            self.counters.redundancy.unknown_leg.inc();
            return Err(Received::Dropped);
        }
        if standby {
            // Warm standby (`core::standby`): counted and discarded before
            // admission, so nothing is sent.
            self.counters.standby_discarded.inc();
            return Err(Received::Standby);
        }
        if len > MAX_PAYLOAD {
            self.counters.drops.oversize.inc();
            return Err(Received::Dropped);
        }
        Ok(())
    }
}
