//! TOML text to a validated [`Config`], collecting every error.
//!
//! The text is parsed into `toml`'s spanned document tree
//! ([`toml::de::DeTable`]) and walked by hand rather than through
//! `#[derive(Deserialize)]`: serde stops at the first problem, while
//! operators want every mistake in the file, each with its line and column.

use std::collections::HashMap;
use std::fmt::Display;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::PathBuf;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::error::{ConfigError, ConfigErrors};
use crate::model::*;

mod legs;
mod rist;
mod spread;
mod srt;

/// Largest CPU number accepted in `daemon.cores` and a flow's `core`
/// (Linux supports at most 8192 CPUs).
pub const MAX_CPU: usize = 8191;

const TOP_KEYS: &[&str] = &["daemon", "pools", "flow"];
const DAEMON_KEYS: &[&str] = &[
    "user",
    "control_socket",
    "cores",
    "metrics_listen",
    "metrics_allow",
    "log_level",
    "mode",
];
const POOL_KEYS: &[&str] = &["small", "standard", "jumbo"];
const FLOW_KEYS: &[&str] = &[
    "name",
    "input",
    "inputs",
    "outputs",
    "core",
    "spread",
    "latency",
    "payload",
    "silence_ms",
    "rtp_clock_hz",
    "redundancy",
    "merge_delay_ms",
    "merge_window_ms",
    "failover_after_ms",
    "failover_gap_factor",
    "revert_after_s",
    "rtp_rewrite",
];
const INPUT_KEYS: &[&str] = &[
    "interface",
    "address",
    "port",
    "source",
    "ingress",
    "receive_buffer_bytes",
    "fec",
    "protocol",
    "buffer_ms",
    "mode",
    "latency_ms",
    "passphrase",
    "key_length",
    "stream_id",
];
const OUTPUT_KEYS: &[&str] = &[
    "interface",
    "address",
    "port",
    "ttl",
    "source_address",
    "queue_depth",
    "fec",
    "protocol",
    "mode",
    "latency_ms",
    "passphrase",
    "key_length",
    "max_callers",
    "stream_id",
    "buffer_ms",
    "egress",
];
const OUTPUT_FEC_KEYS: &[&str] = &["columns", "rows"];

/// Longest `sun_path` a Unix socket address can hold, minus the NUL.
const MAX_SOCKET_PATH: usize = 107;

type Value<'i> = Spanned<DeValue<'i>>;

/// Maps byte offsets to 1-based line and character column.
struct LineIndex<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    fn new(text: &'a str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex { text, starts }
    }

    fn position(&self, offset: usize) -> (u32, u32) {
        let offset = offset.min(self.text.len());
        let line = self.starts.partition_point(|&s| s <= offset).max(1) - 1;
        let start = self.starts[line];
        let column = match self.text.get(start..offset) {
            Some(s) => s.chars().count(),
            None => offset - start,
        };
        (to_u32(line + 1), to_u32(column + 1))
    }

    fn line(&self, offset: usize) -> u32 {
        self.position(offset).0
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A string as it should appear in a message: bare when it is a plain
/// token, quoted and escaped otherwise.
fn show(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_graphic() && c != '"') {
        s.to_owned()
    } else {
        format!("{s:?}")
    }
}

fn family(a: IpAddr) -> &'static str {
    if a.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// The integer inside a TOML value, or `None` if it does not fit an `i128`
/// (TOML integers are 64-bit, so that never happens for valid TOML).
fn int_value(v: &DeValue<'_>) -> Option<i128> {
    match v {
        DeValue::Integer(i) => i128::from_str_radix(i.as_str(), i.radix()).ok(),
        _ => None,
    }
}

/// Whether a datagram sent to `a:ap` arrives at a socket bound to `b:bp`
/// as far as the file can tell: same port, same address once an
/// IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is read as the IPv4 address.
pub fn same_endpoint(a: IpAddr, ap: u16, b: IpAddr, bp: u16) -> bool {
    ap == bp && a.to_canonical() == b.to_canonical()
}

/// Whether a datagram sent by `output` reaches the socket of `input`: the
/// same endpoint ([`same_endpoint`]) and, for a group, the same interface.
/// An SRT listener output and an SRT listener input on one port are one
/// listener with two routes told apart by stream ID, not a loop: the
/// listener rule checks them (see `SrtSide`).
pub fn reaches(output: &Output, input: &Input) -> bool {
    let listener_out = output
        .srt
        .as_ref()
        .is_some_and(|s| s.mode == SrtMode::Listener);
    let listener_in = input
        .srt
        .as_ref()
        .is_some_and(|s| s.mode == SrtMode::Listener);
    if listener_out && listener_in {
        return false;
    }
    same_endpoint(output.address, output.port, input.address, input.port)
        && (output.interface == input.interface || !input.address.to_canonical().is_multicast())
}

/// Chains of flows that come back to where they started: flow A's output
/// is flow B's input, ..., and one of them sends to A's input. One entry
/// per flow on such a cycle (its name, and the names of the flows the
/// cycle goes through), in file order. A flow sending to its own input is
/// reported where its outputs are checked, not here.
fn loops_between_flows(flows: &[Flow]) -> Vec<(String, String)> {
    // Every input by its endpoint (address read canonically, and port):
    // an output reaches only inputs at its own endpoint, so each output
    // looks its few candidates up rather than every flow's inputs (the
    // n x n comparison was ~54 M of a 1000-flow file's 138 M
    // instructions: docs/benchmarks.md "Config parsing").
    let mut by_endpoint: HashMap<(IpAddr, u16), Vec<(usize, &Input)>> = HashMap::new();
    for (j, f) in flows.iter().enumerate() {
        for input in &f.inputs {
            by_endpoint
                .entry((input.address.to_canonical(), input.port))
                .or_default()
                .push((j, input));
        }
    }
    // Edge i -> j: an output of flow i is an input of flow j (i != j);
    // each flow's edges in file order, once.
    let n = flows.len();
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut fed = vec![false; n];
    for (i, f) in flows.iter().enumerate() {
        for o in &f.outputs {
            let Some(inputs) = by_endpoint.get(&(o.address.to_canonical(), o.port)) else {
                continue;
            };
            for &(j, input) in inputs {
                if j != i && reaches(o, input) {
                    edges[i].push(j);
                    fed[j] = true;
                }
            }
        }
        edges[i].sort_unstable();
        edges[i].dedup();
    }
    let mut found = Vec::new();
    for start in 0..n {
        // Only a flow that feeds another and is fed by one can be on a
        // cycle.
        if edges[start].is_empty() || !fed[start] {
            continue;
        }
        // Breadth-first from `start`, remembering the way back.
        let mut from: Vec<Option<usize>> = vec![None; n];
        let mut queue = std::collections::VecDeque::from([start]);
        let mut seen = vec![false; n];
        seen[start] = true;
        let mut closing = None;
        while let Some(i) = queue.pop_front() {
            for &j in &edges[i] {
                if j == start {
                    closing = Some(i);
                    break;
                }
                if !seen[j] {
                    seen[j] = true;
                    from[j] = Some(i);
                    queue.push_back(j);
                }
            }
            if closing.is_some() {
                break;
            }
        }
        if let Some(mut last) = closing {
            let mut path = vec![flows[start].name.as_str()];
            let mut back = Vec::new();
            while last != start {
                back.push(flows[last].name.as_str());
                last = from[last].unwrap_or(start);
            }
            back.reverse();
            path.extend(back);
            path.push(flows[start].name.as_str());
            let through = path
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(" -> ");
            found.push((flows[start].name.clone(), through));
        }
    }
    found
}

/// Longest flow name, in bytes. Names travel in the helper's `OPEN <name>`
/// request (1024 bytes at most: a name of 1020 bytes or more passed
/// `check` and made the daemon exit at start, issue 27), in thread-free
/// places like log lines, Prometheus labels and table columns; 255 leaves
/// room for all of them.
pub const MAX_FLOW_NAME_BYTES: usize = 255;

/// Unicode format characters (general category Cf) and the line and
/// paragraph separators (Zl, Zp): invisible in a terminal, yet they
/// reverse (U+202E), isolate (U+2066..U+2069) or break (U+2028) the lines
/// `mcrelayctl flows` prints. Control characters (Cc) are
/// [`char::is_control`]. The Cf table is Unicode 15.1's.
pub fn is_format_char(c: char) -> bool {
    matches!(
        u32::from(c),
        0x00AD
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x2028..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

fn valid_interface(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
}

/// `BASE.KEY` in a message, formatted only when a message is written (a
/// thousand flows' paths formatted up front were a sixth of a reload's
/// parse).
#[derive(Clone, Copy)]
struct Dotted<P>(P, &'static str);

impl<P: Display> Display for Dotted<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// `NAME[INDEX]` in a message, formatted only when one is written.
#[derive(Clone, Copy)]
struct Indexed(&'static str, usize);

impl Display for Indexed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

/// ` in PATH`, for [`Walker::check_keys`], formatted only when needed.
#[derive(Clone, Copy)]
struct Inside<P>(P);

impl<P: Display> Display for Inside<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, " in {}", self.0)
    }
}

struct Walker<'t> {
    lines: LineIndex<'t>,
    errors: Vec<(usize, String)>,
}

/// What a flow walk found, even when the flow as a whole is invalid, so
/// the cross-flow rules can still run.
struct FlowParts {
    name: Option<(String, usize)>,
    /// Each valid leg, with where it is written.
    inputs: Vec<(Input, usize)>,
    flow: Option<Flow>,
    /// Each SRT listener's address, port and stream ID, whether it is an
    /// input or an output, and where it is written (two flows may share a
    /// port with distinct stream IDs).
    srt_listeners: Vec<(SrtListenerKey, SrtSide, usize)>,
}

/// Which way an SRT listener's callers' data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SrtSide {
    Input,
    Output,
}

type SrtListenerKey = (IpAddr, u16, Option<String>);

impl<'t> Walker<'t> {
    fn err(&mut self, span: &Range<usize>, msg: String) {
        self.errors.push((span.start, msg));
    }

    fn check_keys(
        &mut self,
        table: &DeTable<'_>,
        allowed: &[&str],
        prefix: &str,
        inside: impl Display,
    ) {
        for (k, _) in table.iter() {
            if !allowed.contains(&k.get_ref().as_ref()) {
                self.err(
                    &k.span(),
                    format!(
                        "{prefix}unknown key {:?}{inside} (expected one of: {})",
                        k.get_ref().as_ref(),
                        allowed.join(", ")
                    ),
                );
            }
        }
    }

    fn type_err(&mut self, v: &Value<'_>, prefix: &str, path: impl Display, want: &str) {
        self.err(
            &v.span(),
            format!(
                "{prefix}{path} must be {want}, found {}",
                v.get_ref().type_str()
            ),
        );
    }

    fn table<'a, 'i>(
        &mut self,
        v: &'a Value<'i>,
        prefix: &str,
        path: impl Display,
    ) -> Option<&'a DeTable<'i>> {
        match v.get_ref() {
            DeValue::Table(t) => Some(t),
            _ => {
                self.type_err(v, prefix, path, "a table");
                None
            }
        }
    }

