//! A flow's `spread`: how many workers serve its outputs (see
//! [`Flow::spread`]). At least 1, at most its outputs (each worker serves
//! at least one), and not together with `core` (which pins the flow to one
//! worker). Whether there are that many workers is the daemon's to check:
//! the file doesn't know.

use std::ops::Range;

use toml::de::DeTable;

use super::Walker;
use crate::model::MAX_SPREAD;

impl Walker<'_> {
    /// The flow's `spread` (1 when absent); `None` (with an error) when it
    /// is invalid. `outputs` is how many outputs parsed, `core` whether
    /// `core` is set.
    pub(super) fn spread(
        &mut self,
        t: &DeTable<'_>,
        p: &str,
        outputs: usize,
        core: bool,
    ) -> Option<usize> {
        let Some(v) = t.get("spread") else {
            return Some(1);
        };
        let max = i128::try_from(MAX_SPREAD).unwrap_or(i128::MAX);
        let n = self
            .ranged(v, p, "spread", 1, max)
            .and_then(|n| usize::try_from(n).ok())?;
        let span: Range<usize> = v.span();
        if n > 1 && core {
            self.err(
                &span,
                format!(
                    "{p}spread {n} serves the flow from {n} workers, but core pins it to one; remove core or spread"
                ),
            );
            return None;
        }
        if outputs > 0 && n > outputs {
            self.err(
                &span,
                format!(
                    "{p}spread {n} is more than the flow's {outputs} outputs (each worker serves at least one); use spread = {outputs} or less"
                ),
            );
            return None;
        }
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use crate::parse;
    use crate::parse::tests::{error, errors};

    /// A flow with `outputs` outputs and `extra` from line 5.
    fn flow(outputs: usize, extra: &str) -> String {
        let outs: Vec<String> = (0..outputs)
            .map(|i| {
                format!(
                    "{{ interface = \"eth1\", address = \"239.2.2.2\", port = {} }}",
                    6000 + i
                )
            })
            .collect();
        format!(
            "[[flow]]\nname = \"x\"\ninput = {{ interface = \"eth0\", address = \"239.1.1.1\", port = 5000 }}\noutputs = [{}]\n{extra}",
            outs.join(", ")
        )
    }

    fn spread_of(text: &str) -> usize {
        parse(text, "t.toml")
            .unwrap_or_else(|e| panic!("{e}"))
            .flows
            .by_name("x")
            .expect("flow x")
            .spread
    }

    #[test]
    fn spread_defaults_to_one_and_is_read() {
        assert_eq!(spread_of(&flow(3, "")), 1);
        assert_eq!(spread_of(&flow(3, "spread = 2\n")), 2);
        assert_eq!(spread_of(&flow(3, "spread = 3\n")), 3);
        // With legs: each shard runs its own merge or failover.
        let legs = "[[flow]]\nname = \"x\"\ninputs = [{ interface = \"eth0\", address = \"239.1.1.1\", port = 5000 }, \
                    { interface = \"eth2\", address = \"239.1.1.1\", port = 5000 }]\nredundancy = \"failover\"\n\
                    outputs = [{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }, \
                    { interface = \"eth1\", address = \"239.2.2.2\", port = 6001 }]\nspread = 2\n";
        assert_eq!(spread_of(legs), 2);
    }

    #[test]
    fn spread_zero_or_not_an_integer_is_refused_where_it_is_written() {
        let e = error(&flow(2, "spread = 0\n"));
        assert!(e.starts_with("t.toml:5:10: "), "{e}");
        assert!(
            e.contains("flow \"x\": spread 0 is out of range; use 1-"),
            "{e}"
        );
        let e = error(&flow(2, "spread = \"2\"\n"));
        assert!(e.starts_with("t.toml:5:10: "), "{e}");
        assert!(e.contains("spread") && e.contains("an integer"), "{e}");
        let e = error(&flow(2, "spread = 1.5\n"));
        assert!(e.contains("an integer"), "{e}");
    }

    #[test]
    fn spread_beyond_the_outputs_is_refused_naming_both() {
        let e = error(&flow(2, "spread = 3\n"));
        assert!(e.starts_with("t.toml:5:10: "), "{e}");
        assert!(
            e.contains("spread 3 is more than the flow's 2 outputs") && e.contains("spread = 2"),
            "{e}"
        );
    }

    #[test]
    fn spread_with_core_is_refused() {
        let e = errors(&flow(2, "core = 0\nspread = 2\n"));
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(e[0].contains("remove core or spread"), "{}", e[0]);
        // spread = 1 with core is the same as core alone.
        assert_eq!(spread_of(&flow(2, "core = 0\nspread = 1\n")), 1);
    }
}
