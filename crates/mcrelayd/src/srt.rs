//! The daemon's SRT outputs and inputs (`protocol = "srt"`): one SRT
//! thread for the process ([`mcrelay_srt::SrtService`]), started by the
//! first flow that has one. For each SRT output a flow opens, the daemon
//! makes a socket pair: the worker gets one end as that output's socket
//! (it sends to it like to any output, bounded by its `queue_depth`), the
//! SRT thread reads the other and serves the callers. An SRT input is the
//! same the other way: the SRT thread writes what its peer sends into a
//! pair whose other end is the leg's socket the worker receives on. SRT sockets need no privilege: the
//! daemon opens them itself, after the privilege drop (docs/security.md).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use mcrelay_config::{Flow, SrtMode, SrtOutput};
use mcrelay_srt::service::FEED_BUFFER_BYTES;
use mcrelay_srt::{OutputSpec, RouteView, SrtService, feed_pair, input_pair};

/// The SRT thread, or the outputs waiting for it. It starts only after
/// the privilege drop ([`privileges_dropped`]): a thread (libsrt's own
/// included) created before it would keep the capabilities, which are
/// per thread.
enum State {
    Waiting(Vec<Waiting>),
    Running(SrtService),
    Failed(String),
}

/// An SRT output, or an SRT input (its leg), waiting for the thread.
type Waiting = (OutputSpec, OwnedFd, Option<usize>);

static STATE: Mutex<State> = Mutex::new(State::Waiting(Vec::new()));
static DROPPED: AtomicBool = AtomicBool::new(false);

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn start(st: &mut State) {
    if let State::Waiting(waiting) = st {
        let waiting = std::mem::take(waiting);
        *st = match SrtService::start() {
            Ok(svc) => {
                for (spec, feed, leg) in waiting {
                    match leg {
                        None => svc.add(spec, feed),
                        Some(leg) => svc.add_input(spec, leg, feed),
                    }
                }
                State::Running(svc)
            }
            Err(e) => {
                tracing::error!(error = %e, "SRT thread can't start; SRT outputs serve no caller");
                State::Failed(e.to_string())
            }
        };
    }
}

/// Called once privileges are dropped: the SRT thread may start, and
/// does if a flow has an SRT output.
pub fn privileges_dropped() {
    DROPPED.store(true, Ordering::SeqCst);
    let mut st = state();
    if matches!(&*st, State::Waiting(w) if !w.is_empty()) {
        start(&mut st);
    }
}

/// Hands an SRT output (`leg` `None`) or input to the SRT thread.
fn add(spec: OutputSpec, feed: OwnedFd, leg: Option<usize>) -> std::io::Result<()> {
    let mut st = state();
    if matches!(&*st, State::Waiting(_)) && DROPPED.load(Ordering::SeqCst) {
        start(&mut st);
    }
    match &mut *st {
        State::Waiting(w) => w.push((spec, feed, leg)),
        State::Running(svc) => match leg {
            None => svc.add(spec, feed),
            Some(leg) => svc.add_input(spec, leg, feed),
        },
        State::Failed(e) => return Err(std::io::Error::other(format!("SRT thread: {e}"))),
    }
    Ok(())
}

/// Stops the SRT thread (closing every SRT socket), if it runs; before
/// the process exits.
pub fn shutdown() {
    let svc = {
        let mut st = state();
        match std::mem::replace(&mut *st, State::Failed("stopped".into())) {
            State::Running(svc) => Some(svc),
            other => {
                *st = other;
                None
            }
        }
    };
    if let Some(svc) = svc {
        svc.stop();
    }
}

/// Every SRT output's state (empty when no flow has one).
pub fn view() -> Vec<RouteView> {
    match &*state() {
        State::Running(s) => s.view(),
        _ => Vec::new(),
    }
}

/// What a socket pair holds for the SRT thread is the worker end's send
/// buffer, which the kernel caps at `net.core.wmem_max`; a burst longer
/// than that while the SRT thread is descheduled fails on the worker's
/// side (`EAGAIN`, counted as `drop_send_error`). Said once, with the fix,
/// when the cap kept it below [`FEED_BUFFER_BYTES`].
fn warn_small_queue(worker: &OwnedFd) {
    static SAID: AtomicBool = AtomicBool::new(false);
    let Ok(bytes) = socket2::SockRef::from(worker).send_buffer_size() else {
        return;
    };
    if bytes < FEED_BUFFER_BYTES && !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            send_buffer_bytes = bytes,
            "SRT outputs queue at most {bytes} bytes (about {} datagrams of 1316 bytes) for the SRT thread; raise net.core.wmem_max (sysctl -w net.core.wmem_max={}) so bursts queue instead of dropping",
            bytes / 2304,
            FEED_BUFFER_BYTES / 2
        );
    }
}

