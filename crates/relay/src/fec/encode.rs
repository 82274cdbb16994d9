//! An output's 2022-1 FEC encoder: the media packets, in the order the
//! output sends them, fill an `L × D` matrix row by row; a row's parity
//! leaves when its `L`-th packet has gone, a column's when its `D`-th
//! has (so the column packets of a matrix are spread over its last row,
//! not sent in one burst). Each stream has its own sequence numbers.
//!
//! A packet that is not RTP, longer than [`MAX_MEDIA`] or out of
//! sequence ends the current matrix unprotected (the parity of a matrix
//! with a hole would repair the wrong packet); the next matrix starts
//! with the packet that follows in sequence.

use super::header::{
    self, Direction, FEC_HEADER, FecHeader, MAX_DIMENSION, MAX_MATRIX, RTP_HEADER,
};
use super::{MAX_MEDIA, MAX_RECOVERY, xor_into};

/// An output's matrix: `columns` (`L`) by `rows` (`D`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FecLayout {
    /// `L`, 1 to 20.
    pub columns: u8,
    /// `D`, 0 to 20; 0 sends the row stream only (1-D over rows).
    pub rows: u8,
    /// Send the row stream (port + 4); off for column-only 1-D FEC.
    pub row_stream: bool,
}

impl FecLayout {
    /// Within 2022-1's limits (`L`, `D` ≤ 20, `L × D` ≤ 100), one stream
    /// at least, and no group of one packet (a copy, not parity): `D` is
    /// 0 or at least 2, a row stream needs `L` ≥ 2.
    pub fn is_valid(&self) -> bool {
        (1..=MAX_DIMENSION).contains(&self.columns)
            && self.rows <= MAX_DIMENSION
            && self.rows != 1
            && u16::from(self.columns) * u16::from(self.rows.max(1)) <= MAX_MATRIX
            && (self.rows > 0 || self.row_stream)
            && (!self.row_stream || self.columns >= 2)
    }
}

/// XOR accumulated over the packets of one row or column.
#[derive(Debug)]
struct Parity {
    sn_base: u16,
    pxcc: u8,
    marker: u8,
    pt: u8,
    ts: u32,
    length: u16,
    /// Bytes of `payload` in use (the longest payload so far).
    used: usize,
    payload: Box<[u8]>,
}

impl Parity {
    fn new() -> Self {
        Self {
            sn_base: 0,
            pxcc: 0,
            marker: 0,
            pt: 0,
            ts: 0,
            length: 0,
            used: 0,
            payload: vec![0; MAX_RECOVERY].into_boxed_slice(),
        }
    }

    fn start(&mut self, sn_base: u16) {
        self.sn_base = sn_base;
        self.pxcc = 0;
        self.marker = 0;
        self.pt = 0;
        self.ts = 0;
        self.length = 0;
        self.payload[..self.used].fill(0);
        self.used = 0;
    }

    /// XOR one media packet (RTP, at most [`MAX_MEDIA`] bytes) in.
    #[inline]
    fn add(&mut self, p: &[u8]) {
        let payload = &p[RTP_HEADER..];
        self.pxcc ^= p[0] & 0x3f;
        self.marker ^= p[1] & 0x80;
        self.pt ^= p[1] & 0x7f;
        self.ts ^= u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
        // At most MAX_RECOVERY: fits 16 bits.
        self.length ^= u16::try_from(payload.len()).unwrap_or(u16::MAX);
        xor_into(&mut self.payload, payload);
        self.used = self.used.max(payload.len());
    }

    /// Write the FEC packet into `out`; its length.
    fn write(
        &self,
        out: &mut [u8],
        direction: Direction,
        offset: u8,
        na: u8,
        seq: u16,
        ts: u32,
    ) -> usize {
        let h = FecHeader {
            sn_base: self.sn_base,
            length_recovery: self.length,
            pxcc_recovery: self.pxcc,
            marker_recovery: self.marker,
            pt_recovery: self.pt,
            ts_recovery: self.ts,
            direction,
            offset,
            na,
        };
        header::write(out, &h, seq, ts);
        let start = RTP_HEADER + FEC_HEADER;
        out[start..start + self.used].copy_from_slice(&self.payload[..self.used]);
        start + self.used
    }
}

/// Counters of an encoder (read by the core into the output's counters).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EncoderStats {
    /// Column packets sent.
    pub columns_sent: u64,
    /// Row packets sent.
    pub rows_sent: u64,
    /// Media packets left unprotected (not RTP, too long, or a matrix
    /// cut short by a sequence gap).
    pub unprotected: u64,
}

/// One output's column and row parity.
#[derive(Debug)]
pub struct FecEncoder {
    layout: FecLayout,
    /// The sequence number the matrix expects next; `None` between
    /// matrices.
    next: Option<u16>,
    /// Position of the next packet in the matrix (0 to `L × D − 1`).
    index: u16,
    columns: Box<[Parity]>,
    row: Parity,
    column_seq: u16,
    row_seq: u16,
    column_out: Box<[u8]>,
    column_len: usize,
    row_out: Box<[u8]>,
    row_len: usize,
    stats: EncoderStats,
}

