//! Barrier in shared memory: every rank publishes a step and waits for everyone's.

use crate::algorithms::common::{publish_empty, shared, wait_all};
use crate::error::Result;
use crate::transport::{OpCtx, SharedMemory, Transport};

/// Returns once every rank (all on this host) has entered the barrier.
pub fn barrier(t: &mut dyn Transport, ctx: &OpCtx) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    on_host(shared(t, ctx)?, ctx)
}

/// Barrier over the ranks of workspace `ws`.
pub(crate) fn on_host(ws: &mut dyn SharedMemory, ctx: &OpCtx) -> Result<()> {
    publish_empty(ws, ctx)?;
    wait_all(ws, ctx)
}
