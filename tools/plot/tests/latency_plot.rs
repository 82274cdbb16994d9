//! The latency plot against the committed latency run: every contender
//! has a legend entry, every load point a group, and every measured p99
//! its bar label. (Byte-for-byte equality with the committed SVG is
//! checked for every plot by `plots.rs`.)

use std::path::{Path, PathBuf};

use mcrelay_plot::{Inputs, latency, render_all};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// The text content of every `<text>` element of `svg`.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..];
            Some(body[..body.find("</text>")?].trim().to_owned())
        })
        .collect()
}

#[test]
fn the_latency_plot_shows_every_contender_load_and_percentile() {
    let root = workspace_root();
    let inputs = Inputs::committed(&root).expect("committed inputs");
    let run = latency::load(&inputs.latency).expect("the committed latency run loads");
    let figure = render_all(&root, &inputs)
        .expect("renders")
        .into_iter()
        .find(|f| f.file_name == latency::FILE_NAME)
        .expect("a latency figure");
    let texts = texts(&figure.svg);
    for contender in ["mcrelay", "mcrelay-packet", "baseline", "kernel"] {
        assert!(
            texts.iter().any(|t| t == contender),
            "no legend entry for {contender} in {texts:?}"
        );
    }
    for row in &run.summary {
        assert!(texts.contains(&row.point), "no group {}", row.point);
        if let Some(p99) = row.p99_us_median {
            let label = format!("{p99:.0}");
            assert!(
                texts.contains(&label),
                "no {label} µs p99 bar for {} at {}",
                row.contender,
                row.point
            );
        }
    }
    for title in ["p99", "p99.9"] {
        assert!(texts.iter().any(|t| t == title), "no panel {title}");
    }
}
