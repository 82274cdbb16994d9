//! Egress batching: the sends queued for each output during one batch of
//! completions, turned into io_uring SQEs when the batch ends — one `Send`
//! per datagram, or one `SendMsg` that carries a run of consecutive
//! same-size datagrams as a single UDP GSO (`UDP_SEGMENT`) send. The kernel
//! then routes, builds headers for and queues the run once, and segments it
//! late (in the NIC where it offloads UDP segmentation, else in software
//! just before the driver).
//!
//! Everything here is pre-allocated when the worker starts: a fixed array
//! of pending slots per output and a fixed table of GSO message records
//! whose `msghdr`, `iovec`s and control message stay put (boxed slice) for
//! as long as the kernel may read them.

use std::mem::size_of;

/// Datagrams one GSO send carries at most (the kernel allows 64 on every
/// version with UDP GSO, 128 on newer ones).
pub const MAX_SEGMENTS: usize = 64;

/// Payload bytes one GSO send carries at most: the whole run travels as one
/// IP datagram up to segmentation, so it must stay below 64 KiB with IPv4
/// or IPv6 and UDP headers on top.
pub const MAX_GSO_BYTES: usize = 65_000;

/// Sends an output can have queued in one completion batch: one per
/// completion at most, and a batch has at most this many.
pub const PENDING_CAPACITY: usize = 64;

/// `CMSG_ALIGN` of glibc and the kernel: round up to the size of a long.
const fn cmsg_align(len: usize) -> usize {
    (len + size_of::<usize>() - 1) & !(size_of::<usize>() - 1)
}

/// `CMSG_LEN(sizeof(u16))`: header plus the segment size.
const SEGMENT_CMSG_LEN: usize = cmsg_align(size_of::<libc::cmsghdr>()) + size_of::<u16>();

/// A `UDP_SEGMENT` control message, laid out as `CMSG_FIRSTHDR` expects:
/// the header, then the `u16` segment size at `CMSG_DATA`, padded to
/// `CMSG_SPACE(sizeof(u16))`.
#[repr(C)]
#[derive(Clone, Copy)]
struct SegmentCmsg {
    header: libc::cmsghdr,
    segment_size: u16,
    _pad: [u8; 6],
}

const _: () = assert!(size_of::<libc::cmsghdr>() == cmsg_align(size_of::<libc::cmsghdr>()));
const _: () = assert!(
    size_of::<SegmentCmsg>()
        == cmsg_align(size_of::<libc::cmsghdr>()) + cmsg_align(size_of::<u16>())
);

/// One GSO send in flight: the message the kernel reads and the in-flight
/// slots of the datagrams it carries.
pub struct GsoRecord {
    msg: libc::msghdr,
    iov: [libc::iovec; MAX_SEGMENTS],
    cmsg: SegmentCmsg,
    slots: [u32; MAX_SEGMENTS],
    count: usize,
}

impl std::fmt::Debug for GsoRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GsoRecord")
            .field("count", &self.count)
            .field("segment_size", &self.cmsg.segment_size)
            .finish_non_exhaustive()
    }
}

impl GsoRecord {
    fn empty() -> Self {
        Self {
            msg: libc::msghdr {
                msg_name: std::ptr::null_mut(),
                msg_namelen: 0,
                msg_iov: std::ptr::null_mut(),
                msg_iovlen: 0,
                msg_control: std::ptr::null_mut(),
                msg_controllen: 0,
                msg_flags: 0,
            },
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_SEGMENTS],
            cmsg: SegmentCmsg {
                header: libc::cmsghdr {
                    cmsg_len: 0,
                    cmsg_level: 0,
                    cmsg_type: 0,
                },
                segment_size: 0,
                _pad: [0; 6],
            },
            slots: [0; MAX_SEGMENTS],
            count: 0,
        }
    }

    /// The in-flight slots of the datagrams this send carries.
    pub fn slots(&self) -> &[u32] {
        &self.slots[..self.count]
    }

    /// Where each datagram's payload is, in order.
    pub fn iovecs(&self) -> &[libc::iovec] {
        &self.iov[..self.count]
    }

    /// The size every datagram but the last has.
    pub fn segment_size(&self) -> usize {
        usize::from(self.cmsg.segment_size)
    }
}

