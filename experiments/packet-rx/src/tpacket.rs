//! Method `tpacket-v3`: a `PACKET_RX_RING` of `TPACKET_V3` blocks mapped
//! into the process. The kernel copies each frame into the current block
//! (in softirq, as it arrives) behind a `tpacket3_hdr`; a block is handed
//! to us (`block_status` gains `TP_STATUS_USER`) when it is full or its
//! retire timer (`tp_retire_blk_tov`) fires. We walk its frames, then hand
//! it back by writing `TP_STATUS_KERNEL`. When the next block is not ours
//! yet, we `poll` the socket.
//!
//! Ownership protocol (what the `unsafe` below relies on): a block whose
//! status (read with acquire ordering) has `TP_STATUS_USER` is not written
//! by the kernel until we store `TP_STATUS_KERNEL` (release) into it; only
//! then is it the kernel's again. Everything inside a block — offsets,
//! lengths, counts — is read through bounds-checked slices of that block,
//! so a bad value can't make us read outside it.
#![allow(unsafe_code)]

use std::io;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use libc::{tpacket_block_desc, tpacket_hdr_v1, tpacket_req3, tpacket3_hdr};
use mcrelay_wire::{FlowMatch, Reject};

use crate::Counts;
use crate::os::{poll_readable, setsockopt};

/// Where the fields we read sit (linux/if_packet.h layouts, from libc).
const BLOCK_HDR: usize = offset_of!(tpacket_block_desc, hdr);
const BLOCK_STATUS: usize = BLOCK_HDR + offset_of!(tpacket_hdr_v1, block_status);
const NUM_PKTS: usize = BLOCK_HDR + offset_of!(tpacket_hdr_v1, num_pkts);
const FIRST_PKT: usize = BLOCK_HDR + offset_of!(tpacket_hdr_v1, offset_to_first_pkt);
const NEXT_OFFSET: usize = offset_of!(tpacket3_hdr, tp_next_offset);
const SNAPLEN: usize = offset_of!(tpacket3_hdr, tp_snaplen);
const STATUS: usize = offset_of!(tpacket3_hdr, tp_status);
const MAC: usize = offset_of!(tpacket3_hdr, tp_mac);

/// Ring geometry.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Geometry {
    /// Bytes per block (a multiple of the page size).
    pub block_bytes: u32,
    /// Blocks in the ring.
    pub blocks: u32,
    /// Milliseconds after which the kernel retires a block that is not full.
    pub retire_ms: u32,
}

/// The kernel-shared mapping, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what `mmap` returned and mapped;
        // no slice into the mapping outlives a `turn` call, so nothing
        // refers to it any more.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[derive(Debug)]
pub struct TpacketReceiver {
    map: Mapping,
    geometry: Geometry,
    block_bytes: usize,
    fd: RawFd,
    next: usize,
    /// Blocks walked and handed back.
    pub blocks: u64,
    /// Blocks handed over by the retire timer rather than because full.
    pub timed_out_blocks: u64,
    /// Times the loop waited in `poll`.
    pub waits: u64,
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let b = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_ne_bytes([b[0], b[1]]))
}

