//! The receive side of the driver: arming and cancelling a flow's receive
//! (or its packet ring's poll), turning receive completions and packet ring
//! frames into the core's "datagram received" events, and handing receive
//! buffers back.
#![allow(unsafe_code)]

use std::io;

use io_uring::cqueue;
use io_uring::opcode;
use io_uring::types::{CancelBuilder, Fd};

use super::driver::{CQE_BATCH, Flow, Worker};
use crate::core::{FlowId, Received};
use crate::packet_ring::{Layout, PacketRing, Wake};
use crate::receive_buffers::BUFFER_LEN;
use crate::submit::{self, UserData};

/// A receive (or packet ring poll) failed with `errno`: counted, and the
/// first per flow logged.
fn receive_failed(
    counters: Option<&crate::counters::FlowCounters>,
    flow: &mut Flow,
    worker: usize,
    what: &str,
    errno: i32,
) {
    if let Some(c) = counters {
        c.receive_errors.inc();
    }
    if !flow.error_logged {
        flow.error_logged = true;
        tracing::warn!(
            worker,
            flow = %flow.name,
            "{what} failed: {}",
            io::Error::from_raw_os_error(errno)
        );
    }
}

impl Worker {
    pub(super) fn arm_receive(&mut self, f: FlowId) {
        let Some(flow) = self.flows.get(f.index()).and_then(Option::as_ref) else {
            return;
        };
        let user_data = UserData::Receive { flow: f }.encode();
        let entry = if let Some(ring) = &flow.packet_ring {
            let poll = opcode::PollAdd::new(Fd(flow.fd), u32::from(libc::POLLIN.unsigned_abs()));
            match ring.layout() {
                // Woken once per block the kernel hands over.
                Layout::Blocks => poll.multi(true).build(),
                // A busy flow's frames are walked every WAKE_INTERVAL by the
                // loop turn instead.
                Layout::Frames if ring.wake.wake() == Wake::Interval => return,
                // One-shot, re-armed by the loop turn after the walk: woken
                // by the next frame when the ring was empty, at once (the
                // poll finds it readable) when frames are waiting — a
                // wake-up per frame only while nearly idle.
                Layout::Frames => poll.build(),
            }
        } else if flow.packet.is_some() {
            // Its packet ring could not be set up (logged when the flow was
            // added).
            return;
        } else if self.multishot {
            opcode::RecvMulti::new(Fd(flow.fd), self.receive_buffers.group()).build()
        } else {
            // One receive buffer per flow, its index the flow's number: the
            // receive buffers have one for every flow number.
            let Some(ptr) = self.receive_buffers.receive_ptr(f.get()) else {
                return;
            };
            opcode::Recv::new(Fd(flow.fd), ptr, BUFFER_LEN).build()
        };
        // SAFETY: the receive buffers (and with them the single receive's
        // buffer) and the flow's ingress socket live in the worker, which
        // drops its io_uring first; a removed flow's socket closes only once
        // its receive is no longer armed.
        if unsafe { submit::push(&mut self.uring, &entry.user_data(user_data)) }
            && let Some(flow) = self.flows[f.index()].as_mut()
        {
            flow.armed = true;
        }
    }

    pub(super) fn cancel_receive(&mut self, f: FlowId) {
        if self
            .flows
            .get(f.index())
            .and_then(Option::as_ref)
            .is_some_and(|f| f.armed)
        {
            let target = UserData::Receive { flow: f }.encode();
            let entry = opcode::AsyncCancel2::new(CancelBuilder::user_data(target).all())
                .build()
                .user_data(UserData::Cancel.encode());
            // SAFETY: a cancellation points to no memory and names no fd.
            unsafe { submit::push(&mut self.uring, &entry) };
        }
    }

