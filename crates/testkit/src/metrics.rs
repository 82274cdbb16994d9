//! Reading a Prometheus text exposition the way the counter tests need:
//! every `_total` series ([`totals`]) and which of them went down
//! between two reads ([`fell`]).

use std::collections::BTreeMap;

/// The `_total` series of an exposition, by name and labels.
pub fn totals(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            series
                .split('{')
                .next()
                .is_some_and(|n| n.ends_with("_total"))
        })
        .filter_map(|(series, v)| Some((series.to_owned(), v.parse().ok()?)))
        .collect()
}

/// What went down from `was` to `now`, of the series present in both,
/// one line each.
pub fn fell<V: PartialOrd + Copy + std::fmt::Debug>(
    was: &BTreeMap<String, V>,
    now: &BTreeMap<String, V>,
) -> Vec<String> {
    was.iter()
        .filter_map(|(k, v)| {
            let n = now.get(k)?;
            (n < v).then(|| format!("{k}: {v:?} -> {n:?}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_totals_and_finds_what_fell() {
        let was = super::totals("# TYPE a counter\na_total{x=\"1 2\"} 5\nb_bytes 3\nc_total 2\n");
        assert_eq!(was.len(), 2);
        let now = super::totals("a_total{x=\"1 2\"} 4\nc_total 2\n");
        assert_eq!(super::fell(&was, &now), ["a_total{x=\"1 2\"}: 5.0 -> 4.0"]);
    }
}
