//! Runs the fuzz entry point over the checked-in corpus, and checks that
//! each `valid-*` file's lines parse and each `invalid-*` file's don't.

use std::path::PathBuf;

use mcrelay_control::{LineEvent, LineReader, fuzz_request, parse_request};

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// Every line of `bytes` as the daemon would see it, `None` for a line too
/// long.
fn lines(bytes: &[u8]) -> Vec<Option<Vec<u8>>> {
    let mut reader = LineReader::new();
    let mut lines = Vec::new();
    let mut push = |e: LineEvent<'_>| {
        lines.push(match e {
            LineEvent::Line(l) => Some(l.to_vec()),
            LineEvent::TooLong => None,
        })
    };
    reader.feed(bytes, &mut push);
    reader.finish(&mut push);
    lines
}

#[test]
fn fuzz_request_survives_the_corpus() {
    let files = corpus();
    assert!(files.len() >= 10, "corpus went missing: {files:?}");
    for (_, bytes) in &files {
        fuzz_request(bytes);
        // Also with every chunk size the first byte could pick.
        for first in [1u8, 2, 3, 7, 64, 255] {
            let mut data = vec![first];
            data.extend_from_slice(bytes);
            fuzz_request(&data);
        }
    }
}

#[test]
fn corpus_files_are_what_their_names_say() {
    for (name, bytes) in corpus() {
        let lines = lines(&bytes);
        assert!(!lines.is_empty(), "{name} is empty");
        let valid = name.starts_with("valid-");
        assert!(
            valid || name.starts_with("invalid-"),
            "{name}: name it valid-* or invalid-*"
        );
        for line in lines {
            let parsed = line.map(|l| parse_request(&l));
            match (valid, parsed) {
                (true, Some(Ok(_))) | (false, None | Some(Err(_))) => {}
                (true, other) => panic!("{name}: {other:?}"),
                (false, Some(Ok(r))) => panic!("{name} parsed as {r:?}"),
            }
        }
    }
}
