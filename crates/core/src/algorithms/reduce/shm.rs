//! reduce in shared memory: every rank publishes its data, the root reduces every
//! contribution in rank order into its buffer; the others' buffers are left unchanged.

use crate::algorithms::common::{publish_data, reduce_contributions, shared, slot_pieces};
use crate::error::Result;
use crate::transport::workspace::SLOT_BYTES;
use crate::transport::{OpCtx, Peers, SharedMemory, Transport};

/// Reduces `buf` of every rank (all on this host) into `buf` of rank `root`.
pub fn reduce(t: &mut dyn Transport, ctx: &OpCtx, buf: &mut [u8], root: usize) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    on_host(shared(t, ctx)?, ctx, buf, root)
}

/// Reduce over the ranks of workspace `ws` to local rank `root`.
pub(crate) fn on_host(
    ws: &mut dyn SharedMemory,
    ctx: &OpCtx,
    buf: &mut [u8],
    root: usize,
) -> Result<()> {
    let me = ws.local_rank();
    for piece in slot_pieces(buf.len(), ctx.sig.dtype.size(), SLOT_BYTES) {
        let part = &mut buf[piece];
        publish_data(ws, ctx, part)?;
        if me == root {
            ws.wait(ctx, Peers::All)?;
            reduce_contributions(ws, ctx, part, None)?;
        }
    }
    Ok(())
}
