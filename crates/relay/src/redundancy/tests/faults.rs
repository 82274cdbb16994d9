//! The fault table of issue 26, one test per row: one leg misbehaves, the
//! other is clean, and the output must carry the stream once, without
//! the gap the fault used to cause. Datagrams are told apart by their RTP
//! timestamp (`index * 90`), so a restart's repeated numbers are distinct.

#![allow(clippy::cast_possible_truncation)] // test streams: numbers wrap on purpose

use super::*;

/// One datagram of a test stream: arrival, leg, number, timestamp, SSRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Ev {
    t: u64,
    leg: u8,
    seq: u16,
    ts: u32,
    ssrc: u32,
}

/// `n` datagrams at `pps` on legs `0..legs`, leg `l` delayed by
/// `skew_ns(l)`; datagram `i` numbered `seq(l, i)` (with SSRC
/// `ssrc(l)`), timestamp `i * 90`. In time order.
fn stream(
    n: u32,
    pps: u64,
    legs: u8,
    skew_ns: impl Fn(u8) -> u64,
    seq: impl Fn(u8, u32) -> u16,
    ssrc: impl Fn(u8) -> u32,
) -> Vec<Ev> {
    let period = 1_000_000_000 / pps;
    let mut v = Vec::new();
    for i in 0..n {
        for leg in 0..legs {
            v.push(Ev {
                t: 1000 * MS + u64::from(i) * period + skew_ns(leg),
                leg,
                seq: seq(leg, i),
                ts: i * 90,
                ssrc: ssrc(leg),
            });
        }
    }
    v.sort();
    v
}

/// Play `events` (ticking each timer slot in between) and `after_ms`
/// more; returns the end time.
fn run(h: &mut Harness, events: &[Ev], after_ms: u64) -> u64 {
    let mut now = events.first().map_or(0, |e| e.t);
    for e in events {
        while now + SLOT < e.t {
            now += SLOT;
            h.tick(now);
        }
        now = e.t;
        h.rx_ts(e.leg, e.seq, e.ts, e.ssrc, now);
        h.tick(now);
    }
    let end = now + after_ms * MS;
    while now < end {
        now += SLOT;
        h.tick(now);
    }
    now
}

/// The stream's datagram indices that left, sorted; panics on one that
/// left twice.
fn indices(h: &Harness) -> Vec<u32> {
    let mut v: Vec<u32> = h.sent_ts.iter().map(|ts| ts / 90).collect();
    v.sort_unstable();
    let mut d = v.clone();
    d.dedup();
    assert_eq!(d.len(), v.len(), "a datagram left twice");
    v
}

fn missing(h: &Harness, n: u32) -> Vec<u32> {
    let got = indices(h);
    (0..n).filter(|i| got.binary_search(i).is_err()).collect()
}

/// A hostile datagram on `leg` at `t`: number `seq`, a timestamp no
/// stream datagram has.
fn hostile(events: &mut Vec<Ev>, t: u64, leg: u8, seq: u16, ssrc: u32) {
    events.push(Ev {
        t,
        leg,
        seq,
        ts: u32::MAX - 89,
        ssrc,
    });
    events.sort();
}

fn stray_left(h: &Harness) -> bool {
    h.sent_ts.contains(&(u32::MAX - 89))
}

#[test]
fn a_stray_jump_on_one_merge_leg_leaves_no_gap() {
    for jump in [2000u16, 4095] {
        for delay in [0, 20] {
            let mut h = Harness::new(2, merge(delay, 50));
            let mut ev = stream(
                3000,
                1000,
                2,
                |l| u64::from(l) * 3 * MS,
                |_, i| i as u16,
                |_| SSRC,
            );
            hostile(
                &mut ev,
                1000 * MS + 1000 * MS + MS / 2,
                1,
                1000 + jump,
                SSRC,
            );
            run(&mut h, &ev, 200);
            assert_eq!(
                missing(&h, 3000),
                Vec::<u32>::new(),
                "+{jump} delay {delay}"
            );
            assert!(!stray_left(&h), "the stray is not forwarded");
            assert_eq!(h.red().lost.get(), 0);
            assert_eq!(h.red().late.get(), 0, "the healthy leg is not late");
            assert_eq!(h.red().strays.get(), 1);
            assert_eq!(h.red().resets.get(), 0);
            h.assert_adds_up();
        }
    }
}

