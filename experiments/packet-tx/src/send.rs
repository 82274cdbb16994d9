//! The sender: datagrams of one size to one multicast destination, in
//! batches, each batch submitted through io_uring (single issuer,
//! cooperative task running, like the worker) and waited for, or handed to
//! one `sendmmsg(2)`.
//!
//! Memory protocol (what the `unsafe` below relies on): `batch` slots of
//! payload, header, iovec pair and msghdr are allocated once, before any
//! send, and never resized or moved (boxed slices); every pointer an SQE
//! or msghdr carries points into them. A batch reuses slots only after
//! every completion of the previous batch was reaped (`submit_and_wait`
//! for all of them), so the kernel never reads a slot being rewritten.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, OwnedFd};

use io_uring::types::Fd;
use io_uring::{IoUring, opcode};

use crate::frame::{HEADER_LEN, Template};

/// Where the datagrams go out.
#[derive(Debug)]
pub enum Egress {
    /// The product's output socket (connected UDP), one `Send` each.
    Udp(UdpSocket),
    /// An AF_PACKET socket bound to the interface, one `SendMsg` each with
    /// the iovec [headers, payload].
    Packet { fd: OwnedFd, template: Template },
}

/// How a batch reaches the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submit {
    Uring,
    Sendmmsg,
    /// UDP only: the whole batch as one io_uring `SendMsg` with a
    /// `UDP_SEGMENT` control message and one iovec per datagram (the
    /// worker's GSO run).
    UringGso,
}

/// A `UDP_SEGMENT` control message as `CMSG_FIRSTHDR` expects it: the
/// header, the `u16` segment size at `CMSG_DATA`, padding to
/// `CMSG_SPACE(sizeof(u16))` (the worker's `egress::SegmentCmsg`).
#[repr(C)]
#[derive(Clone, Copy)]
struct SegmentCmsg {
    header: libc::cmsghdr,
    segment_size: u16,
    _pad: [u8; 6],
}

/// The GSO message: one per sender, rebuilt per batch. `iov[0]` is the
/// AF_PACKET variant's `virtio_net_hdr` + headers (UDP sends start at
/// `iov[1]`), `iov[1..]` the payloads.
struct Gso {
    msg: libc::msghdr,
    iov: Box<[libc::iovec]>,
    cmsg: Box<SegmentCmsg>,
    header: Box<[u8; VNET_LEN + HEADER_LEN]>,
}

/// `struct virtio_net_hdr` (the legacy one a packet socket with
/// `PACKET_VNET_HDR` reads): 10 bytes, little-endian fields on x86.
pub const VNET_LEN: usize = 10;
const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
const VIRTIO_NET_HDR_GSO_UDP_L4: u8 = 5;

/// What the sends returned.
#[derive(Debug, Default)]
pub struct Outcome {
    pub sent: u64,
    /// Sends that returned fewer bytes than asked.
    pub short: u64,
    /// Failed sends by errno.
    pub errors: BTreeMap<i32, u64>,
}

/// The slots, allocated once (see the module's memory protocol).
pub struct Sender {
    egress: Egress,
    submit: Submit,
    uring: IoUring,
    size: usize,
    payloads: Box<[u8]>,
    headers: Box<[[u8; HEADER_LEN]]>,
    iovs: Box<[[libc::iovec; 2]]>,
    msgs: Box<[libc::mmsghdr]>,
    gso: Gso,
    run_id: u32,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("egress", &self.egress)
            .field("submit", &self.submit)
            .field("size", &self.size)
            .field("batch", &self.headers.len())
            .finish_non_exhaustive()
    }
}

