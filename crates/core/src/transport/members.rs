//! A subset of a group's ranks seen as a group of its own, inside the same collective: the
//! leaders of a hierarchical collective (one rank per host) run an ordinary algorithm among
//! themselves over it. Rank i of the view is group rank `ranks[i]`; messages go through the
//! underlying transport.

use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

pub struct Members<'a> {
    inner: &'a mut dyn Transport,
    ranks: &'a [usize],
    me: usize,
    /// Every member is a host of its own.
    host_of: Vec<usize>,
}

impl<'a> Members<'a> {
    /// The view of `ranks` (group ranks; this rank is `ranks[me]`) over `inner`.
    pub fn new(inner: &'a mut dyn Transport, ranks: &'a [usize], me: usize) -> Members<'a> {
        Members {
            inner,
            ranks,
            me,
            host_of: (0..ranks.len()).collect(),
        }
    }
}

impl Transport for Members<'_> {
    fn rank(&self) -> usize {
        self.me
    }

    fn size(&self) -> usize {
        self.ranks.len()
    }

    fn host_of(&self) -> &[usize] {
        &self.host_of
    }

    fn exchange(&mut self, ctx: &OpCtx, ops: &mut [Op<'_>]) -> Result<()> {
        for op in ops.iter_mut() {
            let peer = match op {
                Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => peer,
            };
            *peer = self.ranks[*peer];
        }
        self.inner.exchange(ctx, ops)
    }

    fn abort(&mut self, reason: &str) {
        self.inner.abort(reason);
    }

    fn shutdown(&mut self) {
        self.inner.shutdown();
    }
}