#[test]
fn a_stray_jump_on_the_active_failover_leg_leaves_no_gap() {
    for jump in [2000u16, 4095] {
        let mut h = Harness::new(2, failover(100, None, true));
        let mut ev = stream(
            3000,
            1000,
            2,
            |l| u64::from(l) * 3 * MS,
            |_, i| i as u16,
            |_| SSRC,
        );
        hostile(
            &mut ev,
            1000 * MS + 1000 * MS + MS / 2,
            0,
            1000 + jump,
            SSRC,
        );
        run(&mut h, &ev, 50); // before leg 0's end lets leg 1 take over
        assert_eq!(missing(&h, 3000), Vec::<u32>::new(), "+{jump}");
        assert!(!stray_left(&h));
        assert_eq!(h.red().strays.get(), 1);
        assert_eq!(h.red().switches.get(), 0, "nothing to switch for");
        h.assert_adds_up();
    }
}

#[test]
fn legs_with_different_ssrcs_and_the_same_numbering_merge() {
    for delay in [0, 20] {
        let mut h = Harness::new(2, merge(delay, 50));
        // 3 % loss on each leg, never the same datagram on both (nor the
        // first: a delayed merge starts where its first datagram is).
        let ev: Vec<Ev> = stream(
            10_000,
            1000,
            2,
            |l| u64::from(l) * 7 * MS,
            |_, i| i as u16,
            |l| 0x1000 + u32::from(l),
        )
        .into_iter()
        .filter(|e| e.ts == 0 || (e.ts / 90 * 7 + u32::from(e.leg) * 50) % 100 >= 3)
        .collect();
        run(&mut h, &ev, 200);
        assert_eq!(
            (
                h.sent.len(),
                h.red().late.get(),
                h.red().strays.get(),
                h.red().mismatched.get()
            ),
            (10_000, 0, 0, 0),
            "not doubled (delay {delay})"
        );
        assert_eq!(missing(&h, 10_000), Vec::<u32>::new());
        assert_eq!(h.red().resets.get(), 0);
        assert_eq!(h.red().lost.get(), 0);
        h.assert_adds_up();
    }
}

#[test]
fn a_leg_numbered_32768_apart_is_not_merged() {
    for delay in [0, 20] {
        let mut h = Harness::new(2, merge(delay, 50));
        let ev = stream(
            10_000,
            1000,
            2,
            |l| u64::from(l) * 2 * MS,
            |l, i| (i as u16).wrapping_add(if l == 1 { 32_768 } else { 0 }),
            |_| SSRC,
        );
        run(&mut h, &ev, 200);
        assert_eq!(h.sent.len(), 10_000, "one leg only (delay {delay})");
        assert_eq!(missing(&h, 10_000), Vec::<u32>::new());
        assert_eq!(h.red().forwarded[1].get(), 0, "leg 0 came first and stays");
        assert_eq!(h.red().detached_legs.get(), 0b10, "leg 1 is shown apart");
        assert!(h.red().mismatched.get() + h.red().late.get() >= 9_990);
        h.assert_adds_up();
    }
}

