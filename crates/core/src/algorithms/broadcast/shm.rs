//! Broadcast in shared memory: the root publishes each slot-sized piece (in the flag
//! entry when it fits), the others wait for it and copy it out. The root may run one piece
//! ahead of the slowest reader, so large broadcasts overlap writing and reading.

use crate::algorithms::common::{contribution, publish_data, publish_empty, shared, slot_pieces};
use crate::error::Result;
use crate::transport::workspace::SLOT_BYTES;
use crate::transport::{OpCtx, Peers, SharedMemory, Transport};

/// Copies `buf` of rank `root` into `buf` of every other rank (all on this host).
pub fn broadcast(t: &mut dyn Transport, ctx: &OpCtx, buf: &mut [u8], root: usize) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    on_host(shared(t, ctx)?, ctx, buf, root)
}

/// Broadcast over the ranks of workspace `ws` from local rank `root`.
pub(crate) fn on_host(
    ws: &mut dyn SharedMemory,
    ctx: &OpCtx,
    buf: &mut [u8],
    root: usize,
) -> Result<()> {
    let me = ws.local_rank();
    for piece in slot_pieces(buf.len(), 1, SLOT_BYTES) {
        let part = &mut buf[piece];
        if me == root {
            publish_data(ws, ctx, part)?;
        } else {
            publish_empty(ws, ctx)?;
            ws.wait(ctx, Peers::Only(&[root]))?;
            part.copy_from_slice(contribution(ws, root, part.len()));
        }
    }
    Ok(())
}
