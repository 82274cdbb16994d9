//! AF_XDP and eBPF glue for `ingress = "xdp"`: the `bpf(2)` commands the
//! privileged helper needs (create an `XSKMAP`, load an XDP program, put a
//! socket in the map, attach the program with a `bpf_link`), the AF_XDP
//! socket's setup (UMEM registration from a `memfd`, ring sizes, bind to
//! an interface queue), and the mapped rings and UMEM the worker reads
//! ([`XskRings`]). `bpf(2)` is called directly: five commands, no loader
//! library (see docs/architecture.md, "AF_XDP").
//!
//! The UMEM is a `memfd` so it can cross the helper connection: the helper
//! maps it, registers it with the socket (the kernel pins its pages) and
//! unmaps it; the worker maps the same `memfd` and so sees the frames the
//! kernel writes into those pages.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::sockopt;

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;

/// Bytes of one UMEM frame: a standard Ethernet frame fits, a jumbo one
/// doesn't (`ingress = "xdp"` refuses an MTU above [`MAX_FRAME`]).
pub const FRAME_SIZE: u32 = 2048;
/// The largest frame (Ethernet header included) a UMEM frame holds: the
/// frame size less the kernel's `XDP_PACKET_HEADROOM` (256), which copy
/// mode reserves in front of every frame.
pub const MAX_FRAME: u32 = FRAME_SIZE - 256;

#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapUpdate {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// `bpf(cmd, attr)`, the new fd on success for the commands that make one.
///
/// # Safety
/// `attr` must be the `union bpf_attr` member the kernel reads for `cmd`,
/// and every pointer in it valid for what the kernel does with it during
/// the call (reads of `insns`/`license`/`key`/`value`, writes of
/// `log_size` bytes at `log_buf`).
unsafe fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: the caller's contract covers `attr` and what it points to;
    // its size is passed so the kernel reads no more than `T`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<libc::c_void>(),
            size_of::<T>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn new_fd(rc: libc::c_long) -> io::Result<OwnedFd> {
    let fd = RawFd::try_from(rc).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: `rc` is the fd a successful `bpf` call just installed in
    // this process; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fd_u32(fd: &impl AsFd) -> u32 {
    u32::try_from(fd.as_fd().as_raw_fd()).unwrap_or(u32::MAX)
}

/// Create an `XSKMAP` with `entries` slots (one per receive queue).
pub fn create_xsk_map(entries: u32) -> io::Result<OwnedFd> {
    let mut attr = MapCreate {
        map_type: BPF_MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries: entries,
        ..MapCreate::default()
    };
    attr.map_name[..8].copy_from_slice(b"mcrelay\0");
    // SAFETY: a `MapCreate` is what `BPF_MAP_CREATE` reads; no pointers.
    new_fd(unsafe { bpf(BPF_MAP_CREATE, &mut attr) }?)
}

/// `map[key] = fd`: put the AF_XDP socket `xsk` in the `XSKMAP`'s slot
/// for queue `key`.
pub fn xsk_map_insert(map: &impl AsFd, key: u32, xsk: &impl AsFd) -> io::Result<()> {
    let value = fd_u32(xsk);
    let mut attr = MapUpdate {
        map_fd: fd_u32(map),
        key: (&raw const key) as u64,
        value: (&raw const value) as u64,
        ..MapUpdate::default()
    };
    // SAFETY: `key` and `value` are live u32s (the map's key and value
    // size) for the call; the kernel only reads them.
    unsafe { bpf(BPF_MAP_UPDATE_ELEM, &mut attr) }.map(drop)
}

