//! An input's 2022-1 FEC decoder. Every media packet of the leg is copied
//! into a window of the last [`WINDOW`] sequence numbers; a FEC packet
//! whose group (`SNBase + i × offset`, `i < NA`) misses exactly one
//! packet repairs it from the others by XOR, and the repaired packet
//! goes on like a received one. A FEC packet missing two or more waits
//! until a repair by the other direction, or a media packet read after
//! it, leaves it one short: that is how 2-D FEC repairs a burst a single
//! direction can't. At most [`PENDING`] wait: one whose group left the
//! window is released, and when all are taken the one whose group ends
//! furthest behind is evicted. `L` and `D` come from each FEC packet's
//! header, so the decoder needs no configuration.
//!
//! Nothing is invented: a packet is repaired only from a group whose
//! other members are all in the window (so belong to the current
//! stream), with the stream's SSRC and the sequence number the group
//! names; a repaired packet that arrives after all is a duplicate
//! (counted, dropped).
//!
//! Nor is anything repaired that may still arrive: a FEC packet whose
//! one missing member is not yet behind the newest *media* packet read
//! waits (`deferred`) until a media packet past it is read. FEC and
//! media come on different sockets, and the driver may read a FEC
//! datagram before the media datagrams sent just before it (ffmpeg even
//! sends a group's FEC before its last member): repairing then rebuilt a
//! packet whose original was still queued on the media socket, so
//! `recovered` overstated what FEC saved (a CI run counted 20 repairs
//! for 13 losses on the wire, 6 of them then dropped as duplicates).
//! One socket's datagrams are read in the order they came, so once a
//! later media number was read the original is not queued behind it:
//! only reordering on the path can still bring it (then a duplicate, as
//! before). The cost: a lost packet that is the newest of the stream
//! waits for the next media packet (one packet interval) to be repaired,
//! and a stream's very last packet, if lost, is not repaired while the
//! stream stays stopped. A packet leaving the window never received nor
//! repaired is counted as `unrecoverable`. An SSRC change or a jump of a
//! window or more starts the window afresh.
//!
//! Memory, allocated once per FEC input: [`WINDOW`] × [`MAX_MEDIA`]
//! (754 KB) for the window and [`PENDING`] × [`MAX_RECOVERY`] (93 KB) for
//! waiting FEC packets.

use super::header::{self, FecHeader, RTP_HEADER};
use super::{Direction, MAX_MEDIA, MAX_RECOVERY, xor_into};

/// Sequence numbers the window holds: more than twice the largest
/// 2022-1 matrix (100), so a column packet sent a whole matrix late still
/// finds its group.
pub const WINDOW: usize = 512;
/// FEC packets waiting for a second repair.
pub const PENDING: usize = 64;

const WINDOW_U16: u16 = 512;
/// Further behind than this is a restart, not a late packet.
const LATE: u16 = 3000;

/// What to do with a media packet after the decoder has seen it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaVerdict {
    /// Relay it.
    Forward,
    /// Already repaired and relayed: drop it (counted).
    Duplicate,
}

/// The decoder's counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FecStats {
    /// Packets repaired.
    pub recovered: u64,
    /// Packets that left the window neither received nor repaired.
    pub unrecoverable: u64,
    /// Column and row FEC packets taken.
    pub fec_columns: u64,
    pub fec_rows: u64,
    /// Datagrams on a FEC port that are not 2022-1 XOR FEC within its
    /// limits, or whose recovery fields contradict the group.
    pub fec_rejected: u64,
    /// Media packets that arrived after being repaired (dropped).
    pub duplicates: u64,
    /// Media packets too long to protect.
    pub unprotected: u64,
    /// FEC packets that found their one missing member not yet behind
    /// the newest media packet (it may still be queued on the media
    /// socket) and waited for a later media packet instead of repairing.
    pub deferred: u64,
    /// Times the window started afresh (SSRC change, jump).
    pub resets: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Empty,
    Received,
    Recovered,
    /// Arrived, but too long to keep: repairs nothing.
    Oversize,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    seq: u16,
    state: State,
    len: u16,
}

