//! Line framing for a non-blocking control socket.
//!
//! The daemon reads whatever bytes a client has sent and feeds them to the
//! connection's [`LineReader`], which hands back each complete line. Its
//! buffer holds one request ([`MAX_REQUEST_BYTES`]) and is allocated once;
//! a line that would not fit is reported once as [`LineEvent::TooLong`] and
//! the rest of it is thrown away as it arrives, so a client can neither make
//! the daemon allocate nor make it wait for a newline.

use crate::protocol::MAX_REQUEST_BYTES;

/// What [`LineReader::feed`] found in the bytes it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineEvent<'a> {
    /// A complete line without its `\n` (a `\r` before it is removed too).
    /// May be empty.
    Line(&'a [u8]),
    /// A line exceeded [`MAX_REQUEST_BYTES`]. Reported once per such line;
    /// the reader then discards bytes up to and including its newline.
    TooLong,
}

/// Splits a byte stream into lines of at most [`MAX_REQUEST_BYTES`] bytes,
/// one chunk at a time. One per connection.
#[derive(Debug)]
pub struct LineReader {
    /// The start of a line whose newline has not arrived yet. Its capacity
    /// is fixed at [`MAX_REQUEST_BYTES`]: nothing is pushed past it.
    partial: Vec<u8>,
    /// Inside a line already reported as too long: drop bytes until `\n`.
    discarding: bool,
}

impl Default for LineReader {
    fn default() -> Self {
        Self::new()
    }
}

impl LineReader {
    /// A reader with its buffer allocated; it never allocates again.
    pub fn new() -> Self {
        Self {
            partial: Vec::with_capacity(MAX_REQUEST_BYTES),
            discarding: false,
        }
    }