    fn string<'a>(
        &mut self,
        v: &'a Value<'_>,
        prefix: &str,
        path: impl Display,
    ) -> Option<&'a str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            _ => {
                self.type_err(v, prefix, path, "a string");
                None
            }
        }
    }

    /// An integer; the second value is its text as written, for messages
    /// (formatted only when one is written).
    fn int<'a>(
        &mut self,
        v: &'a Value<'_>,
        prefix: &str,
        path: impl Display,
    ) -> Option<(i128, &'a dyn Display)> {
        match v.get_ref() {
            DeValue::Integer(i) => Some((int_value(v.get_ref()).unwrap_or(i128::MAX), i)),
            _ => {
                self.type_err(v, prefix, path, "an integer");
                None
            }
        }
    }

    /// An integer in `lo..=hi`; out-of-range values are reported as
    /// `PATH N is out of range; use LO-HI`.
    fn ranged(
        &mut self,
        v: &Value<'_>,
        prefix: &str,
        path: impl Display + Copy,
        lo: i128,
        hi: i128,
    ) -> Option<i128> {
        let (n, text) = self.int(v, prefix, path)?;
        if (lo..=hi).contains(&n) {
            Some(n)
        } else {
            self.err(
                &v.span(),
                format!("{prefix}{path} {text} is out of range; use {lo}-{hi}"),
            );
            None
        }
    }

    fn port(&mut self, v: &Value<'_>, prefix: &str, path: impl Display + Copy) -> Option<u16> {
        let (n, text) = self.int(v, prefix, path)?;
        if n == 0 {
            self.err(
                &v.span(),
                format!("{prefix}{path} 0 is not allowed; use 1-65535"),
            );
            None
        } else if let Ok(p) = u16::try_from(n) {
            Some(p)
        } else {
            self.err(
                &v.span(),
                format!("{prefix}{path} {text} is out of range; use 1-65535"),
            );
            None
        }
    }

    fn ip(&mut self, v: &Value<'_>, prefix: &str, path: impl Display + Copy) -> Option<IpAddr> {
        let s = self.string(v, prefix, path)?;
        match s.parse::<IpAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                self.err(
                    &v.span(),
                    format!("{prefix}{path} {} is not an IP address", show(s)),
                );
                None
            }
        }
    }

    fn interface(
        &mut self,
        v: &Value<'_>,
        prefix: &str,
        path: impl Display + Copy,
    ) -> Option<String> {
        let s = self.string(v, prefix, path)?;
        if valid_interface(s) {
            Some(s.to_owned())
        } else {
            self.err(
                &v.span(),
                format!(
                    "{prefix}{path} {s:?} is not a valid interface name; use 1-15 bytes without '/', ':' or whitespace"
                ),
            );
            None
        }
    }

    fn missing(
        &mut self,
        span: &Range<usize>,
        prefix: &str,
        path: impl Display,
        key: &str,
        example: &str,
    ) {
        self.err(
            span,
            format!("{prefix}{path} is missing; add {key} = {example}"),
        );
    }

    fn cpu(&mut self, v: &Value<'_>, prefix: &str, path: impl Display + Copy) -> Option<usize> {
        let max = i128::try_from(MAX_CPU).unwrap_or(i128::MAX);
        self.ranged(v, prefix, path, 0, max)
            .and_then(|n| usize::try_from(n).ok())
    }

    // ---- [daemon] ----

    fn daemon(&mut self, v: Option<&Value<'_>>) -> (Option<DaemonConfig>, Option<Range<usize>>) {
        let mut d = DaemonConfig::default();
        let Some(v) = v else { return (Some(d), None) };
        let Some(t) = self.table(v, "", "daemon") else {
            return (None, None);
        };
        self.check_keys(t, DAEMON_KEYS, "", " in daemon");
        let mut ok = true;
        let mut cores_span = None;
        if let Some(v) = t.get("user") {
            match self.string(v, "", "daemon.user") {
                Some(s)
                    if !s.is_empty()
                        && !s.chars().any(|c| {
                            c == ':' || c == '/' || c.is_whitespace() || c.is_control()
                        }) =>
                {
                    d.user = s.to_owned();
                }
                Some(s) => {
                    self.err(&v.span(), format!("daemon.user {s:?} is not a valid user name; use an existing account such as \"mcrelay\""));
                    ok = false;
                }
                None => ok = false,
            }
        }
        if let Some(v) = t.get("control_socket") {
            match self.string(v, "", "daemon.control_socket") {
                Some(s) if !s.starts_with('/') => {
                    self.err(&v.span(), format!("daemon.control_socket {s:?} is not an absolute path; use e.g. \"{DEFAULT_CONTROL_SOCKET}\""));
                    ok = false;
                }
                Some(s) if s.len() > MAX_SOCKET_PATH || s.contains('\0') => {
                    self.err(&v.span(), format!("daemon.control_socket is {} bytes long; use a path of at most {MAX_SOCKET_PATH} bytes without NUL", s.len()));
                    ok = false;
                }
                Some(s) => d.control_socket = PathBuf::from(s),
                None => ok = false,
            }
        }
        if let Some(v) = t.get("cores") {
            cores_span = Some(v.span());
            match v.get_ref() {
                DeValue::Array(items) if items.is_empty() => {
                    self.err(&v.span(), "daemon.cores is empty; list at least one CPU, or remove cores to use every CPU in the affinity mask".to_owned());
                    ok = false;
                }
                DeValue::Array(items) => {
                    let mut cores = Vec::with_capacity(items.len());
                    for (i, item) in items.iter().enumerate() {
                        match self.cpu(item, "", &format!("daemon.cores[{i}]")) {
                            Some(c) if cores.contains(&c) => {
                                self.err(
                                    &item.span(),
                                    format!("daemon.cores lists CPU {c} twice; list each CPU once"),
                                );
                                ok = false;
                            }
                            Some(c) => cores.push(c),
                            None => ok = false,
                        }
                    }
                    d.cores = Some(cores);
                }
                _ => {
                    self.type_err(v, "", "daemon.cores", "an array of CPU numbers");
                    ok = false;
                }
            }
        }
        if let Some(v) = t.get("metrics_listen") {
            match self.string(v, "", "daemon.metrics_listen") {
                Some(s) => match s.parse::<SocketAddr>() {
                    Ok(a) => d.metrics_listen = Some(a),
                    Err(_) => {
                        self.err(&v.span(), format!("daemon.metrics_listen {} is not a socket address; use IP:PORT, e.g. \"127.0.0.1:9464\"", show(s)));
                        ok = false;
                    }
                },
                None => ok = false,
            }
        }
        if let Some(v) = t.get("metrics_allow") {
            match v.get_ref() {
                DeValue::Array(items) if items.is_empty() => {
                    self.err(&v.span(), "daemon.metrics_allow is empty, which would refuse every scraper; list the scrapers' addresses (e.g. [\"127.0.0.1/32\", \"10.0.0.0/8\"]), or remove it to allow every address".to_owned());
                    ok = false;
                }
                DeValue::Array(items) => {
                    let mut allow = Vec::with_capacity(items.len());
                    for (i, item) in items.iter().enumerate() {
                        let path = format!("daemon.metrics_allow[{i}]");
                        match self.string(item, "", &path) {
                            Some(s) => match Cidr::parse(s) {
                                Ok(c) => allow.push(c),
                                Err(why) => {
                                    self.err(&item.span(), format!("{path} = {s:?}: {why}"));
                                    ok = false;
                                }
                            },
                            None => ok = false,
                        }
                    }
                    d.metrics_allow = Some(allow);
                }
                _ => {
                    self.type_err(
                        v,
                        "",
                        "daemon.metrics_allow",
                        "an array of address ranges (\"10.0.0.0/8\")",
                    );
                    ok = false;
                }
            }
        }
        if let Some(v) = t.get("log_level") {
            match self.string(v, "", "daemon.log_level") {
                Some(s) if LOG_LEVELS.contains(&s) => d.log_level = s.to_owned(),
                Some(s) => {
                    self.err(
                        &v.span(),
                        format!(
                            "daemon.log_level {s:?} is not valid; use one of: {}",
                            LOG_LEVELS.join(", ")
                        ),
                    );
                    ok = false;
                }
                None => ok = false,
            }
        }
        if let Some(v) = t.get("mode") {
            match self.string(v, "", "daemon.mode") {
                Some(s) => match crate::Mode::from_word(s) {
                    Some(m) => d.mode = m,
                    None => {
                        self.err(&v.span(), format!("daemon.mode {s:?} is not valid; use \"active\" (relay from the start) or \"standby\" (receive, send nothing until `mcrelayctl active`)"));
                        ok = false;
                    }
                },
                None => ok = false,
            }
        }
        (ok.then_some(d), cores_span)
    }

    // ---- [pools] ----

    fn pools(&mut self, v: Option<&Value<'_>>) -> Option<PoolCounts> {
        let mut p = PoolCounts::default();
        let Some(v) = v else { return Some(p) };
        let t = self.table(v, "", "pools")?;
        self.check_keys(t, POOL_KEYS, "", " in pools");
        let mut ok = true;
        for (key, slot) in [
            ("small", &mut p.small),
            ("standard", &mut p.standard),
            ("jumbo", &mut p.jumbo),
        ] {
            let Some(v) = t.get(key) else { continue };
            let path = format!("pools.{key}");
            let Some((n, text)) = self.int(v, "", &path) else {
                ok = false;
                continue;
            };
            if n < 1 {
                self.err(
                    &v.span(),
                    format!("{path} {text} is not allowed; use at least 1"),
                );
                ok = false;
            } else if n > i128::from(MAX_POOL_COUNT) {
                self.err(
                    &v.span(),
                    format!("{path} {text} is too large; use at most {MAX_POOL_COUNT}"),
                );
                ok = false;
            } else if let Ok(n) = u32::try_from(n) {
                *slot = n;
            }
        }
        ok.then_some(p)
    }

    // ---- [[flow]] ----

    fn flow(&mut self, index: usize, v: &Value<'_>, cores: Option<&[usize]>) -> FlowParts {
        let mut parts = FlowParts {
            name: None,
            inputs: Vec::new(),
            flow: None,
            srt_listeners: Vec::new(),
        };
        let Some(t) = self.table(v, "", Indexed("flow", index)) else {
            return parts;
        };
        let span = v.span();
        let mut ok = true;
        // The name first: every other message about this flow quotes it.
        let mut prefix = format!("flow[{index}]: ");
        match t.get("name") {
            None => {
                self.missing(&span, &prefix, "name", "name", "\"camera-1\"");
                ok = false;
            }
            Some(nv) => match self.string(nv, &prefix, "name") {
                Some("") => {
                    self.err(
                        &nv.span(),
                        format!("{prefix}name is empty; give each flow a unique, non-empty name"),
                    );
                    ok = false;
                }
                Some(s) if s.len() > MAX_FLOW_NAME_BYTES => {
                    self.err(
                        &nv.span(),
                        format!(
                            "{prefix}name is {} bytes long; the limit is {MAX_FLOW_NAME_BYTES}: use a shorter name",
                            s.len()
                        ),
                    );
                    ok = false;
                }
                Some(s) if s.chars().any(char::is_control) => {
                    self.err(&nv.span(), format!("{prefix}name {s:?} contains control characters; use printable characters"));
                    ok = false;
                }
                Some(s) if s.chars().any(is_format_char) => {
                    let c = s.chars().find(|&c| is_format_char(c)).unwrap_or_default();
                    self.err(
                        &nv.span(),
                        format!(
                            "{prefix}name {s:?} contains U+{:04X}, a format, bidi or line-separator character that reorders or splits what tools print; use printable characters",
                            u32::from(c)
                        ),
                    );
                    ok = false;
                }
                Some(s) => {
                    prefix = format!("flow {s:?}: ");
                    parts.name = Some((s.to_owned(), nv.span().start));
                }
                None => ok = false,
            },
        }
        let p = prefix.as_str();
        self.check_keys(t, FLOW_KEYS, p, "");

        // `input` (one leg) or `inputs` (2 to 4): see `legs`.
        let inputs = self.legs(t, &span, p);
        if let Some(legs) = &inputs {
            // An SRT listener input is checked with the SRT listeners (a
            // port may carry several flows by stream ID); an SRT caller
            // input calls someone else's listener.
            for (leg, at) in legs {
                match &leg.srt {
                    None => parts.inputs.push((leg.clone(), *at)),
                    Some(s) if s.mode == SrtMode::Listener => parts.srt_listeners.push((
                        (leg.address, leg.port, s.stream_id.clone()),
                        SrtSide::Input,
                        *at,
                    )),
                    Some(_) => {}
                }
            }
        }

        let mut outputs = Vec::new();
        match t.get("outputs") {
            None => {
                self.missing(
                    &span,
                    p,
                    "outputs",
                    "outputs",
                    "[{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }]",
                );
                ok = false;
            }
            Some(ov) => match ov.get_ref() {
                DeValue::Array(items) if items.is_empty() => {
                    self.err(
                        &ov.span(),
                        format!("{p}outputs is empty; add at least one output"),
                    );
                    ok = false;
                }
                DeValue::Array(items) => {
                    let mut seen: Vec<(usize, &Output)> = Vec::new();
                    let parsed: Vec<(usize, Range<usize>, Option<Output>)> = items
                        .iter()
                        .enumerate()
                        .map(|(i, item)| (i, item.span(), self.output(item, p, i)))
                        .collect();
                    for (i, span, out) in &parsed {
                        let Some(out) = out else {
                            ok = false;
                            continue;
                        };
                        for (inp, _) in inputs.iter().flatten() {
                            // In either family (`::ffff:a.b.c.d` is
                            // a.b.c.d); a unicast input is this host's own
                            // address, so through any interface (issue 27).
                            // The same group on another interface is a relay
                            // between segments, not a loop (if the segments
                            // are joined after all, the run-time guard drops
                            // what comes back).
                            if reaches(out, inp) {
                                self.err(span, format!(
                                    "{p}outputs[{i}] ({out}) sends to the flow's own input ({} {}), which would loop; change the address or port",
                                    inp.interface, inp.socket_addr()
                                ));
                                ok = false;
                            }
                        }
                        if let Some((j, _)) = seen.iter().find(|(_, o)| {
                            o.interface == out.interface
                                && o.address == out.address
                                && o.port == out.port
                                && o.srt.as_ref().map(|s| &s.stream_id)
                                    == out.srt.as_ref().map(|s| &s.stream_id)
                        }) {
                            self.err(span, format!("{p}outputs[{i}] is the same as outputs[{j}] ({out}); remove one"));
                            ok = false;
                        }
                        seen.push((*i, out));
                    }
                    for (_, span, out) in &parsed {
                        if let Some(Output {
                            srt: Some(s),
                            address,
                            port,
                            ..
                        }) = out
                        {
                            if s.mode == SrtMode::Listener {
                                parts.srt_listeners.push((
                                    (*address, *port, s.stream_id.clone()),
                                    SrtSide::Output,
                                    span.start,
                                ));
                            }
                        }
                    }
                    outputs = parsed.into_iter().filter_map(|(_, _, o)| o).collect();
                }
                _ => {
                    self.type_err(ov, p, "outputs", "an array of tables");
                    ok = false;
                }
            },
        }

        let mut core = None;
        if let Some(cv) = t.get("core") {
            match self.cpu(cv, p, "core") {
                Some(c) => match cores {
                    Some(cores) if !cores.contains(&c) => {
                        self.err(&cv.span(), format!("{p}core {c} is not one of daemon.cores {cores:?}; use one of them or remove core"));
                        ok = false;
                    }
                    _ => core = Some(c),
                },
                None => ok = false,
            }
        }

        let spread = self.spread(t, p, outputs.len(), t.contains_key("core"));
        ok &= spread.is_some();
        if spread.is_some_and(|n| n > 1) && outputs.iter().any(|o| o.fec.is_some()) {
            if let Some(v) = t.get("spread") {
                self.err(
                    &v.span(),
                    format!(
                        "{p}spread with an output's fec is not supported yet; remove spread or fec"
                    ),
                );
            }
            ok = false;
        }
        let rist_input = inputs
            .as_ref()
            .is_some_and(|legs| legs.iter().any(|(i, _)| i.rist.is_some()));
        if spread.is_some_and(|n| n > 1) && (rist_input || outputs.iter().any(|o| o.rist.is_some()))
        {
            let at = t.get("spread").map_or(span.clone(), Spanned::span);
            self.err(&at, format!("{p}spread with a RIST input or output is not supported yet (its buffer and RTCP live on one worker); remove spread or protocol = \"rist\""));
            ok = false;
        }
        if spread.is_some_and(|n| n > 1) && outputs.iter().any(|o| o.srt.is_some()) {
            let at = t.get("spread").map_or(span.clone(), Spanned::span);
            self.err(&at, format!("{p}spread can't be used with an SRT output (its callers are served by one SRT thread); remove spread or the SRT output"));
            ok = false;
        }
        let srt_input = inputs.iter().flatten().any(|(i, _)| i.srt.is_some());
        if spread.is_some_and(|n| n > 1) && srt_input {
            let at = t.get("spread").map_or(span.clone(), Spanned::span);
            self.err(&at, format!("{p}spread can't be used with an SRT input (one SRT connection feeds one worker); remove spread or the SRT input"));
            ok = false;
        }
        if spread.is_some_and(|n| n > 1)
            && inputs
                .iter()
                .flatten()
                .any(|(i, _)| i.ingress == IngressKind::Xdp)
        {
            let at = t.get("spread").map_or(span.clone(), Spanned::span);
            self.err(&at, format!("{p}spread can't be used with ingress = \"xdp\" (one AF_XDP socket per interface queue); remove spread or use ingress = \"packet\""));
            ok = false;
        }
        let mut latency = Latency::Normal;
        if let Some(v) = t.get("latency") {
            match self.string(v, p, "latency") {
                Some("normal") => {}
                Some("low") => latency = Latency::Low,
                Some(s) => {
                    self.err(
                        &v.span(),
                        format!("{p}latency {s:?} is not valid; use \"normal\" or \"low\""),
                    );
                    ok = false;
                }
                None => ok = false,
            }
        }
        let health = self.health(t, p);
        ok &= health.is_some();
        let redundancy = self.redundancy(
            t,
            &span,
            p,
            inputs.as_ref().map(Vec::len),
            health.map(|h| h.payload),
        );

        if let (true, Some((name, _)), Some(inputs), Some(health), Some(redundancy), Some(spread)) =
            (ok, &parts.name, inputs, health, redundancy, spread)
        {
            parts.flow = Some(Flow {
                id: FlowKey::from_name(name),
                name: name.clone(),
                inputs: inputs.into_iter().map(|(i, _)| i).collect(),
                redundancy,
                outputs,
                core,
                spread,
                health,
                latency,
            });
        }
        parts
    }

    /// A flow's `payload`, `silence_ms` and `rtp_clock_hz`.
    fn health(&mut self, t: &DeTable<'_>, p: &str) -> Option<Health> {
        let mut h = Health::default();
        let mut ok = true;
        if let Some(v) = t.get("payload") {
            match self.string(v, p, "payload") {
                Some(s) => match Payload::from_name(s) {
                    Some(payload) => h.payload = payload,
                    None => {
                        self.err(
                            &v.span(),
                            format!("{p}payload {s:?} is not valid; use \"udp\", \"rtp\", \"mpegts\" or \"rtp-mpegts\""),
                        );
                        ok = false;
                    }
                },
                None => ok = false,
            }
        }
        for (key, slot, hi) in [
            ("silence_ms", &mut h.silence_ms, MAX_SILENCE_MS),
            ("rtp_clock_hz", &mut h.rtp_clock_hz, MAX_RTP_CLOCK_HZ),
        ] {
            let Some(v) = t.get(key) else { continue };
            match self.ranged(v, p, key, 1, i128::from(hi)) {
                Some(n) => *slot = u32::try_from(n).unwrap_or(hi),
                None => ok = false,
            }
        }
        ok.then_some(h)
    }

    /// One leg: `input`, or `inputs[i]` (`path`).
    fn input(&mut self, v: &Value<'_>, p: &str, path: &str) -> Option<Input> {
        let t = self.table(v, p, path)?;
        self.check_keys(t, INPUT_KEYS, p, Inside(path));
        let span = v.span();
        if self.is_srt(t, p, path)? {
            return self.srt_input(t, &span, p, path);
        }
        let mut ok = self.no_srt_keys(t, p, path, "input");
        let interface = match t.get("interface") {
            Some(v) => self.interface(v, p, Dotted(path, "interface")),
            None => {
                self.missing(&span, p, Dotted(path, "interface"), "interface", "\"eth0\"");
                None
            }
        };
        let address = match t.get("address") {
            Some(v) => match self.ip(v, p, Dotted(path, "address")) {
                Some(a) if a.is_unspecified() => {
                    self.err(&v.span(), format!("{p}{path}.address {a} is unspecified; use a multicast group or a local unicast address"));
                    None
                }
                a => a,
            },
            None => {
                self.missing(
                    &span,
                    p,
                    Dotted(path, "address"),
                    "address",
                    "\"239.1.1.1\"",
                );
                None
            }
        };
        let port = match t.get("port") {
            Some(v) => self.port(v, p, Dotted(path, "port")),
            None => {
                self.missing(&span, p, Dotted(path, "port"), "port", "5000");
                None
            }
        };
        let mut source = None;
        if let Some(v) = t.get("source") {
            match (self.ip(v, p, Dotted(path, "source")), address) {
                (None, _) => ok = false,
                (Some(s), _) if s.is_multicast() || s.is_unspecified() => {
                    self.err(
                        &v.span(),
                        format!(
                            "{p}{path}.source {s} is not a unicast address; use the sender's address"
                        ),
                    );
                    ok = false;
                }
                (Some(_), Some(a)) if !a.is_multicast() => {
                    self.err(&v.span(), format!("{p}{path}.source is only valid with a multicast {path}.address ({a} is unicast); remove source"));
                    ok = false;
                }
                (Some(s), Some(a)) if s.is_ipv4() != a.is_ipv4() => {
                    self.err(&v.span(), format!(
                        "{p}{path}.source {s} is {} but {path}.address {a} is {}; use the same family",
                        family(s), family(a)
                    ));
                    ok = false;
                }
                (Some(s), _) => source = Some(s),
            }
        }
        let mut ingress = IngressKind::Socket;
        if let Some(v) = t.get("ingress") {
            match self.string(v, p, Dotted(path, "ingress")) {
                Some("socket") => ingress = IngressKind::Socket,
                Some("packet") => ingress = IngressKind::Packet,
                Some("xdp") if address.is_some_and(|a: IpAddr| !a.is_ipv4()) => {
                    self.err(
                        &v.span(),
                        format!("{p}{path}.ingress = \"xdp\" takes IPv4 inputs only (the XDP program matches IPv4); use ingress = \"packet\" for IPv6"),
                    );
                    ok = false;
                }
                Some("xdp") => ingress = IngressKind::Xdp,
                Some(s) => {
                    self.err(
                        &v.span(),
                        format!(
                            "{p}{path}.ingress {s:?} is not valid; use \"socket\", \"packet\" or \"xdp\""
                        ),
                    );
                    ok = false;
                }
                None => ok = false,
            }
        }
        let mut receive_buffer_bytes = DEFAULT_RECEIVE_BUFFER_BYTES;
        if let Some(v) = t.get("receive_buffer_bytes") {
            match self.ranged(
                v,
                p,
                Dotted(path, "receive_buffer_bytes"),
                1,
                i128::from(MAX_RECEIVE_BUFFER_BYTES),
            ) {
                Some(n) => {
                    receive_buffer_bytes = u32::try_from(n).unwrap_or(DEFAULT_RECEIVE_BUFFER_BYTES)
                }
                None => ok = false,
            }
        }
        let mut fec = None;
        if let Some(v) = t.get("fec") {
            match self.string(v, p, Dotted(path, "fec")) {
                Some("2022-1") if ingress != IngressKind::Socket => {
                    self.err(&v.span(), format!("{p}{path}.fec needs ingress = \"socket\" (the FEC ports are received on sockets); remove ingress or fec"));
                    ok = false;
                }
                Some("2022-1") if port.is_some_and(|p| p > u16::MAX - 4) => {
                    self.err(
                        &v.span(),
                        format!(
                            "{p}{path}.fec needs the ports + 2 and + 4; use a port up to {}",
                            u16::MAX - 4
                        ),
                    );
                    ok = false;
                }
                Some("2022-1") => fec = Some(InputFec::Smpte2022_1),
                Some(s) => {
                    self.err(
                        &v.span(),
                        format!("{p}{path}.fec {s:?} is not valid; use \"2022-1\""),
                    );
                    ok = false;
                }
                None => ok = false,
            }
        }
        let mut rist = None;
        match self.input_is_rist(t, p, path) {
            Some(is_rist) => match self.rist_settings(t, p, path, is_rist, port) {
                Some(r) => rist = r,
                None => ok = false,
            },
            None => ok = false,
        }
        if rist.is_some() && fec.is_some() {
            if let Some(v) = t.get("fec") {
                self.err(&v.span(), format!("{p}{path}: fec and protocol = \"rist\" on one input are not supported yet (FEC repairs would bypass RIST's reorder buffer); use one of them"));
            }
            ok = false;
        }
        if rist.is_some() && ingress != IngressKind::Socket {
            if let Some(v) = t.get("protocol") {
                self.err(&v.span(), format!("{p}{path}.protocol \"rist\" needs ingress = \"socket\" (its RTCP is received and sent on a socket); remove ingress or protocol"));
            }
            ok = false;
        }
        let (Some(interface), Some(address), Some(port), true) = (interface, address, port, ok)
        else {
            return None;
        };
        Some(Input {
            interface,
            address,
            port,
            source,
            ingress,
            receive_buffer_bytes,
            fec,
            srt: None,
            rist,
        })
    }

    fn output(&mut self, v: &Value<'_>, p: &str, i: usize) -> Option<Output> {
        let path = |key: &'static str| Dotted(Indexed("outputs", i), key);
        let t = self.table(v, p, Indexed("outputs", i))?;
        self.check_keys(t, OUTPUT_KEYS, p, Inside(Indexed("outputs", i)));
        let span = v.span();
        if self.is_srt(t, p, Indexed("outputs", i))? {
            if let Some(v) = t.get("egress") {
                self.err(&v.span(), format!("{p}{} applies to UDP outputs; an SRT output sends on libsrt's socket: remove egress", path("egress")));
                return None;
            }
            return self.srt_output(t, &span, p, i);
        }
        let mut ok = self.no_srt_keys(t, p, Indexed("outputs", i), "output");
        let interface = match t.get("interface") {
            Some(v) => self.interface(v, p, path("interface")),
            None => {
                self.missing(&span, p, path("interface"), "interface", "\"eth1\"");
                None
            }
        };
        let address = match t.get("address") {
            Some(v) => match self.ip(v, p, path("address")) {
                Some(a) if a.is_unspecified() => {
                    self.err(
                        &v.span(),
                        format!(
                            "{p}{} {a} is unspecified; use a multicast group or a unicast host",
                            path("address")
                        ),
                    );
                    None
                }
                a => a,
            },
            None => {
                self.missing(&span, p, path("address"), "address", "\"239.2.2.2\"");
                None
            }
        };
        let port = match t.get("port") {
            Some(v) => self.port(v, p, path("port")),
            None => {
                self.missing(&span, p, path("port"), "port", "6000");
                None
            }
        };
        let mut ttl = None;
        if let Some(v) = t.get("ttl") {
            match self.ranged(v, p, path("ttl"), 1, 255) {
                Some(n) => ttl = u8::try_from(n).ok(),
                None => ok = false,
            }
        }
        let mut source_address = None;
        if let Some(v) = t.get("source_address") {
            match (self.ip(v, p, path("source_address")), address) {
                (None, _) => ok = false,
                (Some(s), _) if s.is_multicast() || s.is_unspecified() => {
                    self.err(&v.span(), format!("{p}{} {s} is not a unicast address; use an address of the egress interface", path("source_address")));
                    ok = false;
                }
                (Some(s), Some(a)) if s.is_ipv4() != a.is_ipv4() => {
                    self.err(
                        &v.span(),
                        format!(
                            "{p}{} {s} is {} but {} {a} is {}; use the same family",
                            path("source_address"),
                            family(s),
                            path("address"),
                            family(a)
                        ),
                    );
                    ok = false;
                }
                (Some(s), _) => source_address = Some(s),
            }
        }
        let mut queue_depth = DEFAULT_OUTPUT_QUEUE_DEPTH;
        if let Some(v) = t.get("queue_depth") {
            match self.ranged(
                v,
                p,
                path("queue_depth"),
                1,
                i128::from(MAX_OUTPUT_QUEUE_DEPTH),
            ) {
                Some(n) => queue_depth = u32::try_from(n).unwrap_or(DEFAULT_OUTPUT_QUEUE_DEPTH),
                None => ok = false,
            }
        }
        let mut fec = None;
        if let Some(v) = t.get("fec") {
            match self.output_fec(v, p, i, port) {
                Some(f) => fec = Some(f),
                None => ok = false,
            }
        }
        let is_rist = t
            .get("protocol")
            .is_some_and(|v| matches!(v.get_ref(), DeValue::String(s) if s.as_ref() == "rist"));
        let mut rist = None;
        match self.rist_settings(t, p, Indexed("outputs", i), is_rist, port) {
            Some(r) => rist = r,
            None => ok = false,
        }
        let mut egress = EgressKind::Socket;
        if let Some(v) = t.get("egress") {
            match self.string(v, p, path("egress")) {
                Some("socket") => {}
                Some("xdp") => match address {
                    Some(IpAddr::V6(a)) => {
                        self.err(&v.span(), format!("{p}{} = \"xdp\" takes IPv4 outputs only ({a} is IPv6: the frames' headers are built for IPv4); use egress = \"socket\"", path("egress")));
                        ok = false;
                    }
                    _ if fec.is_some() || rist.is_some() => {
                        self.err(&v.span(), format!("{p}{} = \"xdp\" can't be used with fec or protocol = \"rist\" (their extra ports are sent on sockets); remove egress or fec/protocol", path("egress")));
                        ok = false;
                    }
                    _ => egress = EgressKind::Xdp,
                },
                Some(s) => {
                    self.err(
                        &v.span(),
                        format!(
                            "{p}{} {s:?} is not valid; use \"socket\" or \"xdp\"",
                            path("egress")
                        ),
                    );
                    ok = false;
                }
                None => ok = false,
            }
        }
        let (Some(interface), Some(address), Some(port), true) = (interface, address, port, ok)
        else {
            return None;
        };
        let ttl = ttl.unwrap_or(if address.is_multicast() {
            DEFAULT_MULTICAST_TTL
        } else {
            DEFAULT_UNICAST_TTL
        });
        Some(Output {
            interface,
            address,
            port,
            ttl,
            source_address,
            queue_depth,
            fec,
            srt: None,
            rist,
            egress,
        })
    }

    /// An output's `fec = { columns = L, rows = D }`, within 2022-1's
    /// limits.
    fn output_fec(
        &mut self,
        v: &Value<'_>,
        p: &str,
        i: usize,
        port: Option<u16>,
    ) -> Option<OutputFec> {
        let path = Dotted(Indexed("outputs", i), "fec");
        let t = self.table(v, p, path)?;
        self.check_keys(t, OUTPUT_FEC_KEYS, p, Inside(path));
        let columns = match t.get("columns") {
            Some(c) => self.ranged(c, p, Dotted(path, "columns"), 1, 20),
            None => {
                self.missing(&v.span(), p, Dotted(path, "columns"), "columns", "5");
                None
            }
        };
        let rows = match t.get("rows") {
            Some(r) => self.ranged(r, p, Dotted(path, "rows"), 0, 20),
            None => {
                self.missing(&v.span(), p, Dotted(path, "rows"), "rows", "5");
                None
            }
        };
        let (columns, rows) = (u8::try_from(columns?).ok()?, u8::try_from(rows?).ok()?);
        let fix = if rows != 0 && rows < 4 {
            Some("rows is 0 (row FEC only) or 4-20")
        } else if u16::from(columns) * u16::from(rows) > 100 {
            Some("columns × rows is at most 100")
        } else if rows == 0 && columns < 2 {
            Some("row FEC only (rows = 0) needs columns 2-20")
        } else if port.is_some_and(|p| p > u16::MAX - 4) {
            Some("the FEC goes to port + 2 and + 4: use a port up to 65531")
        } else {
            None
        };
        if let Some(fix) = fix {
            self.err(
                &v.span(),
                format!("{p}{path} = {{ columns = {columns}, rows = {rows} }} is outside SMPTE 2022-1: {fix}"),
            );
            return None;
        }
        Some(OutputFec { columns, rows })
    }

    fn document(&mut self, root: &DeTable<'_>) -> Option<Config> {
        self.check_keys(root, TOP_KEYS, "", "");
        let (daemon, cores_span) = self.daemon(root.get("daemon"));
        let pools_value = root.get("pools");
        let pools = self.pools(pools_value);

        if let (Some(d), Some(p)) = (&daemon, &pools) {
            let per_core = p.bytes_per_core();
            let cores = d.cores.as_ref().map_or(1, Vec::len);
            let total = per_core.saturating_mul(u64::try_from(cores).unwrap_or(u64::MAX));
            if total > MAX_TOTAL_POOL_BYTES {
                let at = pools_value
                    .map(Spanned::span)
                    .or(cores_span)
                    .unwrap_or(0..0);
                self.err(&at, format!(
                    "pools: {} per core x {} exceeds the {} MiB limit; reduce the pool counts or cores",
                    fmt_mib(per_core),
                    plural(cores, "core"),
                    MAX_TOTAL_POOL_BYTES / (1024 * 1024)
                ));
            }
        }

        let cores = daemon.as_ref().and_then(|d| d.cores.as_deref());
        let mut flows = Vec::new();
        let mut name_spans: HashMap<String, usize> = HashMap::new();
        let mut all_ok = daemon.is_some() && pools.is_some();
        match root.get("flow") {
            None => {}
            Some(v) => match v.get_ref() {
                DeValue::Array(items) => {
                    let mut names: HashMap<String, (usize, FlowKey)> = HashMap::new();
                    let mut ids: HashMap<FlowKey, String> = HashMap::new();
                    let mut inputs: HashMap<(String, IpAddr, u16, Option<IpAddr>), String> =
                        HashMap::new();
                    let mut srt_listeners: HashMap<SrtListenerKey, (String, SrtSide)> =
                        HashMap::new();
                    let mut srt_binds = srt::ListenerBinds::default();
                    // An interface holds one XDP program: one xdp input each.
                    let mut xdp_interfaces: HashMap<String, String> = HashMap::new();
                    // Queue 0 of an interface holds one AF_XDP socket: one
                    // xdp output each, and none beside an xdp input.
                    let mut xdp_egress: HashMap<String, String> = HashMap::new();
                    for (i, item) in items.iter().enumerate() {
                        let parts = self.flow(i, item, cores);
                        if let Some((name, at)) = &parts.name {
                            name_spans.entry(name.clone()).or_insert(*at);
                            let id = FlowKey::from_name(name);
                            if let Some((first, _)) = names.get(name) {
                                let line = self.lines.line(*first);
                                self.errors.push((*at, format!(
                                    "flow {name:?}: duplicate flow name (first defined at line {line}); give each flow a unique name"
                                )));
                                all_ok = false;
                            } else {
                                if let Some(other) = ids.get(&id) {
                                    self.errors.push((*at, format!(
                                        "flow {name:?}: flow id {id} is the same as flow {other:?}'s; rename one of them"
                                    )));
                                    all_ok = false;
                                }
                                names.insert(name.clone(), (*at, id));
                                ids.insert(id, name.clone());
                            }
                            for (input, at) in &parts.inputs {
                                for e in srt_binds.add_input(name, input) {
                                    self.errors.push((*at, e));
                                    all_ok = false;
                                }
                                if input.ingress == IngressKind::Xdp
                                    && let Some(other) = xdp_egress.get(&input.interface)
                                {
                                    self.errors.push((*at, format!(
                                        "flow {name:?}: ingress = \"xdp\" on interface {:?}, which has an egress = \"xdp\" output (flow {other}); queue 0 of an interface holds one AF_XDP socket, so give one of them \"packet\"/\"socket\"",
                                        input.interface
                                    )));
                                    all_ok = false;
                                }
                                if input.ingress == IngressKind::Xdp {
                                    let leg = format!("{name} ({input})");
                                    match xdp_interfaces.get(&input.interface) {
                                        Some(other) => {
                                            self.errors.push((*at, format!(
                                                "flow {name:?}: a second ingress = \"xdp\" input on interface {:?} (the first is flow {other}); an interface holds one XDP program, so give the other inputs ingress = \"packet\"",
                                                input.interface
                                            )));
                                            all_ok = false;
                                        }
                                        None => {
                                            xdp_interfaces.insert(input.interface.clone(), leg);
                                        }
                                    }
                                }
                                let key = (
                                    input.interface.clone(),
                                    input.address,
                                    input.port,
                                    input.source,
                                );
                                match inputs.get(&key) {
                                    // A flow's own legs are compared in `legs`.
                                    Some(other) if other == name => {}
                                    Some(other) => {
                                        self.errors.push((*at, format!(
                                            "flow {name:?}: same input as flow {other:?} ({input}); two flows can't share an input"
                                        )));
                                        all_ok = false;
                                    }
                                    None => {
                                        inputs.insert(key, name.clone());
                                    }
                                }
                            }
                        }
                        if let (Some(f), Some((name, at))) = (&parts.flow, &parts.name) {
                            for o in f.outputs.iter().filter(|o| o.egress == EgressKind::Xdp) {
                                let here = format!("{name} ({})", o.interface);
                                let clash = xdp_egress
                                    .get(&o.interface)
                                    .map(|other| format!("a second egress = \"xdp\" output on interface {:?} (the first is flow {other}); queue 0 of an interface holds one AF_XDP socket, so give the others egress = \"socket\"", o.interface))
                                    .or_else(|| xdp_interfaces.get(&o.interface).map(|other| format!("egress = \"xdp\" on interface {:?}, which has an ingress = \"xdp\" input (flow {other}); queue 0 of an interface holds one AF_XDP socket, so give one of them \"socket\"/\"packet\"", o.interface)));
                                match clash {
                                    Some(why) => {
                                        self.errors.push((*at, format!("flow {name:?}: {why}")));
                                        all_ok = false;
                                    }
                                    None => {
                                        xdp_egress.insert(o.interface.clone(), here);
                                    }
                                }
                            }
                        }
                        for (key, side, at) in &parts.srt_listeners {
                            let name = parts.name.as_ref().map_or("", |(n, _)| n.as_str());
                            let (a, port, id) = key;
                            let id = id.as_deref().map_or_else(
                                || "no stream_id".to_owned(),
                                |s| format!("stream_id {s:?}"),
                            );
                            let listener = SocketAddr::new(*a, *port);
                            if let Some(e) = srt_binds.add(name, *a, *port, *side) {
                                self.errors.push((*at, e));
                                all_ok = false;
                            }
                            match srt_listeners.get(key) {
                                // Two inputs or two outputs of one flow are
                                // compared in `legs` and with the outputs.
                                Some((other, s)) if other == name && s == side => {}
                                // The listener would pick one of the two
                                // for every caller: the other never works.
                                Some((other, _)) if other == name => {
                                    self.errors.push((*at, format!(
                                        "flow {name:?}: SRT listener {listener} with {id} is both an input and an output of this flow; a caller could not say which it wants: give them distinct stream_ids or ports"
                                    )));
                                    all_ok = false;
                                }
                                Some((other, s)) => {
                                    let what = if s == side {
                                        ""
                                    } else if *s == SrtSide::Input {
                                        " (its input)"
                                    } else {
                                        " (its output)"
                                    };
                                    self.errors.push((*at, format!(
                                        "flow {name:?}: SRT listener {listener} with {id} is also flow {other:?}'s{what}; give each flow on one port its own stream_id"
                                    )));
                                    all_ok = false;
                                }
                                None => {
                                    srt_listeners.insert(key.clone(), (name.to_owned(), *side));
                                }
                            }
                        }
                        match parts.flow {
                            Some(f) => flows.push(f),
                            None => all_ok = false,
                        }
                    }
                }
                _ => self.err(
                    &v.span(),
                    format!(
                        "flow must be an array of tables (write [[flow]] for each flow), found {}",
                        v.get_ref().type_str()
                    ),
                ),
            },
        }
        if self.errors.is_empty() && all_ok {
            for (name, through) in loops_between_flows(&flows) {
                let at = name_spans.get(&name).copied().unwrap_or(0);
                self.errors.push((at, format!(
                    "flow {name:?}: its outputs reach its own input through {through}, which would loop; change an output's address or port"
                )));
                all_ok = false;
            }
        }
        if !self.errors.is_empty() || !all_ok {
            return None;
        }
        let flows = match FlowTable::new(flows) {
            Ok(t) => t,
            Err(e) => {
                // Unreachable after the checks above; reported, never a panic.
                self.errors
                    .push((0, format!("internal error building the flow table: {e}")));
                return None;
            }
        };
        Some(Config {
            daemon: daemon?,
            pools: pools?,
            flows,
        })
    }
}

