//! The validated configuration as the rest of mcrelay sees it: plain data,
//! produced only by [`crate::parse`] after every validation rule has passed.
//!
//! Nothing here touches the packet path: the data plane reads these values
//! once, when it builds its workers at start-up or on reload.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

pub use mcrelay_wire::health::Payload;

/// Default `SO_RCVBUF` request for ingress sockets (4 MiB).
pub const DEFAULT_RECEIVE_BUFFER_BYTES: u32 = 4 * 1024 * 1024;
/// Default cap on in-flight sends per output.
pub const DEFAULT_OUTPUT_QUEUE_DEPTH: u32 = 256;
/// Largest allowed `queue_depth`.
pub const MAX_OUTPUT_QUEUE_DEPTH: u32 = 65_536;
/// Largest allowed `receive_buffer_bytes` (`SO_RCVBUF` is a C `int`).
pub const MAX_RECEIVE_BUFFER_BYTES: u32 = 0x7fff_ffff;
/// Most workers one flow may be spread over (`spread`).
pub const MAX_SPREAD: usize = 256;
/// Default TTL / hop limit of multicast outputs (the kernel's default).
pub const DEFAULT_MULTICAST_TTL: u8 = 1;
/// Default TTL / hop limit of unicast outputs (the kernel's default).
pub const DEFAULT_UNICAST_TTL: u8 = 64;

/// Size of a `small` pool buffer in bytes.
pub const SMALL_BUFFER_BYTES: u64 = 1500;
/// Size of a `standard` pool buffer in bytes.
pub const STANDARD_BUFFER_BYTES: u64 = 4096;
/// Size of a `jumbo` pool buffer in bytes.
pub const JUMBO_BUFFER_BYTES: u64 = 9000;
/// Largest allowed count for any one pool class.
pub const MAX_POOL_COUNT: u32 = 1_000_000;
/// Upper bound on total pool memory: bytes per core x worker cores (4 GiB).
pub const MAX_TOTAL_POOL_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// Default `daemon.user`.
pub const DEFAULT_USER: &str = "mcrelay";
/// Default `daemon.control_socket`.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/mcrelay/control.sock";
/// Default `daemon.log_level`.
pub const DEFAULT_LOG_LEVEL: &str = "info";
/// Valid `daemon.log_level` values.
pub const LOG_LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];
/// Default `[pools]`.
pub const DEFAULT_POOLS: PoolCounts = PoolCounts {
    small: 1000,
    standard: 500,
    jumbo: 200,
};

/// A whole, valid configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `[daemon]`.
    pub daemon: DaemonConfig,
    /// `[pools]`.
    pub pools: PoolCounts,
    /// Every `[[flow]]`.
    pub flows: FlowTable,
}

/// `[daemon]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonConfig {
    /// Unprivileged user to run as after start-up when started as root.
    pub user: String,
    /// Path of the control socket.
    pub control_socket: PathBuf,
    /// Worker CPUs; `None` = every CPU in the process's affinity mask.
    pub cores: Option<Vec<usize>>,
    /// Optional Prometheus endpoint.
    pub metrics_listen: Option<SocketAddr>,
    /// Scraper addresses the metrics endpoint serves; `None` (the
    /// default): every address.
    pub metrics_allow: Option<Vec<Cidr>>,
    /// One of `error`, `warn`, `info`, `debug`, `trace`.
    pub log_level: String,
    /// Relay from the start, or start as a warm standby.
    pub mode: crate::Mode,
}

/// `[pools]`: buffers per class, per worker core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCounts {
    /// 1500-byte buffers.
    pub small: u32,
    /// 4096-byte buffers.
    pub standard: u32,
    /// 9000-byte buffers.
    pub jumbo: u32,
}

/// How a flow's input is received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IngressKind {
    /// A UDP socket bound to the group and port that joins the group.
    Socket,
    /// AF_PACKET capture, bypassing the kernel's reverse-path filter.
    Packet,
    /// An XDP program on the interface steering the flow's frames to an
    /// AF_XDP socket, below the kernel's IP stack (IPv4, frames up to
    /// [`MAX_XDP_FRAME`] bytes).
    Xdp,
}

/// The largest frame (Ethernet header included) `ingress = "xdp"`
/// receives: one 2048-byte UMEM frame less the kernel's 256 bytes of
/// headroom. A larger frame (a jumbo MTU) is dropped by the kernel's XDP
/// path, so the config refuses `ingress = "xdp"` on an interface whose
/// MTU says it may carry one (checked when the sockets are opened).
pub const MAX_XDP_FRAME: u32 = 1792;

/// How an output's datagrams leave (`egress` on an output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EgressKind {
    /// A connected UDP socket: the kernel's UDP/IP output path and qdisc.
    #[default]
    Socket,
    /// An AF_XDP socket bound to queue 0 of the output interface: frames
    /// built by the worker (prebuilt Ethernet/IPv4/UDP header) sent on its
    /// TX ring, skipping the kernel's UDP/IP output path and the qdisc.
    /// IPv4 outputs only. The destination MAC is a group's multicast MAC,
    /// or a unicast destination's next hop's, read from the neighbour
    /// table when the output is opened.
    Xdp,
}

