//! Bruck all_gather: ceil(log2 n) steps for any n, so each rank talks to log2 n peers where
//! the direct exchange talks to n-1. Each rank stages the blocks it holds in one buffer, its
//! own first, then ranks rank+1, rank+2, ... (mod n); at step k it sends the first 2^k of
//! them (fewer at the last step) to rank - 2^k and appends as many from rank + 2^k. A final
//! rotation copies the staged blocks into rank order. Same bytes on the wire as the ring,
//! plus one local copy of the gathered bytes: for latency-bound sizes. Blocks may differ
//! in length (all ranks pass the same lengths).

use crate::algorithms::common::send_recv_pair;
use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// Fills every `blocks[i]` (i != rank) with rank i's block; `blocks[rank]` is this rank's.
pub fn all_gather(t: &mut dyn Transport, ctx: &OpCtx, blocks: &mut [&mut [u8]]) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    if n == 1 {
        return Ok(());
    }
    // at[i]: where the i-th staged block (rank (r + i) % n's) starts; at[n]: the total.
    let mut at = Vec::with_capacity(n + 1);
    at.push(0);
    for i in 0..n {
        at.push(at[i] + blocks[(r + i) % n].len());
    }
    let mut staged = vec![0u8; at[n]];
    staged[..at[1]].copy_from_slice(blocks[r]);
    // `held` doubles each step until the last, so it is also the distance to the peers.
    let mut held = 1;
    while held < n {
        let count = held.min(n - held);
        let (data, buf) = send_recv_pair(&mut staged, 0..at[count], at[held]..at[held + count]);
        t.exchange(
            ctx,
            &mut [
                Op::Send {
                    peer: (r + n - held) % n,
                    data,
                },
                Op::Recv {
                    peer: (r + held) % n,
                    buf,
                },
            ],
        )?;
        held += count;
    }
    for i in 1..n {
        blocks[(r + i) % n].copy_from_slice(&staged[at[i]..at[i + 1]]);
    }
    Ok(())
}
