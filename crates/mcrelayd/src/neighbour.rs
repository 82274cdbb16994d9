//! The next hop's MAC address of a unicast `egress = "xdp"` output: the
//! frames the worker builds skip the kernel's IP output path, and with it
//! the neighbour (ARP) lookup, so their destination MAC is looked up here,
//! once, when the output is opened (the flow starts, a reload changes it,
//! its interface comes back after a flap, a failed start is retried).
//!
//! Through a `NETLINK_ROUTE` socket of its own (no privilege needed: both
//! are reads): `RTM_GETROUTE` for the destination out of the output's
//! interface gives the next hop (a gateway, or the destination itself on
//! the link), `RTM_GETNEIGH` that next hop's entry. An entry the kernel
//! would send to itself (`REACHABLE`, `STALE`, `DELAY`, `PROBE`,
//! `PERMANENT`) gives the MAC. Without one, the kernel is made to resolve
//! it the normal way: one empty UDP datagram to the next hop's discard
//! port (9) with TTL 1, from a socket bound to the interface (it never
//! goes past the next hop, and nothing listens there); then the entry is
//! read again every 20 ms for up to [`RESOLVE_WAIT`]. Still nothing: the
//! output is refused, naming the address and the entry's state. Parsing
//! is [`mcrelay_wire::neighbour`]. Never on the packet path.
//!
//! While the flow runs, [`follow`] keeps the MAC in step with the
//! kernel's table: one thread of the daemon, started with the first
//! unicast xdp output (at start, only once privileges are dropped: until
//! then the process stays single-threaded), reads what changed since the
//! outputs were resolved, then the neighbour notifications
//! (`RTMGRP_NEIGH`) and, when a followed next hop's entry gets a new
//! usable MAC (the host was replaced and announced itself, an
//! administrator set it), stores it in the output's [`NextHopMac`], which
//! the worker reads before each frame it builds. An entry that fails or is
//! deleted keeps the last MAC (the kernel's own sends would queue and
//! retry; these frames go to the last address known). After an overrun of
//! the notification socket every followed next hop is read again.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use mcrelay_uring::worker::NextHopMac;

use mcrelay_wire::neighbour::{
    self, Answer, NUD_FAILED, NUD_INCOMPLETE, Neighbour, Route, neighbour_request, route_request,
};
use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    socket,
};

/// How long an unresolved next hop is waited for: the kernel sends three
/// ARP requests a second apart before it gives up (`mcast_solicit`,
/// `retrans_time_ms`), and an answer normally comes in a millisecond.
pub const RESOLVE_WAIT: Duration = Duration::from_secs(3);
/// How long one answer from the kernel is waited for.
const ANSWER_WAIT: Duration = Duration::from_secs(2);
/// The discard port: what the resolving datagram is sent to.
const DISCARD_PORT: u16 = 9;

/// `RTMGRP_NEIGH`: neighbour table notifications.
const RTMGRP_NEIGH: u32 = 4;

