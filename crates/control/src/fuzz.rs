//! The fuzz entry point for everything that reads bytes from the control
//! socket.

use crate::framing::{LineEvent, LineReader};
use crate::protocol::{Response, encode_request, parse_request, parse_response};

/// Feeds arbitrary bytes through a [`LineReader`] and [`parse_request`] the
/// way the daemon does, and checks that what parses re-encodes to the same
/// request. Must never panic; a `cargo fuzz` target just calls it.
///
/// The first byte, if any, picks the chunk size the rest is fed in, so the
/// fuzzer also explores lines split across reads.
pub fn fuzz_request(data: &[u8]) {
    let (chunk, stream) = match data.split_first() {
        Some((&first, rest)) => (usize::from(first).max(1), rest),
        None => (1, data),
    };
    let mut reader = LineReader::new();
    let capacity = reader.capacity();
    for piece in stream.chunks(chunk) {
        reader.feed(piece, check_event);
    }
    reader.finish(check_event);
    assert_eq!(reader.capacity(), capacity, "LineReader grew its buffer");

    // The whole input as one line, and as a response (the client's side).
    check_line(stream);
    // (No round-trip check: serde_json's default float parsing may move
    // the last bit of a number, so only "no panic" is asserted.)
    if let Ok(response) = parse_response(stream) {
        let _ = parse_response(response.encode().as_bytes());
    }
}

fn check_event(event: LineEvent<'_>) {
    match event {
        LineEvent::Line(line) => check_line(line),
        LineEvent::TooLong => {
            let _ = Response::Error("request too long".into()).encode();
        }
    }
}

fn check_line(line: &[u8]) {
    match parse_request(line) {
        Ok(request) => {
            let again = parse_request(encode_request(&request).as_bytes());
            assert!(
                matches!(again, Ok(r) if r == request),
                "request did not round-trip"
            );
        }
        Err(e) => {
            let _ = Response::error(e).encode();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_inputs_do_not_panic() {
        fuzz_request(b"");
        fuzz_request(b"\x00");
        fuzz_request(b"\x01{\"v\":1,\"cmd\":\"status\"}\n\n\r\n");
        fuzz_request(&[0xff; 10_000]);
        fuzz_request(&[b'\n'; 100]);
    }
}
