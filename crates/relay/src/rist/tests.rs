//! The RIST state machines with a fake clock: NACK timing, retransmits,
//! buffer expiry, duplicates, and a sender and a receiver joined by a
//! simulated lossy, delayed link.

use super::rtcp::{self, Packet, ReportBlock, Writer};
use super::*;

const MS: u64 = 1_000_000;

fn rtp(seq: u16, ssrc: u32) -> Vec<u8> {
    let mut d = vec![0u8; 200];
    let _ = mcrelay_wire::rtp::build(&mut d, 33, seq, u32::from(seq) * 90, ssrc);
    for (k, b) in d[12..].iter_mut().enumerate() {
        *b = (usize::from(seq) * 7 + k).to_le_bytes()[0];
    }
    d
}

fn seq_of(d: &[u8]) -> u16 {
    u16::from_be_bytes([d[2], d[3]])
}

fn range_nack(seqs: &[(u16, u16)]) -> Vec<u8> {
    let mut b = [0u8; 512];
    let mut w = Writer::new(&mut b);
    w.receiver_report(9, None);
    w.range_nack(0x1000, seqs);
    let n = w.len();
    b[..n].to_vec()
}

fn nacked_in(d: &[u8]) -> Vec<u16> {
    let mut v = Vec::new();
    for p in rtcp::packets(d) {
        rtcp::nacked(&p, |s| v.push(s));
    }
    v
}

#[test]
fn slots_cover_the_buffer_at_the_sized_rate() {
    assert_eq!(slots_for(1000), 4096);
    assert_eq!(slots_for(200), 1024);
    assert_eq!(slots_for(1), 64);
    assert_eq!(slots_for(u32::MAX), 32_768);
    // What a 1000 ms output costs: the ring of 4096 × 1472 bytes.
    let s = RistSender::new(1000);
    assert!(s.memory_bytes() >= 4096 * MAX_DATAGRAM && s.memory_bytes() < 7_000_000);
}

#[test]
fn sender_retransmits_what_is_nacked_marked_as_a_retransmission() {
    let mut s = RistSender::new(200);
    for seq in 0..100u16 {
        s.record(u64::from(seq) * MS, &rtp(seq, 0x1000));
    }
    s.receive_rtcp(100 * MS, &range_nack(&[(10, 2)]));
    let mut b = [0u8; 64];
    let mut w = Writer::new(&mut b);
    w.generic_nack(9, 0x1000, &[(50, 0b1)]);
    let n = w.len();
    s.receive_rtcp(100 * MS, &b[..n]);
    let mut got = Vec::new();
    while let Some(d) = s.next_retransmission() {
        let mut want = rtp(seq_of(d), 0x1000);
        want[11] |= 1;
        assert_eq!(d, &want[..]);
        got.push(seq_of(d));
    }
    assert_eq!(got, [10, 11, 12, 50, 51]);
    assert_eq!(s.stats().retransmitted, 5);
    assert_eq!(s.stats().nacked, 5);
    assert_eq!(s.stats().unrecoverable, 0);
}

#[test]
fn sender_counts_nacks_for_datagrams_already_gone() {
    let mut s = RistSender::new(200);
    for seq in 0..10u16 {
        s.record(u64::from(seq) * MS, &rtp(seq, 0x1000));
    }
    // Seq 0 was sent at 0: at 201 ms it is past the buffer; 500 was never sent.
    s.receive_rtcp(201 * MS, &range_nack(&[(0, 0), (500, 0)]));
    assert!(s.next_retransmission().is_none());
    assert_eq!(s.stats().unrecoverable, 2);
    // Overwritten by a datagram 1024 numbers later (same slot).
    let mut s = RistSender::new(200);
    s.record(0, &rtp(5, 1));
    s.record(MS, &rtp(5 + 1024, 1));
    s.receive_rtcp(2 * MS, &range_nack(&[(5, 0)]));
    assert!(s.next_retransmission().is_none());
    assert_eq!(s.stats().unrecoverable, 1);
}