#[test]
fn a_leg_later_than_the_window_is_counted_late_and_never_sent_twice() {
    // (packets per second, leg 1's lag, window): 5 s at 1 kpps; 0.6 s at
    // 8 kpps (4800 numbers, more than the merge keeps) with a 1 s window.
    for (pps, lag_ms, window_ms, n) in [
        (1000u64, 5000u64, 50u64, 10_000u32),
        (8000, 600, 1000, 16_000),
    ] {
        for delay in [0, 20] {
            let mut h = Harness::with_pool(2, merge(delay, window_ms), 40_000);
            let ev = stream(
                n,
                pps,
                2,
                |l| u64::from(l) * lag_ms * MS,
                |_, i| i as u16,
                |_| SSRC,
            );
            // Leg 0's stream ends first: stop there (after it, leg 1 is
            // the only source and rightly taken).
            let end = ev
                .iter()
                .filter(|e| e.leg == 0)
                .map(|e| e.t)
                .max()
                .expect("events");
            let ev: Vec<Ev> = ev.into_iter().filter(|e| e.t <= end).collect();
            let on_leg1 = ev.iter().filter(|e| e.leg == 1).count() as u64;
            run(&mut h, &ev, 0);
            assert_eq!(
                h.sent.len(),
                n as usize,
                "{pps} pps delay {delay}: nothing twice"
            );
            assert_eq!(missing(&h, n), Vec::<u32>::new());
            assert_eq!(h.red().forwarded[1].get(), 0);
            assert_eq!(h.red().late.get(), on_leg1, "every late copy counted late");
            assert_eq!(h.red().duplicates.get(), 0);
            h.assert_adds_up();
        }
    }
}

/// Datagram `i` of a stream whose encoder restarts after 2000, numbering
/// again from 1000 with the same SSRC.
fn restarted(i: u32) -> u16 {
    if i < 2000 {
        i as u16
    } else {
        (i - 1000) as u16
    }
}

#[test]
fn an_encoder_restart_1000_back_restarts_the_merge_within_a_few_packets() {
    // At 8 kpps the 20 ms skew is 160 numbers: the leading leg joins the
    // restarted stream ahead of where the lagging leg restarted it.
    for pps in [1000, 8000] {
        for delay in [0, 20] {
            let mut h = Harness::with_pool(2, merge(delay, 50), 8000);
            let ev = stream(
                4000,
                pps,
                2,
                |l| u64::from(l) * 20 * MS,
                |_, i| restarted(i),
                |_| SSRC,
            );
            run(&mut h, &ev, 200);
            let miss = missing(&h, 4000);
            assert!(miss.len() <= 3, "{pps} pps delay {delay}: missing {miss:?}");
            assert!(miss.iter().all(|&i| (2000..2004).contains(&i)), "{miss:?}");
            assert_eq!(h.red().resets.get(), 1);
            assert!(
                h.red().duplicates.get() < 4000 + 5,
                "no restart counted as duplicates"
            );
            assert_eq!(h.red().lost.get(), 0);
            h.assert_adds_up();
        }
    }
}

#[test]
fn an_encoder_restart_1000_back_restarts_the_failover_within_a_few_packets() {
    let mut h = Harness::new(2, failover(100, None, true));
    let ev = stream(
        4000,
        1000,
        2,
        |l| u64::from(l) * 20 * MS,
        |_, i| restarted(i),
        |_| SSRC,
    );
    run(&mut h, &ev, 50);
    let miss = missing(&h, 4000);
    assert!(miss.len() <= 3, "missing {miss:?}");
    assert!(miss.iter().all(|&i| (2000..2004).contains(&i)), "{miss:?}");
    assert_eq!(h.red().switches.get(), 0);
    h.assert_adds_up();
}

#[test]
fn a_leg_replaying_a_datagram_of_2_s_ago_disturbs_nothing() {
    for pps in [1000u64, 8000] {
        for delay in [0, 20] {
            let n = 4 * pps as u32;
            let mut h = Harness::with_pool(2, merge(delay, 50), 40_000);
            let mut ev = stream(
                n,
                pps,
                2,
                |l| u64::from(l) * 3 * MS,
                |_, i| i as u16,
                |_| SSRC,
            );
            // At 3 s, leg 1 sends the datagram of 1 s (its number 2 s back).
            let at = 1000 * MS + 3000 * MS + MS / 3;
            hostile(&mut ev, at, 1, pps as u16, SSRC);
            run(&mut h, &ev, 200);
            assert_eq!(missing(&h, n), Vec::<u32>::new(), "{pps} pps delay {delay}");
            assert!(!stray_left(&h));
            assert_eq!(h.red().lost.get(), 0);
            assert_eq!(h.red().resets.get(), 0);
            assert_eq!(
                h.red().replays.get() + h.red().duplicates.get(),
                n as u64 + 1
            );
            h.assert_adds_up();
        }
    }
}

