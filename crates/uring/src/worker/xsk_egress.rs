//! XDP egress in the worker (`egress = "xdp"`): an output whose datagrams
//! leave as Ethernet frames on an AF_XDP socket's TX ring instead of
//! through a UDP socket. Each datagram the core asks to send is written
//! into a free UMEM frame behind the output's prebuilt Ethernet/IPv4/UDP
//! header ([`mcrelay_wire::egress::Template`]) and published on the TX
//! ring; the send is complete once it is there (the datagram is copied,
//! so its pool buffer goes back at once). After each flush the worker
//! kicks every socket with frames in its TX ring (one `sendto` with
//! `MSG_DONTWAIT` per batch, never per datagram) and takes the frames the
//! kernel finished with off the completion ring. When a kick leaves
//! frames the kernel could take soon (it said `EAGAIN`: the driver's
//! queue stopped, the socket's send buffer full), the worker's loop comes
//! back within `WAKE_INTERVAL` to kick again instead of waiting for the
//! next datagram or its 100 ms tick.
//!
//! A datagram finding the TX ring full kicks it at once (the kernel
//! hasn't taken what the last kicks left) and tries again; finding no
//! free frame or a full TX ring still, it is dropped and counted as a
//! send error with `ENOBUFS`; one too long for a frame or the
//! interface's MTU with `EMSGSIZE` (no fragmentation on this path). A
//! frame the driver drops after taking it from the ring (copy mode: the
//! kick's `sendto` says `EBUSY`, e.g. a veth whose peer's backlog is
//! full) was already counted in `packets_out`; it is counted again in the
//! output's `drop_send_error`, so the drop is seen.
//! Nothing here allocates per datagram: the completions of one flush wait
//! in a list whose capacity is reserved when the flow is placed.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mcrelay_relay::counters::OutputCounters;
use mcrelay_relay::{InFlight, SendKind, SendRequest, SendToken};
use mcrelay_sys::xdp::{TxRefused, XskTx};
use mcrelay_wire::egress::Template;

use super::driver::Worker;

/// What an `egress = "xdp"` output brings to the worker: its AF_XDP
/// socket (bound, with a TX ring), the UMEM memfd, the frames' header and
/// the largest UDP payload the interface's MTU carries.
#[derive(Debug)]
pub struct XskOutput {
    pub socket: OwnedFd,
    pub umem: OwnedFd,
    pub header: Template,
    /// The interface's MTU less the IPv4 and UDP headers.
    pub max_payload: usize,
    /// A unicast output's next hop MAC, which the daemon's neighbour
    /// watcher may change while the flow runs; `None` for a group.
    pub next_hop: Option<Arc<NextHopMac>>,
}

/// A unicast xdp output's next hop MAC, shared between the daemon's
/// neighbour watcher (the one writer) and the worker, which reads it (one
/// relaxed load) before each frame it builds and puts a changed one into
/// its header. A plain atomic: no lock on the packet path.
#[derive(Debug, Default)]
pub struct NextHopMac(AtomicU64);

impl NextHopMac {
    pub fn new(mac: [u8; 6]) -> Self {
        Self(AtomicU64::new(Self::word(mac)))
    }

    fn word(mac: [u8; 6]) -> u64 {
        let [a, b, c, d, e, f] = mac;
        u64::from_be_bytes([0, 0, a, b, c, d, e, f])
    }

    /// Frames built from now on go to `mac`.
    pub fn set(&self, mac: [u8; 6]) {
        self.0.store(Self::word(mac), Ordering::Relaxed);
    }

    pub fn get(&self) -> [u8; 6] {
        let [_, _, a, b, c, d, e, f] = self.0.load(Ordering::Relaxed).to_be_bytes();
        [a, b, c, d, e, f]
    }
}

/// Kicks in a row that may leave frames behind before the worker stops
/// coming back early for them (about 100 ms of retries every 250 µs); the
/// frames then wait for the next flush or the loop's tick.
const RETRY_LIMIT: u32 = 400;

/// The worker's state of one xdp output. Field order is drop order: the
/// rings are unmapped before the socket closes.
pub(super) struct XskEgress {
    tx: XskTx,
    header: Template,
    max_payload: usize,
    /// See [`XskOutput::next_hop`].
    next_hop: Option<Arc<NextHopMac>>,
    /// The first kick error was logged (once per output, not per batch).
    kick_error_logged: bool,
    /// The output's counters (a driver's drop is a send error).
    counters: Arc<OutputCounters>,
    /// Frames the driver dropped after taking them (logged at close).
    driver_drops: u64,
    /// Kicks made, and those that left frames for a retry (logged at
    /// close: where frames waited).
    kicks: u64,
    kicks_left_frames: u64,
    /// Kicks in a row that left frames: past [`RETRY_LIMIT`] the loop
    /// stops coming back early for this output (a queue that never
    /// drains would otherwise keep the worker turning every 250 µs).
    left_in_a_row: u32,
    _socket: OwnedFd,
    _umem: OwnedFd,
}

impl XskEgress {
    /// Map the output's rings; `None` (logged) when they can't be: the
    /// output then drops every datagram as a send error (`ENOTCONN`).
    pub(super) fn new(
        flow: &str,
        label: &str,
        o: XskOutput,
        counters: Arc<OutputCounters>,
    ) -> Option<Self> {
        match XskTx::map(&o.socket, &o.umem, mcrelay_sys::xdp::EGRESS_GEOMETRY) {
            Ok(tx) => {
                tracing::info!(flow, output = label, "xdp egress on an AF_XDP socket");
                Some(Self {
                    tx,
                    header: o.header,
                    max_payload: o.max_payload,
                    next_hop: o.next_hop,
                    kick_error_logged: false,
                    counters,
                    driver_drops: 0,
                    kicks: 0,
                    kicks_left_frames: 0,
                    left_in_a_row: 0,
                    _socket: o.socket,
                    _umem: o.umem,
                })
            }
            Err(e) => {
                tracing::error!(
                    flow,
                    output = label,
                    "AF_XDP rings not mapped ({e}): this xdp output sends nothing"
                );
                None
            }
        }
    }

