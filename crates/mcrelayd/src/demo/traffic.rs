//! The demo's traffic: one paced sender thread in the sender namespace and
//! one validating receiver thread per output in the receivers' namespace.
//! Both use the load generator's pure parts (`mcrelay_loadgen`'s pacer,
//! payload and tracker, built without its batched socket code): the same
//! numbered, patterned datagrams and the same byte-by-byte checks and
//! sequence accounting as the benchmark's `loadgen send` / `loadgen recv`.
//! Not the packet path under test: plain std sockets, one `send` and one
//! `recv` per datagram (at the demo's few thousand datagrams a second),
//! a little allocation at start.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::{DemoError, IoContext};
use mcrelay_loadgen::pacer::Pacer;
use mcrelay_loadgen::payload;
use mcrelay_loadgen::tracker::Streams;
use mcrelay_sys::sockopt::{force_receive_buffer, join_any_source_group, multicast_if_v4};
use socket2::{Domain, Protocol, Socket, Type};

use super::netns;

/// One stream the sender sends: to `dest`, datagram sizes cycled through
/// `sizes`, tagged with `stream_id`.
#[derive(Debug, Clone)]
pub struct Stream {
    pub dest: SocketAddr,
    pub stream_id: u32,
    pub sizes: &'static [usize],
}

/// Handle of the running sender; [`Sender::finish`] stops it.
#[derive(Debug)]
pub struct Sender {
    stop: Arc<AtomicBool>,
    sent: Arc<[AtomicU64]>,
    thread: JoinHandle<Result<(), DemoError>>,
}

impl Sender {
    /// Start sending every stream at `rate` datagrams per second each, from
    /// the namespace `ns`, for `duration` (or until [`finish`](Self::finish)).
    pub fn start(
        ns: &str,
        streams: Vec<Stream>,
        run_id: u32,
        rate: u64,
        duration: Duration,
    ) -> Result<Self, DemoError> {
        let stop = Arc::new(AtomicBool::new(false));
        let sent: Arc<[AtomicU64]> = streams.iter().map(|_| AtomicU64::new(0)).collect();
        let (ready_tx, ready_rx) = mpsc::channel();
        let ns = ns.to_owned();
        let thread = {
            let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
            std::thread::Builder::new()
                .name("demo-sender".into())
                .spawn(move || {
                    let sockets = match open_senders(&ns, &streams) {
                        Ok(sockets) => {
                            let _ = ready_tx.send(Ok(()));
                            sockets
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("{e:#}")));
                            return Ok(());
                        }
                    };
                    send_loop(&sockets, &streams, run_id, rate, duration, &stop, &sent)
                })
                .ctx(|| "starting the sender thread".into())?
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Sender { stop, sent, thread }),
            Ok(Err(e)) => Err(DemoError::Thread(format!("sender: {e}"))),
            Err(_) => Err(DemoError::Thread(
                "the sender thread ended before opening its sockets".into(),
            )),
        }
    }

    /// Datagrams sent so far, per stream.
    pub fn sent(&self) -> Vec<u64> {
        self.sent
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    /// Whether it has sent for its whole duration.
    pub fn done(&self) -> bool {
        self.thread.is_finished()
    }

    /// Stop (if still sending) and return what each stream sent.
    pub fn finish(self) -> Result<Vec<u64>, DemoError> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(r) => r?,
            Err(_) => return Err(DemoError::Thread("the sender thread panicked".into())),
        }
        Ok(self
            .sent
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect())
    }
}

fn open_senders(ns: &str, streams: &[Stream]) -> Result<Vec<UdpSocket>, DemoError> {
    super::sys::enter_netns(ns)?;
    let ifindex = mcrelay_sys::net::interface_index(netns::SENDER_IF)
        .ctx(|| format!("interface {} in {ns}", netns::SENDER_IF))?;
    streams
        .iter()
        .map(|s| sender(s.dest, ifindex).ctx(|| format!("sending to {}", s.dest)))
        .collect()
}

/// A UDP socket connected to the IPv4 group or address `dest`, multicast
/// out of interface `ifindex`, TTL 8, no loopback.
fn sender(dest: SocketAddr, ifindex: u32) -> std::io::Result<UdpSocket> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    // Room for a burst of jumbo datagrams between two pacer ticks.
    let _ = socket.set_send_buffer_size(4 << 20);
    multicast_if_v4(&socket, ifindex, Ipv4Addr::UNSPECIFIED)?;
    socket.set_multicast_ttl_v4(8)?;
    socket.set_ttl_v4(8)?;
    socket.set_multicast_loop_v4(false)?;
    socket.connect(&dest.into())?;
    Ok(socket.into())
}

/// Longest the sender sleeps between bursts: at the demo's rates, a burst
/// of a few datagrams a millisecond is smooth enough and costs little CPU
/// (the load generator's spin-wait would burn a core to be exact).
const TICK: Duration = Duration::from_millis(1);