/// Load `insns` as an XDP program; on the verifier's refusal the error
/// carries its log's last line.
pub fn load_xdp_program(insns: &[u64]) -> io::Result<OwnedFd> {
    const LICENSE: &CStr = c"Apache-2.0";
    let mut attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: u32::try_from(insns.len()).map_err(|_| io::ErrorKind::InvalidInput)?,
        insns: insns.as_ptr() as u64,
        license: LICENSE.as_ptr() as u64,
        expected_attach_type: BPF_XDP,
        ..ProgLoad::default()
    };
    attr.prog_name[..12].copy_from_slice(b"mcrelay_xdp\0");
    // SAFETY: `insns` (`insn_cnt` 8-byte instructions) and `LICENSE` are
    // live for the call and only read; no log buffer.
    match unsafe { bpf(BPF_PROG_LOAD, &mut attr) } {
        Ok(rc) => new_fd(rc),
        Err(e) => {
            let mut log = vec![0u8; 64 * 1024];
            attr.log_level = 1;
            attr.log_size = u32::try_from(log.len()).unwrap_or(0);
            attr.log_buf = log.as_mut_ptr() as u64;
            // SAFETY: as above, and `log` is `log_size` writable bytes
            // live for the call.
            if unsafe { bpf(BPF_PROG_LOAD, &mut attr) }.is_ok() {
                return Err(e);
            }
            let text = String::from_utf8_lossy(&log);
            let text = text.trim_end_matches('\0');
            let last = text.lines().rev().find(|l| !l.trim().is_empty());
            Err(io::Error::new(
                e.kind(),
                format!("{e}; verifier: {}", last.unwrap_or("(no log)")),
            ))
        }
    }
}

/// Attach `prog` to interface `ifindex` through a `bpf_link` (native XDP
/// where the driver has it, generic otherwise): detached when the last fd
/// of the returned link closes, so a killed process leaves nothing
/// attached. `EBUSY` when the interface already has an XDP program.
pub fn attach_xdp(prog: &impl AsFd, ifindex: u32) -> io::Result<OwnedFd> {
    let mut attr = LinkCreate {
        prog_fd: fd_u32(prog),
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags: 0,
    };
    // SAFETY: a `LinkCreate` (the `link_create` member's head) is what
    // `BPF_LINK_CREATE` reads for XDP; no pointers.
    new_fd(unsafe { bpf(BPF_LINK_CREATE, &mut attr) }?)
}

/// The `ifreq` the interface ioctl `request` (a `SIOCGIF*` that reads
/// `ifr_name` and writes one member of the union) answers for interface
/// `name`, asked on a fresh UDP socket (no privilege needed).
fn interface_ioctl(name: &str, request: libc::Ioctl) -> io::Result<libc::ifreq> {
    let socket = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: `ifreq` is plain data for which all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() || name.bytes().any(|b| b == 0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name:?} is not a valid one"),
        ));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = libc::c_char::from_ne_bytes([s]);
    }
    // SAFETY: `req` is a live `ifreq` with a NUL-terminated name (the
    // check above leaves room for the NUL of the zeroed array); the
    // kernel writes one member of its union and nothing else (the
    // caller's `request` is a `SIOCGIF*` getter).
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), request, &raw mut req) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(req)
}

/// The MTU of interface `name` (`SIOCGIFMTU`).
pub fn interface_mtu(name: &str) -> io::Result<u32> {
    let req = interface_ioctl(name, libc::SIOCGIFMTU)?;
    // SAFETY: `SIOCGIFMTU` succeeded, so the union holds `ifru_mtu`.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).map_err(|_| io::ErrorKind::InvalidData.into())
}

/// The hardware (MAC) address of Ethernet interface `name`
/// (`SIOCGIFHWADDR`; no privilege needed). An error for an interface
/// that isn't Ethernet (no 6-byte address).
pub fn interface_mac(name: &str) -> io::Result<[u8; 6]> {
    let req = interface_ioctl(name, libc::SIOCGIFHWADDR)?;
    // SAFETY: `SIOCGIFHWADDR` succeeded, so the union holds `ifru_hwaddr`.
    let addr = unsafe { req.ifr_ifru.ifru_hwaddr };
    if addr.sa_family != libc::ARPHRD_ETHER {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "interface {name:?} is not Ethernet (hardware type {})",
                addr.sa_family
            ),
        ));
    }
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(addr.sa_data) {
        *d = s.to_ne_bytes()[0];
    }
    Ok(mac)
}

/// A new AF_XDP socket (`CAP_NET_RAW`).
pub fn xsk_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain `socket(2)`, no pointers.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created by this call and is owned by nobody.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The UMEM frames and ring entries of every `ingress = "xdp"` leg: 2048
/// frames of 2 KiB (4 MiB of locked memory, counted against
/// `RLIMIT_MEMLOCK` of the helper's user unless it has `CAP_IPC_LOCK`),
/// all of them in the fill ring, so the kernel never lacks a frame while
/// the worker keeps up. The helper sets the socket up with it and the
/// worker maps it with it.
pub const INGRESS_GEOMETRY: XskGeometry = XskGeometry {
    frames: 2048,
    ring: 2048,
};