#[test]
fn sender_ignores_a_repeated_nack_while_the_retransmission_is_on_its_way() {
    let mut s = RistSender::new(1000);
    s.record(0, &rtp(7, 1));
    s.receive_rtcp(10 * MS, &range_nack(&[(7, 0)]));
    s.receive_rtcp(12 * MS, &range_nack(&[(7, 0)]));
    assert_eq!(s.stats().suppressed, 1);
    assert!(s.next_retransmission().is_some());
    assert!(s.next_retransmission().is_none());
    // Later, the receiver still misses it: sent again.
    s.receive_rtcp(30 * MS, &range_nack(&[(7, 0)]));
    assert!(s.next_retransmission().is_some());
    assert_eq!(s.stats().retransmitted, 2);
}

#[test]
fn sender_bounds_its_retransmission_queue() {
    let mut s = RistSender::new(1000);
    for seq in 0..2000u16 {
        s.record(0, &rtp(seq, 1));
    }
    s.receive_rtcp(MS, &range_nack(&[(0, 1023), (1024, 975)]));
    assert_eq!(s.stats().nacked, 2000);
    assert_eq!(s.stats().queue_full, 2000 - sender::PENDING as u64);
    let mut n = 0;
    while s.next_retransmission().is_some() {
        n += 1;
    }
    assert_eq!(n, sender::PENDING);
}

/// A sender that sent an SR at 100 ms, and the receiver report naming it
/// that arrives 25 ms later after the receiver held it 5 ms (DLSR): an
/// RTT of 20 ms once the sender reads it.
fn sender_and_a_20_ms_report() -> (RistSender, Vec<u8>) {
    let mut s = RistSender::new(200);
    s.record(0, &rtp(1, 0x1000));
    let mut sr = [0u8; 128];
    let ntp = rtcp::ntp_from_unix_ns(1_700_000_000 * 1_000_000_000);
    let n = s.sender_report(100 * MS, ntp, &mut sr);
    assert!(n > 0);
    let Some(Packet::SenderReport { ntp: got, .. }) = rtcp::packets(&sr[..n]).next() else {
        panic!("no SR")
    };
    assert_eq!(got, ntp);
    let mut b = [0u8; 64];
    let mut w = Writer::new(&mut b);
    w.receiver_report(
        9,
        Some(&ReportBlock {
            ssrc: 0x1000,
            highest: 1,
            lsr: rtcp::ntp_middle(ntp),
            dlsr: 5 * 65536 / 1000,
        }),
    );
    let len = w.len();
    (s, b[..len].to_vec())
}

#[test]
fn sender_keeps_the_buffer_plus_two_rtts() {
    let (mut s, report) = sender_and_a_20_ms_report();
    s.receive_rtcp(125 * MS, &report);
    let rtt = s.rtt_ns().expect("rtt");
    s.record(1000 * MS, &rtp(7, 0x1000));
    s.record(1000 * MS, &rtp(8, 0x1000));
    // 200 ms + 1.5 RTT after it left: still kept (a NACK whose way took
    // longer than the RTT).
    s.receive_rtcp(1000 * MS + 200 * MS + rtt * 3 / 2, &range_nack(&[(7, 0)]));
    assert_eq!(s.next_retransmission().map(seq_of), Some(7));
    // 200 ms + 2.5 RTT: gone, counted.
    s.receive_rtcp(1000 * MS + 200 * MS + rtt * 5 / 2, &range_nack(&[(8, 0)]));
    assert!(s.next_retransmission().is_none());
    assert_eq!(s.stats().unrecoverable, 1);
}

#[test]
fn sender_measures_rtt_from_receiver_reports() {
    let (mut s, report) = sender_and_a_20_ms_report();
    s.receive_rtcp(125 * MS, &report);
    let rtt = s.rtt_ns().unwrap();
    assert!((19 * MS..=21 * MS).contains(&rtt), "{rtt}");
    // A report naming no SR of ours gives nothing.
    let mut s2 = RistSender::new(200);
    s2.receive_rtcp(125 * MS, &report);
    assert_eq!(s2.rtt_ns(), None);
}

