//! The few libc calls the measurement needs that are not about either
//! receive method: socket options on the packet socket, the thread's CPU
//! time, and `poll`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

/// `setsockopt(fd, level, name, value)` for a plain-data `value`.
pub fn setsockopt<T: Copy>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of::<T>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `value` points at `len` initialised bytes of a `Copy` (plain
    // data) value that outlives the call; the kernel only reads them.
    let rc =
        unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, (&raw const *value).cast(), len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What `PACKET_STATISTICS` reports (and resets): frames the socket saw
/// (including the dropped ones), frames it dropped (receive queue or ring
/// full), and for TPACKET_V3 how often the ring froze for lack of a free
/// block.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct PacketStats {
    pub packets: u64,
    pub drops: u64,
    pub freeze_q_cnt: u64,
}

/// Read (and reset) the socket's `PACKET_STATISTICS`.
pub fn packet_stats(fd: BorrowedFd<'_>) -> io::Result<PacketStats> {
    let mut stats = libc::tpacket_stats_v3 {
        tp_packets: 0,
        tp_drops: 0,
        tp_freeze_q_cnt: 0,
    };
    let mut len = libc::socklen_t::try_from(size_of::<libc::tpacket_stats_v3>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `stats` is a writable `tpacket_stats_v3` of `len` bytes; the
    // kernel writes at most `len` bytes (a `tpacket_stats` prefix when the
    // socket has no V3 ring) and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&raw mut stats).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PacketStats {
        packets: u64::from(stats.tp_packets),
        drops: u64::from(stats.tp_drops),
        freeze_q_cnt: u64::from(stats.tp_freeze_q_cnt),
    })
}

/// User and system CPU time of the calling thread, in nanoseconds.
pub fn thread_cpu_ns() -> io::Result<(u64, u64)> {
    // SAFETY: `rusage` is plain data for which all-zero is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable `rusage` for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut usage) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let ns = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_usec).unwrap_or(0) * 1_000
    };
    Ok((ns(usage.ru_utime), ns(usage.ru_stime)))
}

/// Wait until `fd` is readable (or in error), at most `timeout`. Returns
/// whether it became ready.
pub fn poll_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN | libc::POLLERR,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfd` is one valid `pollfd` that outlives the call.
    let rc = unsafe { libc::poll(&raw mut pfd, 1, ms) };
    match rc {
        0 => Ok(false),
        n if n > 0 => Ok(true),
        _ => {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}
