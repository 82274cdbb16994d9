//! The pure configuration layer of mcrelay: the TOML schema, validation,
//! and the immutable flow table that the data plane and the helper consume.
//!
//! Where it sits: this crate is read once at start-up and again on each
//! reload, never on the packet path. It opens no sockets, reads no clock and
//! looks up no interfaces; the checks that need the host (interfaces exist,
//! `cores` are CPUs this process may run on) happen at daemon start-up.
//!
//! Entry points: [`parse`] for text, [`load`] for a file. Both return every
//! problem in the file as [`ConfigErrors`], each error formatted as
//! `file:line:column: message`.
#![deny(unsafe_code)]

mod error;
mod mode;
pub mod model;
mod parse;

use std::path::Path;

pub use error::{ConfigError, ConfigErrors};
pub use mode::Mode;
pub use model::*;
pub use parse::{MAX_CPU, MAX_FLOW_NAME_BYTES, is_format_char, parse};

/// Largest configuration file [`load`] accepts (16 MiB).
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Reads and parses the configuration file at `path`.
///
/// Errors are labelled with `path` as given. A file that cannot be read, is
/// not a regular file (a FIFO, a device such as `/dev/zero`, a socket, even
/// through a symlink), is larger than [`MAX_FILE_BYTES`] or is not UTF-8 is
/// reported as a single [`ConfigError`]; `load` never blocks on the file
/// and never reads more than [`MAX_FILE_BYTES`] + 1 bytes of it.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let file = path.display().to_string();
    let one = |line: u32, column: u32, message: String| {
        ConfigErrors(vec![ConfigError {
            file: file.clone(),
            line,
            column,
            message,
        }])
    };
    let bytes = match read_bounded(path) {
        Ok(b) => b,
        Err(ReadError::Io(e)) => return Err(one(0, 0, format!("cannot read: {e}"))),
        Err(ReadError::Directory) => {
            return Err(one(
                0,
                0,
                "cannot read: is a directory; give the path of a .toml file".to_owned(),
            ));
        }
        Err(ReadError::NotRegular) => {
            return Err(one(
                0,
                0,
                "cannot read: not a regular file (a FIFO, device or socket); \
                 give the path of a .toml file"
                    .to_owned(),
            ));
        }
        Err(ReadError::TooLarge(len)) => {
            return Err(one(
                0,
                0,
                format!("file is {len} bytes or more; the limit is {MAX_FILE_BYTES} bytes"),
            ));
        }
    };
    match String::from_utf8(bytes) {
        Ok(text) => parse(&text, &file),
        Err(e) => {
            let good = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            // Valid UTF-8 by construction: `valid_up_to` says so.
            let prefix = std::str::from_utf8(good).unwrap_or_default();
            let line = prefix.matches('\n').count() + 1;
            let column = prefix.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            Err(one(
                u32::try_from(line).unwrap_or(u32::MAX),
                u32::try_from(column).unwrap_or(u32::MAX),
                "file is not valid UTF-8; save it as UTF-8".to_owned(),
            ))
        }
    }
}

/// Why [`read_bounded`] refused.
enum ReadError {
    Io(std::io::Error),
    Directory,
    NotRegular,
    TooLarge(u64),
}

/// The file's bytes, read without ever blocking or reading without bound:
/// opened with `O_NONBLOCK` (a FIFO with no writer would block `open`
/// forever), checked through the open descriptor (not the path, which may
/// change between the check and the read) to be a regular file, then read
/// at most [`MAX_FILE_BYTES`] + 1 bytes (the file may grow while read).
fn read_bounded(path: &Path) -> Result<Vec<u8>, ReadError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(ReadError::Io)?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if meta.is_dir() {
        return Err(ReadError::Directory);
    }
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ReadError::TooLarge(meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > MAX_FILE_BYTES {
        return Err(ReadError::TooLarge(read));
    }
    Ok(bytes)
}

