//! Runs the fuzz entry point over a fixed corpus of valid, invalid and
//! weird files (deep nesting, huge numbers, unicode, binary, empty): the
//! parser must never panic and must return a table or positioned errors.

use std::path::Path;

#[test]
fn corpus_never_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 15, "corpus has only {} files", files.len());
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let result = mcrelay_config::fuzz_parse(&bytes);
        // Files named valid-* must parse; invalid-* must not.
        if name.starts_with("valid-") {
            assert!(result.is_ok(), "{name}: {}", result.unwrap_err());
        }
        if name.starts_with("invalid-") {
            assert!(result.is_err(), "{name} parsed");
        }
    }
}

#[test]
fn corpus_expectations() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let parse = |name: &str| mcrelay_config::load(&dir.join(name));
    assert!(parse("empty.toml").unwrap().flows.is_empty());
    assert!(parse("comments-only.toml").unwrap().flows.is_empty());
    assert_eq!(parse("crlf.toml").unwrap().flows.len(), 1);
    assert_eq!(parse("bom.toml").unwrap().daemon.user, "bom");
    let many = parse("invalid-many.toml").unwrap_err();
    assert!(many.len() >= 10, "{many}");
    let dup = parse("many-flows-same-input.toml").unwrap_err();
    let messages = dup.messages();
    assert!(
        messages.iter().any(|m| m.contains("which would loop")),
        "{dup}"
    );
    assert!(
        messages.iter().any(|m| m.contains("can't share an input")),
        "{dup}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("is the same as outputs[0]")),
        "{dup}"
    );
    assert!(
        messages.iter().any(|m| m.contains("name is empty")),
        "{dup}"
    );
    for deep in [
        "deep-arrays.toml",
        "deep-inline-tables.toml",
        "deep-dotted.toml",
    ] {
        assert!(parse(deep).is_err(), "{deep}");
    }
}
