//! An error and its causes on one line, `outer: inner: ...`: how the
//! daemon reports a typed error (what `anyhow`'s `{:#}` printed before the
//! modules below `main` got their own error enums).

use std::error::Error;
use std::fmt;

/// Displays `.0` followed by each of its sources, separated by `": "`.
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("binding the thing")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn prints_every_cause_once() {
        let e = Outer(std::io::Error::other("address in use"));
        assert_eq!(Chain(&e).to_string(), "binding the thing: address in use");
    }
}