/// Fuzzing entry point: parses arbitrary bytes (as lossy UTF-8) and checks
/// the parser's contract, panicking if it is broken: the result is either a
/// config or a non-empty list of errors, each with a position (line and
/// column at least 1). Used by `fuzz/fuzz_targets/parse.rs` and by the
/// corpus and property tests.
pub fn fuzz_parse(data: &[u8]) -> Result<Config, ConfigErrors> {
    let text = String::from_utf8_lossy(data);
    let result = parse(&text, "fuzz.toml");
    if let Err(errors) = &result {
        assert!(!errors.is_empty(), "parse returned Err with no errors");
        for e in errors {
            assert!(
                e.line >= 1 && e.column >= 1,
                "error without a position: {e}"
            );
            assert!(!e.message.is_empty(), "error without a message: {e}");
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("mcrelay-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn load_reads_the_file_and_labels_errors_with_its_path() {
        let path = temp("bad.toml", b"[pools]\nsmall = 0\n");
        let errors = load(&path).unwrap_err();
        assert_eq!(
            errors.to_string(),
            format!(
                "{}:2:9: pools.small 0 is not allowed; use at least 1",
                path.display()
            )
        );
        let path = temp("good.toml", b"");
        assert!(load(&path).unwrap().flows.is_empty());
    }

    #[test]
    fn load_reports_io_errors() {
        let path = std::path::Path::new("/nonexistent/mcrelay.toml");
        let errors = load(path).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(
            errors
                .to_string()
                .starts_with("/nonexistent/mcrelay.toml: cannot read: "),
            "{errors}"
        );
        let dir = std::env::temp_dir();
        let errors = load(&dir).unwrap_err();
        assert_eq!(
            errors.0[0].message,
            "cannot read: is a directory; give the path of a .toml file"
        );
    }

    #[test]
    fn load_reports_invalid_utf8_with_position() {
        let path = temp("latin1.toml", b"# ok\n# caf\xe9\n");
        let errors = load(&path).unwrap_err();
        assert_eq!(
            errors.to_string(),
            format!(
                "{}:2:6: file is not valid UTF-8; save it as UTF-8",
                path.display()
            )
        );
    }

    /// `load` on another thread, failing the test if it has not returned
    /// within `limit` (a blocked `open` would otherwise hang it forever).
    fn load_within(path: &Path, limit: std::time::Duration) -> Result<Config, ConfigErrors> {
        let (tx, rx) = std::sync::mpsc::channel();
        let owned = path.to_owned();
        std::thread::spawn(move || {
            let _ = tx.send(load(&owned));
        });
        rx.recv_timeout(limit)
            .unwrap_or_else(|_| panic!("load({}) did not return in {limit:?}", path.display()))
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let path = temp("fifo.toml", b"");
        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", path.display());
        let errors = load_within(&path, std::time::Duration::from_secs(10)).unwrap_err();
        assert!(
            errors.0[0].message.contains("not a regular file"),
            "{errors}"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_link_to_dev_zero_is_refused_without_reading_it() {
        let path = temp("zero.toml", b"");
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let errors = load_within(&path, std::time::Duration::from_secs(10)).unwrap_err();
        assert!(
            errors.0[0].message.contains("not a regular file"),
            "{errors}"
        );
    }

    #[test]
    fn an_oversized_file_is_refused() {
        let path = temp("big.toml", b"");
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(MAX_FILE_BYTES + 1).unwrap();
        let errors = load(&path).unwrap_err();
        assert!(
            errors.0[0].message.contains("the limit is 16777216 bytes"),
            "{errors}"
        );
    }

    #[test]
    fn fuzz_entry_accepts_anything() {
        assert!(fuzz_parse(b"").is_ok());
        assert!(fuzz_parse(b"\xff\xfe[[").is_err());
        assert!(fuzz_parse(&[0u8; 64]).is_err());
    }
}
