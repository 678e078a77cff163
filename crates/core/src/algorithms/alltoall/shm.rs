//! all_to_all in shared memory: every rank publishes its block for rank q in region q of its
//! slot (piece by piece when a block is larger than a region) and copies region `rank` of
//! everyone's slot. Blocks may differ in size (uneven splits): then a first step tells
//! every rank what each sends to whom, so the number of steps agrees and a rank that
//! expects another size fails naming both.

use crate::algorithms::common::{contribution, publish_data, region_bytes, shared, wait_all};
use crate::error::{Error, Result};
use crate::transport::workspace::INLINE_BYTES;
use crate::transport::{OpCtx, SharedMemory, Transport};

/// Sends `sends[q]` to rank q and receives rank q's block for this rank into `recvs[q]`.
pub fn all_to_all(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    sends: &[&[u8]],
    recvs: &mut [&mut [u8]],
) -> Result<()> {
    let me = t.rank();
    recvs[me].copy_from_slice(sends[me]);
    if t.size() == 1 {
        return Ok(());
    }
    let ws = shared(t, ctx)?;
    let n = ws.local_size();
    let block = ctx.sig.count as usize * ctx.sig.dtype.size();
    if ctx.sig.count > 0 && n * block <= INLINE_BYTES {
        return inline(ws, ctx, sends, recvs, block);
    }
    let region = region_bytes(n, 1);
    let longest = if ctx.sig.count > 0 {
        recvs.iter().map(|r| r.len()).max().unwrap_or(0)
    } else {
        // Uneven: every rank publishes the lengths it sends; the longest block of all sets
        // the number of steps.
        let slot = ws.prepare(ctx)?;
        for (q, s) in sends.iter().enumerate() {
            slot[q * 8..q * 8 + 8].copy_from_slice(&(s.len() as u64).to_le_bytes());
        }
        ws.publish(&[]);
        wait_all(ws, ctx)?;
        let mut longest = 0;
        for (p, expected) in recvs.iter().enumerate() {
            let table = ws.slot(p);
            let len_to = |q: usize| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&table[q * 8..q * 8 + 8]);
                u64::from_le_bytes(w) as usize
            };
            if len_to(me) != expected.len() {
                return Err(Error::backend(format!(
                    "all_to_all mismatch between ranks: rank {} expected {} bytes from rank {} \
                     but it sends {} (collective #{})",
                    ws.group_rank(me),
                    expected.len(),
                    ws.group_rank(p),
                    len_to(me),
                    ctx.seq
                )));
            }
            longest = (0..n).map(len_to).fold(longest, usize::max);
        }
        longest
    };
    let mut at = 0;
    while at < longest {
        let slot = ws.prepare(ctx)?;
        for (q, s) in sends.iter().enumerate() {
            let len = region.min(s.len().saturating_sub(at));
            slot[q * region..q * region + len].copy_from_slice(&s[at.min(s.len())..][..len]);
        }
        ws.publish(&[]);
        wait_all(ws, ctx)?;
        for (p, r) in recvs.iter_mut().enumerate() {
            let len = region.min(r.len().saturating_sub(at));
            if p != me && len > 0 {
                r[at..at + len].copy_from_slice(&ws.slot(p)[me * region..][..len]);
            }
        }
        at += region;
    }
    Ok(())
}

/// Blocks of `block` bytes that all fit in one flag entry: each rank publishes them there in
/// one step, and every rank reads its own from each peer's entry (no slot lines to fetch).
fn inline(
    ws: &mut dyn SharedMemory,
    ctx: &OpCtx,
    sends: &[&[u8]],
    recvs: &mut [&mut [u8]],
    block: usize,
) -> Result<()> {
    let (n, me) = (ws.local_size(), ws.local_rank());
    if let Some(q) = (0..n).find(|&q| sends[q].len() != block || recvs[q].len() != block) {
        return Err(Error::invalid(format!(
            "all_to_all: blocks of {block} bytes agreed, but this rank's blocks for rank {} \
             have {} and {} bytes",
            ws.group_rank(q),
            sends[q].len(),
            recvs[q].len()
        )));
    }
    let mut entry = [0u8; INLINE_BYTES];
    for (q, s) in sends.iter().enumerate() {
        entry[q * block..(q + 1) * block].copy_from_slice(s);
    }
    publish_data(ws, ctx, &entry[..n * block])?;
    wait_all(ws, ctx)?;
    for (p, r) in recvs.iter_mut().enumerate().filter(|&(p, _)| p != me) {
        r.copy_from_slice(&contribution(ws, p, n * block)[me * block..(me + 1) * block]);
    }
    Ok(())
}
