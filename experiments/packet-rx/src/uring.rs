//! Method `uring`: the worker's way. One multishot `recvmsg` on the packet
//! socket, the kernel picking a buffer from a provided-buffer ring for each
//! frame; each completion's buffer holds an `io_uring_recvmsg_out` header,
//! the `PACKET_AUXDATA` control message and the frame. The buffer goes back
//! to the ring as soon as the frame is parsed; the ring tail is published
//! once per loop turn. Ring setup and the wait mirror
//! `mcrelay_uring::worker` (single issuer, cooperative task running,
//! `submit_with_args(1, timeout)`).
//!
//! Ownership protocol (what the `unsafe` below relies on): a buffer id is
//! either in the ring (the kernel may write it at any time) or was reported
//! by exactly one completion and not yet recycled (we may read it). Ids
//! come from completions, so each is checked `< entries` before use.
#![allow(unsafe_code)]

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use io_uring::types::{BufRingEntry, Fd, RecvMsgOut, SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue, opcode};
use mcrelay_wire::{FlowMatch, Reject};

use crate::auxdata;
use crate::os::setsockopt;

use crate::Counts;

/// Bytes per receive buffer, as the worker's were when this was measured
/// (its fallback recvmsg path, since removed, needed room for the header).
pub const BUFFER_BYTES: usize = 9344;
const BUFFER_LEN: u32 = 9344;
const GROUP: u16 = 0;
const RECEIVE: u64 = 1;

/// The provided-buffer ring: page-aligned `BufRingEntry` descriptors and
/// the buffer memory they point to.
#[derive(Debug)]
struct Buffers {
    ring: NonNull<BufRingEntry>,
    ring_layout: Layout,
    data: NonNull<u8>,
    data_layout: Layout,
    entries: u16,
    tail: u16,
}

