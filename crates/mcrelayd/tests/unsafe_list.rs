//! docs/architecture.md lists, in "Where `unsafe` lives", every source file
//! under `crates/*/src` and `tools/*/src` that holds `unsafe` code, with the reason. This
//! test keeps that list true both ways: a file with `unsafe` code must be
//! listed, and a listed file must exist and still hold some. Needs no root
//! and no network: it only reads the tree.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const SECTION: &str = "## Where `unsafe` lives";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether `source` uses the `unsafe` keyword as code: a block, an
/// `unsafe fn`, `unsafe impl`, `unsafe trait` or `unsafe extern`. Comment
/// lines, and words such as `unsafe_code`, don't count.
fn holds_unsafe(source: &str) -> bool {
    source.lines().any(|line| {
        let code = line.split("//").next().unwrap_or("");
        code.match_indices("unsafe").any(|(at, _)| {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                return false;
            }
            let rest = code[at + "unsafe".len()..].trim_start();
            rest.starts_with('{')
                || ["fn ", "impl", "trait ", "extern "]
                    .iter()
                    .any(|k| rest.starts_with(k))
        })
    })
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Files under `crates/*/src` and `tools/*/src` holding `unsafe` code,
/// relative to the root.
fn files_with_unsafe(root: &Path) -> BTreeSet<String> {
    let mut files = Vec::new();
    for top in ["crates", "tools"] {
        let dir = root.join(top);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for krate in entries {
            let src = krate.expect("entry").path().join("src");
            if src.is_dir() {
                rust_files(&src, &mut files);
            }
        }
    }
    files
        .into_iter()
        .filter(|f| holds_unsafe(&std::fs::read_to_string(f).expect("read source")))
        .map(|f| {
            f.strip_prefix(root)
                .expect("under the root")
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// The first column of the section's table: `` | `path` | why | ``.
fn listed(architecture: &str) -> BTreeSet<String> {
    let start = architecture
        .find(SECTION)
        .unwrap_or_else(|| panic!("docs/architecture.md has no section {SECTION:?}"));
    let body = &architecture[start + SECTION.len()..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    body.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(path, _)| path.to_owned())
        .filter(|p| p.ends_with(".rs"))
        .collect()
}

#[test]
fn the_detector_tells_code_from_words() {
    assert!(holds_unsafe("    let x = unsafe { f() };"));
    assert!(holds_unsafe("pub unsafe fn push() {}"));
    assert!(holds_unsafe("unsafe impl Send for P {}"));
    assert!(holds_unsafe("    match unsafe{ g() } {"));
    assert!(!holds_unsafe("#![deny(unsafe_code)]"));
    assert!(!holds_unsafe("    // SAFETY: unsafe { is fine here }"));
    assert!(!holds_unsafe("//! calls `submit`'s unsafe fns"));
    assert!(!holds_unsafe("let unsafe_dir = 1;"));
    assert!(!holds_unsafe("let not_unsafe { }"));
}

#[test]
fn every_file_with_unsafe_is_listed_in_architecture_md() {
    let root = workspace();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("architecture.md");
    let listed = listed(&doc);
    let actual = files_with_unsafe(&root);
    assert!(!actual.is_empty(), "the scan found no unsafe at all");
    let missing: Vec<_> = actual.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&actual).collect();
    assert!(
        missing.is_empty(),
        "these files hold `unsafe` code but are not listed in docs/architecture.md \
         (section {SECTION:?}); add a line saying why: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "these files are listed in docs/architecture.md (section {SECTION:?}) but hold no \
         `unsafe` code (or no longer exist); remove their lines: {stale:?}"
    );
}