/// A flow's `input`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Input {
    /// Interface to receive on.
    pub interface: String,
    /// Multicast group, or a local unicast address.
    pub address: IpAddr,
    /// UDP destination port.
    pub port: u16,
    /// Source-specific multicast source (only with a multicast `address`).
    pub source: Option<IpAddr>,
    pub ingress: IngressKind,
    /// `SO_RCVBUF` to request for the ingress socket.
    pub receive_buffer_bytes: u32,
    /// Forward error correction received beside the stream (`fec`).
    pub fec: Option<InputFec>,
    /// `protocol = "srt"`: the SRT settings; `None` for a UDP input. An
    /// SRT input has no `interface` (empty here): a listener binds
    /// `address:port`, a caller connects to it; the daemon opens it
    /// itself, never the helper.
    pub srt: Option<SrtInput>,
    /// `protocol = "rist"`: RIST simple profile (NACKs to the sender from
    /// port + 1); `None` for plain RTP/UDP.
    pub rist: Option<Rist>,
}

/// Default RIST `buffer_ms`.
pub const DEFAULT_RIST_BUFFER_MS: u32 = 1000;
/// Largest RIST `buffer_ms`.
pub const MAX_RIST_BUFFER_MS: u32 = 30_000;

/// A RIST (VSF TR-06-1 simple profile) input's or output's settings
/// (`protocol = "rist"`): RTCP on the media port + 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rist {
    /// Output: how long sent datagrams are kept for retransmission.
    /// Input: how long a gap is waited for (NACKed) before it is skipped.
    pub buffer_ms: u32,
}

/// An input's `fec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputFec {
    /// `"2022-1"`: SMPTE 2022-1 column and row FEC on the input's port + 2
    /// and + 4, same address; `L` and `D` are read from the FEC headers.
    Smpte2022_1,
}

/// One of a flow's `outputs`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Output {
    /// Interface to send on.
    pub interface: String,
    /// Multicast group or unicast host.
    pub address: IpAddr,
    /// UDP destination port.
    pub port: u16,
    /// TTL / hop limit; by default 1 for multicast and 64 for unicast
    /// outputs, like the kernel.
    pub ttl: u8,
    /// Egress source IP, if set.
    pub source_address: Option<IpAddr>,
    /// Maximum sends in flight on this output before packets are dropped
    /// and counted as output backlog.
    pub queue_depth: u32,
    /// SMPTE 2022-1 FEC sent beside the stream (`fec`).
    pub fec: Option<OutputFec>,
    /// `protocol = "srt"`: the SRT settings; `None` for a plain UDP output.
    /// An SRT output has no `interface` (empty here): a listener binds
    /// `address:port`, a caller connects to it.
    pub srt: Option<SrtOutput>,
    /// `protocol = "rist"`: RIST simple profile (retransmits what
    /// receivers NACK on port + 1); `None` for plain RTP/UDP or SRT.
    pub rist: Option<Rist>,
    /// `egress`: a UDP socket (the default) or an AF_XDP socket.
    pub egress: EgressKind,
}

/// An output's `fec = { columns = L, rows = D }`: 2022-1 column FEC to
/// port + 2 (when `rows` > 0) and row FEC to port + 4 (when `columns` >
/// 1), as ffmpeg sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OutputFec {
    /// `L`: 1-20 (2 or more for row FEC).
    pub columns: u8,
    /// `D`: 0 (row FEC only), or 4-20; `L` × `D` at most 100.
    pub rows: u8,
}

/// Default SRT `latency_ms` (libsrt's TSBPD default).
pub const DEFAULT_SRT_LATENCY_MS: u32 = 120;
/// Default SRT listener `max_callers`.
pub const DEFAULT_SRT_MAX_CALLERS: u32 = 16;
/// Largest SRT listener `max_callers`.
pub const MAX_SRT_MAX_CALLERS: u32 = 1024;
/// Largest SRT `latency_ms`.
pub const MAX_SRT_LATENCY_MS: u32 = 60_000;
/// Default SRT `key_length` in bytes (AES-128) when a passphrase is set.
pub const DEFAULT_SRT_KEY_LENGTH: u8 = 16;

/// Whether an SRT output waits for callers or calls out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SrtMode {
    /// Binds `address:port`; many callers connect (`max_callers`).
    Listener,
    /// Connects to `address:port`, reconnecting with back-off.
    Caller,
}

/// An output's SRT settings (`protocol = "srt"`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SrtOutput {
    pub mode: SrtMode,
    /// TSBPD latency in milliseconds (`SRTO_LATENCY`).
    pub latency_ms: u32,
    /// AES passphrase (10 to 79 characters); callers without it are refused.
    pub passphrase: Option<String>,
    /// AES key length in bytes: 16, 24 or 32 (only with a passphrase).
    pub key_length: u8,
    /// Most callers served at once (listener only).
    pub max_callers: u32,
    /// The stream ID a caller must present (listener), or sends (caller).
    pub stream_id: Option<String>,
}

impl fmt::Debug for SrtOutput {
    /// Never prints the passphrase.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SrtOutput")
            .field("mode", &self.mode)
            .field("latency_ms", &self.latency_ms)
            .field("passphrase", &self.passphrase.as_ref().map(|_| "<set>"))
            .field("key_length", &self.key_length)
            .field("max_callers", &self.max_callers)
            .field("stream_id", &self.stream_id)
            .finish()
    }
}

/// An input's SRT settings (`protocol = "srt"` on `input` or a leg of
/// `inputs`): one SRT connection whose datagrams feed the flow.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SrtInput {
    /// Listener: waits for one caller at a time (a second one is refused);
    /// caller: connects out, reconnecting with back-off.
    pub mode: SrtMode,
    /// TSBPD latency in milliseconds (`SRTO_LATENCY`).
    pub latency_ms: u32,
    /// AES passphrase (10 to 79 characters); a peer without it is refused.
    pub passphrase: Option<String>,
    /// AES key length in bytes: 16, 24 or 32 (only with a passphrase).
    pub key_length: u8,
    /// The stream ID a caller must present (listener), or sends (caller).
    pub stream_id: Option<String>,
}

