//! The receive ring of an `ingress = "packet"` flow, mapped into the
//! worker, in one of two layouts ([`layout_for`] picks by the input
//! interface's MTU):
//!
//! * [`Layout::Frames`] (`TPACKET_V2`, inputs with an MTU up to
//!   [`FRAMES_MAX_MTU`]): fixed [`FRAME_BYTES`] slots, each with its own
//!   status word, handed over as soon as the kernel has copied the frame,
//!   with a wake-up per frame. The worker polls the ring (one-shot) only
//!   after it found it empty, so it is woken per frame when the flow is
//!   nearly idle and once per loop turn (up to 64 frames) when busy: no
//!   frame waits for a timer.
//! * [`Layout::Blocks`] (`TPACKET_V3`, larger MTUs: jumbo frames don't fit
//!   a 2 KiB slot): the kernel copies frames into the current block and
//!   hands a block over when it is full or its retire timer fires (1 ms,
//!   the shortest it takes); the worker is woken (a multishot poll) once per
//!   block and walks its frames ([`mcrelay_wire::tpacket::frames`]). At low
//!   rates a frame waits for the timer: 0.5 ms on average (issue 19,
//!   docs/benchmarks.md).
//!
//! Either way the worker reads frames in place, without a system call per
//! frame: measured against multishot `recvmsg` in `experiments/packet-rx`
//! (docs/benchmarks.md), the V3 ring took about a third of the CPU per
//! frame and stayed lossless at rates where recvmsg lost 45%.
//!
//! Ownership protocol (what the `unsafe` below relies on): a block (V3) or
//! frame slot (V2) whose status word (read with acquire ordering) has
//! `TP_STATUS_USER` is not written by the kernel until the worker stores
//! `TP_STATUS_KERNEL` (release) into it; every slice of it is dropped
//! before that store.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use mcrelay_wire::tpacket::BLOCK_STATUS;

use mcrelay_sys::sockopt::set as setsockopt;

/// Bytes per block: room for ~90 full-size 1316-byte frames, and for any
/// jumbo frame.
pub const BLOCK_BYTES: u32 = 128 << 10;
/// Blocks per ring: 4 MiB, the default socket receive buffer.
pub const BLOCKS: u32 = 32;
/// A block that isn't full is handed over after this long (ms): the most a
/// frame waits at low rates.
pub const RETIRE_MS: u32 = 1;

/// Bytes per frame slot of a [`Layout::Frames`] ring.
pub const FRAME_BYTES: u32 = 2048;
/// Where the kernel puts a V2 frame's network header: `TPACKET2_HDRLEN`
/// (52) plus 16, aligned to 16. The link-layer header sits just before it.
const V2_NET_OFFSET: u32 = 80;
/// The largest input MTU whose packets fit a [`FRAME_BYTES`] slot whole.
pub const FRAMES_MAX_MTU: u32 = FRAME_BYTES - V2_NET_OFFSET;

const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;

/// How a packet ring is laid out, and so when the worker is woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `TPACKET_V3` blocks: a wake-up per block (full, or after 1 ms).
    Blocks,
    /// `TPACKET_V2` frame slots: a wake-up per frame when idle.
    Frames,
}

/// How the worker learns of a [`Layout::Frames`] ring's new frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A one-shot poll: the kernel wakes the worker for the next frame. No
    /// frame waits, but a wake-up costs several µs of CPU: right for a
    /// light flow.
    Frame,
    /// No poll: the worker walks the ring after waiting at most
    /// [`WAKE_INTERVAL`], a batch per wake-up as with a V3 block but
    /// never more than this late.
    Interval,
}

/// How long a busy flow's frames may wait in [`Wake::Interval`] mode.
pub const WAKE_INTERVAL: Duration = Duration::from_micros(250);
/// Rates are measured over windows at least this long.
const RATE_WINDOW: Duration = Duration::from_millis(4);
/// [`Wake::Frame`] → [`Wake::Interval`] at this many frames per second and
/// above (5 frames per interval)...
pub const INTERVAL_FROM_PPS: u64 = 20_000;
/// ... and back below this (hysteresis: 2.5 per interval).
pub const FRAME_BELOW_PPS: u64 = 10_000;