/// A `NETLINK_ROUTE` socket for requests (subscribed to nothing).
struct Rtnl {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    fn open() -> io::Result<Self> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        socket2::SockRef::from(&fd).set_read_timeout(Some(ANSWER_WAIT))?;
        Ok(Self {
            fd,
            seq: 0,
            buf: vec![0; 16 << 10],
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Send `request` (sequence number `seq`) and read until its answer.
    fn ask(&mut self, request: &[u8], seq: u32) -> io::Result<Answer> {
        loop {
            match send(self.fd.as_raw_fd(), request, MsgFlags::empty()) {
                Ok(_) => break,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let deadline = Instant::now() + ANSWER_WAIT;
        loop {
            let n = match recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty()) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the kernel did not answer an rtnetlink request",
                    ));
                }
                Err(e) => return Err(e.into()),
            };
            for answer in neighbour::answers(self.buf.get(..n).unwrap_or_default()) {
                match answer {
                    Ok((s, Answer::Error(errno))) if s == seq && errno < 0 => {
                        return Err(io::Error::from_raw_os_error(errno.saturating_neg()));
                    }
                    Ok((s, a @ (Answer::Route(_) | Answer::Neighbour(_)))) if s == seq => {
                        return Ok(a);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("a malformed rtnetlink answer: {e}"),
                        ));
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the kernel did not answer an rtnetlink request",
                ));
            }
        }
    }

    fn route(&mut self, destination: Ipv4Addr, ifindex: u32) -> io::Result<Route> {
        let seq = self.next_seq();
        match self.ask(&route_request(seq, destination, ifindex), seq)? {
            Answer::Route(r) => Ok(r),
            _ => Err(io::ErrorKind::InvalidData.into()),
        }
    }

    /// The entry of `address` on `ifindex`; `None` when there is none.
    fn neighbour(&mut self, address: Ipv4Addr, ifindex: u32) -> io::Result<Option<Neighbour>> {
        let seq = self.next_seq();
        match self.ask(&neighbour_request(seq, address, ifindex), seq) {
            Ok(Answer::Neighbour(n)) => Ok(Some(n)),
            Ok(_) => Err(io::ErrorKind::InvalidData.into()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Make the kernel resolve `next_hop` on `interface`: one empty datagram
/// to its discard port, TTL 1, from a socket bound to the interface.
fn solicit(next_hop: Ipv4Addr, interface: &str) -> io::Result<()> {
    let s = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    // Best effort: binding an unbound socket to a device needs no
    // privilege since Linux 5.7; without it routing picks the interface,
    // as the route lookup did.
    let _ = socket2::SockRef::from(&s).bind_device(Some(interface.as_bytes()));
    s.set_ttl(1)?;
    s.connect((next_hop, DISCARD_PORT))?;
    // A send refused at once (an entry that failed a moment ago) has
    // still started a new resolution.
    let _ = s.send(&[]);
    Ok(())
}

/// A unicast destination's next hop, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    /// The output interface's index.
    pub ifindex: u32,
    /// The gateway, or the destination itself.
    pub next_hop: Ipv4Addr,
    pub mac: [u8; 6],
}

/// The MAC address frames to unicast `destination` out of `interface`
/// carry: its next hop's, resolved as the module says, waiting up to
/// `wait`. The error names the destination, the next hop and why.
pub fn resolve_mac(interface: &str, destination: Ipv4Addr, wait: Duration) -> io::Result<Resolved> {
    let ifindex = nix::net::if_::if_nametoindex(interface).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("interface {interface}: {e}"),
        )
    })?;
    let mut rtnl = Rtnl::open()?;
    let route = rtnl.route(destination, ifindex).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("no route to {destination} out of {interface} ({e}); egress = \"xdp\" needs one when the flow starts"),
        )
    })?;
    let next_hop = neighbour::next_hop(&route, destination, ifindex).map_err(|why| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{destination} can't be sent to on {interface} with egress = \"xdp\": {why}; use egress = \"socket\""),
        )
    })?;
    let deadline = Instant::now() + wait;
    let mut solicited = false;
    let mut incomplete = false;
    let mut state: &'static str;
    loop {
        match rtnl.neighbour(next_hop, ifindex)? {
            Some(n) => {
                if let Some(mac) = n.usable_mac() {
                    return Ok(Resolved {
                        ifindex,
                        next_hop,
                        mac,
                    });
                }
                state = n.state_name();
                // The resolution this started has given up.
                if incomplete && n.state == NUD_FAILED {
                    break;
                }
                incomplete |= solicited && n.state == NUD_INCOMPLETE;
            }
            None => state = "absent",
        }
        if !solicited {
            solicit(next_hop, interface)?;
            solicited = true;
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let hop = if next_hop == destination {
        format!("{destination}")
    } else {
        format!("{next_hop} (the gateway to {destination})")
    };
    Err(io::Error::new(
        io::ErrorKind::HostUnreachable,
        format!(
            "no MAC address for {hop} on {interface}: its neighbour entry is {state} after ARP for {wait:?}; is the host up and the address right? (egress = \"xdp\" sends only to a resolved next hop; egress = \"socket\" would queue and retry)"
        ),
    ))
}

/// One followed next hop: whose MAC (the output's [`NextHopMac`], gone
/// when the output is) to keep in step with the entry of `next_hop` on
/// `ifindex`.
struct Followed {
    ifindex: u32,
    next_hop: Ipv4Addr,
    mac: Weak<NextHopMac>,
    /// The output's label, for the log.
    label: String,
}

/// The next hops followed now (touched by the opening supervisor and the
/// watcher thread only; never by a worker).
static FOLLOWED: Mutex<Vec<Followed>> = Mutex::new(Vec::new());
static WATCHER: std::sync::Once = std::sync::Once::new();
/// The daemon has dropped its privileges: a thread may start (before, the
/// process must stay single-threaded, see `run::supervise`).
static MAY_SPAWN: AtomicBool = AtomicBool::new(false);

/// Keep `mac` (an output's next hop MAC, just resolved) in step with the
/// kernel's neighbour table while the output exists. Starts the watcher
/// thread the first time, once privileges are dropped
/// ([`privileges_dropped`]).
pub fn follow(resolved: &Resolved, mac: &Arc<NextHopMac>, label: String) {
    let mut followed = FOLLOWED.lock().unwrap_or_else(PoisonError::into_inner);
    followed.retain(|f| f.mac.strong_count() > 0);
    followed.push(Followed {
        ifindex: resolved.ifindex,
        next_hop: resolved.next_hop,
        mac: Arc::downgrade(mac),
        label,
    });
    drop(followed);
    if MAY_SPAWN.load(Ordering::Relaxed) {
        start_watcher();
    }
}

/// Called once the daemon is unprivileged (and may have threads): starts
/// the watcher if outputs opened at start follow a next hop.
pub fn privileges_dropped() {
    MAY_SPAWN.store(true, Ordering::Relaxed);
    let any = !FOLLOWED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .is_empty();
    if any {
        start_watcher();
    }
}

fn start_watcher() {
    WATCHER.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("mcrelay-neigh".into())
            .spawn(watch);
        if let Err(e) = spawned {
            tracing::error!(
                "starting the neighbour watcher: {e}; unicast xdp outputs keep the MAC they started with"
            );
        }
    });
}