    /// Write `req`'s datagram into a UMEM frame on the TX ring: its
    /// completion's result (bytes, or a negative errno).
    fn send(&mut self, req: &SendRequest<'_>, in_flight: &InFlight) -> Option<i32> {
        let SendKind::Plain { slot } = req.kind else {
            // Never asked (the output has no GSO); the core sends the run
            // one by one when this says no.
            return None;
        };
        let payload = crate::submit::in_flight_bytes(in_flight, slot)?;
        if payload.len() > self.max_payload {
            return Some(-libc::EMSGSIZE);
        }
        if let Some(hop) = &self.next_hop {
            let mac = hop.get();
            if mac != self.header.destination_mac() {
                self.header.set_destination_mac(mac);
            }
        }
        let header = self.header;
        let mut sent = self.tx.send(|frame| header.write_frame(frame, payload));
        if sent == Err(TxRefused::Full) {
            // The ring is full: the kernel hasn't taken what earlier
            // kicks left (copy mode sends only inside `sendto`). Kick it
            // now (non-blocking; only when full, never per datagram
            // otherwise) and try once more before dropping.
            let kick = self.tx.kick();
            self.note(&kick);
            sent = self.tx.send(|frame| header.write_frame(frame, payload));
        }
        Some(match sent {
            Ok(()) => i32::try_from(payload.len()).unwrap_or(i32::MAX),
            Err(TxRefused::Full) => -libc::ENOBUFS,
            Err(TxRefused::TooLong) => -libc::EMSGSIZE,
        })
    }

    /// Count what a kick did: the driver's drops (send errors too), the
    /// kicks that left frames behind. Whether to come back soon for them.
    fn note(&mut self, kick: &mcrelay_sys::xdp::XskKick) -> bool {
        if kick.driver_drops > 0 {
            self.driver_drops += u64::from(kick.driver_drops);
            self.counters
                .drop_send_error
                .add(u64::from(kick.driver_drops));
        }
        self.kicks += 1;
        if kick.unsent {
            self.kicks_left_frames += 1;
            self.left_in_a_row = self.left_in_a_row.saturating_add(1);
        } else {
            self.left_in_a_row = 0;
        }
        kick.retry_soon() && self.left_in_a_row <= RETRY_LIMIT
    }
}

impl Drop for XskEgress {
    /// Says what the kernel made of the frames (its socket's counters),
    /// once, when the output goes: frames still in the TX ring and
    /// descriptors it refused are frames counted in `packets_out` that
    /// never left.
    fn drop(&mut self) {
        let stats = mcrelay_sys::xdp::xsk_statistics(&self._socket);
        tracing::info!(
            unsent = self.tx.unsent(),
            driver_drops = self.driver_drops,
            kicks = self.kicks,
            kicks_left_frames = self.kicks_left_frames,
            free_frames = self.tx.free_frames(),
            tx_invalid_descs = stats.as_ref().map_or(0, |s| s.tx_invalid_descs),
            tx_ring_empty_descs = stats.as_ref().map_or(0, |s| s.tx_ring_empty_descs),
            "xdp egress closed"
        );
    }
}

/// Hand `req` to its xdp output if it has one: `None` when the output is a
/// socket one, else whether it was taken (its completion queued in
/// `done`, which never grows past its capacity).
pub(super) fn submit(
    egress: Option<&mut Option<XskEgress>>,
    req: &SendRequest<'_>,
    in_flight: &InFlight,
    done: &mut Vec<(SendToken, i32)>,
) -> Option<bool> {
    let egress = egress?;
    if done.len() == done.capacity() {
        return Some(false);
    }
    let result = match egress {
        Some(x) => match x.send(req, in_flight) {
            Some(r) => r,
            None => return Some(false),
        },
        None => -libc::ENOTCONN,
    };
    done.push((req.token(), result));
    Some(true)
}

impl Worker {
    /// After a flush: finish the xdp outputs' sends in the core (their
    /// buffers go back to the pool), then kick every xdp output with
    /// frames in its TX ring.
    pub(super) fn finish_xsk_sends(&mut self) {
        if self.xsk_outputs == 0 {
            self.xsk_retry = false;
            return;
        }
        let mut i = 0;
        while let Some(&(token, result)) = self.xsk_done.get(i) {
            i += 1;
            let (mut submitter, core) = self.submitter();
            core.complete(token, result, &mut |req, inf| submitter.submit(req, inf));
        }
        self.xsk_done.clear();
        let mut retry = false;
        for flow in self.flows.iter_mut().flatten() {
            for (o, x) in flow.xsk_outputs.iter_mut().enumerate() {
                let Some(Some(x)) = x.as_mut() else {
                    continue;
                };
                if !x.tx.unsent() {
                    continue;
                }
                let kick = x.tx.kick();
                retry |= x.note(&kick);
                match kick.error {
                    Some(e)
                        if !x.kick_error_logged
                            && !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) =>
                    {
                        x.kick_error_logged = true;
                        tracing::warn!(
                            flow = %flow.name,
                            output = o,
                            "xdp egress: the kernel took no frames ({e}); they wait in the TX ring, and datagrams beyond it are dropped (send errors, ENOBUFS)"
                        );
                    }
                    Some(_) => {}
                    None => x.kick_error_logged = false,
                }
            }
        }
        self.xsk_retry = retry;
    }
}
