//! The plots in docs/plots/ against the committed data: rendered by the
//! binary into a temporary directory they are well-formed SVG with every
//! contender's series, and they are byte for byte what is committed.

use std::path::{Path, PathBuf};
use std::process::Command;

use mcrelay_plot::{Inputs, OUT_DIR, pool, relay, render_all};
use quick_xml::Reader;
use quick_xml::events::Event;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// Parses `svg` as XML (quick-xml checks that end tags match) and returns
/// the root element's name and all text content, trimmed.
fn parse_svg(svg: &str) -> (String, Vec<String>) {
    let mut reader = Reader::from_str(svg);
    let mut root = None;
    let mut depth = 0usize;
    let mut texts = Vec::new();
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) => {
                if root.is_none() {
                    root = Some(String::from_utf8_lossy(e.name().as_ref()).into_owned());
                }
                depth += 1;
            }
            Ok(Event::End(_)) => depth -= 1,
            Ok(Event::Empty(e)) => {
                assert!(root.is_some(), "element {:?} outside the root", e.name());
            }
            Ok(Event::Text(t)) => {
                let text = t.decode().expect("text is UTF-8");
                if !text.trim().is_empty() {
                    texts.push(text.trim().to_owned());
                }
            }
            Ok(Event::Eof) => break,
            Ok(_) => {}
            Err(e) => panic!("not well-formed at byte {}: {e}", reader.error_position()),
        }
    }
    assert_eq!(depth, 0, "unclosed elements at the end");
    (root.expect("a root element"), texts)
}

#[test]
fn the_binary_renders_well_formed_svg_with_every_series() {
    let root = workspace_root();
    let out = tempfile::tempdir().expect("temp dir");
    let status = Command::new(env!("CARGO_BIN_EXE_mcrelay-plot"))
        .arg("--root")
        .arg(&root)
        .arg("--out")
        .arg(out.path())
        .status()
        .expect("mcrelay-plot runs");
    assert!(status.success(), "mcrelay-plot failed: {status}");

    let read = |name: &str| {
        std::fs::read_to_string(out.path().join(name))
            .unwrap_or_else(|e| panic!("{name} was not written: {e}"))
    };
    let (name, texts) = parse_svg(&read(relay::FILE_NAME));
    assert_eq!(name, "svg");
    for contender in ["mcrelay", "baseline", "kernel"] {
        assert!(
            texts.iter().any(|t| t == contender),
            "no legend entry for {contender} in {texts:?}"
        );
    }
    for group in ["1316 B, 1→1", "1316 B, 1→4", "64 B, 1→1", "64 B, 1→4"] {
        assert!(texts.iter().any(|t| t == group), "no group {group}");
    }
    // Every row of the run has its bars: its CPU label is there.
    let inputs = Inputs::committed(&root).expect("committed inputs");
    let run = relay::load(&inputs.relay).expect("the committed run loads");
    for row in &run.summary {
        let label = format!("{:.0}", row.ns_per_delivered_median);
        assert!(
            texts.contains(&label),
            "no {label} ns bar for {} {} B 1→{}",
            row.contender,
            row.size,
            row.fanout
        );
    }

    let (name, texts) = parse_svg(&read(pool::FILE_NAME));
    assert_eq!(name, "svg");
    for series in ["pool take + give", "Vec::with_capacity + drop"] {
        assert!(
            texts.iter().any(|t| t == series),
            "no legend entry {series}"
        );
    }
    for class in ["small (1500 B)", "standard (4096 B)", "jumbo (9000 B)"] {
        assert!(texts.iter().any(|t| t == class), "no class {class}");
    }
    assert!(
        texts.iter().filter(|t| t.ends_with("x the pool")).count() == 3,
        "one ratio label per class"
    );
}

#[test]
fn the_committed_plots_are_what_the_committed_data_renders_to() {
    let root = workspace_root();
    let inputs = Inputs::committed(&root).expect("committed inputs");
    for figure in render_all(&root, &inputs).expect("renders") {
        let path = root.join(OUT_DIR).join(figure.file_name);
        let committed =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            committed == figure.svg,
            "{} is stale: it differs from what {} renders to; regenerate with `cargo run -p mcrelay-plot`",
            path.display(),
            figure.source.display()
        );
    }
}