/// Parses and validates a configuration file's text.
///
/// `file_name` is only used to label errors. On failure every problem
/// found is returned, sorted by position, each with line and column.
pub fn parse(text: &str, file_name: &str) -> Result<Config, ConfigErrors> {
    let lines = LineIndex::new(text);
    let make = |lines: &LineIndex<'_>, offset: usize, message: String| {
        let (line, column) = lines.position(offset);
        ConfigError {
            file: file_name.to_owned(),
            line,
            column,
            message,
        }
    };
    // A syntax error is reported once, at the earliest place the parser
    // noticed something wrong; what follows it is not trustworthy.
    let (root, syntax) = DeTable::parse_recoverable(text);
    if let Some(e) = syntax
        .iter()
        .min_by_key(|e| e.span().map_or(0, |s| s.start))
    {
        let offset = e.span().map_or(0, |s| s.start);
        let msg = format!("TOML syntax error: {}", e.message().trim_end());
        return Err(ConfigErrors(vec![make(&lines, offset, msg)]));
    }
    let mut w = Walker {
        lines,
        errors: Vec::new(),
    };
    let config = w.document(root.get_ref());
    match config {
        Some(c) if w.errors.is_empty() => Ok(c),
        _ => {
            let mut errors = std::mem::take(&mut w.errors);
            if errors.is_empty() {
                errors.push((0, "configuration is invalid".to_owned()));
            }
            errors.sort_by_key(|&(offset, _)| offset);
            Err(ConfigErrors(
                errors
                    .into_iter()
                    .map(|(o, m)| make(&w.lines, o, m))
                    .collect(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error of `text`, as displayed.
    pub(super) fn errors(text: &str) -> Vec<String> {
        match parse(text, "t.toml") {
            Ok(_) => panic!("expected errors, got a valid config"),
            Err(e) => e.iter().map(ToString::to_string).collect(),
        }
    }

    /// The single error of `text`, as displayed.
    pub(super) fn error(text: &str) -> String {
        let e = errors(text);
        assert_eq!(e.len(), 1, "expected one error, got {e:#?}");
        e[0].clone()
    }

    /// One flow, with `input` and `outputs` lines supplied by the test.
    fn flow(input: &str, outputs: &str) -> String {
        format!("[[flow]]\nname = \"x\"\ninput = {input}\noutputs = {outputs}\n")
    }

    const IN: &str = r#"{ interface = "eth0", address = "239.1.1.1", port = 5000 }"#;
    const OUT: &str = r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000 }]"#;

    #[test]
    fn latency() {
        let f = |extra: &str| format!("{}{extra}\n", flow(IN, OUT));
        let c = parse(&f(""), "t.toml").expect("valid");
        assert_eq!(c.flows.by_name("x").expect("x").latency, Latency::Normal);
        let c = parse(&f("latency = \"low\""), "t.toml").expect("valid");
        assert_eq!(c.flows.by_name("x").expect("x").latency, Latency::Low);
        assert!(
            error(&f("latency = \"fast\""))
                .contains("latency \"fast\" is not valid; use \"normal\" or \"low\"")
        );
    }

    #[test]
    fn xdp_egress() {
        let out = |o: &str| format!("[{o}]");
        let xdp = r#"{ interface = "eth1", address = "239.2.2.2", port = 6000, egress = "xdp" }"#;
        let c = parse(&flow(IN, &out(xdp)), "t.toml").expect("valid");
        assert_eq!(
            c.flows.by_name("x").expect("x").outputs[0].egress,
            EgressKind::Xdp
        );
        let c = parse(&flow(IN, OUT), "t.toml").expect("valid");
        assert_eq!(
            c.flows.by_name("x").expect("x").outputs[0].egress,
            EgressKind::Socket
        );
        let v6 = r#"{ interface = "eth1", address = "ff3e::1", port = 6000, egress = "xdp" }"#;
        let e = error(&flow(IN, &out(v6)));
        assert!(
            e.contains("egress = \"xdp\" takes IPv4 outputs only"),
            "{e}"
        );
        // A unicast destination is served (its next hop's MAC comes from
        // the neighbour table when the flow starts).
        let unicast =
            r#"{ interface = "eth1", address = "10.0.0.2", port = 6000, egress = "xdp" }"#;
        let c = parse(&flow(IN, &out(unicast)), "t.toml").expect("unicast xdp output");
        assert_eq!(
            c.flows.by_name("x").expect("x").outputs[0].egress,
            EgressKind::Xdp
        );
        let fec = r#"{ interface = "eth1", address = "239.2.2.2", port = 6000, egress = "xdp", fec = { columns = 4, rows = 4 } }"#;
        assert!(error(&flow(IN, &out(fec))).contains("can't be used with fec"));
        let srt = r#"{ address = "0.0.0.0", port = 6000, protocol = "srt", egress = "xdp" }"#;
        assert!(error(&flow(IN, &out(srt))).contains("applies to UDP outputs"));
        let bad = r#"{ interface = "eth1", address = "239.2.2.2", port = 6000, egress = "raw" }"#;
        assert!(error(&flow(IN, &out(bad))).contains("use \"socket\" or \"xdp\""));
        // Queue 0 holds one AF_XDP socket: two xdp outputs on eth1 (two
        // flows, or one flow) are refused; eth1 and eth2 are fine; an xdp
        // input on eth1 beside an xdp output on eth1 is refused.
        let two = format!("[{xdp}, {}]", xdp.replace("239.2.2.2", "239.2.2.3"));
        assert!(
            error(&flow(IN, &two))
                .contains("a second egress = \"xdp\" output on interface \"eth1\"")
        );
        let fan = format!("[{xdp}, {}]", xdp.replace("eth1", "eth2"));
        parse(&flow(IN, &fan), "t.toml").expect("one per interface");
        let xin = r#"{ interface = "eth1", address = "239.1.1.1", port = 5000, ingress = "xdp" }"#;
        let other = format!(
            "{}[[flow]]\nname = \"y\"\ninput = {xin}\noutputs = {OUT}\n",
            flow(IN, &out(xdp))
        );
        assert!(error(&other).contains("which has an egress = \"xdp\" output"));
        let other = format!(
            "{}[[flow]]\nname = \"y\"\ninput = {IN}\noutputs = {}\n",
            flow(xin, OUT),
            out(xdp)
        );
        assert!(error(&other).contains("which has an ingress = \"xdp\" input"));
    }

    #[test]
    fn xdp_ingress() {
        let xdp = r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, ingress = "xdp" }"#;
        let c = parse(&flow(xdp, OUT), "t.toml").expect("valid");
        assert_eq!(
            c.flows.by_name("x").expect("x").inputs[0].ingress,
            IngressKind::Xdp
        );
        let v6 = r#"{ interface = "eth0", address = "ff3e::1", port = 5000, ingress = "xdp" }"#;
        assert!(error(&flow(v6, OUT)).contains("IPv4 inputs only"));
        let fec = r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, ingress = "xdp", fec = "2022-1" }"#;
        assert!(error(&flow(fec, OUT)).contains("fec needs ingress = \"socket\""));
        let rist = r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, ingress = "xdp", protocol = "rist" }"#;
        assert!(error(&flow(rist, OUT)).contains("protocol \"rist\" needs ingress = \"socket\""));
        // One XDP program per interface: a second xdp input on eth0 is
        // refused, one on eth2 is fine.
        let other = |iface: &str| {
            format!(
                "{}[[flow]]\nname = \"y\"\ninput = {{ interface = \"{iface}\", address = \"239.1.1.2\", port = 5000, ingress = \"xdp\" }}\noutputs = [{{ interface = \"eth1\", address = \"239.2.2.3\", port = 6000 }}]\n",
                flow(xdp, OUT)
            )
        };
        assert!(parse(&other("eth2"), "t.toml").is_ok());
        assert!(
            error(&other("eth0"))
                .contains("a second ingress = \"xdp\" input on interface \"eth0\"")
        );
        let two = r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000 },
                      { interface = "eth1", address = "239.2.2.3", port = 6000 }]
