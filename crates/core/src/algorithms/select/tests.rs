//! Tests of the policy and of the table it prints (the parts' own tests sit in their files).

use std::time::Duration;

use super::*;
use crate::algorithms::params::RingShape;
use crate::transport::LinkKind;
use crate::types::{DType, ReduceOp};
use SingleCopy::{CoreEach, SharedCores, Unavailable};

#[test]
fn defaults_depend_on_size_and_links() {
    let o = AlgoOverrides::default();
    let (tcp, shm, mixed) = (
        LinkKind::Tcp,
        LinkKind::SharedMemory,
        LinkKind::Hierarchical,
    );
    assert_eq!(
        o.all_reduce(1024, DType::F32, ReduceOp::Sum, 4, tcp, Unavailable),
        AllReduceAlgo::RecursiveDoubling
    );
    assert_eq!(
        o.all_reduce(64 << 20, DType::F32, ReduceOp::Sum, 4, tcp, Unavailable),
        AllReduceAlgo::Ring
    );
    assert_eq!(
        o.all_reduce(8, DType::F32, ReduceOp::Sum, 2, shm, Unavailable),
        AllReduceAlgo::ShmOneShot
    );
    assert_eq!(
        o.all_reduce(64 << 20, DType::F32, ReduceOp::Sum, 2, shm, Unavailable),
        AllReduceAlgo::ShmTwoShot
    );
    // The bands of single-copy algorithms depend on the CPU.
    let intel = AlgoOverrides {
        cpu: HostCpu::Intel,
        ..o
    };
    // Peers' slices read in one copy where the ranks may: on Intel's CPUs from 2 MiB (three
    // ranks, or two with an op other than SUM and PRODUCT; below).
    for (bytes, algo, on_intel) in [
        (
            64 << 10,
            AllReduceAlgo::ShmOneShot,
            AllReduceAlgo::ShmOneShot,
        ),
        (
            (2 << 20) - 4,
            AllReduceAlgo::ShmTwoShot,
            AllReduceAlgo::ShmTwoShot,
        ),
        (
            2 << 20,
            AllReduceAlgo::ShmTwoShot,
            AllReduceAlgo::ShmSingleCopy,
        ),
        (
            64 << 20,
            AllReduceAlgo::ShmTwoShot,
            AllReduceAlgo::ShmSingleCopy,
        ),
    ] {
        for (op, world) in [(ReduceOp::Sum, 3), (ReduceOp::Max, 2)] {
            assert_eq!(
                o.all_reduce(bytes, DType::F32, op, world, shm, CoreEach),
                algo,
                "{bytes} bytes"
            );
            assert_eq!(
                intel.all_reduce(bytes, DType::F32, op, world, shm, CoreEach),
                on_intel,
                "{bytes} bytes, Intel, {op:?} of {world}"
            );
        }
    }
    // Two ranks' SUM and PRODUCT two-shot copies less: single copy from 3 MiB.
    for op in [ReduceOp::Sum, ReduceOp::Product] {
        for (bytes, algo) in [
            (2 << 20, AllReduceAlgo::ShmTwoShot),
            ((3 << 20) - 4, AllReduceAlgo::ShmTwoShot),
            (3 << 20, AllReduceAlgo::ShmSingleCopy),
        ] {
            let picked = intel.all_reduce(bytes, DType::F32, op, 2, shm, CoreEach);
            assert_eq!(picked, algo, "{bytes} bytes, Intel, {op:?} of two");
            let elsewhere = o.all_reduce(bytes, DType::F32, op, 2, shm, CoreEach);
            assert_eq!(elsewhere, AllReduceAlgo::ShmTwoShot);
        }
    }
    assert_eq!(
        intel.all_reduce(64 << 20, DType::F32, ReduceOp::Sum, 2, shm, Unavailable),
        AllReduceAlgo::ShmTwoShot
    );
    assert_eq!(
        intel.all_reduce(64 << 20, DType::F32, ReduceOp::Sum, 2, tcp, CoreEach),
        AllReduceAlgo::Ring
    );
    assert_eq!(
        o.all_reduce(8, DType::F32, ReduceOp::Sum, 4, mixed, Unavailable),
        AllReduceAlgo::Hierarchical
    );
    assert_eq!(
        o.broadcast(64 << 20, 4, tcp, Unavailable),
        BroadcastAlgo::Chain
    );
    assert_eq!(
        o.broadcast(64 << 20, 2, tcp, Unavailable),
        BroadcastAlgo::BinomialTree
    );
    assert_eq!(o.broadcast(8, 4, shm, Unavailable), BroadcastAlgo::Shm);
    // One copy between the root's memory and the others' where the ranks may: from 16 KiB on
    // Intel's CPUs, never on others.
    for (bytes, algo, on_intel) in [
        ((16 << 10) - 1, BroadcastAlgo::Shm, BroadcastAlgo::Shm),
        (16 << 10, BroadcastAlgo::Shm, BroadcastAlgo::SingleCopy),
        (1 << 20, BroadcastAlgo::Shm, BroadcastAlgo::SingleCopy),
        (64 << 20, BroadcastAlgo::Shm, BroadcastAlgo::SingleCopy),
    ] {
        assert_eq!(o.broadcast(bytes, 2, shm, CoreEach), algo, "{bytes} bytes");
        assert_eq!(
            intel.broadcast(bytes, 2, shm, CoreEach),
            on_intel,
            "{bytes} bytes, Intel"
        );
    }
    assert_eq!(
        intel.broadcast(64 << 10, 2, shm, Unavailable),
        BroadcastAlgo::Shm
    );
    assert_eq!(
        intel.broadcast(64 << 10, 2, tcp, CoreEach),
        BroadcastAlgo::BinomialTree
    );
    assert_eq!(
        o.all_gather(100, 4, tcp, Unavailable),
        AllGatherAlgo::Direct
    );
    // One copy from the peers' memory where the ranks may read it: 256 KiB to 4 MiB,
    // 32 KiB to 16 MiB on Intel's CPUs.
    for (bytes, algo, on_intel) in [
        ((32 << 10) - 1, AllGatherAlgo::Shm, AllGatherAlgo::Shm),
        (32 << 10, AllGatherAlgo::Shm, AllGatherAlgo::SingleCopy),
        (
            (256 << 10) - 1,
            AllGatherAlgo::Shm,
            AllGatherAlgo::SingleCopy,
        ),
        (
            256 << 10,
            AllGatherAlgo::SingleCopy,
            AllGatherAlgo::SingleCopy,
        ),
        (
            4 << 20,
            AllGatherAlgo::SingleCopy,
            AllGatherAlgo::SingleCopy,
        ),
        ((4 << 20) + 1, AllGatherAlgo::Shm, AllGatherAlgo::SingleCopy),
        (16 << 20, AllGatherAlgo::Shm, AllGatherAlgo::SingleCopy),
        ((16 << 20) + 1, AllGatherAlgo::Shm, AllGatherAlgo::Shm),
    ] {
        assert_eq!(o.all_gather(bytes, 4, shm, CoreEach), algo, "{bytes} bytes");
        assert_eq!(
            intel.all_gather(bytes, 4, shm, CoreEach),
            on_intel,
            "{bytes} bytes, Intel"
        );
    }
    assert_eq!(
        intel.all_gather(1 << 20, 4, shm, Unavailable),
        AllGatherAlgo::Shm
    );
    assert_eq!(
        o.all_gather(1 << 20, 4, shm, Unavailable),
        AllGatherAlgo::Shm
    );
    assert_eq!(o.all_gather(1 << 20, 4, tcp, CoreEach), AllGatherAlgo::Ring);
    // Equal blocks read in one copy where the ranks may (and their addresses fit a flag
    // entry): on Intel's CPUs from 32 KiB per rank.
    for (bytes, world, on_intel) in [
        (Some((32 << 10) - 1), 2, AllToAllAlgo::Shm),
        (Some(32 << 10), 2, AllToAllAlgo::SingleCopy),
        (Some(64 << 20), 7, AllToAllAlgo::SingleCopy),
        (Some(64 << 20), 8, AllToAllAlgo::Shm),
        (None, 2, AllToAllAlgo::Shm),
    ] {
        assert_eq!(o.all_to_all(bytes, world, shm, CoreEach), AllToAllAlgo::Shm);
        let what = format!("{bytes:?} bytes, world {world}, Intel");
        assert_eq!(
            intel.all_to_all(bytes, world, shm, CoreEach),
            on_intel,
            "{what}"
        );
    }
    assert_eq!(
        intel.all_to_all(Some(1 << 20), 2, shm, Unavailable),
        AllToAllAlgo::Shm
    );
    // With more ranks than cores only all_to_all reads straight from the peers, from
    // 256 KiB per rank.
    assert_eq!(
        intel.all_to_all(Some(256 << 10), 4, shm, SharedCores),
        AllToAllAlgo::SingleCopy
    );
    assert_eq!(
        intel.all_to_all(Some((256 << 10) - 1), 4, shm, SharedCores),
        AllToAllAlgo::Shm
    );
    assert_eq!(
        o.all_to_all(Some(1 << 20), 4, shm, SharedCores),
        AllToAllAlgo::Shm
    );
    assert_eq!(
        intel.all_reduce(64 << 20, DType::F32, ReduceOp::Sum, 4, shm, SharedCores),
        AllReduceAlgo::ShmTwoShot
    );
    assert_eq!(
        intel.broadcast(64 << 10, 4, shm, SharedCores),
        BroadcastAlgo::Shm
    );
    assert_eq!(
        intel.all_gather(1 << 20, 4, shm, SharedCores),
        AllGatherAlgo::Shm
    );
    assert_eq!(
        intel.all_to_all(Some(1 << 20), 2, tcp, CoreEach),
        AllToAllAlgo::Pairwise
    );
    assert_eq!(o.reduce(tcp), ReduceAlgo::BinomialTree);
    let forced = AlgoOverrides::parse("allreduce=ring").unwrap();
    assert_eq!(
        forced.all_reduce(8, DType::F32, ReduceOp::Sum, 4, shm, Unavailable),
        AllReduceAlgo::Ring
    );
    let rows = table(&forced, &[2, 4], &[8, 1 << 20], 2);
    assert_eq!(rows.len(), 3 * 2 * 2 * 11);
    assert!(rows
        .iter()
        .all(|r| !r.collective.starts_with("all_reduce") || r.algorithm == "ring"));
    // The shared-memory column: single copy where the world has a core per rank.
    let pick = |rows: &[Choice], coll: &str, world: usize| {
        rows.iter()
            .find(|r| {
                r.collective == coll
                    && r.world == world
                    && r.link == LinkKind::SharedMemory
                    && r.bytes == 1 << 20
            })
            .map(|r| r.algorithm)
    };
    let rows = table(&intel, &[2, 4], &[1 << 20], 2);
    assert_eq!(pick(&rows, "all_gather", 2), Some("shm_single_copy"));
    assert_eq!(pick(&rows, "all_gather", 4), Some("shm"));
    assert_eq!(pick(&rows, "all_to_all", 4), Some("shm_single_copy"));
}

