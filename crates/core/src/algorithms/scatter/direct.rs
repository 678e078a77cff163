//! Direct scatter: the root sends every rank its block at once.

use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// Sends `inputs[r]` (on `root`; empty elsewhere) to rank r's `output`.
pub fn scatter(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    inputs: &[&[u8]],
    output: &mut [u8],
    root: usize,
) -> Result<()> {
    let me = t.rank();
    if me != root {
        return t.exchange(
            ctx,
            &mut [Op::Recv {
                peer: root,
                buf: output,
            }],
        );
    }
    output.copy_from_slice(inputs[me]);
    let mut ops: Vec<Op<'_>> = inputs
        .iter()
        .enumerate()
        .filter(|(p, _)| *p != me)
        .map(|(peer, data)| Op::Send { peer, data })
        .collect();
    t.exchange(ctx, &mut ops)
}
