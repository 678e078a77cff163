//! Collective algorithms, one file per algorithm (`<collective>/<algorithm>.rs`), written
//! against [`Transport`] (messages between ranks) and, for the `shm` ones, the shared-memory
//! workspace the transport offers when ranks share a host.
//!
//! The dispatchers below are what the process group calls: they validate the buffers, ask
//! [`select`] which algorithm to run, and run it with the parameters of that choice
//! ([`params`]). Every algorithm is correct for any world size, any length (including 0 and
//! fewer elements than ranks), and leaves all ranks with bitwise identical results.

pub(crate) mod common;
pub mod params;
pub mod select;

pub mod allreduce {
    pub mod hierarchical;
    pub mod recursive_doubling;
    pub mod ring;
    pub mod shm_oneshot;
    pub mod shm_single_copy;
    pub mod shm_twoshot;
}
pub mod broadcast {
    pub mod binomial_tree;
    pub mod chain;
    pub mod hierarchical;
    pub mod shm;
    pub mod single_copy;
}
pub mod allgather {
    pub mod bruck;
    pub mod direct;
    pub mod hierarchical;
    pub mod ring;
    pub mod shm;
    pub mod single_copy;
}
pub mod reduce_scatter {
    pub mod ring;
    pub mod shm;
}
pub mod reduce {
    pub mod binomial_tree;
    pub mod hierarchical;
    pub mod shm;
}
pub mod gather {
    pub mod direct;
    pub mod shm;
}
pub mod scatter {
    pub mod direct;
    pub mod shm;
}
pub mod alltoall {
    pub mod pairwise;
    pub mod shm;
    pub mod single_copy;
}
pub mod barrier {
    pub mod dissemination;
    pub mod hierarchical;
    pub mod shm;
}
pub mod monitored_barrier {
    pub mod linear;
}

use params::{LeadersAllGather, LeadersAllReduce, LeadersBroadcast};
pub use select::{streams_per_peer, AlgoOverrides, HostCpu, LinkModel, Measured};
use select::{
    AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BarrierAlgo, BroadcastAlgo, GatherAlgo, ReduceAlgo,
    ReduceScatterAlgo, ScatterAlgo,
};

use crate::error::{Error, Result};
use crate::reduce as kernels;
use crate::transport::{OpCtx, Transport};

fn check_whole_elements(ctx: &OpCtx, what: &str, len: usize) -> Result<()> {
    let es = ctx.sig.dtype.size();
    if !len.is_multiple_of(es) {
        return Err(Error::invalid(format!(
            "{}: {what} of {len} bytes is not a whole number of {} elements",
            ctx.sig.kind.name(),
            ctx.sig.dtype.name()
        )));
    }
    Ok(())
}

fn check_root(t: &dyn Transport, ctx: &OpCtx, root: usize) -> Result<()> {
    if root >= t.size() {
        return Err(Error::invalid(format!(
            "{}: root {root} is not a rank of a group of size {}",
            ctx.sig.kind.name(),
            t.size()
        )));
    }
    Ok(())
}

fn check_blocks(t: &dyn Transport, ctx: &OpCtx, what: &str, blocks: usize) -> Result<()> {
    if blocks != t.size() {
        return Err(Error::invalid(format!(
            "{}: {blocks} {what} for a group of size {}",
            ctx.sig.kind.name(),
            t.size()
        )));
    }
    Ok(())
}

/// Reduces `buf` elementwise with `ctx.reduce` across all ranks; every rank ends with the result.
pub fn all_reduce(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    algos: &AlgoOverrides,
) -> Result<()> {
    kernels::check_supported(ctx.sig.dtype, ctx.reduce)?;
    check_whole_elements(ctx, "buffer", buf.len())?;
    let single_copy = common::single_copy_available(t);
    match algos
        .all_reduce(
            buf.len(),
            ctx.sig.dtype,
            ctx.reduce,
            t.size(),
            t.link_kind(),
            single_copy,
        )
        .noted()
    {
        AllReduceAlgo::Ring => {
            let shape = algos.ring_shape();
            allreduce::ring::all_reduce(t, ctx, buf, shape)
        }
        AllReduceAlgo::RecursiveDoubling => allreduce::recursive_doubling::all_reduce(
            t,
            ctx,
            buf,
            allreduce::recursive_doubling::DEFAULT_MAX_SEGMENT_BYTES,
        ),
        AllReduceAlgo::ShmOneShot => allreduce::shm_oneshot::all_reduce(t, ctx, buf),
        AllReduceAlgo::ShmTwoShot => allreduce::shm_twoshot::all_reduce(t, ctx, buf),
        AllReduceAlgo::ShmSingleCopy => allreduce::shm_single_copy::all_reduce(t, ctx, buf),
        AllReduceAlgo::Hierarchical => {
            let hosts = common::host_count(t.host_of());
            let between = match algos.all_reduce_between_hosts(buf.len(), hosts) {
                AllReduceAlgo::RecursiveDoubling => LeadersAllReduce::RecursiveDoubling,
                _ => LeadersAllReduce::Ring(algos.ring_shape()),
            };
            allreduce::hierarchical::all_reduce(t, ctx, buf, between)
        }
    }
}

