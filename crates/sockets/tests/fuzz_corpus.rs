//! Every file of `tests/corpus/` through [`fuzz_request`], which must not
//! panic; files named `ok-*` must decode as a request and `bad-*` must be
//! refused. The same files seed a fuzzer's corpus.

use std::path::Path;

use mcrelay_sockets::{Request, fuzz_request};

#[test]
fn corpus_decodes_as_named_and_never_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut seen = (0, 0);
    for entry in std::fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_owned();
        let data = std::fs::read(&path).expect("read");
        fuzz_request(&data);
        let decoded = Request::decode(&data);
        if name.starts_with("ok-") {
            assert!(decoded.is_ok(), "{name}: {decoded:?}");
            seen.0 += 1;
        } else if name.starts_with("bad-") {
            assert!(decoded.is_err(), "{name} decoded as {decoded:?}");
            seen.1 += 1;
        } else {
            panic!("{name}: corpus files are named ok-* or bad-*");
        }
    }
    assert!(seen.0 >= 5 && seen.1 >= 15, "corpus too small: {seen:?}");
}
