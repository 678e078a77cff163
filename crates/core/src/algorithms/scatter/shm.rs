//! scatter in shared memory: the root publishes block r in region r of its slot (piece by
//! piece when a block is larger than a region), every rank copies its region out. When blocks
//! differ in size (`count` 0: scatter_object_list), a first step carries the root's lengths,
//! so the number of steps agrees and every rank checks its block.

use crate::algorithms::common::{publish_empty, region_bytes, shared};
use crate::error::{Error, Result};
use crate::transport::{OpCtx, Peers, Transport};

/// Sends `inputs[r]` (on `root`; empty elsewhere) to rank r's `output`.
pub fn scatter(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    inputs: &[&[u8]],
    output: &mut [u8],
    root: usize,
) -> Result<()> {
    if t.size() == 1 {
        output.copy_from_slice(inputs[0]);
        return Ok(());
    }
    let ws = shared(t, ctx)?;
    let (n, me) = (ws.local_size(), ws.local_rank());
    let region = region_bytes(n, 1);
    let mut longest = output.len();
    if ctx.sig.count == 0 {
        if me == root {
            let slot = ws.prepare(ctx)?;
            for (q, input) in inputs.iter().enumerate() {
                slot[q * 8..q * 8 + 8].copy_from_slice(&(input.len() as u64).to_le_bytes());
            }
            ws.publish(&[]);
        } else {
            publish_empty(ws, ctx)?;
            ws.wait(ctx, Peers::Only(&[root]))?;
        }
        let table = ws.slot(root);
        let len_of = |q: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&table[q * 8..q * 8 + 8]);
            u64::from_le_bytes(word) as usize
        };
        if len_of(me) != output.len() {
            return Err(Error::backend(format!(
                "scatter mismatch between ranks: rank {} expected {} bytes from rank {} but it \
                 sends {} (collective #{})",
                ws.group_rank(me),
                output.len(),
                ws.group_rank(root),
                len_of(me),
                ctx.seq
            )));
        }
        longest = (0..n).map(len_of).max().unwrap_or(0);
    }
    let mut at = 0;
    while at < longest {
        let clip = |len: usize| region.min(len.saturating_sub(at));
        if me == root {
            let slot = ws.prepare(ctx)?;
            for (q, input) in inputs.iter().enumerate() {
                let len = clip(input.len());
                slot[q * region..q * region + len].copy_from_slice(&input[at..at + len]);
            }
            ws.publish(&[]);
            let len = clip(output.len());
            output[at..at + len].copy_from_slice(&inputs[me][at..at + len]);
        } else {
            publish_empty(ws, ctx)?;
            ws.wait(ctx, Peers::Only(&[root]))?;
            let len = clip(output.len());
            output[at..at + len].copy_from_slice(&ws.slot(root)[me * region..][..len]);
        }
        at += region;
    }
    Ok(())
}