impl TpacketReceiver {
    /// Switch `socket` (an AF_PACKET socket, no ring yet) to TPACKET_V3 and
    /// map a ring of `geometry`. The socket must outlive the receiver.
    pub fn new(socket: BorrowedFd<'_>, geometry: Geometry) -> io::Result<Self> {
        let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        setsockopt(socket, libc::SOL_PACKET, libc::PACKET_VERSION, &version)?;
        // V3 frames are variable-length inside a block; the frame size only
        // has to divide the block and be TPACKET_ALIGNMENT-aligned.
        let frame_size = 2048u32;
        if geometry.block_bytes % 4096 != 0 || geometry.block_bytes < frame_size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--block-bytes must be a multiple of 4096",
            ));
        }
        let req = tpacket_req3 {
            tp_block_size: geometry.block_bytes,
            tp_block_nr: geometry.blocks,
            tp_frame_size: frame_size,
            tp_frame_nr: geometry.block_bytes / frame_size * geometry.blocks,
            tp_retire_blk_tov: geometry.retire_ms,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        setsockopt(socket, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
        let block_bytes = usize::try_from(geometry.block_bytes)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let len = block_bytes
            * usize::try_from(geometry.blocks)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: maps the socket's ring, `len` bytes (exactly what the
        // kernel just allocated), at an address the kernel picks; the
        // result is checked before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                socket.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self {
            map: Mapping { base, len },
            geometry,
            block_bytes,
            fd: socket.as_raw_fd(),
            next: 0,
            blocks: 0,
            timed_out_blocks: 0,
            waits: 0,
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The status word of block `i` (`i < blocks`).
    fn status(&self, i: usize) -> &AtomicU32 {
        debug_assert!(i * self.block_bytes < self.map.len);
        // SAFETY: `i < blocks`, so the block starts inside the mapping;
        // `BLOCK_STATUS` is inside its header. The mapping is page-aligned,
        // blocks are page multiples and the field is at a 4-aligned offset
        // (8 + 0), so the pointer is aligned for a u32.
        let p = unsafe {
            self.map
                .base
                .as_ptr()
                .add(i * self.block_bytes + BLOCK_STATUS)
        };
        // SAFETY: `p` is valid and aligned for a u32 for as long as the
        // mapping (borrowed through `self`) lives; the kernel accesses the
        // block status with its own barriers (smp_rmb/smp_wmb around it),
        // and we only ever access it atomically.
        unsafe { AtomicU32::from_ptr(p.cast::<u32>()) }
    }

    /// Block `i`'s status and bytes, if the kernel has handed it to us.
    fn owned(&self, i: usize) -> Option<(u32, &[u8])> {
        if i >= self.geometry.blocks as usize {
            return None;
        }
        let status = self.status(i).load(Ordering::Acquire);
        if status & libc::TP_STATUS_USER == 0 {
            return None;
        }
        // SAFETY: `i < blocks`: the offset stays inside the mapping.
        let start = unsafe { self.map.base.as_ptr().add(i * self.block_bytes) };
        // SAFETY: block `i`'s `block_bytes` bytes from `start` are inside
        // the mapping, which lives as long as `self`. The status just read
        // (acquire) has `TP_STATUS_USER`: the kernel has finished writing
        // the block and writes none of it (status word included) until we
        // store `TP_STATUS_KERNEL`, which `turn` does only after the last
        // use of this slice.
        let block = unsafe { std::slice::from_raw_parts(start, self.block_bytes) };
        Some((status, block))
    }

    /// One loop turn: wait (`poll`, up to `timeout`) if the next block is
    /// not ours yet, then walk and hand back every block that is, in order.
    /// Returns the frames handled.
    pub fn turn(
        &mut self,
        timeout: Duration,
        flow: &FlowMatch,
        counts: &mut Counts,
    ) -> io::Result<u64> {
        let before = counts.seen();
        let blocks = self.geometry.blocks as usize;
        if self.owned(self.next).is_none() {
            self.waits += 1;
            // SAFETY: `fd` is the socket the caller keeps open for the
            // receiver's lifetime.
            let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
            poll_readable(fd, timeout)?;
        }
        for _ in 0..blocks {
            let i = self.next;
            let Some((status, block)) = self.owned(i) else {
                break;
            };
            walk(block, flow, counts);
            self.status(i)
                .store(libc::TP_STATUS_KERNEL, Ordering::Release);
            if status & libc::TP_STATUS_BLK_TMO != 0 {
                self.timed_out_blocks += 1;
            }
            self.blocks += 1;
            self.next = (i + 1) % blocks;
        }
        Ok(counts.seen() - before)
    }
}

/// Walk the frames of a block we own into `counts`.
fn walk(block: &[u8], flow: &FlowMatch, counts: &mut Counts) {
    let (Some(n), Some(first)) = (read_u32(block, NUM_PKTS), read_u32(block, FIRST_PKT)) else {
        return;
    };
    let mut at = first as usize;
    for _ in 0..n {
        let hdr = block.get(at..).unwrap_or(&[]);
        let (Some(next), Some(snaplen), Some(status), Some(mac)) = (
            read_u32(hdr, NEXT_OFFSET),
            read_u32(hdr, SNAPLEN),
            read_u32(hdr, STATUS),
            read_u16(hdr, MAC),
        ) else {
            counts.reject(Reject::Truncated);
            return;
        };
        let start = usize::from(mac);
        match hdr.get(start..start + snaplen as usize) {
            Some(frame) => {
                let verify =
                    status & (libc::TP_STATUS_CSUMNOTREADY | libc::TP_STATUS_CSUM_VALID) == 0;
                counts.frame(frame, flow, verify);
            }
            None => counts.reject(Reject::Truncated),
        }
        if next == 0 {
            break;
        }
        at += next as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcrelay_wire::testframes::ipv4_udp;

    fn flow() -> FlowMatch {
        FlowMatch {
            destination: std::net::Ipv4Addr::new(239, 1, 1, 1).into(),
            port: 5000,
            source: None,
        }
    }

    fn put_u32(block: &mut [u8], at: usize, v: u32) {
        block[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }

    /// A block as the kernel lays it out: header, then frames behind
    /// `tpacket3_hdr`s chained by `tp_next_offset`.
    fn block(frames: &[Vec<u8>], status: u32) -> Vec<u8> {
        let mut b = vec![0u8; 16384];
        let mut at = 48;
        put_u32(&mut b, NUM_PKTS, u32::try_from(frames.len()).unwrap_or(0));
        put_u32(&mut b, FIRST_PKT, 48);
        for (k, f) in frames.iter().enumerate() {
            let mac = 68usize;
            let len = (mac + f.len()).next_multiple_of(16);
            let next = if k + 1 == frames.len() { 0 } else { len };
            put_u32(&mut b, at + NEXT_OFFSET, u32::try_from(next).unwrap_or(0));
            put_u32(&mut b, at + SNAPLEN, u32::try_from(f.len()).unwrap_or(0));
            put_u32(&mut b, at + STATUS, status);
            b[at + MAC..at + MAC + 2]
                .copy_from_slice(&u16::try_from(mac).unwrap_or(0).to_ne_bytes());
            b[at + mac..at + mac + f.len()].copy_from_slice(f);
            at += len;
        }
        b
    }

    #[test]
    fn a_block_s_frames_are_walked_and_parsed() {
        let ours = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, &[7; 100]);
        let other = ipv4_udp("10.0.0.1", "239.1.1.1", 5001, &[7; 10]);
        let b = block(
            &[ours.clone(), other, ours],
            libc::TP_STATUS_USER | libc::TP_STATUS_CSUMNOTREADY,
        );
        let mut counts = Counts::default();
        walk(&b, &flow(), &mut counts);
        assert_eq!(counts.seen(), 3);
        assert_eq!(counts.frames, 2);
        assert_eq!(counts.payload_bytes, 200);
        assert_eq!(counts.software_checksums, 0, "CSUMNOTREADY: not checked");
        let mut checked = Counts::default();
        walk(
            &block(
                &[ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x")],
                libc::TP_STATUS_USER,
            ),
            &flow(),
            &mut checked,
        );
        assert_eq!((checked.frames, checked.software_checksums), (1, 1));
    }

    #[test]
    fn lying_offsets_stay_inside_the_block() {
        let f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, &[1; 64]);
        let mut b = block(&[f.clone(), f], libc::TP_STATUS_USER);
        put_u32(&mut b, NUM_PKTS, u32::MAX);
        put_u32(&mut b, 48 + SNAPLEN, 1 << 20);
        let mut counts = Counts::default();
        walk(&b, &flow(), &mut counts);
        assert_eq!(counts.frames, 1, "the second frame is still reached");
        put_u32(&mut b, FIRST_PKT, 1 << 30);
        walk(&b, &flow(), &mut counts);
        walk(&[], &flow(), &mut counts);
    }
}
