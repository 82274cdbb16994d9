//! RIST's RTCP in the worker: the port + 1 sockets of RIST legs and
//! outputs, read and written with plain non-blocking `recv_from` and
//! `send_to` at most every [`RIST_POLL_NS`] (RTCP is a few datagrams per
//! report interval and per NACK, not the packet path; the retransmitted
//! datagrams themselves go through the core's queues and io_uring like
//! any other). What to do with RTCP is the core's (`Core::rist_tick`,
//! `Core::rist_output_rtcp`, `Core::rist_input_rtcp`).

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, UdpSocket};

use super::driver::Worker;
use super::{RistEnd, RistSocket};
use mcrelay_relay::{FlowId, OutputId, RtcpTo};

/// How often RTCP sockets are read and the RIST timers served, at most;
/// the loop waits no longer than this while a RIST flow exists.
pub(super) const RIST_POLL_NS: u64 = 2_000_000;

/// RTCP datagrams read per socket and turn, at most.
const READS: usize = 64;

/// A RIST leg's or output's RTCP socket, as the worker keeps it.
#[derive(Debug)]
pub(super) struct RistRtcp {
    pub(super) end: RistEnd,
    pub(super) buffer_ms: u32,
    socket: UdpSocket,
    /// Where RTCP goes: an output's receivers (address, port + 1), or a
    /// leg's sender once it has sent RTCP.
    peer: Option<SocketAddr>,
    /// A unicast output: RTCP is taken from this address only.
    only_from: Option<IpAddr>,
    /// Send errors (logged once).
    pub(super) send_errors: u64,
}

impl RistRtcp {
    pub(super) fn new(s: RistSocket) -> Self {
        // Non-blocking: the helper set it so; a socket opened here
        // without the helper is made so (no privilege needed).
        let _ = s.socket.set_nonblocking(true);
        let only_from = match (s.end, s.peer) {
            (RistEnd::Output(_), Some(p)) if !p.ip().is_multicast() => Some(p.ip()),
            _ => None,
        };
        Self {
            end: s.end,
            buffer_ms: s.buffer_ms,
            socket: s.socket,
            peer: s.peer,
            only_from,
            send_errors: 0,
        }
    }
}

/// The worker's RIST state: a receive buffer and when it next looks.
#[derive(Debug)]
pub(super) struct RistIo {
    buf: Box<[u8]>,
    next_ns: u64,
}

impl Default for RistIo {
    fn default() -> Self {
        Self {
            buf: vec![0; 2048].into_boxed_slice(),
            next_ns: 0,
        }
    }
}

fn output_id(i: usize) -> OutputId {
    OutputId(u16::try_from(i).unwrap_or(u16::MAX))
}

impl Worker {
    /// Read the RIST flows' RTCP, hand it to the core, serve the core's
    /// RIST timers and send the RTCP it writes; at most every
    /// [`RIST_POLL_NS`].
    pub(super) fn service_rist(&mut self) {
        if !self.core.has_rist() || self.now_ns < self.rist_io.next_ns {
            return;
        }
        self.rist_io.next_ns = self.now_ns + RIST_POLL_NS;
        let now = self.now_ns;
        let buf = &mut self.rist_io.buf;
        for (index, flow) in self.flows.iter_mut().enumerate() {
            let Some(flow) = flow.as_mut() else { continue };
            let Some(id) = FlowId::new(index) else {
                continue;
            };
            for r in flow.rist.iter_mut() {
                for _ in 0..READS {
                    let (n, from) = match r.socket.recv_from(buf) {
                        Ok(got) => got,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(_) => break,
                    };
                    let Some(d) = buf.get(..n) else { break };
                    match r.end {
                        RistEnd::Output(o) => {
                            if r.only_from.is_some_and(|ip| ip != from.ip()) {
                                continue;
                            }
                            self.core.rist_output_rtcp(id, output_id(o), now, d);
                        }
                        RistEnd::Leg(leg) => {
                            // The sender's RTCP address: NACKs go there.
                            r.peer = Some(from);
                            self.core.rist_input_rtcp(id, leg, now, d);
                        }
                    }
                }
            }
        }
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(0));
        let flows = &mut self.flows;
        let paused = self.core.rist_tick(now, unix_ns, |to, d| {
            let (f, end) = match to {
                RtcpTo::Output(f, o) => (f, RistEnd::Output(o.index())),
                RtcpTo::Leg(f, l) => (f, RistEnd::Leg(l)),
            };
            let Some(r) = flows
                .get_mut(f.index())
                .and_then(Option::as_mut)
                .and_then(|fl| fl.rist.iter_mut().find(|r| r.end == end))
            else {
                return;
            };
            let Some(peer) = r.peer else { return };
            if let Err(e) = r.socket.send_to(d, peer) {
                if r.send_errors == 0 {
                    tracing::warn!(%peer, error = %e, "RIST RTCP not sent (logged once per socket)");
                }
                r.send_errors += 1;
            }
        });
        if let Some(f) = paused {
            self.cancel_receives(f);
        }
    }
}