    /// Feeds the next chunk received from the socket; calls `out` for every
    /// line completed by it and for every line found too long, in order.
    ///
    /// A line that arrives whole within one chunk is handed out straight from
    /// `bytes`, without a copy.
    pub fn feed(&mut self, mut bytes: &[u8], mut out: impl FnMut(LineEvent<'_>)) {
        while !bytes.is_empty() {
            let Some(newline) = bytes.iter().position(|&b| b == b'\n') else {
                self.hold(bytes, &mut out);
                return;
            };
            let (head, rest) = bytes.split_at(newline);
            bytes = &rest[1..];
            if self.discarding {
                self.discarding = false;
            } else if self.partial.len() + head.len() > MAX_REQUEST_BYTES {
                self.partial.clear();
                out(LineEvent::TooLong);
            } else if self.partial.is_empty() {
                out(LineEvent::Line(strip_cr(head)));
            } else {
                self.partial.extend_from_slice(head);
                out(LineEvent::Line(strip_cr(&self.partial)));
                self.partial.clear();
            }
        }
    }

    /// The peer closed its side: hands out what is left of an unterminated
    /// last line (nothing if it is empty or was already reported too long)
    /// and resets the reader.
    pub fn finish(&mut self, mut out: impl FnMut(LineEvent<'_>)) {
        if !self.discarding && !self.partial.is_empty() {
            out(LineEvent::Line(strip_cr(&self.partial)));
        }
        self.partial.clear();
        self.discarding = false;
    }

    /// Bytes of an unfinished line held now.
    pub fn pending(&self) -> usize {
        self.partial.len()
    }

    /// The buffer's capacity: [`MAX_REQUEST_BYTES`] (or more, if the
    /// allocator rounded up), and never more than it was at construction.
    pub fn capacity(&self) -> usize {
        self.partial.capacity()
    }

    /// Whether the reader is dropping the rest of a line that was too long.
    pub fn is_discarding(&self) -> bool {
        self.discarding
    }

    /// Keeps `bytes`, which hold no newline, as part of the current line.
    fn hold(&mut self, bytes: &[u8], out: &mut impl FnMut(LineEvent<'_>)) {
        if self.discarding {
            return;
        }
        if self.partial.len() + bytes.len() > MAX_REQUEST_BYTES {
            self.partial.clear();
            self.discarding = true;
            out(LineEvent::TooLong);
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Owned copy of an event, to collect them.
    #[derive(Debug, PartialEq, Eq)]
    enum Event {
        Line(Vec<u8>),
        TooLong,
    }

    fn feed(reader: &mut LineReader, bytes: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        reader.feed(bytes, |e| {
            events.push(match e {
                LineEvent::Line(l) => Event::Line(l.to_vec()),
                LineEvent::TooLong => Event::TooLong,
            })
        });
        events
    }

    fn line(s: &str) -> Event {
        Event::Line(s.as_bytes().to_vec())
    }

    #[test]
    fn a_line_split_across_chunks_comes_out_whole() {
        let mut r = LineReader::new();
        assert!(feed(&mut r, b"{\"v\":1,").is_empty());
        assert_eq!(r.pending(), 7);
        assert!(feed(&mut r, b"\"cmd\":").is_empty());
        assert_eq!(feed(&mut r, b"\"status\"}\r"), vec![]);
        assert_eq!(
            feed(&mut r, b"\n"),
            vec![line("{\"v\":1,\"cmd\":\"status\"}")]
        );
        assert_eq!(r.pending(), 0);
    }

    #[test]
    fn several_lines_in_one_chunk() {
        let mut r = LineReader::new();
        assert_eq!(
            feed(&mut r, b"a\nbb\r\n\nccc\nd"),
            vec![line("a"), line("bb"), line(""), line("ccc")]
        );
        assert_eq!(feed(&mut r, b"d\n"), vec![line("dd")]);
    }

    #[test]
    fn one_byte_at_a_time() {
        let mut r = LineReader::new();
        let mut events = Vec::new();
        for b in b"ab\ncd\n" {
            events.extend(feed(&mut r, &[*b]));
        }
        assert_eq!(events, vec![line("ab"), line("cd")]);
    }

    #[test]
    fn a_megabyte_without_newline_is_one_too_long_then_recovers() {
        let mut r = LineReader::new();
        let capacity = r.capacity();
        assert!(capacity >= MAX_REQUEST_BYTES);
        let chunk = vec![b'x'; 1000];
        let mut events = Vec::new();
        for _ in 0..1000 {
            events.extend(feed(&mut r, &chunk));
            assert_eq!(r.capacity(), capacity);
            assert!(r.pending() <= MAX_REQUEST_BYTES);
        }
        assert_eq!(events, vec![Event::TooLong]);
        assert!(r.is_discarding());
        assert_eq!(feed(&mut r, b"yyy\nnext\n"), vec![line("next")]);
        assert!(!r.is_discarding());
        assert_eq!(r.capacity(), capacity);
    }

    #[test]
    fn a_too_long_line_inside_one_chunk() {
        let mut r = LineReader::new();
        let mut chunk = vec![b'x'; MAX_REQUEST_BYTES + 1];
        chunk.extend_from_slice(b"\nok\n");
        assert_eq!(feed(&mut r, &chunk), vec![Event::TooLong, line("ok")]);
        assert!(!r.is_discarding());
    }

    #[test]
    fn a_too_long_line_completed_by_its_newline() {
        let mut r = LineReader::new();
        assert!(feed(&mut r, &vec![b'x'; MAX_REQUEST_BYTES]).is_empty());
        assert_eq!(feed(&mut r, b"x\nok\n"), vec![Event::TooLong, line("ok")]);
    }

    #[test]
    fn a_line_of_exactly_the_limit_is_accepted() {
        let mut r = LineReader::new();
        let body = vec![b'x'; MAX_REQUEST_BYTES];
        assert!(feed(&mut r, &body[..10]).is_empty());
        let events = feed(&mut r, &[&body[10..], b"\n"].concat());
        assert_eq!(events, vec![Event::Line(body)]);
    }

    #[test]
    fn finish_hands_out_the_unterminated_tail() {
        let mut r = LineReader::new();
        assert!(feed(&mut r, b"a\nb").len() == 1);
        let mut tail = Vec::new();
        r.finish(|e| tail.push(format!("{e:?}")));
        assert_eq!(tail, vec![format!("{:?}", LineEvent::Line(b"b"))]);
        assert_eq!(r.pending(), 0);

        feed(&mut r, &vec![b'x'; MAX_REQUEST_BYTES + 1]);
        let mut calls = 0;
        r.finish(|_| calls += 1);
        assert_eq!(calls, 0);
        assert!(!r.is_discarding());
    }
}