impl fmt::Debug for SrtInput {
    /// Never prints the passphrase.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SrtInput")
            .field("mode", &self.mode)
            .field("latency_ms", &self.latency_ms)
            .field("passphrase", &self.passphrase.as_ref().map(|_| "<set>"))
            .field("key_length", &self.key_length)
            .field("stream_id", &self.stream_id)
            .finish()
    }
}

impl SrtInput {
    /// The same settings as an SRT output's, serving one peer: what the
    /// SRT thread applies to a socket.
    pub fn as_output(&self) -> SrtOutput {
        SrtOutput {
            mode: self.mode,
            latency_ms: self.latency_ms,
            passphrase: self.passphrase.clone(),
            key_length: self.key_length,
            max_callers: 1,
            stream_id: self.stream_id.clone(),
        }
    }
}

/// What a flow carries, for stream health (`payload`, `silence_ms`,
/// `rtp_clock_hz` in a `[[flow]]`): the relay core's own settings type.
pub use mcrelay_wire::health::HealthSettings as Health;
pub use mcrelay_wire::health::{DEFAULT_RTP_CLOCK_HZ, DEFAULT_SILENCE_MS};

/// Largest `silence_ms` (one day).
pub const MAX_SILENCE_MS: u32 = 86_400_000;
/// Largest `rtp_clock_hz`.
pub const MAX_RTP_CLOCK_HZ: u32 = 1_000_000_000;

/// Most legs (`inputs`) a flow may have.
pub const MAX_LEGS: usize = 4;
/// Default `merge_delay_ms`.
pub const DEFAULT_MERGE_DELAY_MS: u32 = 0;
/// Default `merge_window_ms`.
pub const DEFAULT_MERGE_WINDOW_MS: u32 = 50;
/// Largest `merge_window_ms` (and `merge_delay_ms`).
pub const MAX_MERGE_WINDOW_MS: u32 = 1000;
/// Default `failover_after_ms`.
pub const DEFAULT_FAILOVER_AFTER_MS: u32 = 100;
/// Largest `failover_after_ms` (one hour).
pub const MAX_FAILOVER_AFTER_MS: u32 = 3_600_000;
/// Default `failover_gap_factor`.
pub const DEFAULT_FAILOVER_GAP_FACTOR: u32 = 4;
/// Largest `failover_gap_factor`.
pub const MAX_FAILOVER_GAP_FACTOR: u32 = 100;
/// Default `revert_after_s`.
pub const DEFAULT_REVERT_AFTER_S: u32 = 10;
/// Largest `revert_after_s` (one day).
pub const MAX_REVERT_AFTER_S: u32 = 86_400;

/// How a flow with several legs combines them (`redundancy` and its
/// settings in a `[[flow]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Redundancy {
    /// One leg (`input`): nothing to combine.
    Single,
    /// `redundancy = "merge"` (SMPTE 2022-7): each RTP sequence number is
    /// forwarded once, its first copy from any leg.
    Merge {
        /// `merge_delay_ms`: 0 forwards each first copy at once; N holds
        /// packets up to N ms so the output leaves in sequence order.
        delay_ms: u32,
        /// `merge_window_ms`: a number no leg delivered within this long
        /// counts as lost.
        window_ms: u32,
    },
    /// `redundancy = "failover"`: forward from the first healthy leg in
    /// list order.
    Failover {
        /// `failover_after_ms`: a leg silent this long is unhealthy (the
        /// floor of the detection time when `gap_factor` is set).
        after_ms: u32,
        /// `failover_gap_factor`: a leg is unhealthy once silent for this
        /// many times its recent longest gap between datagrams, if that is
        /// longer than `after_ms`; 0 = `after_ms` alone.
        gap_factor: u32,
        /// `revert_after_s`: return to a higher-priority leg once it has
        /// been healthy this long; 0 = never.
        revert_after_s: u32,
        /// `rtp_rewrite`: the output is one RTP stream (one SSRC,
        /// continuous sequence numbers and timestamps) whichever leg it
        /// comes from. Needs an RTP payload.
        rtp_rewrite: bool,
    },
}

impl Redundancy {
    /// `"single"`, `"merge"` or `"failover"`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Redundancy::Single => "single",
            Redundancy::Merge { .. } => "merge",
            Redundancy::Failover { .. } => "failover",
        }
    }
}

impl fmt::Display for Redundancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A flow's identity: stable across restarts, platforms and Rust versions
/// (a fixed hash of the flow's name, not `DefaultHasher`). Named apart
/// from the relay core's `FlowId`, which is the flow's slot in one worker
/// (a small index reused after removal), not an identity.
///
/// The value is the 64-bit FNV-1a hash of the UTF-8 bytes of the flow name:
/// start with `0xcbf29ce484222325`; for each byte, XOR it in, then multiply
/// by `0x100000001b3` (wrapping). Renaming a flow therefore gives it a new
/// identity; changing anything else keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlowKey(pub u64);

/// One `[[flow]]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Flow {
    /// `FlowKey::from_name(&name)`.
    pub id: FlowKey,
    /// Unique, non-empty name.
    pub name: String,
    /// Where packets come from: one leg, or 2 to [`MAX_LEGS`] legs
    /// (`inputs`) carrying copies of one stream; never empty.
    pub inputs: Vec<Input>,
    /// How the legs are combined; [`Redundancy::Single`] exactly when
    /// there is one leg.
    pub redundancy: Redundancy,
    /// Where each packet is sent; never empty.
    pub outputs: Vec<Output>,
    /// Pin this flow to one worker core.
    pub core: Option<usize>,
    /// How many workers serve its outputs (1 to [`MAX_SPREAD`], at most
    /// its outputs; more than 1 only without `core`): each joins the input
    /// on its own socket and sends to outputs `k`, `k + spread`, ... (shard
    /// `k`).
    pub spread: usize,
    /// What its datagrams carry and how their health is judged.
    pub health: Health,
    /// `latency`: whether its worker sleeps between packets.
    pub latency: Latency,
}

