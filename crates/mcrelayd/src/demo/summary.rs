//! The demo's closing report and verdict, from plain numbers: what the
//! sender sent, what the daemon's counters say it received and relayed,
//! what each receiver got byte-exact, and the daemon's CPU time. Pure, so
//! the verdict rules are unit-tested.

use std::fmt::Write;

/// One output of one flow, end to end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputResult {
    pub flow: String,
    /// The output's group and port.
    pub output: String,
    /// Datagrams the sender sent to the flow's input.
    pub sent: u64,
    /// The daemon's `packets_in` of the flow (None: no final snapshot).
    pub relay_in: Option<u64>,
    /// The daemon's `packets_out` of this output.
    pub relayed: Option<u64>,
    /// Distinct datagrams of this flow that arrived and passed the
    /// byte-by-byte check (header, length, every payload byte).
    pub received: u64,
    pub duplicates: u64,
    pub reordered: u64,
    /// Datagrams that failed the check or belong to another flow.
    pub bad: u64,
}

impl OutputResult {
    /// Sent but not received byte-exact.
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }

    /// Everything arrived once, intact and in order.
    pub fn clean(&self) -> bool {
        self.sent > 0
            && self.lost() == 0
            && self.duplicates == 0
            && self.reordered == 0
            && self.bad == 0
    }
}

/// The daemon's CPU time while traffic flowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cpu {
    /// User plus system time of the daemon (all threads), its zygote and helper.
    pub seconds: f64,
    /// Packets the daemon sent out over the same time, all outputs.
    pub packets: u64,
    pub daemon_pid: u32,
}

/// Everything the report says.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Seconds the sender sent for.
    pub seconds: f64,
    /// Datagrams per second per flow.
    pub rate: u64,
    pub outputs: Vec<OutputResult>,
    pub cpu: Option<Cpu>,
    /// Stopped early by a signal.
    pub interrupted: bool,
}

impl Summary {
    /// Every output received everything its flow sent, byte-exact, once
    /// and in order.
    pub fn passed(&self) -> bool {
        !self.outputs.is_empty() && self.outputs.iter().all(OutputResult::clean)
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "summary: sent for {:.1} s at {} packets/s per flow{}",
            self.seconds,
            self.rate,
            if self.interrupted {
                " (interrupted)"
            } else {
                ""
            }
        );
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let mut rows = vec![
            [
                "FLOW",
                "OUTPUT",
                "SENT",
                "RELAY IN",
                "RELAYED",
                "RECEIVED",
                "LOST",
                "DUPLICATES",
                "REORDERED",
                "BAD",
            ]
            .map(str::to_owned),
        ];
        for o in &self.outputs {
            rows.push([
                o.flow.clone(),
                o.output.clone(),
                o.sent.to_string(),
                opt(o.relay_in),
                opt(o.relayed),
                o.received.to_string(),
                o.lost().to_string(),
                o.duplicates.to_string(),
                o.reordered.to_string(),
                o.bad.to_string(),
            ]);
        }
        out.push_str(&table(&rows));
        out.push_str(
            "  SENT by the demo's sender to the flow's input group; RELAY IN and RELAYED are the\n  \
             daemon's own counters; RECEIVED arrived byte-exact (header, length and every payload\n  \
             byte checked); LOST = SENT - RECEIVED; BAD failed the check or belonged to another flow.\n",
        );
        match self.cpu {
            Some(cpu) if cpu.packets > 0 => {
                let _ = writeln!(
                    out,
                    "daemon CPU: {:.2} s user+system for {} packets relayed = {:.2} us per packet\n  \
                     (mcrelayd PID {}, all threads, and its helper, from /proc/PID/stat while traffic\n  \
                     flowed: its syscalls and the kernel's send path count, interrupt work charged\n  \
                     elsewhere does not. At the demo's rate the workers wake for almost every packet,\n  \
                     so this is mostly wake-up cost; docs/benchmarks.md measures it at full load.)",
                    cpu.seconds,
                    cpu.packets,
                    cpu.seconds * 1e6 / cpu.packets as f64,
                    cpu.daemon_pid
                );
            }
            _ => out.push_str("daemon CPU: not measured\n"),
        }
        let failed: Vec<String> = self
            .outputs
            .iter()
            .filter(|o| !o.clean())
            .map(|o| format!("{} -> {}", o.flow, o.output))
            .collect();
        if self.passed() {
            let _ = writeln!(
                out,
                "result: PASS: all {} outputs received every packet byte-exact, none duplicated or reordered",
                self.outputs.len()
            );
        } else if self.outputs.is_empty() {
            out.push_str("result: FAIL: no outputs measured\n");
        } else {
            let _ = writeln!(
                out,
                "result: FAIL: {} of {} outputs lost, damaged, duplicated or reordered packets: {}",
                failed.len(),
                self.outputs.len(),
                failed.join(", ")
            );
        }
        out
    }
}