/// Reduces `buf` of every rank into `buf` of rank `root` with `ctx.reduce`. `buf` may be
/// clobbered on the other ranks: the caller passes a copy there.
pub fn reduce(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    root: usize,
    algos: &AlgoOverrides,
) -> Result<()> {
    kernels::check_supported(ctx.sig.dtype, ctx.reduce)?;
    check_whole_elements(ctx, "buffer", buf.len())?;
    check_root(t, ctx, root)?;
    match algos.reduce(t.link_kind()).noted() {
        ReduceAlgo::BinomialTree => reduce::binomial_tree::reduce(t, ctx, buf, root),
        ReduceAlgo::Shm => reduce::shm::reduce(t, ctx, buf, root),
        ReduceAlgo::Hierarchical => reduce::hierarchical::reduce(t, ctx, buf, root),
    }
}

/// Copies `buf` of rank `root` into `buf` of every other rank.
pub fn broadcast(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    root: usize,
    algos: &AlgoOverrides,
) -> Result<()> {
    check_root(t, ctx, root)?;
    let single_copy = common::single_copy_available(t);
    match algos
        .broadcast(buf.len(), t.size(), t.link_kind(), single_copy)
        .noted()
    {
        BroadcastAlgo::BinomialTree => broadcast::binomial_tree::broadcast(t, ctx, buf, root),
        BroadcastAlgo::Chain => broadcast::chain::broadcast(
            t,
            ctx,
            buf,
            root,
            broadcast::chain::segment_bytes(buf.len()),
        ),
        BroadcastAlgo::Shm => broadcast::shm::broadcast(t, ctx, buf, root),
        BroadcastAlgo::SingleCopy => broadcast::single_copy::broadcast(t, ctx, buf, root),
        BroadcastAlgo::Hierarchical => {
            let hosts = common::host_count(t.host_of());
            let between = match algos.broadcast_between_hosts(buf.len(), hosts) {
                BroadcastAlgo::Chain => LeadersBroadcast::Chain,
                _ => LeadersBroadcast::BinomialTree,
            };
            broadcast::hierarchical::broadcast(t, ctx, buf, root, between)
        }
    }
}

/// `blocks[rank]` holds this rank's data; fills `blocks[i]` with rank i's. Blocks may differ
/// in size between ranks; all ranks pass the same sizes.
pub fn all_gather(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    blocks: &mut [&mut [u8]],
    algos: &AlgoOverrides,
) -> Result<()> {
    all_gather_from(t, ctx, None, blocks, algos)
}

/// [`all_gather`] of `input` (sharing no byte with any block), which `blocks[rank]` receives
/// too; `None`: `blocks[rank]` holds this rank's data already. In shared memory the input is
/// copied into `blocks[rank]` piece by piece from the slot it was published in (still in
/// cache), else first.
pub fn all_gather_from(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    input: Option<&[u8]>,
    blocks: &mut [&mut [u8]],
    algos: &AlgoOverrides,
) -> Result<()> {
    check_blocks(t, ctx, "output blocks", blocks.len())?;
    let own = t.rank();
    if let Some(src) = input.filter(|src| src.len() != blocks[own].len()) {
        return Err(Error::invalid(format!(
            "all_gather: an input of {} bytes for an output block of {}",
            src.len(),
            blocks[own].len()
        )));
    }
    let total: usize = blocks.iter().map(|b| b.len()).sum();
    let single_copy = common::single_copy_available(t);
    let algo = algos
        .all_gather(total, t.size(), t.link_kind(), single_copy)
        .noted();
    let takes_input = matches!(algo, AllGatherAlgo::Shm | AllGatherAlgo::SingleCopy);
    if let (Some(src), false) = (input, takes_input) {
        blocks[own].copy_from_slice(src);
    }
    match algo {
        AllGatherAlgo::Ring => allgather::ring::all_gather(t, ctx, blocks),
        AllGatherAlgo::Direct => allgather::direct::all_gather(t, ctx, blocks),
        AllGatherAlgo::Bruck => allgather::bruck::all_gather(t, ctx, blocks),
        AllGatherAlgo::Shm => allgather::shm::all_gather_from(t, ctx, input, blocks),
        AllGatherAlgo::SingleCopy => allgather::single_copy::all_gather_from(t, ctx, input, blocks),
        AllGatherAlgo::Hierarchical => {
            let hosts = common::host_count(t.host_of());
            let between = match algos.all_gather_between_hosts(total, hosts) {
                AllGatherAlgo::Bruck => LeadersAllGather::Bruck,
                AllGatherAlgo::Ring => LeadersAllGather::Ring,
                _ => LeadersAllGather::Direct,
            };
            allgather::hierarchical::all_gather(t, ctx, blocks, between)
        }
    }
}

