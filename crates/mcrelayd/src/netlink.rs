//! The kernel side of watching interfaces: a `NETLINK_ROUTE` socket
//! subscribed to link changes (`RTMGRP_LINK`), and the supervisor-side
//! thread that reads it. Needs no privileges, so the unprivileged daemon
//! owns it; workers never see it. Parsing is in [`crate::links`].
//!
//! Netlink is a datagram protocol the kernel may overrun: when the socket's
//! buffer overflows, `recv` fails with `ENOBUFS` and changes were lost.
//! The watcher then reads every link again (an `RTM_GETLINK` dump), so the
//! table it publishes can't stay stale.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    socket,
};

use crate::links::{LinkTable, Message, dump_request, messages};

/// `RTMGRP_LINK`: link notifications.
const RTMGRP_LINK: u32 = 1;
/// Socket receive buffer asked for (clamped by `net.core.rmem_max`): room
/// for thousands of link messages before an overrun.
const RECEIVE_BUFFER_BYTES: usize = 1 << 20;
/// One datagram: a dump part is at most a page or two, a notification a
/// few hundred bytes; a longer one is noticed (`MSG_TRUNC`) and handled
/// like an overrun.
const DATAGRAM_BYTES: usize = 64 << 10;
/// Dumps interrupted by changes (or overrun) are retried this often.
const DUMP_ATTEMPTS: usize = 10;

/// The link-change socket.
#[derive(Debug)]
pub struct LinkWatch {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl LinkWatch {
    /// Open the socket and subscribe to link changes. From this moment on
    /// no change is missed: the first [`dump`](Self::dump) and then
    /// [`run`](Self::run) read them in order.
    pub fn open() -> io::Result<Self> {
        Self::open_with_buffer(RECEIVE_BUFFER_BYTES)
    }