spread = 2"#;
        assert!(error(&flow(xdp, two)).contains("spread can't be used with ingress = \"xdp\""));
    }

    #[test]
    fn fec_on_inputs_and_outputs() {
        let input = r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, fec = "2022-1" }"#;
        let output = r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000, fec = { columns = 5, rows = 5 } }]"#;
        let c = parse(&flow(input, output), "t.toml").unwrap();
        let f = c.flows.by_name("x").unwrap();
        assert_eq!(f.primary().fec, Some(InputFec::Smpte2022_1));
        assert_eq!(
            f.outputs[0].fec,
            Some(OutputFec {
                columns: 5,
                rows: 5
            })
        );
        let ports: Vec<u16> = f.receive_inputs().iter().map(|i| i.port).collect();
        assert_eq!(ports, [5000, 5002, 5004]);
        let ports: Vec<u16> = f.send_outputs().iter().map(|o| o.port).collect();
        assert_eq!(ports, [6000, 6002, 6004]);
        let plain = parse(&flow(IN, OUT), "t.toml").unwrap();
        assert_eq!(plain.flows.by_name("x").unwrap().receive_inputs().len(), 1);
        assert_eq!(plain.flows.by_name("x").unwrap().send_outputs().len(), 1);
    }

    #[test]
    fn fec_outside_2022_1_is_an_error_naming_the_fix() {
        let out = |fec: &str| {
            format!(
                r#"[{{ interface = "eth1", address = "239.2.2.2", port = 6000, fec = {fec} }}]"#
            )
        };
        for (fec, fix) in [
            (
                "{ columns = 5, rows = 2 }",
                "rows is 0 (row FEC only) or 4-20",
            ),
            (
                "{ columns = 20, rows = 20 }",
                "columns × rows is at most 100",
            ),
            ("{ columns = 1, rows = 0 }", "needs columns 2-20"),
        ] {
            let e = error(&flow(IN, &out(fec)));
            assert!(e.contains("outside SMPTE 2022-1") && e.contains(fix), "{e}");
        }
        assert!(error(&flow(IN, &out("{ columns = 21, rows = 4 }"))).contains("use 1-20"));
        assert!(error(&flow(IN, &out("{ columns = 5 }"))).contains("rows"));
        assert!(
            error(&flow(IN, &out("{ columns = 5, rows = 5, x = 1 }")))
                .contains("unknown key \"x\"")
        );
        let e = error(&flow(
            r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, fec = "2022-2" }"#,
            OUT,
        ));
        assert!(e.contains("use \"2022-1\""), "{e}");
        let e = error(&flow(
            r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, fec = "2022-1", ingress = "packet" }"#,
            OUT,
        ));
        assert!(e.contains("needs ingress = \"socket\""), "{e}");
        let e = error(&flow(
            r#"{ interface = "eth0", address = "239.1.1.1", port = 65533, fec = "2022-1" }"#,
            OUT,
        ));
        assert!(e.contains("65531"), "{e}");
        let two = r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000, fec = { columns = 5, rows = 5 } },
                      { interface = "eth1", address = "239.2.2.3", port = 6000 }]