    pub(super) fn received(&mut self, f: FlowId, cqe: &cqueue::Entry) {
        let flags = cqe.flags();
        let removing = self.core.is_removing(f);
        if let Some(flow) = self
            .flows
            .get_mut(f.index())
            .and_then(Option::as_mut)
            .filter(|fl| fl.packet_ring.is_some())
        {
            if !cqueue::more(flags) {
                flow.armed = false;
            }
            let result = cqe.result();
            if result < 0 && result != -libc::ECANCELED {
                receive_failed(
                    self.core.counters(f),
                    flow,
                    self.index,
                    "poll on the packet ring",
                    -result,
                );
            }
            if result > 0 && !removing {
                self.service_ring(f);
            }
            return;
        }
        let id = if self.multishot {
            cqueue::buffer_select(flags)
        } else {
            Some(f.get())
        };
        let Some(flow) = self.flows.get_mut(f.index()).and_then(Option::as_mut) else {
            if self.multishot
                && let Some(id) = id
            {
                self.receive_buffers.recycle(id);
            }
            return;
        };
        if !self.multishot || !cqueue::more(flags) {
            flow.armed = false;
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
                errno => receive_failed(counters, flow, self.index, "receive", errno),
            }
            return;
        }
        let Some(id) = id else {
            return;
        };
        let len = result.unsigned_abs() as usize;
        if let Some(bytes) = self.receive_buffers.filled(id, len)
            && {
                flow.health.observe(bytes);
                self.core.receive(f, bytes) == (Received::Full { newly: true })
            }
        {
            // Stop receiving until the outputs drain: the kernel drops the
            // excess at the socket for less than a receive costs, and
            // counts it.
            self.cancel_receive(f);
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
    pub(super) fn service_ring(&mut self, f: FlowId) {
        let Some(flow) = self.flows.get_mut(f.index()).and_then(Option::as_mut) else {
            return;
        };
        flow.ring_pending = false;
        let (Some(mut ring), Some(filter)) = (flow.packet_ring.take(), flow.packet) else {
            return;
        };
        if ring.layout() == Layout::Frames {
            return self.service_frames(f, ring, filter);
        }
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
                match payload {
                    Ok(payload) => {
                        if let Some(fl) = self.flows.get_mut(f.index()).and_then(Option::as_mut) {
                            fl.health.observe(payload);
                        }
                        if matches!(self.core.receive(f, payload), Received::Full { .. }) {
                            // This one is dropped (counted per output as
                            // backlog, as on a socket); the frames after it
                            // wait in the packet ring.
                            done += 1;
                            break 'blocks;
                        }
                    }
                    Err(reason) => {
                        if let Some(c) = self.core.counters(f) {
                            c.frames.count(reason);
                        }
                    }
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
        if let Some(flow) = self.flows.get_mut(f.index()).and_then(Option::as_mut) {
            flow.packet_ring = Some(ring);
            flow.ring_pending = pending;
        }
    }

    /// [`Layout::Frames`]: relay the frames the kernel has handed over, at
    /// most a completion batch's worth per call, handing each slot back as
    /// it is done; as [`Worker::service_ring`] otherwise.
    fn service_frames(&mut self, f: FlowId, mut ring: PacketRing, filter: mcrelay_wire::FlowMatch) {
        self.flush_sends();
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
            let mut full = false;
            match payload {
                Ok(payload) => {
                    if let Some(fl) = self.flows.get_mut(f.index()).and_then(Option::as_mut) {
                        fl.health.observe(payload);
                    }
                    // Dropped when full (counted per output as backlog, as
                    // on a socket); the frames after it wait in the ring.
                    full = matches!(self.core.receive(f, payload), Received::Full { .. });
                }
                Err(reason) => {
                    if let Some(c) = self.core.counters(f) {
                        c.frames.count(reason);
                    }
                }
            }
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
        ring.wake.walked(walked, std::time::Instant::now());
        if let Some(flow) = self.flows.get_mut(f.index()).and_then(Option::as_mut) {
            flow.packet_ring = Some(ring);
            flow.ring_pending = pending;
        }
    }
}