/// Drain a receiver's ready datagrams into `out` (their numbers).
fn drain(r: &mut RistReceiver, now: u64, out: &mut Vec<u16>) {
    while let Some(d) = r.pop_ready(now) {
        out.push(seq_of(d));
    }
}

#[test]
fn receiver_passes_an_in_order_stream_straight_through() {
    let mut r = RistReceiver::new(200, 5);
    for seq in 65530..=65535u16 {
        assert_eq!(r.receive(0, &rtp(seq, 2)), Verdict::Deliver);
    }
    for seq in 0..5u16 {
        assert_eq!(r.receive(0, &rtp(seq, 2)), Verdict::Deliver);
    }
    assert_eq!(r.window(), 0);
    assert_eq!(r.poll(0, &mut [0u8; 512]), 0);
}

#[test]
fn receiver_nacks_a_gap_then_hands_on_in_order_once_it_is_filled() {
    let mut r = RistReceiver::new(200, 5);
    let mut out = Vec::new();
    r.receive(0, &rtp(10, 2));
    out.push(10);
    // 11, 12 and 14 lost.
    assert_eq!(r.receive(MS, &rtp(13, 2)), Verdict::Held);
    assert_eq!(r.receive(2 * MS, &rtp(15, 2)), Verdict::Held);
    drain(&mut r, 2 * MS, &mut out);
    assert_eq!(out, [10]);
    let mut b = [0u8; 512];
    let n = r.poll(2 * MS, &mut b);
    assert_eq!(nacked_in(&b[..n]), [11, 12, 14]);
    assert_eq!(r.stats().nacks_sent, 3);
    // Not again before the retry interval (no RTT yet: 50 ms).
    assert_eq!(r.poll(30 * MS, &mut b), 0);
    // The retransmissions (SSRC lowest bit set) arrive 20 ms later.
    let re = |seq| {
        let mut d = rtp(seq, 2);
        d[11] |= 1;
        d
    };
    // Each is copied and handed on as first sent, with the media SSRC
    // (so never straight through, even at the head).
    assert_eq!(r.receive(22 * MS, &re(12)), Verdict::Held);
    assert_eq!(r.receive(22 * MS, &re(11)), Verdict::Held);
    while let Some(d) = r.pop_ready(22 * MS) {
        assert_eq!(d, &rtp(seq_of(d), 2)[..], "as first sent");
        out.push(seq_of(d));
    }
    assert_eq!(out, [10, 11, 12, 13]);
    assert_eq!(r.receive(22 * MS, &re(14)), Verdict::Held);
    drain(&mut r, 22 * MS, &mut out);
    assert_eq!(out, [10, 11, 12, 13, 14, 15]);
    assert_eq!(r.stats().recovered, 3);
    assert_eq!(r.stats().retransmissions, 3);
    // RTT measured from the NACK to the retransmission.
    assert_eq!(r.rtt_ns(), Some(20 * MS));
    // A second copy of a retransmission is a duplicate, counted once.
    assert_eq!(r.receive(23 * MS, &re(14)), Verdict::Duplicate);
    assert_eq!(r.stats().duplicates, 1);
    assert_eq!(r.missing(), 0);
}

#[test]
fn receiver_renacks_at_the_retry_interval_and_skips_at_the_buffer_end() {
    let mut r = RistReceiver::new(200, 5);
    let mut b = [0u8; 512];
    r.receive(0, &rtp(0, 2));
    r.receive(0, &rtp(2, 2));
    let mut sent = Vec::new();
    let mut now = 0;
    while now < 300 * MS {
        if r.poll(now, &mut b) > 0 {
            sent.push(now / MS);
        }
        now += MS;
    }
    // Every 50 ms (no RTT sample) while the 200 ms last.
    assert_eq!(sent, [0, 50, 100, 150]);
    let mut out = Vec::new();
    drain(&mut r, 199 * MS, &mut out);
    assert!(out.is_empty());
    assert_eq!(r.next_deadline(), Some(200 * MS));
    drain(&mut r, 200 * MS, &mut out);
    assert_eq!(out, [2]);
    assert_eq!(r.stats().unrecovered, 1);
    // It arrives after all: late, dropped.
    assert_eq!(r.receive(201 * MS, &rtp(1, 3)), Verdict::Late);
}

