//! reduce_scatter in shared memory: every rank publishes its input with block r in region r
//! of its slot (piece by piece when a block is larger than a region), and rank r reduces
//! region r of every rank's slot, in rank order, into its output.

use crate::algorithms::common::{reduce_contributions, region_bytes, shared, wait_all};
use crate::error::Result;
use crate::transport::{OpCtx, Transport};

/// `input` holds n blocks of `out.len()` bytes; `out` receives this rank's block reduced
/// with `ctx.reduce` over all ranks. The input is not modified.
pub fn reduce_scatter(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    input: &[u8],
    out: &mut [u8],
) -> Result<()> {
    let block = out.len();
    if t.size() == 1 {
        out.copy_from_slice(&input[..block]);
        return Ok(());
    }
    let ws = shared(t, ctx)?;
    let (n, me) = (ws.local_size(), ws.local_rank());
    let region = region_bytes(n, ctx.sig.dtype.size());
    let mut at = 0;
    while at < block {
        let len = region.min(block - at);
        let slot = ws.prepare(ctx)?;
        for q in 0..n {
            slot[q * region..q * region + len].copy_from_slice(&input[q * block + at..][..len]);
        }
        ws.publish(&[]);
        wait_all(ws, ctx)?;
        reduce_contributions(ws, ctx, &mut out[at..at + len], Some(me * region))?;
        at += len;
    }
    Ok(())
}