/// A flow's `latency`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Latency {
    /// `"normal"`: the worker sleeps in the kernel until a packet or a
    /// timer wakes it.
    #[default]
    Normal,
    /// `"low"`: the worker that serves the flow never sleeps; it polls its
    /// io_uring and rings without waiting, spending its whole core to
    /// save the wake-up (several µs) per packet, for every ingress.
    Low,
}

impl FlowKey {
    /// The identity of the flow called `name` (64-bit FNV-1a of its bytes).
    pub const fn from_name(name: &str) -> Self {
        let bytes = name.as_bytes();
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut i = 0;
        while i < bytes.len() {
            hash ^= bytes[i] as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            i += 1;
        }
        FlowKey(hash)
    }
}

impl fmt::Display for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Display for IngressKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IngressKind::Socket => "socket",
            IngressKind::Packet => "packet",
            IngressKind::Xdp => "xdp",
        })
    }
}

impl Flow {
    /// The outputs the helper opens (plain UDP), in config order; SRT
    /// outputs are the daemon's own.
    pub fn udp_outputs(&self) -> impl Iterator<Item = &Output> {
        self.outputs.iter().filter(|o| o.srt.is_none())
    }

    /// The shard (of [`Flow::spread`]) that sends to output `output`:
    /// `output mod spread`.
    pub fn shard_of(&self, output: usize) -> usize {
        output % self.spread.max(1)
    }

    /// The first (for failover: the primary) leg.
    ///
    /// # Panics
    ///
    /// On a hand-built flow with no input: a parsed flow, like every flow
    /// in a [`FlowTable`] ([`FlowTable::new`] refuses one without), has at
    /// least one. (Used by tests; the daemon walks `inputs`.)
    pub fn primary(&self) -> &Input {
        &self.inputs[0]
    }

    /// The legs the helper opens (UDP and packet ingress), in config
    /// order; SRT legs are the daemon's own.
    pub fn udp_inputs(&self) -> impl Iterator<Item = &Input> {
        self.inputs.iter().filter(|i| i.srt.is_none())
    }

    /// Every socket the helper opens for the flow to receive on: its UDP
    /// legs (not SRT ones, the daemon's own) in order, then for each leg
    /// with `fec = "2022-1"` (in leg order) its column and row FEC ports
    /// (port + 2 and + 4, same address, interface and source), then for
    /// each RIST leg (in leg order) its RTCP port (port + 1).
    pub fn receive_inputs(&self) -> Vec<Input> {
        let mut all: Vec<Input> = self.udp_inputs().cloned().collect();
        for input in &self.inputs {
            if input.fec == Some(InputFec::Smpte2022_1) {
                for offset in [2, 4] {
                    all.push(Input {
                        port: input.port.saturating_add(offset),
                        fec: None,
                        rist: None,
                        ..input.clone()
                    });
                }
            }
        }
        for input in &self.inputs {
            if input.rist.is_some() {
                all.push(Input {
                    port: input.port.saturating_add(1),
                    fec: None,
                    rist: None,
                    ..input.clone()
                });
            }
        }
        all
    }

    /// Every socket the helper opens for the flow to send on: its UDP
    /// outputs (not SRT ones, the daemon's own) in order, then for
    /// each output with `fec` (in output order) its column and row FEC
    /// destinations (port + 2 and + 4, same address and settings), then
    /// for each RIST output (in output order) its RTCP destination, the
    /// port + 1 (sender reports go out and the receivers' NACKs come back
    /// on it). SRT outputs in between change none of this: the daemon
    /// maps each extra socket to its output by config index.
    pub fn send_outputs(&self) -> Vec<Output> {
        let mut all: Vec<Output> = self.udp_outputs().cloned().collect();
        for o in &self.outputs {
            if o.fec.is_some() {
                for offset in [2, 4] {
                    all.push(Output {
                        port: o.port.saturating_add(offset),
                        fec: None,
                        rist: None,
                        ..o.clone()
                    });
                }
            }
        }
        for o in &self.outputs {
            if o.rist.is_some() {
                all.push(Output {
                    port: o.port.saturating_add(1),
                    fec: None,
                    rist: None,
                    ..o.clone()
                });
            }
        }
        all
    }

    /// The interfaces the flow needs up: every UDP leg's and every UDP
    /// output's, in that order (with repeats); SRT ones name none.
    pub fn interfaces(&self) -> impl Iterator<Item = &str> {
        self.udp_inputs()
            .map(|i| i.interface.as_str())
            .chain(self.udp_outputs().map(|o| o.interface.as_str()))
    }
}

impl Input {
    /// The input's socket address (group or local address, and port).
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }

    /// Whether `address` is a multicast group.
    pub fn is_multicast(&self) -> bool {
        self.address.is_multicast()
    }
}

impl fmt::Display for Input {
    /// `eth0 239.1.1.1:5000`, with ` from 10.1.1.1` for SSM inputs, or
    /// `srt listener 0.0.0.0:9000 stream_id "a"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(s) = &self.srt {
            let mode = match s.mode {
                SrtMode::Listener => "listener",
                SrtMode::Caller => "caller",
            };
            write!(f, "srt {mode} {}", self.socket_addr())?;
            if let Some(id) = &s.stream_id {
                write!(f, " stream_id {id:?}")?;
            }
            return Ok(());
        }
        write!(f, "{} {}", self.interface, self.socket_addr())?;
        if let Some(source) = self.source {
            write!(f, " from {source}")?;
        }
        Ok(())
    }
}