/// After an outage longer than the buffer, the numbers sent `buffer_ms`
/// or more ago (as the gap's own pacing tells) are given up at once,
/// counted unrecovered and never NACKed: the sender, keeping about what
/// this receiver waits, no longer has them (a leg back from a 5 s cut
/// once NACKed 24 187 numbers). Only the gap's last `buffer_ms` is
/// NACKed and waited for.
#[test]
fn receiver_gives_up_at_once_what_an_outage_took_beyond_its_buffer() {
    let mut r = RistReceiver::new(100, 5);
    // 500 datagrams/s: number k at 2k ms.
    for seq in 0..10u16 {
        let at = u64::from(seq) * 2 * MS;
        assert_eq!(r.receive(at, &rtp(seq, 2)), Verdict::Deliver);
    }
    // A 1 s outage: 10..=509 lost, 510 arrives at 1020 ms.
    let now = 1020 * MS;
    assert_eq!(r.receive(now, &rtp(510, 2)), Verdict::Held);
    // 10..=460 were sent at 920 ms or before: given up at once.
    assert_eq!(r.stats().given_up, 451);
    assert_eq!(r.stats().unrecovered, 451);
    assert_eq!(r.missing(), 49);
    // An original of one of them arriving after all is late.
    assert_eq!(r.receive(now, &rtp(100, 2)), Verdict::Late);
    let mut b = [0u8; 1500];
    let n = r.poll(now, &mut b);
    assert_eq!(nacked_in(&b[..n]), (461..510).collect::<Vec<u16>>());
    assert_eq!(r.stats().nacks_sent, 49);
    let mut out = Vec::new();
    drain(&mut r, now, &mut out);
    assert!(out.is_empty(), "461..=509 are awaited");
    for seq in 461..510u16 {
        let mut d = rtp(seq, 2);
        d[11] |= 1;
        assert_eq!(r.receive(now + 20 * MS, &d), Verdict::Held);
    }
    drain(&mut r, now + 20 * MS, &mut out);
    assert_eq!(out, (461..=510).collect::<Vec<u16>>());
    assert_eq!(r.stats().recovered, 49);
    assert_eq!(r.stats().unrecovered, 451);
    // A gap no longer than the buffer gives nothing up.
    r.receive(now + 21 * MS, &rtp(511, 2));
    r.receive(now + 90 * MS, &rtp(540, 2));
    assert_eq!(r.stats().given_up, 451);
    assert_eq!(r.missing(), 28);
}

/// A sender whose own SSRC is odd is not taken for retransmitting
/// everything: its datagrams go straight on, unchanged.
#[test]
fn receiver_takes_an_odd_ssrc_for_retransmissions_only_beside_its_even_one() {
    let mut r = RistReceiver::new(100, 5);
    for seq in 0..5u16 {
        assert_eq!(r.receive(0, &rtp(seq, 7)), Verdict::Deliver);
    }
    assert_eq!(r.stats().retransmissions, 0);
    assert!(!r.is_retransmitted(&rtp(5, 7)));
    r.receive(0, &rtp(5, 8));
    assert!(r.is_retransmitted(&rtp(1, 9)));
    assert!(!r.is_retransmitted(&rtp(1, 11)), "another stream");
    assert!(!r.is_retransmitted(&[0x80, 33, 0, 1]), "too short");
}