/// The fixed table of GSO records of one worker.
#[derive(Debug)]
pub struct GsoTable {
    records: Box<[GsoRecord]>,
    free: Vec<u32>,
}

impl GsoTable {
    pub fn with_capacity(capacity: u32) -> Self {
        Self {
            records: (0..capacity).map(|_| GsoRecord::empty()).collect(),
            free: (0..capacity).rev().collect(),
        }
    }

    /// Fill a free record with `segments` (each `(slot, ptr, len)`; every
    /// length equal to `segment_size` except a shorter last one) and return
    /// its index and the `msghdr` to send, or `None` when every record is
    /// in flight (the caller sends the datagrams one by one).
    ///
    /// The `msghdr` points into the record, which stays at its address
    /// until [`GsoTable::finish`] hands the index back.
    pub fn start(
        &mut self,
        segment_size: u16,
        segments: impl ExactSizeIterator<Item = (u32, *const u8, usize)>,
    ) -> Option<(u32, *const libc::msghdr)> {
        if segments.len() > MAX_SEGMENTS {
            return None;
        }
        let index = self.free.pop()?;
        let r = self.records.get_mut(index as usize)?;
        r.count = 0;
        for (i, (slot, ptr, len)) in segments.enumerate() {
            r.slots[i] = slot;
            r.iov[i] = libc::iovec {
                iov_base: ptr.cast_mut().cast(),
                iov_len: len,
            };
            r.count = i + 1;
        }
        r.cmsg = SegmentCmsg {
            header: libc::cmsghdr {
                cmsg_len: SEGMENT_CMSG_LEN,
                cmsg_level: libc::SOL_UDP,
                cmsg_type: libc::UDP_SEGMENT,
            },
            segment_size,
            _pad: [0; 6],
        };
        r.msg.msg_iov = r.iov.as_mut_ptr();
        r.msg.msg_iovlen = r.count;
        r.msg.msg_control = (&raw mut r.cmsg).cast();
        r.msg.msg_controllen = size_of::<SegmentCmsg>();
        Some((index, &raw const r.msg))
    }

    /// The record of a send that completed (or was never submitted).
    pub fn get(&self, index: u32) -> Option<&GsoRecord> {
        self.records.get(index as usize).filter(|r| r.count > 0)
    }

    /// Hand a record back once its send completed (or was never submitted).
    pub fn finish(&mut self, index: u32) {
        if let Some(r) = self.records.get_mut(index as usize)
            && r.count > 0
        {
            r.count = 0;
            self.free.push(index);
        }
    }
}

/// One queued send: the datagram's in-flight slot, its payload address and
/// its length.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    pub slot: u32,
    pub ptr: *const u8,
    pub len: usize,
}

/// The sends queued for one output in the current completion batch.
#[derive(Debug)]
pub struct PendingSends {
    items: [Pending; PENDING_CAPACITY],
    len: usize,
}

impl Default for PendingSends {
    fn default() -> Self {
        Self {
            items: [Pending {
                slot: 0,
                ptr: std::ptr::null(),
                len: 0,
            }; PENDING_CAPACITY],
            len: 0,
        }
    }
}

impl PendingSends {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queue a send; `false` when full (the caller flushes first).
    pub fn push(&mut self, p: Pending) -> bool {
        match self.items.get_mut(self.len) {
            Some(item) => {
                *item = p;
                self.len += 1;
                true
            }
            None => false,
        }
    }

