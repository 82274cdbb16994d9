//! What the driver keeps of a flow and of each of its legs: sockets,
//! receive state, packet ring and stream health. The relay state of the
//! same flow is the core's.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use super::FlowSockets;
use crate::ingress::IngressSocket;
use crate::packet_ring::{Layout, PacketRing, Wake};
use mcrelay_relay::OutputId;
use mcrelay_relay::fec::FecLayout;
use mcrelay_relay::{LegId, OutputSpec, Redundancy};

/// What the core takes of a new flow: `Core::add_flow`'s arguments and
/// `Core::set_intake`'s.
pub(super) struct CoreFlow {
    pub(super) outputs: Vec<OutputSpec>,
    pub(super) counters: Arc<mcrelay_relay::counters::FlowCounters>,
    pub(super) redundancy: Redundancy,
    pub(super) health: mcrelay_relay::health::HealthSettings,
    /// Per FEC socket (the receivers after the legs), its media leg.
    pub(super) fec: Vec<LegId>,
}

/// What the driver keeps of one receiver (a leg, or a leg's FEC socket)
/// of a flow: its socket, the state of its receive in the kernel and its
/// packet ring. What it receives goes to `Core::ingest`, which keeps the
/// leg's stream health.
pub(super) struct Leg {
    pub(super) fd: i32,
    /// The receive (or the packet ring's poll) is armed in the kernel.
    pub(super) armed: bool,
    /// The first receive error was logged.
    pub(super) error_logged: bool,
    /// Packet ingress: the frames' filter, checked again per frame.
    pub(super) packet: Option<mcrelay_wire::FlowMatch>,
    /// Packet ingress: frames are left in the packet ring for the next turn.
    pub(super) ring_pending: bool,
    /// Packet ingress: the mapped `TPACKET_V3` packet ring (`None` only if
    /// it could not be set up: then the leg receives nothing, logged).
    /// Unmapped before the socket closes (field order).
    pub(super) packet_ring: Option<PacketRing>,
    /// XDP ingress: the AF_XDP socket's mapped fill and RX rings and UMEM
    /// (`None` only if they could not be mapped: logged, and the leg
    /// receives nothing). Unmapped before the socket closes.
    pub(super) xsk: Option<mcrelay_sys::xdp::XskRings>,
    /// Closed when the flow goes (which leaves its group), after the packet
    /// ring no longer names its fd.
    _ingress: IngressSocket,
}

/// What the driver keeps of a flow: its legs and its output sockets. Its
/// relay state is the core's, at the same [`FlowId`].
pub(super) struct Flow {
    pub(super) name: String,
    /// Output sockets' fds, in the core's output order.
    pub(super) output_fds: Box<[i32]>,
    /// Each leg, its index its [`LegId`] (1 to [`LegId::MAX_LEGS`]),
    /// then the FEC sockets of legs with FEC (up to
    /// [`LegId::MAX_RECEIVERS`] in all).
    pub(super) legs: Box<[Leg]>,
    /// The media legs (the first `media_legs` of `legs`).
    pub(super) media_legs: u8,
    /// Kept open for as long as the io_uring may name their fds.
    _outputs: Box<[UdpSocket]>,
    /// Removed: what its sockets still held once its receives ended has
    /// been read (`Worker::drain`).
    pub(super) drained: bool,
    /// Outputs with 2022-1 FEC: the output, its column and row outputs
    /// (after the configured ones) and the matrix, for
    /// `Core::enable_fec_output` once the flow has its number.
    pub(super) fec_outputs: Vec<(OutputId, OutputId, OutputId, FecLayout)>,
    /// `latency = "low"`: counted in `Worker::busy_flows` while placed.
    pub(super) busy_poll: bool,
    /// RTCP sockets of RIST legs and outputs (`Worker::service_rist`).
    pub(super) rist: Vec<super::rist::RistRtcp>,
    /// Per output, in the core's order: `Some` for an `egress = "xdp"`
    /// one (holding its rings, or `None` when they could not be mapped),
    /// `None` for a socket one. Empty when the flow has no xdp output.
    pub(super) xsk_outputs: Box<[Option<Option<super::xsk_egress::XskEgress>>]>,
}

impl Flow {
    /// Whether a leg's packet ring is walked every `WAKE_INTERVAL`.
    pub(super) fn walks_by_interval(&self) -> bool {
        self.legs.iter().any(Leg::walks_by_interval)
    }

