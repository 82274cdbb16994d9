//! Send pacing: a token bucket on the monotonic clock ([`Instant`] is
//! `CLOCK_MONOTONIC`). Datagram `i` is due at `i / rate` seconds; the
//! sender asks how many are due, sleeping while the next one is far off and
//! spinning the last [`SPIN`], so rates of several hundred thousand per
//! second come out accurate. Falling behind (descheduled, a full socket
//! buffer) is caught up in batches, but at most [`MAX_DEBT`] worth.

use std::time::{Duration, Instant};

/// Spin instead of sleeping for the last stretch before a datagram is due.
pub const SPIN: Duration = Duration::from_micros(50);
/// Most lateness caught up by bursting; beyond it the schedule slips.
pub const MAX_DEBT: Duration = Duration::from_millis(10);

/// Paces datagrams at `rate` per second (0 = unpaced).
#[derive(Debug, Clone)]
pub struct Pacer {
    rate: u64,
    /// The schedule: datagram `base_index + k` is due at `base + k / rate`.
    base: Instant,
    base_index: u64,
    /// Datagrams released so far.
    released: u64,
}

impl Pacer {
    pub fn new(rate: u64) -> Self {
        Self::starting_at(rate, Instant::now())
    }

    pub fn starting_at(rate: u64, start: Instant) -> Self {
        Self {
            rate,
            base: start,
            base_index: 0,
            released: 0,
        }
    }

    /// When datagram `index` is due.
    fn due(&self, index: u64) -> Instant {
        let k = u128::from(index.saturating_sub(self.base_index));
        let nanos = k * 1_000_000_000 / u128::from(self.rate.max(1));
        self.base + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// How many datagrams (1..=`max`) are due at `now`, or when the next one
    /// is if none is.
    pub fn poll(&mut self, now: Instant, max: usize) -> Result<usize, Instant> {
        let max = max.max(1);
        if self.rate == 0 {
            return Ok(max);
        }
        let next = self.due(self.released);
        if now < next {
            return Err(next);
        }
        if now - next > MAX_DEBT {
            // Too far behind: slip the schedule rather than burst it all.
            self.base = now - MAX_DEBT;
            self.base_index = self.released;
        }
        let elapsed = now.saturating_duration_since(self.base).as_nanos();
        let due_total =
            u128::from(self.base_index) + elapsed * u128::from(self.rate) / 1_000_000_000 + 1;
        let ready = due_total.saturating_sub(u128::from(self.released));
        Ok(usize::try_from(ready).unwrap_or(usize::MAX).clamp(1, max))
    }

    /// Block until at least one datagram is due; how many (1..=`max`) are.
    pub fn wait(&mut self, max: usize) -> usize {
        loop {
            let now = Instant::now();
            match self.poll(now, max) {
                Ok(n) => return n,
                Err(next) => {
                    let left = next - now;
                    if left > SPIN * 2 {
                        std::thread::sleep(left - SPIN);
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        }
    }

    /// `n` datagrams went out.
    pub fn sent(&mut self, n: usize) {
        self.released += u64::try_from(n).unwrap_or(u64::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_on_schedule() {
        let t0 = Instant::now();
        let mut p = Pacer::starting_at(1000, t0);
        // The first is due at once, the second after 1 ms.
        assert_eq!(p.poll(t0, 64), Ok(1));
        p.sent(1);
        assert_eq!(p.poll(t0, 64), Err(t0 + Duration::from_millis(1)));
        // 5.5 ms in: datagrams 1..=5 are due.
        assert_eq!(p.poll(t0 + Duration::from_micros(5500), 64), Ok(5));
        assert_eq!(p.poll(t0 + Duration::from_micros(5500), 3), Ok(3));
        p.sent(3);
        assert_eq!(p.poll(t0 + Duration::from_micros(5500), 64), Ok(2));
    }

    #[test]
    fn lateness_beyond_the_debt_limit_slips() {
        let t0 = Instant::now();
        let mut p = Pacer::starting_at(100_000, t0);
        p.sent(1);
        // 1 s late: only MAX_DEBT worth (1000 datagrams) may burst.
        let late = t0 + Duration::from_secs(1);
        assert_eq!(p.poll(late, usize::MAX), Ok(1001));
    }

    #[test]
    fn unpaced_releases_everything() {
        let mut p = Pacer::new(0);
        assert_eq!(p.poll(Instant::now(), 64), Ok(64));
    }

    #[test]
    fn wait_keeps_the_rate() {
        let mut p = Pacer::new(20_000);
        let start = Instant::now();
        let mut sent = 0;
        while sent < 2000 {
            let n = p.wait(64).min(2000 - sent);
            p.sent(n);
            sent += n;
        }
        let took = start.elapsed().as_secs_f64();
        // 2000 at 20 kpps is 0.1 s (the first at t=0).
        assert!((0.095..0.5).contains(&took), "took {took} s");
    }
}