spread = 2"#;
        assert!(error(&flow(IN, two)).contains("spread with an output's fec"));
    }

    #[test]
    fn output_fec_beside_an_srt_output() {
        // The extra sockets follow the UDP outputs: the FEC destinations
        // of outputs[1] (config index 1, the first UDP output) are the
        // second and third sockets; the SRT listener is the daemon's own.
        let outs = r#"[{ protocol = "srt", address = "0.0.0.0", port = 9000 },
                       { interface = "eth1", address = "239.2.2.2", port = 6000, fec = { columns = 5, rows = 5 } },
                       { interface = "eth1", address = "10.0.0.9", port = 7000, protocol = "rist" }]"#;
        let c = parse(&flow(IN, outs), "t.toml").unwrap();
        let f = c.flows.by_name("x").unwrap();
        let ports: Vec<u16> = f.send_outputs().iter().map(|o| o.port).collect();
        assert_eq!(ports, [6000, 7000, 6002, 6004, 7001]);
    }

    #[test]
    fn rist_on_inputs_and_outputs() {
        let input = r#"{ interface = "eth0", address = "10.0.0.1", port = 5000, protocol = "rist", buffer_ms = 200 }"#;
        let output = r#"[{ interface = "eth1", address = "10.0.1.2", port = 6000, protocol = "rist" },
                         { interface = "eth1", address = "239.2.2.2", port = 6010, protocol = "udp" }]"#;
        let c = parse(&flow(input, output), "t.toml").unwrap();
        let f = c.flows.by_name("x").unwrap();
        assert_eq!(f.primary().rist, Some(Rist { buffer_ms: 200 }));
        assert_eq!(f.outputs[0].rist, Some(Rist { buffer_ms: 1000 }));
        assert_eq!(f.outputs[1].rist, None);
        let ports: Vec<u16> = f.receive_inputs().iter().map(|i| i.port).collect();
        assert_eq!(ports, [5000, 5001]);
        let ports: Vec<u16> = f.send_outputs().iter().map(|o| o.port).collect();
        assert_eq!(ports, [6000, 6010, 6001]);
    }

    #[test]
    fn rist_errors_name_the_field_and_the_fix() {
        let out = |extra: &str| {
            format!(r#"[{{ interface = "eth1", address = "10.0.1.2", port = 6000{extra} }}]"#)
        };
        let e = error(&flow(IN, &out(", buffer_ms = 200")));
        assert!(
            e.contains("outputs[0].buffer_ms is only for RIST; add protocol = \"rist\""),
            "{e}"
        );
        let e = error(&flow(IN, &out(", protocol = \"rist\", buffer_ms = 0")));
        assert!(
            e.contains("outputs[0].buffer_ms 0 is out of range; use 1-30000"),
            "{e}"
        );
        let e = error(&flow(
            IN,
            r#"[{ interface = "eth1", address = "10.0.1.2", port = 65535, protocol = "rist" }]"#,
        ));
        assert!(e.contains("no port + 1"), "{e}");
        let e = error(&flow(
            r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, protocol = "rist", ingress = "packet" }"#,
            OUT,
        ));
        assert!(e.contains("needs ingress = \"socket\""), "{e}");
        let e = error(&flow(
            r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, protocol = "rtp" }"#,
            OUT,
        ));
        assert!(
            e.contains("input.protocol \"rtp\" is not known; use \"udp\", \"rist\" or \"srt\""),
            "{e}"
        );
        let e = error(&flow(
            r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, protocol = "rist", fec = "2022-1" }"#,
            OUT,
        ));
        assert!(
            e.contains("fec and protocol = \"rist\" on one input"),
            "{e}"
        );
        let e = error(&flow(
            IN,
            r#"[{ protocol = "srt", address = "0.0.0.0", port = 9000, buffer_ms = 5 }]"#,
        ));
        assert!(e.contains("does not apply to an SRT output"), "{e}");
        let two = r#"[{ interface = "eth1", address = "10.0.1.2", port = 6000, protocol = "rist" },
                      { interface = "eth1", address = "239.2.2.3", port = 6000 }]
