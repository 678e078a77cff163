//! Hierarchical all_reduce for groups spread over hosts with several ranks each: a
//! shared-memory reduce to each host's leader (its lowest rank), an all_reduce among the
//! leaders over TCP, and a shared-memory broadcast from each leader.

use crate::algorithms::common::leaders;
use crate::algorithms::params::LeadersAllReduce;
use crate::algorithms::{broadcast, reduce};
use crate::error::Result;
use crate::transport::members::Members;
use crate::transport::{OpCtx, Transport};

/// All-reduces `buf` in place with `ctx.reduce` over every rank of the group; the leaders run
/// `between` among themselves.
pub fn all_reduce(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    between: LeadersAllReduce,
) -> Result<()> {
    if let Some(ws) = t.shared() {
        reduce::shm::on_host(ws, ctx, buf, 0)?;
    }
    let leaders = leaders(t.host_of(), None);
    if let Some(i) = leaders.iter().position(|&l| l == t.rank()) {
        if leaders.len() > 1 {
            let view = &mut Members::new(t, &leaders, i);
            match between {
                LeadersAllReduce::RecursiveDoubling => super::recursive_doubling::all_reduce(
                    view,
                    ctx,
                    buf,
                    super::recursive_doubling::DEFAULT_MAX_SEGMENT_BYTES,
                )?,
                LeadersAllReduce::Ring(shape) => super::ring::all_reduce(view, ctx, buf, shape)?,
            }
        }
    }
    if let Some(ws) = t.shared() {
        broadcast::shm::on_host(ws, ctx, buf, 0)?;
    }
    Ok(())
}
