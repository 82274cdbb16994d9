//! The receive side of the driver: arming and cancelling a flow's receive
//! (or its packet ring's poll), turning receive completions and packet ring
//! frames into datagrams for the core, and handing receive buffers back.
//!
//! Every ingress ends in the same one call, `Core::ingest(flow, receiver,
//! payload or the parser's reject, now)`: the core counts a reject, feeds
//! an FEC receiver's decoder, shows a media datagram to its leg's stream
//! health and admits it (`mcrelay_relay::intake`). A new ingress (AF_XDP,
//! SRT, RIST) reads its datagrams and makes that call; what it gets back
//! (`Received::Full`) says when to stop reading until the flow resumes.
#![allow(unsafe_code)]

use std::io;

use io_uring::cqueue;
use io_uring::opcode;
use io_uring::types::{CancelBuilder, Fd};

use super::driver::{CQE_BATCH, Worker, single_buffer};
use super::flow::Leg;
use crate::packet_ring::{Layout, PacketRing, Wake};
use crate::receive_buffers::BUFFER_LEN;
use crate::submit::{self, UserData};
use mcrelay_relay::{FlowId, LegId, Received};

/// A receive (or packet ring poll) failed with `errno`: counted, and the
/// first per leg logged.
fn receive_failed(
    counters: Option<&mcrelay_relay::counters::FlowCounters>,
    leg: &mut Leg,
    at: (usize, FlowId, LegId),
    what: &str,
    errno: i32,
) {
    if let Some(c) = counters {
        c.receive_errors.inc();
    }
    if !leg.error_logged {
        leg.error_logged = true;
        let (worker, flow, leg) = at;
        tracing::warn!(
            worker,
            flow = flow.get(),
            leg = leg.0,
            "{what} failed: {}",
            io::Error::from_raw_os_error(errno)
        );
    }
}

impl Worker {
    pub(super) fn arm_receive(&mut self, f: FlowId, l: LegId) {
        let Some(leg) = self.leg(f, l) else {
            return;
        };
        let user_data = UserData::Receive { flow: f, leg: l }.encode();
        let entry = if let Some(ring) = &leg.packet_ring {
            let poll = opcode::PollAdd::new(Fd(leg.fd), u32::from(libc::POLLIN.unsigned_abs()));
            match ring.layout() {
                // Woken once per block the kernel hands over.
                Layout::Blocks => poll.multi(true).build(),
                // A busy leg's frames are walked every WAKE_INTERVAL by the
                // loop turn instead.
                Layout::Frames if ring.wake.wake() == Wake::Interval => return,
                // One-shot, re-armed by the loop turn after the walk: woken
                // by the next frame when the ring was empty, at once (the
                // poll finds it readable) when frames are waiting — a
                // wake-up per frame only while nearly idle.
                Layout::Frames => poll.build(),
            }
        } else if leg.xsk.is_some() {
            // One-shot, re-armed by the loop turn after the walk, as a
            // frame-slot packet ring's.
            opcode::PollAdd::new(Fd(leg.fd), u32::from(libc::POLLIN.unsigned_abs())).build()
        } else if leg.packet.is_some() {
            // Its packet ring could not be set up (logged when the flow was
            // added).
            return;
        } else if self.multishot {
            opcode::RecvMulti::new(Fd(leg.fd), self.receive_buffers.group()).build()
        } else {
            // One receive buffer per leg, named by its flow's number and
            // the leg: the receive buffers have one for every leg of every
            // flow number.
            let fd = leg.fd;
            let Some(ptr) = single_buffer(f, l).and_then(|id| self.receive_buffers.receive_ptr(id))
            else {
                return;
            };
            opcode::Recv::new(Fd(fd), ptr, BUFFER_LEN).build()
        };
        // SAFETY: the receive buffers (and with them the single receive's
        // buffer) and the leg's ingress socket live in the worker, which
        // drops its io_uring first; a removed flow's sockets close only once
        // none of its legs' receives is armed.
        if unsafe { submit::push(&mut self.uring, &entry.user_data(user_data)) }
            && let Some(leg) = self.leg_mut(f, l)
        {
            leg.armed = true;
        }
    }

    pub(super) fn cancel_receive(&mut self, f: FlowId, l: LegId) {
        if self.leg(f, l).is_some_and(|leg| leg.armed) {
            let target = UserData::Receive { flow: f, leg: l }.encode();
            let entry = opcode::AsyncCancel2::new(CancelBuilder::user_data(target).all())
                .build()
                .user_data(UserData::Cancel.encode());
            // SAFETY: a cancellation points to no memory and names no fd.
            unsafe { submit::push(&mut self.uring, &entry) };
        }
    }

