//! Point-to-point operations of a [`CudaGroup`]: send, recv and batch_isend_irecv. Tag-0
//! transfers go through NCCL (grouped), the others through host memory and the CPU engine;
//! the receiver routes a tag the same way, so they match.

use super::group::CudaGroup;
use super::staged::{staged_p2p, staged_recv_any};
use super::types::{DevTensor, Mode, P2pOp};
use super::work::CudaWork;
use crate::error::{Error, Result};
use crate::recorder::Op;
use crate::work::Keepalive;

impl CudaGroup {
    /// The recorder's entries of point-to-point transfers (`(send, peer, tensor)`; a receive
    /// from any source has no peer).
    fn p2p_ops(
        &self,
        transfers: impl Iterator<Item = (bool, Option<usize>, DevTensor)>,
    ) -> Vec<Op> {
        let me = self.inner.rank;
        transfers
            .map(|(send, peer, t)| {
                let peer = peer.unwrap_or(usize::MAX);
                Op {
                    name: if send { "send" } else { "recv" },
                    input: t.numel as u64,
                    output: t.numel as u64,
                    dtype: t.dtype,
                    p2p: Some(if send { (me, peer) } else { (peer, me) }),
                    cuda: true,
                }
            })
            .collect()
    }

    /// Whether a point-to-point transfer with `tag` goes through NCCL (else host memory).
    fn p2p_on_nccl(&self, tag: i64) -> bool {
        self.inner.mode == Mode::Nccl && tag == 0
    }

    /// Sends `t` to `dst`. NCCL for tag 0, else through host memory (the receiver routes the
    /// same tag the same way, so they match).
    pub fn send(
        &self,
        t: DevTensor,
        dst: usize,
        tag: i64,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        self.check_rank("send destination rank", dst)?;
        self.batch_isend_irecv(
            vec![P2pOp {
                send: true,
                peer: dst,
                tensor: t,
                tag,
            }],
            stream,
            keep,
        )
        .map(|(w, _)| w)
    }

    /// Receives into `t` from `src` (any rank when `None`: needs a nonzero tag when this group
    /// has NCCL, whose receives always name their peer). The Work's source rank is the sender.
    pub fn recv(
        &self,
        t: DevTensor,
        src: Option<usize>,
        tag: i64,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        match src {
            Some(peer) => {
                self.check_rank("recv source rank", peer)?;
                let op = P2pOp {
                    send: false,
                    peer,
                    tensor: t,
                    tag,
                };
                self.batch_isend_irecv(vec![op], stream, keep)
                    .map(|(w, _)| w)
            }
            None if self.p2p_on_nccl(tag) => Err(Error::Runtime(
                "recv from any source on CUDA tensors needs a nonzero tag (on the sender too): \
                 tag 0 travels through NCCL, which cannot receive from any source"
                    .into(),
            )),
            None => {
                let ops = self.p2p_ops([(false, None, t)].into_iter());
                let plan = Self::staged(staged_recv_any(self.inner.cpu.clone(), t, tag));
                self.inner.submit("recv", &ops, None, stream, keep, plan)
            }
        }
    }

    /// torch's batch_isend_irecv: tag-0 transfers in one NCCL group, the others through host
    /// memory after it. Returns the Work of the last part (it ends after the others on the
    /// stream) and whether the batch was split in two.
    pub fn batch_isend_irecv(
        &self,
        ops: Vec<P2pOp>,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<(CudaWork, bool)> {
        for op in &ops {
            let what = if op.send {
                "send destination rank"
            } else {
                "recv source rank"
            };
            self.check_rank(what, op.peer)?;
        }
        let (on_nccl, staged): (Vec<P2pOp>, Vec<P2pOp>) =
            ops.into_iter().partition(|op| self.p2p_on_nccl(op.tag));
        let single_recv = |list: &[P2pOp]| match list {
            [op] if !op.send => Some(op.peer),
            _ => None,
        };
        let name = |list: &[P2pOp]| match list {
            [op] if op.send => "send",
            [_] => "recv",
            _ => "batch_isend_irecv",
        };
        let split = !on_nccl.is_empty() && !staged.is_empty();
        let mut keep = keep;
        let mut last = None;
        if !on_nccl.is_empty() {
            let source = single_recv(&on_nccl);
            let what = name(&on_nccl);
            let split_keep = if staged.is_empty() { keep.take() } else { None };
            let (sends, recvs): (Vec<&P2pOp>, Vec<&P2pOp>) = on_nccl.iter().partition(|op| op.send);
            let plan = self.nccl_transfers(
                what,
                sends.iter().map(|op| (op.peer, op.tensor)).collect(),
                recvs.iter().map(|op| (op.peer, op.tensor)).collect(),
            )?;
            let ops = self.p2p_ops(on_nccl.iter().map(|o| (o.send, Some(o.peer), o.tensor)));
            last = Some(
                self.inner
                    .submit(what, &ops, source, stream, split_keep, plan)?,
            );
        }
        if !staged.is_empty() {
            let source = single_recv(&staged);
            let what = name(&staged);
            let ops = self.p2p_ops(staged.iter().map(|o| (o.send, Some(o.peer), o.tensor)));
            let plan = Self::staged(staged_p2p(self.inner.cpu.clone(), staged));
            last = Some(
                self.inner
                    .submit(what, &ops, source, stream, keep.take(), plan)?,
            );
        }
        let work =
            last.ok_or_else(|| Error::invalid("batch_isend_irecv needs at least one operation"))?;
        Ok((work, split))
    }
}