/// Apply a neighbour entry to every output following it; how many
/// changed.
fn apply(n: &Neighbour) -> usize {
    let (Some(mac), Some(address)) = (n.usable_mac(), n.address) else {
        // Failed, being resolved, or deleted: keep the last MAC.
        return 0;
    };
    let mut changed = 0;
    let mut followed = FOLLOWED.lock().unwrap_or_else(PoisonError::into_inner);
    followed.retain(|f| f.mac.strong_count() > 0);
    for f in followed
        .iter()
        .filter(|f| f.ifindex == n.ifindex && f.next_hop == address)
    {
        if let Some(m) = f.mac.upgrade()
            && m.get() != mac
        {
            m.set(mac);
            changed += 1;
            tracing::info!(
                output = %f.label,
                next_hop = %address,
                mac = %crate::sockets::format_mac(mac),
                "xdp egress: the next hop's MAC changed; frames follow it"
            );
        }
    }
    changed
}

/// Read every followed next hop's entry again (after an overrun).
fn reread() {
    let hops: Vec<(u32, Ipv4Addr)> = FOLLOWED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|f| (f.ifindex, f.next_hop))
        .collect();
    let Ok(mut rtnl) = Rtnl::open() else {
        return;
    };
    for (ifindex, hop) in hops {
        if let Ok(Some(n)) = rtnl.neighbour(hop, ifindex) {
            apply(&n);
        }
    }
}

/// The watcher thread: neighbour notifications, forever.
fn watch() {
    let socket = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )
    .map_err(io::Error::from)
    .and_then(|fd| {
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, RTMGRP_NEIGH))?;
        // Best effort: a smaller buffer only makes overruns likelier.
        let _ = socket2::SockRef::from(&fd).set_recv_buffer_size(1 << 20);
        Ok(fd)
    });
    let fd = match socket {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!(
                "watching neighbour changes: {e}; unicast xdp outputs keep the MAC they started with"
            );
            return;
        }
    };
    // What changed between the outputs' resolution and this subscription.
    reread();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(n) => {
                for answer in neighbour::answers(buf.get(..n).unwrap_or_default()) {
                    if let Ok((_, Answer::Neighbour(nb))) = answer {
                        apply(&nb);
                    }
                }
            }
            Err(Errno::EINTR) => {}
            Err(Errno::ENOBUFS) => {
                tracing::warn!(
                    "neighbour notifications overran; reading the followed next hops again"
                );
                reread();
            }
            Err(e) => {
                tracing::error!("reading neighbour changes: {e}; retrying in a second");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback: the route to 127.0.0.1 is a local one, refused by name;
    /// an interface that doesn't exist is named. (No privilege, no
    /// traffic.)
    /// A notification with a new usable MAC reaches the outputs following
    /// that next hop on that interface, and no other; a failed entry
    /// changes nothing; an output that is gone is forgotten.
    #[test]
    fn a_new_mac_reaches_the_outputs_following_its_next_hop() {
        let hop = Ipv4Addr::new(192, 0, 2, 77);
        let old = [2, 0, 0, 0, 0, 1];
        let new = [2, 0, 0, 0, 0, 2];
        let here = Arc::new(NextHopMac::new(old));
        let elsewhere = Arc::new(NextHopMac::new(old));
        let gone = Arc::new(NextHopMac::new(old));
        {
            let mut f = FOLLOWED.lock().unwrap_or_else(PoisonError::into_inner);
            for (ifindex, mac) in [(7, &here), (8, &elsewhere), (7, &gone)] {
                f.push(Followed {
                    ifindex,
                    next_hop: hop,
                    mac: Arc::downgrade(mac),
                    label: "t".into(),
                });
            }
        }
        drop(gone);
        let entry = |state, mac| Neighbour {
            ifindex: 7,
            state,
            address: Some(hop),
            mac: Some(mac),
        };
        assert_eq!(apply(&entry(NUD_FAILED, new)), 0);
        assert_eq!(here.get(), old);
        assert_eq!(
            apply(&entry(mcrelay_wire::neighbour::NUD_REACHABLE, new)),
            1
        );
        assert_eq!(here.get(), new);
        assert_eq!(elsewhere.get(), old, "another interface");
        assert_eq!(
            apply(&entry(mcrelay_wire::neighbour::NUD_STALE, new)),
            0,
            "no change"
        );
        let left = FOLLOWED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|f| f.next_hop == hop)
            .count();
        assert_eq!(left, 2, "the gone output was forgotten");
    }

    #[test]
    fn a_local_destination_and_a_missing_interface_are_refused() {
        let e =
            resolve_mac("lo", Ipv4Addr::LOCALHOST, Duration::from_millis(100)).expect_err("local");
        assert!(
            e.to_string().contains("it is an address of this host"),
            "{e}"
        );
        let e = resolve_mac("nosuchif0", Ipv4Addr::new(10, 0, 0, 1), Duration::ZERO)
            .expect_err("missing");
        assert!(e.to_string().contains("interface nosuchif0"), "{e}");
    }
}
