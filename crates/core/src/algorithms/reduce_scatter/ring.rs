//! Ring reduce_scatter: n-1 steps around the ring over the n blocks of the input, each step
//! sending one partial block right and reducing one arriving from the left. Blocks larger
//! than `max_chunk_bytes` run as consecutive segments (the same slice of every block).

use crate::algorithms::common::{ring_reduce_scatter, segments};
use crate::error::Result;
use crate::transport::{OpCtx, Transport};

/// Default bound on the bytes of one message.
pub const DEFAULT_MAX_CHUNK_BYTES: usize = 1 << 20;

/// `work` holds n blocks of `block_bytes` (clobbered); `out` receives block `rank` reduced
/// over all ranks.
pub fn reduce_scatter(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    work: &mut [u8],
    block_bytes: usize,
    out: &mut [u8],
    max_chunk_bytes: usize,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let es = ctx.sig.dtype.size();
    for seg in segments(block_bytes, es, max_chunk_bytes) {
        let chunks: Vec<_> = (0..n)
            .map(|i| i * block_bytes + seg.start..i * block_bytes + seg.end)
            .collect();
        ring_reduce_scatter(t, ctx, work, &chunks)?;
    }
    out.copy_from_slice(&work[r * block_bytes..(r + 1) * block_bytes]);
    Ok(())
}
