//! Recursive-doubling all_reduce: log2(p) pairwise exchanges of the whole buffer, where p is the
//! largest power of two <= n. Latency-optimal for small messages.
//!
//! Non-powers of two: the first 2*(n-p) ranks pair up, each even one folds its data into the
//! odd one above it and sits out, and gets the result back at the end. In every pairwise step
//! both partners compute `lower_rank_value op higher_rank_value`, so the results are bitwise
//! identical even for ops where operand order shows (NaN payloads, signed zeros).

use crate::algorithms::common::segments;
use crate::error::Result;
use crate::reduce::reduce_into;
use crate::transport::{Op, OpCtx, Transport};

/// Default bound on the bytes handled per round (and on the scratch buffer).
pub const DEFAULT_MAX_SEGMENT_BYTES: usize = 4 << 20;

/// All-reduces `buf` in place with `ctx.reduce`, in segments of at most `max_segment_bytes`.
pub fn all_reduce(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    max_segment_bytes: usize,
) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    let es = ctx.sig.dtype.size();
    let mut scratch = Vec::new();
    for seg in segments(buf.len(), es, max_segment_bytes) {
        scratch.resize(seg.len(), 0);
        segment(t, ctx, &mut buf[seg], &mut scratch)?;
    }
    Ok(())
}

fn segment(t: &mut dyn Transport, ctx: &OpCtx, buf: &mut [u8], scratch: &mut [u8]) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let extra = n - p;
    // Virtual rank among the p participants; real rank of virtual rank v.
    let real = |v: usize| if v < extra { 2 * v + 1 } else { v + extra };
    let folded_out = r < 2 * extra && r % 2 == 0;
    if r < 2 * extra {
        let op = if folded_out {
            Op::Send {
                peer: r + 1,
                data: buf,
            }
        } else {
            Op::RecvReduce { peer: r - 1, buf }
        };
        t.exchange(ctx, &mut [op])?;
    }
    if !folded_out {
        let v = if r < 2 * extra { r / 2 } else { r - extra };
        let mut mask = 1;
        while mask < p {
            let peer = real(v ^ mask);
            t.exchange(
                ctx,
                &mut [
                    Op::Send { peer, data: buf },
                    Op::Recv { peer, buf: scratch },
                ],
            )?;
            if r < peer {
                reduce_into(ctx.sig.dtype, ctx.reduce, buf, scratch)?;
            } else {
                reduce_into(ctx.sig.dtype, ctx.reduce, scratch, buf)?;
                buf.copy_from_slice(scratch);
            }
            mask <<= 1;
        }
    }
    if r < 2 * extra {
        let op = if folded_out {
            Op::Recv { peer: r + 1, buf }
        } else {
            Op::Send {
                peer: r - 1,
                data: buf,
            }
        };
        t.exchange(ctx, &mut [op])?;
    }
    Ok(())
}
