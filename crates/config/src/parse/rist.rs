//! `protocol = "rist"` on an input or a UDP output: RIST simple profile
//! (VSF TR-06-1), its RTCP on the media port + 1, and `buffer_ms`.

use std::fmt::Display;

use toml::de::DeTable;

use super::{Dotted, Walker};
use crate::model::{DEFAULT_RIST_BUFFER_MS, MAX_RIST_BUFFER_MS, Rist};

impl Walker<'_> {
    /// An input's `protocol`: `Some(true)` for `"rist"`, `Some(false)`
    /// for `"udp"` or absent, `None` (with an error) otherwise.
    pub(super) fn input_is_rist(
        &mut self,
        t: &DeTable<'_>,
        p: &str,
        path: impl Display + Copy,
    ) -> Option<bool> {
        let Some(v) = t.get("protocol") else {
            return Some(false);
        };
        match self.string(v, p, Dotted(path, "protocol"))? {
            "udp" => Some(false),
            "rist" => Some(true),
            other => {
                self.err(
                    &v.span(),
                    format!("{p}{path}.protocol {other:?} is not known; use \"udp\" or \"rist\""),
                );
                None
            }
        }
    }

    /// The RIST settings of an input or UDP output at `path` (`rist`:
    /// its protocol is `"rist"`): `Some(None)` for a plain one,
    /// `None` after an error (`buffer_ms` without RIST, out of range, or
    /// no port + 1 for the RTCP).
    pub(super) fn rist_settings(
        &mut self,
        t: &DeTable<'_>,
        p: &str,
        path: impl Display + Copy,
        rist: bool,
        port: Option<u16>,
    ) -> Option<Option<Rist>> {
        let buffer = t.get("buffer_ms");
        if !rist {
            if let Some(v) = buffer {
                self.err(
                    &v.span(),
                    format!(
                        "{p}{path}.buffer_ms is only for RIST; add protocol = \"rist\" or remove it"
                    ),
                );
                return None;
            }
            return Some(None);
        }
        let mut ok = true;
        if port == Some(u16::MAX)
            && let Some(v) = t.get("port")
        {
            self.err(
                &v.span(),
                format!("{p}{path}.port 65535 leaves no port + 1 for RIST's RTCP; use an even port up to 65534"),
            );
            ok = false;
        }
        let mut buffer_ms = DEFAULT_RIST_BUFFER_MS;
        if let Some(v) = buffer {
            match self.ranged(
                v,
                p,
                Dotted(path, "buffer_ms"),
                1,
                i128::from(MAX_RIST_BUFFER_MS),
            ) {
                Some(n) => buffer_ms = u32::try_from(n).unwrap_or(DEFAULT_RIST_BUFFER_MS),
                None => ok = false,
            }
        }
        ok.then_some(Some(Rist { buffer_ms }))
    }
}
