//! RIST simple profile (VSF TR-06-1): RTP with retransmission asked for
//! by RTCP NACKs, the media on an even port P and RTCP on P + 1.
//!
//! - [`rtcp`]: the RTCP packets RIST uses (SR, RR, SDES, generic and
//!   range NACK), read and written without allocating;
//! - [`sender`]: [`RistSender`], an output's buffer of sent datagrams,
//!   the NACKs it answers with retransmissions, its sender reports and
//!   the RTT from the receivers' reports;
//! - [`receiver`]: [`RistReceiver`], an input's gap detection, NACK
//!   timing, reorder/recovery buffer and in-order delivery.
//!
//! Both are sans-I/O state machines in the style of quinn-proto: the
//! driver hands them datagrams and the time, and sends what they write.
//! They allocate only when built.
#![forbid(unsafe_code)]

pub mod receiver;
pub mod rtcp;
pub mod sender;

pub use receiver::{ReceiverStats, RistReceiver, Verdict};
pub use sender::{RistSender, SenderStats};

/// The longest datagram kept for retransmission or reordering (an
/// Ethernet MTU's UDP payload); longer ones pass unprotected.
pub const MAX_DATAGRAM: usize = 1472;

/// `buffer_ms` when the config names none.
pub const DEFAULT_BUFFER_MS: u32 = 1000;

/// The datagram rate a buffer is sized for: 4 per millisecond (4000/s,
/// about 42 Mb/s of 7 × 188-byte TS datagrams). A faster stream keeps
/// less than `buffer_ms`: the ring holds [`slots_for`] datagrams.
pub const DATAGRAMS_PER_MS: u32 = 4;

/// The ring's slots for `buffer_ms`: a power of two holding at least
/// `buffer_ms` × [`DATAGRAMS_PER_MS`] datagrams, 64 to 32768 (a sequence
/// number's half range stays beyond it, so old and new never mix).
pub fn slots_for(buffer_ms: u32) -> usize {
    let want = usize::try_from(buffer_ms.saturating_mul(DATAGRAMS_PER_MS)).unwrap_or(usize::MAX);
    want.clamp(64, 32_768).next_power_of_two()
}

#[cfg(test)]
mod tests;
