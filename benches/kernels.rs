//! Criterion benches of the reduction kernels (filled in by the kernels work).
use criterion::{criterion_group, criterion_main, Criterion};

fn kernels(_c: &mut Criterion) {}

criterion_group!(benches, kernels);
criterion_main!(benches);