/// The UMEM frames and ring entries of every `egress = "xdp"` output's
/// socket: 256 frames of 2 KiB (512 KiB of locked memory, counted against
/// `RLIMIT_MEMLOCK` like the ingress UMEM: four xdp outputs and an xdp
/// input fit the default 8 MiB), a TX ring and a completion ring of 256
/// entries. A frame is taken from the free list when a datagram is
/// written, and comes back through the completion ring once the kernel
/// has sent it (copy mode: copied it into an skb). The worker kicks after
/// every flush (at most a completion batch, 64 datagrams, per output), so
/// the ring holds several flushes.
pub const EGRESS_GEOMETRY: XskGeometry = XskGeometry {
    frames: 256,
    ring: 256,
};

/// Ring sizes and frame count of one AF_XDP socket (powers of two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XskGeometry {
    /// UMEM frames of [`FRAME_SIZE`] bytes.
    pub frames: u32,
    /// Entries of the fill and RX rings.
    pub ring: u32,
}

impl XskGeometry {
    /// The UMEM's bytes.
    pub fn umem_len(&self) -> usize {
        self.frames as usize * FRAME_SIZE as usize
    }
}

/// Give `xsk` a UMEM of `geometry.frames` frames in a new `memfd` (the
/// fd returned, for the worker to map), its fill, completion and RX rings,
/// and bind it to queue `queue` of interface `ifindex` (zero-copy where
/// the driver has it, else copy mode). Returns the memfd and whether the
/// socket is zero-copy. A bind the queue refuses with `EBUSY`, and a UMEM
/// the locked-memory limit refuses with `ENOBUFS`, are retried until
/// `busy_wait` has passed, as for [`setup_xsk_tx`] (a flow removed and
/// added again by a reload: its old socket holds the queue and its UMEM
/// a moment).
pub fn setup_xsk(
    xsk: &OwnedFd,
    ifindex: u32,
    queue: u32,
    geometry: XskGeometry,
    busy_wait: std::time::Duration,
) -> io::Result<(OwnedFd, bool)> {
    setup(xsk, ifindex, queue, geometry, Direction::Receive, busy_wait)
}

