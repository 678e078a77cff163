//! Two-shot all_reduce in shared memory, for large buffers: per slot-sized piece, every rank
//! publishes the piece, reduces its own 1/n slice of it from every rank's slot (in rank
//! order), publishes that reduced slice, and copies the others' reduced slices. Each rank
//! reduces 1/n of the data instead of all of it; two waits per piece.
//!
//! Two ranks publish only the slice the other reduces, and each reduces into its own buffer
//! (`mine op= theirs`): for SUM and PRODUCT, which are commutative bit for bit (NaN payloads
//! aside), that is the rank-order result, with 40% less copying.

use crate::algorithms::common::{part, reduce_contributions, shared, slot_pieces, wait_all};
use crate::algorithms::params::pair_reduces_into_own;
use crate::error::Result;
use crate::reduce::reduce_into;
use crate::transport::workspace::SLOT_BYTES;
use crate::transport::{OpCtx, Transport};

/// All-reduces `buf` in place with `ctx.reduce` over the ranks of the workspace.
pub fn all_reduce(t: &mut dyn Transport, ctx: &OpCtx, buf: &mut [u8]) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    let ws = shared(t, ctx)?;
    let (n, me) = (ws.local_size(), ws.local_rank());
    let es = ctx.sig.dtype.size();
    for piece in slot_pieces(buf.len(), es, SLOT_BYTES) {
        let chunk = &mut buf[piece];
        let elems = chunk.len() / es;
        let slice = |r: usize| {
            let p = part(elems, n, r);
            p.start * es..p.end * es
        };
        let mine = slice(me);
        if pair_reduces_into_own(n, ctx.reduce) {
            let (peer, theirs) = (1 - me, slice(1 - me));
            ws.prepare(ctx)?[theirs.clone()].copy_from_slice(&chunk[theirs]);
            ws.publish(&[]);
            wait_all(ws, ctx)?;
            let (dtype, op) = (ctx.sig.dtype, ctx.reduce);
            reduce_into(
                dtype,
                op,
                &mut chunk[mine.clone()],
                &ws.slot(peer)[mine.clone()],
            )?;
        } else {
            ws.prepare(ctx)?[..chunk.len()].copy_from_slice(chunk);
            ws.publish(&[]);
            wait_all(ws, ctx)?;
            reduce_contributions(ws, ctx, &mut chunk[mine.clone()], Some(mine.start))?;
        }
        ws.prepare(ctx)?[..mine.len()].copy_from_slice(&chunk[mine.clone()]);
        ws.publish(&[]);
        wait_all(ws, ctx)?;
        for p in (0..n).filter(|&p| p != me) {
            let theirs = slice(p);
            let len = theirs.len();
            chunk[theirs].copy_from_slice(&ws.slot(p)[..len]);
        }
    }
    Ok(())
}