#[test]
fn receiver_needs_two_in_a_row_to_follow_a_jump() {
    let mut r = RistReceiver::new(200, 5);
    let mut out = Vec::new();
    r.receive(0, &rtp(100, 2));
    assert_eq!(r.receive(0, &rtp(102, 2)), Verdict::Held);
    // A stray far ahead moves nothing.
    assert_eq!(r.receive(0, &rtp(30_000, 2)), Verdict::Stray);
    assert_eq!(r.receive(0, &rtp(101, 2)), Verdict::Deliver);
    drain(&mut r, 0, &mut out);
    assert_eq!(out, [102]);
    // A restart: 40000, 40001 confirm; what is held goes first.
    assert_eq!(r.receive(0, &rtp(104, 2)), Verdict::Held);
    assert_eq!(r.receive(0, &rtp(40_000, 2)), Verdict::Stray);
    assert_eq!(r.receive(0, &rtp(40_001, 2)), Verdict::Flush);
    out.clear();
    drain(&mut r, 0, &mut out);
    assert_eq!(out, [104]);
    assert_eq!(r.receive(0, &rtp(40_001, 2)), Verdict::Deliver);
    assert_eq!(r.receive(0, &rtp(40_002, 2)), Verdict::Deliver);
    assert_eq!(r.stats().resets, 1);
    assert_eq!(r.stats().unrecovered, 1);
}

#[test]
fn receiver_reports_carry_the_last_sender_report() {
    let mut r = RistReceiver::new(200, 5);
    r.receive(0, &rtp(1, 0x1000));
    let mut s = RistSender::new(200);
    s.record(0, &rtp(1, 0x1000));
    let mut b = [0u8; 128];
    let n = s.sender_report(0, 0x0000_1234_5678_0000, &mut b);
    r.receive_rtcp(10 * MS, &b[..n]);
    let n = r.receiver_report(20 * MS, &mut b);
    let Some(Packet::ReceiverReport {
        report: Some(rb), ..
    }) = rtcp::packets(&b[..n]).next()
    else {
        panic!("no RR")
    };
    assert_eq!(rb.lsr, 0x1234_5678);
    assert_eq!(rb.dlsr, 655); // 10 ms in 1/65536 s
    assert_eq!(rb.ssrc, 0x1000);
    s.receive_rtcp(30 * MS, &b[..n]);
    assert_eq!(s.rtt_ns().map(|t| t / 100_000), Some(200)); // 20 ms
}

/// A tiny deterministic random source (xorshift).
struct Rng(u64);
impl Rng {
    fn chance(&mut self, per_mille: u64) -> bool {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % 1000 < per_mille
    }
}

/// A link that loses `loss` per mille and delays by `delay_ns`.
struct Link {
    queue: std::collections::VecDeque<(u64, Vec<u8>)>,
    delay_ns: u64,
}
impl Link {
    fn send(&mut self, rng: &mut Rng, loss: u64, now: u64, d: &[u8]) {
        if !rng.chance(loss) {
            self.queue.push_back((now + self.delay_ns, d.to_vec()));
        }
    }
    fn due(&mut self, now: u64) -> Option<Vec<u8>> {
        if self.queue.front().is_some_and(|(t, _)| *t <= now) {
            return self.queue.pop_front().map(|(_, d)| d);
        }
        None
    }
}

/// Sender and receiver across 5 % loss each way and 20 ms RTT, 200 ms
/// buffers, 1000 datagrams/s for `secs` s: returns the delivered
/// numbers, both ends' stats and RTTs.
#[allow(clippy::type_complexity)]
fn simulate(
    seed: u64,
    loss: u64,
    secs: u64,
) -> (
    Vec<u16>,
    ReceiverStats,
    SenderStats,
    (Option<u64>, Option<u64>),
) {
    let mut rng = Rng(seed | 1);
    let mut s = RistSender::new(200);
    let mut r = RistReceiver::new(200, 7);
    let mut fwd = Link {
        queue: Default::default(),
        delay_ns: 10 * MS,
    };
    let mut back = Link {
        queue: Default::default(),
        delay_ns: 10 * MS,
    };
    let mut out = Vec::new();
    let mut b = [0u8; 1500];
    let total = secs * 1000;
    let mut now = 0;
    let end = total * MS + 400 * MS;
    while now < end {
        if now % MS == 0 && now / MS < total {
            let seq = u16::try_from(now / MS % 65_536).unwrap_or(0);
            let d = rtp(seq, 0x2000);
            s.record(now, &d);
            fwd.send(&mut rng, loss, now, &d);
        }
        if now % (100 * MS) == 0 {
            let n = s.sender_report(now, rtcp::ntp_from_unix_ns(now), &mut b);
            fwd.send(&mut rng, loss, now, &b[..n]);
            let n = r.receiver_report(now, &mut b);
            back.send(&mut rng, loss, now, &b[..n]);
        }
        while let Some(d) = fwd.due(now) {
            if d[1] >= 200 && d[1] <= 204 {
                r.receive_rtcp(now, &d);
                continue;
            }
            match r.receive(now, &d) {
                Verdict::Deliver => out.push(seq_of(&d)),
                Verdict::Flush => panic!("no restart here"),
                _ => {}
            }
            drain(&mut r, now, &mut out);
        }
        drain(&mut r, now, &mut out);
        let n = r.poll(now, &mut b);
        if n > 0 {
            back.send(&mut rng, loss, now, &b[..n]);
        }
        while let Some(d) = back.due(now) {
            s.receive_rtcp(now, &d);
            while let Some(re) = s.next_retransmission() {
                let re = re.to_vec();
                fwd.send(&mut rng, loss, now, &re);
            }
        }
        now += MS / 2;
    }
    (out, *r.stats(), *s.stats(), (r.rtt_ns(), s.rtt_ns()))
}

