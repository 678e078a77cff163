//! all_to_all of equal blocks in one copy (ranks on one host that may read each other's
//! memory, see `transport::cma`): every rank publishes in its flag entry where each of its
//! blocks lies, reads its own block from every peer straight into its output, and all wait
//! until every rank has read before returning. The slot path copies every byte twice.

use crate::algorithms::common::{
    all_read, block_at, read_block, single_copy_workspace, BLOCK_AT_BYTES,
};
use crate::error::{Error, Result};
use crate::transport::workspace::INLINE_BYTES;
use crate::transport::{OpCtx, Peers, Transport};

/// The most ranks whose block addresses fit in one flag entry.
pub const MAX_RANKS: usize = INLINE_BYTES / BLOCK_AT_BYTES;

/// Sends `sends[q]` to rank q and receives rank q's block for this rank into `recvs[q]`; every
/// block holds `ctx.sig.count` elements (the signature, checked on every rank, makes the
/// lengths agree).
pub fn all_to_all(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    sends: &[&[u8]],
    recvs: &mut [&mut [u8]],
) -> Result<()> {
    let (n, me) = (t.size(), t.rank());
    let block = ctx.sig.count as usize * ctx.sig.dtype.size();
    if let Some(q) = (0..n).find(|&q| sends[q].len() != block || recvs[q].len() != block) {
        return Err(Error::invalid(format!(
            "all_to_all: the single-copy algorithm takes blocks of {block} bytes, but this \
             rank's blocks for rank {q} have {} and {} bytes",
            sends[q].len(),
            recvs[q].len()
        )));
    }
    if n == 1 {
        recvs[me].copy_from_slice(sends[me]);
        return Ok(());
    }
    if n > MAX_RANKS {
        return Err(Error::Runtime(format!(
            "all_to_all: the single-copy algorithm takes at most {MAX_RANKS} ranks, not {n} \
             (check RUSTDIST_ALGO)"
        )));
    }
    let ws = single_copy_workspace(t, ctx)?;
    let mut entry = [0u8; INLINE_BYTES];
    for (q, s) in sends.iter().enumerate() {
        entry[q * BLOCK_AT_BYTES..(q + 1) * BLOCK_AT_BYTES].copy_from_slice(&block_at(s));
    }
    ws.prepare_flag(ctx)?;
    ws.publish(&entry[..n * BLOCK_AT_BYTES]);
    // While the peers read, this rank copies its own block.
    recvs[me].copy_from_slice(sends[me]);
    ws.wait(ctx, Peers::All)?;
    for (p, r) in recvs.iter_mut().enumerate().filter(|&(p, _)| p != me) {
        let entry = ws.inline(p, n * BLOCK_AT_BYTES);
        let at = &entry[me * BLOCK_AT_BYTES..(me + 1) * BLOCK_AT_BYTES];
        read_block(ws, ctx, p, at, r)?;
    }
    all_read(ws, ctx)
}
