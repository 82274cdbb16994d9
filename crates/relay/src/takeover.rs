//! A flow replaced by a reload hands its redundancy state to its
//! successor on the same worker ([`Core::take_over`]), in one step
//! between two datagrams: the merge's window and hold (or the failover's
//! active leg, leg health and sent-number guard) move to the new flow, so
//! the datagrams both flows' sockets receive while the new legs join and
//! the old ones leave (make before break) go out once.

use mcrelay_pool::Buffer;

use super::admission::Held;
use super::redundancy::Mode;
use super::{Core, Flow, FlowId, Parts};

/// What a replaced flow hands its successor besides its core state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Handover {
    /// The new flow's legs that are the old flow's leg of the same index
    /// (same interface, group, port and source), a bit per leg: a
    /// failover keeps their health; the others start silent.
    pub kept: u8,
    /// The highest RTP sequence number (and SSRC) the old flow received,
    /// when it kept no sequence state of its own (a one-leg flow; the
    /// driver reads it from the leg's stream health): its successor
    /// treats that number and the ones before it as sent.
    pub last_rtp: Option<(u16, u32)>,
}

impl Core {
    /// Flow `new` takes over from flow `old`, which stops relaying: what
    /// `old` still receives is dropped (counted as its `duplicates`), and
    /// it goes once its sends have completed ([`Core::is_quiet`],
    /// [`Core::forget`]), as after [`Core::remove_flow`].
    ///
    /// - merge → merge: the window and the hold move over; no number
    ///   `old` forwarded or holds is forwarded again, and held packets
    ///   keep their order and their buffers (they leave at once, in
    ///   order, if `new` has no delay).
    /// - failover → failover: the active leg, the legs in
    ///   `handover.kept` with their health, and the sent-number guard.
    /// - any other pair: what `old` holds leaves now, in order, on
    ///   `new`'s outputs; a merge or an RTP failover `new` starts after
    ///   the highest number `old` sent (from its merge or guard, or
    ///   `handover.last_rtp`), and so does each output of a one-leg
    ///   `new` (its outputs resume after that number: `resume`).
    ///
    /// `false` (nothing done) when either flow is unknown, `old` is
    /// already going, or they are the same. Control plane: O(4096) at
    /// most, no allocation.
    pub fn take_over(&mut self, old: FlowId, new: FlowId, handover: Handover, now_ns: u64) -> bool {
        if old == new || self.flow(new).is_none() || self.is_removing(old) {
            return false;
        }
        let Some(mut o) = self.flows.get_mut(old.index()).and_then(Option::take) else {
            return false;
        };
        let mode = std::mem::replace(&mut o.mode, Mode::Replaced);
        o.removing = true;
        o.ready = false;
        self.timers.disarm(old);
        self.ready.retain(|&f| f != old);
        if let Some(n) = self.flows.get_mut(new.index()).and_then(Option::as_mut) {
            // `rtp_rewrite` on both: the output stream goes on unbroken.
            if let (Some(from), Some(to)) = (o.rewrite.as_deref(), n.rewrite.as_deref_mut()) {
                to.clone_from(from);
            }
            let mut parts = Parts {
                pool: &mut self.pool,
                in_flight: &mut self.in_flight,
                reserve: &mut self.reserve,
                dirty: &mut self.dirty,
            };
            let due = hand_over(&mut parts, &mut o.held, new, n, mode, handover, now_ns);
            n.refresh_plain();
            if due.ready && !n.ready {
                n.ready = true;
                self.ready.push(new);
            }
            if let Some(deadline) = due.deadline {
                self.timers.arm(new, deadline);
            }
        }
        o.refresh_plain();
        self.flows[old.index()] = Some(o);
        self.rebalance();
        true
    }
}

/// What the new flow has due after a takeover.
struct Due {
    deadline: Option<u64>,
    ready: bool,
}

/// Move `mode`, the old flow's state, into `n`, flow `new`; buffers the
/// old flow held change hands (`old_held` → `n.held`).
fn hand_over(
    parts: &mut Parts<'_>,
    old_held: &mut Held,
    new: FlowId,
    n: &mut Flow,
    mode: Mode,
    handover: Handover,
    now_ns: u64,
) -> Due {
    let Flow {
        outputs,
        held,
        mode: new_mode,
        counters,
        ..
    } = n;
    let red = &counters.redundancy;
    let mut release = |buf: Buffer| {
        Held::hand_over(old_held, held, buf.class());
        parts.enqueue(new, outputs, held, buf);
    };
    match (mode, &mut *new_mode) {
        (Mode::Merge(mut m), Mode::Merge(nm)) => {
            nm.take_over(&mut m, &mut release);
            for class in nm.held_classes() {
                Held::hand_over(old_held, held, class);
            }
        }
        (Mode::Failover(f), Mode::Failover(nf)) => nf.take_over(&f, handover.kept, now_ns),
        (old_mode, _) => {
            let last = match old_mode {
                Mode::Merge(mut m) => {
                    m.drain(&mut release);
                    m.highest()
                }
                Mode::Failover(f) => f.highest(),
                Mode::Single | Mode::Replaced => handover.last_rtp,
            };
            if let Some((seq, ssrc)) = last {
                match new_mode {
                    Mode::Merge(nm) => nm.seed(seq, ssrc, now_ns),
                    Mode::Failover(nf) => nf.seed(seq, ssrc),
                    // A one-leg flow keeps no numbers: each of its outputs
                    // resumes after the old flow's last (`resume`).
                    Mode::Single | Mode::Replaced => {
                        for o in outputs.iter_mut() {
                            o.guard.set(Some((seq, ssrc)));
                        }
                    }
                }
            }
        }
    }
    match new_mode {
        Mode::Merge(m) => Due {
            deadline: m.deadline(),
            ready: m.has_ready(now_ns),
        },
        Mode::Failover(f) => {
            // A leg that is gone or changed may have been the active one.
            f.evaluate(now_ns, red);
            red.active_leg.set(u64::from(f.active().0));
            Due {
                deadline: f.deadline(now_ns),
                ready: false,
            }
        }
        Mode::Single | Mode::Replaced => Due {
            deadline: None,
            ready: false,
        },
    }
}
