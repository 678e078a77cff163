//! Direct all_gather for small messages: one exchange in which every rank sends its block to
//! every peer and receives every peer's block. Same bytes as the ring, one step of latency.

use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// Fills every `blocks[i]` (i != rank) with rank i's block; `blocks[rank]` is this rank's.
pub fn all_gather(t: &mut dyn Transport, ctx: &OpCtx, blocks: &mut [&mut [u8]]) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let (before, rest) = blocks.split_at_mut(r);
    let Some((mine, after)) = rest.split_first_mut() else {
        return Ok(());
    };
    let mine: &[u8] = mine;
    let mut ops: Vec<Op<'_>> = (0..n)
        .filter(|&p| p != r)
        .map(|peer| Op::Send { peer, data: mine })
        .collect();
    let recvs = before
        .iter_mut()
        .enumerate()
        .chain(after.iter_mut().enumerate().map(|(i, b)| (r + 1 + i, b)));
    ops.extend(recvs.map(|(peer, buf)| Op::Recv { peer, buf }));
    t.exchange(ctx, &mut ops)
}
