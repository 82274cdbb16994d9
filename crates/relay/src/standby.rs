//! Warm standby: the rule that a standby worker sends nothing.
//!
//! A daemon in standby (`daemon.mode = "standby"`, `mcrelayctl standby`)
//! keeps every flow's sockets open, its groups joined and its receive
//! armed, so that taking over (`mcrelayctl active`) is this flag flipping,
//! not a start-up. While it is set, [`Core::receive`] counts each datagram
//! (`packets_in`, `bytes_in`, and `standby_discarded`) and discards it
//! before admission: no pool buffer is taken, nothing is copied or queued,
//! no output counter moves. The datagram was already read from the socket
//! (into a receive buffer that goes straight back to the kernel), which is
//! what keeps the socket buffer from filling: a standby that stopped
//! reading would count kernel drops (which alert) and, on taking over,
//! first relay a socket buffer's worth of stale datagrams.
//!
//! `standby_discarded` is not a drop reason: an operator's alert on drops
//! stays quiet on a healthy standby. Stream health still sees every
//! datagram (the driver shows it before the core), so a standby reports
//! whether its inputs would be good to take over with.
//!
//! Sends already in flight when the flag is set complete as usual and
//! give their buffers back; a flow that was paused with every output full
//! resumes by the usual rule once they drain.
//!
//! The numbers a merge never saw while standing by were discarded on
//! purpose, not lost: taking over starts each merge afresh (one holding
//! no packet), so its first datagram starts the stream and nothing
//! discarded is counted `lost` or as a restart.

use super::Core;
use super::redundancy::Mode;

impl Core {
    /// Enter (`true`) or leave (`false`) standby; takes effect from the
    /// next datagram.
    pub fn set_standby(&mut self, standby: bool) {
        if self.standby && !standby {
            for f in self.flows.iter_mut().flatten() {
                if let Mode::Merge(m) = &f.mode
                    && m.held() == 0
                {
                    f.mode = Mode::new(f.legs, f.redundancy);
                    f.refresh_plain();
                }
            }
        }
        self.standby = standby;
    }

