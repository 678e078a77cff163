//! Every algorithm x world size 1..=5 x awkward lengths x every dtype x every supported op,
//! run on n threads over the in-memory mesh (ranks on separate hosts, on one host sharing a
//! workspace, or mixed), against a sequential reference; plus random cases (a property test).

use std::time::Duration;

use half::{bf16, f16};
use rustdist_core::algorithms::params::{
    LeadersAllGather, LeadersAllReduce, LeadersBroadcast, RingShape,
};
use rustdist_core::algorithms::{self, allgather, allreduce, alltoall, barrier, broadcast};
use rustdist_core::algorithms::{gather, reduce, reduce_scatter, scatter, AlgoOverrides, HostCpu};
use rustdist_core::reduce::{check_supported, reduce_into};
use rustdist_core::transport::local::{mesh, mesh_on_hosts, LocalTransport};
use rustdist_core::transport::workspace::{INLINE_BYTES, ROTATED_MAX_BYTES, SLOT_BYTES};
use rustdist_core::transport::{OpCtx, Signature, Transport};
use rustdist_core::{CollectiveKind, DType, Error, ReduceOp, Result};

/// Runs `f` on every rank of a fresh mesh of `n` (each rank a host of its own), one thread
/// each; results in rank order.
fn run<T: Send>(n: usize, f: impl Fn(&mut LocalTransport) -> T + Sync) -> Vec<T> {
    run_on(&(0..n).collect::<Vec<_>>(), f)
}