#[test]
fn half_precision_all_reduce_turns_two_shot_sooner() {
    // Reducing f16/bf16 costs more per byte: two-shot halves each rank's share from 16 KiB,
    // where float32 stays one-shot up to 64 KiB (three ranks, or MIN/MAX of two).
    let (o, shm) = (AlgoOverrides::default(), LinkKind::SharedMemory);
    for (op, world) in [(ReduceOp::Sum, 3), (ReduceOp::Max, 2)] {
        for dtype in [DType::F16, DType::BF16] {
            assert_eq!(
                o.all_reduce(8 << 10, dtype, op, world, shm, CoreEach),
                AllReduceAlgo::ShmOneShot
            );
            assert_eq!(
                o.all_reduce(16 << 10, dtype, op, world, shm, CoreEach),
                AllReduceAlgo::ShmTwoShot
            );
        }
        for dtype in [DType::F32, DType::F64, DType::I32] {
            assert_eq!(
                o.all_reduce(64 << 10, dtype, op, world, shm, CoreEach),
                AllReduceAlgo::ShmOneShot
            );
        }
    }
}

#[test]
fn the_table_shows_all_reduce_by_dtype_and_op_where_the_choice_differs() {
    let rows = table(&AlgoOverrides::default(), &[2, 3], &[32 << 10], 3);
    let pick = |coll: &str, world: usize| {
        rows.iter()
            .find(|r| r.collective == coll && r.world == world && r.link == LinkKind::SharedMemory)
            .map(|r| r.algorithm)
    };
    assert_eq!(pick("all_reduce", 3), Some("shm_oneshot"));
    assert_eq!(pick("all_reduce bf16/f16", 3), Some("shm_twoshot"));
    assert_eq!(pick("all_reduce bf16/f16", 2), Some("shm_oneshot"));
    assert_eq!(pick("all_reduce MIN/MAX/bitwise", 3), Some("shm_oneshot"));
    // Intel, two ranks with a core each, 2 MiB: MAX turns single copy a MiB before SUM.
    let intel = AlgoOverrides {
        cpu: HostCpu::Intel,
        ..AlgoOverrides::default()
    };
    let rows = table(&intel, &[2], &[2 << 20], 2);
    let pick = |coll: &str| {
        rows.iter()
            .find(|r| r.collective == coll && r.link == LinkKind::SharedMemory)
            .map(|r| r.algorithm)
    };
    assert_eq!(pick("all_reduce"), Some("shm_twoshot"));
    assert_eq!(pick("all_reduce MIN/MAX/bitwise"), Some("shm_single_copy"));
}

