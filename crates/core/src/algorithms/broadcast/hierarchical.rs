//! Hierarchical broadcast for groups spread over hosts with several ranks each: the root and
//! one leader per other host (its lowest rank) broadcast over TCP, then each leader
//! broadcasts in shared memory on its host.

use crate::algorithms::common::{leaders, local_index};
use crate::algorithms::params::LeadersBroadcast;
use crate::error::Result;
use crate::transport::members::Members;
use crate::transport::{OpCtx, Transport};

/// Copies `buf` of rank `root` into `buf` of every other rank; the root and the other hosts'
/// leaders run `between` among themselves.
pub fn broadcast(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    root: usize,
    between: LeadersBroadcast,
) -> Result<()> {
    let leaders = leaders(t.host_of(), Some(root));
    let my_leader = leaders[t.host_of()[t.rank()]];
    if let Some(i) = leaders.iter().position(|&l| l == t.rank()) {
        if leaders.len() > 1 {
            let from = leaders.iter().position(|&l| l == root).unwrap_or(0);
            let view = &mut Members::new(t, &leaders, i);
            match between {
                LeadersBroadcast::Chain => {
                    let segment = super::chain::segment_bytes(buf.len());
                    super::chain::broadcast(view, ctx, buf, from, segment)?
                }
                LeadersBroadcast::BinomialTree => {
                    super::binomial_tree::broadcast(view, ctx, buf, from)?
                }
            }
        }
    }
    if let Some(ws) = t.shared() {
        let root = local_index(ws, my_leader);
        super::shm::on_host(ws, ctx, buf, root)?;
    }
    Ok(())
}