/// A hostile datagram of the property test.
#[derive(Debug, Clone)]
enum Hostile {
    /// A number this far from the stream's (beyond where a real datagram
    /// could be: a number a real one might carry can't be told from it).
    Jump(u16),
    /// A random SSRC, a number this far off.
    Ssrc(u32, u16),
    /// The datagram this many numbers back (2 s ago and more at 1 kpps
    /// would be 2000).
    Replay(u16),
    /// An encoder restart on this leg only: a few consecutive numbers
    /// this far off, then back to the stream.
    Restart(u16, u8),
}

fn hostile_strategy() -> impl Strategy<Value = (u32, Hostile)> {
    // Off by 300 or more either way (the window plus a step).
    let far = (300u16..=65_236).prop_map(|d| d);
    (
        100u32..1100,
        prop_oneof![
            far.clone().prop_map(Hostile::Jump),
            (any::<u32>(), far.clone()).prop_map(|(s, d)| Hostile::Ssrc(s, d)),
            (300u16..3000).prop_map(Hostile::Replay),
            (far, 2u8..5).prop_map(|(d, n)| Hostile::Restart(d, n)),
        ],
    )
}

use proptest::prelude::*;

/// The property below, for one case: two to four legs carry one 1 kpps
/// stream, each with its own loss and delay (within the window, with
/// reordering); hostile datagrams land on one leg. The output carries
/// every number some leg delivered, none twice; a hostile datagram opens
/// no gap and none leaves.
fn hostile_case(
    legs: u8,
    delay: u64,
    skew: &[u64],
    seed: u64,
    bad_leg: u8,
    hostiles: &[(u32, Hostile)],
) -> Result<(), TestCaseError> {
    let n = 1200u32;
    let bad_leg = bad_leg % legs;
    // With a delay, copies must come within it (the skews' spread
    // plus the jitter below 20 ms); without, within the window.
    let skew: Vec<u64> = skew
        .iter()
        .map(|s| if delay > 0 { s % 15 } else { *s })
        .collect();
    let rnd = |leg: u8, i: u32, salt: u64| {
        (u64::from(i) << 8 ^ u64::from(leg) ^ seed ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40
    };
    let mut ev = Vec::new();
    let mut delivered = std::collections::BTreeSet::new();
    for i in 0..n {
        for leg in 0..legs {
            // 5 % loss per leg (none of the first datagram, where a
            // delayed merge starts).
            if i > 0 && rnd(leg, i, 1) % 100 < 5 {
                continue;
            }
            // The leg's skew plus up to 3 ms of jitter: reordering
            // (not of the first few: a delayed merge starts at the
            // first number to arrive).
            let t = 1000 * MS
                + u64::from(i) * MS
                + skew[usize::from(leg)] * MS
                + if i < 5 { 0 } else { rnd(leg, i, 2) % (3 * MS) };
            ev.push(Ev {
                t,
                leg,
                seq: i as u16,
                ts: i * 90,
                ssrc: SSRC,
            });
            delivered.insert(i as u16);
        }
    }
    for (k, (at, h)) in hostiles.iter().enumerate() {
        let t = 1000 * MS + u64::from(*at) * MS + skew[usize::from(bad_leg)] * MS + MS / 2;
        let cur = *at as u16;
        let ts = u32::MAX - 90 * (k as u32 + 1);
        let mut put = |dt: u64, seq: u16, ssrc: u32| {
            ev.push(Ev {
                t: t + dt,
                leg: bad_leg,
                seq,
                ts,
                ssrc,
            });
        };
        match *h {
            Hostile::Jump(d) => put(0, cur.wrapping_add(d), SSRC),
            Hostile::Ssrc(s, d) => put(0, cur.wrapping_add(d), s),
            Hostile::Replay(d) => put(0, cur.wrapping_sub(d), SSRC),
            Hostile::Restart(d, count) => {
                for j in 0..u16::from(count) {
                    put(
                        u64::from(j) * 10_000,
                        cur.wrapping_add(d).wrapping_add(j),
                        SSRC,
                    );
                }
            }
        }
    }
    ev.sort();
    let mut h = Harness::with_pool(legs, merge(delay, 100), 4000);
    run(&mut h, &ev, 300);
    let mut sent = h.sent.clone();
    sent.sort_unstable();
    let mut once = sent.clone();
    once.dedup();
    let twice: Vec<u16> = sent
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    prop_assert!(twice.is_empty(), "numbers left twice: {:?}", twice);
    let got: std::collections::BTreeSet<u16> = sent.iter().copied().collect();
    let gaps: Vec<u16> = delivered.difference(&got).copied().collect();
    prop_assert!(gaps.is_empty(), "numbers delivered, not sent: {:?}", gaps);
    prop_assert!(
        h.sent_ts.iter().all(|&ts| ts < n * 90),
        "a hostile datagram left"
    );
    prop_assert_eq!(h.red().lost.get(), 0);
    h.assert_adds_up();
    Ok(())
}

/// The case proptest found (cc e40eaf1f): leg 1 restarts 300 ahead for
/// three datagrams at 665, then goes back to the stream.
#[test]
fn a_three_datagram_restart_on_one_leg_sends_nothing_twice() {
    let hostiles = [(665, Hostile::Restart(300, 3))];
    hostile_case(2, 0, &[0; 4], 2_457_661_285_953_961_006, 1, &hostiles).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn merge_output_is_complete_and_once_under_hostile_datagrams(
        legs in 2u8..=4,
        delay in prop::sample::select(vec![0u64, 20]),
        skew in prop::collection::vec(0u64..40, 4),
        seed in any::<u64>(),
        bad_leg in 0u8..4,
        hostiles in prop::collection::vec(hostile_strategy(), 1..6),
    ) {
        hostile_case(legs, delay, &skew, seed, bad_leg, &hostiles)?;
    }
}

/// A leg that goes on sending, but a broken stream (every datagram a
/// jump nothing confirms: a corrupting path), is unhealthy as a silent
/// one is: the flow switches to the healthy leg after `after_ns`.
#[test]
fn failover_switches_away_from_a_leg_sending_a_broken_stream() {
    let mut h = Harness::new(2, failover(100, None, true));
    let ev: Vec<Ev> = stream(
        3000,
        1000,
        2,
        |l| u64::from(l) * 3 * MS,
        |_, i| i as u16,
        |_| SSRC,
    )
    .into_iter()
    .map(|mut e| {
        // From datagram 1000 on, leg 0's numbers are garbage.
        if e.leg == 0 && e.ts / 90 >= 1000 {
            e.seq = (e.ts / 90).wrapping_mul(7919) as u16 ^ 0x5a5a;
        }
        e
    })
    .collect();
    run(&mut h, &ev, 0);
    assert_eq!(h.red().switches.get(), 1, "switched once");
    assert_eq!(h.core.active_leg(h.flow), Some(LegId(1)));
    // What is missing is the detection time (100 ms), nothing else.
    let miss = missing(&h, 3000);
    assert!(miss.len() <= 105, "{} missing", miss.len());
    assert!(miss.iter().all(|&i| (1000..1105).contains(&i)));
    assert!(h.red().strays.get() + h.red().replays.get() >= 1900);
    h.assert_adds_up();
}

/// A VBR source whose gaps reach 106-144 ms under load, behind a 100 ms
/// floor: with the default `gap_factor` (4) the detection time grows
/// with the gaps it has seen and the flow never flaps; with 0 (the floor
/// alone) it switches at every long gap. A real outage still switches.
#[test]
fn failover_detection_adapts_to_a_vbr_source_and_still_sees_an_outage() {
    for (factor, flaps) in [(4u32, false), (0, true)] {
        let mut h = Harness::new(
            2,
            Redundancy::Failover {
                after_ns: 100 * MS,
                revert_after_ns: Some(1000 * MS),
                rtp: true,
                gap_factor: factor,
                rtp_rewrite: None,
            },
        );
        // Bursts of 10 datagrams every 40 ms, and every 25th burst comes
        // 106-144 ms after the previous one, on both legs alike.
        let mut ev = Vec::new();
        let mut t = 1000 * MS;
        let mut i = 0u32;
        for burst in 0..400u32 {
            t += if burst % 25 == 24 {
                (106 + u64::from(burst % 39)) * MS
            } else {
                40 * MS
            };
            for _ in 0..10 {
                for leg in 0..2u8 {
                    ev.push(Ev {
                        t: t + u64::from(leg) * MS / 2,
                        leg,
                        seq: i as u16,
                        ts: i * 90,
                        ssrc: SSRC,
                    });
                }
                i += 1;
                t += MS / 10;
            }
        }
        run(&mut h, &ev, 0);
        assert_eq!(h.red().switches.get() > 0, flaps, "gap_factor {factor}");
        assert_eq!(missing(&h, i), Vec::<u32>::new());
        if !flaps {
            // Leg 0 stops for good: the flow goes to leg 1 within 4 x the
            // longest gap learnt (under 600 ms).
            let mut now = t;
            for k in 0..100u32 {
                now += 40 * MS;
                h.rx_ts(1, (i + k) as u16, (i + k) * 90, SSRC, now);
                h.tick(now);
            }
            assert_eq!(h.red().switches.get(), 1);
            assert!(
                h.red().forwarded[1].get() >= 85,
                "{}",
                h.red().forwarded[1].get()
            );
        }
    }
}

/// An encoder stopped and started again from number 0 (its SSRC kept)
/// after every leg was silent longer than the window: the restarted
/// stream arrives whole on merge and failover flows alike, its first
/// datagram included (it used to be dropped, unconfirmed, as a replay).
#[test]
fn a_stream_restarted_from_0_after_a_pause_loses_nothing() {
    for redundancy in [merge(0, 50), merge(20, 50), failover(100, None, true)] {
        let mut h = Harness::with_pool(2, redundancy, 8000);
        // 3000 datagrams, then 1 s of silence, then 1000 numbered from 0.
        let mut ev = stream(
            4000,
            1000,
            2,
            |l| u64::from(l) * 3 * MS,
            |_, i| {
                if i < 3000 {
                    i as u16
                } else {
                    (i - 3000) as u16
                }
            },
            |_| SSRC,
        );
        for e in &mut ev {
            if e.ts / 90 >= 3000 {
                e.t += 1000 * MS;
            }
        }
        ev.sort();
        run(&mut h, &ev, 200);
        let mut v: Vec<u32> = h.sent_ts.iter().map(|ts| ts / 90).collect();
        v.sort_unstable();
        let twice: Vec<u32> = v
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        assert_eq!(twice, Vec::<u32>::new(), "{redundancy:?}");
        assert_eq!(missing(&h, 4000), Vec::<u32>::new(), "{redundancy:?}");
        h.assert_adds_up();
    }
}

/// Main and backup from two independent encoders whose numberings lie
/// within [`SPAN`] of each other (ffmpeg starts its numbers below 4096):
/// after the main leg goes silent the backup's stream leaves, whichever
/// leg is numbered lower (its datagrams were all `late` before: a
/// switch to a leg numbered 2000 behind sent nothing), and again after
/// the revert to the main leg.
#[test]
fn failover_to_an_independent_encoder_numbered_behind_forwards_it() {
    for (main, backup) in [(3000u16, 1000u16), (1000, 3000)] {
        let mut h = Harness::new(2, failover(100, Some(500), true));
        // 4000 datagrams; leg 0 is cut from 1000 to 2000, then the flow
        // goes back to it.
        let ev: Vec<Ev> = stream(
            4000,
            1000,
            2,
            |l| u64::from(l) * 2 * MS,
            |l, i| if l == 0 { main } else { backup }.wrapping_add(i as u16),
            |l| SSRC + u32::from(l),
        )
        .into_iter()
        .filter(|e| e.leg == 1 || !(1000..2000).contains(&(e.ts / 90)))
        .collect();
        run(&mut h, &ev, 0);
        assert_eq!(h.red().switches.get(), 2, "{main}/{backup}");
        let miss = missing(&h, 4000);
        assert!(miss.len() <= 105, "{main}/{backup}: {} missing", miss.len());
        assert_eq!(h.red().late.get(), 0, "{main}/{backup}");
        h.assert_adds_up();
    }
}
