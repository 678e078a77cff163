//! Ring all_reduce: reduce-scatter then all-gather around the ring, 2(n-1) steps per segment.
//!
//! Bandwidth-optimal: each rank sends and receives 2(n-1)/n of the buffer. Every step is one
//! exchange (send right, reduce from left) so the transport overlaps the two. Buffers larger
//! than n chunks of `max_chunk_bytes` run as consecutive segments, bounding per-step size.
//! Each chunk is reduced on exactly one path and then copied, so all ranks end bitwise equal.

use crate::algorithms::common::{part, ring_all_gather, ring_reduce_scatter};
use crate::error::Result;
use crate::transport::{OpCtx, Transport};

/// All-reduces `buf` in place with `ctx.reduce`; `max_chunk_bytes` bounds one message
/// (`AlgoOverrides::ring_chunk_bytes` gives the policy's bound).
pub fn all_reduce(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    max_chunk_bytes: usize,
) -> Result<()> {
    let n = t.size();
    if n == 1 {
        return Ok(());
    }
    let es = ctx.sig.dtype.size();
    let numel = buf.len() / es;
    let seg_elems = (max_chunk_bytes / es).max(1) * n;
    let mut start = 0;
    while start < numel {
        let len = seg_elems.min(numel - start);
        let chunks: Vec<_> = (0..n)
            .map(|i| {
                let p = part(len, n, i);
                (start + p.start) * es..(start + p.end) * es
            })
            .collect();
        ring_reduce_scatter(t, ctx, buf, &chunks)?;
        ring_all_gather(t, ctx, buf, &chunks)?;
        start += len;
    }
    Ok(())
}