spread = 2"#;
        assert!(error(&flow(IN, two)).contains("spread with a RIST input or output"));
        let rist_in =
            r#"{ interface = "eth0", address = "10.0.0.1", port = 5000, protocol = "rist" }"#;
        let two = r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000 },
                      { interface = "eth1", address = "239.2.2.3", port = 6000 }]
spread = 2"#;
        assert!(error(&flow(rist_in, two)).contains("spread with a RIST input or output"));
    }

    #[test]
    fn minimal_flow_gets_every_default() {
        let c = parse(&flow(IN, OUT), "t.toml").unwrap();
        assert_eq!(c.daemon, DaemonConfig::default());
        assert_eq!(c.daemon.user, "mcrelay");
        assert_eq!(
            c.daemon.control_socket,
            PathBuf::from("/run/mcrelay/control.sock")
        );
        assert_eq!(c.daemon.cores, None);
        assert_eq!(c.daemon.metrics_listen, None);
        assert_eq!(c.daemon.log_level, "info");
        assert_eq!(
            c.pools,
            PoolCounts {
                small: 1000,
                standard: 500,
                jumbo: 200
            }
        );
        let f = c.flows.by_name("x").unwrap();
        assert_eq!(f.id, FlowKey::from_name("x"));
        assert_eq!(f.primary().ingress, IngressKind::Socket);
        assert_eq!(f.primary().source, None);
        assert_eq!(f.primary().receive_buffer_bytes, 4 * 1024 * 1024);
        assert_eq!(f.outputs[0].ttl, 1);
        assert_eq!(f.outputs[0].queue_depth, 256);
        assert_eq!(f.outputs[0].source_address, None);
        assert_eq!(f.core, None);
    }

    #[test]
    fn metrics_allow_is_a_list_of_ranges_and_never_empty() {
        let text = |allow: &str| {
            format!(
                "[daemon]\nmetrics_listen = \"0.0.0.0:9464\"\nmetrics_allow = {allow}\n{}",
                flow(IN, OUT)
            )
        };
        let c = parse(
            &text(r#"["127.0.0.1/32", "10.0.0.0/8", "fd00::/8"]"#),
            "t.toml",
        )
        .unwrap();
        let allow = c.daemon.metrics_allow.expect("a list");
        assert_eq!(allow.len(), 3);
        assert_eq!(allow[1].to_string(), "10.0.0.0/8");
        assert_eq!(
            parse(&flow(IN, OUT), "t.toml")
                .unwrap()
                .daemon
                .metrics_allow,
            None
        );
        for (allow, want) in [
            ("[]", "daemon.metrics_allow is empty"),
            (
                r#"["10.1.2.3/8"]"#,
                "daemon.metrics_allow[0] = \"10.1.2.3/8\": 10.1.2.3/8 has bits set past the prefix; write 10.0.0.0/8",
            ),
            (
                r#"["127.0.0.1", "ten"]"#,
                "daemon.metrics_allow[1] = \"ten\": \"ten\" is not an IP address; write",
            ),
            (r#""10.0.0.0/8""#, "daemon.metrics_allow must be an array"),
            ("[8]", "daemon.metrics_allow[0] must be a string"),
        ] {
            let e = parse(&text(allow), "t.toml").unwrap_err().to_string();
            assert!(e.contains(want), "{allow}: {e}");
            assert!(e.contains("t.toml:3:"), "{allow}: the line is named: {e}");
        }
    }

    #[test]
    fn unicast_output_ttl_defaults_to_64() {
        let out = r#"[{ interface = "eth1", address = "10.0.0.9", port = 6000 }]"#;
        let c = parse(&flow(IN, out), "t.toml").unwrap();
        assert_eq!(c.flows.by_name("x").unwrap().outputs[0].ttl, 64);
    }

    #[test]
    fn every_key_is_read() {
        let text = r#"
[daemon]
user = "relay"
control_socket = "/run/r.sock"
cores = [3, 1]
metrics_listen = "[::1]:9464"
log_level = "debug"
[pools]
small = 1
standard = 2
jumbo = 3
[[flow]]
name = "v6"
core = 1
input = { interface = "eth0", address = "ff3e::1", port = 5000, source = "2001:db8::1", ingress = "packet", receive_buffer_bytes = 1024 }
outputs = [{ interface = "eth1", address = "239.2.2.2", port = 6000, ttl = 255, source_address = "10.0.0.1", queue_depth = 65536 }]
"#;
        let c = parse(text, "t.toml").unwrap();
        assert_eq!(c.daemon.user, "relay");
        assert_eq!(c.daemon.control_socket, PathBuf::from("/run/r.sock"));
        assert_eq!(c.daemon.cores, Some(vec![3, 1]));
        assert_eq!(c.daemon.metrics_listen, Some("[::1]:9464".parse().unwrap()));
        assert_eq!(c.daemon.log_level, "debug");
        assert_eq!(
            c.pools,
            PoolCounts {
                small: 1,
                standard: 2,
                jumbo: 3
            }
        );
        let f = c.flows.by_name("v6").unwrap();
        assert_eq!(f.core, Some(1));
        assert_eq!(
            f.inputs[0],
            Input {
                interface: "eth0".into(),
                address: "ff3e::1".parse().unwrap(),
                port: 5000,
                source: Some("2001:db8::1".parse().unwrap()),
                ingress: IngressKind::Packet,
                receive_buffer_bytes: 1024,
                fec: None,
                srt: None,
                rist: None,
            }
        );
        assert_eq!(
            f.outputs,
            vec![Output {
                egress: Default::default(),
                interface: "eth1".into(),
                address: "239.2.2.2".parse().unwrap(),
                port: 6000,
                ttl: 255,
                source_address: Some("10.0.0.1".parse().unwrap()),
                queue_depth: 65536,
                fec: None,
                rist: None,
                srt: None,
            }]
        );
    }

    #[test]
    fn deploy_example_is_valid() {
        let c = parse(include_str!("../../../deploy/mcrelay.toml"), "mcrelay.toml").unwrap();
        assert!(c.flows.len() >= 2);
        // SSM, on a leg marked as a placeholder for the second sender.
        assert!(
            c.flows
                .iter()
                .any(|f| f.inputs.iter().any(|i| i.source.is_some()))
        );
        assert!(
            c.flows
                .iter()
                .any(|f| f.primary().ingress == IngressKind::Packet)
        );
        assert!(
            c.flows
                .iter()
                .any(|f| f.inputs.len() == 2 && matches!(f.redundancy, Redundancy::Merge { .. }))
        );
    }

    #[test]
    fn zero_flows_is_valid_and_summarised() {
        let c = parse("", "t.toml").unwrap();
        assert!(c.flows.is_empty());
        assert_eq!(
            c.summary(),
            "ok: 0 flows (the daemon will idle until a reload adds one), 0 outputs, \
             cores: all CPUs in the affinity mask, pool memory 5.1 MiB per core \
             (1000 small, 500 standard, 200 jumbo)"
        );
    }

    #[test]
    fn syntax_error_is_one_error_with_position() {
        assert_eq!(
            error("[daemon]\nuser = \"a\"\nuser = \"b\"\n"),
            "t.toml:3:1: TOML syntax error: duplicate key"
        );
        assert_eq!(
            error("[[flow]\n"),
            "t.toml:1:8: TOML syntax error: unclosed array table, expected `]`"
        );
    }

    #[test]
    fn unknown_key_in_input() {
        let input = r#"{ interface = "eth0", adress = "239.1.1.1", port = 5000 }"#;
        assert_eq!(
            errors(&flow(input, OUT)),
            [
                "t.toml:3:9: flow \"x\": input.address is missing; add address = \"239.1.1.1\"",
                "t.toml:3:31: flow \"x\": unknown key \"adress\" in input (expected one of: \
                 interface, address, port, source, ingress, receive_buffer_bytes, fec, protocol, buffer_ms, mode, latency_ms, passphrase, key_length, stream_id)",
            ]
        );
    }

    #[test]
    fn unknown_keys_everywhere() {
        let text = format!(
            "colour = 1\n[daemon]\nusr = \"a\"\n[pools]\ntiny = 1\n{}core_ = 1\n",
            flow(
                IN,
                r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000, tll = 2 }]"#
            )
        );
        assert_eq!(
            errors(&text),
            [
                "t.toml:1:1: unknown key \"colour\" (expected one of: daemon, pools, flow)",
                "t.toml:3:1: unknown key \"usr\" in daemon (expected one of: user, control_socket, cores, metrics_listen, metrics_allow, log_level, mode)",
                "t.toml:5:1: unknown key \"tiny\" in pools (expected one of: small, standard, jumbo)",
                "t.toml:9:70: flow \"x\": unknown key \"tll\" in outputs[0] (expected one of: interface, address, port, ttl, source_address, queue_depth, fec, protocol, mode, latency_ms, passphrase, key_length, max_callers, stream_id, buffer_ms, egress)",
                "t.toml:10:1: flow \"x\": unknown key \"core_\" (expected one of: name, input, inputs, outputs, core, spread, latency, payload, silence_ms, rtp_clock_hz, redundancy, merge_delay_ms, merge_window_ms, failover_after_ms, failover_gap_factor, revert_after_s, rtp_rewrite)",
            ]
        );
    }

    #[test]
    fn bad_input_address() {
        let input = r#"{ interface = "eth0", address = "239.1.1.300", port = 5000 }"#;
        assert_eq!(
            error(&flow(input, OUT)),
            "t.toml:3:41: flow \"x\": input.address 239.1.1.300 is not an IP address"
        );
    }

    #[test]
    fn bad_output_and_source_addresses() {
        let input =
            r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, source = "nope" }"#;
        let out = r#"[{ interface = "eth1", address = "host.example", port = 6000, source_address = "1.2.3" }]"#;
        assert_eq!(
            errors(&flow(input, out)),
            [
                "t.toml:3:76: flow \"x\": input.source nope is not an IP address",
                "t.toml:4:44: flow \"x\": outputs[0].address host.example is not an IP address",
                "t.toml:4:90: flow \"x\": outputs[0].source_address 1.2.3 is not an IP address",
            ]
        );
    }

    #[test]
    fn unspecified_addresses() {
        let input = r#"{ interface = "eth0", address = "0.0.0.0", port = 5000 }"#;
        let out = r#"[{ interface = "eth1", address = "::", port = 6000 }]"#;
        assert_eq!(
            errors(&flow(input, out)),
            [
                "t.toml:3:41: flow \"x\": input.address 0.0.0.0 is unspecified; use a multicast group or a local unicast address",
                "t.toml:4:44: flow \"x\": outputs[0].address :: is unspecified; use a multicast group or a unicast host",
            ]
        );
    }

    #[test]
    fn port_zero() {
        let input = r#"{ interface = "eth0", address = "239.1.1.1", port = 0 }"#;
        assert_eq!(
            error(&flow(input, OUT)),
            "t.toml:3:61: flow \"x\": input.port 0 is not allowed; use 1-65535"
        );
        let out = r#"[{ interface = "eth1", address = "239.2.2.2", port = 0 }]"#;
        assert_eq!(
            error(&flow(IN, out)),
            "t.toml:4:64: flow \"x\": outputs[0].port 0 is not allowed; use 1-65535"
        );
    }

    #[test]
    fn port_out_of_range() {
        let input = r#"{ interface = "eth0", address = "239.1.1.1", port = 65536 }"#;
        assert_eq!(
            error(&flow(input, OUT)),
            "t.toml:3:61: flow \"x\": input.port 65536 is out of range; use 1-65535"
        );
        let input = r#"{ interface = "eth0", address = "239.1.1.1", port = -1 }"#;
        assert_eq!(
            error(&flow(input, OUT)),
            "t.toml:3:61: flow \"x\": input.port -1 is out of range; use 1-65535"
        );
    }

    #[test]
    fn source_family_mismatch() {
        let input =
            r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, source = "2001:db8::1" }"#;
        assert_eq!(
            error(&flow(input, OUT)),
            "t.toml:3:76: flow \"x\": input.source 2001:db8::1 is IPv6 but input.address 239.1.1.1 is IPv4; use the same family"
        );
    }

    #[test]
    fn output_source_address_family_mismatch() {
        let out = r#"[{ interface = "eth1", address = "ff3e::1", port = 6000, source_address = "10.0.0.1" }]"#;
        assert_eq!(
            error(&flow(IN, out)),
            "t.toml:4:85: flow \"x\": outputs[0].source_address 10.0.0.1 is IPv4 but outputs[0].address ff3e::1 is IPv6; use the same family"
        );
    }

    #[test]
    fn output_family_may_differ_from_input() {
        let out = r#"[{ interface = "eth1", address = "ff3e::1", port = 6000 }]"#;
        assert!(parse(&flow(IN, out), "t.toml").is_ok());
    }

    #[test]
    fn source_on_unicast_input() {
        let input =
            r#"{ interface = "eth0", address = "10.0.0.1", port = 5000, source = "10.0.0.2" }"#;
        assert_eq!(
            error(&flow(input, OUT)),
            "t.toml:3:75: flow \"x\": input.source is only valid with a multicast input.address (10.0.0.1 is unicast); remove source"
        );
    }

    #[test]
    fn multicast_source_addresses() {
        let input =
            r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, source = "239.9.9.9" }"#;
        let out = r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000, source_address = "239.9.9.9" }]"#;
        assert_eq!(
            errors(&flow(input, out)),
            [
                "t.toml:3:76: flow \"x\": input.source 239.9.9.9 is not a unicast address; use the sender's address",
                "t.toml:4:87: flow \"x\": outputs[0].source_address 239.9.9.9 is not a unicast address; use an address of the egress interface",
            ]
        );
    }

    #[test]
    fn duplicate_flow_names() {
        let text = format!(
            "{}{}",
            flow(IN, OUT),
            flow(IN.replace("5000", "5001").as_str(), OUT)
        );
        assert_eq!(
            error(&text),
            "t.toml:6:8: flow \"x\": duplicate flow name (first defined at line 2); give each flow a unique name"
        );
    }

    #[test]
    fn two_flows_with_the_same_input() {
        let text = format!(
            "{}{}",
            flow(IN, OUT),
            flow(IN, OUT).replace("\"x\"", "\"y\"")
        );
        assert_eq!(
            error(&text),
            "t.toml:7:9: flow \"y\": same input as flow \"x\" (eth0 239.1.1.1:5000); two flows can't share an input"
        );
        // A different SSM source is a different input.
        let ssm = IN.replace("5000", "5000, source = \"10.1.1.1\"");
        let text = format!(
            "{}{}",
            flow(IN, OUT),
            flow(&ssm, OUT).replace("\"x\"", "\"y\"")
        );
        assert!(parse(&text, "t.toml").is_ok());
        // Two identical SSM inputs name the source.
        let text = format!(
            "{}{}",
            flow(&ssm, OUT),
            flow(&ssm, OUT).replace("\"x\"", "\"y\"")
        );
        assert_eq!(
            error(&text),
            "t.toml:7:9: flow \"y\": same input as flow \"x\" (eth0 239.1.1.1:5000 from 10.1.1.1); two flows can't share an input"
        );
    }

    #[test]
    fn output_equal_to_input_loops() {
        let out = r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000 }, { interface = "eth0", address = "239.1.1.1", port = 5000 }]"#;
        assert_eq!(
            error(&flow(IN, out)),
            "t.toml:4:72: flow \"x\": outputs[1] (eth0 239.1.1.1:5000) sends to the flow's own input (eth0 239.1.1.1:5000), which would loop; change the address or port"
        );
        // The same group and port on another interface is a relay, not a loop.
        let out = r#"[{ interface = "eth1", address = "239.1.1.1", port = 5000 }]"#;
        assert!(parse(&flow(IN, out), "t.toml").is_ok());
    }

    #[test]
    fn the_reported_storm_configs_are_refused() {
        // An IPv4-mapped IPv6 output equal to the input group (issue 27:
        // 1.48 M datagrams in 3 s from one).
        let text = flow(
            IN,
            r#"[{ interface = "eth0", address = "::ffff:239.1.1.1", port = 5000 }]"#,
        );
        assert_eq!(
            error(&text),
            "t.toml:4:12: flow \"x\": outputs[0] (eth0 [::ffff:239.1.1.1]:5000) sends to the flow's own input (eth0 239.1.1.1:5000), which would loop; change the address or port"
        );
        // The relay's own unicast input address, through another interface.
        let text = flow(
            r#"{ interface = "eth0", address = "10.0.0.1", port = 5000 }"#,
            r#"[{ interface = "eth1", address = "10.0.0.1", port = 5000 }]"#,
        );
        assert!(error(&text).contains("sends to the flow's own input (eth0 10.0.0.1:5000)"));
        // And the reverse: a mapped input, a plain output.
        let text = flow(
            r#"{ interface = "eth0", address = "::ffff:10.0.0.1", port = 5000 }"#,
            r#"[{ interface = "eth1", address = "10.0.0.1", port = 5000 }]"#,
        );
        assert!(
            error(&text).contains("which would loop"),
            "{}",
            error(&text)
        );
        // Another port or address is not a loop.
        let text = flow(
            IN,
            r#"[{ interface = "eth1", address = "::ffff:239.1.1.1", port = 5001 }]"#,
        );
        assert!(parse(&text, "t.toml").is_ok());
    }

    #[test]
    fn flows_feeding_each_other_in_a_circle_are_refused() {
        let a = flow(
            IN,
            r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000 }]"#,
        );
        let b = flow(
            r#"{ interface = "eth1", address = "239.2.2.2", port = 6000 }"#,
            r#"[{ interface = "eth2", address = "239.3.3.3", port = 7000 }]"#,
        )
        .replace("\"x\"", "\"y\"");
        // A chain is fine.
        assert!(parse(&format!("{a}{b}"), "t.toml").is_ok());
        // Closing it through a third flow is a loop, reported on each.
        let c = flow(
            r#"{ interface = "eth2", address = "239.3.3.3", port = 7000 }"#,
            r#"[{ interface = "eth0", address = "239.1.1.1", port = 5000 }]"#,
        )
        .replace("\"x\"", "\"z\"");
        let e = parse(&format!("{a}{b}{c}"), "t.toml").unwrap_err();
        assert_eq!(
            e.messages(),
            [
                "flow \"x\": its outputs reach its own input through \"x\" -> \"y\" -> \"z\" -> \"x\", which would loop; change an output's address or port",
                "flow \"y\": its outputs reach its own input through \"y\" -> \"z\" -> \"x\" -> \"y\", which would loop; change an output's address or port",
                "flow \"z\": its outputs reach its own input through \"z\" -> \"x\" -> \"y\" -> \"z\", which would loop; change an output's address or port",
            ]
        );
        assert_eq!(e.iter().next().map(|e| e.line), Some(2));
    }

    /// The loop check by endpoint finds what comparing every output with
    /// every other flow's inputs (the check before it) finds, the same
    /// paths in the same order, on flows drawn from a few groups, ports
    /// and interfaces so that many feed each other.
    #[test]
    fn loops_by_endpoint_are_the_loops_by_pairs() {
        fn by_pairs(flows: &[Flow]) -> Vec<(String, String)> {
            let n = flows.len();
            let mut found = Vec::new();
            for start in 0..n {
                let edges = |i: usize| -> Vec<usize> {
                    (0..n)
                        .filter(|&j| {
                            j != i
                                && flows[i]
                                    .outputs
                                    .iter()
                                    .any(|o| flows[j].inputs.iter().any(|inp| reaches(o, inp)))
                        })
                        .collect()
                };
                let mut from = vec![None; n];
                let mut seen = vec![false; n];
                seen[start] = true;
                let mut queue = std::collections::VecDeque::from([start]);
                let mut closing = None;
                'bfs: while let Some(i) = queue.pop_front() {
                    for j in edges(i) {
                        if j == start {
                            closing = Some(i);
                            break 'bfs;
                        }
                        if !seen[j] {
                            seen[j] = true;
                            from[j] = Some(i);
                            queue.push_back(j);
                        }
                    }
                }
                if let Some(mut last) = closing {
                    let mut back = Vec::new();
                    while last != start {
                        back.push(format!("{:?}", flows[last].name));
                        last = from[last].unwrap_or(start);
                    }
                    back.reverse();
                    let name = format!("{:?}", flows[start].name);
                    let through = [vec![name.clone()], back, vec![name]].concat().join(" -> ");
                    found.push((flows[start].name.clone(), through));
                }
            }
            found
        }
        /// A few groups (and a unicast address), two ports, two
        /// interfaces, drawn by xorshift.
        struct Draw(u64);
        impl Draw {
            fn next(&mut self, m: usize) -> usize {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                usize::try_from(self.0 % 1024).unwrap_or(0) % m
            }
            fn endpoint(&mut self, address: &mut IpAddr, port: &mut u16, interface: &mut String) {
                *address = [
                    IpAddr::from([239, 0, 0, 1]),
                    IpAddr::from([239, 0, 0, 2]),
                    IpAddr::from([239, 0, 0, 3]),
                    IpAddr::from([10, 0, 0, 1]),
                ][self.next(4)];
                *port = [5000, 5001][self.next(2)];
                *interface = ["eth0", "eth1"][self.next(2)].to_owned();
            }
        }
        let template = parse(&flow(IN, OUT), "t.toml")
            .expect("one flow")
            .flows
            .as_slice()[0]
            .clone();
        let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
        for round in 0..20 {
            let mut flows = Vec::new();
            for k in 0..60 {
                let mut f = template.clone();
                f.name = format!("f{round}-{k}");
                for input in &mut f.inputs {
                    draw.endpoint(&mut input.address, &mut input.port, &mut input.interface);
                }
                let out = f.outputs[0].clone();
                let outputs = 1 + draw.next(3);
                f.outputs = (0..outputs)
                    .map(|_| {
                        let mut o = out.clone();
                        draw.endpoint(&mut o.address, &mut o.port, &mut o.interface);
                        o
                    })
                    .collect();
                flows.push(f);
            }
            let want = by_pairs(&flows);
            assert_eq!(loops_between_flows(&flows), want, "round {round}");
            if round == 0 {
                assert!(!want.is_empty(), "the draw makes loops");
            }
        }
    }

    #[test]
    fn duplicate_outputs() {
        let out = r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000 }, { interface = "eth1", address = "239.2.2.2", port = 6000, ttl = 4 }]"#;
        assert_eq!(
            error(&flow(IN, out)),
            "t.toml:4:72: flow \"x\": outputs[1] is the same as outputs[0] (eth1 239.2.2.2:6000); remove one"
        );
    }

    #[test]
    fn ttl_out_of_range() {
        let out = r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000 }, { interface = "eth1", address = "239.2.2.3", port = 6000, ttl = 0 }]"#;
        assert_eq!(
            error(&flow(IN, out)),
            "t.toml:4:136: flow \"x\": outputs[1].ttl 0 is out of range; use 1-255"
        );
        let out = r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000, ttl = 256 }]"#;
        assert_eq!(
            error(&flow(IN, out)),
            "t.toml:4:76: flow \"x\": outputs[0].ttl 256 is out of range; use 1-255"
        );
    }

    #[test]
    fn empty_outputs() {
        assert_eq!(
            error(&flow(IN, "[]")),
            "t.toml:4:11: flow \"x\": outputs is empty; add at least one output"
        );
    }

    #[test]
    fn missing_required_keys() {
        assert_eq!(
            errors("[[flow]]\ninput = { port = 1 }\n"),
            [
                "t.toml:1:1: flow[0]: name is missing; add name = \"camera-1\"",
                "t.toml:1:1: flow[0]: outputs is missing; add outputs = [{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }]",
                "t.toml:2:9: flow[0]: input.interface is missing; add interface = \"eth0\"",
                "t.toml:2:9: flow[0]: input.address is missing; add address = \"239.1.1.1\"",
            ]
        );
        assert_eq!(
            errors("[[flow]]\nname = \"x\"\noutputs = [{}]\n"),
            [
                "t.toml:1:1: flow \"x\": input is missing; add input = { interface = \"eth0\", address = \"239.1.1.1\", port = 5000 }",
                "t.toml:3:12: flow \"x\": outputs[0].interface is missing; add interface = \"eth1\"",
                "t.toml:3:12: flow \"x\": outputs[0].address is missing; add address = \"239.2.2.2\"",
                "t.toml:3:12: flow \"x\": outputs[0].port is missing; add port = 6000",
            ]
        );
    }

    #[test]
    fn flow_name_rules() {
        let text = flow(IN, OUT).replace("\"x\"", "\"\"");
        assert_eq!(
            error(&text),
            "t.toml:2:8: flow[0]: name is empty; give each flow a unique, non-empty name"
        );
        let text = flow(IN, OUT).replace("\"x\"", "\"a\\tb\"");
        assert_eq!(
            error(&text),
            "t.toml:2:8: flow[0]: name \"a\\tb\" contains control characters; use printable characters"
        );
    }

    #[test]
    fn flow_names_with_format_or_bidi_characters_are_refused() {
        for c in [
            '\u{2028}',
            '\u{2029}',
            '\u{202A}',
            '\u{202B}',
            '\u{202C}',
            '\u{202D}',
            '\u{202E}',
            '\u{2066}',
            '\u{2067}',
            '\u{2068}',
            '\u{2069}',
            '\u{200E}',
            '\u{200F}',
            '\u{200B}',
            '\u{FEFF}',
            '\u{00AD}',
            '\u{061C}',
            '\u{E0041}',
            '\u{0085}',
            '\u{009B}',
        ] {
            let name = format!("cam{c}era");
            let text = flow(IN, OUT).replace("\"x\"", &format!("\"{name}\""));
            let e = error(&text);
            assert!(e.starts_with("t.toml:2:8: flow[0]: name "), "{c:?}: {e}");
            assert!(
                e.contains("control characters") || e.contains(&format!("U+{:04X}", u32::from(c))),
                "{c:?}: {e}"
            );
            // The message itself never carries the character.
            assert!(!e.contains(c), "{c:?} in {e}");
        }
        // Printable names of every script are fine.
        for name in ["camera-1", "Kamera Süd", "カメラ", "كاميرا", "cam😀"] {
            let text = flow(IN, OUT).replace("\"x\"", &format!("\"{name}\""));
            let c = parse(&text, "t.toml").unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(c.flows.by_name(name).is_some());
        }
    }

    #[test]
    fn flow_names_are_at_most_255_bytes() {
        let ok = "n".repeat(MAX_FLOW_NAME_BYTES);
        let text = flow(IN, OUT).replace("\"x\"", &format!("\"{ok}\""));
        assert!(parse(&text, "t.toml").is_ok());
        // 1020 bytes used to pass and then stop the daemon at start.
        for len in [MAX_FLOW_NAME_BYTES + 1, 1020, 4000] {
            let long = "n".repeat(len);
            let text = flow(IN, OUT).replace("\"x\"", &format!("\"{long}\""));
            assert_eq!(
                error(&text),
                format!(
                    "t.toml:2:8: flow[0]: name is {len} bytes long; the limit is 255: use a shorter name"
                )
            );
        }
    }

    #[test]
    fn wrong_types() {
        let text = "daemon = 1\npools = { small = \"many\" }\n[[flow]]\nname = 7\ninput = \"eth0\"\noutputs = { a = 1 }\ncore = 1.5\n";
        assert_eq!(
            errors(text),
            [
                "t.toml:1:10: daemon must be a table, found integer",
                "t.toml:2:19: pools.small must be an integer, found string",
                "t.toml:4:8: flow[0]: name must be a string, found integer",
                "t.toml:5:9: flow[0]: input must be a table, found string",
                "t.toml:6:11: flow[0]: outputs must be an array of tables, found table",
                "t.toml:7:8: flow[0]: core must be an integer, found float",
            ]
        );
        assert_eq!(
            error("[flow]\nname = \"x\"\n"),
            "t.toml:1:1: flow must be an array of tables (write [[flow]] for each flow), found table"
        );
        assert_eq!(
            error(&flow(IN, "[\"eth1\"]")),
            "t.toml:4:12: flow \"x\": outputs[0] must be a table, found string"
        );
    }

    #[test]
    fn health_settings() {
        let f = |extra: &str| format!("{}{extra}\n", flow(IN, OUT));
        let c = parse(&f(""), "t.toml").unwrap();
        assert_eq!(c.flows.as_slice()[0].health, Health::default());
        assert_eq!(
            (
                Health::default().payload,
                Health::default().silence_ms,
                Health::default().rtp_clock_hz
            ),
            (Payload::Udp, 1000, 90_000)
        );
        let c = parse(
            &f("payload = \"rtp-mpegts\"\nsilence_ms = 250\nrtp_clock_hz = 27000000"),
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            c.flows.as_slice()[0].health,
            Health {
                payload: Payload::RtpMpegts,
                silence_ms: 250,
                rtp_clock_hz: 27_000_000
            }
        );
        for p in ["udp", "rtp", "mpegts", "rtp-mpegts"] {
            let c = parse(&f(&format!("payload = \"{p}\"")), "t.toml").unwrap();
            assert_eq!(c.flows.as_slice()[0].health.payload.as_str(), p);
        }
        assert_eq!(
            error(&f("payload = \"rtp_mpegts\"")),
            "t.toml:5:11: flow \"x\": payload \"rtp_mpegts\" is not valid; use \"udp\", \"rtp\", \"mpegts\" or \"rtp-mpegts\""
        );
        assert_eq!(
            error(&f("silence_ms = 0")),
            "t.toml:5:14: flow \"x\": silence_ms 0 is out of range; use 1-86400000"
        );
        assert_eq!(
            error(&f("rtp_clock_hz = -1")),
            "t.toml:5:16: flow \"x\": rtp_clock_hz -1 is out of range; use 1-1000000000"
        );
        assert!(error(&f("payload = 3")).starts_with("t.toml:5:11: flow \"x\": payload"));
    }

    #[test]
    fn ingress_values() {
        let input =
            r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, ingress = "raw" }"#;
        assert_eq!(
            error(&flow(input, OUT)),
            "t.toml:3:77: flow \"x\": input.ingress \"raw\" is not valid; use \"socket\", \"packet\" or \"xdp\""
        );
    }

    #[test]
    fn interface_names() {
        let long = r#"{ interface = "a-very-long-ifname", address = "239.1.1.1", port = 5000 }"#;
        assert_eq!(
            error(&flow(long, OUT)),
            "t.toml:3:23: flow \"x\": input.interface \"a-very-long-ifname\" is not a valid interface name; use 1-15 bytes without '/', ':' or whitespace"
        );
        for bad in ["", "eth/0", "eth 0", "eth0:1", ".."] {
            let out = format!(r#"[{{ interface = "{bad}", address = "239.2.2.2", port = 6000 }}]"#);
            assert_eq!(
                error(&flow(IN, &out)),
                format!(
                    "t.toml:4:26: flow \"x\": outputs[0].interface {bad:?} is not a valid interface name; use 1-15 bytes without '/', ':' or whitespace"
                )
            );
        }
        let ok = r#"{ interface = "enp129s0f1np1", address = "239.1.1.1", port = 5000 }"#;
        assert!(parse(&flow(ok, OUT), "t.toml").is_ok());
    }

    #[test]
    fn queue_depth_and_receive_buffer_ranges() {
        let input = r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, receive_buffer_bytes = 0 }"#;
        let out =
            r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000, queue_depth = 65537 }]"#;
        assert_eq!(
            errors(&flow(input, out)),
            [
                "t.toml:3:90: flow \"x\": input.receive_buffer_bytes 0 is out of range; use 1-2147483647",
                "t.toml:4:84: flow \"x\": outputs[0].queue_depth 65537 is out of range; use 1-65536",
            ]
        );
    }

    #[test]
    fn pool_count_zero_and_too_large() {
        assert_eq!(
            errors("[pools]\nsmall = 0\nstandard = -3\njumbo = 1000001\n"),
            [
                "t.toml:2:9: pools.small 0 is not allowed; use at least 1",
                "t.toml:3:12: pools.standard -3 is not allowed; use at least 1",
                "t.toml:4:9: pools.jumbo 1000001 is too large; use at most 1000000",
            ]
        );
    }

    #[test]
    fn pool_memory_bound() {
        // 1000 x 1500 + 500 x 4096 + 200000 x 9000 = 1720.0 MiB per core.
        assert_eq!(
            error("[daemon]\ncores = [0, 1, 2, 3]\n[pools]\njumbo = 200000\n"),
            "t.toml:3:1: pools: 1720.0 MiB per core x 4 cores exceeds the 4096 MiB limit; reduce the pool counts or cores"
        );
        // Without daemon.cores the bound counts one core.
        assert_eq!(
            error("[pools]\njumbo = 1000000\n"),
            "t.toml:1:1: pools: 8586.5 MiB per core x 1 core exceeds the 4096 MiB limit; reduce the pool counts or cores"
        );
        // Two cores of the same pools fit.
        assert!(
            parse(
                "[daemon]\ncores = [0, 1]\n[pools]\njumbo = 200000\n",
                "t.toml"
            )
            .is_ok()
        );
        // Without [pools] the error points at cores.
        let many: Vec<String> = (0..1000).map(|c| c.to_string()).collect();
        let text = format!("[daemon]\ncores = [{}]\n", many.join(", "));
        assert_eq!(
            error(&text),
            "t.toml:2:9: pools: 5.1 MiB per core x 1000 cores exceeds the 4096 MiB limit; reduce the pool counts or cores"
        );
    }

    #[test]
    fn daemon_values() {
        let text = "[daemon]\nuser = \"\"\ncontrol_socket = \"run/x.sock\"\nmetrics_listen = \"localhost\"\nlog_level = \"verbose\"\n";
        assert_eq!(
            errors(text),
            [
                "t.toml:2:8: daemon.user \"\" is not a valid user name; use an existing account such as \"mcrelay\"",
                "t.toml:3:18: daemon.control_socket \"run/x.sock\" is not an absolute path; use e.g. \"/run/mcrelay/control.sock\"",
                "t.toml:4:18: daemon.metrics_listen localhost is not a socket address; use IP:PORT, e.g. \"127.0.0.1:9464\"",
                "t.toml:5:13: daemon.log_level \"verbose\" is not valid; use one of: error, warn, info, debug, trace",
            ]
        );
        let long = format!("[daemon]\ncontrol_socket = \"/{}\"\n", "a".repeat(107));
        assert_eq!(
            error(&long),
            "t.toml:2:18: daemon.control_socket is 108 bytes long; use a path of at most 107 bytes without NUL"
        );
    }

    #[test]
    fn daemon_mode() {
        assert_eq!(
            parse("", "t.toml").unwrap().daemon.mode,
            crate::Mode::Active
        );
        for (word, mode) in [
            ("active", crate::Mode::Active),
            ("standby", crate::Mode::Standby),
        ] {
            let text = format!("[daemon]\nmode = \"{word}\"\n");
            assert_eq!(parse(&text, "t.toml").unwrap().daemon.mode, mode);
        }
        assert_eq!(
            error("[daemon]\nmode = \"backup\"\n"),
            "t.toml:2:8: daemon.mode \"backup\" is not valid; use \"active\" (relay from the start) or \"standby\" (receive, send nothing until `mcrelayctl active`)"
        );
        assert_eq!(
            error("[daemon]\nmode = 1\n"),
            "t.toml:2:8: daemon.mode must be a string, found integer"
        );
    }

    #[test]
    fn cores_rules() {
        assert_eq!(
            error("[daemon]\ncores = []\n"),
            "t.toml:2:9: daemon.cores is empty; list at least one CPU, or remove cores to use every CPU in the affinity mask"
        );
        assert_eq!(
            error("[daemon]\ncores = [1, 2, 1]\n"),
            "t.toml:2:16: daemon.cores lists CPU 1 twice; list each CPU once"
        );
        assert_eq!(
            errors("[daemon]\ncores = [-1, 8191, 8192]\n"),
            [
                "t.toml:2:10: daemon.cores[0] -1 is out of range; use 0-8191",
                "t.toml:2:20: daemon.cores[2] 8192 is out of range; use 0-8191",
            ]
        );
    }

    #[test]
    fn flow_core_must_be_a_worker() {
        let text = format!("[daemon]\ncores = [2, 3]\n{}core = 5\n", flow(IN, OUT));
        assert_eq!(
            error(&text),
            "t.toml:7:8: flow \"x\": core 5 is not one of daemon.cores [2, 3]; use one of them or remove core"
        );
        // Without daemon.cores any CPU is accepted here and checked at start-up.
        let text = format!("{}core = 5\n", flow(IN, OUT));
        assert_eq!(
            parse(&text, "t.toml")
                .unwrap()
                .flows
                .by_name("x")
                .unwrap()
                .core,
            Some(5)
        );
    }

    #[test]
    fn all_errors_are_reported_in_file_order() {
        let text = "[[flow]]\nname = \"a\"\ninput = { interface = \"eth0\", address = \"239.1.1.300\", port = 0 }\noutputs = []\n\
                    [pools]\nsmall = 0\n";
        assert_eq!(
            errors(text),
            [
                "t.toml:3:41: flow \"a\": input.address 239.1.1.300 is not an IP address",
                "t.toml:3:63: flow \"a\": input.port 0 is not allowed; use 1-65535",
                "t.toml:4:11: flow \"a\": outputs is empty; add at least one output",
                "t.toml:6:9: pools.small 0 is not allowed; use at least 1",
            ]
        );
    }

    #[test]
    fn columns_count_characters() {
        let text = "[[flow]]\nname = \"kamera-ü\"\ninput = { interface = \"eth0\", address = \"x\", port = 5000 }\n";
        let e = parse(text, "t.toml").unwrap_err();
        assert_eq!(
            e.0[0].to_string(),
            "t.toml:1:1: flow \"kamera-ü\": outputs is missing; add outputs = [{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }]"
        );
        let text = "# ü\nx = 1\n";
        assert_eq!(
            error(text),
            "t.toml:2:1: unknown key \"x\" (expected one of: daemon, pools, flow)"
        );
        let text = "a = \"ü\" b\n";
        assert_eq!(
            error(text),
            "t.toml:1:9: TOML syntax error: unexpected key or value, expected newline, `#`"
        );
    }
}
