//! Broadcast in one copy (ranks on one host that may read each other's memory, see
//! `transport::cma`): every rank publishes where its buffer lies; with the buffer cut in one
//! segment per rank, each other rank reads every segment but its own straight from the root's
//! buffer while the root writes each rank its own segment, so the root's core copies as much
//! as each reader's instead of idling. All wait until every rank is done before returning (the
//! root's buffer must stay put until then). A reader that fails after publishing where its
//! buffer lies withdraws it and returns only once the root no longer writes there. The slot
//! path copies every byte twice, the readers' copy starting only once the root's piece is in
//! the slot.

use crate::algorithms::common::{all_read, block_at, block_of_len, part, single_copy_workspace};
use crate::error::Result;
use crate::transport::{OpCtx, Peers, SharedMemory, Transport};

/// Copies `buf` of rank `root` into `buf` of every other rank (all on this host).
pub fn broadcast(t: &mut dyn Transport, ctx: &OpCtx, buf: &mut [u8], root: usize) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    let ws = single_copy_workspace(t, ctx)?;
    let me = ws.local_rank();
    let at = block_at(buf);
    ws.prepare_flag(ctx)?;
    ws.publish(&at);
    let done = copy(ws, ctx, buf, root, &at);
    if done.is_err() && me != root {
        // The root may be writing into `buf`, which the caller may free on return.
        ws.withdraw(ctx, root);
    }
    done
}

/// The steps after this rank published where `buf` lies (`at`).
fn copy(
    ws: &mut dyn SharedMemory,
    ctx: &OpCtx,
    buf: &mut [u8],
    root: usize,
    at: &[u8],
) -> Result<()> {
    let (n, me) = (ws.local_size(), ws.local_rank());
    // Every rank waits for all and checks every length: each sees every rank's step, so
    // ranks that disagree (another length) fail on all of them before anything is copied.
    ws.wait(ctx, Peers::All)?;
    let mut addrs = Vec::with_capacity(n);
    for p in 0..n {
        let theirs = if p == me { at } else { ws.inline(p, at.len()) };
        addrs.push(block_of_len(ws, ctx, p, theirs, buf.len())?);
    }
    if me == root {
        ws.begin_writes(ctx);
        let wrote = (0..n).filter(|&p| p != root).try_for_each(|p| {
            let seg = part(buf.len(), n, p);
            ws.write_to(ctx, p, addrs[p] + seg.start, &buf[seg])
        });
        ws.end_writes(ctx);
        wrote?;
    } else {
        for s in (0..n).filter(|&s| s != me) {
            let seg = part(buf.len(), n, s);
            ws.read_from(ctx, root, addrs[root] + seg.start, &mut buf[seg])?;
        }
    }
    all_read(ws, ctx)
}
