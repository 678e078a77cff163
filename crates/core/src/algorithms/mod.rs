//! Collective algorithms, one file per algorithm, all written against `transport::Transport`.
//!
//! The dispatchers below are what the process group calls: they validate the buffers, ask
//! [`select`] which algorithm to run, and run it. Every algorithm is correct for any world
//! size, any length (including 0 and fewer elements than ranks), and leaves all ranks with
//! bitwise identical results.

mod common;
pub mod select;

pub mod allreduce {
    pub mod recursive_doubling;
    pub mod ring;
}
pub mod broadcast {
    pub mod binomial_tree;
    pub mod chain;
}
pub mod allgather {
    pub mod direct;
    pub mod ring;
}
pub mod reduce_scatter {
    pub mod ring;
}
pub mod barrier {
    pub mod dissemination;
}

pub use select::AlgoOverrides;
use select::{AllGatherAlgo, AllReduceAlgo, BarrierAlgo, BroadcastAlgo, ReduceScatterAlgo};

use crate::error::{Error, Result};
use crate::reduce;
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

/// Reduces `buf` elementwise with `ctx.reduce` across all ranks; every rank ends with the result.
pub fn all_reduce(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    algos: &AlgoOverrides,
) -> Result<()> {
    reduce::check_supported(ctx.sig.dtype, ctx.reduce)?;
    check_whole_elements(ctx, "buffer", buf.len())?;
    match algos.all_reduce(buf.len(), t.size()) {
        AllReduceAlgo::Ring => {
            allreduce::ring::all_reduce(t, ctx, buf, allreduce::ring::DEFAULT_MAX_CHUNK_BYTES)
        }
        AllReduceAlgo::RecursiveDoubling => allreduce::recursive_doubling::all_reduce(
            t,
            ctx,
            buf,
            allreduce::recursive_doubling::DEFAULT_MAX_SEGMENT_BYTES,
        ),
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
    if root >= t.size() {
        return Err(Error::invalid(format!(
            "broadcast: root {root} is not a rank of a group of size {}",
            t.size()
        )));
    }
    match algos.broadcast(buf.len(), t.size()) {
        BroadcastAlgo::BinomialTree => broadcast::binomial_tree::broadcast(t, ctx, buf, root),
        BroadcastAlgo::Chain => {
            broadcast::chain::broadcast(t, ctx, buf, root, broadcast::chain::DEFAULT_SEGMENT_BYTES)
        }
    }
}

/// `blocks[rank]` holds this rank's data; fills `blocks[i]` with rank i's. All ranks pass the
/// same block lengths.
pub fn all_gather(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    blocks: &mut [&mut [u8]],
    algos: &AlgoOverrides,
) -> Result<()> {
    if blocks.len() != t.size() {
        return Err(Error::invalid(format!(
            "all_gather: {} output blocks for a group of size {}",
            blocks.len(),
            t.size()
        )));
    }
    let total: usize = blocks.iter().map(|b| b.len()).sum();
    match algos.all_gather(total) {
        AllGatherAlgo::Ring => allgather::ring::all_gather(t, ctx, blocks),
        AllGatherAlgo::Direct => allgather::direct::all_gather(t, ctx, blocks),
    }
}

/// `work` holds n blocks of `block_bytes` (this rank's input; clobbered); `out` receives block
/// `rank` reduced with `ctx.reduce` over all ranks.
pub fn reduce_scatter(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    work: &mut [u8],
    block_bytes: usize,
    out: &mut [u8],
    algos: &AlgoOverrides,
) -> Result<()> {
    reduce::check_supported(ctx.sig.dtype, ctx.reduce)?;
    check_whole_elements(ctx, "block", block_bytes)?;
    if Some(work.len()) != block_bytes.checked_mul(t.size()) || out.len() != block_bytes {
        return Err(Error::invalid(format!(
            "reduce_scatter: expected an input of {} blocks of {block_bytes} bytes and an output \
             of {block_bytes} bytes, got {} and {}",
            t.size(),
            work.len(),
            out.len()
        )));
    }
    match algos.reduce_scatter() {
        ReduceScatterAlgo::Ring => reduce_scatter::ring::reduce_scatter(
            t,
            ctx,
            work,
            block_bytes,
            out,
            reduce_scatter::ring::DEFAULT_MAX_CHUNK_BYTES,
        ),
    }
}

/// Returns once every rank has entered the barrier.
pub fn barrier(t: &mut dyn Transport, ctx: &OpCtx, algos: &AlgoOverrides) -> Result<()> {
    match algos.barrier() {
        BarrierAlgo::Dissemination => barrier::dissemination::barrier(t, ctx),
    }
}
