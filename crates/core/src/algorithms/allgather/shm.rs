//! all_gather in shared memory: every rank publishes its block (piece by piece when larger
//! than a slot; in the flag entry when small) and copies everyone else's. Blocks may
//! differ in size between ranks; each step also carries the sender's block length, so a rank
//! that expects another size from it fails naming both instead of reading garbage.

use crate::algorithms::common::shared;
use crate::error::{Error, Result};
use crate::transport::workspace::{INLINE_BYTES, SLOT_BYTES};
use crate::transport::{OpCtx, Peers, SharedMemory, Transport};

/// Bytes of a block carried inline (after its 8-byte length).
const INLINE_DATA: usize = INLINE_BYTES - 8;

/// `blocks[rank]` holds this rank's data; fills `blocks[r]` with rank r's (all on this
/// host).
pub fn all_gather(t: &mut dyn Transport, ctx: &OpCtx, blocks: &mut [&mut [u8]]) -> Result<()> {
    all_gather_from(t, ctx, None, blocks)
}

/// [`all_gather`] of `input` (as long as `blocks[rank]`, sharing no byte with any block),
/// which `blocks[rank]` receives piece by piece from the slot it was published in; `None`:
/// `blocks[rank]` holds this rank's data already.
pub fn all_gather_from(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    input: Option<&[u8]>,
    blocks: &mut [&mut [u8]],
) -> Result<()> {
    if alone(t, input, blocks) {
        return Ok(());
    }
    on_host(shared(t, ctx)?, ctx, input, blocks)
}

/// At world 1, copies `input` (if any) into the only block and says so.
pub(crate) fn alone(t: &dyn Transport, input: Option<&[u8]>, blocks: &mut [&mut [u8]]) -> bool {
    if t.size() != 1 {
        return false;
    }
    if let Some(src) = input {
        blocks[0].copy_from_slice(src);
    }
    true
}

/// all_gather over the ranks of workspace `ws`: `blocks` by local rank, this rank's data in
/// `input` or else in its own block.
pub(crate) fn on_host(
    ws: &mut dyn SharedMemory,
    ctx: &OpCtx,
    input: Option<&[u8]>,
    blocks: &mut [&mut [u8]],
) -> Result<()> {
    let (n, me) = (ws.local_size(), ws.local_rank());
    let lens: Vec<usize> = blocks.iter().map(|b| b.len()).collect();
    let longest = lens.iter().copied().max().unwrap_or(0);
    let inline = longest <= INLINE_DATA;
    let step = if inline { INLINE_DATA } else { SLOT_BYTES };
    let rounds = longest.div_ceil(step).max(1);
    for round in 0..rounds {
        let at = round * step;
        let piece = |len: usize| at.min(len)..(at + step).min(len);
        let mine = piece(lens[me]);
        let own = match input {
            Some(src) => &src[mine.clone()],
            None => &blocks[me][mine.clone()],
        };
        let mut head = [0u8; INLINE_BYTES];
        head[..8].copy_from_slice(&(lens[me] as u64).to_le_bytes());
        if inline {
            head[8..8 + own.len()].copy_from_slice(own);
            ws.prepare_flag(ctx)?;
        } else {
            ws.prepare_data(ctx, own.len())?.copy_from_slice(own);
        }
        ws.publish(&head[..if inline { 8 + own.len() } else { 8 }]);
        // While the peers copy this piece, this rank copies it too: from its slot (in cache).
        if let Some(src) = input {
            let len = mine.len();
            let from = if inline {
                &src[mine.clone()]
            } else {
                ws.data(me, len)
            };
            blocks[me][mine].copy_from_slice(from);
        }
        ws.wait(ctx, Peers::All)?;
        for p in (0..n).filter(|&p| p != me) {
            let got = ws.inline(p, 8);
            let sent = u64::from_le_bytes(got.try_into().unwrap_or_default()) as usize;
            if sent != lens[p] {
                return Err(Error::backend(format!(
                    "all_gather mismatch between ranks: rank {} expected {} bytes from rank {} \
                     but it sent {sent} (collective #{})",
                    ws.group_rank(me),
                    lens[p],
                    ws.group_rank(p),
                    ctx.seq
                )));
            }
            let r = piece(lens[p]);
            let len = r.len();
            let src = if inline {
                &ws.inline(p, 8 + len)[8..]
            } else {
                ws.data(p, len)
            };
            blocks[p][r].copy_from_slice(src);
        }
    }
    Ok(())
}