impl Buffers {
    fn new(entries: u16) -> io::Result<Self> {
        if !entries.is_power_of_two() || entries > 32768 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--buffers must be a power of two up to 32768",
            ));
        }
        let n = usize::from(entries);
        let ring_layout = Layout::from_size_align(n * size_of::<BufRingEntry>(), 4096)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let data_layout = Layout::from_size_align(n * BUFFER_BYTES, 4096)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: the layout has a non-zero size (entries >= 1).
        let ring = NonNull::new(unsafe { alloc_zeroed(ring_layout) })
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        // SAFETY: as above.
        let Some(data) = NonNull::new(unsafe { alloc_zeroed(data_layout) }) else {
            // SAFETY: `ring` came from `alloc_zeroed(ring_layout)` just above.
            unsafe { dealloc(ring.as_ptr(), ring_layout) };
            return Err(io::ErrorKind::OutOfMemory.into());
        };
        let mut bufs = Self {
            ring: ring.cast(),
            ring_layout,
            data,
            data_layout,
            entries,
            tail: 0,
        };
        for id in 0..entries {
            bufs.recycle(id);
        }
        bufs.publish();
        Ok(bufs)
    }

    fn start(&self, id: u16) -> *mut u8 {
        debug_assert!(id < self.entries);
        // SAFETY: callers pass `id < entries`: the offset stays inside the
        // `entries * BUFFER_BYTES` bytes of `data`.
        unsafe { self.data.as_ptr().add(usize::from(id) * BUFFER_BYTES) }
    }

    /// The first `len` bytes of buffer `id`, just reported filled.
    fn filled(&self, id: u16, len: usize) -> Option<&[u8]> {
        if id >= self.entries {
            return None;
        }
        // SAFETY: buffer `id` (`id < entries`) has `BUFFER_BYTES >= len`
        // initialised bytes (zeroed, then written by the kernel). A
        // completion reported it filled and it is not back in the ring, so
        // nothing writes it while this borrow of `self` lives (`recycle`
        // needs `&mut self`).
        Some(unsafe { std::slice::from_raw_parts(self.start(id), len.min(BUFFER_BYTES)) })
    }

    /// Put buffer `id` back (seen by the kernel after `publish`).
    fn recycle(&mut self, id: u16) {
        if id >= self.entries {
            return;
        }
        let slot = usize::from(self.tail & (self.entries - 1));
        let addr = self.start(id) as u64;
        // SAFETY: `slot < entries`: the offset stays inside the ring.
        let entry = unsafe { self.ring.as_ptr().add(slot) };
        // SAFETY: `entry` is a valid, aligned slot past the published tail,
        // which the kernel does not read until the next `publish`.
        let entry = unsafe { &mut *entry };
        entry.set_addr(addr);
        entry.set_len(BUFFER_LEN);
        entry.set_bid(id);
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish(&self) {
        // SAFETY: the ring tail lives in the first entry's `resv` field,
        // 2-byte aligned, valid while `self` lives.
        let tail = unsafe { BufRingEntry::tail(self.ring.as_ptr()) }.cast_mut();
        // SAFETY: `tail` is valid and aligned for a u16 while `self` lives
        // and the kernel accesses it only atomically; the release store
        // makes the entries written before it visible first.
        unsafe { AtomicU16::from_ptr(tail) }.store(self.tail, Ordering::Release);
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`; the io_uring that
        // had it registered was dropped first (field order of
        // `UringReceiver`), so the kernel no longer uses it.
        unsafe { dealloc(self.ring.as_ptr().cast(), self.ring_layout) };
        // SAFETY: as above, for the buffer memory.
        unsafe { dealloc(self.data.as_ptr(), self.data_layout) };
    }
}

/// The receiver. Field order matters: `ring` drops (and unregisters the
/// buffer ring, ending the receive) before `bufs` and `header`.
pub struct UringReceiver {
    ring: IoUring,
    bufs: Buffers,
    header: Box<libc::msghdr>,
    fd: RawFd,
    armed: bool,
    /// Times the multishot receive ended (every buffer taken: `ENOBUFS`)
    /// and was re-armed.
    pub rearms: u64,
    /// Times the loop entered the kernel to wait.
    pub waits: u64,
    /// Completions handled.
    pub completions: u64,
    /// Completions to wait for per turn, and how long (µs) to wait for
    /// more than one before settling for one (`min_wait_usec`, 6.12+).
    wait_nr: usize,
    min_wait_us: u32,
}

impl std::fmt::Debug for UringReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringReceiver")
            .field("bufs", &self.bufs)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}

fn zeroed_msghdr() -> libc::msghdr {
    // SAFETY: `msghdr` is plain data for which all-zero is valid.
    unsafe { std::mem::zeroed() }
}

impl UringReceiver {
    /// A ring reading `socket` into `buffers` provided buffers. The socket
    /// must outlive the receiver.
    pub fn new(
        socket: BorrowedFd<'_>,
        buffers: u16,
        wait_nr: usize,
        min_wait_us: u32,
        defer_taskrun: bool,
    ) -> io::Result<Self> {
        // The frame's checksum state arrives as a control message.
        setsockopt(
            socket,
            libc::SOL_PACKET,
            libc::PACKET_AUXDATA,
            &1 as &libc::c_int,
        )?;
        let mut builder = IoUring::builder();
        builder.setup_cqsize(1024).setup_single_issuer();
        if defer_taskrun {
            // Receives run only when we wait, and the wait wakes once
            // `wait_nr` of them are pending, not once per frame.
            builder.setup_defer_taskrun();
        } else {
            builder.setup_coop_taskrun();
        }
        let ring = builder.build(1024)?;
        let bufs = Buffers::new(buffers)?;
        // SAFETY: the ring memory is page-aligned, `entries` long, and lives
        // until `self` drops, after `ring` (field order).
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.ring.as_ptr() as u64,
                bufs.entries,
                GROUP,
                0,
            )?;
        }
        let mut header = Box::new(zeroed_msghdr());
        header.msg_controllen = auxdata::CONTROL_BYTES;
        Ok(Self {
            ring,
            bufs,
            header,
            fd: socket.as_raw_fd(),
            armed: false,
            rearms: 0,
            waits: 0,
            completions: 0,
            wait_nr: wait_nr.max(1),
            min_wait_us,
        })
    }

    fn arm(&mut self) -> io::Result<()> {
        let entry = opcode::RecvMsgMulti::new(Fd(self.fd), &raw const *self.header, GROUP)
            .build()
            .user_data(RECEIVE);
        // SAFETY: the SQE names the boxed `msghdr` (stable address, lives
        // as long as `self`, outliving the ring) and buffer group `GROUP`,
        // registered in `new` and alive as long as the ring; the socket
        // outlives the receiver (caller's contract).
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| io::Error::other("submission queue full"))?;
        self.armed = true;
        Ok(())
    }

    /// One loop turn: arm if needed, wait up to `timeout` for a completion,
    /// handle every completion there is. Returns the frames handled.
    pub fn turn(
        &mut self,
        timeout: Duration,
        flow: &FlowMatch,
        counts: &mut Counts,
    ) -> io::Result<u64> {
        if !self.armed {
            self.arm()?;
        }
        let ts = Timespec::from(timeout);
        let mut args = SubmitArgs::new();
        if self.min_wait_us > 0 {
            args = args.min_wait_usec(self.min_wait_us);
        }
        let args = args.timespec(&ts);
        self.waits += 1;
        match self.ring.submitter().submit_with_args(self.wait_nr, &args) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
                ) => {}
            Err(e) => return Err(e),
        }
        let before = counts.seen();
        for cqe in self.ring.completion() {
            self.completions += 1;
            let flags = cqe.flags();
            if !cqueue::more(flags) {
                self.armed = false;
            }
            let result = cqe.result();
            let id = cqueue::buffer_select(flags);
            if result < 0 {
                if -result == libc::ENOBUFS {
                    self.rearms += 1;
                } else if -result != libc::ECANCELED {
                    return Err(io::Error::from_raw_os_error(-result));
                }
                continue;
            }
            let Some(id) = id else {
                continue;
            };
            if let Some(buffer) = self.bufs.filled(id, result.unsigned_abs() as usize) {
                match RecvMsgOut::parse(buffer, &self.header) {
                    Ok(out) if !out.is_payload_truncated() => {
                        let verify = auxdata::checksum_needs_checking(out.control_data());
                        counts.frame(out.payload_data(), flow, verify);
                    }
                    _ => counts.reject(Reject::Truncated),
                }
            }
            self.bufs.recycle(id);
        }
        self.bufs.publish();
        Ok(counts.seen() - before)
    }
}
