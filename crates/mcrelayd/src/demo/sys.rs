//! The demo's three calls into libc that have no safe wrapper here:
//! entering a network namespace, the clock tick of `/proc` CPU times, and
//! sending SIGTERM to the daemon it started.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Move the calling thread into the network namespace `name` (of `ip
/// netns`). Sockets it opens afterwards belong to that namespace for good;
/// other threads are not affected.
pub fn enter_netns(name: &str) -> io::Result<()> {
    let path = format!("/run/netns/{name}");
    let ns = File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    // SAFETY: `ns` is an open descriptor of a network namespace file that
    // outlives the call; setns(CLONE_NEWNET) changes only the calling
    // thread's network namespace and touches no memory of ours.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("setns {path}: {e}")))
    }
}

/// Clock ticks per second, the unit of `/proc/PID/stat` CPU times.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf takes a constant and only reads a system value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
}

/// SIGTERM to `pid`, a child this process started and has not yet reaped
/// (so the PID cannot have been reused).
pub fn terminate(pid: u32) -> io::Result<()> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: kill takes plain integers; the caller guarantees `pid` is its
    // own unreaped child.
    if unsafe { libc::kill(pid, libc::SIGTERM) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_sane() {
        assert!((1..=10_000).contains(&clock_ticks_per_second()));
    }

    #[test]
    fn entering_a_missing_namespace_fails_cleanly() {
        let e = enter_netns("mcrelay-demo-no-such-namespace").unwrap_err();
        assert!(e.to_string().contains("/run/netns/"), "{e}");
    }
}
