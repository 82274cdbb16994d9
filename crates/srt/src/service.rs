//! The SRT thread: every SRT output of the daemon, one thread, one libsrt
//! epoll set.
//!
//! Each SRT output is a *route*: the worker sends the flow's datagrams,
//! like to any output, into the write end of a `SOCK_SEQPACKET` socket
//! pair (bounded by the kernel's queue and the output's `queue_depth`;
//! full means `drop_backlog` on the worker's side); this thread holds the
//! read end (the *feed*) and sends each datagram to every caller of the
//! route with one `srt_send` (libsrt copies it into that caller's send
//! buffer). Nothing on this per-datagram path allocates, locks or logs:
//! the datagram is read into one stack buffer, a full caller buffer is
//! counted (`dropped`), a broken caller is marked and removed after the
//! batch.
//!
//! A listener (`address:port`) may carry several routes told apart by the
//! caller's stream ID; its access-control hook (libsrt's listen callback,
//! run on libsrt's thread) picks the route, refuses unknown stream IDs and
//! full routes, and sets the route's passphrase, key length and latency on
//! the socket being accepted, so a caller with a wrong or no passphrase
//! fails the handshake. A caller route connects out and reconnects with a
//! doubling back-off (1 s to 30 s).
//!
//! A route ends when its feed reports end of file: the worker closed the
//! write end (the flow was removed). A route added again under the same
//! flow and label (a reload that replaced the flow) takes the old route's
//! callers over, so they stay connected.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mcrelay_config::{SrtMode, SrtOutput};

use crate::ffi::{self, ConnStats, Opt, Poll, Request, Socket, SocketRef};
use crate::late::{self, Verdict};

/// Largest SRT live-mode payload (libsrt's `SRT_LIVE_MAX_PLSIZE`).
pub const MAX_PAYLOAD: usize = 1456;
/// Datagrams read from one feed per wake-up before the others get a turn.
const FEED_BATCH: usize = 256;
/// Seconds of consecutive drops, while its receiver takes nothing more
/// (flow window closed), after which a caller is disconnected.
const STALL_TICKS: u32 = 3;
/// How long a handshake accepted by the hook may take before it counts as
/// refused by libsrt (wrong passphrase, version).
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(3);
/// The send buffer asked for an SRT input's feed: about 1600 datagrams
/// of 1316 bytes (each costs its size plus ~1 KiB of kernel overhead).
const INPUT_QUEUE_BYTES: usize = 4 << 20;
/// How long a listener route refuses new callers after the relay's own
/// sending fell behind (see [`crate::late`]).
const OVERLOAD_HOLD: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// One SRT output to serve.
#[derive(Debug, Clone)]
pub struct OutputSpec {
    pub flow: String,
    /// The output's label in counters (unique within the flow).
    pub label: String,
    /// Listener: the address to bind; caller: the listener to call.
    pub address: SocketAddr,
    pub srt: SrtOutput,
}

/// The send buffer an SRT output's pair asks for on the worker's end: what
/// it holds for the SRT thread while that thread is not scheduled (a
/// connected Unix pair is bounded by its sender's buffer, not by
/// `net.unix.max_dgram_qlen`). The kernel caps the request at
/// `net.core.wmem_max` and doubles it: 425 984 bytes by default, about 180
/// datagrams of 1 316 bytes; the daemon warns when it ends below this.
pub const FEED_BUFFER_BYTES: usize = 4 << 20;

/// Creates the socket pair of an SRT output: the worker's end (connected,
/// non-blocking, sent to like any output socket, with the send buffer of
/// [`FEED_BUFFER_BYTES`] or the most the kernel allows) and the feed this
/// thread reads.
pub fn feed_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use socket2::{Domain, Socket as Sock, Type};
    let (a, b) = Sock::pair(Domain::UNIX, Type::SEQPACKET, None)?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    a.set_send_buffer_size(FEED_BUFFER_BYTES)?;
    Ok((a.into(), b.into()))
}

/// What readers see of one caller (of an output), or of the one peer of
/// an SRT input.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallerView {
    pub peer: Option<SocketAddr>,
    pub stream_id: String,
    /// Unix time (seconds) it connected.
    pub connected_since: u64,
    /// Datagrams handed to libsrt for it.
    pub sent: u64,
    /// Datagrams received from it (an SRT input).
    pub received: u64,
    /// Datagrams not handed over because its send buffer was full.
    pub dropped: u64,
    /// libsrt's view: retransmitted, reported lost, dropped as too late,
    /// RTT and send rate.
    pub srt: ConnStats,
}

