//! Property tests of the request path: arbitrary bytes never panic, and
//! encoded requests survive any split into reads.

use mcrelay_control::{
    LineEvent, LineReader, MAX_REQUEST_BYTES, Request, encode_request, fuzz_request, parse_request,
};
use proptest::prelude::*;

fn request() -> impl Strategy<Value = Request> {
    proptest::sample::select(Request::ALL.to_vec())
}

/// Bytes that look like requests often enough to reach past the JSON
/// parser: fragments of valid lines mixed with noise.
fn request_like() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"{\"v\":1,\"cmd\":\"status\"}\n".to_vec()),
        Just(b"{\"v\":".to_vec()),
        Just(b"\"cmd\":".to_vec()),
        Just(b"\"reload\"".to_vec()),
        Just(b"}\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(vec![b'x'; MAX_REQUEST_BYTES]),
        "[0-9]{1,30}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..16),
    ];
    proptest::collection::vec(token, 0..24).prop_map(|t| t.concat())
}

proptest! {
    #[test]
    fn fuzz_request_never_panics(data in proptest::collection::vec(any::<u8>(), 0..6000)) {
        fuzz_request(&data);
    }

    #[test]
    fn fuzz_request_never_panics_on_request_like_bytes(data in request_like()) {
        fuzz_request(&data);
    }

    #[test]
    fn encoded_requests_parse_back_across_any_split(
        requests in proptest::collection::vec(request(), 0..20),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..10),
    ) {
        let stream: String = requests.iter().map(encode_request).collect();
        let bytes = stream.as_bytes();
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort_unstable();

        let mut reader = LineReader::new();
        let capacity = reader.capacity();
        let mut parsed = Vec::new();
        for pair in cuts.windows(2) {
            reader.feed(&bytes[pair[0]..pair[1]], |e| match e {
                LineEvent::Line(l) => parsed.push(parse_request(l).ok()),
                LineEvent::TooLong => parsed.push(None),
            });
        }
        prop_assert_eq!(reader.pending(), 0);
        prop_assert_eq!(reader.capacity(), capacity);
        let expected: Vec<Option<Request>> = requests.into_iter().map(Some).collect();
        prop_assert_eq!(parsed, expected);
    }

    #[test]
    fn reader_never_holds_more_than_the_limit(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 0..20),
    ) {
        let mut reader = LineReader::new();
        let capacity = reader.capacity();
        for chunk in &chunks {
            reader.feed(chunk, |e| {
                if let LineEvent::Line(l) = e {
                    assert!(l.len() <= MAX_REQUEST_BYTES);
                    assert!(!l.contains(&b'\n'));
                }
            });
            prop_assert!(reader.pending() <= MAX_REQUEST_BYTES);
            prop_assert_eq!(reader.capacity(), capacity);
        }
    }
}
