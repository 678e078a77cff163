//! Criterion benches of the reduction kernels: `reduce_into` throughput per dtype, op, size and
//! path (every `Isa` this CPU runs: baseline, AVX2, AVX-512, AVX-512 with AVX512_BF16), and four
//! contributions of half precision reduced in f32 against the pairwise fold.
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rustdist_core::reduce::{reduce_in_f32_with, reduce_into, reduce_into_with, Isa};
use rustdist_core::{DType, ReduceOp};

fn kernels(c: &mut Criterion) {
    let cases = [
        (DType::F32, ReduceOp::Sum),
        (DType::BF16, ReduceOp::Sum),
        (DType::F16, ReduceOp::Sum),
        (DType::I64, ReduceOp::Max),
    ];
    for (dtype, op) in cases {
        for isa in Isa::supported_all() {
            let name = format!("reduce_into/{}/{}/{}", dtype.name(), op.name(), isa.name());
            let mut g = c.benchmark_group(name);
            for bytes in [4usize << 10, 64 << 10, 1 << 20, 16 << 20] {
                // Bytes 0x3c give finite values for every dtype (bf16 1.17, f32 0.011).
                let mut dst = vec![0x3cu8; bytes];
                let src = vec![0x3cu8; bytes];
                g.throughput(Throughput::Bytes(bytes as u64));
                g.bench_function(BenchmarkId::from_parameter(size_name(bytes)), |b| {
                    b.iter(|| reduce_into_with(isa, dtype, op, &mut dst, &src).unwrap())
                });
            }
            g.finish();
        }
    }
}

/// Four ranks' 1 MiB contributions of f16/bf16 summed: accumulated in f32 and rounded once
/// (what shared memory does from three ranks on), against the pairwise fold, which rounds
/// after every rank.
fn four_contributions(c: &mut Criterion) {
    let bytes = 1 << 20;
    for dtype in [DType::BF16, DType::F16] {
        let mut g = c.benchmark_group(format!("four_contributions/{}", dtype.name()));
        let parts: Vec<Vec<u8>> = (0..4).map(|_| vec![0x3cu8; bytes]).collect();
        let mut dst = vec![0u8; bytes];
        g.throughput(Throughput::Bytes(4 * bytes as u64));
        g.bench_function("pairwise", |b| {
            b.iter(|| {
                dst.copy_from_slice(&parts[0]);
                for p in &parts[1..] {
                    reduce_into(dtype, ReduceOp::Sum, &mut dst, p).unwrap();
                }
            })
        });
        for isa in Isa::supported_all() {
            g.bench_function(format!("in_f32/{}", isa.name()), |b| {
                b.iter(|| {
                    reduce_in_f32_with(isa, dtype, ReduceOp::Sum, &mut dst, 4, |p| &parts[p])
                        .unwrap()
                })
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
    targets = kernels, four_contributions
}
criterion_main!(benches);