    pub(super) fn received(&mut self, f: FlowId, l: LegId, cqe: &cqueue::Entry) {
        let flags = cqe.flags();
        let removing = self.core.is_removing(f);
        let worker = self.index;
        if let Some(leg) = self
            .flows
            .get_mut(f.index())
            .and_then(Option::as_mut)
            .and_then(|fl| fl.leg_mut(l))
            .filter(|leg| leg.has_ring())
        {
            if !cqueue::more(flags) {
                leg.armed = false;
            }
            let result = cqe.result();
            if result < 0 && result != -libc::ECANCELED {
                receive_failed(
                    self.core.counters(f),
                    leg,
                    (worker, f, l),
                    "poll on the packet ring or AF_XDP socket",
                    -result,
                );
            }
            if result > 0 && !removing {
                self.service_ring(f, l);
            }
            return;
        }
        let id = if self.multishot {
            cqueue::buffer_select(flags)
        } else {
            single_buffer(f, l)
        };
        let Some(leg) = self
            .flows
            .get_mut(f.index())
            .and_then(Option::as_mut)
            .and_then(|fl| fl.leg_mut(l))
        else {
            if self.multishot
                && let Some(id) = id
            {
                self.receive_buffers.recycle(id);
            }
            return;
        };
        if !self.multishot || !cqueue::more(flags) {
            leg.armed = false;
        }
        let result = cqe.result();
        if result < 0 {
            let counters = self.core.counters(f);
            match -result {
                libc::ENOBUFS => {
                    if let Some(c) = counters {
                        c.receive_rearms.inc();
                    }
                }
                libc::ECANCELED => {}
                errno => receive_failed(counters, leg, (worker, f, l), "receive", errno),
            }
            return;
        }
        if result == 0 {
            // The loop guard cut it to its UDP header: one of this flow's
            // own datagrams came back (a real empty datagram never gets
            // here, the guard drops it). A 0-byte receive also ends a
            // multishot receive, which is re-armed like any other. One
            // compare on the packet path.
            if let Some(c) = self.core.counters(f) {
                c.drops.looped.inc();
            }
            if self.multishot
                && let Some(id) = id
            {
                self.receive_buffers.recycle(id);
            }
            return;
        }
        let Some(id) = id else {
            return;
        };
        let len = result.unsigned_abs() as usize;
        if let Some(bytes) = self.receive_buffers.filled(id, len)
            && self.core.ingest(f, l, Ok(bytes), self.now_ns) == (Received::Full { newly: true })
        {
            // Stop receiving until the outputs drain: the kernel drops the
            // excess at the sockets for less than a receive costs, and
            // counts it.
            self.cancel_receives(f);
        }
        if self.multishot {
            self.receive_buffers.recycle(id);
        }
    }

    /// Packet ingress: relay the frames the kernel has handed over, at most
    /// a completion batch's worth per call (so completions are reaped
    /// between batches, as for socket ingress), handing each block back
    /// once walked. Sets `ring_pending` when frames are left. A flow whose
    /// outputs are all full stops here; the frames wait in the packet ring
    /// (and once it is full the kernel drops, counted) until they drain.
    pub(super) fn service_ring(&mut self, f: FlowId, l: LegId) {
        let Some(leg) = self.leg_mut(f, l) else {
            return;
        };
        leg.ring_pending = false;
        if leg.xsk.is_some() {
            return self.service_xsk(f, l);
        }
        let (Some(mut ring), Some(filter)) = (leg.packet_ring.take(), leg.packet) else {
            return;
        };
        if ring.layout() == Layout::Frames {
            return self.service_frames(f, l, ring, filter);
        }
        let now = self.now_ns;
        // Each frame may queue a send per output; the queues hold
        // `QUEUE_CAPACITY`: hand them to the kernel first (what this
        // completion batch queued) and every 32 frames.
        self.flush_sends();
        let mut budget = CQE_BATCH;
        let mut pending = false;
        let mut done = ring.done;
        'blocks: while let Some(block) = ring.next_block() {
            for frame in mcrelay_wire::tpacket::frames(block).skip(done) {
                if budget == 0 {
                    pending = true;
                    break 'blocks;
                }
                let payload = frame.and_then(|fr| {
                    mcrelay_wire::parse(fr.bytes, &filter, fr.verify_checksum)
                        .map(|d| &fr.bytes[d.payload])
                });
                if matches!(self.core.ingest(f, l, payload, now), Received::Full { .. }) {
                    // This one is dropped (counted per output as backlog,
                    // as on a socket); the frames after it wait in the
                    // packet ring.
                    done += 1;
                    break 'blocks;
                }
                done += 1;
                budget -= 1;
                if budget % 32 == 0 {
                    self.flush_sends();
                }
            }
            ring.release_block();
            done = 0;
        }
        ring.done = done;
        self.flush_sends();
        self.core.publish_health();
        if let Some(leg) = self.leg_mut(f, l) {
            leg.packet_ring = Some(ring);
            leg.ring_pending = pending;
        }
    }

    /// [`Layout::Frames`]: relay the frames the kernel has handed over, at
    /// most a completion batch's worth per call, handing each slot back as
    /// it is done; as [`Worker::service_ring`] otherwise.
    fn service_frames(
        &mut self,
        f: FlowId,
        l: LegId,
        mut ring: PacketRing,
        filter: mcrelay_wire::FlowMatch,
    ) {
        self.flush_sends();
        let now = self.now_ns;
        let mut budget = CQE_BATCH;
        let mut pending = false;
        let mut walked = 0u64;
        while let Some(slot) = ring.next_frame() {
            if budget == 0 {
                pending = true;
                break;
            }
            let payload = mcrelay_wire::tpacket::frame_v2(slot).and_then(|fr| {
                mcrelay_wire::parse(fr.bytes, &filter, fr.verify_checksum)
                    .map(|d| &fr.bytes[d.payload])
            });
            // Dropped when full (counted per output as backlog, as on a
            // socket); the frames after it wait in the ring.
            let full = matches!(self.core.ingest(f, l, payload, now), Received::Full { .. });
            ring.release_frame();
            walked += 1;
            if full {
                break;
            }
            budget -= 1;
            if budget % 32 == 0 {
                self.flush_sends();
            }
        }
        self.flush_sends();
        self.core.publish_health();
        ring.wake.walked(walked, std::time::Instant::now());
        if let Some(leg) = self.leg_mut(f, l) {
            leg.packet_ring = Some(ring);
            leg.ring_pending = pending;
        }
    }
}
