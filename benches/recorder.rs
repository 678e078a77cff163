//! Criterion bench of the flight recorder's cost per operation: what a small collective pays
//! for being recorded (an entry written when issued, marked completed when done), against
//! the few microseconds the collective itself takes.
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use rustdist_core::recorder::{Op, Recorder};
use rustdist_core::DType;

fn recorder(c: &mut Criterion) {
    let op = Op {
        name: "all_reduce",
        input: 2,
        output: 2,
        dtype: DType::F32,
        p2p: None,
        cuda: false,
    };
    let timeout = Duration::from_secs(1800);
    let r = Recorder::new("bench", Some(1), 4);
    c.bench_function("recorder/record_and_complete", |b| {
        b.iter(|| {
            let t = r.record(op, timeout, true);
            r.completed(t);
        })
    });
    c.bench_function("recorder/record_start_complete_queued", |b| {
        b.iter(|| {
            let t = r.record(op, timeout, false);
            r.started(t);
            r.completed(t);
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = recorder
}
criterion_main!(benches);
