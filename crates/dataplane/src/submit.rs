//! The one place an SQE reaches the kernel, and the encoding of what each
//! completion belongs to.
#![allow(unsafe_code)]

use io_uring::{IoUring, squeue};

/// What a completion is for, packed into the SQE's `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserData {
    /// A receive of the worker's flow number `flow`.
    Receive { flow: u32 },
    /// A send of the buffer parked in in-flight `slot` on output number
    /// `output` of the worker's flow number `flow`.
    Send { slot: u32, flow: u16, output: u16 },
    /// A UDP GSO send of the datagrams in GSO table `record` on output
    /// number `output` of flow number `flow`.
    GsoSend { record: u32, flow: u16, output: u16 },
    /// A cancellation request (its own completion carries nothing).
    Cancel,
}

const KIND_SHIFT: u32 = 62;
/// Sends: output in bits 0..16, slot or record in 16..48, flow in 48..61.
const FLOW_SHIFT: u32 = 48;
/// Flow numbers a send can name (13 bits).
pub const MAX_FLOWS: usize = 1 << 13;
const RECEIVE: u64 = 1;
const SEND: u64 = 2;
const CANCEL: u64 = 3;
/// Set in a send's value when it is a GSO send.
const GSO_FLAG: u64 = 1 << 61;

impl UserData {
    pub fn encode(self) -> u64 {
        match self {
            UserData::Receive { flow } => (RECEIVE << KIND_SHIFT) | u64::from(flow),
            UserData::Send { slot, flow, output } => send_bits(slot, flow, output),
            UserData::GsoSend {
                record,
                flow,
                output,
            } => GSO_FLAG | send_bits(record, flow, output),
            UserData::Cancel => CANCEL << KIND_SHIFT,
        }
    }

    /// `None` for a value this worker never submitted.
    pub fn decode(v: u64) -> Option<Self> {
        let low32 = |x: u64| u32::try_from(x & 0xffff_ffff).ok();
        match v >> KIND_SHIFT {
            RECEIVE => Some(UserData::Receive { flow: low32(v)? }),
            SEND => {
                let index = low32(v >> 16)?;
                let flow = u16::try_from((v >> FLOW_SHIFT) & (MAX_FLOWS as u64 - 1)).ok()?;
                let output = u16::try_from(v & 0xffff).ok()?;
                Some(if v & GSO_FLAG != 0 {
                    UserData::GsoSend {
                        record: index,
                        flow,
                        output,
                    }
                } else {
                    UserData::Send {
                        slot: index,
                        flow,
                        output,
                    }
                })
            }
            CANCEL => Some(UserData::Cancel),
            _ => None,
        }
    }
}

/// The bits of a send: flow numbers above [`MAX_FLOWS`] are masked off
/// (the worker never has that many).
fn send_bits(index: u32, flow: u16, output: u16) -> u64 {
    (SEND << KIND_SHIFT)
        | ((u64::from(flow) & (MAX_FLOWS as u64 - 1)) << FLOW_SHIFT)
        | (u64::from(index) << 16)
        | u64::from(output)
}

/// Queue SQEs, submitting first when the submission queue is full.
pub trait Submit {
    /// Queue `entry`; `false` if the queue stayed full even after a submit
    /// (the caller drops and counts the work).
    ///
    /// The caller guarantees that every buffer `entry` points to stays
    /// valid and unmoved until its completion is reaped, and that every fd
    /// it names stays open as long: the worker keeps payloads in pool
    /// buffers parked in its in-flight table until the completion arrives,
    /// receive buffers in its provided ring, and its sockets for its whole
    /// life, and tears the ring down first.
    fn push(&mut self, entry: &squeue::Entry) -> bool;
}

impl Submit for IoUring {
    fn push(&mut self, entry: &squeue::Entry) -> bool {
        for _ in 0..2 {
            // SAFETY: the validity of everything the entry points to until
            // its completion is the caller's contract, stated on the trait.
            if unsafe { self.submission().push(entry) }.is_ok() {
                return true;
            }
            // Full: hand the queued entries to the kernel without waiting.
            if self.submit().is_err() {
                return false;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips() {
        for u in [
            UserData::Receive { flow: 0 },
            UserData::Receive { flow: 65_534 },
            UserData::Send {
                slot: 0,
                flow: 0,
                output: 0,
            },
            UserData::Send {
                slot: 3_000_000,
                flow: 8191,
                output: 65_534,
            },
            UserData::Send {
                slot: u32::MAX,
                flow: 17,
                output: 7,
            },
            UserData::GsoSend {
                record: 0,
                flow: 0,
                output: 0,
            },
            UserData::GsoSend {
                record: u32::MAX,
                flow: 8191,
                output: 65_535,
            },
            UserData::Cancel,
        ] {
            assert_eq!(UserData::decode(u.encode()), Some(u));
        }
        assert_eq!(UserData::decode(0), None);
        assert_eq!(UserData::decode(u64::MAX >> 2), None);
    }
}
