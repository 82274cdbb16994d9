//! The one place an SQE reaches the kernel ([`push`], an `unsafe fn`:
//! what it points to must outlive the request), the sends built from the
//! core's in-flight slots (which read the buffer addresses themselves), and
//! the encoding of what each completion belongs to.
//!
//! Every send carries `MSG_DONTWAIT`: a send that finds its socket full
//! completes at once with `EAGAIN`, counted as the output's send error,
//! and the datagrams behind it go on in order. Without it io_uring parks
//! such a send on the socket's wait queue and retries the parked sends
//! newest first when room comes (the queue wakes its last waiter first):
//! an output that filled for a moment, such as an SRT output whose thread
//! was not scheduled, came out with those datagrams in reverse order.
#![allow(unsafe_code)]

use io_uring::types::Fd;
use io_uring::{IoUring, opcode, squeue};

use crate::egress::GsoMessages;
use mcrelay_relay::{FlowId, InFlight, LegId, OutputId, SendToken, Slot};

/// What a completion is for, packed into the SQE's `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserData {
    /// A receive (or a packet ring's poll) of leg `leg` of flow `flow`.
    Receive { flow: FlowId, leg: LegId },
    /// A send of the buffer parked in in-flight `slot` on output `output`
    /// of flow `flow`.
    Send {
        slot: Slot,
        flow: FlowId,
        output: OutputId,
    },
    /// A UDP GSO send of the datagrams of GSO run `record` on output
    /// `output` of flow `flow`.
    GsoSend {
        record: u32,
        flow: FlowId,
        output: OutputId,
    },
    /// A cancellation request (its own completion carries nothing).
    Cancel,
    /// The poll of the worker's wake-up eventfd: commands are queued.
    Wake,
}

/// `MSG_DONTWAIT` as `SendMsg` takes it (see the module's paragraph).
const DONT_WAIT: u32 = libc::MSG_DONTWAIT.unsigned_abs();

const KIND_SHIFT: u32 = 62;
/// Receives: flow in bits 0..13, the receiving socket (a leg or a leg's
/// FEC stream) in 16..20.
const LEG_SHIFT: u32 = 16;
const LEG_MASK: u64 = LegId::MAX_RECEIVERS as u64 - 1;
/// Sends: output in bits 0..16, slot or record in 16..48, flow in 48..61.
const FLOW_SHIFT: u32 = 48;
const FLOW_MASK: u64 = FlowId::LIMIT as u64 - 1;
const RECEIVE: u64 = 1;
const SEND: u64 = 2;
const CANCEL: u64 = 3;
/// Kind 0 holds one value: the wake-up poll.
const WAKE: u64 = 0x5741_4b45;
/// Set in a send's value when it is a GSO send.
const GSO_FLAG: u64 = 1 << 61;

impl From<SendToken> for UserData {
    fn from(t: SendToken) -> Self {
        match t {
            SendToken::Plain { slot, flow, output } => UserData::Send { slot, flow, output },
            SendToken::Gso {
                record,
                flow,
                output,
            } => UserData::GsoSend {
                record,
                flow,
                output,
            },
        }
    }
}

impl UserData {
    pub fn encode(self) -> u64 {
        match self {
            UserData::Receive { flow, leg } => {
                (RECEIVE << KIND_SHIFT)
                    | ((u64::from(leg.0) & LEG_MASK) << LEG_SHIFT)
                    | u64::from(flow.get())
            }
            UserData::Send { slot, flow, output } => send_bits(slot, flow, output),
            UserData::GsoSend {
                record,
                flow,
                output,
            } => GSO_FLAG | send_bits(record, flow, output),
            UserData::Cancel => CANCEL << KIND_SHIFT,
            UserData::Wake => WAKE,
        }
    }