/// Where a sequence number stands against the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Present,
    Oversize,
    Missing,
    /// Before the window or the stream's start, or too far ahead.
    Gone,
}

/// What a FEC packet did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Nothing to repair or nothing it can ever repair: drop it.
    Done,
    /// Repaired this sequence number.
    Recovered(u16),
    /// Two members or more missing: keep it.
    Waiting,
    /// One member missing, not yet behind the newest media packet read
    /// (it may still arrive): keep it until a later media packet is.
    Early,
}

#[derive(Debug)]
struct Window {
    slots: Box<[Slot]>,
    data: Box<[u8]>,
    highest: Option<u16>,
    /// The newest media number read (not repaired) since the window
    /// (re)started: only numbers behind it are repaired.
    media_top: Option<u16>,
    /// Sequence numbers covered since the window (re)started.
    covered: u64,
    ssrc: u32,
    scratch: Box<[u8]>,
}

impl Window {
    fn new() -> Self {
        Self {
            slots: vec![
                Slot {
                    seq: 0,
                    state: State::Empty,
                    len: 0
                };
                WINDOW
            ]
            .into_boxed_slice(),
            data: vec![0; WINDOW * MAX_MEDIA].into_boxed_slice(),
            highest: None,
            media_top: None,
            covered: 0,
            ssrc: 0,
            scratch: vec![0; MAX_RECOVERY].into_boxed_slice(),
        }
    }

    fn reset(&mut self) {
        for s in self.slots.iter_mut() {
            s.state = State::Empty;
        }
        self.highest = None;
        self.media_top = None;
        self.covered = 0;
    }

    /// A media packet numbered `seq` was read.
    fn saw_media(&mut self, seq: u16) {
        let newer = self
            .media_top
            .is_none_or(|top| (1..0x8000).contains(&seq.wrapping_sub(top)));
        if newer {
            self.media_top = Some(seq);
        }
    }

    /// Whether a media packet numbered after `seq` was read: then `seq`'s
    /// original is not queued on the media socket behind it.
    fn overtaken(&self, seq: u16) -> bool {
        self.media_top
            .is_some_and(|top| (1..0x8000).contains(&top.wrapping_sub(seq)))
    }

    #[inline]
    fn index(seq: u16) -> usize {
        usize::from(seq) % WINDOW
    }

    fn packet(&self, seq: u16) -> &[u8] {
        let i = Self::index(seq);
        let start = i * MAX_MEDIA;
        &self.data[start..start + usize::from(self.slots[i].len)]
    }

    fn place(&self, seq: u16) -> Place {
        let Some(h) = self.highest else {
            return Place::Gone;
        };
        let back = h.wrapping_sub(seq);
        if back < WINDOW_U16 {
            if u64::from(back) >= self.covered {
                // Before the first packet seen: its slot is free.
                return Place::Missing;
            }
            let s = self.slots[Self::index(seq)];
            return match s.state {
                State::Received | State::Recovered if s.seq == seq => Place::Present,
                State::Oversize if s.seq == seq => Place::Oversize,
                _ => Place::Missing,
            };
        }
        if seq.wrapping_sub(h) < WINDOW_U16 {
            Place::Missing
        } else {
            Place::Gone
        }
    }

    /// Whether every member of `h`'s group is behind the window.
    fn behind(&self, h: &FecHeader) -> bool {
        let last = h.member(h.na.saturating_sub(1));
        self.highest.is_some_and(|head| {
            let back = head.wrapping_sub(last);
            (WINDOW_U16..0x8000).contains(&back)
        })
    }

    /// Move the window's head to `seq` (ahead of it, by less than a
    /// window), counting what leaves unseen.
    fn advance(&mut self, seq: u16, stats: &mut FecStats) {
        let Some(h) = self.highest else {
            self.highest = Some(seq);
            self.covered = 1;
            let slot = &mut self.slots[Self::index(seq)];
            slot.state = State::Empty;
            return;
        };
        let mut s = h;
        while s != seq {
            s = s.wrapping_add(1);
            let slot = &mut self.slots[Self::index(s)];
            if self.covered >= WINDOW as u64 {
                let old = s.wrapping_sub(WINDOW_U16);
                let seen = slot.seq == old && slot.state != State::Empty;
                if !seen {
                    stats.unrecoverable += 1;
                }
            }
            slot.state = State::Empty;
            self.covered += 1;
        }
        self.highest = Some(seq);
    }

