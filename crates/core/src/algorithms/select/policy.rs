//! The selection policy: for each collective, the algorithm from the bytes it moves, the
//! world size, the link kind, whether the ranks may read each other's memory (a core each or
//! not), the host's CPU kind and the TCP link model, unless `RUSTDIST_ALGO` forced one. Each
//! is a pure function of those (the CPU kind, the link model and the overrides travel in
//! [`AlgoOverrides`]); the sizes it compares against are in `thresholds.rs`.

use super::link_model::LinkModel;
use super::overrides::{
    AlgoOverrides, AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BarrierAlgo, BroadcastAlgo,
    GatherAlgo, ReduceAlgo, ReduceScatterAlgo, ScatterAlgo,
};
use super::thresholds::{
    RING_CHUNK_BYTES, RING_CHUNK_BYTES_SLOW_LINK, RING_PIECE_BYTES_SLOW_LINK,
    SHARED_CORES_SINGLE_COPY_ALL_TO_ALL_MIN_BYTES, SHM_ALL_REDUCE_ONESHOT_MAX_BYTES,
    SHM_ALL_REDUCE_ONESHOT_MAX_BYTES_HALF, SHM_ALL_REDUCE_ONESHOT_MAX_BYTES_PAIR,
    TCP_ALL_GATHER_BRUCK_MAX_BLOCK_BYTES, TCP_ALL_GATHER_BRUCK_MIN_WORLD,
    TCP_ALL_GATHER_DIRECT_MAX_BYTES, TCP_ALL_REDUCE_RD_MAX_BYTES,
    TCP_BROADCAST_CHAIN_HOST_BOUND_MIN_BYTES, TCP_BROADCAST_CHAIN_MIN_BYTES,
};
use crate::algorithms::params::{pair_reduces_into_own, RingShape};
use crate::transport::workspace::SingleCopy;
use crate::transport::LinkKind;
use crate::types::{DType, ReduceOp};

/// How far the recursive doubling / ring crossover of all_reduce moves up from 4 ranks to
/// `world`: the ring's 2(n - 1) steps of latency against doubling's log2 n, with n - 1 over n
/// of the bytes twice against log2 n times, cross where the bytes are (2(n - 1) - log2 n) /
/// (log2 n - 2(n - 1)/n) bandwidth-delay products: 8 at 4 ranks, 12 at 16, 30 at 64, 254 at
/// 1,024 (docs/tuning.md, "all_reduce at large worlds"). 1 up to 4 ranks, where the
/// threshold was measured.
pub(super) fn ring_crossover_growth(world: usize) -> f64 {
    let crossover = |n: f64| (2.0 * (n - 1.0) - n.log2()) / (n.log2() - 2.0 * (n - 1.0) / n);
    if world <= 4 {
        1.0
    } else {
        crossover(world as f64) / crossover(4.0)
    }
}

/// How far the binomial tree / chain crossover of broadcast moves up from `measured` ranks
/// (where the threshold was measured) to `world`: the chain takes n - 2 segment steps more
/// than its S segments, the tree log2 n steps of the whole buffer, so the chain wins once S
/// passes (n - 2) / (log2 n - 1): 2 at 4 ranks, 3 at 8, 12 at 64, 114 at 1,024
/// (docs/tuning.md, "Crossovers as the world grows"). 1 up to `measured` ranks.
pub(super) fn chain_crossover_growth(world: usize, measured: usize) -> f64 {
    let segments = |n: f64| (n - 2.0) / (n.log2() - 1.0);
    if world <= measured {
        1.0
    } else {
        segments(world as f64) / segments(measured as f64)
    }
}

/// The largest shared-memory all_reduce per rank that runs one-shot: lower for f16/bf16, whose
/// reduction costs more per byte, so halving each rank's share pays from fewer bytes; but
/// where two ranks each reduce into their own buffer, whose one-shot copies nothing.
fn shm_all_reduce_oneshot_max_bytes(dtype: DType, op: ReduceOp, world: usize) -> usize {
    if pair_reduces_into_own(world, op) {
        return SHM_ALL_REDUCE_ONESHOT_MAX_BYTES_PAIR;
    }
    match dtype {
        DType::F16 | DType::BF16 => SHM_ALL_REDUCE_ONESHOT_MAX_BYTES_HALF,
        _ => SHM_ALL_REDUCE_ONESHOT_MAX_BYTES,
    }
}