/// Columns as wide as their widest cell, two spaces apart; the first two
/// left-aligned, the numbers right-aligned.
fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let _ = if i < 2 {
                write!(line, "{cell:<width$}")
            } else {
                write!(line, "{cell:>width$}")
            };
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(flow: &str, group: &str, sent: u64, received: u64) -> OutputResult {
        OutputResult {
            flow: flow.into(),
            output: group.into(),
            sent,
            relay_in: Some(sent),
            relayed: Some(received),
            received,
            ..OutputResult::default()
        }
    }

    fn summary(outputs: Vec<OutputResult>) -> Summary {
        Summary {
            seconds: 15.0,
            rate: 5000,
            outputs,
            cpu: Some(Cpu {
                seconds: 0.5,
                packets: 300_000,
                daemon_pid: 77,
            }),
            interrupted: false,
        }
    }

    #[test]
    fn all_received_passes() {
        let s = summary(vec![
            output("one-to-one", "239.2.2.1:5000", 75_000, 75_000),
            output("fan-out", "239.3.3.1:5001", 75_000, 75_000),
        ]);
        assert!(s.passed());
        let text = s.render();
        assert!(text.contains("result: PASS: all 2 outputs"), "{text}");
        assert!(text.contains("1.67 us per packet"), "{text}");
        assert!(text.contains("mcrelayd PID 77"), "{text}");
        let row = text.lines().find(|l| l.starts_with("one-to-one")).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "one-to-one",
                "239.2.2.1:5000",
                "75000",
                "75000",
                "75000",
                "75000",
                "0",
                "0",
                "0",
                "0"
            ]
        );
        // Right-aligned numbers end under their headers.
        let header = text.lines().find(|l| l.starts_with("FLOW")).unwrap();
        let end = header.find("LOST").unwrap() + 4;
        assert_eq!(&row[end - 1..end], "0");
    }

    #[test]
    fn any_loss_damage_duplicate_or_reorder_fails() {
        let good = output("fan-out", "239.3.3.1:5001", 100, 100);
        for bad in [
            output("fan-out", "239.3.3.2:5001", 100, 99),
            OutputResult {
                duplicates: 1,
                ..good.clone()
            },
            OutputResult {
                reordered: 2,
                ..good.clone()
            },
            OutputResult {
                bad: 1,
                ..good.clone()
            },
            output("fan-out", "239.3.3.2:5001", 0, 0),
        ] {
            let s = summary(vec![good.clone(), bad.clone()]);
            assert!(!s.passed(), "{bad:?}");
            let text = s.render();
            assert!(text.contains("result: FAIL: 1 of 2 outputs"), "{text}");
        }
        assert_eq!(output("f", "o", 100, 97).lost(), 3);
        assert_eq!(output("f", "o", 100, 120).lost(), 0);
        assert!(!summary(Vec::new()).passed());
    }

    #[test]
    fn missing_numbers_show_as_dashes() {
        let mut s = summary(vec![OutputResult {
            relay_in: None,
            relayed: None,
            ..output("one-to-one", "239.2.2.1:5000", 10, 10)
        }]);
        s.cpu = None;
        s.interrupted = true;
        let text = s.render();
        assert!(text.contains("(interrupted)"), "{text}");
        assert!(text.contains("daemon CPU: not measured"), "{text}");
        let row = text.lines().find(|l| l.starts_with("one-to-one")).unwrap();
        assert_eq!(row.split_whitespace().nth(3), Some("-"));
    }
}