    /// Everything queued, in order.
    pub fn items(&self) -> &[Pending] {
        self.items.get(..self.len).unwrap_or_default()
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The length of the run starting at `at`: consecutive datagrams of
    /// one size, `gso_max` bytes or less each (0 disables grouping),
    /// optionally ended by one shorter non-empty datagram, within
    /// [`MAX_SEGMENTS`] and [`MAX_GSO_BYTES`]. A run of one is a plain
    /// send; 0 means nothing is left.
    pub fn run_len(&self, at: usize, gso_max: usize) -> usize {
        let rest = self.items().get(at..).unwrap_or_default();
        let Some(first) = rest.first() else {
            return 0;
        };
        let size = first.len;
        let mut n = 1;
        if size == 0 || size > gso_max {
            return n;
        }
        let mut bytes = size;
        for p in &rest[1..] {
            if n == MAX_SEGMENTS || bytes + p.len > MAX_GSO_BYTES {
                break;
            }
            if p.len == size {
                n += 1;
                bytes += p.len;
            } else {
                if p.len > 0 && p.len < size {
                    n += 1;
                }
                break;
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(lens: &[usize]) -> PendingSends {
        let mut p = PendingSends::default();
        for (i, &len) in lens.iter().enumerate() {
            assert!(p.push(Pending {
                slot: u32::try_from(i).expect("small"),
                ptr: std::ptr::null(),
                len,
            }));
        }
        p
    }

    fn runs(lens: &[usize], gso_max: usize) -> Vec<Vec<usize>> {
        let p = pending(lens);
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let n = p.run_len(at, gso_max);
            if n == 0 {
                return out;
            }
            out.push(p.items()[at..at + n].iter().map(|p| p.len).collect());
            at += n;
        }
    }

    #[test]
    fn same_size_datagrams_group_and_a_shorter_one_ends_a_run() {
        assert_eq!(
            runs(&[100, 100, 100, 50, 100, 200], 9000),
            vec![vec![100, 100, 100, 50], vec![100], vec![200]]
        );
        assert_eq!(
            runs(&[100, 200, 200], 9000),
            vec![vec![100], vec![200, 200]]
        );
    }

    #[test]
    fn empty_datagrams_and_disabled_gso_are_sent_alone() {
        assert_eq!(runs(&[0, 0], 9000), vec![vec![0], vec![0]]);
        assert_eq!(runs(&[100, 0], 9000), vec![vec![100], vec![0]]);
        assert_eq!(runs(&[100, 100], 0), vec![vec![100], vec![100]]);
        assert_eq!(runs(&[1400, 1400], 1399), vec![vec![1400], vec![1400]]);
    }

    #[test]
    fn runs_respect_the_segment_and_byte_limits() {
        let many = vec![10; PENDING_CAPACITY];
        let r = runs(&many, 9000);
        assert_eq!(r.iter().map(Vec::len).sum::<usize>(), PENDING_CAPACITY);
        assert!(r.iter().all(|run| run.len() <= MAX_SEGMENTS));
        let jumbo = vec![9000; 10];
        let r = runs(&jumbo, 9000);
        assert_eq!(r[0].len(), MAX_GSO_BYTES / 9000);
        assert!(
            r.iter()
                .all(|run| run.iter().sum::<usize>() <= MAX_GSO_BYTES)
        );
    }

    #[test]
    fn pending_refuses_beyond_capacity() {
        let mut p = pending(&[1; PENDING_CAPACITY]);
        assert!(!p.push(Pending {
            slot: 0,
            ptr: std::ptr::null(),
            len: 1
        }));
        p.clear();
        assert!(p.is_empty());
    }

    #[test]
    fn gso_records_build_a_udp_segment_message_and_come_back() {
        let mut table = GsoTable::with_capacity(1);
        let data = [7u8; 300];
        let segs = [
            (4u32, data.as_ptr(), 100usize),
            (9, data.as_ptr(), 100),
            (2, data.as_ptr(), 50),
        ];
        let (index, msg) = table.start(100, segs.into_iter()).expect("a free record");
        assert!(table.start(100, segs.into_iter()).is_none(), "table full");
        let r = table.get(index).expect("in flight");
        assert_eq!(r.slots(), &[4, 9, 2]);
        assert_eq!(r.segment_size(), 100);
        assert_eq!(msg, &raw const r.msg);
        assert_eq!(r.msg.msg_iovlen, 3);
        assert_eq!(r.iov[2].iov_len, 50);
        assert_eq!(r.cmsg.header.cmsg_level, libc::SOL_UDP);
        assert_eq!(r.cmsg.header.cmsg_type, libc::UDP_SEGMENT);
        assert_eq!(r.cmsg.header.cmsg_len, 18);
        assert_eq!(r.msg.msg_controllen, 24);
        table.finish(index);
        assert!(table.get(index).is_none());
        table.finish(index);
        assert!(
            table.start(100, segs.into_iter()).is_some(),
            "record reused once"
        );
        assert!(
            table.start(100, segs.into_iter()).is_none(),
            "finish twice frees once"
        );
    }
}