    /// Make room for `seq` (a media packet or a repair): `false` when it
    /// lies before the window.
    fn admit(&mut self, seq: u16, stats: &mut FecStats) -> bool {
        match self.highest {
            None => {
                self.advance(seq, stats);
                true
            }
            Some(h) => {
                let ahead = seq.wrapping_sub(h);
                if ahead == 0 {
                    true
                } else if ahead < WINDOW_U16 {
                    self.advance(seq, stats);
                    true
                } else if h.wrapping_sub(seq) < WINDOW_U16 {
                    // Behind the head: before the first packet seen, the
                    // window grows back to it (its slots are free).
                    let back = u64::from(h.wrapping_sub(seq));
                    self.covered = self.covered.max(back + 1);
                    true
                } else if h.wrapping_sub(seq) < LATE {
                    // Too late to keep (RFC 3550's `MAX_DROPOUT`).
                    false
                } else {
                    // A jump: a new window from here.
                    self.reset();
                    stats.resets += 1;
                    self.advance(seq, stats);
                    true
                }
            }
        }
    }

    /// Try the FEC packet `h` with recovery payload `payload`.
    fn try_recover(&mut self, h: &FecHeader, payload: &[u8], stats: &mut FecStats) -> Outcome {
        if self.highest.is_none() {
            // No media packet yet (the stream's first row lost, its row
            // FEC first to arrive): it waits for its group like one
            // missing two.
            return Outcome::Waiting;
        }
        let mut missing = None;
        for i in 0..h.na {
            let seq = h.member(i);
            match self.place(seq) {
                Place::Present => {}
                Place::Oversize | Place::Gone => return Outcome::Done,
                Place::Missing => {
                    if missing.is_some() {
                        return Outcome::Waiting;
                    }
                    missing = Some(seq);
                }
            }
        }
        let Some(lost) = missing else {
            return Outcome::Done;
        };
        if !self.overtaken(lost) {
            // It may still be queued on the media socket (see the module).
            return Outcome::Early;
        }
        if payload.len() > MAX_RECOVERY || usize::from(h.length_recovery) > MAX_RECOVERY {
            stats.fec_rejected += 1;
            return Outcome::Done;
        }
        let mut pxcc = h.pxcc_recovery;
        let mut marker = h.marker_recovery;
        let mut pt = h.pt_recovery;
        let mut ts = h.ts_recovery;
        let mut length = h.length_recovery;
        let mut longest = payload.len();
        self.scratch[..payload.len()].copy_from_slice(payload);
        self.scratch[payload.len()..].fill(0);
        for i in 0..h.na {
            let seq = h.member(i);
            if seq == lost {
                continue;
            }
            let i = Self::index(seq);
            let start = i * MAX_MEDIA;
            let p = &self.data[start..start + usize::from(self.slots[i].len)];
            // Kept packets are RTP (parsed on arrival): 12 bytes at least.
            let [b0, b1, _, _, t0, t1, t2, t3, ..] = *p else {
                return Outcome::Done;
            };
            pxcc ^= b0 & 0x3f;
            marker ^= b1 & 0x80;
            pt ^= b1 & 0x7f;
            ts ^= u32::from_be_bytes([t0, t1, t2, t3]);
            let body = &p[RTP_HEADER..];
            length ^= u16::try_from(body.len()).unwrap_or(u16::MAX);
            longest = longest.max(body.len());
            xor_into(&mut self.scratch, body);
        }
        let len = usize::from(length);
        // The FEC payload is as long as the group's longest payload: a
        // longer recovered length means the fields don't belong together.
        if len > payload.len() || longest > payload.len() {
            stats.fec_rejected += 1;
            return Outcome::Done;
        }
        if !self.admit(lost, stats) {
            return Outcome::Done;
        }
        let i = Self::index(lost);
        let start = i * MAX_MEDIA;
        let out = &mut self.data[start..start + RTP_HEADER + len];
        out[0] = 0x80 | (pxcc & 0x3f);
        out[1] = (marker & 0x80) | (pt & 0x7f);
        out[2..4].copy_from_slice(&lost.to_be_bytes());
        out[4..8].copy_from_slice(&ts.to_be_bytes());
        out[8..12].copy_from_slice(&self.ssrc.to_be_bytes());
        out[RTP_HEADER..].copy_from_slice(&self.scratch[..len]);
        self.slots[i] = Slot {
            seq: lost,
            state: State::Recovered,
            // At most MAX_MEDIA: fits.
            len: u16::try_from(RTP_HEADER + len).unwrap_or(0),
        };
        stats.recovered += 1;
        Outcome::Recovered(lost)
    }
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    header: FecHeader,
    len: u16,
    live: bool,
    /// Its one missing member was not yet behind the newest media packet
    /// ([`Outcome::Early`]): retried at each media packet, not only at
    /// its group's.
    early: bool,
}

