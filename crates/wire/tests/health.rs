//! Stream health ([`mcrelay_wire::health`]) from the outside: the fuzz
//! entry point over the committed corpus in `tests/health_corpus/` and
//! random bytes; valid RTP / TS / RTP-in-TS streams counted with zero
//! errors; streams with planted faults counted exactly.

use std::fs;
use std::path::Path;

use mcrelay_wire::health::{InputTracker, Payload};
use mcrelay_wire::{fuzz_health, rtp, ts};
use proptest::prelude::*;

#[test]
fn corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/health_corpus");
    let mut n = 0;
    for entry in fs::read_dir(&dir).expect("tests/health_corpus") {
        let bytes = fs::read(entry.expect("entry").path()).expect("read");
        fuzz_health(&bytes);
        n += 1;
    }
    assert!(n >= 4, "corpus has {n} inputs");
}

/// An RTP datagram carrying seven TS packets on `pid` with counters from
/// `cc`.
fn datagram(seq: u16, ssrc: u32, pid: u16, cc: u8) -> Vec<u8> {
    let mut d = vec![0u8; 12 + 7 * ts::PACKET];
    let _ = rtp::build(&mut d, 33, seq, u32::from(seq).wrapping_mul(900), ssrc);
    for (i, p) in d[12..].chunks_exact_mut(ts::PACKET).enumerate() {
        ts::build(
            p,
            pid,
            cc.wrapping_add(u8::try_from(i).unwrap()),
            true,
            None,
        );
    }
    d
}

fn feed(t: &mut InputTracker, ds: &[Vec<u8>]) {
    for (i, d) in ds.iter().enumerate() {
        t.observe(d, i as u64 * 1_000_000);
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
        fuzz_health(&data);
    }

    /// Any start sequence number and counter, any length (wrapping both):
    /// zero errors in every mode.
    #[test]
    fn valid_streams_have_no_errors(first in any::<u16>(), cc in 0u8..16, n in 1usize..400, ssrc in any::<u32>()) {
        let ds: Vec<_> = (0..n)
            .map(|i| {
                let k = u16::try_from(i).unwrap();
                datagram(first.wrapping_add(k), ssrc, 0x100, cc.wrapping_add(7 * (k % 16) as u8) & 15)
            })
            .collect();
        for p in Payload::ALL {
            let mut t = InputTracker::new(p, 90_000);
            if p == Payload::Mpegts {
                let plain: Vec<_> = ds.iter().map(|d| d[12..].to_vec()).collect();
                feed(&mut t, &plain);
            } else {
                feed(&mut t, &ds);
            }
            let r = *t.rtp();
            prop_assert_eq!((r.lost, r.duplicates, r.reordered, r.ssrc_changes, r.malformed, r.resyncs), (0, 0, 0, 0, 0, 0));
            let s = t.ts();
            prop_assert_eq!((s.continuity_errors, s.sync_errors, s.transport_errors), (0, 0, 0));
            if p.has_ts() {
                prop_assert_eq!(s.packets, 7 * n as u64);
                prop_assert_eq!(s.pids, 1);
            }
            if p.has_rtp() {
                prop_assert_eq!(r.packets, n as u64);
            }
        }
    }

    /// Drop, duplicate or swap datagrams of an RTP stream at chosen places
    /// (at least 2 apart, so faults don't overlap): each is counted exactly.
    #[test]
    fn planted_rtp_faults_are_counted_exactly(
        first in any::<u16>(),
        faults in proptest::collection::vec((0u8..3, 1usize..40), 0..20),
    ) {
        let mut seqs: Vec<u16> = Vec::new();
        let mut next = first;
        let (mut lost, mut dups, mut reord) = (0u64, 0u64, 0u64);
        seqs.push(next);
        for (kind, run) in faults {
            for _ in 0..run {
                next = next.wrapping_add(1);
                seqs.push(next);
            }
            match kind {
                0 => { next = next.wrapping_add(2); seqs.push(next); lost += 1; }
                1 => { seqs.push(next); dups += 1; }
                _ => {
                    let a = next.wrapping_add(1);
                    let b = next.wrapping_add(2);
                    seqs.push(b);
                    seqs.push(a);
                    next = b;
                    reord += 1;
                }
            }
            next = next.wrapping_add(1);
            seqs.push(next);
        }
        // A window's worth in order: every missing number has left the
        // reorder window, so it is counted lost (and never uncounted).
        for _ in 0..rtp::WINDOW {
            next = next.wrapping_add(1);
            seqs.push(next);
        }
        let mut t = InputTracker::new(Payload::Rtp, 90_000);
        let ds: Vec<_> = seqs.iter().map(|&s| datagram(s, 9, 0x100, 0)).collect();
        feed(&mut t, &ds);
        let r = *t.rtp();
        prop_assert_eq!((r.lost, r.duplicates, r.reordered, r.resyncs), (lost, dups, reord, 0));
    }

    /// Skip counters (an error each), repeat a packet once (allowed) or
    /// twice (an error), insert adaptation-only packets (ignored) on one
    /// of several PIDs: the errors are exactly the planted ones.
    #[test]
    fn planted_ts_faults_are_counted_exactly(
        faults in proptest::collection::vec((0u8..4, 0u16..3, 1usize..30), 0..40),
    ) {
        let mut cc = [0u8; 3];
        let mut packets: Vec<[u8; ts::PACKET]> = Vec::new();
        let mut planted = 0u64;
        let mut push = |pid: u16, c: u8, payload: bool, af: Option<u8>| {
            let mut p = [0u8; ts::PACKET];
            ts::build(&mut p, 0x100 + pid, c, payload, af);
            packets.push(p);
        };
        for pid in 0..3u16 { push(pid, 0, true, None); }
        for (kind, pid, run) in faults {
            let k = usize::from(pid);
            for _ in 0..run {
                cc[k] = (cc[k] + 1) & 15;
                push(pid, cc[k], true, None);
            }
            match kind {
                0 => { cc[k] = (cc[k] + 2) & 15; push(pid, cc[k], true, None); planted += 1; }
                1 => push(pid, cc[k], true, None),
                2 => { push(pid, cc[k], true, None); push(pid, cc[k], true, None); planted += 1; }
                _ => push(pid, (cc[k] + 5) & 15, false, Some(0x10)),
            }
            cc[k] = (cc[k] + 1) & 15;
            push(pid, cc[k], true, None);
        }
        let mut t = InputTracker::new(Payload::Mpegts, 90_000);
        for (i, chunk) in packets.chunks(7).enumerate() {
            let d: Vec<u8> = chunk.iter().flatten().copied().collect();
            t.observe(&d, i as u64);
        }
        let s = t.ts();
        prop_assert_eq!((s.continuity_errors, s.sync_errors, s.pids), (planted, 0, 3));
    }
}