#[test]
fn two_ranks_sum_and_product_stay_one_shot_to_64_kib() {
    // Each reduces the other's data into its own buffer: one-shot copies nothing, in any dtype.
    let (o, shm) = (AlgoOverrides::default(), LinkKind::SharedMemory);
    for op in [ReduceOp::Sum, ReduceOp::Product] {
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::I64] {
            assert_eq!(
                o.all_reduce(64 << 10, dtype, op, 2, shm, CoreEach),
                AllReduceAlgo::ShmOneShot
            );
            assert_eq!(
                o.all_reduce((64 << 10) + 8, dtype, op, 2, shm, CoreEach),
                AllReduceAlgo::ShmTwoShot
            );
        }
    }
}

fn on(latency_us: u64, bandwidth: u64) -> AlgoOverrides {
    AlgoOverrides {
        tcp: LinkModel {
            latency: Duration::from_micros(latency_us),
            bandwidth,
        },
        ..AlgoOverrides::default()
    }
}

#[test]
fn ring_chunks_travel_in_pieces_on_slow_links() {
    let whole = |bytes| RingShape {
        chunk_bytes: bytes,
        piece_bytes: bytes,
    };
    let reference = AlgoOverrides::default();
    assert_eq!(reference.ring_shape(), whole(128 << 10));
    let pieces = |bytes| RingShape {
        chunk_bytes: 16 << 20,
        piece_bytes: bytes,
    };
    let slow = on(40, 125_000_000);
    assert_eq!(slow.ring_shape(), pieces(256 << 10));
    // 3 ms away: a piece holds a bandwidth-delay product.
    assert_eq!(on(3000, 125_000_000).ring_shape(), pieces(375_000));
    assert_eq!(on(4000, 125_000_000).ring_shape(), pieces(500_000));
    // 10 Gbit/s: the hosts limit, as on loopback; 1 ms away a step grows with the
    // bandwidth-delay product (15.6 times the reference's), and at a shorter latency it
    // stays as on the reference.
    assert_eq!(on(40, 1_250_000_000).ring_shape(), whole(128 << 10));
    assert_eq!(on(1000, 1_250_000_000).ring_shape(), whole(2_048_000));
    assert_eq!(on(5, 2_000_000_000).ring_shape(), whole(128 << 10));
}

