//! Configuration errors: every one names the file, line and column, what is
//! wrong and how to fix it.

use std::fmt;

/// One problem found in a configuration file.
///
/// Displays as `file:line:column: message`, e.g.
/// `mcrelay.toml:14:21: flow "camera-1": input.address 239.1.1.300 is not an IP address`.
/// Lines and columns are 1-based; the column counts characters, not bytes.
/// Errors that have no position in the file (it could not be read at all)
/// have `line == 0` and `column == 0` and display as `file: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file name as given to [`crate::parse`] or [`crate::load`].
    pub file: String,
    /// 1-based line, or 0 when the error has no position.
    pub line: u32,
    /// 1-based column in characters, or 0 when the error has no position.
    pub column: u32,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file, self.line, self.column, self.message
            )
        }
    }
}

/// Every problem found in a configuration file, in file order.
///
/// Never empty when returned by [`crate::parse`] or [`crate::load`].
/// Displays one error per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// The individual errors, in file order.
    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.0.iter()
    }

    /// How many errors there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no errors (never true for a returned `Err`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The messages alone, without file and position (handy in tests).
    pub fn messages(&self) -> Vec<&str> {
        self.0.iter().map(|e| e.message.as_str()).collect()
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(line: u32, column: u32, message: &str) -> ConfigError {
        ConfigError {
            file: "mcrelay.toml".into(),
            line,
            column,
            message: message.into(),
        }
    }

    #[test]
    fn display_format() {
        assert_eq!(
            e(
                14,
                21,
                "flow \"camera-1\": input.address 239.1.1.300 is not an IP address"
            )
            .to_string(),
            "mcrelay.toml:14:21: flow \"camera-1\": input.address 239.1.1.300 is not an IP address"
        );
        assert_eq!(
            e(0, 0, "cannot read: denied").to_string(),
            "mcrelay.toml: cannot read: denied"
        );
        let all = ConfigErrors(vec![e(1, 1, "a"), e(2, 3, "b")]);
        assert_eq!(all.to_string(), "mcrelay.toml:1:1: a\nmcrelay.toml:2:3: b");
        assert_eq!(all.messages(), ["a", "b"]);
        assert_eq!(all.len(), 2);
    }
}
