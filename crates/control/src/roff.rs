//! Text for the man pages both binaries write (`mcrelayd man`, `mcrelayctl
//! man`): this crate is the lowest one they share.

/// Escape text for a roff body line: backslashes (`\e`), hyphens (`\-`,
/// so they are not broken or turned into dashes), characters beyond ASCII
/// (`\[uXXXX]`: groff reads its input as Latin-1, so UTF-8 bytes would be
/// other characters, or invalid ones), and a leading `.` or `'` that would
/// read as a request (`\&`).
pub fn escape(text: &str) -> String {
    let mut text = text.replace('\\', "\\e").replace('-', "\\-");
    if !text.is_ascii() {
        text = text
            .chars()
            .map(|c| {
                if c.is_ascii() {
                    c.to_string()
                } else {
                    format!("\\[u{:04X}]", u32::from(c))
                }
            })
            .collect();
    }
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
        assert_eq!(escape("4 × RTT — ok"), "4 \\[u00D7] RTT \\[u2014] ok");
    }
}
