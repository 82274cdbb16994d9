//! What parsing a 1000-flow file costs, and whether serde-derived raw
//! structs with `toml::Spanned` positions would cost less (issue 25,
//! item "Config parsing"). The file is the scale test's
//! (crates/mcrelayd/tests/scale.rs): each flow one input and two outputs
//! with a TTL. Modes (the first argument):
//!
//! - `parse`: `mcrelay_config::parse`, the shipped path (toml's spanned
//!   document tree walked by hand, every check, every error collected);
//! - `detable`: only `toml::de::DeTable::parse`, the tokenizing both
//!   routes share;
//! - `serde`: `toml::from_str` into derived raw structs whose every value
//!   is `Spanned` (positions kept for a later validation pass), with no
//!   validation at all: a lower bound of the serde route;
//! - `none`: only generate the text (to subtract under callgrind).
//!
//! Prints the median wall time of `runs` runs (second argument, default
//! 21). Under `valgrind --tool=callgrind` run it with `runs` = 1 and
//! subtract `none`'s instruction count.

use std::time::Instant;

use serde::Deserialize;
use toml::Spanned;

const FLOWS: usize = 1000;

fn group(prefix: &str, i: usize) -> String {
    format!("{prefix}.{}.{}", i / 250, i % 250 + 1)
}

fn text() -> String {
    let mut c =
        String::from("[daemon]\nuser = \"nobody\"\ncontrol_socket = \"/run/mcrelay.sock\"\n");
    for i in 0..FLOWS {
        c.push_str(&format!(
            "[[flow]]\nname = \"f{i:05}\"\ninput = {{ interface = \"vRA\", address = \"{}\", port = 5000 }}\noutputs = [\n  {{ interface = \"vRB\", address = \"{}\", port = 6000, ttl = 1 }},\n  {{ interface = \"vRB\", address = \"{}\", port = 6001, ttl = 1 }},\n]\n",
            group("239.10", i),
            group("239.11", i),
            group("239.12", i),
        ));
    }
    c
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Raw {
    daemon: Option<Spanned<RawDaemon>>,
    #[serde(default)]
    flow: Vec<Spanned<RawFlow>>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct RawDaemon {
    user: Option<Spanned<String>>,
    control_socket: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct RawFlow {
    name: Spanned<String>,
    input: Option<Spanned<RawEndpoint>>,
    #[serde(default)]
    outputs: Vec<Spanned<RawEndpoint>>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct RawEndpoint {
    interface: Spanned<String>,
    address: Spanned<String>,
    port: Spanned<i64>,
    ttl: Option<Spanned<i64>>,
}

fn once(mode: &str, text: &str) -> usize {
    match mode {
        "parse" => mcrelay_config::parse(text, "scale.toml")
            .map(|c| c.flows.len())
            .unwrap_or(0),
        "detable" => toml::de::DeTable::parse(text).map_or(0, |t| t.get_ref().len()),
        "serde" => toml::from_str::<Raw>(text).map_or(0, |r| r.flow.len()),
        _ => text.len(),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "parse".to_owned());
    let runs: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(21);
    let text = text();
    let mut times = Vec::with_capacity(runs);
    let mut n = 0;
    for _ in 0..runs {
        let start = Instant::now();
        n = std::hint::black_box(once(&mode, std::hint::black_box(&text)));
        times.push(start.elapsed());
    }
    times.sort();
    let median = times.get(runs / 2).copied().unwrap_or_default();
    println!(
        "{mode}: {} bytes, result {n}, median of {runs}: {:.2} ms",
        text.len(),
        median.as_secs_f64() * 1e3
    );
}
