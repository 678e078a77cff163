//! One-shot all_reduce in shared memory: every rank publishes its data (in the flag's cache
//! line when it fits, else in its slot) and reduces every contribution, in rank order, into
//! its own buffer. One wait per slot-sized piece; all ranks compute the same bits (but NaN
//! payloads of two ranks' SUM and PRODUCT, where each reduces the other's into its own).

use crate::algorithms::common::{
    publish_data, reduce_contributions, shared, slot_pieces, wait_all,
};
use crate::error::Result;
use crate::transport::workspace::SLOT_BYTES;
use crate::transport::{OpCtx, SharedMemory, Transport};

/// All-reduces `buf` in place with `ctx.reduce` over the group's ranks, all on this host.
pub fn all_reduce(t: &mut dyn Transport, ctx: &OpCtx, buf: &mut [u8]) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    on_host(shared(t, ctx)?, ctx, buf)
}

/// All-reduces `buf` over the ranks of workspace `ws`.
pub(crate) fn on_host(ws: &mut dyn SharedMemory, ctx: &OpCtx, buf: &mut [u8]) -> Result<()> {
    for piece in slot_pieces(buf.len(), ctx.sig.dtype.size(), SLOT_BYTES) {
        let part = &mut buf[piece];
        publish_data(ws, ctx, part)?;
        wait_all(ws, ctx)?;
        reduce_contributions(ws, ctx, part, None)?;
    }
    Ok(())
}
