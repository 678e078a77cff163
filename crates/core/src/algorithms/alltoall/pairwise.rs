//! all_to_all as one exchange: every rank posts its sends and receives to every other rank at
//! once (the transport moves them concurrently), and copies its own block.

use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// Sends `sends[q]` to rank q and receives rank q's block for this rank into `recvs[q]`;
/// block sizes may differ (each message's length is checked).
pub fn all_to_all(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    sends: &[&[u8]],
    recvs: &mut [&mut [u8]],
) -> Result<()> {
    let me = t.rank();
    recvs[me].copy_from_slice(sends[me]);
    let mut ops: Vec<Op<'_>> = sends
        .iter()
        .enumerate()
        .filter(|(p, _)| *p != me)
        .map(|(peer, data)| Op::Send { peer, data })
        .collect();
    ops.extend(
        recvs
            .iter_mut()
            .enumerate()
            .filter(|(p, _)| *p != me)
            .map(|(peer, buf)| Op::Recv { peer, buf }),
    );
    t.exchange(ctx, &mut ops)
}
