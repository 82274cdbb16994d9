//! The kernel-facing half of UDP GSO sends: one `msghdr` per GSO run
//! record of the core (same numbers), with its `iovec`s and its
//! `UDP_SEGMENT` control message, filled from the run's in-flight slots
//! when the send is queued. The core decides the runs (`mcrelay_relay::queue`);
//! this only lays them out as the kernel reads them. The kernel then
//! routes, builds headers for and queues the run once, and segments it
//! late (in the NIC where it offloads UDP segmentation, else in software
//! just before the driver).
//!
//! Everything here is allocated when the worker starts (boxed slice: the
//! records stay put for as long as the kernel may read them).

use std::mem::size_of;

use mcrelay_relay::queue::MAX_SEGMENTS;
use mcrelay_relay::{InFlight, Slot};

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

/// The message of one GSO send in flight.
struct GsoMessage {
    msg: libc::msghdr,
    iov: [libc::iovec; MAX_SEGMENTS],
    cmsg: SegmentCmsg,
}

impl GsoMessage {
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
        }
    }
}

/// The messages of one worker's GSO runs, indexed by the core's record
/// numbers.
pub struct GsoMessages {
    records: Box<[GsoMessage]>,
}

impl std::fmt::Debug for GsoMessages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GsoMessages")
            .field("records", &self.records.len())
            .finish_non_exhaustive()
    }
}

impl GsoMessages {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            records: (0..capacity).map(|_| GsoMessage::empty()).collect(),
        }
    }

    /// Lay out record `record` for a GSO send of the buffers in `slots`
    /// (each `segment_size` bytes but a shorter last one), reading their
    /// addresses from `in_flight`; the `msghdr` to send, which stays at its
    /// address until the record is filled again. `None` for an unknown
    /// record, too many slots or a slot with no buffer.
    pub fn fill(
        &mut self,
        record: u32,
        segment_size: u16,
        slots: &[Slot],
        in_flight: &InFlight,
    ) -> Option<*const libc::msghdr> {
        if slots.is_empty() || slots.len() > MAX_SEGMENTS {
            return None;
        }
        let r = self.records.get_mut(record as usize)?;
        for (iov, &slot) in r.iov.iter_mut().zip(slots) {
            let buf = in_flight.buffer(slot)?;
            *iov = libc::iovec {
                iov_base: buf.as_ptr().cast_mut().cast(),
                iov_len: buf.len(),
            };
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
        r.msg.msg_iovlen = slots.len();
        r.msg.msg_control = (&raw mut r.cmsg).cast();
        r.msg.msg_controllen = size_of::<SegmentCmsg>();
        Some(&raw const r.msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcrelay_pool::{PoolConfig, PoolSet, SharedBuffer};

    #[test]
    fn a_gso_message_is_a_udp_segment_message_of_the_slots_buffers() {
        let mut pool = PoolSet::new(PoolConfig {
            small: 4,
            standard: 1,
            jumbo: 1,
        })
        .expect("pool");
        let mut in_flight = InFlight::with_capacity(4);
        let mut slots = Vec::new();
        for len in [100, 100, 50] {
            let buf = pool.take_filled(&[7; 100][..len]).expect("buf");
            slots.push(
                in_flight
                    .insert(SharedBuffer::new(buf, 1).expect("use"))
                    .expect("slot"),
            );
        }
        let mut msgs = GsoMessages::with_capacity(1);
        let msg = msgs.fill(0, 100, &slots, &in_flight).expect("filled");
        let r = &msgs.records[0];
        assert_eq!(msg, &raw const r.msg);
        assert_eq!(r.msg.msg_iovlen, 3);
        assert_eq!(r.iov[2].iov_len, 50);
        assert_eq!(
            r.iov[0].iov_base.cast_const().cast::<u8>(),
            in_flight.buffer(slots[0]).expect("parked").as_ptr()
        );
        assert_eq!(r.cmsg.segment_size, 100);
        assert_eq!(r.cmsg.header.cmsg_level, libc::SOL_UDP);
        assert_eq!(r.cmsg.header.cmsg_type, libc::UDP_SEGMENT);
        assert_eq!(r.cmsg.header.cmsg_len, 18);
        assert_eq!(r.msg.msg_controllen, 24);
        assert!(
            msgs.fill(1, 100, &slots, &in_flight).is_none(),
            "no such record"
        );
        assert!(
            msgs.fill(0, 100, &[99], &in_flight).is_none(),
            "no buffer in slot"
        );
        for slot in slots {
            if let Some(b) = in_flight.complete_one(slot) {
                pool.give(b).expect("home");
            }
        }
    }
}
