//! The blocks of an exchange (gather, scatter, all_to_all, all_gather of blocks of different
//! sizes) by peer, and the views an all_gather moves: mutable slices of raw buffers, and an
//! input that may be (part of) an output.

use crate::algorithms::{self, AlgoOverrides};
use crate::error::Result;
use crate::tensor::{any_overlap, RawBuf};
use crate::transport::{OpCtx, Transport};

/// Mutable slices of `bufs`.
///
/// # Safety
/// As for [`RawBuf::as_mut_slice`], for every buffer, and no two of them overlap.
pub(super) unsafe fn mut_slices<'a>(bufs: &[RawBuf]) -> Vec<&'a mut [u8]> {
    // SAFETY: forwarded to the caller.
    bufs.iter().map(|b| unsafe { b.as_mut_slice() }).collect()
}

/// all_gather of `input` into `outputs` by rank, `outputs[rank]` included. An input apart
/// from every output goes to the algorithm, which copies it into the own block when it suits
/// it (shared memory: from cache); one that is (part of) an output, as all_gather_into_tensor
/// in place, is copied into the own block first.
///
/// # Safety
/// Every view is alive and touched by nothing else until the call returns, no slice of any
/// exists, and the outputs are distinct from each other; `outputs[rank]` is as long as `input`.
pub(super) unsafe fn all_gather_views(
    tr: &mut dyn Transport,
    ctx: &OpCtx,
    input: RawBuf,
    outputs: &[RawBuf],
    rank: usize,
    algos: &AlgoOverrides,
) -> Result<()> {
    let apart = !any_overlap(&[input], outputs);
    if !apart {
        // SAFETY: guaranteed by the caller; ptr::copy allows the views to overlap.
        unsafe { std::ptr::copy(input.as_mut_ptr(), outputs[rank].as_mut_ptr(), input.len()) };
    }
    // SAFETY: guaranteed by the caller.
    let mut blocks = unsafe { mut_slices(outputs) };
    // SAFETY: guaranteed by the caller, and the input shares no byte with the outputs.
    let src = apart.then(|| unsafe { input.as_slice() });
    algorithms::all_gather_from(tr, ctx, src, &mut blocks, algos)
}

/// The blocks of a gather, scatter, all_to_all or all_gather of blocks of different sizes,
/// by peer: `sends[q]` goes to rank q, `recvs[q]` comes from rank q.
pub struct Blocks {
    pub sends: Vec<(usize, RawBuf)>,
    pub recvs: Vec<(usize, RawBuf)>,
}
