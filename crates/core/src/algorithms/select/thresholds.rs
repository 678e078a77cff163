//! The sizes selection compares against: one table for TCP (measured on the reference link,
//! scaled by [`LinkModel::scale`](super::LinkModel) to other links), one for shared memory,
//! and one per CPU kind for the single-copy bands. Each constant names the measurement it
//! comes from; the figures are in `docs/tuning.md`, one section per decision.

use std::ops::RangeInclusive;

// TCP: loopback on the 2-core Intel Xeon VM (`LinkModel::REFERENCE`), unless said otherwise.

/// all_reduce up to this many bytes runs recursive doubling, above it the ring; a quarter of
/// it on 2 ranks. benches/allreduce.rs over loopback (tuning.md, "TCP all_reduce").
pub(super) const TCP_ALL_REDUCE_RD_MAX_BYTES: usize = 256 << 10;
/// Ring all_reduce step on host-bound links (scaled with the bandwidth-delay product). A/B
/// against gloo over loopback, Intel Xeon VM (tuning.md, "Ring all_reduce chunks").
pub(super) const RING_CHUNK_BYTES: usize = 128 << 10;
/// Ring all_reduce chunk on slow links, where chunks travel in pieces. 1 Gbit/s links, 8
/// ranks (tuning.md, "Ring all_reduce on slow links").
pub(super) const RING_CHUNK_BYTES_SLOW_LINK: usize = 16 << 20;
/// Smallest ring piece on slow links (and at least one bandwidth-delay product). 1 Gbit/s
/// links, 8 ranks, 0-1 ms away (tuning.md, "Ring all_reduce on slow links").
pub(super) const RING_PIECE_BYTES_SLOW_LINK: usize = 256 << 10;
/// Broadcast goes down the chain from here (and one bandwidth-delay product, 3 ranks or
/// more) on slow links. 1 Gbit/s links 1 ms away (tuning.md, "TCP broadcast, slow links").
pub(super) const TCP_BROADCAST_CHAIN_MIN_BYTES: usize = 64 << 10;
/// Broadcast goes down the chain from here (3 ranks or more) where the hosts limit. Against
/// gloo over loopback, Intel Xeon VM (tuning.md, "TCP broadcast, host-bound links").
pub(super) const TCP_BROADCAST_CHAIN_HOST_BOUND_MIN_BYTES: usize = 8 << 20;
/// all_gather up to this many bytes in total runs the direct exchange, above it the ring.
/// Loopback (tuning.md, "TCP all_gather").
pub(super) const TCP_ALL_GATHER_DIRECT_MAX_BYTES: usize = 256 << 10;
/// all_gather on this many ranks or more runs Bruck's (log2 n steps) while the gathered bytes
/// are at most `TCP_ALL_GATHER_BRUCK_MAX_BLOCK_BYTES` per rank. Loopback, 4-64 ranks as
/// threads (tuning.md, "all_gather at large worlds: Bruck").
pub(super) const TCP_ALL_GATHER_BRUCK_MIN_WORLD: usize = 8;
/// See `TCP_ALL_GATHER_BRUCK_MIN_WORLD`.
pub(super) const TCP_ALL_GATHER_BRUCK_MAX_BLOCK_BYTES: usize = 8 << 10;

// Shared memory, every CPU kind.

/// all_reduce up to this many bytes per rank runs one-shot, above it two-shot (tuning.md,
/// "Shared-memory all_reduce").
pub(super) const SHM_ALL_REDUCE_ONESHOT_MAX_BYTES: usize = 64 << 10;
/// The same for f16 and bf16: two-shot from 16 KiB (Intel Xeon VM, world 2, with the AVX-512
/// kernels; tuning.md, "Shared-memory all_reduce").
pub(super) const SHM_ALL_REDUCE_ONESHOT_MAX_BYTES_HALF: usize = 8 << 10;
/// The same for two ranks' SUM and PRODUCT, every dtype: each rank reduces the other's data
/// into its own buffer (`params::pair_reduces_into_own`), and one-shot is ahead up to 64 KiB
/// (Intel Xeon VM, world 2; tuning.md, "Shared-memory all_reduce").
pub(super) const SHM_ALL_REDUCE_ONESHOT_MAX_BYTES_PAIR: usize = 64 << 10;
/// With more ranks than cores, single-copy all_to_all starts at this many bytes per rank at
/// the least. 4 ranks on 2 cores, Intel Xeon VM (tuning.md, "More ranks than cores").
pub(super) const SHARED_CORES_SINGLE_COPY_ALL_TO_ALL_MIN_BYTES: usize = 256 << 10;

/// Where the single-copy algorithms (one copy by the kernel from or to a peer's memory
/// instead of two through the slots) run, for one CPU kind, with every rank on a core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SingleCopyBands {
    /// all_reduce from this many bytes (None: never).
    pub all_reduce_min_bytes: Option<usize>,
    /// The same for two ranks' SUM and PRODUCT, whose two-shot copies less
    /// (`params::pair_reduces_into_own`).
    pub all_reduce_pair_min_bytes: Option<usize>,
    /// all_to_all of equal blocks from this many bytes per rank (None: never).
    pub all_to_all_min_bytes: Option<usize>,
    /// broadcast from this many bytes (None: never).
    pub broadcast_min_bytes: Option<usize>,
    /// all_gather of this many bytes (gathered).
    pub all_gather_bytes: RangeInclusive<usize>,
}

/// Intel CPUs. A/Bs of one build at world 2 on the 2-core Intel Xeon VM (tuning.md, the
/// "Single-copy" sections).
pub(super) const INTEL: SingleCopyBands = SingleCopyBands {
    all_reduce_min_bytes: Some(2 << 20),
    all_reduce_pair_min_bytes: Some(3 << 20),
    all_to_all_min_bytes: Some(32 << 10),
    broadcast_min_bytes: Some(16 << 10),
    all_gather_bytes: (32 << 10)..=(16 << 20),
};

/// Every other CPU. all_gather, all_to_all and broadcast from A/Bs at world 2 on the 2-core
/// AMD EPYC VM, all_reduce unmeasured (tuning.md, the "Single-copy" sections).
pub(super) const OTHER: SingleCopyBands = SingleCopyBands {
    all_reduce_min_bytes: None,
    all_reduce_pair_min_bytes: None,
    all_to_all_min_bytes: None,
    broadcast_min_bytes: None,
    all_gather_bytes: (256 << 10)..=(4 << 20),
};