/// Like [`setup_xsk`] for an egress socket (`egress = "xdp"`): a UMEM of
/// `geometry.frames` frames, a TX ring and a completion ring of
/// `geometry.ring` entries (and the small fill ring bind insists on), no
/// RX ring. Returns the memfd and whether the socket is zero-copy. A bind
/// the queue refuses with `EBUSY` is retried for up to `busy_wait` (a
/// socket closed a moment ago holds the queue until the kernel's work
/// queue has released its buffer pool).
pub fn setup_xsk_tx(
    xsk: &OwnedFd,
    ifindex: u32,
    queue: u32,
    geometry: XskGeometry,
    busy_wait: std::time::Duration,
) -> io::Result<(OwnedFd, bool)> {
    setup(
        xsk,
        ifindex,
        queue,
        geometry,
        Direction::Transmit,
        busy_wait,
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Receive,
    Transmit,
}

fn setup(
    xsk: &OwnedFd,
    ifindex: u32,
    queue: u32,
    geometry: XskGeometry,
    direction: Direction,
    busy_wait: std::time::Duration,
) -> io::Result<(OwnedFd, bool)> {
    let deadline = std::time::Instant::now() + busy_wait;
    let umem =
        nix::sys::memfd::memfd_create(c"mcrelay-umem", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
    let len = geometry.umem_len();
    nix::unistd::ftruncate(
        &umem,
        i64::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?,
    )?;
    {
        // Mapped only for the registration: the kernel pins the pages, and
        // they stay the memfd's pages after this mapping is gone.
        let mapping = Mapping::shared(&umem, len, 0)?;
        let reg = libc::xdp_umem_reg {
            addr: mapping.ptr.as_ptr() as u64,
            len: len as u64,
            chunk_size: FRAME_SIZE,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        // The pages count against RLIMIT_MEMLOCK: `ENOBUFS` while a
        // socket closed a moment ago (a flow a reload removed and adds
        // again) still holds its UMEM, released by a kernel work queue.
        // Retried like the bind below.
        loop {
            match sockopt::set(xsk, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg) {
                Ok(()) => break,
                Err(e)
                    if e.raw_os_error() == Some(libc::ENOBUFS)
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
    }
    let ring = libc::c_int::try_from(geometry.ring).map_err(|_| io::ErrorKind::InvalidInput)?;
    // Bind requires both UMEM rings; the direction not used gets a small
    // one.
    let unused: libc::c_int = 64;
    let (fill, completion) = match direction {
        Direction::Receive => (ring, unused),
        Direction::Transmit => (unused, ring),
    };
    sockopt::set(xsk, libc::SOL_XDP, libc::XDP_UMEM_FILL_RING, &fill)?;
    sockopt::set(
        xsk,
        libc::SOL_XDP,
        libc::XDP_UMEM_COMPLETION_RING,
        &completion,
    )?;
    let data_ring = match direction {
        Direction::Receive => libc::XDP_RX_RING,
        Direction::Transmit => libc::XDP_TX_RING,
    };
    sockopt::set(xsk, libc::SOL_XDP, data_ring, &ring)?;
    let addr = libc::sockaddr_xdp {
        sxdp_family: u16::try_from(libc::AF_XDP).unwrap_or(44),
        sxdp_flags: 0,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: queue,
        sxdp_shared_umem_fd: 0,
    };
    loop {
        // SAFETY: `addr` is a live `sockaddr_xdp` of the length given; the
        // kernel only reads it.
        let rc = unsafe {
            libc::bind(
                xsk.as_raw_fd(),
                (&raw const addr).cast(),
                libc::socklen_t::try_from(size_of::<libc::sockaddr_xdp>()).unwrap_or(0),
            )
        };
        if rc == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) || std::time::Instant::now() >= deadline {
            return Err(e);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let options: libc::xdp_options = get(xsk, libc::SOL_XDP, libc::XDP_OPTIONS)?;
    Ok((umem, options.flags & libc::XDP_OPTIONS_ZEROCOPY != 0))
}

/// The kernel's drop counters of an AF_XDP socket.
pub fn xsk_statistics(xsk: &impl AsFd) -> io::Result<libc::xdp_statistics> {
    get(xsk, libc::SOL_XDP, libc::XDP_STATISTICS)
}

/// `getsockopt` of a plain-data option of exactly `T`'s size.
fn get<T: Copy>(socket: &impl AsFd, level: libc::c_int, name: libc::c_int) -> io::Result<T> {
    let mut value = std::mem::MaybeUninit::<T>::zeroed();
    let mut len =
        libc::socklen_t::try_from(size_of::<T>()).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `value` is `len` writable bytes and `len` a valid in/out
    // length; the kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            level,
            name,
            value.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if usize::try_from(len).ok() != Some(size_of::<T>()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the kernel's option is not the size this was built for",
        ));
    }
    // SAFETY: zero-initialised, then fully written by the kernel (its
    // length is `T`'s): every `T` used here (integers and structs of them)
    // is valid for any bytes.
    Ok(unsafe { value.assume_init() })
}

/// A shared mapping, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn shared(fd: &impl AsFd, len: usize, offset: libc::off_t) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel (no address hint),
        // of an fd this process holds; nothing aliases it yet.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_fd().as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(io::ErrorKind::InvalidData)?;
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` is exactly the mapping `shared` made, and
        // every borrow of it ends with `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping is plain memory; the rings' shared words are only
// touched through atomics, and `XskRings` (its one user) is used by one
// thread at a time (`&mut self` for every change).
unsafe impl Send for Mapping {}

/// One mapped ring: its producer and consumer words and its entries.
#[derive(Debug)]
struct Ring {
    map: Mapping,
    producer: usize,
    consumer: usize,
    desc: usize,
    mask: u32,
}

impl Ring {
    fn map(
        fd: &impl AsFd,
        off: &libc::xdp_ring_offset,
        entries: u32,
        entry: usize,
        pgoff: libc::off_t,
    ) -> io::Result<Ring> {
        let desc = usize::try_from(off.desc).map_err(|_| io::ErrorKind::InvalidData)?;
        let map = Mapping::shared(fd, desc + entries as usize * entry, pgoff)?;
        Ok(Ring {
            map,
            producer: usize::try_from(off.producer).map_err(|_| io::ErrorKind::InvalidData)?,
            consumer: usize::try_from(off.consumer).map_err(|_| io::ErrorKind::InvalidData)?,
            desc,
            mask: entries - 1,
        })
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is an offset the kernel gave for this ring's
        // 4-byte-aligned producer or consumer word, inside the mapping,
        // which lives as long as `self`; the kernel and this process only
        // ever access it atomically.
        unsafe { AtomicU32::from_ptr(self.map.ptr.as_ptr().wrapping_add(at).cast::<u32>()) }
    }
}

/// The worker's side of an AF_XDP socket: the UMEM and the fill and RX
/// rings, mapped from the socket and the UMEM's memfd. Frames go round:
/// the fill ring gives the kernel free frames, the RX ring returns them
/// holding a received frame, [`XskRings::recycle`] puts them back.
#[derive(Debug)]
pub struct XskRings {
    umem: Mapping,
    fill: Ring,
    rx: Ring,
}

/// One received frame: where it lies in the UMEM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XskFrame {
    /// Offset of its first byte in the UMEM.
    pub addr: u64,
    /// Its length.
    pub len: u32,
}

impl XskRings {
    /// Map `xsk`'s fill and RX rings (sized by `geometry`, as the helper
    /// set them) and the UMEM `memfd`, and hand every frame to the kernel.
    pub fn map(xsk: &impl AsFd, umem: &impl AsFd, geometry: XskGeometry) -> io::Result<XskRings> {
        if !geometry.ring.is_power_of_two() || geometry.frames < geometry.ring {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let off: libc::xdp_mmap_offsets = get(xsk, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS)?;
        let fill = Ring::map(
            xsk,
            &off.fr,
            geometry.ring,
            size_of::<u64>(),
            libc::off_t::try_from(libc::XDP_UMEM_PGOFF_FILL_RING)
                .map_err(|_| io::ErrorKind::InvalidData)?,
        )?;
        let rx = Ring::map(
            xsk,
            &off.rx,
            geometry.ring,
            size_of::<libc::xdp_desc>(),
            libc::XDP_PGOFF_RX_RING,
        )?;
        let umem = Mapping::shared(umem, geometry.umem_len(), 0)?;
        let mut rings = XskRings { umem, fill, rx };
        for i in 0..geometry.ring {
            rings.recycle(u64::from(i) * u64::from(FRAME_SIZE));
        }
        Ok(rings)
    }

    /// The next received frame, if any. Until it is [`recycle`]d the
    /// kernel won't write its UMEM frame again.
    ///
    /// [`recycle`]: XskRings::recycle
    pub fn next_frame(&mut self) -> Option<XskFrame> {
        let consumer = self.rx.word(self.rx.consumer).load(Ordering::Relaxed);
        let producer = self.rx.word(self.rx.producer).load(Ordering::Acquire);
        if producer == consumer {
            return None;
        }
        let at = self.rx.desc + (consumer & self.rx.mask) as usize * size_of::<libc::xdp_desc>();
        // SAFETY: `at` is entry `consumer & mask` of the RX ring, inside
        // its mapping; the kernel published it (the acquire load of
        // `producer` above) and won't touch it until the consumer word
        // moves past it.
        let desc = unsafe {
            self.rx
                .map
                .ptr
                .as_ptr()
                .wrapping_add(at)
                .cast::<libc::xdp_desc>()
                .read()
        };
        self.rx
            .word(self.rx.consumer)
            .store(consumer.wrapping_add(1), Ordering::Release);
        Some(XskFrame {
            addr: desc.addr,
            len: desc.len,
        })
    }

    /// Whether the RX ring holds a frame not yet taken.
    pub fn has_frames(&self) -> bool {
        self.rx.word(self.rx.consumer).load(Ordering::Relaxed)
            != self.rx.word(self.rx.producer).load(Ordering::Acquire)
    }

    /// The bytes of `frame`, or `None` when the kernel's descriptor points
    /// outside the UMEM (never, from a sane kernel; checked anyway).
    pub fn bytes(&self, frame: XskFrame) -> Option<&[u8]> {
        let start = usize::try_from(frame.addr).ok()?;
        let end = start.checked_add(frame.len as usize)?;
        if end > self.umem.len {
            return None;
        }
        // SAFETY: `start..end` lies in the UMEM mapping, which lives as
        // long as `&self`; the frame belongs to this process until it is
        // recycled (which takes `&mut self`, so this borrow has ended).
        Some(unsafe {
            std::slice::from_raw_parts(self.umem.ptr.as_ptr().wrapping_add(start), end - start)
        })
    }

    /// Give the frame at `addr` back to the kernel through the fill ring.
    /// Never more frames are in circulation than the ring holds, so there
    /// is always room.
    pub fn recycle(&mut self, addr: u64) {
        let producer = self.fill.word(self.fill.producer).load(Ordering::Relaxed);
        let consumer = self.fill.word(self.fill.consumer).load(Ordering::Acquire);
        if producer.wrapping_sub(consumer) > self.fill.mask {
            // Full: cannot happen with `ring` frames in circulation.
            return;
        }
        // Frames are aligned; the kernel wants the frame's start.
        let addr = addr - addr % u64::from(FRAME_SIZE);
        let at = self.fill.desc + (producer & self.fill.mask) as usize * size_of::<u64>();
        // SAFETY: entry `producer & mask` of the fill ring, inside its
        // mapping; not yet published (the producer word hasn't moved past
        // it), so the kernel isn't reading it.
        unsafe {
            self.fill
                .map
                .ptr
                .as_ptr()
                .wrapping_add(at)
                .cast::<u64>()
                .write(addr)
        };
        self.fill
            .word(self.fill.producer)
            .store(producer.wrapping_add(1), Ordering::Release);
    }
}

/// Why [`XskTx::send`] sent nothing. Each is counted by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxRefused {
    /// Every UMEM frame is in the TX ring or with the kernel, or the TX
    /// ring is full: the kernel hasn't sent (completed) what was queued.
    Full,
    /// The frame doesn't fit one UMEM frame ([`FRAME_SIZE`] bytes).
    TooLong,
}

/// The worker's side of an egress AF_XDP socket (`egress = "xdp"`): the
/// UMEM, the TX and completion rings, and the list of free frames (every
/// frame, at first). [`XskTx::send`] writes a frame into a free UMEM
/// frame and publishes it on the TX ring; [`XskTx::kick`] asks the kernel
/// to send what the TX ring holds; [`XskTx::reap`] takes the frames the
/// kernel finished with off the completion ring, back onto the free list.
/// Nothing here allocates after [`XskTx::map`].
#[derive(Debug)]
pub struct XskTx {
    umem: Mapping,
    tx: Ring,
    completion: Ring,
    /// Free frames' UMEM offsets (a stack; capacity `frames`, never
    /// exceeded: a frame is either here, in the TX ring or the kernel's).
    free: Vec<u64>,
    fd: RawFd,
    /// The socket is in zero-copy mode (the driver reads the UMEM; a kick
    /// only wakes it).
    zero_copy: bool,
}

impl XskTx {
    /// Map `xsk`'s TX and completion rings (sized by `geometry`, as the
    /// helper set them, [`setup_xsk_tx`]) and the UMEM `memfd`. `xsk` must
    /// outlive the returned value (its fd is kicked).
    pub fn map(xsk: &impl AsFd, umem: &impl AsFd, geometry: XskGeometry) -> io::Result<XskTx> {
        if !geometry.ring.is_power_of_two() || geometry.frames < geometry.ring {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let off: libc::xdp_mmap_offsets = get(xsk, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS)?;
        let tx = Ring::map(
            xsk,
            &off.tx,
            geometry.ring,
            size_of::<libc::xdp_desc>(),
            libc::XDP_PGOFF_TX_RING,
        )?;
        let completion = Ring::map(
            xsk,
            &off.cr,
            geometry.ring,
            size_of::<u64>(),
            libc::off_t::try_from(libc::XDP_UMEM_PGOFF_COMPLETION_RING)
                .map_err(|_| io::ErrorKind::InvalidData)?,
        )?;
        let umem = Mapping::shared(umem, geometry.umem_len(), 0)?;
        // Only as many frames in circulation as the completion ring holds,
        // so a completion never finds it full.
        let free = (0..geometry.ring)
            .rev()
            .map(|i| u64::from(i) * u64::from(FRAME_SIZE))
            .collect();
        let options: libc::xdp_options = get(xsk, libc::SOL_XDP, libc::XDP_OPTIONS)?;
        Ok(XskTx {
            umem,
            tx,
            completion,
            free,
            fd: xsk.as_fd().as_raw_fd(),
            zero_copy: options.flags & libc::XDP_OPTIONS_ZEROCOPY != 0,
        })
    }

    /// Write one frame with `write` (given a UMEM frame's bytes, it
    /// returns the frame's length, or `None` when it doesn't fit) and
    /// publish it on the TX ring. Sent at the next [`XskTx::kick`].
    pub fn send(
        &mut self,
        write: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> Result<(), TxRefused> {
        if self.free.is_empty() {
            self.reap();
        }
        let producer = self.tx.word(self.tx.producer).load(Ordering::Relaxed);
        let consumer = self.tx.word(self.tx.consumer).load(Ordering::Acquire);
        if producer.wrapping_sub(consumer) > self.tx.mask {
            return Err(TxRefused::Full);
        }
        let Some(&addr) = self.free.last() else {
            return Err(TxRefused::Full);
        };
        let start = usize::try_from(addr).map_err(|_| TxRefused::TooLong)?;
        let end = start + FRAME_SIZE as usize;
        if end > self.umem.len {
            return Err(TxRefused::TooLong);
        }
        // SAFETY: `start..end` is one UMEM frame inside the mapping, which
        // lives as long as `self`; it is on the free list, so neither the
        // kernel (it has no descriptor of it) nor another borrow uses it.
        let frame = unsafe {
            std::slice::from_raw_parts_mut(self.umem.ptr.as_ptr().wrapping_add(start), end - start)
        };
        let len = write(frame).ok_or(TxRefused::TooLong)?;
        let len = u32::try_from(len).map_err(|_| TxRefused::TooLong)?;
        self.free.pop();
        let at = self.tx.desc + (producer & self.tx.mask) as usize * size_of::<libc::xdp_desc>();
        // SAFETY: entry `producer & mask` of the TX ring, inside its
        // mapping; not yet published (the producer word hasn't moved past
        // it, and the ring has room: checked above), so the kernel isn't
        // reading it.
        unsafe {
            self.tx
                .map
                .ptr
                .as_ptr()
                .wrapping_add(at)
                .cast::<libc::xdp_desc>()
                .write(libc::xdp_desc {
                    addr,
                    len,
                    options: 0,
                });
        }
        self.tx
            .word(self.tx.producer)
            .store(producer.wrapping_add(1), Ordering::Release);
        Ok(())
    }

    /// Take the frames the kernel has sent off the completion ring, back
    /// onto the free list.
    pub fn reap(&mut self) {
        let consumer = self
            .completion
            .word(self.completion.consumer)
            .load(Ordering::Relaxed);
        let producer = self
            .completion
            .word(self.completion.producer)
            .load(Ordering::Acquire);
        let mut at = consumer;
        while at != producer && self.free.len() < self.free.capacity() {
            let off =
                self.completion.desc + (at & self.completion.mask) as usize * size_of::<u64>();
            // SAFETY: entry `at & mask` of the completion ring, inside its
            // mapping, published by the kernel (the acquire load of
            // `producer`) and not yet released (the consumer word moves
            // below).
            let addr = unsafe {
                self.completion
                    .map
                    .ptr
                    .as_ptr()
                    .wrapping_add(off)
                    .cast::<u64>()
                    .read()
            };
            self.free.push(addr - addr % u64::from(FRAME_SIZE));
            at = at.wrapping_add(1);
        }
        self.completion
            .word(self.completion.consumer)
            .store(at, Ordering::Release);
    }

    /// Whether the TX ring holds frames the kernel hasn't taken yet.
    pub fn unsent(&self) -> bool {
        self.tx.word(self.tx.producer).load(Ordering::Relaxed)
            != self.tx.word(self.tx.consumer).load(Ordering::Acquire)
    }

    /// Frames on the free list.
    pub fn free_frames(&self) -> usize {
        self.free.len()
    }

    /// Ask the kernel to send what the TX ring holds (`sendto` with
    /// `MSG_DONTWAIT`), then reap. Copy mode sends at most a batch (32) per
    /// call and says `EAGAIN` when frames are left, and also when it can't
    /// go on now (the driver's queue is stopped, the socket's send buffer
    /// of copies in flight is full): called again while frames are left,
    /// at most `ring / 16` times. In copy mode `EBUSY` means the driver
    /// dropped the frame it was given (a veth whose peer's backlog is
    /// full; the frame is completed, not sent): counted in
    /// [`XskKick::driver_drops`], and the kick goes on. A call that returns
    /// without an error has taken what the kernel will take now (zero-copy
    /// mode only wakes the driver). The error, when the ring still holds
    /// frames: `EAGAIN` (the caller kicks again soon,
    /// [`XskKick::retry_soon`]), or another (`ENETDOWN` on a link that is
    /// down, ...: the frames wait for the next flush).
    pub fn kick(&mut self) -> XskKick {
        let mut kick = XskKick::default();
        let mut tries = (self.tx.mask as usize + 1) / 16 + 1;
        while self.unsent() && tries > 0 {
            tries -= 1;
            // SAFETY: a zero-length `sendto` with no buffer and no address
            // on the AF_XDP socket's fd, which lives as long as `self` (the
            // caller's contract in `map`); the kernel reads nothing.
            let rc = unsafe {
                libc::sendto(
                    self.fd,
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            kick.calls += 1;
            if rc >= 0 {
                kick.error = None;
                break;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Copy mode: the driver dropped the frame it was given.
                Some(libc::EBUSY) if !self.zero_copy => {
                    kick.driver_drops += 1;
                    kick.error = None;
                }
                Some(libc::EINTR) => {}
                // The batch limit, or it can't go on now: which, the ring
                // doesn't say (the kernel publishes its consumer index
                // lazily), so try again, a bounded number of times.
                Some(libc::EAGAIN) => kick.error = Some(e),
                _ => {
                    kick.error = Some(e);
                    break;
                }
            }
        }
        self.reap();
        if !self.unsent() {
            kick.error = None;
        }
        kick.unsent = self.unsent();
        kick
    }
}

/// What one [`XskTx::kick`] did.
#[derive(Debug, Default)]
pub struct XskKick {
    /// `sendto` calls made.
    pub calls: u32,
    /// Frames the driver dropped (`EBUSY`): completed, not sent.
    pub driver_drops: u32,
    /// Frames are left in the TX ring.
    pub unsent: bool,
    /// Why frames are left (`None` when none are, or when the last call
    /// took what the kernel would take now).
    pub error: Option<io::Error>,
}

impl XskKick {
    /// Frames are left that the kernel could take soon: the caller should
    /// kick again without waiting for new datagrams (`EAGAIN`: a stopped
    /// queue, a full send buffer or completion ring, or the batch limit;
    /// or a zero-copy driver still working through the ring).
    pub fn retry_soon(&self) -> bool {
        self.unsent
            && self
                .error
                .as_ref()
                .is_none_or(|e| e.raw_os_error() == Some(libc::EAGAIN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kick(unsent: bool, errno: Option<i32>) -> XskKick {
        XskKick {
            calls: 1,
            driver_drops: 0,
            unsent,
            error: errno.map(io::Error::from_raw_os_error),
        }
    }

    /// Frames left by a kick the kernel could take soon are kicked again
    /// without new datagrams; frames left behind a down link wait for
    /// the next flush (no busy retry while the flow is being paused).
    #[test]
    fn frames_left_by_eagain_are_retried_soon() {
        assert!(!kick(false, None).retry_soon(), "nothing left");
        assert!(kick(true, Some(libc::EAGAIN)).retry_soon(), "queue stopped");
        assert!(kick(true, None).retry_soon(), "zero-copy driver at work");
        assert!(!kick(true, Some(libc::ENETDOWN)).retry_soon(), "link down");
        assert!(!kick(true, Some(libc::ENXIO)).retry_soon(), "unbound");
    }

    /// Both interface ioctls through `interface_ioctl`: loopback has an
    /// MTU but no Ethernet address; a name that can't be one, or names
    /// no interface, is an error, not a panic.
    #[test]
    fn interface_ioctls_answer_for_loopback_and_refuse_bad_names() {
        assert!(interface_mtu("lo").expect("lo's MTU") >= 1280);
        let e = interface_mac("lo").expect_err("lo is not Ethernet");
        assert!(e.to_string().contains("is not Ethernet"), "{e}");
        for bad in ["a-name-longer-than-ifnamsiz", "l\0o"] {
            let e = interface_mtu(bad).expect_err(bad);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}: {e}");
        }
        let e = interface_mtu("nosuchif0").expect_err("no such interface");
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
    }
}
