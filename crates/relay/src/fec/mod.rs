//! SMPTE 2022-1 forward error correction (Pro-MPEG COP3): XOR parity over
//! an `L × D` matrix of RTP packets, sent as two extra RTP streams beside
//! the media (columns to port + 2, rows to port + 4).
//!
//! - [`header`]: the FEC packet's wire format, parsed and written;
//! - [`encode`]: [`FecEncoder`], an output's column and row parity,
//!   emitted as each column and row completes;
//! - [`decode`]: [`FecDecoder`], an input's window of recent media and
//!   the FEC packets still waiting, repairing single losses per row or
//!   column and chaining them (a row repair completes a column and back).
//!
//! Both are pure (no sockets, no clock) and allocate only when built: the
//! packet path copies into their preallocated slabs.
#![forbid(unsafe_code)]

pub mod decode;
pub mod encode;
pub mod header;

pub use decode::{FecDecoder, FecStats, MediaVerdict};
pub use encode::{FecEncoder, FecLayout};
pub use header::Direction;

/// The longest media datagram FEC protects (RTP header and payload): an
/// Ethernet MTU's UDP payload. Longer ones are relayed unprotected.
pub const MAX_MEDIA: usize = 1472;

/// The payload bytes (after the 12-byte RTP header) a FEC packet's XOR
/// covers at most.
pub const MAX_RECOVERY: usize = MAX_MEDIA - header::RTP_HEADER;

/// `acc ^= src` over `src`'s length (`acc` at least as long).
#[inline]
fn xor_into(acc: &mut [u8], src: &[u8]) {
    for (a, b) in acc.iter_mut().zip(src) {
        *a ^= *b;
    }
}

#[cfg(test)]
mod tests;