/// The rule that picks a frame-slot ring's [`Wake`] from the rate its
/// frames arrive at: a wake-up per frame while the flow is light, so no
/// frame waits for a timer (issue 19); batches every [`WAKE_INTERVAL`] once
/// per-frame wake-ups would cost more CPU than the ring saves. Pure: the
/// caller passes the clock reading.
#[derive(Debug, Clone)]
pub struct WakePolicy {
    wake: Wake,
    window_start: Option<Instant>,
    frames: u64,
}

impl Default for WakePolicy {
    fn default() -> Self {
        Self {
            wake: Wake::Frame,
            window_start: None,
            frames: 0,
        }
    }
}

impl WakePolicy {
    /// The current mode.
    pub fn wake(&self) -> Wake {
        self.wake
    }

    /// A walk of the ring at `now` found `frames`; the mode from now on.
    pub fn walked(&mut self, frames: u64, now: Instant) -> Wake {
        let start = *self.window_start.get_or_insert(now);
        self.frames += frames;
        let elapsed = now.saturating_duration_since(start);
        if elapsed >= RATE_WINDOW {
            let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
            let pps = self.frames.saturating_mul(1_000_000_000) / nanos.max(1);
            self.wake = match self.wake {
                Wake::Frame if pps >= INTERVAL_FROM_PPS => Wake::Interval,
                Wake::Interval if pps < FRAME_BELOW_PPS => Wake::Frame,
                w => w,
            };
            self.window_start = Some(now);
            self.frames = 0;
        }
        self.wake
    }
}

/// The layout for an input interface of MTU `mtu` (`None`: unknown):
/// frame slots wherever the largest packet fits one, so no frame waits
/// for a block timeout; blocks otherwise (jumbo frames), and when the MTU
/// can't be read.
pub fn layout_for(mtu: Option<u32>) -> Layout {
    match mtu {
        Some(m) if m <= FRAMES_MAX_MTU => Layout::Frames,
        _ => Layout::Blocks,
    }
}

/// The mapped ring of one packet socket; unmapped on drop (before the
/// socket closes: the flow declares it first).
#[derive(Debug)]
pub struct PacketRing {
    base: NonNull<u8>,
    len: usize,
    layout: Layout,
    block_bytes: usize,
    blocks: usize,
    /// Frame slots per block ([`Layout::Frames`]; 0 for blocks).
    frames_per_block: usize,
    /// The block (or frame slot) the kernel fills next, in order.
    next: usize,
    /// Frames of block `next` already handled (a walk may stop mid-block
    /// and resume there).
    pub done: usize,
    /// [`Layout::Frames`]: how the worker is woken for new frames.
    pub wake: WakePolicy,
}