impl AlgoOverrides {
    /// all_reduce of `bytes` per rank of `dtype` with kernel op `op` on `world` ranks;
    /// `single_copy`: whether the ranks on the host may read each other's memory, each with a
    /// core.
    pub fn all_reduce(
        &self,
        bytes: usize,
        dtype: DType,
        op: ReduceOp,
        world: usize,
        link: LinkKind,
        single_copy: SingleCopy,
    ) -> AllReduceAlgo {
        self.all_reduce.unwrap_or(match link {
            LinkKind::SharedMemory
                if bytes <= shm_all_reduce_oneshot_max_bytes(dtype, op, world) =>
            {
                AllReduceAlgo::ShmOneShot
            }
            LinkKind::SharedMemory
                if single_copy == SingleCopy::CoreEach
                    && self
                        .cpu
                        .single_copy_all_reduce_min_bytes(pair_reduces_into_own(world, op))
                        .is_some_and(|min| bytes >= min) =>
            {
                AllReduceAlgo::ShmSingleCopy
            }
            LinkKind::SharedMemory => AllReduceAlgo::ShmTwoShot,
            LinkKind::Hierarchical => AllReduceAlgo::Hierarchical,
            LinkKind::Tcp
                if bytes <= self.tcp.scale(TCP_ALL_REDUCE_RD_MAX_BYTES / 4)
                    || world > 2
                        && bytes as f64
                            <= self.tcp.scale(TCP_ALL_REDUCE_RD_MAX_BYTES) as f64
                                * ring_crossover_growth(world) =>
            {
                AllReduceAlgo::RecursiveDoubling
            }
            LinkKind::Tcp => AllReduceAlgo::Ring,
        })
    }

    /// The algorithm the leaders of a hierarchical all_reduce run among themselves.
    pub fn all_reduce_between_hosts(&self, bytes: usize, hosts: usize) -> AllReduceAlgo {
        self.policy().all_reduce(
            bytes,
            DType::F32,
            ReduceOp::Sum,
            hosts,
            LinkKind::Tcp,
            SingleCopy::Unavailable,
        )
    }

    /// The policy alone: no algorithm forced, the same link model.
    fn policy(&self) -> AlgoOverrides {
        AlgoOverrides {
            tcp: self.tcp,
            cpu: self.cpu,
            ..AlgoOverrides::default()
        }
    }

    /// How the ring all_reduce cuts its buffer.
    pub fn ring_shape(&self) -> RingShape {
        if self.slow_tcp() {
            let piece = (self.tcp.bdp() as usize)
                .clamp(RING_PIECE_BYTES_SLOW_LINK, RING_CHUNK_BYTES_SLOW_LINK);
            return RingShape {
                chunk_bytes: RING_CHUNK_BYTES_SLOW_LINK,
                piece_bytes: piece,
            };
        }
        let chunk = self.ring_chunk_bytes();
        RingShape {
            chunk_bytes: chunk,
            piece_bytes: chunk,
        }
    }

    /// The smallest TCP broadcast on `world` ranks (3 or more) that goes down the chain: the
    /// threshold measured (at 8 ranks on slow links, 4 where the hosts limit), grown with
    /// the world.
    fn tcp_broadcast_chain_min_bytes(&self, world: usize) -> usize {
        let (measured, at) = if self.slow_tcp() {
            (
                TCP_BROADCAST_CHAIN_MIN_BYTES.max(self.tcp.bdp() as usize),
                8,
            )
        } else {
            (self.tcp.scale(TCP_BROADCAST_CHAIN_HOST_BOUND_MIN_BYTES), 4)
        };
        (measured as f64 * chain_crossover_growth(world, at)) as usize
    }

    /// The ring all_reduce's chunk on host-bound TCP links (see `RING_CHUNK_BYTES`).
    fn ring_chunk_bytes(&self) -> usize {
        self.tcp.scale(RING_CHUNK_BYTES).max(RING_CHUNK_BYTES)
    }

    /// Whether the TCP links are slower than half the reference's bandwidth: there the
    /// network limits rather than the hosts.
    pub(super) fn slow_tcp(&self) -> bool {
        self.tcp.bandwidth < LinkModel::SLOW_BANDWIDTH
    }

    /// Broadcast of `bytes` on `world` ranks; `single_copy`: whether the ranks on the host may
    /// read each other's memory, each with a core.
    pub fn broadcast(
        &self,
        bytes: usize,
        world: usize,
        link: LinkKind,
        single_copy: SingleCopy,
    ) -> BroadcastAlgo {
        self.broadcast.unwrap_or(match link {
            LinkKind::SharedMemory
                if single_copy == SingleCopy::CoreEach
                    && self
                        .cpu
                        .single_copy_broadcast_min_bytes()
                        .is_some_and(|min| bytes >= min) =>
            {
                BroadcastAlgo::SingleCopy
            }
            LinkKind::SharedMemory => BroadcastAlgo::Shm,
            LinkKind::Hierarchical => BroadcastAlgo::Hierarchical,
            LinkKind::Tcp if world >= 3 && bytes >= self.tcp_broadcast_chain_min_bytes(world) => {
                BroadcastAlgo::Chain
            }
            LinkKind::Tcp => BroadcastAlgo::BinomialTree,
        })
    }

