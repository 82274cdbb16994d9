//! Passing file descriptors between the daemon and the helper: one message
//! with its fds attached as an `SCM_RIGHTS` control message.
//!
//! The socket is a `SOCK_SEQPACKET` Unix socket pair ([`pair`]), held as a
//! std [`UnixStream`] (std wraps any connected Unix socket fd through
//! `From<OwnedFd>`; the type only names the fd, the kernel keeps the
//! semantics). On it each [`send_with_fds`] is one record, delivered whole
//! and alone by one [`recv_with_fds`], with its fds; a record never merges
//! with the next and never arrives in pieces. Use only these two functions
//! on it: std's `Read`/`Write` helpers such as `read_exact` assume a byte
//! stream and would silently drop the rest of a record.
//!
//! At most [`MAX_FDS_PER_MESSAGE`] (the kernel's `SCM_MAX_FD`, 253) fds fit
//! in one message; the protocol splits larger sets over several messages.
//!
//! Sending goes through nix (`sendmsg` with `ControlMessage::ScmRights`).
//! Receiving stays a raw `recvmsg`: nix refuses to walk the control data
//! of a message flagged `MSG_CTRUNC`, but the fds the kernel installed
//! before it ran out of room (or fd-table slots) must still be taken and
//! closed, so this module walks the headers itself.
#![allow(unsafe_code)]

use std::io::{self, IoSlice};
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use socket2::{Domain, Socket, Type};

/// Most fds one message can carry (`SCM_MAX_FD` in the kernel).
pub const MAX_FDS_PER_MESSAGE: usize = 253;

/// A connected `SOCK_SEQPACKET` Unix socket pair, close-on-exec, each end
/// held as a [`UnixStream`] (see the module docs for why that type).
pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
    // `Socket::pair` adds SOCK_CLOEXEC.
    let (a, b) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None)?;
    Ok((
        UnixStream::from(OwnedFd::from(a)),
        UnixStream::from(OwnedFd::from(b)),
    ))
}

/// Bytes of control buffer for `n` fds (`CMSG_SPACE(n * sizeof(int))`).
fn cmsg_space(n: usize) -> usize {
    // n <= MAX_FDS_PER_MESSAGE, checked by both callers, so this fits.
    let data = u32::try_from(n * size_of::<RawFd>()).unwrap_or(u32::MAX);
    // SAFETY: CMSG_SPACE is pure arithmetic on its argument.
    let space = unsafe { libc::CMSG_SPACE(data) };
    space as usize
}

/// A zeroed control buffer of at least `bytes` bytes, aligned for
/// `cmsghdr` (u64 alignment is at least `cmsghdr`'s on every Linux ABI).
fn cmsg_buffer(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(size_of::<u64>())]
}

/// Send `bytes` as one record with `fds` attached (`SCM_RIGHTS`).
///
/// `bytes` must not be empty (an empty record reads as end of stream on
/// the other side); at most [`MAX_FDS_PER_MESSAGE`] fds. The fds stay open
/// here; the receiver gets its own copies. Never raises `SIGPIPE`: a closed
/// peer is an `EPIPE` error.
pub fn send_with_fds(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if bytes.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an empty record cannot be sent: the peer would read it as end of stream",
        ));
    }
    if fds.len() > MAX_FDS_PER_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} fds in one message; the kernel takes at most {MAX_FDS_PER_MESSAGE}",
                fds.len()
            ),
        ));
    }
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    // No control message at all when there are no fds.
    let cmsgs = if raw.is_empty() { &[][..] } else { &rights[..] };
    let iov = [IoSlice::new(bytes)];
    loop {
        // The fds are borrowed, so open for the duration of the call.
        match sendmsg::<()>(
            stream.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(n) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("sent {n} of {} bytes of one record", bytes.len()),
                ));
            }
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receive one record into `buf`, and the fds attached to it (at most
/// `max_fds`, each close-on-exec).
///
/// Returns `(0, [])` at end of stream (the peer closed; this protocol never
/// sends empty records). Errors, with every fd that arrived already closed:
/// - `InvalidData` if the record was longer than `buf` (`MSG_TRUNC`), if
///   more than `max_fds` fds came, or if the kernel had to discard some for
///   lack of room (`MSG_CTRUNC`);
/// - `WouldBlock`/`TimedOut` when the socket's receive timeout expires;
/// - the raw OS error `EMFILE` when this process's fd table was too full to
///   take the fds (see [`recv_record`], which says so without failing);
/// - any other error of `recvmsg`.
pub fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let record = recv_record(stream, buf, max_fds)?;
    if record.out_of_fds {
        return Err(io::Error::from_raw_os_error(libc::EMFILE));
    }
    Ok((record.len, record.fds))
}