impl Sender {
    pub fn new(
        egress: Egress,
        submit: Submit,
        size: usize,
        batch: usize,
        run_id: u32,
    ) -> io::Result<Self> {
        let batch = batch.max(1);
        let uring = IoUring::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .build(u32::try_from(batch.next_power_of_two()).unwrap_or(4096))?;
        let mut s = Self {
            egress,
            submit,
            uring,
            size,
            payloads: vec![0u8; size * batch].into_boxed_slice(),
            headers: vec![[0u8; HEADER_LEN]; batch].into_boxed_slice(),
            iovs: vec![
                [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; 2];
                batch
            ]
            .into_boxed_slice(),
            // SAFETY: `mmsghdr` is plain data for which all-zero is valid
            // (null pointers, zero lengths).
            msgs: (0..batch)
                .map(|_| unsafe { std::mem::zeroed::<libc::mmsghdr>() })
                .collect(),
            gso: Gso {
                // SAFETY: `msghdr` is plain data for which all-zero is
                // valid (null pointers, zero lengths).
                msg: unsafe { std::mem::zeroed() },
                iov: vec![
                    libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    };
                    batch + 1
                ]
                .into_boxed_slice(),
                header: Box::new([0; VNET_LEN + HEADER_LEN]),
                cmsg: Box::new(SegmentCmsg {
                    header: libc::cmsghdr {
                        cmsg_len: size_of::<libc::cmsghdr>() + size_of::<u16>(),
                        cmsg_level: libc::SOL_UDP,
                        cmsg_type: libc::UDP_SEGMENT,
                    },
                    segment_size: u16::try_from(size).unwrap_or(u16::MAX),
                    _pad: [0; 6],
                }),
            },
            run_id,
        };
        let packet = matches!(s.egress, Egress::Packet { .. });
        for i in 0..batch {
            let payload = s.payloads[i * size..].as_mut_ptr();
            let header = s.headers[i].as_mut_ptr();
            s.iovs[i] = [
                libc::iovec {
                    iov_base: header.cast(),
                    iov_len: HEADER_LEN,
                },
                libc::iovec {
                    iov_base: payload.cast(),
                    iov_len: size,
                },
            ];
            let iov = &raw mut s.iovs[i];
            let hdr = &mut s.msgs[i].msg_hdr;
            // UDP: the payload alone (iov[1]); packet: both.
            hdr.msg_iov = if packet {
                iov.cast()
            } else {
                iov.cast::<libc::iovec>().wrapping_add(1)
            };
            hdr.msg_iovlen = if packet { 2 } else { 1 };
            s.gso.iov[i + 1] = libc::iovec {
                iov_base: payload.cast(),
                iov_len: size,
            };
        }
        s.gso.iov[0] = libc::iovec {
            iov_base: s.gso.header.as_mut_ptr().cast(),
            iov_len: VNET_LEN + HEADER_LEN,
        };
        if packet {
            // The whole frame: vnet header + headers, then the payloads.
            s.gso.msg.msg_iov = s.gso.iov.as_mut_ptr();
        } else {
            s.gso.msg.msg_iov = s.gso.iov[1..].as_mut_ptr();
            s.gso.msg.msg_control = (&raw mut *s.gso.cmsg).cast();
            s.gso.msg.msg_controllen = size_of::<SegmentCmsg>();
        }
        Ok(s)
    }

    fn fd(&self) -> i32 {
        match &self.egress {
            Egress::Udp(s) => s.as_raw_fd(),
            Egress::Packet { fd, .. } => fd.as_raw_fd(),
        }
    }

    /// Fill and send datagrams `first..first + n` (`n` ≤ the batch size).
    pub fn send_batch(&mut self, first: u64, n: usize, out: &mut Outcome) -> io::Result<()> {
        let n = n.min(self.headers.len());
        let size = self.size;
        for i in 0..n {
            let seq = first + i as u64;
            mcrelay_loadgen::payload::write(
                &mut self.payloads[i * size..(i + 1) * size],
                self.run_id,
                0,
                seq,
            );
            if let Egress::Packet { template, .. } = &self.egress {
                template
                    .fill(&mut self.headers[i], size)
                    .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
            }
        }
        let expected = match self.egress {
            Egress::Udp(_) => size,
            Egress::Packet { .. } => size + HEADER_LEN,
        };
        match self.submit {
            Submit::Uring => self.via_uring(n, expected, out),
            Submit::Sendmmsg => self.via_sendmmsg(n, expected, out),
            Submit::UringGso => self.via_gso(n, expected, out),
        }
    }

    fn via_uring(&mut self, n: usize, expected: usize, out: &mut Outcome) -> io::Result<()> {
        let fd = Fd(self.fd());
        let len = u32::try_from(self.size).unwrap_or(u32::MAX);
        for i in 0..n {
            let entry = match self.egress {
                Egress::Udp(_) => {
                    opcode::Send::new(fd, self.payloads[i * self.size..].as_ptr(), len).build()
                }
                Egress::Packet { .. } => {
                    opcode::SendMsg::new(fd, &raw const self.msgs[i].msg_hdr).build()
                }
            };
            // SAFETY: the entry points into this sender's slots, which
            // stay allocated and untouched until `submit_and_wait` below
            // has reaped its completion (the module's memory protocol).
            unsafe { self.uring.submission().push(&entry.user_data(i as u64)) }
                .map_err(|_| io::Error::other("submission queue full"))?;
        }
        let mut reaped = 0;
        while reaped < n {
            match self.uring.submit_and_wait(n - reaped) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
            for cqe in self.uring.completion() {
                reaped += 1;
                count(cqe.result(), expected, out);
            }
        }
        Ok(())
    }

    fn via_gso(&mut self, n: usize, expected: usize, out: &mut Outcome) -> io::Result<()> {
        self.gso.msg.msg_iovlen = n;
        let mut total = expected * n;
        if let Egress::Packet { template, .. } = &self.egress {
            // One frame of n segments: a virtio_net_hdr asking for UDP
            // segmentation (gso_size = one payload) and a partial UDP
            // checksum; the headers of the whole run (lengths of all n
            // payloads), which segmentation rewrites per segment.
            self.gso.msg.msg_iovlen = n + 1;
            let (vnet, headers) = self.gso.header.split_at_mut(VNET_LEN);
            let headers: &mut [u8; HEADER_LEN] = headers
                .try_into()
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            crate::frame::fill_partial_checksum(template, headers, self.size * n)
                .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
            let segment = u16::try_from(self.size).unwrap_or(u16::MAX);
            let gso = n > 1;
            vnet[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
            vnet[1] = if gso { VIRTIO_NET_HDR_GSO_UDP_L4 } else { 0 };
            vnet[2..4].copy_from_slice(&42u16.to_le_bytes()); // hdr_len
            vnet[4..6].copy_from_slice(&(if gso { segment } else { 0 }).to_le_bytes());
            vnet[6..8].copy_from_slice(&34u16.to_le_bytes()); // csum_start: UDP header
            vnet[8..10].copy_from_slice(&6u16.to_le_bytes()); // csum_offset: its checksum
            total = VNET_LEN + HEADER_LEN + self.size * n;
        }
        let entry = opcode::SendMsg::new(Fd(self.fd()), &raw const self.gso.msg).build();
        // SAFETY: the message, its iovecs and control message and the
        // payloads they point to are this sender's, untouched until the
        // completion is reaped below (the module's memory protocol).
        unsafe { self.uring.submission().push(&entry) }
            .map_err(|_| io::Error::other("submission queue full"))?;
        loop {
            match self.uring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            if let Some(cqe) = self.uring.completion().next() {
                // One completion for the run: its datagrams all went, or
                // none did.
                let r = cqe.result();
                if usize::try_from(r).ok() == Some(total) {
                    out.sent += n as u64;
                } else if r < 0 {
                    *out.errors.entry(-r).or_default() += n as u64;
                } else {
                    out.short += n as u64;
                }
                return Ok(());
            }
        }
    }

    fn via_sendmmsg(&mut self, n: usize, expected: usize, out: &mut Outcome) -> io::Result<()> {
        let mut done = 0;
        while done < n {
            let left = u32::try_from(n - done).unwrap_or(u32::MAX);
            // SAFETY: `msgs[done..n]` are valid `mmsghdr`s whose iovecs
            // point into this sender's slots, all alive for the call; the
            // kernel writes only their `msg_len`.
            let rc = unsafe { libc::sendmmsg(self.fd(), self.msgs[done..].as_mut_ptr(), left, 0) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                let errno = e.raw_os_error().unwrap_or(0);
                if errno == libc::EINTR {
                    continue;
                }
                // The first message failed: count it, go on with the rest.
                *out.errors.entry(errno).or_default() += 1;
                done += 1;
                continue;
            }
            let sent = usize::try_from(rc).unwrap_or(0);
            for m in &self.msgs[done..done + sent] {
                count(i32::try_from(m.msg_len).unwrap_or(-1), expected, out);
            }
            done += sent;
        }
        Ok(())
    }
}

fn count(result: i32, expected: usize, out: &mut Outcome) {
    if result < 0 {
        *out.errors.entry(-result).or_default() += 1;
    } else if usize::try_from(result).ok() == Some(expected) {
        out.sent += 1;
    } else {
        out.short += 1;
    }
}