#[test]
fn large_tcp_broadcasts_go_down_the_chain_where_the_hosts_limit() {
    let (reference, tcp) = (AlgoOverrides::default(), LinkKind::Tcp);
    let on_tcp = |o: &AlgoOverrides, bytes, world| o.broadcast(bytes, world, tcp, Unavailable);
    assert_eq!(
        on_tcp(&reference, (8 << 20) - 1, 4),
        BroadcastAlgo::BinomialTree
    );
    assert_eq!(on_tcp(&reference, 8 << 20, 3), BroadcastAlgo::Chain);
    assert_eq!(on_tcp(&reference, 64 << 20, 4), BroadcastAlgo::Chain);
    assert_eq!(on_tcp(&reference, 64 << 20, 2), BroadcastAlgo::BinomialTree);
    // 10 Gbit/s 1 ms away: from 16 times as many bytes.
    let far = on(1000, 1_250_000_000);
    assert_eq!(on_tcp(&far, 64 << 20, 4), BroadcastAlgo::BinomialTree);
    assert_eq!(on_tcp(&far, 128 << 20, 4), BroadcastAlgo::Chain);
}

#[test]
fn tcp_crossovers_follow_the_bandwidth_delay_product() {
    let tcp = LinkKind::Tcp;
    let reference = AlgoOverrides::default();
    // 1 Gbit/s at loopback latency: a far smaller bandwidth-delay product, so the ring
    // and the chain take over from smaller sizes.
    let slow = on(40, 125_000_000);
    assert_eq!(
        reference.all_reduce(128 << 10, DType::F32, ReduceOp::Sum, 4, tcp, Unavailable),
        AllReduceAlgo::RecursiveDoubling
    );
    assert_eq!(
        slow.all_reduce(128 << 10, DType::F32, ReduceOp::Sum, 4, tcp, Unavailable),
        AllReduceAlgo::Ring
    );
    assert_eq!(
        reference.broadcast(256 << 10, 4, tcp, Unavailable),
        BroadcastAlgo::BinomialTree
    );
    assert_eq!(
        slow.broadcast(256 << 10, 4, tcp, Unavailable),
        BroadcastAlgo::Chain
    );
    assert_eq!(
        reference.all_gather(128 << 10, 4, tcp, Unavailable),
        AllGatherAlgo::Direct
    );
    assert_eq!(
        slow.all_gather(128 << 10, 4, tcp, Unavailable),
        AllGatherAlgo::Ring
    );
    // A 10 Gbit/s link 1 ms away: latency dominates up to far larger sizes.
    let far = on(1000, 1_250_000_000);
    assert_eq!(
        far.all_reduce(2 << 20, DType::F32, ReduceOp::Sum, 4, tcp, Unavailable),
        AllReduceAlgo::RecursiveDoubling
    );
    assert_eq!(
        far.broadcast(4 << 20, 4, tcp, Unavailable),
        BroadcastAlgo::BinomialTree
    );
    assert_eq!(
        slow.broadcast(4 << 20, 2, tcp, Unavailable),
        BroadcastAlgo::BinomialTree
    );
    // A 1 Gbit/s link 1 ms away: the chain from a bandwidth-delay product (125 KB) on.
    let distant = on(1000, 125_000_000);
    assert_eq!(
        distant.broadcast(64 << 10, 8, tcp, Unavailable),
        BroadcastAlgo::BinomialTree
    );
    assert_eq!(
        distant.broadcast(256 << 10, 8, tcp, Unavailable),
        BroadcastAlgo::Chain
    );
    // Leaders between hosts use the same model; shared memory does not read it.
    assert_eq!(
        slow.all_reduce_between_hosts(128 << 10, 4),
        AllReduceAlgo::Ring
    );
    assert_eq!(
        slow.all_reduce(
            8,
            DType::F32,
            ReduceOp::Sum,
            4,
            LinkKind::SharedMemory,
            Unavailable
        ),
        AllReduceAlgo::ShmOneShot
    );
    // Forcing still wins over the model.
    let forced = AlgoOverrides {
        tcp: slow.tcp,
        ..AlgoOverrides::parse("allreduce=recursive_doubling").unwrap()
    };
    assert_eq!(
        forced.all_reduce(64 << 20, DType::F32, ReduceOp::Sum, 4, tcp, Unavailable),
        AllReduceAlgo::RecursiveDoubling
    );
}

