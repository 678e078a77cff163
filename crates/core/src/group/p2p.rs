//! Point-to-point operations on a [`ProcessGroup`]: send and recv are queued like any
//! operation and posted to the transport, which completes them whenever their bytes have moved.

use std::time::Instant;

use super::engine::Engine;
use super::ProcessGroup;
use crate::error::Result;
use crate::recorder::Op;
use crate::tensor::Tensor;
use crate::transport::P2pDone;
use crate::work::{Keepalive, Work};

impl ProcessGroup {
    /// Queues a point-to-point operation: `post` hands it to the transport, whose completion
    /// (possibly during a later operation) completes the Work with the peer's rank.
    fn submit_p2p(
        &self,
        keep: Option<Keepalive>,
        op: Op,
        post: impl FnOnce(&mut Engine, Instant, P2pDone) + Send + 'static,
    ) -> Result<Work> {
        let ticket = self.recorder.record(op, self.timeout(), false);
        let recorder = self.recorder.clone();
        self.enqueue(keep, op.name, move |engine, done| {
            if let Err(e) = engine.check() {
                done.complete(Err(e), None);
                return;
            }
            recorder.started(ticket);
            let deadline = engine.deadline();
            post(
                engine,
                deadline,
                Box::new(move |outcome| match outcome {
                    Ok(peer) => {
                        recorder.completed(ticket);
                        done.complete(Ok(()), Some(peer))
                    }
                    Err(e) => done.complete(Err(e), None),
                }),
            );
        })
    }

    /// The recorder's entry of a transfer of `t` from group rank `src` (any when None) to `dst`.
    fn p2p_op(name: &'static str, t: &Tensor, src: Option<usize>, dst: usize) -> Op {
        Op {
            name,
            input: t.numel as u64,
            output: t.numel as u64,
            dtype: t.dtype,
            p2p: Some((src.unwrap_or(usize::MAX), dst)),
            cuda: false,
        }
    }

    /// Sends `t` to `dst` with `tag`; the Work completes once the bytes are handed over.
    pub fn send(&self, t: Tensor, dst: usize, tag: i64, keep: Option<Keepalive>) -> Result<Work> {
        self.check_rank("send destination rank", dst)?;
        let op = Self::p2p_op("send", &t, Some(self.rank), dst);
        self.submit_p2p(keep, op, move |eng, deadline, done| {
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
        let op = Self::p2p_op("recv", &t, src, self.rank);
        self.submit_p2p(keep, op, move |eng, deadline, done| {
            eng.transport.post_recv(src, tag, t.buf, deadline, done)
        })
    }
}