/// As [`run`], with rank r on host `host_of[r]` (ranks of a host share a workspace).
fn run_on<T: Send>(host_of: &[usize], f: impl Fn(&mut LocalTransport) -> T + Sync) -> Vec<T> {
    let f = &f;
    let ranks = if host_of.iter().enumerate().all(|(r, &h)| r == h) {
        mesh(host_of.len())
    } else {
        mesh_on_hosts(host_of)
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|mut t| s.spawn(move || f(&mut t)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Where the ranks of a world of `n` sit, as each kind of algorithm needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// A host per rank: TCP-like.
    Apart,
    /// All on one host: the shared-memory workspace.
    Together,
    /// Hosts of two ranks (the last one may hold one): hierarchical.
    Mixed,
}

impl Layout {
    fn hosts(self, n: usize) -> Vec<usize> {
        match self {
            Layout::Apart => (0..n).collect(),
            Layout::Together => vec![0; n],
            Layout::Mixed => (0..n).map(|r| r / 2).collect(),
        }
    }
}

/// Dtypes that cover every element size and kind (float, half, integer, bool, complex).
const SAMPLE_DTYPES: [DType; 6] = [
    DType::F32,
    DType::BF16,
    DType::I8,
    DType::I64,
    DType::Bool,
    DType::C128,
];

/// Ops whose results depend on operand order or pairing in different ways; the kernels
/// themselves are tested for every op in `reduce.rs`.
const SAMPLE_OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Product, ReduceOp::Max];

/// The layouts the dispatchers run on.
const ALL_LAYOUTS: [Layout; 3] = [Layout::Apart, Layout::Together, Layout::Mixed];

fn ctx(kind: CollectiveKind, dtype: DType, op: ReduceOp, count: usize) -> OpCtx {
    OpCtx::new(
        1,
        Signature {
            kind,
            dtype,
            op,
            count: count as u64,
        },
        op,
        Duration::from_secs(60),
    )
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

/// [`assert_identical`] for float32 where a NaN matches any NaN.
fn assert_identical_but_nan_payloads(outs: &[Vec<u8>], what: &str) {
    let lanes = |o: &[u8]| -> Vec<f32> {
        o.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let first = lanes(&outs[0]);
    for (r, o) in outs.iter().enumerate() {
        let same = lanes(o)
            .iter()
            .zip(&first)
            .all(|(x, y)| x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan());
        assert!(
            same,
            "{what}: rank {r} differs from rank 0 (NaN payloads aside)"
        );
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
type A2aFn = fn(&mut dyn Transport, &OpCtx, &[&[u8]], &mut [&mut [u8]]) -> Result<()>;

fn ring_shape(chunk_bytes: usize, piece_bytes: usize) -> RingShape {
    RingShape {
        chunk_bytes,
        piece_bytes,
    }
}

/// The all_reduce algorithms with the layout they run on, each also with tiny segments so that
/// multi-segment paths run.
fn all_reduce_algos() -> Vec<(&'static str, Layout, AllReduceFn)> {
    vec![
        ("ring", Layout::Apart, |t, c, b| {
            let shape = AlgoOverrides::default().ring_shape();
            allreduce::ring::all_reduce(t, c, b, shape)
        }),
        ("ring/small-chunks", Layout::Apart, |t, c, b| {
            allreduce::ring::all_reduce(t, c, b, ring_shape(40, 40))
        }),
        // Chunks in a few pieces (fewer than the window, and more), and in many.
        ("ring/pieces", Layout::Apart, |t, c, b| {
            allreduce::ring::all_reduce(t, c, b, ring_shape(40, 16))
        }),
        ("ring/many-pieces", Layout::Apart, |t, c, b| {
            allreduce::ring::all_reduce(t, c, b, ring_shape(1000, 8))
        }),
        ("recursive_doubling", Layout::Apart, |t, c, b| {
            allreduce::recursive_doubling::all_reduce(
                t,
                c,
                b,
                allreduce::recursive_doubling::DEFAULT_MAX_SEGMENT_BYTES,
            )
        }),
        (
            "recursive_doubling/small-segments",
            Layout::Apart,
            |t, c, b| allreduce::recursive_doubling::all_reduce(t, c, b, 48),
        ),
        (
            "shm_oneshot",
            Layout::Together,
            allreduce::shm_oneshot::all_reduce,
        ),
        (
            "shm_twoshot",
            Layout::Together,
            allreduce::shm_twoshot::all_reduce,
        ),
        // Peers' slices read straight from their memory (one process here: threads).
        (
            "shm_single_copy",
            Layout::Together,
            allreduce::shm_single_copy::all_reduce,
        ),
        // Each algorithm the leaders may run between the hosts.
        (
            "hierarchical/recursive_doubling",
            Layout::Mixed,
            |t, c, b| {
                allreduce::hierarchical::all_reduce(t, c, b, LeadersAllReduce::RecursiveDoubling)
            },
        ),
        ("hierarchical/ring", Layout::Mixed, |t, c, b| {
            let between = LeadersAllReduce::Ring(ring_shape(40, 16));
            allreduce::hierarchical::all_reduce(t, c, b, between)
        }),
        ("dispatcher", Layout::Apart, |t, c, b| {
            algorithms::all_reduce(t, c, b, &AlgoOverrides::default())
        }),
        ("dispatcher/shared", Layout::Together, |t, c, b| {
            algorithms::all_reduce(t, c, b, &AlgoOverrides::default())
        }),
        ("dispatcher/mixed", Layout::Mixed, |t, c, b| {
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

/// Lengths around the workspace's thresholds, for elements of `es` bytes: what fits in a
/// flag entry ([`INLINE_BYTES`], less all_gather's 8-byte length header) and what spans
/// several slots ([`SLOT_BYTES`]).
fn threshold_lengths(es: usize) -> Vec<usize> {
    let header = INLINE_BYTES - 8;
    vec![
        header / es,
        header / es + 1,
        INLINE_BYTES / es,
        INLINE_BYTES / es + 1,
        SLOT_BYTES / es + 3,
    ]
}

#[test]
fn all_reduce_every_algorithm_world_length_dtype_op() {
    for (name, layout, algo) in all_reduce_algos() {
        for n in 1..=5 {
            for numel in lengths(n) {
                for dtype in DType::ALL {
                    // Variants only need lengths that span several segments; the dispatchers
                    // run the same code as the named algorithms; the workspace algorithms
                    // share one reduction path for every dtype, so a sample of them will do.
                    if numel > 1000 && (name.contains('/') && dtype != DType::F32) {
                        continue;
                    }
                    if layout != Layout::Apart && !SAMPLE_DTYPES.contains(&dtype) {
                        continue;
                    }
                    let inputs: Vec<_> = (0..n).map(|r| input(dtype, numel, r)).collect();
                    for op in supported_ops(dtype) {
                        if layout != Layout::Apart && !SAMPLE_OPS.contains(&op) {
                            continue;
                        }
                        let what = format!("{name} n={n} numel={numel} {dtype:?} {op:?}");
                        check_all_reduce(layout, algo, &inputs, dtype, op, &what);
                    }
                }
            }
        }
    }
}

fn check_all_reduce(
    layout: Layout,
    algo: AllReduceFn,
    inputs: &[Vec<u8>],
    dtype: DType,
    op: ReduceOp,
    what: &str,
) {
    let numel = inputs[0].len() / dtype.size();
    let c = ctx(CollectiveKind::AllReduce, dtype, op, numel);
    let outs = run_on(&layout.hosts(inputs.len()), |t| {
        let mut buf = inputs[t.rank()].clone();
        algo(t, &c, &mut buf).map(|_| buf)
    });
    let outs: Vec<_> = outs.into_iter().map(|o| o.expect(what)).collect();
    assert_identical(&outs, what);
    let want = reference(dtype, op, inputs);
    assert_matches_reference(dtype, &outs[0], &want, what);
}

#[test]
fn workspace_algorithms_across_their_thresholds() {
    for (name, layout, algo) in all_reduce_algos() {
        if layout == Layout::Apart || name.starts_with("dispatcher/") {
            continue;
        }
        for n in [2, 3] {
            for dtype in [DType::F32, DType::BF16, DType::C128] {
                for numel in threshold_lengths(dtype.size()) {
                    let inputs: Vec<_> = (0..n).map(|r| input(dtype, numel, r)).collect();
                    let what = format!("{name} n={n} numel={numel} {dtype:?}");
                    check_all_reduce(layout, algo, &inputs, dtype, ReduceOp::Sum, &what);
                }
            }
        }
    }
}

#[test]
fn data_published_whole_reaches_its_readers_at_either_place_in_the_slot() {
    // Small data sits at one of two places in its slot, by step (ROTATED_MAX_BYTES): one
    // world runs one-shot all_reduces, broadcasts, reduces and all_gathers, each of sizes
    // either side of that limit four times in a row (so at both places), and a step's
    // readers must find its data there, not an earlier step's.
    let sizes = [
        ROTATED_MAX_BYTES,
        40 << 10,
        ROTATED_MAX_BYTES + 4,
        INLINE_BYTES + 4,
    ];
    let dtype = DType::F32;
    for n in [2, 3] {
        let mut cases: Vec<(usize, usize, Vec<Vec<u8>>)> = Vec::new();
        for op in 0..4 {
            for bytes in sizes {
                for _ in 0..4 {
                    let (i, numel) = (cases.len(), bytes / dtype.size());
                    let inputs = (0..n).map(|r| input(dtype, numel, r + n * i)).collect();
                    cases.push((op, numel, inputs));
                }
            }
        }
        let outs = run_on(&Layout::Together.hosts(n), |t| {
            let mut got = Vec::new();
            for (i, (op, numel, inputs)) in cases.iter().enumerate() {
                let mut buf = inputs[t.rank()].clone();
                let root = i % n;
                match op {
                    0 => {
                        let c = ctx(CollectiveKind::AllReduce, dtype, ReduceOp::Sum, *numel);
                        allreduce::shm_oneshot::all_reduce(t, &c, &mut buf)?
                    }
                    1 => {
                        let c = ctx(CollectiveKind::Broadcast, dtype, ReduceOp::Sum, *numel);
                        broadcast::shm::broadcast(t, &c, &mut buf, root)?
                    }
                    2 => {
                        let c = ctx(CollectiveKind::Reduce, dtype, ReduceOp::Sum, *numel);
                        reduce::shm::reduce(t, &c, &mut buf, root)?
                    }
                    _ => {
                        let c = ctx(CollectiveKind::AllGather, dtype, ReduceOp::Sum, *numel);
                        let mut all = vec![0u8; buf.len() * n];
                        let mut blocks: Vec<&mut [u8]> = all.chunks_mut(buf.len()).collect();
                        allgather::shm::all_gather_from(t, &c, Some(&buf), &mut blocks)?;
                        buf = all;
                    }
                }
                got.push(buf);
            }
            Ok::<_, Error>(got)
        });
        let outs: Vec<_> = outs
            .into_iter()
            .map(|o| o.expect("the sequence runs"))
            .collect();
        for (i, (op, numel, inputs)) in cases.iter().enumerate() {
            let root = i % n;
            let sum = reference(dtype, ReduceOp::Sum, inputs);
            for (r, got) in outs.iter().map(|o| &o[i]).enumerate() {
                let what = format!("n={n} case {i} ({numel} floats) rank {r}");
                match op {
                    0 => assert_matches_reference(dtype, got, &sum, &what),
                    1 => assert_eq!(got, &inputs[root], "{what}: broadcast"),
                    2 if r == root => assert_matches_reference(dtype, got, &sum, &what),
                    2 => {}
                    _ => assert_eq!(got, &inputs.concat(), "{what}: all_gather"),
                }
            }
        }
    }
}

#[test]
fn all_reduce_is_bitwise_identical_with_nan_and_signed_zero() {
    // MIN/MAX with NaNs of different payloads and mixed zero signs depend on operand order;
    // every rank must still end with the same bits. Two ranks' one-shot SUM reduces each
    // other's into their own: NaN payloads may differ (both NaN), nothing else.
    let vals = [
        0.0f32,
        -0.0,
        f32::NAN,
        -f32::NAN,
        1.0,
        f32::from_bits(0x7fc0_0001),
    ];
    for (name, layout, algo) in all_reduce_algos() {
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
                let outs = run_on(&layout.hosts(n), |t| {
                    let mut buf = inputs[t.rank()].clone();
                    algo(t, &c, &mut buf).map(|_| buf)
                });
                let outs: Vec<_> = outs.into_iter().map(Result::unwrap).collect();
                let what = format!("{name} n={n} {op:?}");
                // Two ranks on one host: the dispatchers choose one-shot for 36 floats.
                let one_shot = name == "shm_oneshot" || name.starts_with("dispatcher/");
                if one_shot && n == 2 && op == ReduceOp::Sum {
                    assert_identical_but_nan_payloads(&outs, &what);
                } else {
                    assert_identical(&outs, &what);
                }
            }
        }
    }
}

#[test]
fn broadcast_every_algorithm_world_length_root() {
    type BcastFn = fn(&mut dyn Transport, &OpCtx, &mut [u8], usize) -> Result<()>;
    let algos: [(&str, &[Layout], BcastFn); 8] = [
        (
            "binomial_tree",
            &[Layout::Apart],
            broadcast::binomial_tree::broadcast,
        ),
        ("chain", &[Layout::Apart], |t, c, b, r| {
            broadcast::chain::broadcast(t, c, b, r, broadcast::chain::segment_bytes(b.len()))
        }),
        ("chain/small-segments", &[Layout::Apart], |t, c, b, r| {
            broadcast::chain::broadcast(t, c, b, r, 7)
        }),
        ("shm", &[Layout::Together], broadcast::shm::broadcast),
        // The root's buffer read straight from its memory (one process here: threads).
        (
            "single copy",
            &[Layout::Together],
            broadcast::single_copy::broadcast,
        ),
        // Each algorithm the leaders may run between the hosts.
        (
            "hierarchical/binomial_tree",
            &[Layout::Mixed],
            |t, c, b, r| {
                broadcast::hierarchical::broadcast(t, c, b, r, LeadersBroadcast::BinomialTree)
            },
        ),
        ("hierarchical/chain", &[Layout::Mixed], |t, c, b, r| {
            broadcast::hierarchical::broadcast(t, c, b, r, LeadersBroadcast::Chain)
        }),
        ("dispatcher", &ALL_LAYOUTS, |t, c, b, r| {
            algorithms::broadcast(t, c, b, r, &AlgoOverrides::default())
        }),
    ];
    for (name, layouts, algo) in algos {
        for &layout in layouts {
            for n in 1..=5 {
                let mut sizes = lengths(n);
                sizes.extend(threshold_lengths(1));
                for numel in sizes {
                    if name.contains('/') && numel > 1000 {
                        continue;
                    }
                    for dtype in [DType::U8, DType::F16, DType::C128] {
                        for root in 0..n {
                            let what = format!(
                                "{name} {layout:?} n={n} numel={numel} {dtype:?} root={root}"
                            );
                            let data = input(dtype, numel, root + 7);
                            let c = ctx(CollectiveKind::Broadcast, dtype, ReduceOp::Sum, numel);
                            let outs = run_on(&layout.hosts(n), |t| {
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
}

/// This rank's block, returned as an input apart from `blocks`, and then overwritten there.
fn own_block_as_input(t: &dyn Transport, blocks: &mut [&mut [u8]]) -> Vec<u8> {
    let own = &mut blocks[t.rank()];
    let src = own.to_vec();
    own.fill(0xEE);
    src
}

#[test]
fn all_gather_every_algorithm_world_length() {
    type GatherFn = fn(&mut dyn Transport, &OpCtx, &mut [&mut [u8]]) -> Result<()>;
    let algos: [(&str, &[Layout], GatherFn); 12] = [
        ("ring", &[Layout::Apart], allgather::ring::all_gather),
        ("direct", &[Layout::Apart], allgather::direct::all_gather),
        ("bruck", &[Layout::Apart], allgather::bruck::all_gather),
        ("shm", &[Layout::Together], allgather::shm::all_gather),
        // Each peer's block read straight from its memory (one process here: threads).
        ("single copy", &[Layout::Together], |t, c, b| {
            allgather::single_copy::all_gather_from(t, c, None, b)
        }),
        ("single copy from input", &[Layout::Together], |t, c, b| {
            let src = own_block_as_input(t, b);
            allgather::single_copy::all_gather_from(t, c, Some(&src), b)
        }),
        // The input apart from the outputs; the own block starts as garbage.
        ("shm from input", &[Layout::Together], |t, c, b| {
            let src = own_block_as_input(t, b);
            allgather::shm::all_gather_from(t, c, Some(&src), b)
        }),
        ("dispatcher from input", &ALL_LAYOUTS, |t, c, b| {
            let src = own_block_as_input(t, b);
            algorithms::all_gather_from(t, c, Some(&src), b, &AlgoOverrides::default())
        }),
        // Each algorithm the leaders may run between the hosts.
        ("hierarchical/direct", &[Layout::Mixed], |t, c, b| {
            allgather::hierarchical::all_gather(t, c, b, LeadersAllGather::Direct)
        }),
        ("hierarchical/bruck", &[Layout::Mixed], |t, c, b| {
            allgather::hierarchical::all_gather(t, c, b, LeadersAllGather::Bruck)
        }),
        ("hierarchical/ring", &[Layout::Mixed], |t, c, b| {
            allgather::hierarchical::all_gather(t, c, b, LeadersAllGather::Ring)
        }),
        ("dispatcher", &ALL_LAYOUTS, |t, c, b| {
            algorithms::all_gather(t, c, b, &AlgoOverrides::default())
        }),
    ];
    for (name, layouts, algo) in algos {
        for &layout in layouts {
            for n in 1..=5 {
                let mut sizes = lengths(n);
                sizes.extend(threshold_lengths(4));
                for numel in sizes {
                    for dtype in [DType::Bool, DType::I32, DType::BF16] {
                        for uneven in [false, true] {
                            let what = format!(
                                "{name} {layout:?} n={n} numel={numel} {dtype:?} uneven={uneven}"
                            );
                            // Uneven: rank i's block has numel + i elements.
                            let len = |i: usize| numel + if uneven { i } else { 0 };
                            let data: Vec<_> = (0..n).map(|i| input(dtype, len(i), i)).collect();
                            let count = if uneven { 0 } else { numel };
                            let c = ctx(CollectiveKind::AllGather, dtype, ReduceOp::Sum, count);
                            let outs = run_on(&layout.hosts(n), |t| {
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
}

/// Bruck's all_gather where its steps get awkward: worlds up to 9 and past powers of two
/// (the last step sends fewer blocks), blocks of 0 and odd byte counts, even and uneven, as
/// the group API lays them out (views into one output with gaps between them), forced
/// through the dispatcher and picked by it.
#[test]
fn bruck_all_gather_awkward_worlds_and_blocks() {
    let forced = AlgoOverrides::parse("all_gather=bruck").unwrap();
    let policy = AlgoOverrides::default();
    let worlds = (1..=9).chain([13, 16, 33]);
    for n in worlds {
        for bytes in [0usize, 1, 3, 7, 4097] {
            for uneven in [false, true] {
                for o in [&forced, &policy] {
                    let what = format!("n={n} bytes={bytes} uneven={uneven} {o:?}");
                    let len = |i: usize| bytes + if uneven { i % 3 } else { 0 };
                    let data: Vec<_> = (0..n).map(|i| input(DType::U8, len(i), i)).collect();
                    const GAP: usize = 5;
                    let count = if uneven { 0 } else { bytes };
                    let c = ctx(CollectiveKind::AllGather, DType::U8, ReduceOp::Sum, count);
                    let outs = run(n, |t| {
                        let me = t.rank();
                        let mut out = vec![0xCDu8; (0..n).map(|i| len(i) + GAP).sum()];
                        let mut blocks: Vec<&mut [u8]> = Vec::new();
                        let mut rest = out.as_mut_slice();
                        for i in 0..n {
                            let (block, tail) = std::mem::take(&mut rest).split_at_mut(len(i));
                            rest = &mut tail[GAP..];
                            blocks.push(block);
                        }
                        algorithms::all_gather_from(t, &c, Some(&data[me]), &mut blocks, o)
                            .map(|_| out)
                    });
                    for (r, out) in outs.into_iter().enumerate() {
                        let out = out.expect(&what);
                        let mut at = 0;
                        for (i, d) in data.iter().enumerate() {
                            assert!(out[at..at + d.len()] == d[..], "{what}: rank {r} block {i}");
                            let gap = &out[at + d.len()..at + d.len() + GAP];
                            assert!(gap.iter().all(|&b| b == 0xCD), "{what}: rank {r} gap {i}");
                            at += d.len() + GAP;
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_every_world_length_dtype_op() {
    type RsFn = fn(&mut dyn Transport, &OpCtx, &[u8], &mut [u8]) -> Result<()>;
    let algos: [(&str, &[Layout], RsFn); 4] = [
        ("ring", &[Layout::Apart], |t, c, i, o| {
            let max = reduce_scatter::ring::DEFAULT_MAX_CHUNK_BYTES;
            reduce_scatter::ring::reduce_scatter(t, c, &mut i.to_vec(), o.len(), o, max)
        }),
        ("ring/small-chunks", &[Layout::Apart], |t, c, i, o| {
            reduce_scatter::ring::reduce_scatter(t, c, &mut i.to_vec(), o.len(), o, 24)
        }),
        (
            "shm",
            &[Layout::Together],
            reduce_scatter::shm::reduce_scatter,
        ),
        ("dispatcher", &ALL_LAYOUTS, |t, c, i, o| {
            algorithms::reduce_scatter(t, c, i, o, &AlgoOverrides::default())
        }),
    ];
    for (name, layouts, algo) in algos {
        for &layout in layouts {
            for n in 1..=5 {
                // Blocks of n+1 and more elements; the largest input is 5 x 70_011 elements
                // (more than a slot region on 5 ranks).
                let blocks = lengths(n)
                    .into_iter()
                    .map(|l| if l > 1000 { 70_011 } else { l });
                for block in blocks {
                    if (name.contains('/') || name == "dispatcher") && block > 1000 {
                        continue;
                    }
                    for dtype in DType::ALL {
                        let inputs: Vec<_> = (0..n).map(|r| input(dtype, block * n, r)).collect();
                        let bb = block * dtype.size();
                        for op in supported_ops(dtype) {
                            let what =
                                format!("{name} {layout:?} n={n} block={block} {dtype:?} {op:?}");
                            let c = ctx(CollectiveKind::ReduceScatter, dtype, op, block);
                            let outs = run_on(&layout.hosts(n), |t| {
                                let mut out = vec![0u8; bb];
                                let me = t.rank();
                                algo(t, &c, &inputs[me], &mut out).map(|_| out)
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
}

#[test]
fn reduce_every_algorithm_world_root() {
    type ReduceFn = fn(&mut dyn Transport, &OpCtx, &mut [u8], usize) -> Result<()>;
    let algos: [(&str, &[Layout], ReduceFn); 4] = [
        (
            "binomial_tree",
            &[Layout::Apart],
            reduce::binomial_tree::reduce,
        ),
        ("shm", &[Layout::Together], reduce::shm::reduce),
        (
            "hierarchical",
            &[Layout::Mixed],
            reduce::hierarchical::reduce,
        ),
        ("dispatcher", &ALL_LAYOUTS, |t, c, b, r| {
            algorithms::reduce(t, c, b, r, &AlgoOverrides::default())
        }),
    ];
    for (name, layouts, algo) in algos {
        for &layout in layouts {
            for n in 1..=5 {
                for numel in [0, 1, 13, 20_011] {
                    for dtype in [DType::F32, DType::I64, DType::C64] {
                        let inputs: Vec<_> = (0..n).map(|r| input(dtype, numel, r)).collect();
                        for op in supported_ops(dtype)
                            .into_iter()
                            .filter(|o| SAMPLE_OPS.contains(o))
                        {
                            // The first and last rank as roots: the tree's two shapes.
                            let mut roots = vec![0, n - 1];
                            roots.dedup();
                            for root in roots {
                                let what = format!(
                                    "{name} {layout:?} n={n} numel={numel} {dtype:?} {op:?} root={root}"
                                );
                                let c = ctx(CollectiveKind::Reduce, dtype, op, numel);
                                let outs = run_on(&layout.hosts(n), |t| {
                                    let mut buf = inputs[t.rank()].clone();
                                    algo(t, &c, &mut buf, root).map(|_| buf)
                                });
                                let got = outs.into_iter().nth(root).map(|o| o.expect(&what));
                                let want = reference(dtype, op, &inputs);
                                assert_matches_reference(dtype, &got.unwrap(), &want, &what);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Block sizes of rank `r` when blocks differ (gather, scatter, all_to_all of objects).
fn uneven_len(numel: usize, from: usize, to: usize) -> usize {
    numel + 3 * from + to
}

#[test]
fn gather_and_scatter_every_algorithm_root_and_size() {
    type GatherFn = fn(&mut dyn Transport, &OpCtx, &[u8], &mut [&mut [u8]], usize) -> Result<()>;
    type ScatterFn = fn(&mut dyn Transport, &OpCtx, &[&[u8]], &mut [u8], usize) -> Result<()>;
    let gathers: [(&str, Layout, GatherFn); 2] = [
        ("direct", Layout::Apart, gather::direct::gather),
        ("shm", Layout::Together, gather::shm::gather),
    ];
    let scatters: [(&str, Layout, ScatterFn); 2] = [
        ("direct", Layout::Apart, scatter::direct::scatter),
        ("shm", Layout::Together, scatter::shm::scatter),
    ];
    for n in 1..=5 {
        for numel in [0, 1, 47, 300_007] {
            for uneven in [false, true] {
                let len = |r: usize| {
                    if uneven {
                        uneven_len(numel, r, 0)
                    } else {
                        numel
                    }
                };
                let count = if uneven { 0 } else { numel };
                for root in 0..n {
                    let blocks: Vec<_> = (0..n).map(|r| input(DType::U8, len(r), r)).collect();
                    for (name, layout, algo) in gathers {
                        let what = format!(
                            "gather {name} n={n} numel={numel} uneven={uneven} root={root}"
                        );
                        let c = ctx(CollectiveKind::Gather, DType::U8, ReduceOp::Sum, count);
                        let outs = run_on(&layout.hosts(n), |t| {
                            let mut owned: Vec<Vec<u8>> = if t.rank() == root {
                                (0..n).map(|r| vec![0xEE; len(r)]).collect()
                            } else {
                                Vec::new()
                            };
                            let mut outs: Vec<&mut [u8]> =
                                owned.iter_mut().map(|v| v.as_mut_slice()).collect();
                            let me = t.rank();
                            algo(t, &c, &blocks[me], &mut outs, root).map(|_| owned)
                        });
                        let got = outs.into_iter().nth(root).map(|o| o.expect(&what));
                        assert!(got == Some(blocks.clone()), "{what}");
                    }
                    for (name, layout, algo) in scatters {
                        let what = format!(
                            "scatter {name} n={n} numel={numel} uneven={uneven} root={root}"
                        );
                        let c = ctx(CollectiveKind::Scatter, DType::U8, ReduceOp::Sum, count);
                        let outs = run_on(&layout.hosts(n), |t| {
                            let ins: Vec<&[u8]> = if t.rank() == root {
                                blocks.iter().map(|b| b.as_slice()).collect()
                            } else {
                                Vec::new()
                            };
                            let mut out = vec![0xEE; len(t.rank())];
                            algo(t, &c, &ins, &mut out, root).map(|_| out)
                        });
                        for (r, o) in outs.into_iter().enumerate() {
                            assert!(o.expect(&what) == blocks[r], "{what}: rank {r}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn all_to_all_every_algorithm_even_and_uneven() {
    let algos: [(&str, Layout, A2aFn); 5] = [
        ("pairwise", Layout::Apart, alltoall::pairwise::all_to_all),
        ("shm", Layout::Together, alltoall::shm::all_to_all),
        // Each block read straight from the peer's memory (one process here: threads); equal
        // blocks only.
        (
            "single copy",
            Layout::Together,
            alltoall::single_copy::all_to_all,
        ),
        ("dispatcher", Layout::Together, |t, c, s, r| {
            algorithms::all_to_all(t, c, s, r, &AlgoOverrides::default())
        }),
        ("dispatcher/intel", Layout::Together, |t, c, s, r| {
            let intel = AlgoOverrides {
                cpu: HostCpu::Intel,
                ..AlgoOverrides::default()
            };
            algorithms::all_to_all(t, c, s, r, &intel)
        }),
    ];
    // Past the 4 MiB from which pairwise copies a rank's own block on a helper thread,
    // alongside the exchange (at up to 3 ranks: the test's memory stays small).
    const LARGE_BLOCK: usize = (4 << 20) + 1;
    for (name, layout, algo) in algos {
        for n in 1..=5 {
            let large = name == "pairwise" && n <= 3;
            // Even blocks of up to INLINE_BYTES / n bytes travel in the flag entry.
            let inline_most = INLINE_BYTES / n;
            let numels = [0, 1, 33, inline_most, inline_most + 1, 270_001, LARGE_BLOCK];
            for numel in numels.into_iter().filter(|&m| large || m != LARGE_BLOCK) {
                for uneven in [false, true]
                    .into_iter()
                    .filter(|&u| !u || name != "single copy")
                {
                    let len = |from: usize, to: usize| {
                        if uneven {
                            uneven_len(numel, from, to)
                        } else {
                            numel
                        }
                    };
                    // block(from, to): what rank `from` sends to rank `to`.
                    let block =
                        |from: usize, to: usize| input(DType::U8, len(from, to), from * 8 + to);
                    let what = format!("{name} n={n} numel={numel} uneven={uneven}");
                    let count = if uneven { 0 } else { numel };
                    let c = ctx(CollectiveKind::AllToAll, DType::U8, ReduceOp::Sum, count);
                    let outs = run_on(&layout.hosts(n), |t| {
                        let me = t.rank();
                        let sends: Vec<Vec<u8>> = (0..n).map(|to| block(me, to)).collect();
                        let send_refs: Vec<&[u8]> = sends.iter().map(|b| b.as_slice()).collect();
                        let mut owned: Vec<Vec<u8>> =
                            (0..n).map(|from| vec![0xEE; len(from, me)]).collect();
                        let mut recvs: Vec<&mut [u8]> =
                            owned.iter_mut().map(|v| v.as_mut_slice()).collect();
                        algo(t, &c, &send_refs, &mut recvs).map(|_| owned)
                    });
                    for (me, o) in outs.into_iter().enumerate() {
                        let want: Vec<Vec<u8>> = (0..n).map(|from| block(from, me)).collect();
                        assert!(o.expect(&what) == want, "{what}: rank {me}");
                    }
                }
            }
        }
    }
}

#[test]
fn single_copy_all_gather_forced_on_ranks_apart_fails() {
    let c = ctx(CollectiveKind::AllGather, DType::U8, ReduceOp::Sum, 4);
    let forced = AlgoOverrides::parse("all_gather=shm_single_copy").unwrap();
    let errs = run(2, |t| {
        let mut owned = vec![vec![0u8; 4]; 2];
        let mut blocks: Vec<&mut [u8]> = owned.iter_mut().map(|v| v.as_mut_slice()).collect();
        algorithms::all_gather(t, &c, &mut blocks, &forced).unwrap_err()
    });
    for e in errs {
        assert!(
            matches!(&e, Error::Runtime(m) if m.contains("shared-memory algorithm")),
            "{e:?}"
        );
    }
}

#[test]
fn all_to_all_blocks_that_contradict_the_count_are_invalid() {
    let c = ctx(CollectiveKind::AllToAll, DType::U8, ReduceOp::Sum, 2);
    let algos: [(A2aFn, &str); 2] = [
        (alltoall::shm::all_to_all, "blocks of 2 bytes agreed"),
        (alltoall::single_copy::all_to_all, "takes blocks of 2 bytes"),
    ];
    for (algo, says) in algos {
        let errs = run_on(&[0, 0, 0], |t| {
            let sends = [&[1u8][..]; 3];
            let mut owned = vec![vec![0u8; 1]; 3];
            let mut recvs: Vec<&mut [u8]> = owned.iter_mut().map(|v| v.as_mut_slice()).collect();
            algo(t, &c, &sends, &mut recvs).unwrap_err()
        });
        for e in errs {
            assert!(
                matches!(&e, Error::InvalidArgument(m) if m.contains(says)),
                "{e:?}"
            );
        }
    }
}

#[test]
fn barrier_waits_for_every_rank() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for layout in ALL_LAYOUTS {
        for n in 1..=5 {
            let arrived = AtomicUsize::new(0);
            let c = ctx(CollectiveKind::Barrier, DType::U8, ReduceOp::Sum, 0);
            let seen = run_on(&layout.hosts(n), |t| {
                arrived.fetch_add(1, Ordering::SeqCst);
                algorithms::barrier(t, &c, &AlgoOverrides::default()).unwrap();
                arrived.load(Ordering::SeqCst)
            });
            assert!(seen.iter().all(|&s| s == n), "{layout:?} n={n}: {seen:?}");
        }
    }
    let c = ctx(CollectiveKind::Barrier, DType::U8, ReduceOp::Sum, 0);
    run(3, |t| barrier::dissemination::barrier(t, &c).unwrap());
}

#[test]
fn random_cases_match_the_reference() {
    // A property test: random worlds, layouts, dtypes, ops and lengths through the
    // dispatchers (which pick the algorithm, with either CPU's bands), against the sequential
    // reference.
    for case in 0..120u64 {
        let cpu = [HostCpu::Other, HostCpu::Intel][case as usize % 2];
        let o = AlgoOverrides {
            cpu,
            ..AlgoOverrides::default()
        };
        let h = mix(case ^ 0xC0FFEE);
        let n = 1 + (h % 5) as usize;
        let layout = ALL_LAYOUTS[(h >> 3) as usize % 3];
        let dtype = DType::ALL[(h >> 5) as usize % DType::ALL.len()];
        let ops = supported_ops(dtype);
        let op = ops[(h >> 9) as usize % ops.len()];
        let numel = match (h >> 13) % 4 {
            0 => (h >> 16) as usize % 16,
            1 => (h >> 16) as usize % 1000,
            2 => (h >> 16) as usize % 70_000,
            // Past 2 MiB in all (Intel's single-copy all_reduce).
            _ => (2 << 20) / dtype.size() / n + (h >> 16) as usize % 1000,
        };
        let what = format!("case {case}: {cpu:?} {layout:?} n={n} numel={numel} {dtype:?} {op:?}");
        let inputs: Vec<_> = (0..n)
            .map(|r| input(dtype, numel * n, r + case as usize))
            .collect();
        let want = reference(dtype, op, &inputs);
        let bb = numel * dtype.size();
        let outs = run_on(&layout.hosts(n), |t| {
            let c = ctx(CollectiveKind::AllReduce, dtype, op, numel * n);
            let mut all = inputs[t.rank()].clone();
            algorithms::all_reduce(t, &c, &mut all, &o)?;
            let c = ctx(CollectiveKind::ReduceScatter, dtype, op, numel);
            let mut out = vec![0u8; bb];
            let me = t.rank();
            algorithms::reduce_scatter(t, &c, &inputs[me], &mut out, &o)?;
            Ok::<_, Error>((all, out))
        });
        for (r, o) in outs.into_iter().enumerate() {
            let (all, out) = o.expect(&what);
            assert_matches_reference(dtype, &all, &want, &format!("{what}: all_reduce rank {r}"));
            let w = &want[r * bb..(r + 1) * bb];
            assert_matches_reference(dtype, &out, w, &format!("{what}: reduce_scatter rank {r}"));
        }
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
        let premul = algorithms::reduce_scatter(t, &c, &[0; 3], &mut [0], &o).unwrap_err();
        let c = ctx(CollectiveKind::ReduceScatter, DType::I32, ReduceOp::Sum, 1);
        let short = algorithms::reduce_scatter(t, &c, &[0; 8], &mut [0; 4], &o).unwrap_err();
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

#[test]
fn single_copy_broadcast_of_another_length_fails_every_rank() {
    // Rank 2 expects 5 bytes where the root sends 4: no rank reads or returns garbage.
    let outs = run_on(&[0, 0, 0], |t| {
        let numel = if t.rank() == 2 { 5 } else { 4 };
        let c = ctx(CollectiveKind::Broadcast, DType::U8, ReduceOp::Sum, numel);
        let mut buf = vec![0u8; numel];
        let r = broadcast::single_copy::broadcast(t, &c, &mut buf, 0);
        if let Err(e) = &r {
            t.abort(&e.to_string());
        }
        r
    });
    for r in outs {
        match r {
            Err(Error::Backend(m)) => assert!(m.contains("mismatch"), "{m}"),
            other => panic!("expected a mismatch error, got {other:?}"),
        }
    }
}

#[test]
fn single_copy_broadcast_root_arriving_after_a_reader_failed_writes_nothing_there() {
    // Rank 1 gives up on the root (its timeout passes) after publishing where its buffer
    // lies; the root arrives later, finds the address, and must not write: rank 1's caller
    // may have freed that buffer.
    let mut ranks = mesh_on_hosts(&[0, 0]);
    let short = |numel: usize| {
        let c = ctx(CollectiveKind::Broadcast, DType::U8, ReduceOp::Sum, numel);
        OpCtx::new(c.seq, c.sig, ReduceOp::Sum, Duration::from_millis(50))
    };
    let mut theirs = vec![0u8; 4096];
    let r = broadcast::single_copy::broadcast(&mut ranks[1], &short(4096), &mut theirs, 0);
    assert!(matches!(r, Err(Error::Backend(_))), "{r:?}");
    let mut root_buf = vec![7u8; 4096];
    let r = broadcast::single_copy::broadcast(&mut ranks[0], &short(4096), &mut root_buf, 0);
    assert!(r.is_err(), "rank 1 never finished: {r:?}");
    assert!(
        theirs.iter().all(|&b| b == 0),
        "the root wrote into a withdrawn buffer"
    );
}

#[test]
fn ranks_disagreeing_in_the_workspace_get_backend_error() {
    // Rank 1 reduces 3 elements where the others reduce 4: the step's signature differs.
    let outs = run_on(&[0, 0, 0], |t| {
        let numel = if t.rank() == 1 { 3 } else { 4 };
        let c = ctx(CollectiveKind::AllReduce, DType::F32, ReduceOp::Sum, numel);
        let mut buf = vec![0u8; numel * 4];
        allreduce::shm_oneshot::all_reduce(t, &c, &mut buf)
    });
    for r in outs {
        match r {
            Err(Error::Backend(m)) => assert!(m.contains("mismatch"), "{m}"),
            other => panic!("expected a mismatch error, got {other:?}"),
        }
    }
}