impl PacketRing {
    /// Give the packet socket `fd` (no ring yet) a ring of [`BLOCKS`] ×
    /// [`BLOCK_BYTES`], laid out as [`layout_for`] its interface's MTU
    /// says, and map it. No privilege is needed: the socket is already open.
    pub fn new(fd: RawFd) -> io::Result<Self> {
        // SAFETY: `fd` is the flow's ingress socket, which the caller keeps
        // open for this call (and the ring's lifetime).
        let socket = unsafe { BorrowedFd::borrow_raw(fd) };
        let layout = layout_for(interface_mtu(fd).ok());
        let frames_per_block = match layout {
            Layout::Blocks => {
                let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
                setsockopt(&socket, libc::SOL_PACKET, libc::PACKET_VERSION, &version)?;
                // V3 frames are variable-length; the frame size only has to
                // divide the block.
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
                0
            }
            Layout::Frames => {
                let version = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
                setsockopt(&socket, libc::SOL_PACKET, libc::PACKET_VERSION, &version)?;
                let req = libc::tpacket_req {
                    tp_block_size: BLOCK_BYTES,
                    tp_block_nr: BLOCKS,
                    tp_frame_size: FRAME_BYTES,
                    tp_frame_nr: BLOCK_BYTES / FRAME_BYTES * BLOCKS,
                };
                setsockopt(&socket, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
                (BLOCK_BYTES / FRAME_BYTES) as usize
            }
        };
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
            layout,
            block_bytes,
            blocks,
            frames_per_block,
            next: 0,
            done: 0,
            wake: WakePolicy::default(),
        })
    }

    /// How many blocks the ring has.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// How the ring is laid out.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Frame slots in a [`Layout::Frames`] ring (0 for blocks).
    fn frame_slots(&self) -> usize {
        self.frames_per_block * self.blocks
    }

    /// Where frame slot `i` (`i < frame_slots`) starts: slots don't span
    /// blocks.
    fn frame_offset(&self, i: usize) -> usize {
        (i / self.frames_per_block) * self.block_bytes
            + (i % self.frames_per_block) * FRAME_BYTES as usize
    }

    /// The status word at byte `offset` of the mapping: a block's (V3) or
    /// a frame slot's (V2).
    fn status_at(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= self.len && offset % 4 == 0);
        // SAFETY: callers pass the offset of a block's `BLOCK_STATUS` (8)
        // or of a frame slot's `tp_status` (0), both inside the mapping; the
        // mapping is page-aligned and blocks and slots are multiples of 16
        // bytes, so the field is aligned for a u32.
        let p = unsafe { self.base.as_ptr().add(offset) };
        // SAFETY: `p` is valid and aligned for a u32 while the mapping (tied
        // to `self`) lives; the kernel accesses it with its own barriers and
        // the worker only atomically.
        unsafe { AtomicU32::from_ptr(p.cast::<u32>()) }
    }

    /// The status word of block `i` (`i < blocks`).
    fn status(&self, i: usize) -> &AtomicU32 {
        debug_assert!(i < self.blocks);
        self.status_at(i * self.block_bytes + BLOCK_STATUS)
    }

    /// [`Layout::Frames`]: the next frame slot, if the kernel has handed it
    /// over (read it with [`mcrelay_wire::tpacket::frame_v2`]).
    pub fn next_frame(&self) -> Option<&[u8]> {
        if self.layout != Layout::Frames {
            return None;
        }
        let offset = self.frame_offset(self.next);
        if self.status_at(offset).load(Ordering::Acquire) & TP_STATUS_USER == 0 {
            return None;
        }
        // SAFETY: slot `next` (< frame_slots) starts inside the mapping.
        let start = unsafe { self.base.as_ptr().add(offset) };
        // SAFETY: the slot's FRAME_BYTES lie inside the mapping, which lives
        // as long as `self`; the acquire load saw `TP_STATUS_USER`, so the
        // kernel has finished the frame and won't write the slot until
        // `release_frame` — which takes `&mut self`, so this borrow has
        // ended.
        Some(unsafe { std::slice::from_raw_parts(start, FRAME_BYTES as usize) })
    }

    /// Hand the frame slot [`PacketRing::next_frame`] returned back to the
    /// kernel and move on.
    pub fn release_frame(&mut self) {
        if self.layout != Layout::Frames {
            return;
        }
        self.status_at(self.frame_offset(self.next))
            .store(TP_STATUS_KERNEL, Ordering::Release);
        self.next = (self.next + 1) % self.frame_slots();
    }

    /// [`Layout::Blocks`]: the next block, if the kernel has handed it over.
    pub fn next_block(&self) -> Option<&[u8]> {
        if self.layout != Layout::Blocks {
            return None;
        }
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
        if self.layout != Layout::Blocks {
            return;
        }
        self.status(self.next)
            .store(TP_STATUS_KERNEL, Ordering::Release);
        self.next = (self.next + 1) % self.blocks;
    }
}