impl Output {
    /// The output's destination socket address.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }
}

impl fmt::Display for Output {
    /// `eth1 239.2.2.2:6000`, or `srt listener 0.0.0.0:9000 stream_id "a"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.srt {
            None => write!(f, "{} {}", self.interface, self.socket_addr()),
            Some(s) => {
                let mode = match s.mode {
                    SrtMode::Listener => "listener",
                    SrtMode::Caller => "caller",
                };
                write!(f, "srt {mode} {}", self.socket_addr())?;
                if let Some(id) = &s.stream_id {
                    write!(f, " stream_id {id:?}")?;
                }
                Ok(())
            }
        }
    }
}

/// An address range in CIDR notation (`daemon.metrics_allow`): an
/// address and how many of its leading bits a peer must share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The range's first address (no bits set past `prefix`).
    pub address: IpAddr,
    /// 0 to 32 (IPv4) or 0 to 128 (IPv6).
    pub prefix: u8,
}

impl Cidr {
    /// `"10.0.0.0/8"`, `"fd00::/8"`, or a bare address (the host alone).
    /// The error says what is wrong, for the config's message.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let address: IpAddr = addr
            .parse()
            .map_err(|_| {
                format!("{addr:?} is not an IP address; write a range such as \"10.0.0.0/8\" or one address such as \"127.0.0.1\"")
            })?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("prefix length {p:?} is not 0 to {max}")),
            },
        };
        let cidr = Cidr { address, prefix };
        if cidr.network() != address {
            return Err(format!(
                "{address}/{prefix} has bits set past the prefix; write {}/{prefix}",
                cidr.network()
            ));
        }
        Ok(cidr)
    }

    /// `address` with the bits past the prefix cleared.
    fn network(&self) -> IpAddr {
        match self.address {
            IpAddr::V4(a) => IpAddr::V4((u32::from(a) & mask32(self.prefix)).into()),
            IpAddr::V6(a) => IpAddr::V6((u128::from(a) & mask128(self.prefix)).into()),
        }
    }

    /// `ip` is in the range. An IPv4 peer seen on an IPv6 socket
    /// (`::ffff:10.1.2.3`) is matched as the IPv4 address it is.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                u32::from(ip) & mask32(self.prefix) == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }
}

fn mask32(prefix: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(prefix.min(128)))
        .unwrap_or(0)
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            user: DEFAULT_USER.to_owned(),
            control_socket: PathBuf::from(DEFAULT_CONTROL_SOCKET),
            cores: None,
            metrics_listen: None,
            metrics_allow: None,
            log_level: DEFAULT_LOG_LEVEL.to_owned(),
            mode: crate::Mode::Active,
        }
    }
}

impl Default for PoolCounts {
    fn default() -> Self {
        DEFAULT_POOLS
    }
}

impl PoolCounts {
    /// Bytes of buffer memory one worker core's pools take.
    pub const fn bytes_per_core(&self) -> u64 {
        self.small as u64 * SMALL_BUFFER_BYTES
            + self.standard as u64 * STANDARD_BUFFER_BYTES
            + self.jumbo as u64 * JUMBO_BUFFER_BYTES
    }
}

/// Formats a byte count as MiB with one decimal, e.g. `5.1 MiB`.
pub(crate) fn fmt_mib(bytes: u64) -> String {
    // Tenths of a MiB, rounded to nearest; integer maths keeps it exact.
    let tenths = (bytes * 10 + 512 * 1024) / (1024 * 1024);
    format!("{}.{} MiB", tenths / 10, tenths % 10)
}

pub(crate) fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

impl Config {
    /// Total number of outputs over all flows.
    pub fn output_count(&self) -> usize {
        self.flows.iter().map(|f| f.outputs.len()).sum()
    }

    /// The one-line summary `mcrelayd check` prints for a valid file, e.g.
    /// `ok: 2 flows, 3 outputs, cores [2, 3], pool memory 5.1 MiB per core
    /// (1000 small, 500 standard, 200 jumbo)`.
    pub fn summary(&self) -> String {
        let flows = if self.flows.is_empty() {
            "0 flows (the daemon will idle until a reload adds one)".to_owned()
        } else {
            plural(self.flows.len(), "flow")
        };
        let cores = match &self.daemon.cores {
            Some(cores) => format!("cores {cores:?}"),
            None => "cores: all CPUs in the affinity mask".to_owned(),
        };
        // Flows that read their payload, by mode: "; stream health on 2
        // flows (1 rtp, 1 rtp-mpegts)". Nothing when every flow is "udp".
        let modes: Vec<String> = Payload::ALL[1..]
            .iter()
            .filter_map(|&p| {
                let n = self.flows.iter().filter(|f| f.health.payload == p).count();
                (n > 0).then(|| format!("{n} {p}"))
            })
            .collect();
        let health_flows = self
            .flows
            .iter()
            .filter(|f| f.health.payload != Payload::Udp)
            .count();
        let health = if health_flows == 0 {
            String::new()
        } else {
            format!(
                "; stream health on {} ({})",
                plural(health_flows, "flow"),
                modes.join(", ")
            )
        };
        // "; redundancy on 2 flows (1 merge, 1 failover)", when any.
        let merge = self
            .flows
            .iter()
            .filter(|f| matches!(f.redundancy, Redundancy::Merge { .. }))
            .count();
        let failover = self
            .flows
            .iter()
            .filter(|f| matches!(f.redundancy, Redundancy::Failover { .. }))
            .count();
        let redundancy = match (merge, failover) {
            (0, 0) => String::new(),
            _ => format!(
                "; redundancy on {} ({merge} merge, {failover} failover)",
                plural(merge + failover, "flow")
            ),
        };
        format!(
            "ok: {flows}, {outputs}, {cores}, pool memory {mem} per core ({s} small, {st} standard, {j} jumbo){health}{redundancy}",
            outputs = plural(self.output_count(), "output"),
            mem = fmt_mib(self.pools.bytes_per_core()),
            s = self.pools.small,
            st = self.pools.standard,
            j = self.pools.jumbo,
        )
    }
}