/// One FEC input's decoder (both streams).
#[derive(Debug)]
pub struct FecDecoder {
    window: Window,
    pending: Box<[Waiting]>,
    pending_data: Box<[u8]>,
    /// How many of `pending` are live: a media packet retries them only
    /// when some are.
    live: usize,
    stats: FecStats,
}

impl Default for FecDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl FecDecoder {
    /// A decoder with its window and waiting room allocated.
    pub fn new() -> Self {
        let idle = Waiting {
            header: FecHeader {
                sn_base: 0,
                length_recovery: 0,
                pxcc_recovery: 0,
                marker_recovery: 0,
                pt_recovery: 0,
                ts_recovery: 0,
                direction: Direction::Row,
                offset: 1,
                na: 1,
            },
            len: 0,
            live: false,
            early: false,
        };
        Self {
            window: Window::new(),
            pending: vec![idle; PENDING].into_boxed_slice(),
            pending_data: vec![0; PENDING * MAX_RECOVERY].into_boxed_slice(),
            live: 0,
            stats: FecStats::default(),
        }
    }

    pub fn stats(&self) -> &FecStats {
        &self.stats
    }

    /// FEC packets waiting for a second repair.
    pub fn waiting(&self) -> usize {
        self.pending.iter().filter(|w| w.live).count()
    }

    /// A media packet of the leg arrived: keep a copy for repairs.
    /// `recovered` gets each packet the waiting FEC packets it completes
    /// repair: a FEC packet can be read before the last media packets of
    /// its group (they arrive on other sockets), and then it waits one
    /// short, not two. It also gets what the FEC packets waiting for a
    /// media packet past their one missing member now repair (see the
    /// module).
    pub fn media(&mut self, packet: &[u8], mut recovered: impl FnMut(&[u8])) -> MediaVerdict {
        let Some(h) = mcrelay_wire::rtp::parse(packet) else {
            return MediaVerdict::Forward;
        };
        if self.window.highest.is_some() && h.ssrc != self.window.ssrc {
            self.window.reset();
            self.drop_pending();
            self.stats.resets += 1;
        }
        self.window.ssrc = h.ssrc;
        let seq = h.sequence;
        if !self.window.admit(seq, &mut self.stats) {
            return MediaVerdict::Forward;
        }
        self.window.saw_media(seq);
        let i = Window::index(seq);
        let slot = self.window.slots[i];
        if slot.seq == seq {
            match slot.state {
                State::Recovered => {
                    self.stats.duplicates += 1;
                    return MediaVerdict::Duplicate;
                }
                State::Received | State::Oversize => return MediaVerdict::Forward,
                State::Empty => {}
            }
        }
        if packet.len() > MAX_MEDIA {
            self.stats.unprotected += 1;
            self.window.slots[i] = Slot {
                seq,
                state: State::Oversize,
                len: 0,
            };
            return MediaVerdict::Forward;
        }
        let start = i * MAX_MEDIA;
        self.window.data[start..start + packet.len()].copy_from_slice(packet);
        self.window.slots[i] = Slot {
            seq,
            state: State::Received,
            len: u16::try_from(packet.len()).unwrap_or(0),
        };
        if self.live > 0 {
            self.chain(seq, &mut recovered);
        }
        MediaVerdict::Forward
    }

