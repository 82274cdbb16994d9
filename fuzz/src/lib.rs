//! One macro, [`fuzz_target!`], that turns a crate's fuzz entry point
//! (`fn(&[u8])`, also run over a corpus in that crate's normal tests) into
//! a fuzz target for whichever fuzzer the build's feature picks:
//!
//! - `afl` (default): AFL++ through afl.rs, on stable Rust
//!   (`cargo afl build`); see docs/fuzzing.md.
//! - `libfuzzer`: libFuzzer through cargo-fuzz, which needs nightly
//!   (`cargo +nightly fuzz run --no-default-features --features libfuzzer`).
//!
//! A target is one file in `fuzz_targets/`:
//!
//! ```text
//! #![cfg_attr(feature = "libfuzzer", no_main)]
//! mcrelay_fuzz::fuzz_target!(mcrelay_wire::fuzz_frame);
//! ```
//!
//! plus its `[[bin]]` entry in `Cargo.toml` and a seed directory
//! `corpus/NAME/`.

#[cfg(feature = "afl")]
#[doc(hidden)]
pub use afl;
#[cfg(feature = "libfuzzer")]
#[doc(hidden)]
pub use libfuzzer_sys;

#[cfg(all(feature = "afl", feature = "libfuzzer"))]
compile_error!("pick one fuzzer: feature `afl` or `libfuzzer`, not both");

/// Define the fuzz target's entry point: the function `$entry` gets every
/// input (what it returns is dropped).
#[cfg(feature = "afl")]
#[macro_export]
macro_rules! fuzz_target {
    ($entry:path) => {
        fn main() {
            $crate::afl::fuzz!(|data: &[u8]| {
                let _ = $entry(data);
            });
        }
    };
}

/// Define the fuzz target's entry point: the function `$entry` gets every
/// input (what it returns is dropped).
#[cfg(feature = "libfuzzer")]
#[macro_export]
macro_rules! fuzz_target {
    ($entry:path) => {
        $crate::libfuzzer_sys::fuzz_target!(|data: &[u8]| {
            let _ = $entry(data);
        });
    };
}
