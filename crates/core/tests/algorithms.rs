//! Every algorithm x world size 1..=5 x awkward lengths x every dtype x every supported op,
//! run on n threads over the in-memory mesh, against a sequential reference.

use std::time::{Duration, Instant};

use half::{bf16, f16};
use rustdist_core::algorithms::{self, allgather, allreduce, broadcast, reduce_scatter};
use rustdist_core::algorithms::{barrier, AlgoOverrides};
use rustdist_core::reduce::{check_supported, reduce_into};
use rustdist_core::transport::local::{mesh, LocalTransport};
use rustdist_core::transport::{OpCtx, Signature, Transport};
use rustdist_core::{CollectiveKind, DType, Error, ReduceOp, Result};

/// Runs `f` on every rank of a fresh mesh of `n`, one thread each; results in rank order.
fn run<T: Send>(n: usize, f: impl Fn(&mut LocalTransport) -> T + Sync) -> Vec<T> {
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = mesh(n)
            .into_iter()
            .map(|mut t| s.spawn(move || f(&mut t)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn ctx(kind: CollectiveKind, dtype: DType, op: ReduceOp, count: usize) -> OpCtx {
    OpCtx {
        seq: 1,
        sig: Signature {
            kind,
            dtype,
            op,
            count: count as u64,
        },
        reduce: op,
        deadline: Instant::now() + Duration::from_secs(60),
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Rank `rank`'s input. Floats come from a small set of dyadic values, so sums and products of
/// up to 5 of them are exact in every float format and any reduction order gives the same
/// number; integers use their full range (wrapping is order-independent too).
fn input(dtype: DType, numel: usize, rank: usize) -> Vec<u8> {
    const F: [f64; 8] = [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0];
    let mut out = Vec::with_capacity(numel * dtype.size());
    for i in 0..numel {
        let h = mix((rank as u64) << 40 ^ i as u64 ^ 0x5EED);
        let f = |k: u32| F[((h >> (3 * k)) & 7) as usize];
        match dtype {
            DType::F32 => out.extend((f(0) as f32).to_le_bytes()),
            DType::F64 => out.extend(f(0).to_le_bytes()),
            DType::F16 => out.extend(f16::from_f64(f(0)).to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f64(f(0)).to_le_bytes()),
            DType::C64 => {
                out.extend((f(0) as f32).to_le_bytes());
                out.extend((f(1) as f32).to_le_bytes());
            }
            DType::C128 => {
                out.extend(f(0).to_le_bytes());
                out.extend(f(1).to_le_bytes());
            }
            DType::Bool => out.push((h & 1) as u8),
            _ => out.extend_from_slice(&h.to_le_bytes()[..dtype.size()]),
        }
    }
    out
}

/// Float components as f64, so that +0 and -0 compare equal (their sign may depend on the
/// reduction order for complex products).
fn floats(dtype: DType, b: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F32 | DType::C64 => b
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        DType::F64 | DType::C128 => b
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        DType::F16 => b
            .chunks(2)
            .map(|c| f16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
        DType::BF16 => b
            .chunks(2)
            .map(|c| bf16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
        _ => unreachable!(),
    }
}

fn assert_matches_reference(dtype: DType, got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if dtype.is_float() || dtype.is_complex() {
        assert!(
            floats(dtype, got) == floats(dtype, want),
            "{what}: values differ"
        );
    } else {
        assert!(got == want, "{what}: values differ");
    }
}

/// Results of all ranks must be bitwise identical.
fn assert_identical(outs: &[Vec<u8>], what: &str) {
    for (r, o) in outs.iter().enumerate() {
        assert!(o == &outs[0], "{what}: rank {r} differs from rank 0");
    }
}

fn reference(dtype: DType, op: ReduceOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        reduce_into(dtype, op, &mut acc, x).unwrap();
    }
    acc
}

fn lengths(n: usize) -> Vec<usize> {
    let mut l = vec![0, 1, n - 1, n, n + 1, 100_003];
    l.sort_unstable();
    l.dedup();
    l
}

type AllReduceFn = fn(&mut dyn Transport, &OpCtx, &mut [u8]) -> Result<()>;

/// The all_reduce algorithms, each also with tiny segments so that multi-segment paths run.
fn all_reduce_algos() -> Vec<(&'static str, AllReduceFn)> {
    vec![
        ("ring", |t, c, b| {
            allreduce::ring::all_reduce(t, c, b, allreduce::ring::DEFAULT_MAX_CHUNK_BYTES)
        }),
        ("ring/small-chunks", |t, c, b| {
            allreduce::ring::all_reduce(t, c, b, 40)
        }),
        ("recursive_doubling", |t, c, b| {
            allreduce::recursive_doubling::all_reduce(
                t,
                c,
                b,
                allreduce::recursive_doubling::DEFAULT_MAX_SEGMENT_BYTES,
            )
        }),
        ("recursive_doubling/small-segments", |t, c, b| {
            allreduce::recursive_doubling::all_reduce(t, c, b, 48)
        }),
        ("dispatcher", |t, c, b| {
            algorithms::all_reduce(t, c, b, &AlgoOverrides::default())
        }),
    ]
}

fn supported_ops(dtype: DType) -> Vec<ReduceOp> {
    ReduceOp::ALL
        .into_iter()
        .filter(|&op| check_supported(dtype, op).is_ok())
        .collect()
}

#[test]
fn all_reduce_every_algorithm_world_length_dtype_op() {
    for (name, algo) in all_reduce_algos() {
        for n in 1..=5 {
            for numel in lengths(n) {
                for dtype in DType::ALL {
                    // Small-segment variants only need lengths that span several segments;
                    // the dispatcher runs the same code as the named algorithms.
                    if numel > 1000
                        && (name.contains('/') || name == "dispatcher" && dtype != DType::F32)
                    {
                        continue;
                    }
                    let inputs: Vec<_> = (0..n).map(|r| input(dtype, numel, r)).collect();
                    for op in supported_ops(dtype) {
                        let what = format!("{name} n={n} numel={numel} {dtype:?} {op:?}");
                        let c = ctx(CollectiveKind::AllReduce, dtype, op, numel);
                        let outs = run(n, |t| {
                            let mut buf = inputs[t.rank()].clone();
                            algo(t, &c, &mut buf).map(|_| buf)
                        });
                        let outs: Vec<_> = outs.into_iter().map(|o| o.expect(&what)).collect();
                        assert_identical(&outs, &what);
                        let want = reference(dtype, op, &inputs);
                        assert_matches_reference(dtype, &outs[0], &want, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn all_reduce_is_bitwise_identical_with_nan_and_signed_zero() {
    // MIN/MAX with NaNs of different payloads and mixed zero signs depend on operand order;
    // every rank must still end with the same bits.
    let vals = [
        0.0f32,
        -0.0,
        f32::NAN,
        -f32::NAN,
        1.0,
        f32::from_bits(0x7fc0_0001),
    ];
    for (name, algo) in all_reduce_algos() {
        for n in 2..=5 {
            for op in [ReduceOp::Min, ReduceOp::Max, ReduceOp::Sum] {
                let inputs: Vec<Vec<u8>> = (0..n)
                    .map(|r| {
                        (0..36)
                            .flat_map(|i| vals[(i / 6 * (r + 1) + i + r) % 6].to_le_bytes())
                            .collect()
                    })
                    .collect();
                let c = ctx(CollectiveKind::AllReduce, DType::F32, op, 36);
                let outs = run(n, |t| {
                    let mut buf = inputs[t.rank()].clone();
                    algo(t, &c, &mut buf).map(|_| buf)
                });
                let outs: Vec<_> = outs.into_iter().map(Result::unwrap).collect();
                assert_identical(&outs, &format!("{name} n={n} {op:?}"));
            }
        }
    }
}

#[test]
fn broadcast_every_algorithm_world_length_root() {
    type BcastFn = fn(&mut dyn Transport, &OpCtx, &mut [u8], usize) -> Result<()>;
    let algos: [(&str, BcastFn); 4] = [
        ("binomial_tree", broadcast::binomial_tree::broadcast),
        ("chain", |t, c, b, r| {
            broadcast::chain::broadcast(t, c, b, r, broadcast::chain::DEFAULT_SEGMENT_BYTES)
        }),
        ("chain/small-segments", |t, c, b, r| {
            broadcast::chain::broadcast(t, c, b, r, 7)
        }),
        ("dispatcher", |t, c, b, r| {
            algorithms::broadcast(t, c, b, r, &AlgoOverrides::default())
        }),
    ];
    for (name, algo) in algos {
        for n in 1..=5 {
            for numel in lengths(n) {
                if name.contains('/') && numel > 1000 {
                    continue;
                }
                for dtype in [DType::U8, DType::F16, DType::C128] {
                    for root in 0..n {
                        let what = format!("{name} n={n} numel={numel} {dtype:?} root={root}");
                        let data = input(dtype, numel, root + 7);
                        let c = ctx(CollectiveKind::Broadcast, dtype, ReduceOp::Sum, numel);
                        let outs = run(n, |t| {
                            let mut buf = if t.rank() == root {
                                data.clone()
                            } else {
                                vec![0xAB; data.len()]
                            };
                            algo(t, &c, &mut buf, root).map(|_| buf)
                        });
                        for (r, o) in outs.into_iter().enumerate() {
                            assert!(o.expect(&what) == data, "{what}: rank {r}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn all_gather_every_algorithm_world_length() {
    type GatherFn = fn(&mut dyn Transport, &OpCtx, &mut [&mut [u8]]) -> Result<()>;
    let algos: [(&str, GatherFn); 3] = [
        ("ring", allgather::ring::all_gather),
        ("direct", allgather::direct::all_gather),
        ("dispatcher", |t, c, b| {
            algorithms::all_gather(t, c, b, &AlgoOverrides::default())
        }),
    ];
    for (name, algo) in algos {
        for n in 1..=5 {
            for numel in lengths(n) {
                for dtype in [DType::Bool, DType::I32, DType::BF16] {
                    for uneven in [false, true] {
                        let what = format!("{name} n={n} numel={numel} {dtype:?} uneven={uneven}");
                        // Uneven: rank i's block has numel + i elements.
                        let len = |i: usize| numel + if uneven { i } else { 0 };
                        let data: Vec<_> = (0..n).map(|i| input(dtype, len(i), i)).collect();
                        let c = ctx(CollectiveKind::AllGather, dtype, ReduceOp::Sum, numel);
                        let outs = run(n, |t| {
                            let mut owned: Vec<Vec<u8>> = (0..n)
                                .map(|i| {
                                    if i == t.rank() {
                                        data[i].clone()
                                    } else {
                                        vec![0xCD; data[i].len()]
                                    }
                                })
                                .collect();
                            let mut blocks: Vec<&mut [u8]> =
                                owned.iter_mut().map(|v| v.as_mut_slice()).collect();
                            algo(t, &c, &mut blocks).map(|_| owned)
                        });
                        for (r, o) in outs.into_iter().enumerate() {
                            assert!(o.expect(&what) == data, "{what}: rank {r}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_every_world_length_dtype_op() {
    type RsFn = fn(&mut dyn Transport, &OpCtx, &mut [u8], usize, &mut [u8]) -> Result<()>;
    let algos: [(&str, RsFn); 3] = [
        ("ring", |t, c, w, bb, o| {
            let max = reduce_scatter::ring::DEFAULT_MAX_CHUNK_BYTES;
            reduce_scatter::ring::reduce_scatter(t, c, w, bb, o, max)
        }),
        ("ring/small-chunks", |t, c, w, bb, o| {
            reduce_scatter::ring::reduce_scatter(t, c, w, bb, o, 24)
        }),
        ("dispatcher", |t, c, w, bb, o| {
            algorithms::reduce_scatter(t, c, w, bb, o, &AlgoOverrides::default())
        }),
    ];
    for (name, algo) in algos {
        for n in 1..=5 {
            // Blocks of n+1 and more elements; the largest input is 5 x 20_011 elements.
            let blocks = lengths(n)
                .into_iter()
                .map(|l| if l > 1000 { 20_011 } else { l });
            for block in blocks {
                if (name.contains('/') || name == "dispatcher") && block > 1000 {
                    continue;
                }
                for dtype in DType::ALL {
                    let inputs: Vec<_> = (0..n).map(|r| input(dtype, block * n, r)).collect();
                    let bb = block * dtype.size();
                    for op in supported_ops(dtype) {
                        let what = format!("{name} n={n} block={block} {dtype:?} {op:?}");
                        let c = ctx(CollectiveKind::ReduceScatter, dtype, op, block);
                        let outs = run(n, |t| {
                            let mut work = inputs[t.rank()].clone();
                            let mut out = vec![0u8; bb];
                            algo(t, &c, &mut work, bb, &mut out).map(|_| out)
                        });
                        let want = reference(dtype, op, &inputs);
                        for (r, o) in outs.into_iter().enumerate() {
                            let o = o.expect(&what);
                            let w = &want[r * bb..(r + 1) * bb];
                            assert_matches_reference(dtype, &o, w, &format!("{what} rank {r}"));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn barrier_waits_for_every_rank() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for n in 1..=5 {
        let arrived = AtomicUsize::new(0);
        let c = ctx(CollectiveKind::Barrier, DType::U8, ReduceOp::Sum, 0);
        let seen = run(n, |t| {
            arrived.fetch_add(1, Ordering::SeqCst);
            barrier::dissemination::barrier(t, &c).unwrap();
            let after_first = arrived.load(Ordering::SeqCst);
            algorithms::barrier(t, &c, &AlgoOverrides::default()).unwrap();
            after_first
        });
        assert!(seen.iter().all(|&s| s == n), "n={n}: {seen:?}");
    }
}

#[test]
fn unsupported_ops_and_bad_arguments_are_typed_errors() {
    let o = AlgoOverrides::default();
    let outs = run(3, |t| {
        let c = ctx(CollectiveKind::AllReduce, DType::F32, ReduceOp::Band, 1);
        let band = algorithms::all_reduce(t, &c, &mut [0u8; 4], &o).unwrap_err();
        let c = ctx(CollectiveKind::AllReduce, DType::C64, ReduceOp::Max, 1);
        let cmax = algorithms::all_reduce(t, &c, &mut [0u8; 8], &o).unwrap_err();
        let c = ctx(CollectiveKind::AllReduce, DType::F32, ReduceOp::Avg, 1);
        let avg = algorithms::all_reduce(t, &c, &mut [0u8; 4], &o).unwrap_err();
        let c = ctx(
            CollectiveKind::ReduceScatter,
            DType::Bool,
            ReduceOp::PremulSum,
            1,
        );
        let premul = algorithms::reduce_scatter(t, &c, &mut [0; 3], 1, &mut [0], &o).unwrap_err();
        let c = ctx(CollectiveKind::ReduceScatter, DType::I32, ReduceOp::Sum, 1);
        let short = algorithms::reduce_scatter(t, &c, &mut [0; 8], 4, &mut [0; 4], &o).unwrap_err();
        let partial = algorithms::all_reduce(t, &c, &mut [0; 6], &o).unwrap_err();
        let c = ctx(CollectiveKind::Broadcast, DType::U8, ReduceOp::Sum, 1);
        let root = algorithms::broadcast(t, &c, &mut [0], 3, &o).unwrap_err();
        let c = ctx(CollectiveKind::AllGather, DType::U8, ReduceOp::Sum, 1);
        let blocks = algorithms::all_gather(t, &c, &mut [&mut [0u8][..]], &o).unwrap_err();
        [band, cmax, avg, premul, short, partial, root, blocks]
    });
    for errs in outs {
        let [band, cmax, avg, premul, short, partial, root, blocks] = errs;
        assert_eq!(
            band,
            Error::Runtime("ReduceOp.BAND is not supported for float32".into())
        );
        assert_eq!(
            cmax,
            Error::Runtime("ReduceOp.MAX is not supported for complex64".into())
        );
        assert!(matches!(avg, Error::InvalidArgument(_)), "{avg:?}");
        assert!(matches!(premul, Error::InvalidArgument(_)), "{premul:?}");
        for e in [short, partial, root, blocks] {
            assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        }
    }
}

#[test]
fn ranks_disagreeing_on_dtype_get_backend_error() {
    let outs = run(3, |t| {
        let dtype = if t.rank() == 1 {
            DType::I32
        } else {
            DType::F32
        };
        let c = ctx(CollectiveKind::AllReduce, dtype, ReduceOp::Sum, 4);
        let mut buf = vec![0u8; 16];
        let o = AlgoOverrides::parse("allreduce=ring").unwrap();
        let r = algorithms::all_reduce(t, &c, &mut buf, &o);
        // What the process group does on failure: tell the peers, so that none waits forever.
        if let Err(e) = &r {
            t.abort(&e.to_string());
        }
        r
    });
    // Rank 1's left and right neighbours both see its frames, so at least one rank reports it.
    let msgs: Vec<String> = outs
        .into_iter()
        .filter_map(|r| match r {
            Err(Error::Backend(m)) => Some(m),
            // A rank that already failed and left is a hung-up peer for the others.
            Err(Error::Network(_)) => None,
            Err(e) => panic!("unexpected error {e:?}"),
            Ok(()) => None,
        })
        .collect();
    assert!(!msgs.is_empty());
    assert!(msgs
        .iter()
        .any(|m| m.contains("float32") && m.contains("int32") && m.contains("rank 1")));
}
