//! Waking a worker for its commands: an eventfd the control plane writes
//! after queueing a [`super::Command`], polled (multishot) on the worker's
//! own io_uring, so the `io_uring_enter` the worker sleeps in returns at
//! once and the command is applied in that same loop turn — not at the
//! next 100 ms tick, which delayed a flow added to an idle daemon by up to
//! 100 ms (its first datagrams then arrived in a burst) and made every
//! paused flow's resume wait for a tick.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use io_uring::opcode;
use io_uring::types::Fd;

/// The writing end, shared by the control plane's handle (cheap to clone).
#[derive(Debug, Clone)]
pub(super) struct Waker {
    fd: Arc<OwnedFd>,
}

impl Waker {
    /// A fresh non-blocking eventfd.
    pub(super) fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes two integers and returns a new fd or -1; it
        // touches no memory of ours.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is the fresh fd returned just above; nothing else
        // owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self { fd: Arc::new(fd) })
    }

    /// Wake the worker (it takes every queued command in its next turn).
    /// Best effort: the only failure is a counter at its maximum, which
    /// means a wake-up is pending anyway; the worker's tick is the backstop.
    pub(super) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, which lives across the call,
        // to our own eventfd.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Reset the counter after a wake-up was seen (the poll stays armed).
    pub(super) fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads at most 8 bytes into `value`, which lives across the
        // call; non-blocking, so an empty counter returns EAGAIN at once.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut value).cast(), 8) };
    }

    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The multishot poll SQE that completes whenever the eventfd becomes
    /// readable (building it is safe; pushing it is the caller's
    /// `submit::push`, and the worker holds a clone of this waker — so the
    /// fd stays open — for as long as its io_uring lives).
    pub(super) fn poll_entry(&self) -> io_uring::squeue::Entry {
        opcode::PollAdd::new(Fd(self.raw_fd()), u32::from(libc::POLLIN.unsigned_abs()))
            .multi(true)
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(w: &Waker) -> bool {
        let mut p = libc::pollfd {
            fd: w.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, living across the call; no wait.
        let n = unsafe { libc::poll(&raw mut p, 1, 0) };
        n == 1
    }

    #[test]
    fn wake_makes_it_readable_and_drain_resets_it() {
        let w = Waker::new().expect("eventfd");
        assert!(!readable(&w));
        w.clone().wake();
        w.wake();
        assert!(readable(&w));
        w.drain();
        assert!(!readable(&w));
        w.drain();
        assert!(!readable(&w), "draining an empty counter is harmless");
    }
}
