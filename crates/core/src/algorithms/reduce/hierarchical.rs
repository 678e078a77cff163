//! Hierarchical reduce for groups spread over hosts with several ranks each: a shared-memory
//! reduce on each host to its leader (the root on the root's host, the lowest rank
//! elsewhere), then a binomial-tree reduce among the leaders over TCP.

use crate::algorithms::common::{leaders, local_index};
use crate::error::Result;
use crate::transport::members::Members;
use crate::transport::{OpCtx, Transport};

/// Reduces `buf` of every rank into `buf` of rank `root` with `ctx.reduce` (clobbered on the
/// other ranks: the caller passes a copy there).
pub fn reduce(t: &mut dyn Transport, ctx: &OpCtx, buf: &mut [u8], root: usize) -> Result<()> {
    let leaders = leaders(t.host_of(), Some(root));
    let my_leader = leaders[t.host_of()[t.rank()]];
    if let Some(ws) = t.shared() {
        let local_root = local_index(ws, my_leader);
        super::shm::on_host(ws, ctx, buf, local_root)?;
    }
    if let Some(i) = leaders.iter().position(|&l| l == t.rank()) {
        if leaders.len() > 1 {
            let to = leaders.iter().position(|&l| l == root).unwrap_or(0);
            super::binomial_tree::reduce(&mut Members::new(t, &leaders, i), ctx, buf, to)?;
        }
    }
    Ok(())
}