    /// The algorithm the leaders of a hierarchical broadcast run among themselves.
    pub fn broadcast_between_hosts(&self, bytes: usize, hosts: usize) -> BroadcastAlgo {
        self.policy()
            .broadcast(bytes, hosts, LinkKind::Tcp, SingleCopy::Unavailable)
    }

    /// all_gather of `total_bytes` gathered on every rank of `world`; `single_copy`: whether
    /// the ranks on the host may read each other's memory, each with a core.
    pub fn all_gather(
        &self,
        total_bytes: usize,
        world: usize,
        link: LinkKind,
        single_copy: SingleCopy,
    ) -> AllGatherAlgo {
        self.all_gather.unwrap_or(match link {
            LinkKind::SharedMemory
                if single_copy == SingleCopy::CoreEach
                    && self.cpu.single_copy_bytes().contains(&total_bytes) =>
            {
                AllGatherAlgo::SingleCopy
            }
            LinkKind::SharedMemory => AllGatherAlgo::Shm,
            LinkKind::Hierarchical => AllGatherAlgo::Hierarchical,
            // Few peers per rank where the direct exchange talks to every one and the ring
            // takes n-1 steps; past the band its extra copies cost more than it saves.
            LinkKind::Tcp
                if world >= TCP_ALL_GATHER_BRUCK_MIN_WORLD
                    && total_bytes
                        <= world * self.tcp.scale(TCP_ALL_GATHER_BRUCK_MAX_BLOCK_BYTES) =>
            {
                AllGatherAlgo::Bruck
            }
            LinkKind::Tcp if total_bytes <= self.tcp.scale(TCP_ALL_GATHER_DIRECT_MAX_BYTES) => {
                AllGatherAlgo::Direct
            }
            LinkKind::Tcp => AllGatherAlgo::Ring,
        })
    }

    /// The algorithm the leaders of a hierarchical all_gather run among themselves.
    pub fn all_gather_between_hosts(&self, total_bytes: usize, hosts: usize) -> AllGatherAlgo {
        self.policy()
            .all_gather(total_bytes, hosts, LinkKind::Tcp, SingleCopy::Unavailable)
    }

    pub fn reduce_scatter(&self, link: LinkKind) -> ReduceScatterAlgo {
        self.reduce_scatter.unwrap_or(match link {
            LinkKind::SharedMemory => ReduceScatterAlgo::Shm,
            _ => ReduceScatterAlgo::Ring,
        })
    }

    pub fn reduce(&self, link: LinkKind) -> ReduceAlgo {
        self.reduce.unwrap_or(match link {
            LinkKind::SharedMemory => ReduceAlgo::Shm,
            LinkKind::Hierarchical => ReduceAlgo::Hierarchical,
            LinkKind::Tcp => ReduceAlgo::BinomialTree,
        })
    }

    pub fn gather(&self, link: LinkKind) -> GatherAlgo {
        self.gather.unwrap_or(match link {
            LinkKind::SharedMemory => GatherAlgo::Shm,
            _ => GatherAlgo::Direct,
        })
    }

    pub fn scatter(&self, link: LinkKind) -> ScatterAlgo {
        self.scatter.unwrap_or(match link {
            LinkKind::SharedMemory => ScatterAlgo::Shm,
            _ => ScatterAlgo::Direct,
        })
    }

    /// all_to_all of `even_bytes` per rank in equal blocks (None: uneven splits) on `world`
    /// ranks; `single_copy`: whether the ranks on the host may read each other's memory (a
    /// core each or not).
    pub fn all_to_all(
        &self,
        even_bytes: Option<usize>,
        world: usize,
        link: LinkKind,
        single_copy: SingleCopy,
    ) -> AllToAllAlgo {
        let min = match single_copy {
            SingleCopy::Unavailable => None,
            SingleCopy::SharedCores => self
                .cpu
                .single_copy_all_to_all_min_bytes()
                .map(|min| min.max(SHARED_CORES_SINGLE_COPY_ALL_TO_ALL_MIN_BYTES)),
            SingleCopy::CoreEach => self.cpu.single_copy_all_to_all_min_bytes(),
        };
        let one_copy = |bytes: usize| min.is_some_and(|min| bytes >= min);
        self.all_to_all.unwrap_or(match link {
            LinkKind::SharedMemory
                if world <= crate::algorithms::alltoall::single_copy::MAX_RANKS
                    && even_bytes.is_some_and(one_copy) =>
            {
                AllToAllAlgo::SingleCopy
            }
            LinkKind::SharedMemory => AllToAllAlgo::Shm,
            _ => AllToAllAlgo::Pairwise,
        })
    }

    pub fn barrier(&self, link: LinkKind) -> BarrierAlgo {
        self.barrier.unwrap_or(match link {
            LinkKind::SharedMemory => BarrierAlgo::Shm,
            LinkKind::Hierarchical => BarrierAlgo::Hierarchical,
            LinkKind::Tcp => BarrierAlgo::Dissemination,
        })
    }
}