/// The immutable, validated set of flows, sorted by name.
///
/// Names are unique and every flow's `id` is `FlowKey::from_name(&name)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowTable {
    flows: Vec<Flow>,
    /// `(id, index into flows)`, sorted by id, for [`FlowTable::get`].
    by_id: Vec<(FlowKey, usize)>,
}

/// Why [`FlowTable::new`] refused a set of flows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlowTableError {
    /// Two flows have the same name.
    #[error("duplicate flow name {0:?}")]
    DuplicateName(String),
    /// Two different names hash to the same [`FlowKey`].
    #[error("flows {0:?} and {1:?} have the same flow id")]
    IdCollision(String, String),
    /// A flow's `id` is not `FlowKey::from_name(&name)`.
    #[error("flow {0:?} has id {1}, expected {2}")]
    WrongId(String, FlowKey, FlowKey),
    /// A flow with no input, more than [`MAX_LEGS`], or a redundancy that
    /// doesn't fit its number of legs.
    #[error("flow {0:?} has {1} inputs with redundancy {2}")]
    BadLegs(String, usize, Redundancy),
}

impl FlowTable {
    /// Builds a table from flows in any order. Used by [`crate::parse`]
    /// after validation, and by tests elsewhere that need a table without
    /// writing TOML. Only checks the table's own invariants (unique names,
    /// correct ids), not the per-flow validation rules.
    pub fn new(mut flows: Vec<Flow>) -> Result<Self, FlowTableError> {
        flows.sort_by(|a, b| a.name.cmp(&b.name));
        for w in flows.windows(2) {
            if w[0].name == w[1].name {
                return Err(FlowTableError::DuplicateName(w[0].name.clone()));
            }
        }
        for f in &flows {
            let legs = f.inputs.len();
            let single = matches!(f.redundancy, Redundancy::Single);
            if legs == 0 || legs > MAX_LEGS || single != (legs == 1) {
                return Err(FlowTableError::BadLegs(f.name.clone(), legs, f.redundancy));
            }
            let expected = FlowKey::from_name(&f.name);
            if f.id != expected {
                return Err(FlowTableError::WrongId(f.name.clone(), f.id, expected));
            }
        }
        let mut by_id: Vec<(FlowKey, usize)> =
            flows.iter().enumerate().map(|(i, f)| (f.id, i)).collect();
        by_id.sort_unstable();
        for w in by_id.windows(2) {
            if w[0].0 == w[1].0 {
                return Err(FlowTableError::IdCollision(
                    flows[w[0].1].name.clone(),
                    flows[w[1].1].name.clone(),
                ));
            }
        }
        Ok(FlowTable { flows, by_id })
    }

    /// The flows, sorted by name.
    pub fn iter(&self) -> std::slice::Iter<'_, Flow> {
        self.flows.iter()
    }

    /// The flows as a slice, sorted by name.
    pub fn as_slice(&self) -> &[Flow] {
        &self.flows
    }

    /// Number of flows.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// Whether there are no flows (a daemon waiting for a reload).
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// The flow with this id.
    pub fn get(&self, id: FlowKey) -> Option<&Flow> {
        let i = self.by_id.binary_search_by_key(&id, |&(id, _)| id).ok()?;
        self.flows.get(self.by_id[i].1)
    }

    /// The flow with this name.
    pub fn by_name(&self, name: &str) -> Option<&Flow> {
        let i = self
            .flows
            .binary_search_by(|f| f.name.as_str().cmp(name))
            .ok()?;
        self.flows.get(i)
    }

    /// What changes going from `self` (running) to `newer` (just loaded).
    ///
    /// Flows are matched by id (that is, by name). A flow present in both
    /// whose inputs (its legs, in order), redundancy, outputs, core, spread
    /// or health settings differ is `changed`; the data plane
    /// restarts it, while `unchanged` flows keep running untouched. Each list
    /// is in name order.
    pub fn diff(&self, newer: &FlowTable) -> FlowDiff {
        let mut d = FlowDiff::default();
        for f in &self.flows {
            match newer.get(f.id) {
                None => d.removed.push(f.id),
                Some(n) if n == f => d.unchanged.push(f.id),
                Some(_) => d.changed.push(f.id),
            }
        }
        for n in &newer.flows {
            if self.get(n.id).is_none() {
                d.added.push(n.id);
            }
        }
        d
    }
}

impl<'a> IntoIterator for &'a FlowTable {
    type Item = &'a Flow;
    type IntoIter = std::slice::Iter<'a, Flow>;

    fn into_iter(self) -> Self::IntoIter {
        self.flows.iter()
    }
}

