//! Direct gather: every rank sends its block to the root, which receives them all at once.

use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// Gathers `input` of every rank into `outputs[r]` on `root` (`outputs` is empty elsewhere).
pub fn gather(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    input: &[u8],
    outputs: &mut [&mut [u8]],
    root: usize,
) -> Result<()> {
    let me = t.rank();
    if me != root {
        return t.exchange(
            ctx,
            &mut [Op::Send {
                peer: root,
                data: input,
            }],
        );
    }
    outputs[me].copy_from_slice(input);
    let mut ops: Vec<Op<'_>> = outputs
        .iter_mut()
        .enumerate()
        .filter(|(p, _)| *p != me)
        .map(|(peer, buf)| Op::Recv { peer, buf })
        .collect();
    t.exchange(ctx, &mut ops)
}
