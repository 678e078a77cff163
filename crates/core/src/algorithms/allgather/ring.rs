//! Ring all_gather: n-1 steps, each forwarding to the right the block received from the left
//! in the previous step. Blocks may differ in length (all ranks pass the same lengths).

use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// Fills every `blocks[i]` (i != rank) with rank i's block; `blocks[rank]` is this rank's.
pub fn all_gather(t: &mut dyn Transport, ctx: &OpCtx, blocks: &mut [&mut [u8]]) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    for s in 0..n - 1 {
        let (data, buf) = pair(blocks, (r + n - s) % n, (r + 2 * n - 1 - s) % n);
        t.exchange(
            ctx,
            &mut [Op::Send { peer: right, data }, Op::Recv { peer: left, buf }],
        )?;
    }
    Ok(())
}

/// Borrows block `send` shared and block `recv` (a different one) mutably.
fn pair<'a>(blocks: &'a mut [&mut [u8]], send: usize, recv: usize) -> (&'a [u8], &'a mut [u8]) {
    if send < recv {
        let (lo, hi) = blocks.split_at_mut(recv);
        (&*lo[send], &mut *hi[0])
    } else {
        let (lo, hi) = blocks.split_at_mut(send);
        (&*hi[0], &mut *lo[recv])
    }
}