/// The result of [`FlowTable::diff`]: every flow of either table is in
/// exactly one list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowDiff {
    /// In the newer table only: start these.
    pub added: Vec<FlowKey>,
    /// In the older table only: stop these.
    pub removed: Vec<FlowKey>,
    /// In both, with different inputs, redundancy, outputs, core or
    /// health: restart these.
    pub changed: Vec<FlowKey>,
    /// In both and identical: leave these alone.
    pub unchanged: Vec<FlowKey>,
}

impl FlowDiff {
    /// Whether the two tables had exactly the same flows.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn cidr_ranges_parse_and_match_as_written() {
        let net = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(net.contains("10.200.1.2".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        // A dual-stack socket sees an IPv4 peer as IPv4-mapped IPv6.
        assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!net.contains("fd00::1".parse().unwrap()));
        let host = Cidr::parse("127.0.0.1").unwrap();
        assert_eq!(host.to_string(), "127.0.0.1/32");
        assert!(host.contains("127.0.0.1".parse().unwrap()));
        assert!(!host.contains("127.0.0.2".parse().unwrap()));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        assert!(
            Cidr::parse("::/0")
                .unwrap()
                .contains("2001:db8::1".parse().unwrap())
        );
        for (bad, why) in [
            ("10.1.2.3/8", "write 10.0.0.0/8"),
            ("10.0.0.0/33", "not 0 to 32"),
            ("fd00::/129", "not 0 to 128"),
            ("10.0.0.0/", "not 0 to 32"),
            ("localhost", "not an IP address"),
            ("", "not an IP address"),
        ] {
            let err = Cidr::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
    use super::*;

    fn flow(name: &str, port: u16) -> Flow {
        Flow {
            id: FlowKey::from_name(name),
            name: name.to_owned(),
            inputs: vec![Input {
                interface: "eth0".into(),
                address: "239.1.1.1".parse().unwrap(),
                port,
                source: None,
                ingress: IngressKind::Socket,
                receive_buffer_bytes: DEFAULT_RECEIVE_BUFFER_BYTES,
                fec: None,
                srt: None,
                rist: None,
            }],
            redundancy: Redundancy::Single,
            outputs: vec![Output {
                egress: Default::default(),
                interface: "eth1".into(),
                address: "239.2.2.2".parse().unwrap(),
                port: 6000,
                ttl: 1,
                source_address: None,
                queue_depth: DEFAULT_OUTPUT_QUEUE_DEPTH,
                fec: None,
                rist: None,
                srt: None,
            }],
            core: None,
            spread: 1,
            health: Health::default(),
            latency: Latency::Normal,
        }
    }

    #[test]
    fn flow_id_is_fnv1a_64() {
        // Published FNV-1a 64-bit test vectors: these values must never change.
        assert_eq!(FlowKey::from_name(""), FlowKey(0xcbf2_9ce4_8422_2325));
        assert_eq!(FlowKey::from_name("a"), FlowKey(0xaf63_dc4c_8601_ec8c));
        assert_eq!(FlowKey::from_name("foobar"), FlowKey(0x8594_4171_f739_67e8));
        assert_eq!(FlowKey::from_name("camera-1").to_string().len(), 16);
    }

    #[test]
    fn table_is_sorted_and_searchable() {
        let t = FlowTable::new(vec![flow("b", 2), flow("c", 3), flow("a", 1)]).unwrap();
        let names: Vec<&str> = t.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(t.len(), 3);
        assert!(!t.is_empty());
        assert_eq!(t.get(FlowKey::from_name("c")).unwrap().primary().port, 3);
        assert_eq!(t.by_name("b").unwrap().primary().port, 2);
        assert!(t.get(FlowKey::from_name("d")).is_none());
        assert!(t.by_name("d").is_none());
        assert_eq!((&t).into_iter().count(), 3);
        assert!(FlowTable::default().is_empty());
    }

    #[test]
    fn table_rejects_broken_invariants() {
        assert_eq!(
            FlowTable::new(vec![flow("a", 1), flow("a", 2)]),
            Err(FlowTableError::DuplicateName("a".into()))
        );
        let mut f = flow("a", 1);
        f.id = FlowKey(7);
        assert!(matches!(
            FlowTable::new(vec![f]),
            Err(FlowTableError::WrongId(..))
        ));
    }

    #[test]
    fn diff_classifies_every_flow() {
        let old = FlowTable::new(vec![flow("keep", 1), flow("edit", 2), flow("drop", 3)]).unwrap();
        let mut edited = flow("edit", 2);
        edited.outputs[0].ttl = 9;
        let new = FlowTable::new(vec![flow("keep", 1), edited, flow("new", 4)]).unwrap();
        let d = old.diff(&new);
        assert_eq!(d.added, [FlowKey::from_name("new")]);
        assert_eq!(d.removed, [FlowKey::from_name("drop")]);
        assert_eq!(d.changed, [FlowKey::from_name("edit")]);
        assert_eq!(d.unchanged, [FlowKey::from_name("keep")]);
        assert!(!d.is_empty());
        let same = old.diff(&old.clone());
        assert!(same.is_empty());
        assert_eq!(same.unchanged.len(), 3);
        // A changed core alone is a change too.
        let mut pinned = flow("keep", 1);
        pinned.core = Some(3);
        let d = old.diff(&FlowTable::new(vec![pinned]).unwrap());
        assert_eq!(d.changed, [FlowKey::from_name("keep")]);
        assert_eq!(d.removed.len(), 2);
        // So is each health setting.
        for edit in [
            |h: &mut Health| h.payload = Payload::RtpMpegts,
            |h: &mut Health| h.silence_ms = 5,
            |h: &mut Health| h.rtp_clock_hz = 48_000,
        ] {
            let mut f = flow("keep", 1);
            edit(&mut f.health);
            let d = old.diff(&FlowTable::new(vec![f]).unwrap());
            assert_eq!(d.changed, [FlowKey::from_name("keep")]);
        }
        // A leg added, removed or reordered, or another redundancy, is a
        // change too.
        let mut two = flow("keep", 1);
        let mut backup = two.inputs[0].clone();
        backup.interface = "eth2".into();
        two.inputs.push(backup);
        two.redundancy = Redundancy::Failover {
            after_ms: 100,
            revert_after_s: 10,
            rtp_rewrite: false,
            gap_factor: 4,
        };
        let t2 = FlowTable::new(vec![two.clone()]).unwrap();
        assert_eq!(old.diff(&t2).changed, [FlowKey::from_name("keep")]);
        assert_eq!(t2.diff(&old).changed, [FlowKey::from_name("keep")]);
        let mut swapped = two.clone();
        swapped.inputs.reverse();
        let t3 = FlowTable::new(vec![swapped]).unwrap();
        assert_eq!(t2.diff(&t3).changed, [FlowKey::from_name("keep")]);
        let mut merged = two;
        merged.redundancy = Redundancy::Merge {
            delay_ms: 0,
            window_ms: 50,
        };
        let t4 = FlowTable::new(vec![merged]).unwrap();
        assert_eq!(t2.diff(&t4).changed, [FlowKey::from_name("keep")]);
        assert!(t4.diff(&t4.clone()).is_empty());
    }

    #[test]
    fn table_rejects_legs_that_do_not_fit_the_redundancy() {
        let mut none = flow("a", 1);
        none.inputs.clear();
        assert!(matches!(
            FlowTable::new(vec![none]),
            Err(FlowTableError::BadLegs(_, 0, Redundancy::Single))
        ));
        let mut two_single = flow("a", 1);
        two_single.inputs.push(two_single.inputs[0].clone());
        assert!(FlowTable::new(vec![two_single.clone()]).is_err());
        let mut one_merge = flow("a", 1);
        one_merge.redundancy = Redundancy::Merge {
            delay_ms: 0,
            window_ms: 50,
        };
        assert!(FlowTable::new(vec![one_merge]).is_err());
        let mut five = two_single;
        five.redundancy = Redundancy::Failover {
            after_ms: 1,
            revert_after_s: 0,
            rtp_rewrite: false,
            gap_factor: 4,
        };
        five.inputs = vec![five.inputs[0].clone(); 5];
        assert!(FlowTable::new(vec![five.clone()]).is_err());
        five.inputs.truncate(4);
        assert!(FlowTable::new(vec![five]).is_ok());
    }

    #[test]
    fn pool_memory() {
        assert_eq!(
            DEFAULT_POOLS.bytes_per_core(),
            1000 * 1500 + 500 * 4096 + 200 * 9000
        );
        assert_eq!(fmt_mib(DEFAULT_POOLS.bytes_per_core()), "5.1 MiB");
        assert_eq!(fmt_mib(0), "0.0 MiB");
        assert_eq!(fmt_mib(1024 * 1024), "1.0 MiB");
        assert_eq!(fmt_mib(MAX_TOTAL_POOL_BYTES), "4096.0 MiB");
    }

    #[test]
    fn summary_line() {
        let config = Config {
            daemon: DaemonConfig {
                cores: Some(vec![2, 3]),
                ..DaemonConfig::default()
            },
            pools: PoolCounts::default(),
            flows: FlowTable::new(vec![flow("a", 1), flow("b", 2)]).unwrap(),
        };
        assert_eq!(
            config.summary(),
            "ok: 2 flows, 2 outputs, cores [2, 3], pool memory 5.1 MiB per core (1000 small, 500 standard, 200 jumbo)"
        );
        let one = Config {
            flows: FlowTable::new(vec![flow("a", 1)]).unwrap(),
            ..config
        };
        assert!(one.summary().starts_with("ok: 1 flow, 1 output, "));
        let mut rtp = flow("b", 2);
        rtp.health.payload = Payload::Rtp;
        let mut ts = flow("c", 3);
        ts.health.payload = Payload::RtpMpegts;
        let mixed = Config {
            flows: FlowTable::new(vec![flow("a", 1), rtp, ts]).unwrap(),
            ..one
        };
        assert!(
            mixed
                .summary()
                .ends_with(" jumbo); stream health on 2 flows (1 rtp, 1 rtp-mpegts)"),
            "{}",
            mixed.summary()
        );
        let mut legs = flow("d", 4);
        legs.inputs.push(legs.inputs[0].clone());
        legs.redundancy = Redundancy::Failover {
            after_ms: 100,
            revert_after_s: 10,
            rtp_rewrite: false,
            gap_factor: 4,
        };
        let redundant = Config {
            flows: FlowTable::new(vec![flow("a", 1), legs]).unwrap(),
            ..mixed
        };
        assert!(
            redundant
                .summary()
                .ends_with(" jumbo); redundancy on 1 flow (0 merge, 1 failover)"),
            "{}",
            redundant.summary()
        );
    }

    #[test]
    fn displays() {
        let f = flow("a", 5000);
        assert_eq!(f.primary().to_string(), "eth0 239.1.1.1:5000");
        assert_eq!(f.outputs[0].to_string(), "eth1 239.2.2.2:6000");
        let mut v6 = f.primary().clone();
        v6.address = "ff3e::1".parse().unwrap();
        v6.source = Some("2001:db8::1".parse().unwrap());
        assert_eq!(v6.to_string(), "eth0 [ff3e::1]:5000 from 2001:db8::1");
        assert_eq!(IngressKind::Packet.to_string(), "packet");
    }
}
