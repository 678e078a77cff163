//! Point-to-point operations on a [`ProcessGroup`]: send and recv are queued like any
//! operation and posted to the transport, which completes them whenever their bytes have moved.

use std::time::Instant;

use super::engine::Engine;
use super::ProcessGroup;
use crate::error::Result;
use crate::tensor::Tensor;
use crate::transport::P2pDone;
use crate::work::{Keepalive, Work};

impl ProcessGroup {
    /// Queues a point-to-point operation: `post` hands it to the transport, whose completion
    /// (possibly during a later operation) completes the Work with the peer's rank.
    fn submit_p2p(
        &self,
        keep: Option<Keepalive>,
        what: &'static str,
        post: impl FnOnce(&mut Engine, Instant, P2pDone) + Send + 'static,
    ) -> Result<Work> {
        self.enqueue(keep, what, move |engine, done| {
            if let Err(e) = engine.check() {
                done.complete(Err(e), None);
                return;
            }
            let deadline = engine.deadline();
            post(
                engine,
                deadline,
                Box::new(move |outcome| match outcome {
                    Ok(peer) => done.complete(Ok(()), Some(peer)),
                    Err(e) => done.complete(Err(e), None),
                }),
            );
        })
    }

    /// Sends `t` to `dst` with `tag`; the Work completes once the bytes are handed over.
    pub fn send(&self, t: Tensor, dst: usize, tag: i64, keep: Option<Keepalive>) -> Result<Work> {
        self.check_rank("send destination rank", dst)?;
        self.submit_p2p(keep, "send", move |eng, deadline, done| {
            eng.transport.post_send(dst, tag, t.buf, deadline, done)
        })
    }

    /// Receives into `t` from `src` (any rank when `None`) with `tag`; the Work's source rank is
    /// the sender.
    pub fn recv(
        &self,
        t: Tensor,
        src: Option<usize>,
        tag: i64,
        keep: Option<Keepalive>,
    ) -> Result<Work> {
        if let Some(s) = src {
            self.check_rank("recv source rank", s)?;
        }
        self.submit_p2p(keep, "recv", move |eng, deadline, done| {
            eng.transport.post_recv(src, tag, t.buf, deadline, done)
        })
    }
}