#[test]
fn tcp_all_gather_runs_bruck_on_many_ranks_up_to_8_kib_a_block() {
    let (reference, tcp) = (AlgoOverrides::default(), LinkKind::Tcp);
    let pick = |o: &AlgoOverrides, bytes, world| o.all_gather(bytes, world, tcp, Unavailable);
    // Up to 7 ranks as before: the direct exchange, then the ring.
    assert_eq!(pick(&reference, 64, 4), AllGatherAlgo::Direct);
    assert_eq!(pick(&reference, 64, 7), AllGatherAlgo::Direct);
    assert_eq!(pick(&reference, (256 << 10) + 1, 7), AllGatherAlgo::Ring);
    // From 8 ranks, Bruck's up to 8 KiB per rank, then the direct exchange or the ring.
    for (bytes, world, algo) in [
        (0, 8, AllGatherAlgo::Bruck),
        (64 << 10, 8, AllGatherAlgo::Bruck),
        ((64 << 10) + 1, 8, AllGatherAlgo::Direct),
        ((256 << 10) + 1, 8, AllGatherAlgo::Ring),
        (128 << 10, 16, AllGatherAlgo::Bruck),
        ((128 << 10) + 1, 16, AllGatherAlgo::Direct),
        (256 << 10, 32, AllGatherAlgo::Bruck),
        ((256 << 10) + 1, 32, AllGatherAlgo::Ring),
        (512 << 10, 64, AllGatherAlgo::Bruck),
        ((512 << 10) + 1, 64, AllGatherAlgo::Ring),
        (8 << 20, 1024, AllGatherAlgo::Bruck),
    ] {
        assert_eq!(
            pick(&reference, bytes, world),
            algo,
            "{bytes} bytes, {world} ranks"
        );
    }
    // On a 1 Gbit/s link the band shrinks with the bandwidth-delay product (1/16).
    let slow = on(40, 125_000_000);
    assert_eq!(pick(&slow, 4 << 10, 8), AllGatherAlgo::Bruck);
    assert_eq!(pick(&slow, (4 << 10) + 1, 8), AllGatherAlgo::Direct);
    assert_eq!(pick(&slow, (16 << 10) + 1, 8), AllGatherAlgo::Ring);
    // Leaders between hosts follow the same rule; forcing wins everywhere.
    assert_eq!(
        reference.all_gather_between_hosts(1 << 10, 8),
        AllGatherAlgo::Bruck
    );
    assert_eq!(
        reference.all_gather_between_hosts(1 << 10, 4),
        AllGatherAlgo::Direct
    );
    let forced = AlgoOverrides::parse("all_gather=bruck").unwrap();
    assert_eq!(pick(&forced, 64 << 20, 2), AllGatherAlgo::Bruck);
    // The table shows it per world.
    let rows = table(&reference, &[4, 8], &[1 << 10], 2);
    let tcp_pick = |world: usize| {
        rows.iter()
            .find(|r| r.collective == "all_gather" && r.link == tcp && r.world == world)
            .map(|r| r.algorithm)
    };
    assert_eq!(tcp_pick(4), Some("direct"));
    assert_eq!(tcp_pick(8), Some("bruck"));
}