/// What readers see of one SRT output, or of one SRT input (`input`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteView {
    pub flow: String,
    pub label: String,
    /// An SRT input (its peer's datagrams feed the flow), not an output.
    pub input: bool,
    /// The input's leg in its flow (0 for an output).
    pub leg: usize,
    pub listener: bool,
    pub address: Option<SocketAddr>,
    pub stream_id: Option<String>,
    pub max_callers: u32,
    pub callers: Vec<CallerView>,
    /// Datagrams read from the worker (an output), or received from the
    /// peer (an input).
    pub datagrams: u64,
    /// An input's datagrams handed to its worker.
    pub delivered: u64,
    /// An input's datagrams dropped because the worker's queue (the socket
    /// pair) was full.
    pub drop_queue_full: u64,
    /// An input's datagrams dropped because its flow had stopped reading
    /// (the worker closed its end; the route ends next).
    pub drop_flow_gone: u64,
    /// Datagrams read while no caller was connected.
    pub no_caller: u64,
    /// Every caller's `sent` and `dropped` added up, those that left
    /// included (an output's totals survive its callers).
    pub sent: u64,
    pub dropped: u64,
    /// Datagrams larger than an SRT live payload (1456 B), not sent.
    pub oversize: u64,
    /// Callers accepted (listener) or connections made (caller).
    pub connects: u64,
    /// Callers refused: unknown stream ID, `max_callers` reached, or the
    /// handshake failed (wrong or missing passphrase).
    pub refused: u64,
    /// Callers disconnected: they left, broke, or couldn't keep up.
    pub disconnects: u64,
    /// Of those, disconnected for not keeping up: they fell behind (see
    /// [`crate::late`]: their libsrt held about a second of the stream),
    /// or their receiver stopped reading.
    pub late_disconnects: u64,
    /// New callers are refused (`SRT_REJX_OVERLOAD`, counted in
    /// `refused`) because the relay's sending fell behind lately.
    pub holding: bool,
    /// Failed connection attempts (caller mode).
    pub connect_failures: u64,
    /// Why the listener could not be opened, or the last connect error.
    pub error: Option<String>,
    /// The series its totals belong to: a route rebuilt in place (a
    /// reload changed its settings) keeps the old route's series and goes
    /// on from its totals ([`RouteView::go_on_from`]); a route opened anew
    /// (its flow's feed had ended) starts a series of its own, at 0, whose
    /// readers add what the earlier one counted (the daemon's carry).
    pub series: u64,
}

impl RouteView {
    /// This route replaces `old` in place: its totals go on from
    /// `old`'s, in `old`'s series. `old`'s callers are closed with it
    /// (counted as disconnects); their `sent` and `dropped`, in `old`'s
    /// totals, are returned as what departed callers sent and dropped.
    fn go_on_from(&mut self, old: &RouteView) -> [u64; 2] {
        self.series = old.series;
        for (new, old) in [
            (&mut self.datagrams, old.datagrams),
            (&mut self.delivered, old.delivered),
            (&mut self.drop_queue_full, old.drop_queue_full),
            (&mut self.drop_flow_gone, old.drop_flow_gone),
            (&mut self.no_caller, old.no_caller),
            (&mut self.oversize, old.oversize),
            (&mut self.connects, old.connects),
            (&mut self.refused, old.refused),
            (&mut self.connect_failures, old.connect_failures),
        ] {
            *new = new.saturating_add(old);
        }
        let callers = u64::try_from(old.callers.len()).unwrap_or(u64::MAX);
        self.disconnects = self
            .disconnects
            .saturating_add(old.disconnects)
            .saturating_add(callers);
        [old.sent, old.dropped]
    }
}

/// One SRT output or input to serve, and its end of the socket pair.
type Registration = (OutputSpec, OwnedFd, Direction);

/// Which way a route's datagrams go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// From the worker to the callers (an SRT output).
    Out,
    /// From the one peer to the worker (an SRT input, leg `usize`).
    In(usize),
}

