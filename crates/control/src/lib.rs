//! The pure part of mcrelay's control plane: the versioned JSON-lines
//! protocol spoken on the daemon's control socket, the [`Snapshot`] of
//! everything an operator can see, rates between two snapshots, the tables
//! `mcrelayctl` prints and the Prometheus text the daemon exposes.
//!
//! Where it sits: on the control plane, never on the packet path. The daemon
//! reads its workers' lock-free counters (pool, flow, output and loop
//! counters) into a [`Snapshot`] and answers each [`Request`] itself; this
//! crate parses the requests ([`parse_request`]), turns snapshots into
//! tables ([`render_flows`]), into the
//! bounded [`Summary`] that `status` answers with, and into
//! metrics ([`render_metrics`], or OpenMetrics through [`render_metrics_as`]). Which number is a total, a
//! high-water mark or a gauge, and its Prometheus name, is one table,
//! [`counters`], that the reload carry and the exposition both follow. `mcrelayctl` uses the same types to encode
//! requests and decode replies, through the one control-socket client both
//! share ([`client::ask`]). Apart from that client the crate opens no
//! sockets, reads no clock and does no I/O, so every piece is unit-tested
//! without a daemon; the socket loop feeds received bytes through a
//! fixed-size [`LineReader`].
//!
//! Everything that parses bytes from the socket ([`LineReader`],
//! [`parse_request`]) is fuzzed through [`fuzz_request`].
#![deny(unsafe_code)]

mod carry;
pub mod client;
#[cfg(feature = "cli")]
pub mod completions;
pub mod counters;
mod framing;
mod fuzz;
mod mode;
mod prometheus;
mod protocol;
mod rates;
mod render;
pub mod roff;
mod snapshot;
mod summary;
mod units;

pub use framing::{LineEvent, LineReader};
pub use fuzz::fuzz_request;
pub use mode::{Mode, ModeOutcome};
#[cfg(feature = "prometheus-client")]
pub use prometheus::render_with_prometheus_client;
pub use prometheus::{
    CONTENT_TYPE as METRICS_CONTENT_TYPE, Format as MetricsFormat, render as render_metrics_as,
    render_metrics,
};
pub use protocol::{
    MAX_REQUEST_BYTES, PROTOCOL_VERSION, ProtocolError, ReloadOutcome, Request, Response,
    encode_request, parse_request, parse_response,
};
pub use rates::{FlowRates, OutputRates, Rates};
pub use render::{
    health_text, ingress_drops as flow_drops_text, leg_protection_text,
    output_drops as output_drops_text, protection_text, render_flows, render_stats, render_status,
    render_top, rist_text,
};
#[cfg(any(test, feature = "test-support"))]
pub use snapshot::bench_snapshot;
pub use snapshot::{
    DaemonState, EndpointSnapshot, FecSnapshot, FlowSnapshot, FlowState, IngressDropsSnapshot,
    InputHealth, LegFecSnapshot, LegRistSnapshot, LegSnapshot, OutputSnapshot, PoolClassSnapshot,
    RedundancySnapshot, RistSnapshot, RtpHealth, Snapshot, SrtCallerSnapshot, SrtInputSnapshot,
    SrtPeerSnapshot, SrtSnapshot, Totals, TsHealth, WorkerSnapshot, input_label,
};
pub use summary::{
    FlowStateCounts, MAX_NAMED, MAX_TEXT, Named, NotRunning, StreamErrors, Summary, decode_status,
};
pub use units::{
    human_bits_per_second, human_bytes, human_count, human_duration, human_rate, per_second,
};
