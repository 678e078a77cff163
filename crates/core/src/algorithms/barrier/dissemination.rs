//! Dissemination barrier: in round k every rank signals rank + 2^k and waits for rank - 2^k,
//! ceil(log2 n) rounds of zero-byte messages. No rank leaves before all have arrived.

use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

pub fn barrier(t: &mut dyn Transport, ctx: &OpCtx) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let mut d = 1;
    while d < n {
        t.exchange(
            ctx,
            &mut [
                Op::Send {
                    peer: (r + d) % n,
                    data: &[],
                },
                Op::Recv {
                    peer: (r + n - d) % n,
                    buf: &mut [],
                },
            ],
        )?;
        d <<= 1;
    }
    Ok(())
}
