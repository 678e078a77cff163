//! Criterion benches live in `benches/*.rs`; this crate only hosts them.
