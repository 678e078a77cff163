//! Broadcast in one copy (ranks on one host that may read each other's memory, see
//! `transport::cma`): the root publishes where its buffer lies, every other rank reads it
//! straight into its own, and all wait until every rank has read before returning (the root's
//! buffer must stay put until then). The slot path copies every byte twice, the readers'
//! copy starting only once the root's piece is in the slot.

use crate::algorithms::common::{all_read, block_at, read_block, single_copy_workspace};
use crate::error::Result;
use crate::transport::{OpCtx, Peers, Transport};

/// Copies `buf` of rank `root` into `buf` of every other rank (all on this host).
pub fn broadcast(t: &mut dyn Transport, ctx: &OpCtx, buf: &mut [u8], root: usize) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    let ws = single_copy_workspace(t, ctx)?;
    let at = block_at(buf);
    ws.prepare_flag(ctx)?;
    ws.publish(&at);
    // Every rank waits for all: each sees every rank's step, so a rank that disagrees (another
    // length) fails on all of them before any reads, where the root would otherwise wait in
    // vain for a reader that left.
    ws.wait(ctx, Peers::All)?;
    if ws.local_rank() != root {
        let at = ws.inline(root, at.len());
        read_block(ws, ctx, root, at, buf)?;
    }
    all_read(ws, ctx)
}