    /// Split a flow's sockets into the driver's part and the core's.
    pub(super) fn new(f: FlowSockets, gso: bool) -> (Self, CoreFlow) {
        let mut f = f;
        let configured = f.outputs.len();
        let legs_in = f.legs.len();
        let rist = std::mem::take(&mut f.rist)
            .into_iter()
            .filter(|s| match s.end {
                super::RistEnd::Leg(l) => l.index() < legs_in,
                super::RistEnd::Output(o) => o < configured,
            })
            .map(super::rist::RistRtcp::new)
            .collect();
        let mut fec_outputs = Vec::new();
        for fo in std::mem::take(&mut f.fec_outputs) {
            if fo.output >= configured {
                continue;
            }
            let column = f.outputs.len();
            f.outputs.push(fo.column);
            f.outputs.push(fo.row);
            let id = |i: usize| OutputId(u16::try_from(i).unwrap_or(u16::MAX));
            fec_outputs.push((id(fo.output), id(column), id(column + 1), fo.layout));
        }
        let specs = f
            .outputs
            .iter()
            .map(|o| OutputSpec {
                depth: o.queue_depth,
                gso: gso && o.xsk.is_none() && crate::sockets::supports_gso(&o.socket),
                counters: Arc::clone(&o.counters),
                resume_after: o.resume_after,
            })
            .collect();
        let output_fds = f.outputs.iter().map(|o| o.socket.as_raw_fd()).collect();
        let xsk_outputs = if f.outputs.iter().any(|o| o.xsk.is_some()) {
            f.outputs
                .iter_mut()
                .map(|o| {
                    let label = o.label.clone();
                    let counters = Arc::clone(&o.counters);
                    o.xsk
                        .take()
                        .map(|x| super::xsk_egress::XskEgress::new(&f.name, &label, x, counters))
                })
                .collect()
        } else {
            Box::default()
        };
        let media_legs = u8::try_from(f.legs.len()).unwrap_or(u8::MAX);
        let mut legs: Vec<Leg> = f
            .legs
            .into_iter()
            .enumerate()
            .map(|(i, ingress)| Leg::new(&f.name, i, ingress))
            .collect();
        let mut fec = Vec::with_capacity(f.fec.len());
        for s in f.fec {
            legs.push(Leg::new(&f.name, legs.len(), s.socket));
            fec.push(s.leg);
        }
        let flow = Self {
            name: f.name,
            output_fds,
            legs: legs.into_boxed_slice(),
            media_legs,
            _outputs: f.outputs.into_iter().map(|o| o.socket).collect(),
            drained: false,
            fec_outputs,
            busy_poll: f.busy_poll,
            rist,
            xsk_outputs,
        };
        let core = CoreFlow {
            outputs: specs,
            counters: f.counters,
            redundancy: f.redundancy,
            health: f.health,
            fec,
        };
        (flow, core)
    }

    /// Leg `leg`, if the flow has it.
    pub(super) fn leg(&self, leg: LegId) -> Option<&Leg> {
        self.legs.get(leg.index())
    }

    pub(super) fn leg_mut(&mut self, leg: LegId) -> Option<&mut Leg> {
        self.legs.get_mut(leg.index())
    }

    /// Every leg's number.
    pub(super) fn leg_ids(&self) -> impl Iterator<Item = LegId> + Clone + use<> {
        (0..u8::try_from(self.legs.len()).unwrap_or(0)).map(LegId)
    }
}

impl Leg {
    /// Frames are read from a mapped ring (packet or XDP ingress), whose
    /// poll (not a receive) is armed.
    pub(super) fn has_ring(&self) -> bool {
        self.packet_ring.is_some() || self.xsk.is_some()
    }

    /// Packet ingress on a frame-slot ring that is busy enough to be
    /// walked every `WAKE_INTERVAL` rather than woken per frame.
    pub(super) fn walks_by_interval(&self) -> bool {
        self.packet_ring
            .as_ref()
            .is_some_and(|r| r.layout() == Layout::Frames && r.wake.wake() == Wake::Interval)
    }

    fn new(flow: &str, index: usize, ingress: IngressSocket) -> Self {
        let packet_ring = ingress
            .packet_filter()
            .filter(|_| !matches!(ingress, IngressSocket::Xdp { .. }))
            .and_then(|_| match PacketRing::new(ingress.fd()) {
                Ok(ring) => {
                    match ring.layout() {
                        Layout::Blocks => tracing::info!(
                            flow,
                            leg = index,
                            blocks = ring.blocks(),
                            "packet ingress on a TPACKET_V3 ring"
                        ),
                        Layout::Frames => tracing::info!(
                            flow,
                            leg = index,
                            blocks = ring.blocks(),
                            "packet ingress on a TPACKET_V2 ring (woken per frame when idle)"
                        ),
                    }
                    Some(ring)
                }
                Err(e) => {
                    tracing::error!(
                        flow,
                        leg = index,
                        "no packet ring ({e}): this packet leg receives nothing"
                    );
                    None
                }
            });
        let xsk = ingress.xsk_rings().and_then(|r| match r {
            Ok(rings) => {
                tracing::info!(flow, leg = index, "xdp ingress on an AF_XDP socket");
                Some(rings)
            }
            Err(e) => {
                tracing::error!(
                    flow,
                    leg = index,
                    "AF_XDP rings not mapped ({e}): this xdp leg receives nothing"
                );
                None
            }
        });
        Self {
            fd: ingress.fd(),
            armed: false,
            error_logged: false,
            packet: ingress.packet_filter(),
            ring_pending: false,
            packet_ring,
            xsk,
            _ingress: ingress,
        }
    }
}