/// The MTU of the interface the packet socket `fd` is bound to
/// (`getsockname`, then `SIOCGIFNAME` and `SIOCGIFMTU` on the socket).
fn interface_mtu(fd: RawFd) -> io::Result<u32> {
    // SAFETY: an all-zero sockaddr_ll and ifreq are valid values (plain
    // integers and arrays).
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `sll` is a writable sockaddr_ll of `len` bytes; the kernel
    // writes at most `len` bytes and updates `len`.
    let rc =
        unsafe { libc::getsockname(fd, (&raw mut sll).cast::<libc::sockaddr>(), &raw mut len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if sll.sll_ifindex == 0 {
        return Err(io::Error::other("packet socket not bound to an interface"));
    }
    // SAFETY: as above.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    ifr.ifr_ifru.ifru_ifindex = sll.sll_ifindex;
    // SAFETY: SIOCGIFNAME reads `ifru_ifindex` and writes `ifr_name` of the
    // ifreq it is given, which is ours and writable.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFNAME, &raw mut ifr) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFMTU reads `ifr_name` (just filled, NUL-terminated) and
    // writes `ifru_mtu` of our ifreq.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &raw mut ifr) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFMTU filled the union's `ifru_mtu` member.
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).map_err(|_| io::Error::other("negative MTU"))
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

    /// Feed `pps` for `ms` milliseconds, walked every 100 µs.
    fn feed(p: &mut WakePolicy, t: &mut Instant, pps: u64, ms: u64) -> Wake {
        let step = Duration::from_micros(100);
        let mut owed = 0u64;
        for _ in 0..ms * 10 {
            *t += step;
            owed += pps;
            let n = owed / 10_000;
            owed %= 10_000;
            p.walked(n, *t);
        }
        p.wake()
    }

    #[test]
    fn light_flows_are_woken_per_frame_busy_ones_per_interval() {
        let mut p = WakePolicy::default();
        let mut t = Instant::now();
        assert_eq!(p.wake(), Wake::Frame, "a new flow starts per frame");
        assert_eq!(feed(&mut p, &mut t, 1_000, 50), Wake::Frame);
        assert_eq!(feed(&mut p, &mut t, 15_000, 50), Wake::Frame);
        assert_eq!(feed(&mut p, &mut t, INTERVAL_FROM_PPS, 50), Wake::Interval);
        assert_eq!(feed(&mut p, &mut t, 200_000, 50), Wake::Interval);
        // Hysteresis: between the thresholds it stays where it is.
        assert_eq!(feed(&mut p, &mut t, 15_000, 50), Wake::Interval);
        assert_eq!(feed(&mut p, &mut t, 9_000, 50), Wake::Frame);
        assert_eq!(feed(&mut p, &mut t, 15_000, 50), Wake::Frame);
    }

    #[test]
    fn an_idle_gap_counts_as_a_low_rate() {
        let mut p = WakePolicy::default();
        let mut t = Instant::now();
        assert_eq!(feed(&mut p, &mut t, 100_000, 20), Wake::Interval);
        // Silence (walks find nothing), then one frame a second later.
        assert_eq!(feed(&mut p, &mut t, 0, 10), Wake::Frame);
        let mut q = WakePolicy::default();
        let start = Instant::now();
        q.walked(1, start);
        assert_eq!(q.walked(1, start + Duration::from_secs(1)), Wake::Frame);
        // A burst shorter than a window doesn't switch on its own.
        let mut r = WakePolicy::default();
        assert_eq!(r.walked(64, start), Wake::Frame);
        assert_eq!(
            r.walked(64, start + Duration::from_micros(500)),
            Wake::Frame
        );
    }

    #[test]
    fn frame_slots_wherever_the_largest_packet_fits_one() {
        assert_eq!(layout_for(Some(1500)), Layout::Frames);
        assert_eq!(layout_for(Some(FRAMES_MAX_MTU)), Layout::Frames);
        assert_eq!(layout_for(Some(FRAMES_MAX_MTU + 1)), Layout::Blocks);
        assert_eq!(layout_for(Some(9000)), Layout::Blocks);
        assert_eq!(layout_for(None), Layout::Blocks);
        // The kernel's V2 header and link-layer room, as libc has them:
        // the network header lands at V2_NET_OFFSET.
        let hdr = u32::try_from(libc::TPACKET2_HDRLEN).expect("small");
        assert_eq!((hdr + 16).next_multiple_of(16), V2_NET_OFFSET);
    }

    #[test]
    fn v2_header_offsets_match_the_kernel_headers() {
        use mcrelay_wire::tpacket as t;
        use std::mem::offset_of;
        assert_eq!(t::V2_STATUS, offset_of!(libc::tpacket2_hdr, tp_status));
        assert_eq!(t::V2_LEN, offset_of!(libc::tpacket2_hdr, tp_len));
        assert_eq!(t::V2_SNAPLEN, offset_of!(libc::tpacket2_hdr, tp_snaplen));
        assert_eq!(t::V2_MAC, offset_of!(libc::tpacket2_hdr, tp_mac));
        assert_eq!(BLOCK_BYTES % FRAME_BYTES, 0);
    }

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
