//! Numbers for people: SI-prefixed counts, bytes, rates and durations, and
//! the per-second growth of a counter between two readings. Shared by the
//! tables here and `mcrelayctl top`; nothing else in the crate depends on
//! where it is printed.

use std::time::Duration;

/// A count with an SI prefix: `812`, `1.23k`, `45.6M`.
pub fn human_count(n: u64) -> String {
    if n < 1000 {
        return n.to_string();
    }
    let (x, prefix) = si(n as f64);
    format!("{}{prefix}", three_digits(x))
}

/// Bytes with an SI prefix: `512 B`, `1.05 MB`.
pub fn human_bytes(n: u64) -> String {
    if n < 1000 {
        return format!("{n} B");
    }
    let (x, prefix) = si(n as f64);
    format!("{} {prefix}B", three_digits(x))
}

/// A per-second rate with an SI prefix and no unit: `0`, `950`, `12.3k`.
pub fn human_rate(per_second: f64) -> String {
    let (x, prefix) = si(per_second);
    if x == 0.0 {
        return "0".into();
    }
    format!("{}{prefix}", three_digits(x))
}

/// A bit rate with an SI prefix: `0 b/s`, `950 b/s`, `12.3 Mb/s`.
pub fn human_bits_per_second(bits: f64) -> String {
    let (x, prefix) = si(bits);
    if x == 0.0 {
        return "0 b/s".into();
    }
    format!("{} {prefix}b/s", three_digits(x))
}

/// A duration as `12s`, `5m 03s`, `1h 02m 03s` or `2d 03h 04m`.
pub fn human_duration(seconds: f64) -> String {
    let s = Duration::try_from_secs_f64(seconds).map_or(0, |d| d.as_secs());
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}d {h:02}h {m:02}m")
    } else if h > 0 {
        format!("{h}h {m:02}m {s:02}s")
    } else if m > 0 {
        format!("{m}m {s:02}s")
    } else {
        format!("{s}s")
    }
}

/// `value` scaled below 999.5 (so three digits never round up to 1000) and
/// its prefix. Negative, NaN and infinite values count as 0.
fn si(value: f64) -> (f64, &'static str) {
    const PREFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
    if !value.is_finite() || value <= 0.0 {
        return (0.0, "");
    }
    let mut x = value;
    for (i, prefix) in PREFIXES.iter().enumerate() {
        if x < 999.5 || i == PREFIXES.len() - 1 {
            return (x, prefix);
        }
        x /= 1000.0;
    }
    (x, "E")
}

/// Three significant digits for `x` in `[0, 999.5)`.
fn three_digits(x: f64) -> String {
    if x < 9.995 {
        format!("{x:.2}")
    } else if x < 99.95 {
        format!("{x:.1}")
    } else {
        format!("{x:.0}")
    }
}

/// Growth of a counter from `prev` to `cur` per second; 0 if it went
/// backwards (a restart) or no time passed.
pub fn per_second(prev: u64, cur: u64, seconds: f64) -> f64 {
    if seconds > 0.0 && cur >= prev {
        (cur - prev) as f64 / seconds
    } else {
        0.0
    }
}
