//! Which pool class a datagram's copy goes to: the smallest that fits, or,
//! when that one has run dry, the next larger one with a free buffer
//! (counted as a fallback); and a per-flow reserve in every class so one
//! flooding flow can't take a class's last buffers from the others.
//!
//! The reserve: with `n >= 2` flows on a worker, each flow is promised
//! `capacity / (2 n)` buffers of each class. A flow may take a buffer of a
//! class only while more buffers are free than the other flows' unmet
//! promises (promise minus what they hold). So a flood uses at least half
//! of every class, and a quiet flow always finds its reserve. O(1) per
//! datagram: the unmet total is kept up to date at every take and give.

use mcrelay_pool::{Buffer, Class, PoolSet};

/// One flow's buffers held per class.
#[derive(Debug, Default, Clone, Copy)]
pub struct Held([u32; 3]);

impl Held {
    /// A buffer of `class` changes hands from the flow holding `from` to
    /// the one holding `to` (a flow taking over from the one it
    /// replaces); [`Reserve::rebalance`] follows.
    pub fn hand_over(from: &mut Held, to: &mut Held, class: Class) {
        let c = class.index();
        from.0[c] = from.0[c].saturating_sub(1);
        to.0[c] = to.0[c].saturating_add(1);
    }
}

/// The per-class reserves of one worker's flows.
#[derive(Debug, Default)]
pub struct Reserve {
    /// Buffers promised to each flow, per class.
    per_flow: [u32; 3],
    /// Sum over flows of `per_flow - held` where positive, per class.
    unmet: [u32; 3],
}

/// What admission did with a datagram's class.
#[derive(Debug)]
pub enum Taken {
    /// In the smallest class that fits.
    Fitting(Buffer),
    /// In a larger class: the fitting one had nothing this flow may take.
    Fallback(Buffer),
    /// No class that fits had a buffer this flow may take.
    Exhausted,
}

impl Reserve {
    /// Recompute the promises for the flows' current holdings (on every
    /// flow added or removed: control-plane work, O(flows)).
    pub fn rebalance<'a>(&mut self, pool: &PoolSet, flows: impl Iterator<Item = &'a Held> + Clone) {
        let n = u32::try_from(flows.clone().count()).unwrap_or(u32::MAX);
        for class in Class::ALL {
            let c = class.index();
            self.per_flow[c] = if n >= 2 {
                pool.capacity(class) / (2 * n)
            } else {
                0
            };
            let per_flow = self.per_flow[c];
            self.unmet[c] = flows.clone().map(|h| per_flow.saturating_sub(h.0[c])).sum();
        }
    }

    /// Take a buffer for `len` bytes (at most `MAX_PAYLOAD`) for a flow
    /// holding `held`. Inlined: out of line (the inliner's choice once
    /// the redundancy rules grew `Core::receive_on`), the one-leg path
    /// cost ~50 instructions more per datagram
    /// (`benches/core_instructions.rs`).
    #[inline(always)]
    pub fn take(&mut self, pool: &mut PoolSet, held: &mut Held, len: usize) -> Taken {
        // `Class::for_len` without its branch chain.
        let fitting =
            usize::from(len > Class::Small.size()) + usize::from(len > Class::Standard.size());
        for c in fitting..Class::ALL.len() {
            let class = Class::ALL[c];
            let own = self.per_flow[c].saturating_sub(held.0[c]);
            let others = self.unmet[c].saturating_sub(own);
            if pool.free(class) <= others {
                if c == fitting && others == 0 {
                    // Counted as the pool's exhaustion of this class, as a
                    // plain take would.
                    let _ = pool.take_class(class);
                }
                continue;
            }
            let Some(buf) = pool.take_class(class) else {
                continue;
            };
            if own > 0 {
                self.unmet[c] -= 1;
            }
            held.0[c] += 1;
            return if c == fitting {
                Taken::Fitting(buf)
            } else {
                Taken::Fallback(buf)
            };
        }
        Taken::Exhausted
    }

    /// A buffer of `class` held by a flow holding `held` went back to the
    /// pool.
    #[inline]
    pub fn given(&mut self, held: &mut Held, class: Class) {
        let c = class.index();
        held.0[c] = held.0[c].saturating_sub(1);
        if held.0[c] < self.per_flow[c] {
            self.unmet[c] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcrelay_pool::PoolConfig;

    fn pool(n: u32) -> PoolSet {
        PoolSet::new(PoolConfig {
            small: n,
            standard: n,
            jumbo: n,
        })
        .expect("pool")
    }

    #[test]
    fn a_dry_class_falls_back_to_the_next_larger_one() {
        let mut pool = pool(2);
        let mut r = Reserve::default();
        let mut held = Held::default();
        r.rebalance(&pool, [held].iter());
        let mut bufs = Vec::new();
        for _ in 0..2 {
            match r.take(&mut pool, &mut held, 1000) {
                Taken::Fitting(b) => bufs.push(b),
                other => panic!("expected small, got {other:?}"),
            }
        }
        match r.take(&mut pool, &mut held, 1000) {
            Taken::Fallback(b) => {
                assert_eq!(b.class(), Class::Standard);
                bufs.push(b);
            }
            other => panic!("expected a standard fallback, got {other:?}"),
        }
        for _ in 0..3 {
            match r.take(&mut pool, &mut held, 1000) {
                Taken::Fallback(b) => bufs.push(b),
                other => panic!("expected a fallback, got {other:?}"),
            }
        }
        assert!(matches!(
            r.take(&mut pool, &mut held, 1000),
            Taken::Exhausted
        ));
        assert!(matches!(
            r.take(&mut pool, &mut held, 5000),
            Taken::Exhausted
        ));
        for b in bufs {
            let class = b.class();
            pool.give(b).expect("home");
            r.given(&mut held, class);
        }
        assert_eq!(held.0, [0; 3]);
    }

    #[test]
    fn one_flow_cannot_take_another_flows_reserve() {
        let mut pool = pool(8);
        let mut r = Reserve::default();
        let (mut flood, mut quiet) = (Held::default(), Held::default());
        r.rebalance(&pool, [flood, quiet].iter());
        // 8 / (2 * 2) = 2 promised to each flow in each class.
        let mut bufs = Vec::new();
        while let Taken::Fitting(b) | Taken::Fallback(b) = r.take(&mut pool, &mut flood, 100) {
            bufs.push(b);
        }
        // The flood took everything but the quiet flow's 2 per class.
        assert_eq!(bufs.len(), 3 * 6);
        let mut quiet_bufs = Vec::new();
        for _ in 0..2 {
            match r.take(&mut pool, &mut quiet, 100) {
                Taken::Fitting(b) => quiet_bufs.push(b),
                other => panic!("the reserve is there: {other:?}"),
            }
        }
        // Then its reserves in the larger classes, as fallbacks.
        for _ in 0..4 {
            match r.take(&mut pool, &mut quiet, 100) {
                Taken::Fallback(b) => quiet_bufs.push(b),
                other => panic!("the larger reserves are there: {other:?}"),
            }
        }
        assert!(matches!(
            r.take(&mut pool, &mut quiet, 100),
            Taken::Exhausted
        ));
        for (bufs, held) in [(bufs, &mut flood), (quiet_bufs, &mut quiet)] {
            for b in bufs {
                let class = b.class();
                pool.give(b).expect("home");
                r.given(held, class);
            }
        }
        assert_eq!(r.unmet, [4; 3], "every promise unmet again");
    }
}
