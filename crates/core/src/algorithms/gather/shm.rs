//! gather in shared memory: every rank publishes its block piece by piece, the root copies
//! everyone's pieces out. When blocks differ in size (`count` 0: gather_object), a first step
//! carries every rank's length, so the number of steps agrees and the root checks each block.

use crate::algorithms::common::{contribution, publish_data, shared, slot_pieces, wait_all};
use crate::error::{Error, Result};
use crate::transport::workspace::SLOT_BYTES;
use crate::transport::{OpCtx, Peers, Transport};

/// Gathers `input` of every rank into `outputs[r]` on `root` (`outputs` is empty elsewhere).
pub fn gather(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    input: &[u8],
    outputs: &mut [&mut [u8]],
    root: usize,
) -> Result<()> {
    if t.size() == 1 {
        outputs[0].copy_from_slice(input);
        return Ok(());
    }
    let ws = shared(t, ctx)?;
    let (n, me) = (ws.local_size(), ws.local_rank());
    let mut lens = vec![input.len(); n];
    if ctx.sig.count == 0 {
        publish_data(ws, ctx, &(input.len() as u64).to_le_bytes())?;
        wait_all(ws, ctx)?;
        for (p, len) in lens.iter_mut().enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(ws.inline(p, 8));
            *len = u64::from_le_bytes(word) as usize;
        }
    }
    if me == root {
        if let Some(p) = (0..n).find(|&p| lens[p] != outputs[p].len()) {
            return Err(Error::backend(format!(
                "gather mismatch between ranks: rank {} expected {} bytes from rank {} but it \
                 sent {} (collective #{})",
                ws.group_rank(me),
                outputs[p].len(),
                ws.group_rank(p),
                lens[p],
                ctx.seq
            )));
        }
    }
    let longest = lens.iter().copied().max().unwrap_or(0);
    for piece in slot_pieces(longest, 1, SLOT_BYTES) {
        let clip = |len: usize| piece.start.min(len)..piece.end.min(len);
        publish_data(ws, ctx, &input[clip(input.len())])?;
        if me == root {
            ws.wait(ctx, Peers::All)?;
            for (p, out) in outputs.iter_mut().enumerate() {
                let r = clip(lens[p]);
                let len = r.len();
                out[r].copy_from_slice(contribution(ws, p, len));
            }
        }
    }
    Ok(())
}