#[test]
fn tcp_all_reduce_keeps_recursive_doubling_to_larger_sizes_on_more_ranks() {
    use super::policy::ring_crossover_growth;
    let o = AlgoOverrides::default();
    let tcp = LinkKind::Tcp;
    assert_eq!(ring_crossover_growth(4), 1.0);
    assert!((ring_crossover_growth(64) - 29.8 / 8.0).abs() < 0.05);
    assert!((ring_crossover_growth(1024) - 254.5 / 8.0).abs() < 0.1);
    // At 4 ranks as before: the ring from past 256 KiB.
    assert_eq!(
        o.all_reduce(1 << 20, DType::F32, ReduceOp::Sum, 4, tcp, Unavailable),
        AllReduceAlgo::Ring
    );
    // Up to 952 KiB at 64 ranks (doubling's 6 steps against the ring's 126), 1.5 MiB at 128;
    // 16 MiB still rings.
    assert_eq!(
        o.all_reduce(900 << 10, DType::F32, ReduceOp::Sum, 64, tcp, Unavailable),
        AllReduceAlgo::RecursiveDoubling
    );
    assert_eq!(
        o.all_reduce(1 << 20, DType::F32, ReduceOp::Sum, 64, tcp, Unavailable),
        AllReduceAlgo::Ring
    );
    assert_eq!(
        o.all_reduce(1 << 20, DType::F32, ReduceOp::Sum, 128, tcp, Unavailable),
        AllReduceAlgo::RecursiveDoubling
    );
    assert_eq!(
        o.all_reduce(16 << 20, DType::F32, ReduceOp::Sum, 64, tcp, Unavailable),
        AllReduceAlgo::Ring
    );
    assert_eq!(
        o.all_reduce(4 << 20, DType::F32, ReduceOp::Sum, 1024, tcp, Unavailable),
        AllReduceAlgo::RecursiveDoubling
    );
}