/// An SRT output's label: `srt://0.0.0.0:9000` (`?streamid=a`, and
/// `caller` for one that calls out).
pub fn label(addr: SocketAddr, s: &SrtOutput) -> String {
    let mut l = format!("srt://{addr}");
    let mut sep = '?';
    if s.mode == SrtMode::Caller {
        l.push_str("?mode=caller");
        sep = '&';
    }
    if let Some(id) = &s.stream_id {
        l.push(sep);
        l.push_str("streamid=");
        l.push_str(id);
    }
    l
}

/// Output sockets in config order, and the unconnected ones (index, errno).
type Outputs = (Vec<UdpSocket>, Vec<(usize, i32)>);

/// The flow's output sockets in config order: `udp` (what the helper
/// opened, UDP outputs only, in order) with a socket pair's worker end in
/// place of each SRT output, whose other end goes to the SRT thread.
/// `unconnected` is re-indexed from UDP outputs to all outputs.
pub fn with_srt_outputs(
    flow: &Flow,
    udp: Vec<UdpSocket>,
    unconnected: Vec<(usize, i32)>,
) -> std::io::Result<Outputs> {
    if flow.outputs.iter().all(|o| o.srt.is_none()) {
        return Ok((udp, unconnected));
    }
    let mut udp = udp.into_iter();
    let mut all = Vec::with_capacity(flow.outputs.len());
    let mut udp_index = Vec::new();
    let mut feeds = Vec::new();
    for (i, o) in flow.outputs.iter().enumerate() {
        match &o.srt {
            None => {
                udp_index.push(i);
                all.push(
                    udp.next().ok_or_else(|| {
                        std::io::Error::other("fewer UDP outputs than configured")
                    })?,
                );
            }
            Some(s) => {
                let (worker, feed) = feed_pair()?;
                warn_small_queue(&worker);
                // A datagram socket type for the worker, which only sends
                // on it (io_uring SEND/SENDMSG work on any socket).
                all.push(UdpSocket::from(worker));
                feeds.push((
                    OutputSpec {
                        flow: flow.name.clone(),
                        label: label(o.socket_addr(), s),
                        address: o.socket_addr(),
                        srt: s.clone(),
                    },
                    feed,
                ));
            }
        }
    }
    // Only once every socket exists: an error above leaves no route behind.
    for (spec, feed) in feeds {
        add(spec, feed, None)?;
    }
    let unconnected = unconnected
        .into_iter()
        .filter_map(|(k, errno)| udp_index.get(k).map(|&i| (i, errno)))
        .collect();
    Ok((all, unconnected))
}

/// The worker's end of each SRT leg of `flow` (leg index, socket), whose
/// other end goes to the SRT thread: the SRT connection's datagrams
/// arrive on it like on a UDP leg's socket (one datagram per message,
/// bounded by the pair's buffer; drops counted by the SRT thread). Empty
/// for a flow without SRT inputs.
pub fn srt_inputs(flow: &Flow) -> std::io::Result<Vec<(usize, UdpSocket)>> {
    let mut legs = Vec::new();
    let mut feeds = Vec::new();
    for (i, input) in flow.inputs.iter().enumerate() {
        let Some(s) = &input.srt else { continue };
        let (worker, feed) = input_pair()?;
        // A datagram socket type for the worker, which only receives on
        // it (io_uring RECV works on any socket).
        legs.push((i, UdpSocket::from(worker)));
        let srt = s.as_output();
        feeds.push((
            OutputSpec {
                flow: flow.name.clone(),
                label: label(input.socket_addr(), &srt),
                address: input.socket_addr(),
                srt,
            },
            feed,
            i,
        ));
    }
    // Only once every pair exists: an error above leaves no route behind.
    for (spec, feed, leg) in feeds {
        add(spec, feed, Some(leg))?;
    }
    Ok(legs)
}
