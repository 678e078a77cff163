//! Hierarchical all_reduce for groups spread over hosts with several ranks each: a
//! shared-memory reduce to each host's leader (its lowest rank), an all_reduce among the
//! leaders over TCP, and a shared-memory broadcast from each leader.

use crate::algorithms::common::leaders;
use crate::algorithms::select::{AlgoOverrides, AllReduceAlgo};
use crate::algorithms::{broadcast, reduce};
use crate::error::Result;
use crate::transport::members::Members;
use crate::transport::{OpCtx, Transport};

/// All-reduces `buf` in place with `ctx.reduce` over every rank of the group.
pub fn all_reduce(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    algos: &AlgoOverrides,
) -> Result<()> {
    if let Some(ws) = t.shared() {
        reduce::shm::on_host(ws, ctx, buf, 0)?;
    }
    let leaders = leaders(t.host_of(), None);
    if let Some(i) = leaders.iter().position(|&l| l == t.rank()) {
        if leaders.len() > 1 {
            let view = &mut Members::new(t, &leaders, i);
            match algos.all_reduce_between_hosts(buf.len(), leaders.len()) {
                AllReduceAlgo::RecursiveDoubling => super::recursive_doubling::all_reduce(
                    view,
                    ctx,
                    buf,
                    super::recursive_doubling::DEFAULT_MAX_SEGMENT_BYTES,
                )?,
                _ => super::ring::all_reduce(view, ctx, buf, algos.ring_shape())?,
            }
        }
    }
    if let Some(ws) = t.shared() {
        broadcast::shm::on_host(ws, ctx, buf, 0)?;
    }
    Ok(())
}
