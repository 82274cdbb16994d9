//! Benchmark suites for mcrelay live in `benches/benches/`; this crate has no
//! library code of its own.