/// The FEC packets one media packet completed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Completed {
    pub column: bool,
    pub row: bool,
}

impl Completed {
    /// The streams completed, columns first.
    pub fn iter(self) -> impl Iterator<Item = Direction> {
        [
            self.column.then_some(Direction::Column),
            self.row.then_some(Direction::Row),
        ]
        .into_iter()
        .flatten()
    }
}

impl FecEncoder {
    /// An encoder for `layout` (clamped into 2022-1's limits); allocates
    /// its parity (`L + 1` buffers of [`MAX_RECOVERY`] bytes) once.
    pub fn new(layout: FecLayout) -> Self {
        let columns = layout.columns.clamp(1, MAX_DIMENSION);
        let max_rows = u8::try_from(MAX_MATRIX / u16::from(columns)).unwrap_or(MAX_DIMENSION);
        let layout = FecLayout {
            columns,
            rows: layout.rows.min(MAX_DIMENSION).min(max_rows),
            row_stream: layout.row_stream || layout.rows == 0,
        };
        let n = if layout.rows > 0 {
            usize::from(columns)
        } else {
            0
        };
        Self {
            layout,
            next: None,
            index: 0,
            columns: (0..n).map(|_| Parity::new()).collect(),
            row: Parity::new(),
            column_seq: 0,
            row_seq: 0,
            column_out: vec![0; RTP_HEADER + FEC_HEADER + MAX_RECOVERY].into_boxed_slice(),
            column_len: 0,
            row_out: vec![0; RTP_HEADER + FEC_HEADER + MAX_RECOVERY].into_boxed_slice(),
            row_len: 0,
            stats: EncoderStats::default(),
        }
    }

    pub fn layout(&self) -> FecLayout {
        self.layout
    }

    pub fn stats(&self) -> EncoderStats {
        self.stats
    }

    fn block(&self) -> u16 {
        u16::from(self.layout.columns) * u16::from(self.layout.rows.max(1))
    }

    /// Take the next media packet sent; `emit` gets each FEC packet it
    /// completes (at most a row and a column), with its stream.
    pub fn push(&mut self, packet: &[u8], mut emit: impl FnMut(Direction, &[u8])) {
        let done = self.push_stored(packet);
        for d in done.iter() {
            emit(d, self.packet(d));
        }
    }

    /// [`FecEncoder::push`] keeping the FEC packets it completes in the
    /// encoder ([`FecEncoder::packet`]) until the next push: which ones.
    pub fn push_stored(&mut self, packet: &[u8]) -> Completed {
        let mut done = Completed::default();
        let Some(h) = mcrelay_wire::rtp::parse(packet) else {
            self.cut();
            self.stats.unprotected += 1;
            return done;
        };
        if packet.len() > MAX_MEDIA {
            self.cut();
            self.stats.unprotected += 1;
            return done;
        }
        let seq = h.sequence;
        if self.next != Some(seq) {
            // A gap, a restart or the first packet: a new matrix here.
            self.stats.unprotected += u64::from(self.index);
            self.index = 0;
        }
        let l = u16::from(self.layout.columns);
        let col = usize::from(self.index % l);
        let row = self.index / l;
        if col == 0 {
            self.row.start(seq);
        }
        if row == 0
            && let Some(c) = self.columns.get_mut(col)
        {
            c.start(seq);
        }
        self.row.add(packet);
        if let Some(c) = self.columns.get_mut(col) {
            c.add(packet);
        }
        let ts = h.timestamp;
        if col + 1 == usize::from(l) && self.layout.row_stream {
            self.row_len = self.row.write(
                &mut self.row_out,
                Direction::Row,
                1,
                self.layout.columns,
                self.row_seq,
                ts,
            );
            self.row_seq = self.row_seq.wrapping_add(1);
            self.stats.rows_sent += 1;
            done.row = true;
        }
        if self.layout.rows > 0 && row + 1 == u16::from(self.layout.rows) {
            let c = &self.columns[col];
            self.column_len = c.write(
                &mut self.column_out,
                Direction::Column,
                self.layout.columns,
                self.layout.rows,
                self.column_seq,
                ts,
            );
            self.column_seq = self.column_seq.wrapping_add(1);
            self.stats.columns_sent += 1;
            done.column = true;
        }
        self.index += 1;
        if self.index == self.block() {
            self.index = 0;
        }
        self.next = Some(seq.wrapping_add(1));
        done
    }

    /// The last FEC packet completed in `direction`.
    pub fn packet(&self, direction: Direction) -> &[u8] {
        match direction {
            Direction::Column => &self.column_out[..self.column_len],
            Direction::Row => &self.row_out[..self.row_len],
        }
    }

    /// End the current matrix unprotected.
    fn cut(&mut self) {
        self.stats.unprotected += u64::from(self.index);
        self.index = 0;
        self.next = None;
    }
}
