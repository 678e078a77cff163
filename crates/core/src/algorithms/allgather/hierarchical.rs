//! Hierarchical all_gather for groups spread over hosts with several ranks each: an
//! all_gather in shared memory on each host, an exchange of every host's blocks between the
//! hosts' leaders (their lowest ranks) over TCP, and a shared-memory broadcast of the other
//! hosts' blocks from each leader.

use crate::algorithms::common::leaders;
use crate::error::Result;
use crate::transport::members::Members;
use crate::transport::{Op, OpCtx, Transport};

/// `blocks[rank]` holds this rank's data; fills `blocks[r]` with rank r's.
pub fn all_gather(t: &mut dyn Transport, ctx: &OpCtx, blocks: &mut [&mut [u8]]) -> Result<()> {
    let host_of = t.host_of().to_vec();
    let me = t.rank();
    let here = host_of[me];
    if let Some(ws) = t.shared() {
        let mut local: Vec<&mut [u8]> = blocks
            .iter_mut()
            .zip(&host_of)
            .filter(|(_, &h)| h == here)
            .map(|(b, _)| &mut **b)
            .collect();
        super::shm::on_host(ws, ctx, None, &mut local)?;
    }
    let leaders = leaders(&host_of, None);
    if let Some(i) = leaders.iter().position(|&l| l == me) {
        if leaders.len() > 1 {
            // Per pair of leaders, the messages match in rank order on both sides.
            let mut ops: Vec<Op<'_>> = Vec::new();
            for (q, b) in blocks.iter_mut().enumerate() {
                if host_of[q] == here {
                    let data: &[u8] = b;
                    ops.extend(
                        (0..leaders.len())
                            .filter(|&j| j != i)
                            .map(|peer| Op::Send { peer, data }),
                    );
                } else {
                    ops.push(Op::Recv {
                        peer: host_of[q],
                        buf: b,
                    });
                }
            }
            Members::new(t, &leaders, i).exchange(ctx, &mut ops)?;
        }
    }
    if let Some(ws) = t.shared() {
        for (q, b) in blocks.iter_mut().enumerate() {
            if host_of[q] != here {
                crate::algorithms::broadcast::shm::on_host(ws, ctx, b, 0)?;
            }
        }
    }
    Ok(())
}