#[test]
fn five_percent_loss_each_way_at_20_ms_rtt_is_repaired_completely() {
    for seed in [1, 2, 3] {
        let (out, rs, ss, rtts) = simulate(seed, 50, 20);
        let want: Vec<u16> = (0..20_000u16).collect();
        assert_eq!(rs.unrecovered, 0, "seed {seed}: {rs:?} {ss:?}");
        assert_eq!(out.len(), want.len(), "seed {seed}");
        assert!(out == want, "seed {seed}: out of order");
        assert!(rs.recovered > 500, "{rs:?}");
        assert!(ss.retransmitted >= rs.recovered);
        // Both ends measured the link's 20 ms (within the 0.5 ms step).
        for rtt in [rtts.0, rtts.1] {
            let rtt = rtt.unwrap_or(0);
            assert!((19 * MS..=21 * MS).contains(&rtt), "seed {seed}: {rtt}");
        }
    }
}

#[test]
fn heavy_loss_skips_what_cannot_be_repaired_and_keeps_order() {
    let (out, rs, _, _) = simulate(9, 400, 5);
    assert!(rs.unrecovered > 0);
    // Every number up to the last delivered one is delivered or counted
    // (a loss after it is never seen as a gap).
    let last = u64::from(*out.last().unwrap());
    assert_eq!(out.len() as u64 + rs.unrecovered, last + 1);
    assert!(last >= 4990);
    // In order, nothing invented or repeated.
    let mut last = None;
    for s in out {
        if let Some(l) = last {
            assert!(s > l);
        }
        last = Some(s);
    }
}

/// librist 0.2.7's sender (`ristsender -p 0`, Debian's librist4) as its
/// debug log against mcrelay shows it: with a data and an RTCP peer it
/// takes the "multiple peers" path of `rist_retry_enqueue`, which looks
/// for an earlier request for the same number among the requests it
/// queued in the last 4 × RTT (its last RTT sample) and, when it finds
/// one, compares their distance in milliseconds with the RTT in NTP
/// ticks (2^32 per second), so it always finds it "too soon" and skips
/// the NACK ("already queued (too soon to add another one), skipped").
/// Whatever a receiver does, a number gets at most one retransmission
/// per 4 × RTT: at 20 ms RTT two within a 200 ms buffer, three within
/// 300 ms.
struct LibristSender {
    rtt_ns: u64,
    /// When each number's last request was taken.
    taken: std::collections::HashMap<u16, u64>,
    ignored: u64,
}

impl LibristSender {
    /// The retransmissions a NACK datagram arriving at `now` brings back.
    fn answer(&mut self, now: u64, rtcp: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for seq in nacked_in(rtcp) {
            if self
                .taken
                .get(&seq)
                .is_some_and(|&t| now - t < 4 * self.rtt_ns)
            {
                self.ignored += 1;
                continue;
            }
            self.taken.insert(seq, now);
            out.push(rtp(seq, 0x2001));
        }
        out
    }
}

