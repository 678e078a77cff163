//! Criterion benches of the reduction kernels: `reduce_into` throughput per dtype, op and size.
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rustdist_core::reduce::reduce_into;
use rustdist_core::{DType, ReduceOp};

fn kernels(c: &mut Criterion) {
    let cases = [
        (DType::F32, ReduceOp::Sum),
        (DType::BF16, ReduceOp::Sum),
        (DType::F16, ReduceOp::Sum),
        (DType::I64, ReduceOp::Max),
    ];
    for (dtype, op) in cases {
        let mut g = c.benchmark_group(format!("reduce_into/{}/{}", dtype.name(), op.name()));
        for bytes in [4usize << 10, 1 << 20, 16 << 20] {
            // Bytes 0x3c give finite values for every dtype (bf16 1.17, f32 0.011).
            let mut dst = vec![0x3cu8; bytes];
            let src = vec![0x3cu8; bytes];
            g.throughput(Throughput::Bytes(bytes as u64));
            g.bench_function(BenchmarkId::from_parameter(size_name(bytes)), |b| {
                b.iter(|| reduce_into(dtype, op, &mut dst, &src).unwrap())
            });
        }
        g.finish();
    }
}

fn size_name(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{}MiB", b >> 20),
        b => format!("{}KiB", b >> 10),
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = kernels
}
criterion_main!(benches);