/// Handle to the SRT thread.
#[derive(Debug)]
pub struct SrtService {
    tx: Sender<Registration>,
    published: Arc<Mutex<Vec<RouteView>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SrtService {
    /// Starts the SRT thread (`mcrelay-srt`).
    pub fn start() -> std::io::Result<SrtService> {
        ffi::startup();
        let (tx, rx) = channel();
        let published = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let poll = Poll::new().map_err(std::io::Error::other)?;
        let mut t = Thread {
            poll,
            rx,
            published: Arc::clone(&published),
            stop: Arc::clone(&stop),
            listeners: HashMap::new(),
            routes: Vec::new(),
            retired: Vec::new(),
            last_tick: Instant::now(),
            srt_ready: Vec::with_capacity(ffi::READY_MAX),
            sys_ready: Vec::with_capacity(ffi::READY_MAX),
            series: 0,
        };
        let thread = std::thread::Builder::new()
            .name("mcrelay-srt".into())
            .spawn(move || t.run())?;
        Ok(SrtService {
            tx,
            published,
            stop,
            thread: Some(thread),
        })
    }

    /// Serves `spec`, reading its datagrams from `feed` (see
    /// [`feed_pair`]). Errors (a port in use) show in its [`RouteView`].
    pub fn add(&self, spec: OutputSpec, feed: OwnedFd) {
        // The thread outlives every sender but `stop`; a send after it
        // ended only drops the feed, which the worker sees as a closed peer.
        let _ = self.tx.send((spec, feed, Direction::Out));
    }

    /// Serves `spec` as an SRT input (leg `leg` of its flow: `srt` with
    /// `max_callers` 1, see `SrtInput::as_output`): what its one peer
    /// sends is written to `feed`, whose other end the worker receives on
    /// like any leg's socket (see [`input_pair`]). A datagram the pair
    /// can't take is dropped and counted (`drop_queue_full`).
    pub fn add_input(&self, spec: OutputSpec, leg: usize, feed: OwnedFd) {
        let _ = self.tx.send((spec, feed, Direction::In(leg)));
    }

    /// Every SRT output, as of the last second.
    pub fn view(&self) -> Vec<RouteView> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the thread, closing every SRT socket.
    pub fn stop(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SrtService {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

type RouteKey = (String, String);

/// A listener's routes as its hook sees them.
struct Access {
    key: RouteKey,
    stream_id: Option<String>,
    srt: SrtOutput,
    /// Callers connected or in their handshake.
    taken: Arc<AtomicU32>,
    /// Set while the route refuses new callers (the relay fell behind).
    hold: Arc<AtomicBool>,
}

#[derive(Default)]
struct ListenerShared {
    routes: Mutex<Vec<Access>>,
    /// Sockets the hook let through, by SRT id, until accepted.
    pending: Mutex<HashMap<i32, Pending>>,
    /// Refused by the hook (unknown stream ID, full), per route; and those
    /// with no route at all.
    refused: Mutex<HashMap<RouteKey, u64>>,
    refused_unknown: AtomicU32,
}

struct Pending {
    key: RouteKey,
    peer: Option<SocketAddr>,
    stream_id: String,
    at: Instant,
    socket: SocketRef,
}

struct Listener {
    socket: Socket,
    shared: Arc<ListenerShared>,
}

struct Caller {
    socket: Socket,
    /// In the epoll set (accepted callers are; an input's outgoing
    /// connection is added once connected, to read it).
    watched: bool,
    view: CallerView,
    /// `dropped` at the last tick, and ticks in a row with new drops
    /// while its receiver's flow window was closed.
    dropped_at_tick: u64,
    stalled: u32,
    /// libsrt's `too_late` at the last tick, and seconds in a row the
    /// caller was late (see [`crate::late`]).
    too_late_at_tick: u64,
    late: u32,
    gone: bool,
}

impl Caller {
    /// A caller connected now on `socket` (`watched`: already in the
    /// epoll set), from `peer` with `stream_id`.
    fn connected(
        socket: Socket,
        watched: bool,
        peer: Option<SocketAddr>,
        stream_id: String,
    ) -> Caller {
        Caller {
            socket,
            watched,
            view: CallerView {
                peer,
                stream_id,
                connected_since: now_unix(),
                ..CallerView::default()
            },
            dropped_at_tick: 0,
            stalled: 0,
            too_late_at_tick: 0,
            late: 0,
            gone: false,
        }
    }
}

enum Calling {
    Idle {
        next: Instant,
        backoff: Duration,
    },
    Connecting {
        socket: Socket,
        since: Instant,
        backoff: Duration,
    },
}

struct Route {
    spec: OutputSpec,
    key: RouteKey,
    direction: Direction,
    feed: UnixDatagram,
    /// Feeds of the flow this route's flow replaced, read until they end.
    old_feeds: Vec<UnixDatagram>,
    callers: Vec<Caller>,
    /// `sent` and `dropped` of the callers that left.
    departed: [u64; 2],
    taken: Arc<AtomicU32>,
    /// Refusing new callers until then (see `hold` of `Access`).
    hold: Arc<AtomicBool>,
    hold_until: Option<Instant>,
    calling: Option<Calling>,
    view: RouteView,
    gone: bool,
}

impl Route {
    /// The feed `old` names: a replaced flow's (its index in
    /// `old_feeds`), or the route's own.
    fn feed_of(&self, old: Option<usize>) -> &UnixDatagram {
        match old.and_then(|k| self.old_feeds.get(k)) {
            Some(f) => f,
            None => &self.feed,
        }
    }

    /// The feed `old` names (its descriptor `fd`) has ended: a replaced
    /// flow's is taken off `poll` and dropped; the route's own ends the
    /// route.
    fn end_feed(&mut self, poll: &Poll, old: Option<usize>, fd: i32) {
        match old {
            Some(k) => {
                poll.remove_fd(fd);
                self.old_feeds.swap_remove(k);
            }
            None => self.gone = true,
        }
    }
}

struct Thread {
    poll: Poll,
    rx: Receiver<Registration>,
    published: Arc<Mutex<Vec<RouteView>>>,
    stop: Arc<AtomicBool>,
    listeners: HashMap<SocketAddr, Listener>,
    routes: Vec<Route>,
    /// Feeds of SRT inputs whose route ended while their worker may still
    /// read the other end: kept open (an end of file would make the
    /// worker's receive spin) until the worker closes its end.
    retired: Vec<UnixDatagram>,
    last_tick: Instant,
    /// What the last wait found ready (SRT sockets, then system fds),
    /// copied out of the poll so the thread may act on them: sized for
    /// the most one wait returns, so no wake-up allocates.
    srt_ready: Vec<i32>,
    sys_ready: Vec<i32>,
    /// The last [`RouteView::series`] given out.
    series: u64,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Thread {
    fn run(&mut self) {
        let mut buf = [0u8; 65_536];
        while !self.stop.load(Ordering::Relaxed) {
            while let Ok((spec, feed, direction)) = self.rx.try_recv() {
                self.add(spec, feed, direction);
            }
            let mut srt_ready = std::mem::take(&mut self.srt_ready);
            let mut sys_ready = std::mem::take(&mut self.sys_ready);
            srt_ready.clear();
            sys_ready.clear();
            match self.poll.wait(100) {
                Ok((s, f)) => {
                    srt_ready.extend_from_slice(s);
                    sys_ready.extend_from_slice(f);
                }
                Err(e) => {
                    tracing::error!(error = %e, "SRT epoll wait failed");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            // A flow replaced by a reload registers its new feed before its
            // old one ends: take registrations first, so an old feed's end
            // finds its successor.
            while let Ok((spec, feed, direction)) = self.rx.try_recv() {
                self.add(spec, feed, direction);
            }
            for &fd in &sys_ready {
                if let Some(k) = self.retired.iter().position(|f| f.as_raw_fd() == fd) {
                    if self.retired.get(k).is_some_and(drain_closed) {
                        self.poll.remove_fd(fd);
                        self.retired.swap_remove(k);
                    }
                    continue;
                }
                let owner = self.routes.iter().position(|r| {
                    r.feed.as_raw_fd() == fd || r.old_feeds.iter().any(|o| o.as_raw_fd() == fd)
                });
                if let Some(i) = owner {
                    self.pump(i, fd, &mut buf);
                }
            }
            for &id in &srt_ready {
                self.ready(id, &mut buf);
            }
            self.srt_ready = srt_ready;
            self.sys_ready = sys_ready;
            self.sweep();
            if self.last_tick.elapsed() >= Duration::from_secs(1) {
                self.last_tick = Instant::now();
                self.tick();
            }
        }
        // Close everything: callers, listeners, feeds.
        self.routes.clear();
        self.listeners.clear();
        self.retired.clear();
        self.publish();
    }

    fn add(&mut self, spec: OutputSpec, feed: OwnedFd, direction: Direction) {
        // An input's key is apart from the outputs' (a flow may send to
        // and receive from one listener, by stream ID).
        let key = match direction {
            Direction::Out => (spec.flow.clone(), spec.label.clone()),
            Direction::In(_) => (spec.flow.clone(), format!("input {}", spec.label)),
        };
        let feed = UnixDatagram::from(feed);
        if let Err(e) = self.poll.add_fd(feed.as_raw_fd()) {
            tracing::error!(flow = %spec.flow, output = %spec.label, error = %e, "SRT output: can't watch its feed");
            return;
        }
        // A reload replacing the flow: the new feed takes the old route's
        // callers over; the old feed is closed (the old flow's sends to it
        // fail from then on, which only its draining sees). A route whose
        // settings changed is rebuilt in place instead: the new route goes
        // on from the old one's totals, as it published them last.
        let mut replaced = None;
        if let Some(old) = self.routes.iter_mut().find(|r| r.key == key && !r.gone) {
            if old.spec.srt == spec.srt
                && old.spec.address == spec.address
                && old.direction == direction
            {
                // The old feed is read until it ends (what the old flow
                // still sends comes first).
                let previous = std::mem::replace(&mut old.feed, feed);
                old.old_feeds.push(previous);
                tracing::info!(flow = %spec.flow, output = %spec.label, callers = old.callers.len(), "SRT output taken over by the reloaded flow");
                return;
            }
            old.gone = true;
            let mut last = old.view.clone();
            last.callers = old.callers.iter().map(|c| c.view.clone()).collect();
            last.sent = old.departed[0] + old.callers.iter().map(|c| c.view.sent).sum::<u64>();
            last.dropped =
                old.departed[1] + old.callers.iter().map(|c| c.view.dropped).sum::<u64>();
            replaced = Some(last);
        }
        self.sweep();
        let taken = Arc::new(AtomicU32::new(0));
        let hold = Arc::new(AtomicBool::new(false));
        let mut view = RouteView {
            flow: spec.flow.clone(),
            label: spec.label.clone(),
            input: matches!(direction, Direction::In(_)),
            leg: match direction {
                Direction::In(leg) => leg,
                Direction::Out => 0,
            },
            listener: spec.srt.mode == SrtMode::Listener,
            address: Some(spec.address),
            stream_id: spec.srt.stream_id.clone(),
            max_callers: match spec.srt.mode {
                SrtMode::Listener => spec.srt.max_callers,
                SrtMode::Caller => 1,
            },
            ..RouteView::default()
        };
        let departed = match &replaced {
            Some(old) => view.go_on_from(old),
            None => {
                self.series += 1;
                view.series = self.series;
                [0; 2]
            }
        };
        let calling = match spec.srt.mode {
            SrtMode::Caller => Some(Calling::Idle {
                next: Instant::now(),
                backoff: BACKOFF_MIN,
            }),
            SrtMode::Listener => {
                if let Err(e) = self.attach(&spec, &key, &taken, &hold) {
                    tracing::error!(flow = %spec.flow, output = %spec.label, error = %e, "SRT listener can't open; the output serves no caller");
                    view.error = Some(e.to_string());
                }
                None
            }
        };
        match direction {
            Direction::Out => {
                tracing::info!(flow = %spec.flow, output = %spec.label, "SRT output added");
            }
            Direction::In(leg) => {
                tracing::info!(flow = %spec.flow, input = %spec.label, leg, "SRT input added");
            }
        }
        self.routes.push(Route {
            spec,
            key,
            direction,
            feed,
            old_feeds: Vec::new(),
            callers: Vec::new(),
            departed,
            taken,
            hold,
            hold_until: None,
            calling,
            view,
            gone: false,
        });
        self.publish();
    }

    /// Puts a listener route on its listener, opening the listener first.
    fn attach(
        &mut self,
        spec: &OutputSpec,
        key: &RouteKey,
        taken: &Arc<AtomicU32>,
        hold: &Arc<AtomicBool>,
    ) -> Result<(), ffi::SrtError> {
        let listener = match self.listeners.get(&spec.address) {
            Some(l) => l,
            None => {
                let l = open_listener(spec.address)?;
                self.poll.add(l.socket.as_ref())?;
                tracing::info!(address = %spec.address, "SRT listener open");
                self.listeners.entry(spec.address).or_insert(l)
            }
        };
        let mut routes = listener
            .shared
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        routes.retain(|a| &a.key != key);
        routes.push(Access {
            key: key.clone(),
            stream_id: spec.srt.stream_id.clone(),
            srt: spec.srt.clone(),
            taken: Arc::clone(taken),
            hold: Arc::clone(hold),
        });
        Ok(())
    }

    /// Reads up to a batch of datagrams from route `i`'s feed and sends
    /// each to every caller. The packet path of the SRT side.
    fn pump(&mut self, i: usize, fd: i32, buf: &mut [u8]) {
        let Some(route) = self.routes.get_mut(i) else {
            return;
        };
        // The replaced flow's feed, until it ends, or the route's own.
        let old = route.old_feeds.iter().position(|o| o.as_raw_fd() == fd);
        if matches!(route.direction, Direction::In(_)) {
            // An input's feed is only written; readable means its worker
            // closed its end (the flow stopped), or (never) stray bytes.
            if drain_closed(route.feed_of(old)) {
                route.end_feed(&self.poll, old, fd);
            }
            return;
        }
        for _ in 0..FEED_BATCH {
            let feed = route.feed_of(old);
            let got = match feed.recv(buf) {
                Ok(0) if feed_closed(feed) => None,
                Ok(n) => Some(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => None,
            };
            let Some(n) = got else {
                route.end_feed(&self.poll, old, fd);
                return;
            };
            route.view.datagrams += 1;
            if n > MAX_PAYLOAD {
                route.view.oversize += 1;
                continue;
            }
            if route.callers.is_empty() {
                route.view.no_caller += 1;
                continue;
            }
            let data = buf.get(..n).unwrap_or(&[]);
            for c in &mut route.callers {
                if c.gone {
                    continue;
                }
                match c.socket.send(data) {
                    Ok(()) => c.view.sent += 1,
                    Err(e) if e.code == ffi::ERR_ASYNC_SEND => c.view.dropped += 1,
                    Err(_) => c.gone = true,
                }
            }
        }
    }

    /// An SRT socket is readable: a listener has callers to accept, an
    /// input's peer sent datagrams, or a caller's connection broke
    /// (callers send nothing to an output).
    fn ready(&mut self, id: i32, buf: &mut [u8]) {
        if let Some((addr, _)) = self.listeners.iter().find(|(_, l)| l.socket.id() == id) {
            let addr = *addr;
            self.accept_one(addr);
            return;
        }
        for r in &mut self.routes {
            if matches!(r.direction, Direction::In(_)) {
                if let Some(c) = r.callers.iter_mut().find(|c| c.socket.id() == id) {
                    receive(&r.feed, c, &mut r.view, buf);
                    return;
                }
            }
            for c in &mut r.callers {
                if c.socket.id() == id && c.socket.as_ref().state().is_gone() {
                    c.gone = true;
                }
            }
            if let Some(Calling::Connecting { socket, .. }) = &r.calling {
                if socket.id() == id {
                    // Checked in the sweep.
                }
            }
        }
    }

    /// Accepts one caller: the epoll set is level-triggered, so another
    /// one pending reports the listener ready again (an accept with none
    /// pending would only make libsrt log an error).
    fn accept_one(&mut self, addr: SocketAddr) {
        {
            let Some(l) = self.listeners.get(&addr) else {
                return;
            };
            let (socket, peer) = match l.socket.accept() {
                Ok(Some(x)) => x,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(address = %addr, error = %e, "SRT accept failed");
                    return;
                }
            };
            let pending = l
                .shared
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&socket.id());
            let Some(p) = pending else {
                // Not let through by our hook: can't happen; closed.
                return;
            };
            let Some(route) = self.routes.iter_mut().find(|r| r.key == p.key && !r.gone) else {
                return;
            };
            if let Err(e) = self.poll.add(socket.as_ref()) {
                tracing::warn!(error = %e, "SRT caller can't be watched; closed");
                route.taken.fetch_sub(1, Ordering::Relaxed);
                return;
            }
            let peer = peer.or(p.peer);
            tracing::info!(flow = %route.spec.flow, output = %route.spec.label, peer = ?peer, stream_id = %p.stream_id, callers = route.callers.len() + 1, "SRT caller connected");
            route.view.connects += 1;
            route
                .callers
                .push(Caller::connected(socket, true, peer, p.stream_id));
        }
    }

    /// Removes broken callers and ended routes; moves caller routes along.
    fn sweep(&mut self) {
        let mut changed = false;
        for r in &mut self.routes {
            let before = r.callers.len();
            r.callers.retain(|c| {
                if c.gone {
                    tracing::info!(flow = %r.spec.flow, output = %r.spec.label, peer = ?c.view.peer, sent = c.view.sent, dropped = c.view.dropped, "SRT caller disconnected");
                    r.departed[0] += c.view.sent;
                    r.departed[1] += c.view.dropped;
                    self.poll.remove(c.socket.as_ref());
                }
                !c.gone
            });
            let removed = before - r.callers.len();
            if removed > 0 {
                changed = true;
                r.view.disconnects += u64::try_from(removed).unwrap_or(0);
                if r.spec.srt.mode == SrtMode::Listener {
                    r.taken.fetch_sub(
                        u32::try_from(removed).unwrap_or(u32::MAX),
                        Ordering::Relaxed,
                    );
                }
            }
            if r.spec.srt.mode == SrtMode::Caller && !r.gone {
                changed |= step_caller(r);
            }
            // An input's outgoing connection is read once it is up.
            if matches!(r.direction, Direction::In(_)) {
                for c in r.callers.iter_mut().filter(|c| !c.watched && !c.gone) {
                    match self.poll.add(c.socket.as_ref()) {
                        Ok(()) => c.watched = true,
                        Err(e) => {
                            tracing::warn!(flow = %r.spec.flow, input = %r.spec.label, error = %e, "SRT input's connection can't be watched; closed");
                            c.gone = true;
                        }
                    }
                }
            }
        }
        if self.routes.iter().any(|r| r.gone) {
            let (ended, kept): (Vec<Route>, Vec<Route>) = std::mem::take(&mut self.routes)
                .into_iter()
                .partition(|r| r.gone);
            self.routes = kept;
            for r in ended {
                for c in &r.callers {
                    self.poll.remove(c.socket.as_ref());
                }
                if let Some(l) = self.listeners.get(&r.spec.address) {
                    l.shared
                        .routes
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .retain(|a| a.key != r.key || !Arc::ptr_eq(&a.taken, &r.taken));
                }
                if matches!(r.direction, Direction::In(_)) {
                    tracing::info!(flow = %r.spec.flow, input = %r.spec.label, "SRT input removed");
                    // Watched still: dropped once the worker closed its end.
                    self.retired.push(r.feed);
                    self.retired.extend(r.old_feeds);
                    continue;
                }
                tracing::info!(flow = %r.spec.flow, output = %r.spec.label, callers = r.callers.len(), "SRT output removed");
                self.poll.remove_fd(r.feed.as_raw_fd());
                for o in &r.old_feeds {
                    self.poll.remove_fd(o.as_raw_fd());
                }
            }
            // A listener with no route left closes (its port is freed).
            let routes = &self.routes;
            self.listeners.retain(|addr, _| {
                let used = routes
                    .iter()
                    .any(|r| r.spec.address == *addr && r.spec.srt.mode == SrtMode::Listener);
                if !used {
                    tracing::info!(address = %addr, "SRT listener closed");
                }
                used
            });
            changed = true;
        }
        if changed {
            self.publish();
        }
    }

    /// Once a second: statistics, stalled callers, refused handshakes.
    fn tick(&mut self) {
        for l in self.listeners.values() {
            let mut pending = l
                .shared
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut failed: Vec<(RouteKey, Option<SocketAddr>)> = Vec::new();
            pending.retain(|_, p| {
                let over = p.at.elapsed() >= HANDSHAKE_DEADLINE
                    && (p.socket.state().is_gone() || p.at.elapsed() >= 4 * HANDSHAKE_DEADLINE);
                if over {
                    failed.push((p.key.clone(), p.peer));
                }
                !over
            });
            drop(pending);
            for (key, peer) in failed {
                if let Some(r) = self.routes.iter_mut().find(|r| r.key == key) {
                    r.taken.fetch_sub(1, Ordering::Relaxed);
                    r.view.refused += 1;
                    tracing::warn!(flow = %r.spec.flow, output = %r.spec.label, peer = ?peer, "SRT caller refused in the handshake (wrong or missing passphrase, or an incompatible peer)");
                }
            }
            let refused = std::mem::take(
                &mut *l
                    .shared
                    .refused
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            );
            for (key, n) in refused {
                if let Some(r) = self.routes.iter_mut().find(|r| r.key == key) {
                    r.view.refused += n;
                }
            }
        }
        for r in &mut self.routes {
            for c in &mut r.callers {
                if let Some(s) = c.socket.stats() {
                    c.view.srt = s;
                }
                if c.socket.as_ref().state().is_gone() {
                    c.gone = true;
                }
                // Drops alone don't say whose fault they are: with the
                // relay short of CPU every caller has them, and
                // disconnecting them all would serve nobody. A caller
                // whose own receiver takes nothing more goes after
                // STALL_TICKS; one late with its window open is judged
                // beside the route's other callers (`judge_late`).
                let drops = c.view.dropped;
                if drops > c.dropped_at_tick && c.view.srt.flow_window == 0 {
                    c.stalled += 1;
                } else {
                    c.stalled = 0;
                }
                let too_late = c.view.srt.sender_dropped;
                let window_open = c.view.srt.flow_window > 0;
                if late::late(
                    drops,
                    c.dropped_at_tick,
                    too_late,
                    c.too_late_at_tick,
                    window_open,
                ) {
                    c.late += 1;
                } else {
                    c.late = 0;
                }
                c.too_late_at_tick = too_late;
                c.dropped_at_tick = drops;
                if c.stalled >= STALL_TICKS && !c.gone {
                    tracing::warn!(flow = %r.spec.flow, output = %r.spec.label, peer = ?c.view.peer, dropped = c.view.dropped, "SRT caller can't keep up (its receiver took nothing for {STALL_TICKS} s); disconnected");
                    c.gone = true;
                    r.view.late_disconnects += 1;
                }
            }
            if r.direction == Direction::Out {
                judge_late(r);
            }
        }
        self.sweep();
        self.publish();
    }

    fn publish(&self) {
        let views: Vec<RouteView> = self
            .routes
            .iter()
            .map(|r| {
                let mut v = r.view.clone();
                v.callers = r.callers.iter().map(|c| c.view.clone()).collect();
                let [sent, dropped] = r.departed;
                v.sent = sent + r.callers.iter().map(|c| c.view.sent).sum::<u64>();
                v.dropped = dropped + r.callers.iter().map(|c| c.view.dropped).sum::<u64>();
                v
            })
            .collect();
        *self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = views;
    }
}

/// Reads what an input's feed holds (nothing is ever sent to it) and
/// says whether the worker closed its end.
fn drain_closed(feed: &UnixDatagram) -> bool {
    let mut scrap = [0u8; 64];
    loop {
        match feed.recv(&mut scrap) {
            Ok(0) if feed_closed(feed) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// An SRT input's peer is readable: hands what it sent, a batch at most,
/// to the worker through `feed`. The input side's packet path: one stack
/// buffer, no allocation, no lock, no log; a datagram the socket pair
/// can't take is dropped and counted, never retried (nothing reorders).
fn receive(feed: &UnixDatagram, c: &mut Caller, view: &mut RouteView, buf: &mut [u8]) {
    for _ in 0..FEED_BATCH {
        match c.socket.recv(buf) {
            Ok(Some(n)) => {
                view.datagrams += 1;
                c.view.received += 1;
                let data = buf.get(..n).unwrap_or(&[]);
                match feed.send(data) {
                    Ok(_) => view.delivered += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        view.drop_queue_full += 1;
                    }
                    Err(_) => view.drop_flow_gone += 1,
                }
            }
            Ok(None) => return,
            Err(_) => {
                c.gone = true;
                return;
            }
        }
    }
}

/// The pair of an SRT input: the worker's end (non-blocking, received on
/// like any leg's socket) and the feed the SRT thread writes. The queue
/// between them is the feed's send buffer (a connected pair's bound; the
/// receive queue length limit does not apply to it), asked large so a
/// burst TSBPD releases at once queues rather than drops.
pub fn input_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (worker, feed) = feed_pair()?;
    let s = socket2::SockRef::from(&feed);
    // Best effort: clamped by net.core.wmem_max.
    let _ = s.set_send_buffer_size(INPUT_QUEUE_BYTES);
    Ok((worker, feed))
}

/// Whether a feed that read 0 bytes has ended (the worker closed its end)
/// rather than carried an empty datagram.
fn feed_closed(feed: &UnixDatagram) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut p = [PollFd::new(feed.as_fd(), PollFlags::POLLIN)];
    match poll(&mut p, PollTimeout::ZERO) {
        Ok(_) => p[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLHUP)),
        Err(_) => true,
    }
}

/// Moves a caller route along: connect when due, notice the outcome.
/// Whether anything changed.
fn step_caller(r: &mut Route) -> bool {
    // Connected (a broken connection was removed just before).
    if !r.callers.is_empty() {
        return false;
    }
    let now = Instant::now();
    match r.calling.take() {
        // Just disconnected: call again in a second.
        None => {
            r.calling = Some(Calling::Idle {
                next: now + BACKOFF_MIN,
                backoff: BACKOFF_MIN,
            });
            true
        }
        Some(Calling::Idle { next, backoff }) if now >= next => {
            match connect(&r.spec) {
                Ok(socket) => {
                    r.calling = Some(Calling::Connecting {
                        socket,
                        since: now,
                        backoff,
                    });
                }
                Err(e) => {
                    r.view.connect_failures += 1;
                    r.view.error = Some(e.to_string());
                    r.calling = Some(Calling::Idle {
                        next: now + backoff,
                        backoff: (backoff * 2).min(BACKOFF_MAX),
                    });
                }
            }
            true
        }
        Some(Calling::Connecting {
            socket,
            since,
            backoff,
        }) => match socket.as_ref().state() {
            ffi::State::Connected => {
                tracing::info!(flow = %r.spec.flow, output = %r.spec.label, "SRT caller connected to its listener");
                r.view.connects += 1;
                r.view.error = None;
                let peer = socket.peer().or(Some(r.spec.address));
                let stream_id = r.spec.srt.stream_id.clone().unwrap_or_default();
                r.callers
                    .push(Caller::connected(socket, false, peer, stream_id));
                r.calling = None;
                true
            }
            s if s.is_gone() || since.elapsed() > Duration::from_secs(10) => {
                r.view.connect_failures += 1;
                if r.view.connect_failures == 1 || r.view.error.is_none() {
                    tracing::warn!(flow = %r.spec.flow, output = %r.spec.label, retry_in = ?backoff, "SRT caller could not connect; retrying with back-off");
                }
                r.view.error = Some(format!("connection to {} failed", r.spec.address));
                r.calling = Some(Calling::Idle {
                    next: now + backoff,
                    backoff: (backoff * 2).min(BACKOFF_MAX),
                });
                true
            }
            _ => {
                r.calling = Some(Calling::Connecting {
                    socket,
                    since,
                    backoff,
                });
                false
            }
        },
        other => {
            r.calling = other;
            false
        }
    }
}

/// Once a second, after the callers' statistics: disconnects the callers
/// of output route `r` that fell behind ([`crate::late`]), and starts or
/// ends the route's refusal of new callers.
fn judge_late(r: &mut Route) {
    let now = Instant::now();
    if r.hold_until.is_some_and(|t| now >= t) {
        r.hold_until = None;
        r.hold.store(false, Ordering::Relaxed);
        r.view.holding = false;
        tracing::info!(flow = %r.spec.flow, output = %r.spec.label, "SRT output accepts new callers again");
    }
    let live: Vec<usize> = (0..r.callers.len())
        .filter(|&i| r.callers.get(i).is_some_and(|c| !c.gone))
        .collect();
    let ticks: Vec<u32> = live
        .iter()
        .filter_map(|&i| r.callers.get(i).map(|c| c.late))
        .collect();
    let (going, overload) = match late::judge(&ticks) {
        Verdict::Keep => return,
        Verdict::Disconnect(v) => (v, false),
        Verdict::Overload(k) => (vec![k], true),
    };
    let late_now = ticks.iter().filter(|&&n| n > 0).count();
    for k in going {
        let Some(c) = live.get(k).and_then(|&i| r.callers.get_mut(i)) else {
            continue;
        };
        c.gone = true;
        r.view.late_disconnects += 1;
        if overload {
            tracing::warn!(flow = %r.spec.flow, output = %r.spec.label, peer = ?c.view.peer, late = late_now, callers = ticks.len(), dropped = c.view.dropped, too_late = c.view.srt.sender_dropped, "SRT output past its sending capacity (most callers fell behind at once): its newest late caller is disconnected");
        } else {
            tracing::warn!(flow = %r.spec.flow, output = %r.spec.label, peer = ?c.view.peer, dropped = c.view.dropped, too_late = c.view.srt.sender_dropped, "SRT caller fell behind (datagrams dropped for it for {} s: libsrt held about a second of the stream); disconnected", late::LATE_TICKS);
        }
    }
    if overload && r.spec.srt.mode == SrtMode::Listener {
        if r.hold_until.is_none() {
            tracing::warn!(flow = %r.spec.flow, output = %r.spec.label, hold = ?OVERLOAD_HOLD, "SRT output refuses new callers until its sending keeps up");
        }
        r.hold_until = Some(now + OVERLOAD_HOLD);
        r.hold.store(true, Ordering::Relaxed);
        r.view.holding = true;
    }
}

fn apply(s: SocketRef, srt: &SrtOutput) -> Result<(), ffi::SrtError> {
    s.set_i32(Opt::Latency, i32::try_from(srt.latency_ms).unwrap_or(120))?;
    s.set_i32(Opt::PayloadSize, i32::try_from(MAX_PAYLOAD).unwrap_or(1456))?;
    if let Some(p) = &srt.passphrase {
        s.set_str(Opt::Passphrase, p)?;
        s.set_i32(Opt::PbKeyLen, i32::from(srt.key_length))?;
    }
    s.set_bool(Opt::EnforcedEncryption, true)?;
    // Retransmit on every loss report (libsrt 1.5's default, 1, skips a
    // report that comes within an RTT of the last retransmission): a
    // little more overhead, and the loss test (5 % both ways, 40 ms RTT,
    // latency 200 ms) showed residual loss with the default.
    s.set_i32(Opt::RetransmitAlgo, 0)?;
    Ok(())
}

fn connect(spec: &OutputSpec) -> Result<Socket, ffi::SrtError> {
    let s = Socket::new_live()?;
    apply(s.as_ref(), &spec.srt)?;
    if let Some(id) = &spec.srt.stream_id {
        s.as_ref().set_str(Opt::StreamId, id)?;
    }
    s.as_ref().set_i32(Opt::ConnTimeo, 3000)?;
    s.connect(spec.address)?;
    Ok(s)
}

fn open_listener(addr: SocketAddr) -> Result<Listener, ffi::SrtError> {
    let socket = Socket::new_live()?;
    socket.as_ref().set_bool(Opt::ReuseAddr, true)?;
    if addr.is_ipv6() {
        // Dual-stack whatever net.ipv6.bindv6only says (libsrt 1.5 leaves
        // it to that sysctl; later libsrt refuses to bind `::` with it
        // unset): `::` holds the port on IPv4 too, as docs/configuration.md
        // and the config's port rules (`mcrelay_config`) take it, and
        // `::ffff:a.b.c.d` binds.
        socket.as_ref().set_bool(Opt::Ipv6Only, false)?;
    }
    socket
        .as_ref()
        .set_i32(Opt::PayloadSize, i32::try_from(MAX_PAYLOAD).unwrap_or(1456))?;
    socket.bind(addr)?;
    let shared = Arc::new(ListenerShared::default());
    let hook_shared = Arc::clone(&shared);
    socket.listen_callback(Box::new(move |req: &Request<'_>| admit(&hook_shared, req)))?;
    socket.listen(64)?;
    Ok(Listener { socket, shared })
}

/// The listener's access control (libsrt's thread): route by stream ID,
/// `max_callers`, the route's passphrase, key length and latency.
fn admit(shared: &ListenerShared, req: &Request<'_>) -> bool {
    let routes = shared.routes.lock().unwrap_or_else(PoisonError::into_inner);
    let route = routes
        .iter()
        .find(|a| a.stream_id.as_deref() == Some(req.stream_id))
        .or_else(|| routes.iter().find(|a| a.stream_id.is_none()));
    let Some(a) = route else {
        shared.refused_unknown.fetch_add(1, Ordering::Relaxed);
        req.socket.reject_reason(ffi::REJECT_NOT_FOUND);
        return false;
    };
    let refuse = |reason| {
        *shared
            .refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(a.key.clone())
            .or_default() += 1;
        req.socket.reject_reason(reason);
        false
    };
    // The relay's sending fell behind lately: a new caller would only
    // take a share from those served (see `crate::late`).
    if a.hold.load(Ordering::Relaxed) {
        return refuse(ffi::REJECT_OVERLOAD);
    }
    let taken = a.taken.fetch_add(1, Ordering::Relaxed);
    if taken >= a.srt.max_callers {
        a.taken.fetch_sub(1, Ordering::Relaxed);
        return refuse(ffi::REJECT_OVERLOAD);
    }
    if apply(req.socket, &a.srt).is_err() {
        a.taken.fetch_sub(1, Ordering::Relaxed);
        return refuse(ffi::REJECT_BAD_REQUEST);
    }
    shared
        .pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(
            req.socket.id(),
            Pending {
                key: a.key.clone(),
                peer: req.peer,
                stream_id: req.stream_id.to_owned(),
                at: Instant::now(),
                socket: req.socket,
            },
        );
    true
}

#[cfg(test)]
mod tests {
    use super::{CallerView, RouteView};

    /// A route rebuilt in place goes on from the old one's totals, in its
    /// series; its callers were closed with it.
    #[test]
    fn a_route_rebuilt_in_place_goes_on_from_the_old_ones_totals() {
        let old = RouteView {
            series: 3,
            datagrams: 100,
            delivered: 90,
            drop_queue_full: 1,
            drop_flow_gone: 2,
            no_caller: 3,
            oversize: 4,
            connects: 5,
            refused: 6,
            disconnects: 7,
            connect_failures: 8,
            sent: 80,
            dropped: 9,
            callers: vec![CallerView::default(), CallerView::default()],
            ..RouteView::default()
        };
        let mut new = RouteView {
            series: 4,
            max_callers: 2,
            ..RouteView::default()
        };
        let departed = new.go_on_from(&old);
        assert_eq!(departed, [80, 9]);
        assert_eq!(new.series, 3);
        assert_eq!(
            (
                new.datagrams,
                new.delivered,
                new.drop_queue_full,
                new.drop_flow_gone
            ),
            (100, 90, 1, 2)
        );
        assert_eq!((new.no_caller, new.oversize, new.connects), (3, 4, 5));
        assert_eq!((new.refused, new.connect_failures), (6, 8));
        assert_eq!(new.disconnects, 9, "7 before, and its 2 callers");
        assert_eq!(new.max_callers, 2, "a setting: the new route's");
    }
}