/// One record and its fds, from [`recv_record`].
#[derive(Debug)]
pub struct Record {
    /// Bytes of the record in the buffer.
    pub len: usize,
    /// The fds that came with it.
    pub fds: Vec<OwnedFd>,
    /// The record came with fds that this process had no room for: the
    /// kernel installed fewer than the buffer could take (it stops at the
    /// first `EMFILE`/`ENFILE` and flags `MSG_CTRUNC`). Those that were
    /// installed are closed and `fds` is empty. The record itself arrived
    /// whole, so the stream is still in step: the caller can skip what the
    /// record announced and try again once fds are free.
    pub out_of_fds: bool,
}

/// [`recv_with_fds`], telling a full fd table (retryable) apart from a
/// protocol error.
pub fn recv_record(stream: &UnixStream, buf: &mut [u8], max_fds: usize) -> io::Result<Record> {
    let max_fds = max_fds.min(MAX_FDS_PER_MESSAGE);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for `max_fds` (rounded up by alignment, so perhaps one more:
    // counted below). With no room, any fd sent is discarded by the kernel
    // and flagged with MSG_CTRUNC.
    let space = cmsg_space(max_fds);
    let mut control = cmsg_buffer(space);
    // SAFETY: `msghdr` is plain data for which all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: `msg` points to a live iovec over `buf` (writable,
        // `buf.len()` bytes) and a live, cmsghdr-aligned control buffer of
        // `msg_controllen` bytes; the kernel writes within those bounds.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &raw mut msg, libc::MSG_CMSG_CLOEXEC) };
        if let Ok(n) = usize::try_from(n) {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // Take ownership of every fd the kernel installed, first, so that any
    // error below closes them.
    let mut fds = Vec::new();
    // SAFETY: after recvmsg, `msg_control`/`msg_controllen` describe the
    // control data the kernel wrote into our buffer.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&raw const msg) };
    while !cmsg.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR only return headers that lie
        // within the control data, aligned for cmsghdr.
        let header = unsafe { cmsg.read() };
        if header.cmsg_level == libc::SOL_SOCKET && header.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN(0) is pure arithmetic.
            let empty = unsafe { libc::CMSG_LEN(0) } as usize;
            let count = (header.cmsg_len as usize).saturating_sub(empty) / size_of::<RawFd>();
            // SAFETY: `cmsg` is a valid header (above).
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<RawFd>();
            for i in 0..count {
                // SAFETY: the kernel wrote `count` ints after the header,
                // within the control data; read unaligned to be safe.
                let fd = unsafe { data.wrapping_add(i).read_unaligned() };
                // SAFETY: SCM_RIGHTS fds were just installed in our table
                // by this recvmsg and are owned by nothing else yet.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
        // SAFETY: `msg` still describes the control data; `cmsg` is a
        // header within it.
        cmsg = unsafe { libc::CMSG_NXTHDR(&raw const msg, cmsg) };
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message longer than {} bytes; discarded", buf.len()),
        ));
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 && fds.len() < max_fds {
        // The buffer had room for more than arrived: the fd table didn't.
        return Ok(Record {
            len: n,
            fds: Vec::new(),
            out_of_fds: true,
        });
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "message carried more fds than the {max_fds} expected (control data truncated); closed them"
            ),
        ));
    }
    if fds.len() > max_fds {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "message carried {} fds, more than the {max_fds} expected; closed them",
                fds.len()
            ),
        ));
    }
    Ok(Record {
        len: n,
        fds,
        out_of_fds: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;
    use std::time::Duration;

    fn udp() -> UdpSocket {
        UdpSocket::bind("127.0.0.1:0").expect("bind")
    }

    fn is_cloexec(fd: &OwnedFd) -> bool {
        // SAFETY: F_GETFD on an open fd we own only reads its flags.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert!(flags >= 0, "{}", io::Error::last_os_error());
        flags & libc::FD_CLOEXEC != 0
    }

    #[test]
    fn three_fds_round_trip_and_are_the_same_sockets() {
        let (a, b) = pair().expect("pair");
        let originals = [udp(), udp(), udp()];
        let addrs: Vec<_> = originals
            .iter()
            .map(|s| s.local_addr().expect("addr"))
            .collect();
        let borrowed: Vec<_> = originals.iter().map(AsFd::as_fd).collect();
        send_with_fds(&a, b"three", &borrowed).expect("send");

        let mut buf = [0u8; 64];
        let (n, fds) = recv_with_fds(&b, &mut buf, 3).expect("recv");
        assert_eq!(&buf[..n], b"three");
        assert_eq!(fds.len(), 3);
        assert!(fds.iter().all(is_cloexec), "MSG_CMSG_CLOEXEC");
        let passed: Vec<UdpSocket> = fds.into_iter().map(UdpSocket::from).collect();
        for (p, addr) in passed.iter().zip(&addrs) {
            assert_eq!(p.local_addr().expect("addr"), *addr);
        }

        // A datagram sent to the original arrives on the passed copy, and
        // one sent through the copy comes from the original's address.
        let probe = udp();
        probe
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        passed[1]
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        probe.send_to(b"hello", addrs[1]).expect("send");
        let mut got = [0u8; 16];
        let n = passed[1].recv(&mut got).expect("recv via passed fd");
        assert_eq!(&got[..n], b"hello");
        passed[2]
            .send_to(b"back", probe.local_addr().expect("addr"))
            .expect("send");
        let (n, from) = probe.recv_from(&mut got).expect("recv");
        assert_eq!(&got[..n], b"back");
        assert_eq!(from, addrs[2]);
    }

    #[test]
    fn records_stay_separate() {
        let (a, b) = pair().expect("pair");
        send_with_fds(&a, b"one", &[]).expect("send");
        send_with_fds(&a, b"two!", &[]).expect("send");
        let mut buf = [0u8; 64];
        assert_eq!(recv_with_fds(&b, &mut buf, 0).expect("recv").0, 3);
        assert_eq!(recv_with_fds(&b, &mut buf, 0).expect("recv").0, 4);
        drop(a);
        let (n, fds) = recv_with_fds(&b, &mut buf, 4).expect("eof");
        assert_eq!((n, fds.len()), (0, 0), "end of stream");
    }

    /// Binds the ports of `sockets` again without SO_REUSEADDR: succeeds
    /// only if every copy of every socket was closed.
    fn assert_all_closed(addrs: &[std::net::SocketAddr]) {
        for addr in addrs {
            UdpSocket::bind(addr).unwrap_or_else(|e| panic!("{addr} still open: {e}"));
        }
    }

    fn send_sockets(a: &UnixStream, count: usize) -> Vec<std::net::SocketAddr> {
        let sockets: Vec<UdpSocket> = (0..count).map(|_| udp()).collect();
        let addrs = sockets
            .iter()
            .map(|s| s.local_addr().expect("addr"))
            .collect();
        let borrowed: Vec<_> = sockets.iter().map(AsFd::as_fd).collect();
        send_with_fds(a, b"fds", &borrowed).expect("send");
        addrs // our copies close here
    }

    #[test]
    fn more_fds_than_expected_are_refused_and_closed() {
        let (a, b) = pair().expect("pair");
        let mut buf = [0u8; 16];
        // 2 fds fit the space rounded up for 1: they arrive, are counted
        // and closed.
        let addrs = send_sockets(&a, 2);
        let e = recv_with_fds(&b, &mut buf, 1).expect_err("too many");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("carried 2 fds"), "{e}");
        assert_all_closed(&addrs);
        // 5 fds into room for 2: MSG_CTRUNC; the kernel drops the rest.
        let addrs = send_sockets(&a, 5);
        let e = recv_with_fds(&b, &mut buf, 2).expect_err("ctrunc");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("truncated"), "{e}");
        assert_all_closed(&addrs);
        // No room at all.
        let addrs = send_sockets(&a, 1);
        let e = recv_with_fds(&b, &mut buf, 0).expect_err("ctrunc");
        assert!(e.to_string().contains("truncated"), "{e}");
        assert_all_closed(&addrs);
        // The connection is still in step afterwards.
        send_with_fds(&a, b"ok", &[]).expect("send");
        assert_eq!(recv_with_fds(&b, &mut buf, 0).expect("recv").0, 2);
    }

    #[test]
    fn oversized_record_is_an_error_and_its_fds_are_closed() {
        let (a, b) = pair().expect("pair");
        let s = udp();
        let addr = s.local_addr().expect("addr");
        send_with_fds(&a, &[7u8; 100], &[s.as_fd()]).expect("send");
        drop(s);
        let mut buf = [0u8; 10];
        let e = recv_with_fds(&b, &mut buf, 1).expect_err("truncated");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("longer than 10 bytes"), "{e}");
        assert_all_closed(&[addr]);
    }

    #[test]
    fn send_limits() {
        let (a, _b) = pair().expect("pair");
        let s = udp();
        let many = vec![s.as_fd(); MAX_FDS_PER_MESSAGE + 1];
        let e = send_with_fds(&a, b"x", &many).expect_err("too many");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = send_with_fds(&a, b"", &[]).expect_err("empty");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // Exactly the limit goes through.
        let (c, d) = pair().expect("pair");
        send_with_fds(&c, b"x", &many[..MAX_FDS_PER_MESSAGE]).expect("253 fds");
        let mut buf = [0u8; 4];
        let (_, fds) = recv_with_fds(&d, &mut buf, MAX_FDS_PER_MESSAGE).expect("recv");
        assert_eq!(fds.len(), MAX_FDS_PER_MESSAGE);
    }

    #[test]
    fn closed_peer_is_epipe_not_sigpipe() {
        let (a, b) = pair().expect("pair");
        drop(b);
        let e = send_with_fds(&a, b"x", &[]).expect_err("closed");
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
    }

    #[test]
    fn receive_timeout_is_an_error() {
        let (_a, b) = pair().expect("pair");
        b.set_read_timeout(Some(Duration::from_millis(20)))
            .expect("timeout");
        let mut buf = [0u8; 4];
        let e = recv_with_fds(&b, &mut buf, 0).expect_err("timeout");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{e}"
        );
    }
}