    /// Whether this core is in standby.
    pub fn is_standby(&self) -> bool {
        self.standby
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use mcrelay_pool::{Class, PoolConfig, PoolSet};

    use crate::counters::{FlowCounters, OutputCounters};
    use crate::{Core, OutputSpec, Received, SendKind};

    fn core() -> Core {
        Core::new(
            PoolSet::new(PoolConfig {
                small: 8,
                standard: 8,
                jumbo: 8,
            })
            .expect("pool"),
        )
    }

    fn in_use(core: &Core) -> u32 {
        Class::ALL.iter().map(|&c| core.pool().in_use(c)).sum()
    }

    /// A flow with two outputs of depth 4.
    fn flow(core: &mut Core) -> (crate::FlowId, Arc<FlowCounters>, Vec<Arc<OutputCounters>>) {
        let outs: Vec<Arc<OutputCounters>> = (0..2).map(|_| Arc::default()).collect();
        let specs = outs.iter().map(|c| OutputSpec {
            depth: 4,
            gso: false,
            counters: Arc::clone(c),
            resume_after: None,
        });
        let counters = Arc::<FlowCounters>::default();
        let id = core
            .add_flow(
                specs,
                Arc::clone(&counters),
                1,
                crate::Redundancy::Single,
                8,
            )
            .expect("room");
        (id, counters, outs)
    }

    #[test]
    fn a_standby_core_counts_and_discards_and_sends_nothing() {
        let mut c = core();
        let (f, counters, outs) = flow(&mut c);
        c.set_standby(true);
        assert!(c.is_standby());
        for _ in 0..100 {
            assert_eq!(c.receive(f, &[7u8; 1316]), Received::Standby);
        }
        let mut sends = 0;
        c.flush(&mut |_, _| {
            sends += 1;
            true
        });
        assert_eq!(sends, 0, "a standby core hands out no send");
        assert_eq!(in_use(&c), 0, "no pool buffer taken");
        assert_eq!(counters.packets_in.get(), 100);
        assert_eq!(counters.bytes_in.get(), 131_600);
        assert_eq!(counters.standby_discarded.get(), 100);
        assert_eq!(counters.drops.oversize.get(), 0);
        assert_eq!(counters.drops.pool_exhausted.get(), 0);
        for o in &outs {
            assert_eq!(o.drop_backlog.get(), 0, "not counted as a drop");
            assert_eq!(o.packets_out.get(), 0);
        }
        // Even datagrams that would be dropped as oversize: standby first.
        assert_eq!(c.receive(f, &[0u8; 9500]), Received::Standby);
        assert_eq!(counters.drops.oversize.get(), 0);
    }

    #[test]
    fn taking_over_relays_the_next_datagram_and_standing_by_stops_at_once() {
        let mut c = core();
        let (f, counters, outs) = flow(&mut c);
        c.set_standby(true);
        assert_eq!(c.receive(f, b"before"), Received::Standby);
        c.set_standby(false);
        assert_eq!(c.receive(f, b"after"), Received::Queued);
        let mut sent = Vec::new();
        c.flush(&mut |req, _| {
            if let SendKind::Plain { slot } = req.kind {
                sent.push((req.token(), slot));
            }
            true
        });
        assert_eq!(sent.len(), 2, "one send per output");
        // Back to standby with those two sends still in the kernel: they
        // complete as usual and the buffer goes back.
        c.set_standby(true);
        assert_eq!(c.receive(f, b"later"), Received::Standby);
        let mut more = 0;
        c.flush(&mut |_, _| {
            more += 1;
            true
        });
        assert_eq!(more, 0);
        assert_eq!(in_use(&c), 1);
        for (token, _) in sent {
            c.complete(token, 5, &mut |_, _| true);
        }
        assert_eq!(in_use(&c), 0);
        assert!(c.in_flight().is_empty());
        assert_eq!(counters.standby_discarded.get(), 2);
        assert_eq!(counters.packets_in.get(), 3);
        for o in &outs {
            assert_eq!(o.packets_out.get(), 1);
        }
    }

    /// Issue 26: `merge lost` rose by exactly the datagrams a standby
    /// discarded. Discarded on purpose is not lost, nor a restart.
    #[test]
    fn what_a_merge_discarded_in_standby_is_not_lost() {
        const MS: u64 = 1_000_000;
        let mut c = core();
        let counters = Arc::<FlowCounters>::default();
        let spec = OutputSpec {
            depth: 4,
            gso: false,
            counters: Arc::default(),
            resume_after: None,
        };
        let merge = crate::Redundancy::Merge {
            delay_ns: 0,
            window_ns: 50 * MS,
        };
        let f = c
            .add_flow([spec], Arc::clone(&counters), 2, merge, 8)
            .expect("room");
        let mut seq = 0u16;
        let mut now = 0;
        let step = |c: &mut Core, seq: &mut u16, now: &mut u64| {
            let mut d = [0u8; 40];
            let _ = mcrelay_wire::rtp::build(&mut d, 33, *seq, 0, 9);
            for leg in 0..2 {
                c.receive_on(f, crate::LegId(leg), &d, *now);
            }
            c.tick(*now);
            let mut tokens = Vec::new();
            c.flush(&mut |req, _| {
                tokens.push(req.token());
                true
            });
            for t in tokens {
                c.complete(t, 40, &mut |_, _| true);
            }
            *seq = seq.wrapping_add(1);
            *now += MS;
        };
        for round in 0..5 {
            for _ in 0..100 {
                step(&mut c, &mut seq, &mut now);
            }
            c.set_standby(true);
            // 3000 numbers in standby the first time (a restart's worth
            // of jump), 100 after.
            for _ in 0..if round == 0 { 5000 } else { 100 } {
                step(&mut c, &mut seq, &mut now);
            }
            c.set_standby(false);
        }
        for _ in 0..200 {
            step(&mut c, &mut seq, &mut now);
        }
        let red = &counters.redundancy;
        assert_eq!(
            (red.lost.get(), red.resets.get(), red.late.get()),
            (0, 0, 0),
            "nothing discarded in standby is lost"
        );
        assert_eq!(counters.standby_discarded.get(), 2 * (5000 + 4 * 100));
        assert_eq!(red.forwarded_total(), 5 * 100 + 200);
    }

    #[test]
    fn a_new_core_is_active() {
        assert!(!core().is_standby());
    }
}