fn send_loop(
    sockets: &[UdpSocket],
    streams: &[Stream],
    run_id: u32,
    rate: u64,
    duration: Duration,
    stop: &AtomicBool,
    sent: &[AtomicU64],
) -> Result<(), DemoError> {
    const BATCH: usize = 64;
    let start = Instant::now();
    let end = start + duration;
    let mut pacer = Pacer::starting_at(rate, start);
    let mut bufs: Vec<Vec<u8>> = vec![Vec::new(); BATCH];
    let mut next_seq = vec![0u64; streams.len()];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let due = match pacer.poll(now, BATCH) {
            Ok(n) => n,
            Err(next) => {
                std::thread::sleep((next - now).max(TICK / 2).min(TICK));
                continue;
            }
        };
        for ((stream, socket), (seq, counter)) in streams
            .iter()
            .zip(sockets)
            .zip(next_seq.iter_mut().zip(sent))
        {
            for (k, buf) in bufs.iter_mut().take(due).enumerate() {
                let s = *seq + k as u64;
                let size =
                    stream.sizes[usize::try_from(s % stream.sizes.len() as u64).unwrap_or(0)];
                buf.resize(size, 0);
                payload::write(buf, run_id, stream.stream_id, s);
            }
            let mut off = 0;
            while off < due {
                match socket.send(&bufs[off]) {
                    Ok(_) => off += 1,
                    // A full queue: wait a little and retry the rest.
                    Err(e)
                        if e.kind() == ErrorKind::WouldBlock
                            || e.kind() == ErrorKind::Interrupted
                            || e.raw_os_error() == Some(libc::ENOBUFS) =>
                    {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    Err(e) => return Err(e).ctx(|| format!("sending to {}", stream.dest)),
                }
            }
            *seq += due as u64;
            counter.store(*seq, Ordering::Relaxed);
        }
        pacer.sent(due);
    }
    Ok(())
}

/// What one receiver counted.
#[derive(Debug)]
pub struct Received {
    pub streams: Streams,
}

/// A receiver thread joined to one group.
#[derive(Debug)]
pub struct Receiver {
    pub group: SocketAddr,
    /// Valid datagrams received so far (for knowing when all arrived).
    valid: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Received, DemoError>>,
}

impl Receiver {
    /// Join `group` on the receivers' interface in namespace `ns`; returns
    /// once the socket is bound and joined.
    pub fn start(ns: &str, group: SocketAddr, run_id: u32) -> Result<Self, DemoError> {
        let stop = Arc::new(AtomicBool::new(false));
        let valid = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = mpsc::channel();
        let ns = ns.to_owned();
        let thread = {
            let (stop, valid) = (Arc::clone(&stop), Arc::clone(&valid));
            std::thread::Builder::new()
                .name(format!("demo-recv-{group}"))
                .spawn(move || {
                    let socket = match open_receiver(&ns, group) {
                        Ok(socket) => {
                            let _ = ready_tx.send(Ok(()));
                            socket
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("{e:#}")));
                            return Err(e);
                        }
                    };
                    receive_loop(&socket, run_id, &stop, &valid)
                })
                .ctx(|| "starting a receiver thread".into())?
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Receiver {
                group,
                valid,
                stop,
                thread,
            }),
            Ok(Err(e)) => Err(DemoError::Thread(format!("receiver for {group}: {e}"))),
            Err(_) => Err(DemoError::Thread(format!(
                "the receiver thread for {group} ended before joining"
            ))),
        }
    }

    /// Valid datagrams so far.
    pub fn valid(&self) -> u64 {
        self.valid.load(Ordering::Relaxed)
    }

    /// Stop and return the counts.
    pub fn finish(self) -> Result<Received, DemoError> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(r) => r,
            Err(_) => Err(DemoError::Thread(format!(
                "the receiver thread for {} panicked",
                self.group
            ))),
        }
    }
}

fn open_receiver(ns: &str, group: SocketAddr) -> Result<UdpSocket, DemoError> {
    super::sys::enter_netns(ns)?;
    let ifindex = mcrelay_sys::net::interface_index(netns::RECEIVER_IF)
        .ctx(|| format!("interface {} in {ns}", netns::RECEIVER_IF))?;
    let socket = receiver(group, ifindex).ctx(|| format!("joining {group}"))?;
    // Bounds how long a stop waits for the loop.
    socket.set_read_timeout(Some(Duration::from_millis(50)))?;
    Ok(socket)
}

/// A UDP socket bound to the IPv4 `group` (or unicast address) and joined
/// to it on interface `ifindex`, receiving only what was sent to it.
fn receiver(group: SocketAddr, ifindex: u32) -> std::io::Result<UdpSocket> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    // A burst of the relay's output must fit while this thread is off CPU
    // (forced past rmem_max: the demo runs as root), as `loadgen recv`.
    let _ = force_receive_buffer(&socket, 8 << 20);
    if group.ip().is_multicast() {
        socket.set_reuse_address(true)?;
        socket.set_multicast_all_v4(false)?;
    }
    socket.bind(&group.into())?;
    if let IpAddr::V4(g) = group.ip()
        && g.is_multicast()
    {
        join_any_source_group(&socket, group.ip(), ifindex)?;
    }
    Ok(socket.into())
}

/// Receive buffer per datagram: the largest the demo sends, and more.
const RECV_STRIDE: usize = 9216;

fn receive_loop(
    socket: &UdpSocket,
    run_id: u32,
    stop: &AtomicBool,
    valid: &AtomicU64,
) -> Result<Received, DemoError> {
    let mut buf = vec![0u8; RECV_STRIDE];
    let mut streams = Streams::new(mcrelay_loadgen::tracker::DEFAULT_LIMIT);
    while !stop.load(Ordering::Relaxed) {
        let n = match socket.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e).ctx(|| "receiving".into()),
        };
        // Failures are counted by kind inside.
        let _ = streams.on_datagram(&buf[..n], run_id);
        valid.store(streams.valid, Ordering::Relaxed);
    }
    Ok(Received { streams })
}
