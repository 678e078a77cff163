//! Hierarchical barrier: a shared-memory barrier on each host, a dissemination barrier among
//! the hosts' leaders over TCP, and a second shared-memory barrier that holds every rank until
//! its leader is through.

use crate::algorithms::common::leaders;
use crate::error::Result;
use crate::transport::members::Members;
use crate::transport::{OpCtx, Transport};

/// Returns once every rank of the group has entered the barrier.
pub fn barrier(t: &mut dyn Transport, ctx: &OpCtx) -> Result<()> {
    if let Some(ws) = t.shared() {
        super::shm::on_host(ws, ctx)?;
    }
    let leaders = leaders(t.host_of(), None);
    if let Some(i) = leaders.iter().position(|&l| l == t.rank()) {
        super::dissemination::barrier(&mut Members::new(t, &leaders, i), ctx)?;
    }
    if let Some(ws) = t.shared() {
        super::shm::on_host(ws, ctx)?;
    }
    Ok(())
}