    fn open_with_buffer(receive_buffer: usize) -> io::Result<Self> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        // Best effort: a smaller buffer only makes overruns likelier.
        let _ = socket2::SockRef::from(&fd).set_recv_buffer_size(receive_buffer);
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, RTMGRP_LINK))?;
        Ok(Self {
            fd,
            seq: 0,
            buf: vec![0; DATAGRAM_BYTES],
        })
    }

    /// One datagram into `self.buf`; its length. `ENOBUFS` (overrun) and
    /// truncation both come back as `ENOBUFS`.
    fn recv(&mut self) -> io::Result<usize> {
        loop {
            // With MSG_TRUNC the kernel returns the datagram's real length.
            match recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::MSG_TRUNC) {
                Ok(n) if n > self.buf.len() => {
                    return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
                }
                Ok(n) => return Ok(n),
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn send(&self, message: &[u8]) -> io::Result<()> {
        loop {
            // An unconnected netlink socket sends to the kernel.
            match send(self.fd.as_raw_fd(), message, MsgFlags::empty()) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Every interface now: an `RTM_GETLINK` dump into a fresh table,
    /// applying in order the notifications that arrive meanwhile. Retried
    /// when the kernel says the dump was interrupted, or on an overrun.
    pub fn dump(&mut self) -> io::Result<LinkTable> {
        'attempt: for _ in 0..DUMP_ATTEMPTS {
            self.seq = self.seq.wrapping_add(1);
            let seq = self.seq;
            self.send(&dump_request(seq))?;
            let mut table = LinkTable::default();
            loop {
                let n = match self.recv() {
                    Ok(n) => n,
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => continue 'attempt,
                    Err(e) => return Err(e),
                };
                let datagram = self.buf.get(..n).unwrap_or_default();
                for m in messages(datagram) {
                    match m {
                        Ok(Message::Link(l)) => {
                            table.apply(&l);
                        }
                        Ok(Message::Done {
                            seq: s,
                            interrupted,
                        }) if s == seq => {
                            if interrupted {
                                continue 'attempt;
                            }
                            return Ok(table);
                        }
                        Ok(Message::Error { seq: s, errno }) if s == seq && errno != 0 => {
                            return Err(io::Error::from_raw_os_error(errno.saturating_neg()));
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!("malformed netlink message ignored: {e}"),
                    }
                }
            }
        }
        Err(io::Error::other(format!(
            "the link dump was interrupted {DUMP_ATTEMPTS} times in a row"
        )))
    }

    /// Read link changes forever, starting from `table`; after every
    /// datagram that changed it, hand the new table to `publish`, which
    /// returns false to stop (the supervisor is gone).
    pub fn run(mut self, mut table: LinkTable, mut publish: impl FnMut(&LinkTable) -> bool) {
        loop {
            let changed = match self.recv() {
                Ok(n) => {
                    let mut changed = false;
                    for m in messages(self.buf.get(..n).unwrap_or_default()) {
                        match m {
                            Ok(Message::Link(l)) => changed |= table.apply(&l),
                            Ok(_) => {}
                            Err(e) => tracing::warn!("malformed netlink message ignored: {e}"),
                        }
                    }
                    changed
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    tracing::warn!(
                        "netlink overrun: link changes were lost; reading every interface again"
                    );
                    match self.dump() {
                        Ok(fresh) => {
                            let changed = fresh != table;
                            table = fresh;
                            changed
                        }
                        Err(e) => {
                            tracing::error!("reading every interface again: {e}; retrying");
                            std::thread::sleep(Duration::from_secs(1));
                            false
                        }
                    }
                }
                Err(e) => {
                    tracing::error!("reading link changes: {e}; retrying in a second");
                    std::thread::sleep(Duration::from_secs(1));
                    false
                }
            };
            if changed && !publish(&table) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::links::InterfaceState;

    #[test]
    fn dump_finds_loopback() {
        let mut w = LinkWatch::open().expect("netlink socket (no privileges needed)");
        let table = w.dump().expect("dump");
        assert_ne!(table.state("lo"), InterfaceState::Missing, "{table:?}");
        assert_eq!(table.state("nosuchif0"), InterfaceState::Missing);
        // A second dump on the same socket works too (sequence numbers).
        assert_eq!(w.dump().expect("dump again"), table);
    }

    /// An overrun on a tiny buffer (many link changes in a private network
    /// namespace) is recovered by a dump: the table ends up right.
    #[test]
    fn overrun_is_recovered_by_a_dump() {
        if !std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
        {
            eprintln!("SKIPPED: needs root for a private network namespace");
            return;
        }
        // A thread of its own in a network namespace of its own: the
        // host's interfaces are never touched. `ip` inherits it.
        std::thread::spawn(|| {
            let rc = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET);
            assert_eq!(rc, Ok(()), "unshare");
            let w = LinkWatch::open_with_buffer(0).expect("socket");
            let mut first = LinkWatch::open().expect("socket").dump().expect("dump");
            let (tx, rx) = std::sync::mpsc::channel();
            let ip = |args: &str| {
                let s = std::process::Command::new("ip")
                    .args(["-batch", "-"])
                    .stdin(std::process::Stdio::piped())
                    .spawn()
                    .and_then(|mut c| {
                        use std::io::Write;
                        c.stdin.take().expect("stdin").write_all(args.as_bytes())?;
                        c.wait()
                    })
                    .expect("ip");
                assert!(s.success());
            };
            // 100 veth pairs created, set up and down before the watcher
            // reads anything: far more than a minimal buffer holds.
            let mut batch = String::new();
            for i in 0..100 {
                batch.push_str(&format!(
                    "link add d{i} type veth peer name p{i}\nlink set d{i} up\nlink set p{i} up\n"
                ));
            }
            batch.push_str("link set d7 down\nlink del d9\n");
            ip(&batch);
            first.apply(&crate::links::LinkMessage {
                deleted: false,
                family: 0,
                index: u32::MAX,
                flags: 0,
                name: Some("stale".into()),
                operstate: None,
            });
            let watcher = std::thread::spawn(move || {
                w.run(first, |t| tx.send(t.clone()).is_ok());
            });
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            let mut last = None;
            while std::time::Instant::now() < deadline {
                if let Ok(t) = rx.recv_timeout(Duration::from_millis(200)) {
                    last = Some(t);
                }
                if let Some(t) = &last
                    && t.state("d99") == InterfaceState::Up
                    && t.state("stale") == InterfaceState::Missing
                {
                    break;
                }
            }
            let t = last.expect("a table was published");
            assert_eq!(t.state("d0"), InterfaceState::Up);
            assert_eq!(t.state("d7"), InterfaceState::Down);
            assert_eq!(t.state("d9"), InterfaceState::Missing);
            assert_eq!(t.state("d99"), InterfaceState::Up);
            assert_eq!(t.state("p7"), InterfaceState::Down, "no carrier");
            assert_eq!(
                t.state("stale"),
                InterfaceState::Missing,
                "only a dump removes it"
            );
            drop(rx);
            // The watcher stops at its next publish; one more change.
            ip("link set d0 down\n");
            watcher.join().expect("watcher");
        })
        .join()
        .expect("test thread");
    }
}
