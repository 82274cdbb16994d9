//! Waking a worker for its commands: an eventfd the control plane writes
//! after queueing a [`super::Command`], polled (multishot) on the worker's
//! own io_uring, so the `io_uring_enter` the worker sleeps in returns at
//! once and the command is applied in that same loop turn — not at the
//! next 100 ms tick, which delayed a flow added to an idle daemon by up to
//! 100 ms (its first datagrams then arrived in a burst) and made every
//! paused flow's resume wait for a tick.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use io_uring::opcode;
use io_uring::types::Fd;
use nix::sys::eventfd::{EfdFlags, EventFd};

/// The writing end, shared by the control plane's handle (cheap to clone).
#[derive(Debug, Clone)]
pub(super) struct Waker {
    fd: Arc<EventFd>,
}

impl Waker {
    /// A fresh non-blocking eventfd.
    pub(super) fn new() -> io::Result<Self> {
        let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Self { fd: Arc::new(fd) })
    }

    /// Wake the worker (it takes every queued command in its next turn).
    /// Best effort: the only failure is a counter at its maximum, which
    /// means a wake-up is pending anyway; the worker's tick is the backstop.
    pub(super) fn wake(&self) {
        let _ = self.fd.write(1);
    }

    /// Reset the counter after a wake-up was seen (the poll stays armed).
    pub(super) fn drain(&self) {
        // Non-blocking, so an empty counter returns EAGAIN at once.
        let _ = self.fd.read();
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
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let mut p = [PollFd::new(w.fd.as_fd(), PollFlags::POLLIN)];
        poll(&mut p, PollTimeout::ZERO) == Ok(1)
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
