//! all_to_all as one exchange: every rank posts its sends and receives to every other rank at
//! once (the transport moves them concurrently), and copies its own block.

use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// An own block at least this large is copied on a helper thread, alongside the exchange.
const OVERLAP_COPY_BYTES: usize = 4 << 20;

/// Sends `sends[q]` to rank q and receives rank q's block for this rank into `recvs[q]`;
/// block sizes may differ (each message's length is checked).
pub fn all_to_all(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    sends: &[&[u8]],
    recvs: &mut [&mut [u8]],
) -> Result<()> {
    let me = t.rank();
    let (before, rest) = recvs.split_at_mut(me);
    let Some((own, after)) = rest.split_first_mut() else {
        return Ok(());
    };
    let mut ops: Vec<Op<'_>> = sends
        .iter()
        .enumerate()
        .filter(|(p, _)| *p != me)
        .map(|(peer, data)| Op::Send { peer, data })
        .collect();
    let others = before.iter_mut().enumerate().chain(
        after
            .iter_mut()
            .enumerate()
            .map(|(i, buf)| (me + 1 + i, buf)),
    );
    ops.extend(others.map(|(peer, buf)| Op::Recv { peer, buf }));
    if own.len() < OVERLAP_COPY_BYTES {
        own.copy_from_slice(sends[me]);
        return t.exchange(ctx, &mut ops);
    }
    // A large own block is copied on a helper thread while this one moves the network's
    // bytes, as gloo's receive thread overlaps them; one after the other, the copy adds its
    // whole time to the exchange's.
    std::thread::scope(|s| {
        s.spawn(|| own.copy_from_slice(sends[me]));
        t.exchange(ctx, &mut ops)
    })
}
