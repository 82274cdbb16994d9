//! A flow's recent packet rates, for its sparkline: a fixed ring of the
//! last [`HISTORY`] samples, allocated whole when the flow first appears
//! (one sample per refresh), so a long-running view never grows.

/// Samples kept per flow: two minutes at the default 1 s refresh.
pub const HISTORY: usize = 120;

/// The last [`HISTORY`] rates of one flow, oldest overwritten first.
#[derive(Debug, Clone)]
pub struct History {
    samples: [u64; HISTORY],
    /// Samples stored, at most [`HISTORY`].
    len: usize,
    /// Where the next sample goes.
    next: usize,
}

impl Default for History {
    fn default() -> Self {
        Self {
            samples: [0; HISTORY],
            len: 0,
            next: 0,
        }
    }
}

impl History {
    /// Adds the newest sample, dropping the oldest once full.
    pub fn push(&mut self, sample: u64) {
        self.samples[self.next] = sample;
        self.next = (self.next + 1) % HISTORY;
        self.len = (self.len + 1).min(HISTORY);
    }

    /// The newest `n` samples (fewer if fewer were pushed), oldest first.
    pub fn latest(&self, n: usize) -> impl Iterator<Item = u64> + '_ {
        let n = n.min(self.len);
        let start = (self.next + HISTORY - n) % HISTORY;
        (0..n).map(move |i| self.samples[(start + i) % HISTORY])
    }
}

/// A rate as a sample: rounded, negative and non-finite as 0.
pub fn sample(per_second: f64) -> u64 {
    if per_second.is_finite() && per_second > 0.0 {
        // The value is finite and positive; `as` saturates at u64::MAX.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = per_second.round() as u64;
        n
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_samples_in_order() {
        let mut h = History::default();
        assert_eq!(h.latest(5).count(), 0);
        for v in 1..=3 {
            h.push(v);
        }
        assert_eq!(h.latest(10).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(h.latest(2).collect::<Vec<_>>(), [2, 3]);
        for v in 4..=(HISTORY as u64 + 10) {
            h.push(v);
        }
        assert_eq!(h.latest(HISTORY + 1).count(), HISTORY);
        let all: Vec<u64> = h.latest(usize::MAX).collect();
        assert_eq!(all.len(), HISTORY);
        assert_eq!(all[0], 11, "the oldest ten were overwritten");
        assert_eq!(*all.last().unwrap(), HISTORY as u64 + 10);
        assert!(all.windows(2).all(|w| w[1] == w[0] + 1));
    }

    #[test]
    fn samples_round_and_clamp() {
        assert_eq!(sample(2.6), 3);
        assert_eq!(sample(0.4), 0);
        assert_eq!(sample(-5.0), 0);
        assert_eq!(sample(f64::NAN), 0);
        assert_eq!(sample(f64::INFINITY), 0);
        assert_eq!(sample(1e30), u64::MAX);
    }
}
