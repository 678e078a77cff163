//! Binomial-tree reduce: in round k, a rank whose virtual rank (relative to the root) has bit
//! k set sends its partial result to the rank 2^k below and drops out; the receiver reduces it
//! into its own. log2(n) rounds, each rank sends at most once.

use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// Reduces `buf` of every rank into `buf` of rank `root` with `ctx.reduce`. `buf` is
/// clobbered on the other ranks (the caller passes a copy there).
pub fn reduce(t: &mut dyn Transport, ctx: &OpCtx, buf: &mut [u8], root: usize) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let v = (r + n - root) % n;
    let real = |v: usize| (v + root) % n;
    let mut mask = 1;
    while mask < n {
        if v & mask != 0 {
            let peer = real(v - mask);
            return t.exchange(ctx, &mut [Op::Send { peer, data: buf }]);
        }
        if v + mask < n {
            let peer = real(v + mask);
            t.exchange(ctx, &mut [Op::RecvReduce { peer, buf }])?;
        }
        mask <<= 1;
    }
    Ok(())
}
