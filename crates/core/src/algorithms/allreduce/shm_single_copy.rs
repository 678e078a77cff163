//! Two-shot all_reduce in one copy (ranks on one host that may read each other's memory, see
//! `transport::cma`): every rank publishes where its buffer lies, reduces its own 1/n slice
//! in place from the same slice of every peer's buffer (read in cache-sized pieces), and once
//! all have, reads the others' reduced slices straight into its buffer; all wait until every
//! rank has read before returning. The slot path first copies the whole buffer into the slot.
//! Half precision from three or more ranks is accumulated in f32 and rounded once.

use std::cell::RefCell;

use crate::algorithms::common::{
    all_read, block_at, parse_block_at, part, publish_empty, segments, single_copy_workspace,
    wait_all, BLOCK_AT_BYTES,
};
use crate::error::Result;
use crate::reduce::{accumulates_in_f32, reduce_in_f32, reduce_into};
use crate::transport::{OpCtx, Peers, Transport};

/// Bytes of a peer's slice read per piece before it is reduced: well inside a core's cache.
const PIECE_BYTES: usize = 256 << 10;

thread_local! {
    /// Where the pieces land, kept between calls (a fresh buffer faults its pages each time).
    static PIECE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// All-reduces `buf` in place with `ctx.reduce` over the ranks of the workspace.
pub fn all_reduce(t: &mut dyn Transport, ctx: &OpCtx, buf: &mut [u8]) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    let ws = single_copy_workspace(t, ctx)?;
    let (n, me) = (ws.local_size(), ws.local_rank());
    let (es, len) = (ctx.sig.dtype.size(), buf.len());
    let slice = |r: usize| {
        let p = part(len / es, n, r);
        p.start * es..p.end * es
    };
    ws.prepare_flag(ctx)?;
    ws.publish(&block_at(buf));
    // Every rank's step carries its signature: a rank that disagrees fails on all of them here.
    ws.wait(ctx, Peers::All)?;
    let addrs: Vec<usize> = (0..n)
        .map(|p| parse_block_at(ws.inline(p, BLOCK_AT_BYTES)).0)
        .collect();
    let mine = slice(me);
    let (dtype, op) = (ctx.sig.dtype, ctx.reduce);
    // Half precision from three or more ranks accumulates in f32: every rank's piece is read
    // (this rank's copied) before the one rounding.
    let wide = accumulates_in_f32(dtype, op, n);
    let max = PIECE_BYTES.min(mine.len());
    PIECE.with_borrow_mut(|scratch| -> Result<()> {
        scratch.resize(if wide { n * max } else { max }, 0);
        for piece in segments(mine.len(), es, PIECE_BYTES) {
            let at = mine.start + piece.start;
            let out = &mut buf[at..at + piece.len()];
            if wide {
                for (p, theirs) in scratch.chunks_mut(max).enumerate() {
                    let theirs = &mut theirs[..out.len()];
                    if p == me {
                        theirs.copy_from_slice(out);
                    } else {
                        ws.read_from(ctx, p, addrs[p] + at, theirs)?;
                    }
                }
                let pieces = &*scratch;
                reduce_in_f32(dtype, op, out, n, |p| {
                    &pieces[p * max..p * max + piece.len()]
                })?;
                continue;
            }
            for p in (0..n).filter(|&p| p != me) {
                let theirs = &mut scratch[..piece.len()];
                ws.read_from(ctx, p, addrs[p] + at, theirs)?;
                reduce_into(ctx.sig.dtype, ctx.reduce, out, theirs)?;
            }
        }
        Ok(())
    })?;
    publish_empty(ws, ctx)?;
    wait_all(ws, ctx)?;
    for p in (0..n).filter(|&p| p != me) {
        let theirs = slice(p);
        let from = addrs[p] + theirs.start;
        ws.read_from(ctx, p, from, &mut buf[theirs])?;
    }
    all_read(ws, ctx)
}
