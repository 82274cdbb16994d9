//! Text for the man pages both binaries write (`mcrelayd man`, `mcrelayctl
//! man`): this crate is the lowest one they share.

/// Escape text for a roff body line: backslashes (`\e`), hyphens (`\-`,
/// so they are not broken or turned into dashes), and a leading `.` or `'`
/// that would read as a request (`\&`).
pub fn escape(text: &str) -> String {
    let text = text.replace('\\', "\\e").replace('-', "\\-");
    if text.starts_with(['.', '\'']) {
        format!("\\&{text}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn requests_backslashes_and_hyphens_are_escaped() {
        assert_eq!(escape("plain text"), "plain text");
        assert_eq!(escape("--socket"), "\\-\\-socket");
        assert_eq!(escape("a\\b"), "a\\eb");
        assert_eq!(escape(".TH x"), "\\&.TH x");
        assert_eq!(escape("'quoted"), "\\&'quoted");
        assert_eq!(escape("mid.line"), "mid.line");
    }
}