/// `input` holds n blocks of `out.len()` bytes (unmodified); `out` receives block `rank`
/// reduced with `ctx.reduce` over all ranks.
pub fn reduce_scatter(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    input: &[u8],
    out: &mut [u8],
    algos: &AlgoOverrides,
) -> Result<()> {
    kernels::check_supported(ctx.sig.dtype, ctx.reduce)?;
    let block = out.len();
    check_whole_elements(ctx, "block", block)?;
    if Some(input.len()) != block.checked_mul(t.size()) {
        return Err(Error::invalid(format!(
            "reduce_scatter: expected an input of {} blocks of {block} bytes, got {} bytes",
            t.size(),
            input.len(),
        )));
    }
    match algos.reduce_scatter(t.link_kind()).noted() {
        ReduceScatterAlgo::Ring => reduce_scatter::ring::reduce_scatter(
            t,
            ctx,
            &mut input.to_vec(),
            block,
            out,
            reduce_scatter::ring::DEFAULT_MAX_CHUNK_BYTES,
        ),
        ReduceScatterAlgo::Shm => reduce_scatter::shm::reduce_scatter(t, ctx, input, out),
    }
}

/// Gathers `input` of every rank into `outputs[r]` on `root` (`outputs` is empty on the
/// others); all blocks have `input`'s size.
pub fn gather(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    input: &[u8],
    outputs: &mut [&mut [u8]],
    root: usize,
    algos: &AlgoOverrides,
) -> Result<()> {
    check_root(t, ctx, root)?;
    if t.rank() == root {
        check_blocks(t, ctx, "output blocks", outputs.len())?;
    }
    match algos.gather(t.link_kind()).noted() {
        GatherAlgo::Direct => gather::direct::gather(t, ctx, input, outputs, root),
        GatherAlgo::Shm => gather::shm::gather(t, ctx, input, outputs, root),
    }
}

/// Sends `inputs[r]` (on `root`; empty on the others) to rank r's `output`; all blocks have
/// `output`'s size.
pub fn scatter(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    inputs: &[&[u8]],
    output: &mut [u8],
    root: usize,
    algos: &AlgoOverrides,
) -> Result<()> {
    check_root(t, ctx, root)?;
    if t.rank() == root {
        check_blocks(t, ctx, "input blocks", inputs.len())?;
    }
    match algos.scatter(t.link_kind()).noted() {
        ScatterAlgo::Direct => scatter::direct::scatter(t, ctx, inputs, output, root),
        ScatterAlgo::Shm => scatter::shm::scatter(t, ctx, inputs, output, root),
    }
}

/// Sends `sends[q]` to rank q and receives rank q's block for this rank into `recvs[q]`;
/// block sizes may differ between pairs.
pub fn all_to_all(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    sends: &[&[u8]],
    recvs: &mut [&mut [u8]],
    algos: &AlgoOverrides,
) -> Result<()> {
    check_blocks(t, ctx, "input blocks", sends.len())?;
    check_blocks(t, ctx, "output blocks", recvs.len())?;
    let me = t.rank();
    if sends[me].len() != recvs[me].len() {
        return Err(Error::invalid(format!(
            "all_to_all: the block this rank sends to itself ({} bytes) does not fit the block \
             it receives from itself ({} bytes)",
            sends[me].len(),
            recvs[me].len()
        )));
    }
    let even_bytes = (ctx.sig.count > 0).then(|| sends.iter().map(|s| s.len()).sum());
    let single_copy = common::single_copy_available(t);
    match algos
        .all_to_all(even_bytes, t.size(), t.link_kind(), single_copy)
        .noted()
    {
        AllToAllAlgo::Pairwise => alltoall::pairwise::all_to_all(t, ctx, sends, recvs),
        AllToAllAlgo::Shm => alltoall::shm::all_to_all(t, ctx, sends, recvs),
        AllToAllAlgo::SingleCopy => alltoall::single_copy::all_to_all(t, ctx, sends, recvs),
    }
}

/// Returns once every rank has entered the barrier.
pub fn barrier(t: &mut dyn Transport, ctx: &OpCtx, algos: &AlgoOverrides) -> Result<()> {
    match algos.barrier(t.link_kind()).noted() {
        BarrierAlgo::Dissemination => barrier::dissemination::barrier(t, ctx),
        BarrierAlgo::Shm => barrier::shm::barrier(t, ctx),
        BarrierAlgo::Hierarchical => barrier::hierarchical::barrier(t, ctx),
    }
}
