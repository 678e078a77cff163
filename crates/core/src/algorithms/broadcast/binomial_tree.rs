//! Binomial-tree broadcast from any root: ceil(log2 n) rounds, each rank receives once from its
//! parent and then sends to all its children in one exchange.

use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// Broadcasts `buf` from `root` to every rank.
pub fn broadcast(t: &mut dyn Transport, ctx: &OpCtx, buf: &mut [u8], root: usize) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    // Ranks relative to the root, so the tree is rooted at virtual rank 0.
    let v = (r + n - root) % n;
    let real = |v: usize| (v + root) % n;
    let mut mask = 1;
    while mask < n {
        if v & mask != 0 {
            t.exchange(
                ctx,
                &mut [Op::Recv {
                    peer: real(v - mask),
                    buf: &mut *buf,
                }],
            )?;
            break;
        }
        mask <<= 1;
    }
    let mut ops = Vec::new();
    mask >>= 1;
    while mask > 0 {
        if v + mask < n {
            ops.push(Op::Send {
                peer: real(v + mask),
                data: &*buf,
            });
        }
        mask >>= 1;
    }
    if !ops.is_empty() {
        t.exchange(ctx, &mut ops)?;
    }
    Ok(())
}