/// A stream of 500 datagrams/s (as the interop test's) for `secs` s from
/// a librist-like sender to a receiver with `buffer_ms`, across `loss`
/// per mille each way and 20 ms RTT (the sender's RTT sample 22 ms, as
/// librist reported in the interop runs): the delivered numbers, the
/// receiver's stats and how many NACKed numbers the sender ignored.
fn simulate_against_librist(
    seed: u64,
    loss: u64,
    secs: u64,
    buffer_ms: u32,
) -> (Vec<u16>, ReceiverStats, u64) {
    let mut rng = Rng(seed | 1);
    let mut sender = LibristSender {
        rtt_ns: 22 * MS,
        taken: Default::default(),
        ignored: 0,
    };
    let mut r = RistReceiver::new(buffer_ms, 7);
    let mut fwd = Link {
        queue: Default::default(),
        delay_ns: 10 * MS,
    };
    let mut back = Link {
        queue: Default::default(),
        delay_ns: 10 * MS,
    };
    let mut out = Vec::new();
    let mut b = [0u8; 1500];
    let total = secs * 500;
    let mut now = 0;
    let end = secs * 1000 * MS + u64::from(buffer_ms) * 2 * MS;
    while now < end {
        if now % (2 * MS) == 0 && now / (2 * MS) < total {
            let seq = u16::try_from(now / (2 * MS) % 65_536).unwrap_or(0);
            fwd.send(&mut rng, loss, now, &rtp(seq, 0x2000));
        }
        while let Some(d) = fwd.due(now) {
            match r.receive(now, &d) {
                Verdict::Deliver => out.push(seq_of(&d)),
                Verdict::Flush => panic!("no restart here"),
                _ => {}
            }
            drain(&mut r, now, &mut out);
        }
        drain(&mut r, now, &mut out);
        let n = r.poll(now, &mut b);
        if n > 0 {
            back.send(&mut rng, loss, now, &b[..n]);
        }
        while let Some(d) = back.due(now) {
            for re in sender.answer(now, &d) {
                fwd.send(&mut rng, loss, now, &re);
            }
        }
        now += MS / 2;
    }
    (out, *r.stats(), sender.ignored)
}

/// Why `ristsender -p 0` into a RIST input with `buffer_ms = 200` left 1
/// to 7 of 30 000 numbers missing at 5 % loss each way and 20 ms RTT
/// (crates/mcrelayd/tests/rist.rs): librist grants a number at most two
/// retransmissions in 200 ms, so one lost twice (about 0.05² of the
/// ~1 500 losses: 4) cannot come back. The receiver makes the most of
/// what the sender grants: it NACKs again every 1.25 RTT for as long as
/// an answer can come in time, so each next request lands as soon as
/// librist's window opens, and with 300 ms (three grants) nothing stays
/// missing. (It failed at 300 ms while a number was NACKed at most 10
/// times: 10 NACKs 1.25 RTT apart cover 250 ms, so three grants at most
/// whatever the buffer, and seed 1 left 2.)
#[test]
fn against_librists_sender_200_ms_leave_a_few_numbers_and_300_ms_none() {
    let mut left = 0;
    for seed in 1..=4 {
        let (out, rs, ignored) = simulate_against_librist(seed, 50, 60, 200);
        assert!(ignored > 0, "seed {seed}: the rule never applied");
        assert_eq!(out.len() as u64 + rs.unrecovered, 30_000, "seed {seed}");
        left += rs.unrecovered;
    }
    // About 4 per run expected (0.05² × ~1 500, less what the first
    // NACK's own loss shifts): 4 runs left some, none many.
    assert!((1..=40).contains(&left), "{left} unrecovered in 4 runs");
    for seed in 1..=4 {
        let (out, rs, _) = simulate_against_librist(seed, 50, 60, 300);
        assert_eq!(rs.unrecovered, 0, "seed {seed}: {rs:?}");
        assert!(
            out.iter().zip(0u16..).all(|(a, b)| *a == b) && out.len() == 30_000,
            "seed {seed}: out of order or short"
        );
    }
}
