//! XDP ingress in the worker: walking an AF_XDP socket's RX ring. The XDP
//! program on the input interface has already picked the flow's frames;
//! each is read in place in the UMEM, parsed with [`mcrelay_wire::parse`]
//! (the same parser as packet ingress, so a frame the program let through
//! by mistake is still refused and counted), its payload (or the parser's reject) given to the
//! core through the one `Core::ingest` every ingress ends in (the one
//! copy, into a pool buffer), and its UMEM frame handed
//! straight back to the kernel through the fill ring. No system call per
//! frame: the worker is woken by a one-shot poll on the socket when the
//! ring was empty, and walks it once per loop turn while it is not.

use super::driver::{CQE_BATCH, Worker};
use mcrelay_relay::{FlowId, LegId, Received};

impl Worker {
    /// Relay the frames in leg `l`'s RX ring, at most a completion
    /// batch's worth per call (so completions are reaped between batches);
    /// sets `ring_pending` when frames are left. A flow whose outputs are
    /// all full stops here: the frames wait in the RX ring, and once it is
    /// full the kernel drops (counted in the socket's `rx_ring_full`).
    pub(super) fn service_xsk(&mut self, f: FlowId, l: LegId) {
        let Some(leg) = self.leg_mut(f, l) else {
            return;
        };
        let (Some(mut rings), Some(filter)) = (leg.xsk.take(), leg.packet) else {
            return;
        };
        self.flush_sends();
        let now = self.now_ns;
        let mut budget = CQE_BATCH;
        let mut pending = false;
        while budget > 0 {
            let Some(frame) = rings.next_frame() else {
                break;
            };
            // The kernel copied the frame whole (the config refuses MTUs
            // whose frames don't fit a UMEM frame); its UDP checksum is
            // not checked: a veth peer leaves it to an offload that never
            // runs (CHECKSUM_PARTIAL), and the Ethernet FCS has covered
            // the link.
            let payload = rings
                .bytes(frame)
                .ok_or(mcrelay_wire::Reject::Truncated)
                .and_then(|bytes| {
                    mcrelay_wire::parse(bytes, &filter, false).map(|d| &bytes[d.payload])
                });
            // Dropped when full (counted per output as backlog, as on a
            // socket); the frames after it wait in the ring.
            let full = matches!(self.core.ingest(f, l, payload, now), Received::Full { .. });
            rings.recycle(frame.addr);
            if full {
                break;
            }
            budget -= 1;
            if budget == 0 {
                pending = rings.has_frames();
            } else if budget % 32 == 0 {
                self.flush_sends();
            }
        }
        self.flush_sends();
        self.core.publish_health();
        if let Some(leg) = self.leg_mut(f, l) {
            leg.xsk = Some(rings);
            leg.ring_pending = pending;
        }
    }
}