    /// `None` for a value this worker never submitted.
    pub fn decode(v: u64) -> Option<Self> {
        let flow_at = |shift: u32| FlowId::new(usize::try_from((v >> shift) & FLOW_MASK).ok()?);
        match v >> KIND_SHIFT {
            RECEIVE if v & ((1 << KIND_SHIFT) - 1) & !(LEG_MASK << LEG_SHIFT) <= FLOW_MASK => {
                Some(UserData::Receive {
                    flow: flow_at(0)?,
                    leg: LegId(u8::try_from((v >> LEG_SHIFT) & LEG_MASK).ok()?),
                })
            }
            SEND => {
                let index = u32::try_from((v >> 16) & 0xffff_ffff).ok()?;
                let flow = flow_at(FLOW_SHIFT)?;
                let output = OutputId(u16::try_from(v & 0xffff).ok()?);
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
            0 if v == WAKE => Some(UserData::Wake),
            _ => None,
        }
    }

    /// The core's token of a send completion.
    pub fn token(self) -> Option<SendToken> {
        match self {
            UserData::Send { slot, flow, output } => Some(SendToken::Plain { slot, flow, output }),
            UserData::GsoSend {
                record,
                flow,
                output,
            } => Some(SendToken::Gso {
                record,
                flow,
                output,
            }),
            UserData::Receive { .. } | UserData::Cancel | UserData::Wake => None,
        }
    }
}

fn send_bits(index: u32, flow: FlowId, output: OutputId) -> u64 {
    (SEND << KIND_SHIFT)
        | ((u64::from(flow.get()) & FLOW_MASK) << FLOW_SHIFT)
        | (u64::from(index) << 16)
        | u64::from(output.0)
}

/// Queue `entry`, submitting first when the submission queue is full;
/// `false` if it stayed full even after a submit (the caller drops and
/// counts the work).
///
/// # Safety
///
/// Every buffer `entry` points to must stay valid and unmoved, and every
/// fd it names open, until its completion is reaped (or the io_uring is
/// torn down first). The worker keeps payloads in pool buffers parked in
/// the core's in-flight table until their completion, GSO messages in
/// [`GsoMessages`] at their run's record until then, receive buffers in
/// its [`ReceiveBuffers`](crate::receive_buffers::ReceiveBuffers), and its
/// sockets until a removed flow is quiet; it drops the io_uring first.
pub unsafe fn push(uring: &mut IoUring, entry: &squeue::Entry) -> bool {
    for _ in 0..2 {
        // SAFETY: what the entry points to outlives the request: this
        // function's contract, passed on.
        if unsafe { uring.submission().push(entry) }.is_ok() {
            return true;
        }
        // Full: hand the queued entries to the kernel without waiting.
        if uring.submit().is_err() {
            return false;
        }
    }
    false
}

/// Queue a send of the buffer in in-flight `slot` on socket `fd`, reading
/// its address from the table; `false` if not queued (unknown slot, or the
/// submission queue stayed full).
///
/// # Safety
///
/// The buffer must stay parked in `in_flight` (the pool not dropped) and
/// `fd` open until this send's completion is reaped: the core releases a
/// slot only on the completion of a send naming it, or when this returns
/// `false`.
pub unsafe fn push_send(
    uring: &mut IoUring,
    fd: i32,
    in_flight: &InFlight,
    slot: Slot,
    user_data: UserData,
) -> bool {
    let Some(buf) = in_flight.buffer(slot) else {
        return false;
    };
    let len = u32::try_from(buf.len()).unwrap_or(0);
    let entry = opcode::Send::new(Fd(fd), buf.as_ptr(), len)
        .flags(libc::MSG_DONTWAIT)
        .build()
        .user_data(user_data.encode());
    // SAFETY: the buffer and fd outlive the send: this function's contract.
    unsafe { push(uring, &entry) }
}

/// The written bytes of the buffer parked in in-flight `slot`, for a send
/// that copies them rather than handing the kernel their address (an
/// `egress = "xdp"` output writes them into a UMEM frame). `None` for an
/// empty slot.
pub fn in_flight_bytes(in_flight: &InFlight, slot: Slot) -> Option<&[u8]> {
    let buf = in_flight.buffer(slot)?;
    // SAFETY: a parked buffer's memory lies in the worker's pool set, which
    // outlives `in_flight`'s borrow; its first `len()` bytes were written
    // when it was filled, and nothing writes them while it is parked (a
    // write needs the buffer itself, which `in_flight` holds and lends
    // only shared here).
    Some(unsafe { std::slice::from_raw_parts(buf.as_ptr(), buf.len()) })
}

/// Queue a UDP GSO send of the buffers in in-flight `slots` on socket
/// `fd`, built in `msgs` at `record`; `false` if not queued.
///
/// # Safety
///
/// As [`push_send`] for every slot, and `msgs` must not be dropped, nor
/// `record` refilled, until this send's completion is reaped (the core
/// hands a record out again only after finishing it).
pub unsafe fn push_gso(
    uring: &mut IoUring,
    fd: i32,
    msgs: &mut GsoMessages,
    (record, segment_size, slots): (u32, u16, &[Slot]),
    in_flight: &InFlight,
    user_data: UserData,
) -> bool {
    let Some(msg) = msgs.fill(record, segment_size, slots, in_flight) else {
        return false;
    };
    let entry = opcode::SendMsg::new(Fd(fd), msg)
        .flags(DONT_WAIT)
        .build()
        .user_data(user_data.encode());
    // SAFETY: the message, its buffers and the fd outlive the send: this
    // function's contract.
    unsafe { push(uring, &entry) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(n: usize) -> FlowId {
        FlowId::new(n).expect("in range")
    }

    #[test]
    fn user_data_round_trips() {
        for u in [
            UserData::Receive {
                flow: flow(0),
                leg: LegId(0),
            },
            UserData::Receive {
                flow: flow(8191),
                leg: LegId(3),
            },
            UserData::Receive {
                flow: flow(7),
                leg: LegId(1),
            },
            UserData::Send {
                slot: 0,
                flow: flow(0),
                output: OutputId(0),
            },
            UserData::Send {
                slot: 3_000_000,
                flow: flow(8191),
                output: OutputId(65_534),
            },
            UserData::Send {
                slot: u32::MAX,
                flow: flow(17),
                output: OutputId(7),
            },
            UserData::GsoSend {
                record: 0,
                flow: flow(0),
                output: OutputId(0),
            },
            UserData::GsoSend {
                record: u32::MAX,
                flow: flow(8191),
                output: OutputId(65_535),
            },
            UserData::Cancel,
            UserData::Wake,
        ] {
            assert_eq!(UserData::decode(u.encode()), Some(u));
            if let Some(t) = u.token() {
                assert_eq!(UserData::from(t), u);
            }
        }
        assert_eq!(UserData::decode(0), None);
        assert_eq!(UserData::decode(u64::MAX >> 2), None);
        assert_eq!(
            UserData::decode((1 << 62) | 8192),
            None,
            "flow out of range"
        );
        assert!(FlowId::new(8192).is_none());
    }

    #[test]
    fn the_cores_errno_values_are_linuxs() {
        use mcrelay_relay::errno;
        assert_eq!(errno::EIO, libc::EIO);
        assert_eq!(errno::EINVAL, libc::EINVAL);
        assert_eq!(errno::EMSGSIZE, libc::EMSGSIZE);
        assert_eq!(errno::ENOPROTOOPT, libc::ENOPROTOOPT);
        assert_eq!(errno::EOPNOTSUPP, libc::EOPNOTSUPP);
    }
}
