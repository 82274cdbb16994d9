//! Sends: queued datagrams into send requests (GSO runs and plain
//! sends), and their completions, which give buffers back.

use mcrelay_pool::PoolSet;

use super::admission::{Held, Reserve};
use super::{
    Core, FlowId, InFlight, OutputId, SendKind, SendRequest, SendToken, Slot, errno, refuses_gso,
    release,
};
use crate::counters::OutputCounters;

impl Core {
    /// Turn every output's queued datagrams into sends: a GSO send per run
    /// of same-size datagrams, a plain send for the rest. `submit` hands
    /// one to the kernel; `false` when it could not (the submission queue
    /// stayed full): a GSO send is then sent plain, a plain one dropped and
    /// counted as a send error.
    pub fn flush(&mut self, submit: &mut impl FnMut(&SendRequest<'_>, &InFlight) -> bool) {
        for d in 0..self.dirty.len() {
            let (flow, output) = self.dirty[d];
            let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
                continue;
            };
            let Some(o) = f.outputs.get_mut(output.index()) else {
                continue;
            };
            let mut at = 0;
            loop {
                let n = o.queue.run_len(at, o.gso_max);
                let Some(run) = o.queue.items().get(at..at + n) else {
                    break;
                };
                let Some(first) = run.first() else {
                    break;
                };
                at += n;
                let record = if n > 1 {
                    u16::try_from(first.len).ok().and_then(|size| {
                        Some((size, self.gso.start(size, run.iter().map(|q| q.slot))?))
                    })
                } else {
                    None
                };
                if let Some((segment_size, record)) = record {
                    let req = SendRequest {
                        flow,
                        output,
                        kind: SendKind::Gso {
                            record,
                            segment_size,
                            slots: self.gso.slots(record),
                        },
                    };
                    if submit(&req, &self.in_flight) {
                        continue;
                    }
                    self.gso.finish(record);
                }
                for q in run {
                    let req = SendRequest {
                        flow,
                        output,
                        kind: SendKind::Plain { slot: q.slot },
                    };
                    if !submit(&req, &self.in_flight) {
                        let parts = (&mut self.in_flight, &mut self.pool, &mut self.reserve);
                        unsent((&mut o.in_flight, &o.counters), &mut f.held, parts, q.slot);
                    }
                }
            }
            o.queue.clear();
        }
        self.dirty.clear();
    }

    /// A send completed with `result` (bytes sent, or a negative errno).
    /// A refused GSO send is resent datagram by datagram through `submit`.
    pub fn complete(
        &mut self,
        token: SendToken,
        result: i32,
        submit: &mut impl FnMut(&SendRequest<'_>, &InFlight) -> bool,
    ) {
        match token {
            SendToken::Plain { slot, flow, output } => {
                self.plain_done(slot, flow, output, result);
            }
            SendToken::Gso {
                record,
                flow,
                output,
            } => self.gso_done(record, flow, output, result, submit),
        }
    }

    fn plain_done(&mut self, slot: Slot, flow: FlowId, output: OutputId, result: i32) {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return;
        };
        if let Some(o) = f.outputs.get_mut(output.index()) {
            o.in_flight = o.in_flight.saturating_sub(1);
            count_result(&o.counters, result, 1);
        }
        release(
            &mut self.in_flight,
            &mut self.pool,
            &mut self.reserve,
            &mut f.held,
            slot,
        );
    }

    fn gso_done(
        &mut self,
        record: u32,
        flow: FlowId,
        output: OutputId,
        result: i32,
        submit: &mut impl FnMut(&SendRequest<'_>, &InFlight) -> bool,
    ) {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return;
        };
        let Some(o) = f.outputs.get_mut(output.index()) else {
            return;
        };
        let slots = self.gso.slots(record);
        if slots.is_empty() {
            return;
        }
        if result < 0 && refuses_gso(-result) {
            // The kernel or the route can't segment this: send the same
            // datagrams one by one (their buffers are still held, and
            // `o.in_flight` still counts them), and stop grouping
            // datagrams this large on this output.
            o.counters.gso_fallbacks.inc();
            o.gso_max = if -result == errno::EINVAL || -result == errno::EMSGSIZE {
                self.gso.segment_size(record).saturating_sub(1)
            } else {
                0
            };
            for &slot in slots {
                let req = SendRequest {
                    flow,
                    output,
                    kind: SendKind::Plain { slot },
                };
                if !submit(&req, &self.in_flight) {
                    let parts = (&mut self.in_flight, &mut self.pool, &mut self.reserve);
                    unsent((&mut o.in_flight, &o.counters), &mut f.held, parts, slot);
                }
            }
            self.gso.finish(record);
            return;
        }
        let n = u32::try_from(slots.len()).unwrap_or(u32::MAX);
        o.in_flight = o.in_flight.saturating_sub(n);
        if result >= 0 {
            o.counters.gso_sends.inc();
        }
        count_result(&o.counters, result, u64::from(n));
        for &slot in slots {
            release(
                &mut self.in_flight,
                &mut self.pool,
                &mut self.reserve,
                &mut f.held,
                slot,
            );
        }
        self.gso.finish(record);
    }
}

/// The completion of `n` datagrams' send with `result`.
fn count_result(counters: &OutputCounters, result: i32, n: u64) {
    if result >= 0 {
        counters.packets_out.add(n);
        counters.bytes_out.add(u64::from(result.unsigned_abs()));
    } else {
        counters.drop_send_error.add(n);
        counters.last_error.set(u64::from(result.unsigned_abs()));
    }
}

/// A send the kernel could not take (its submission queue stayed full):
/// dropped for that output, counted as a send error.
fn unsent(
    (queued, counters): (&mut u32, &OutputCounters),
    held: &mut Held,
    (in_flight, pool, reserve): (&mut InFlight, &mut PoolSet, &mut Reserve),
    slot: Slot,
) {
    *queued = queued.saturating_sub(1);
    counters.drop_send_error.inc();
    release(in_flight, pool, reserve, held, slot);
}
