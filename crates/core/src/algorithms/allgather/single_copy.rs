//! all_gather in one copy (ranks on one host that may read each other's memory, see
//! `transport::cma`): every rank publishes where its input lies, then reads each peer's input
//! straight into its output block, and all wait until every rank has read before returning
//! (the inputs must stay put until then). The slot path copies every byte twice.

use crate::algorithms::allgather::shm::alone;
use crate::algorithms::common::{all_read, block_at, read_block, single_copy_workspace};
use crate::error::Result;
use crate::transport::{OpCtx, Peers, SharedMemory, Transport};

/// [`all_gather_from`](crate::algorithms::all_gather_from) with the blocks read straight from
/// the peers' inputs.
pub fn all_gather_from(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    input: Option<&[u8]>,
    blocks: &mut [&mut [u8]],
) -> Result<()> {
    if alone(t, input, blocks) {
        return Ok(());
    }
    on_host(single_copy_workspace(t, ctx)?, ctx, input, blocks)
}

/// all_gather over the ranks of workspace `ws` (which may read each other's memory): `blocks`
/// by local rank, this rank's data in `input` or else in its own block.
pub(crate) fn on_host(
    ws: &mut dyn SharedMemory,
    ctx: &OpCtx,
    input: Option<&[u8]>,
    blocks: &mut [&mut [u8]],
) -> Result<()> {
    let (n, me) = (ws.local_size(), ws.local_rank());
    let at = block_at(input.unwrap_or(&*blocks[me]));
    ws.prepare_flag(ctx)?;
    ws.publish(&at);
    // While the peers read it, this rank copies its own input.
    if let Some(src) = input {
        blocks[me].copy_from_slice(src);
    }
    ws.wait(ctx, Peers::All)?;
    for p in (0..n).filter(|&p| p != me) {
        let at = ws.inline(p, at.len());
        read_block(ws, ctx, p, at, blocks[p])?;
    }
    all_read(ws, ctx)
}