#[test]
fn tcp_broadcast_keeps_the_tree_to_larger_sizes_on_more_ranks() {
    use super::policy::chain_crossover_growth;
    let (o, tcp) = (AlgoOverrides::default(), LinkKind::Tcp);
    assert_eq!(chain_crossover_growth(4, 4), 1.0);
    assert!((chain_crossover_growth(64, 4) - 12.4 / 2.0).abs() < 0.01);
    assert!((chain_crossover_growth(1024, 8) - (1022.0 / 9.0) / 3.0).abs() < 0.01);
    // 8 MiB goes down the chain at 4 ranks; at 64 the tree keeps it up to 8 MiB x 6.2, and
    // at 1,024 (a chain of 1,023 hops) up to about 454 MiB.
    assert_eq!(
        o.broadcast(8 << 20, 4, tcp, Unavailable),
        BroadcastAlgo::Chain
    );
    assert_eq!(
        o.broadcast(48 << 20, 64, tcp, Unavailable),
        BroadcastAlgo::BinomialTree
    );
    assert_eq!(
        o.broadcast(64 << 20, 64, tcp, Unavailable),
        BroadcastAlgo::Chain
    );
    assert_eq!(
        o.broadcast(256 << 20, 1024, tcp, Unavailable),
        BroadcastAlgo::BinomialTree
    );
    // Slow links: measured at 8 ranks, grown past them.
    let distant = on(1000, 125_000_000);
    assert_eq!(
        distant.broadcast(256 << 10, 8, tcp, Unavailable),
        BroadcastAlgo::Chain
    );
    assert_eq!(
        distant.broadcast(256 << 10, 64, tcp, Unavailable),
        BroadcastAlgo::BinomialTree
    );
}
