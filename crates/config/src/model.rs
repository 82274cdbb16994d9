//! The validated configuration as the rest of mcrelay sees it: plain data,
//! produced only by [`crate::parse`] after every validation rule has passed.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// Default `SO_RCVBUF` request for ingress sockets (4 MiB).
pub const DEFAULT_RECEIVE_BUFFER_BYTES: u32 = 4 * 1024 * 1024;
/// Default cap on in-flight sends per output.
pub const DEFAULT_OUTPUT_QUEUE_DEPTH: u32 = 256;

/// A whole, valid configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub daemon: DaemonConfig,
    pub pools: PoolCounts,
    pub flows: FlowTable,
}

/// `[daemon]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonConfig {
    /// Unprivileged user to run as after start-up when started as root.
    pub user: String,
    pub control_socket: PathBuf,
    /// Worker CPUs; `None` = every CPU in the process's affinity mask.
    pub cores: Option<Vec<usize>>,
    pub metrics_listen: Option<SocketAddr>,
    /// One of `error`, `warn`, `info`, `debug`, `trace`.
    pub log_level: String,
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
}

/// A flow's `input`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Input {
    pub interface: String,
    /// Multicast group, or a local unicast address.
    pub address: IpAddr,
    pub port: u16,
    /// Source-specific multicast source (only with a multicast `address`).
    pub source: Option<IpAddr>,
    pub ingress: IngressKind,
    /// `SO_RCVBUF` to request for the ingress socket.
    pub receive_buffer_bytes: u32,
}

/// One of a flow's `outputs`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Output {
    pub interface: String,
    /// Multicast group or unicast host.
    pub address: IpAddr,
    pub port: u16,
    /// TTL / hop limit; 1 by default, like the kernel's multicast default.
    pub ttl: u8,
    /// Egress source IP, if set.
    pub source_address: Option<IpAddr>,
    /// Maximum sends in flight on this output before packets are dropped
    /// and counted as output backlog.
    pub queue_depth: u32,
}

/// A flow's identity: stable across restarts, platforms and Rust versions
/// (a fixed hash of the flow's name, not `DefaultHasher`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlowId(pub u64);

/// One `[[flow]]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Flow {
    pub id: FlowId,
    pub name: String,
    pub input: Input,
    pub outputs: Vec<Output>,
    /// Pin this flow to one worker core.
    pub core: Option<usize>,
}

/// The immutable, validated set of flows, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowTable {
    flows: Vec<Flow>,
}
