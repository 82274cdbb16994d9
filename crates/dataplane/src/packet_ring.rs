//! The receive ring of an `ingress = "packet"` flow: a `PACKET_RX_RING` of
//! `TPACKET_V3` blocks mapped into the worker. The kernel copies each frame
//! into the current block in softirq and hands a block over when it is full
//! or its retire timer fires; the worker is woken (a multishot poll on its
//! io_uring) once per block instead of once per frame, walks the block's
//! frames ([`mcrelay_wire::tpacket::frames`]) and hands it back. Measured
//! against multishot `recvmsg` in `experiments/packet-rx` (docs/benchmarks.md):
//! about a third of the CPU per frame, and lossless at rates where recvmsg
//! lost 45%.
//!
//! Ownership protocol (what the `unsafe` below relies on): a block whose
//! status word (read with acquire ordering) has `TP_STATUS_USER` is not
//! written by the kernel until the worker stores `TP_STATUS_KERNEL`
//! (release) into it; every slice of a block is dropped before that store.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use mcrelay_wire::tpacket::BLOCK_STATUS;

use crate::sockets::setsockopt;

/// Bytes per block: room for ~90 full-size 1316-byte frames, and for any
/// jumbo frame.
pub const BLOCK_BYTES: u32 = 128 << 10;
/// Blocks per ring: 4 MiB, the default socket receive buffer.
pub const BLOCKS: u32 = 32;
/// A block that isn't full is handed over after this long (ms): the most a
/// frame waits at low rates.
pub const RETIRE_MS: u32 = 1;

const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;

/// The mapped ring of one packet socket; unmapped on drop (before the
/// socket closes: the flow declares it first).
#[derive(Debug)]
pub struct PacketRing {
    base: NonNull<u8>,
    len: usize,
    block_bytes: usize,
    blocks: usize,
    /// The block the kernel fills next, in order.
    next: usize,
    /// Frames of block `next` already handled (a walk may stop mid-block
    /// and resume there).
    pub done: usize,
}

impl PacketRing {
    /// Switch the packet socket `fd` (no ring yet) to `TPACKET_V3` with a
    /// ring of [`BLOCKS`] × [`BLOCK_BYTES`] and map it. No privilege is
    /// needed: the socket is already open.
    pub fn new(fd: RawFd) -> io::Result<Self> {
        // SAFETY: `fd` is the flow's ingress socket, which the caller keeps
        // open for this call (and the ring's lifetime).
        let socket = unsafe { BorrowedFd::borrow_raw(fd) };
        let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        setsockopt(&socket, libc::SOL_PACKET, libc::PACKET_VERSION, &version)?;
        // V3 frames are variable-length; the frame size only has to divide
        // the block.
        let frame_size = 2048u32;
        let req = libc::tpacket_req3 {
            tp_block_size: BLOCK_BYTES,
            tp_block_nr: BLOCKS,
            tp_frame_size: frame_size,
            tp_frame_nr: BLOCK_BYTES / frame_size * BLOCKS,
            tp_retire_blk_tov: RETIRE_MS,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        setsockopt(&socket, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
        let block_bytes = BLOCK_BYTES as usize;
        let blocks = BLOCKS as usize;
        let len = block_bytes * blocks;
        // SAFETY: maps the socket's ring, exactly the `len` bytes the kernel
        // just allocated, at an address the kernel picks; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self {
            base,
            len,
            block_bytes,
            blocks,
            next: 0,
            done: 0,
        })
    }

    /// How many blocks the ring has.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// The status word of block `i` (`i < blocks`).
    fn status(&self, i: usize) -> &AtomicU32 {
        debug_assert!(i < self.blocks);
        // SAFETY: `i < blocks`, so the block starts inside the mapping and
        // `BLOCK_STATUS` (8) is inside its header. The mapping is
        // page-aligned and blocks are page multiples, so the field is
        // aligned for a u32.
        let p = unsafe { self.base.as_ptr().add(i * self.block_bytes + BLOCK_STATUS) };
        // SAFETY: `p` is valid and aligned for a u32 while the mapping (tied
        // to `self`) lives; the kernel accesses it with its own barriers and
        // the worker only atomically.
        unsafe { AtomicU32::from_ptr(p.cast::<u32>()) }
    }

    /// The next block, if the kernel has handed it over.
    pub fn next_block(&self) -> Option<&[u8]> {
        let status = self.status(self.next).load(Ordering::Acquire);
        if status & TP_STATUS_USER == 0 {
            return None;
        }
        // SAFETY: block `next` (< blocks) lies inside the mapping.
        let start = unsafe { self.base.as_ptr().add(self.next * self.block_bytes) };
        // SAFETY: its `block_bytes` bytes are inside the mapping, which lives
        // as long as `self`; the acquire load saw `TP_STATUS_USER`, so the
        // kernel has finished the block and won't write it until
        // `release_block` — which takes `&mut self`, so this borrow has ended.
        Some(unsafe { std::slice::from_raw_parts(start, self.block_bytes) })
    }

    /// Hand the block [`PacketRing::next_block`] returned back to the
    /// kernel and move on.
    pub fn release_block(&mut self) {
        self.status(self.next)
            .store(TP_STATUS_KERNEL, Ordering::Release);
        self.next = (self.next + 1) % self.blocks;
    }
}

impl Drop for PacketRing {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are what `mmap` returned; no slice into the
        // mapping outlives a borrow of `self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_layout_matches_the_kernel_headers() {
        use mcrelay_wire::tpacket as t;
        use std::mem::offset_of;
        let hdr = offset_of!(libc::tpacket_block_desc, hdr);
        assert_eq!(
            t::BLOCK_STATUS,
            hdr + offset_of!(libc::tpacket_hdr_v1, block_status)
        );
        assert_eq!(
            t::NUM_PKTS,
            hdr + offset_of!(libc::tpacket_hdr_v1, num_pkts)
        );
        assert_eq!(
            t::FIRST_PKT,
            hdr + offset_of!(libc::tpacket_hdr_v1, offset_to_first_pkt)
        );
        assert_eq!(
            t::NEXT_OFFSET,
            offset_of!(libc::tpacket3_hdr, tp_next_offset)
        );
        assert_eq!(t::SNAPLEN, offset_of!(libc::tpacket3_hdr, tp_snaplen));
        assert_eq!(t::STATUS, offset_of!(libc::tpacket3_hdr, tp_status));
        assert_eq!(t::MAC, offset_of!(libc::tpacket3_hdr, tp_mac));
        assert_eq!(libc::TP_STATUS_USER, TP_STATUS_USER);
    }
}