    /// A datagram arrived on a FEC port: `recovered` gets each packet it
    /// repairs, directly or by the waiting FEC packets it unblocks.
    pub fn repair(&mut self, datagram: &[u8], mut recovered: impl FnMut(&[u8])) {
        let (h, payload) = match header::parse(datagram) {
            Ok(x) => x,
            Err(_) => {
                self.stats.fec_rejected += 1;
                return;
            }
        };
        match h.direction {
            Direction::Column => self.stats.fec_columns += 1,
            Direction::Row => self.stats.fec_rows += 1,
        }
        match self.window.try_recover(&h, payload, &mut self.stats) {
            Outcome::Done => {}
            Outcome::Waiting => self.keep(h, payload, false),
            Outcome::Early => {
                self.stats.deferred += 1;
                self.keep(h, payload, true);
            }
            Outcome::Recovered(seq) => {
                recovered(self.window.packet(seq));
                self.chain(seq, &mut recovered);
            }
        }
    }

    /// Retry the waiting FEC packets each repair (or the media packet
    /// `first`) touches, and those waiting for a media packet past their
    /// missing member ([`Outcome::Early`]), until none repairs more.
    fn chain(&mut self, first: u16, recovered: &mut impl FnMut(&[u8])) {
        let mut stack = [0u16; PENDING + 1];
        stack[0] = first;
        let mut top = 1;
        while top > 0 {
            top -= 1;
            let seq = stack[top];
            for j in 0..PENDING {
                let w = self.pending[j];
                if !w.live {
                    continue;
                }
                if self.window.behind(&w.header) {
                    // Its group left the window: it can repair nothing.
                    self.release(j);
                    continue;
                }
                if !w.early && w.header.position(seq).is_none() {
                    continue;
                }
                let start = j * MAX_RECOVERY;
                let payload = &self.pending_data[start..start + usize::from(w.len)];
                match self.window.try_recover(&w.header, payload, &mut self.stats) {
                    Outcome::Waiting => self.pending[j].early = false,
                    Outcome::Early => {
                        if !w.early {
                            self.stats.deferred += 1;
                        }
                        self.pending[j].early = true;
                    }
                    Outcome::Done => self.release(j),
                    Outcome::Recovered(r) => {
                        self.release(j);
                        recovered(self.window.packet(r));
                        // Each repair frees a waiting packet: at most
                        // PENDING pushes after the first.
                        if top < stack.len() {
                            stack[top] = r;
                            top += 1;
                        }
                    }
                }
            }
        }
    }

    fn keep(&mut self, h: FecHeader, payload: &[u8], early: bool) {
        if payload.len() > MAX_RECOVERY {
            self.stats.fec_rejected += 1;
            return;
        }
        let j = match self.pending.iter().position(|w| !w.live) {
            Some(j) => {
                self.live += 1;
                j
            }
            // Full: the one whose group is furthest behind goes.
            None => self.oldest(),
        };
        let start = j * MAX_RECOVERY;
        self.pending_data[start..start + payload.len()].copy_from_slice(payload);
        self.pending[j] = Waiting {
            header: h,
            len: u16::try_from(payload.len()).unwrap_or(0),
            live: true,
            early,
        };
    }

    /// The waiting FEC packet whose group ends furthest behind the
    /// window's head.
    fn oldest(&self) -> usize {
        let head = self.window.highest.unwrap_or(0);
        let back = |w: &Waiting| {
            let b = head.wrapping_sub(w.header.member(w.header.na.saturating_sub(1)));
            // Ahead of the head: the youngest.
            if b < 0x8000 {
                i32::from(b)
            } else {
                i32::from(b) - 0x1_0000
            }
        };
        (0..PENDING)
            .max_by_key(|&j| back(&self.pending[j]))
            .unwrap_or(0)
    }

    fn release(&mut self, j: usize) {
        if self.pending[j].live {
            self.pending[j].live = false;
            self.live -= 1;
        }
    }

    fn drop_pending(&mut self) {
        for w in self.pending.iter_mut() {
            w.live = false;
        }
        self.live = 0;
    }
}
