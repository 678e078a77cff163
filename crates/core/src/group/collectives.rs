//! Each collective's entry point on a [`ProcessGroup`]: the checks of its arguments, its
//! signature, and the body the engine runs (reductions, broadcast, all_gather, reduce_scatter,
//! barrier, monitored_barrier, and the exchanges of blocks).

use std::time::Duration;

use super::blocks::{all_gather_views, mut_slices, Blocks};
use super::reduction::{kernel_op, Reduction};
use super::{ProcessGroup, Run};
use crate::algorithms;
use crate::error::{Error, Result};
use crate::recorder::Op;
use crate::tensor::{any_overlap, RawBuf, Tensor};
use crate::transport::Signature;
use crate::types::{CollectiveKind, DType, ReduceOp};
use crate::work::Work;

/// The recorder's entry of collective `name` reading `input` and writing `output` elements.
fn op(name: &'static str, input: usize, output: usize, dtype: DType) -> Op {
    Op {
        name,
        input: input as u64,
        output: output as u64,
        dtype,
        p2p: None,
        cuda: false,
    }
}

impl ProcessGroup {
    /// In-place all_reduce of `t` with `red`.
    pub fn all_reduce(&self, t: Tensor, red: Reduction, mode: Run) -> Result<Option<Work>> {
        self.reduction(t, None, red, mode)
    }

    /// Reduces every rank's `t` into `t` on `root`; other ranks' tensors are left unchanged.
    pub fn reduce(
        &self,
        t: Tensor,
        root: usize,
        red: Reduction,
        mode: Run,
    ) -> Result<Option<Work>> {
        self.check_rank("reduce destination rank", root)?;
        self.reduction(t, Some(root), red, mode)
    }

    /// all_reduce (`root` None) or reduce to `root`: non-roots reduce a copy of their tensor.
    fn reduction(
        &self,
        t: Tensor,
        root: Option<usize>,
        red: Reduction,
        mode: Run,
    ) -> Result<Option<Work>> {
        red.check(t.dtype)?;
        let sig = Signature {
            kind: match root {
                None => CollectiveKind::AllReduce,
                Some(_) => CollectiveKind::Reduce,
            },
            dtype: t.dtype,
            op: red.op,
            count: t.numel as u64,
        };
        let in_place = root.is_none_or(|r| r == self.rank);
        let recorded = op(sig.kind.name(), t.numel, t.numel, t.dtype);
        self.start(mode, sig.kind.name(), Some(recorded), move |eng| {
            let size = eng.size;
            eng.collective(sig, kernel_op(red.op), |tr, ctx, algos| {
                // SAFETY: the caller keeps `t` alive and untouched until the Work completes.
                let own = unsafe { t.buf.as_mut_slice() };
                let mut scratch;
                let buf = if in_place {
                    own
                } else {
                    scratch = own.to_vec();
                    &mut scratch[..]
                };
                red.before(t.dtype, buf)?;
                match root {
                    None => algorithms::all_reduce(tr, ctx, buf, algos)?,
                    Some(root) => algorithms::reduce(tr, ctx, buf, root, algos)?,
                }
                red.after(t.dtype, buf, size)
            })?;
            Ok(None)
        })
    }

    /// gather, scatter, all_to_all, or all_gather of blocks of different sizes (`kind`),
    /// given as the blocks this rank sends and receives by peer (see [`Blocks`]): a gather
    /// sends one block to the root, which receives one from every rank; a scatter the other
    /// way; an all_gather sends the same block to every rank. `count` is what every rank
    /// agrees on (0 when sizes legitimately differ: each block's length is still checked).
    pub fn exchange(
        &self,
        kind: CollectiveKind,
        dtype: DType,
        count: u64,
        blocks: Blocks,
        mode: Run,
    ) -> Result<Option<Work>> {
        for &(p, _) in blocks.sends.iter().chain(blocks.recvs.iter()) {
            if p >= self.size {
                self.check_rank(&format!("{} peer rank", kind.name()), p)?;
            }
        }
        fn own(list: &[(usize, RawBuf)], rank: usize) -> impl Iterator<Item = usize> + '_ {
            list.iter()
                .filter(move |(p, _)| *p == rank)
                .map(|(_, b)| b.len())
        }
        if matches!(kind, CollectiveKind::AllToAll | CollectiveKind::AllGather)
            && !own(&blocks.sends, self.rank).eq(own(&blocks.recvs, self.rank))
        {
            return Err(Error::invalid(format!(
                "{}: the block this rank sends to itself does not fit the block it receives from itself",
                kind.name()
            )));
        }
        let (rank, size) = (self.rank, self.size);
        let root = match kind {
            CollectiveKind::Gather => blocks.sends.first().map(|&(p, _)| p),
            CollectiveKind::Scatter => blocks.recvs.first().map(|&(p, _)| p),
            CollectiveKind::AllToAll | CollectiveKind::AllGather => Some(rank),
            other => {
                return Err(Error::invalid(format!(
                    "{} is not an exchange of blocks",
                    other.name()
                )))
            }
        }
        .ok_or_else(|| Error::invalid(format!("{}: no block to move", kind.name())))?;
        let by_peer = |list: &[(usize, RawBuf)], what: &str| -> Result<Vec<RawBuf>> {
            // Usually listed in rank order already (always so from all_to_all_single).
            if list.len() == size && list.iter().enumerate().all(|(q, &(p, _))| p == q) {
                return Ok(list.iter().map(|&(_, b)| b).collect());
            }
            let mut out: Vec<Option<RawBuf>> = vec![None; size];
            for &(p, b) in list {
                if out[p].replace(b).is_some() {
                    return Err(Error::invalid(format!(
                        "{}: two {what} blocks for rank {p}",
                        kind.name()
                    )));
                }
            }
            out.into_iter()
                .enumerate()
                .map(|(p, b)| {
                    b.ok_or_else(|| {
                        Error::invalid(format!("{}: no {what} block for rank {p}", kind.name()))
                    })
                })
                .collect()
        };
        let (sends, recvs) = match kind {
            CollectiveKind::Gather if rank == root => {
                (vec![blocks.sends[0].1], by_peer(&blocks.recvs, "receive")?)
            }
            CollectiveKind::Scatter if rank == root => {
                (by_peer(&blocks.sends, "send")?, vec![blocks.recvs[0].1])
            }
            CollectiveKind::Gather | CollectiveKind::Scatter => (
                blocks.sends.iter().map(|&(_, b)| b).collect(),
                blocks.recvs.iter().map(|&(_, b)| b).collect(),
            ),
            _ => (
                by_peer(&blocks.sends, "send")?,
                by_peer(&blocks.recvs, "receive")?,
            ),
        };
        // Inputs that share memory with outputs (all_to_all_single(t, t), a gather into the
        // root's own input) are read from a copy, else the exchange overwrites blocks before
        // sending them. An all_gather's input may be its own output block (see all_gather_views).
        let stage_sends = kind != CollectiveKind::AllGather && any_overlap(&sends, &recvs);
        let sig = Signature {
            kind,
            dtype,
            op: ReduceOp::Sum,
            count,
        };
        let elements = |list: &[RawBuf]| list.iter().map(|b| b.len()).sum::<usize>() / dtype.size();
        let (input, output) = (elements(&sends), elements(&recvs));
        let recorded = match kind {
            // Blocks of different sizes: torch's analyzer compares inputs across ranks, so
            // each rank records the whole result as both.
            CollectiveKind::AllGather => op("all_gather_v", output, output, dtype),
            _ => op(kind.name(), input, output, dtype),
        };
        self.start(mode, kind.name(), Some(recorded), move |eng| {
            eng.collective(sig, ReduceOp::Sum, |tr, ctx, algos| {
                if kind == CollectiveKind::AllGather {
                    // SAFETY: the caller keeps every block alive and untouched until
                    // completion; no slice exists yet; output blocks are distinct and the own
                    // one is as long as the input (checked above).
                    return unsafe { all_gather_views(tr, ctx, sends[rank], &recvs, rank, algos) };
                }
                // SAFETY: as above; no output slice exists yet.
                let staged: Option<Vec<Vec<u8>>> = stage_sends.then(|| {
                    sends
                        .iter()
                        .map(|b| unsafe { b.as_slice() }.to_vec())
                        .collect()
                });
                let ins: Vec<&[u8]> = match &staged {
                    Some(copies) => copies.iter().map(Vec::as_slice).collect(),
                    // SAFETY: as above; the inputs share no byte with the outputs (checked
                    // above).
                    None => sends.iter().map(|b| unsafe { b.as_slice() }).collect(),
                };
                // SAFETY: as above; output blocks are distinct from each other.
                let mut outs = unsafe { mut_slices(&recvs) };
                match kind {
                    CollectiveKind::Gather => {
                        let input = ins.first().copied().unwrap_or(&[]);
                        algorithms::gather(tr, ctx, input, &mut outs, root, algos)
                    }
                    CollectiveKind::Scatter => {
                        let mut empty: [u8; 0] = [];
                        let output = outs.first_mut().map_or(&mut empty[..], |o| &mut **o);
                        algorithms::scatter(tr, ctx, &ins, output, root, algos)
                    }
                    _ => algorithms::all_to_all(tr, ctx, &ins, &mut outs, algos),
                }
            })?;
            Ok(None)
        })
    }

    /// torch's monitored_barrier (see `algorithms/monitored_barrier`): a late rank fails this
    /// call only; the group stays usable.
    pub fn monitored_barrier(&self, timeout: Duration, wait_all_ranks: bool) -> Result<Work> {
        let work = self.start(Run::detached(), "monitored_barrier", None, move |eng| {
            eng.check()?;
            eng.monitored += 1;
            // Tags below every user tag, one pair per call, so late arrivals never match.
            let tag = i64::MIN + 2 * eng.monitored as i64;
            let grace = eng.timeout;
            let verdict = algorithms::monitored_barrier::linear::monitored_barrier(
                eng.transport.as_mut(),
                tag,
                timeout,
                wait_all_ranks,
                grace,
            );
            match verdict {
                // A transport failure breaks the group; a late rank fails only this call.
                Err(e @ (Error::Network(_) | Error::Interrupted)) => eng.record(Err(e)),
                other => other,
            }
            .map(|()| None)
        })?;
        work.ok_or_else(|| Error::Runtime("monitored_barrier returned no Work".into()))
    }

    /// Broadcast of `t` from `root` to every rank, in place.
    pub fn broadcast(&self, t: Tensor, root: usize, mode: Run) -> Result<Option<Work>> {
        self.check_rank("broadcast root", root)?;
        let sig = Signature {
            kind: CollectiveKind::Broadcast,
            dtype: t.dtype,
            op: ReduceOp::Sum,
            count: t.numel as u64,
        };
        let recorded = op("broadcast", t.numel, t.numel, t.dtype);
        self.start(mode, "broadcast", Some(recorded), move |eng| {
            eng.collective(sig, ReduceOp::Sum, |tr, ctx, algos| {
                // SAFETY: the caller keeps `t` alive and untouched until the Work completes.
                let buf = unsafe { t.buf.as_mut_slice() };
                algorithms::broadcast(tr, ctx, buf, root, algos)
            })?;
            Ok(None)
        })
    }

    /// Gathers every rank's `input` into `outputs[rank]` on every rank (blocks of one size).
    pub fn all_gather(
        &self,
        input: Tensor,
        outputs: Vec<RawBuf>,
        mode: Run,
    ) -> Result<Option<Work>> {
        if outputs.len() != self.size {
            return Err(Error::invalid(format!(
                "all_gather needs {} output tensors (one per rank), got {}",
                self.size,
                outputs.len()
            )));
        }
        if let Some((r, o)) = outputs
            .iter()
            .enumerate()
            .find(|(_, o)| o.len() != input.nbytes())
        {
            return Err(Error::invalid(format!(
                "all_gather output {r} has {} bytes but the input has {} ({} elements of {})",
                o.len(),
                input.nbytes(),
                input.numel,
                input.dtype.name()
            )));
        }
        let sig = Signature {
            kind: CollectiveKind::AllGather,
            dtype: input.dtype,
            op: ReduceOp::Sum,
            count: input.numel as u64,
        };
        let rank = self.rank;
        let recorded = op(
            "all_gather",
            input.numel,
            input.numel * self.size,
            input.dtype,
        );
        self.start(mode, "all_gather", Some(recorded), move |eng| {
            eng.collective(sig, ReduceOp::Sum, |tr, ctx, algos| {
                // SAFETY: the caller keeps the input and every output alive and untouched
                // until completion; no slice exists yet; output blocks are distinct from each
                // other and as long as the input (checked above).
                unsafe { all_gather_views(tr, ctx, input.buf, &outputs, rank, algos) }
            })?;
            Ok(None)
        })
    }

    /// Reduces `input` (size blocks of `output.numel` elements) and leaves block `rank` of the
    /// result in `output`. The input is not modified.
    pub fn reduce_scatter(
        &self,
        input: Tensor,
        output: Tensor,
        red: Reduction,
        mode: Run,
    ) -> Result<Option<Work>> {
        red.check(input.dtype)?;
        if input.dtype != output.dtype {
            return Err(Error::invalid(format!(
                "reduce_scatter input is {} but output is {}",
                input.dtype.name(),
                output.dtype.name()
            )));
        }
        if input.numel != output.numel * self.size {
            return Err(Error::invalid(format!(
                "reduce_scatter input must have world_size ({}) times the output's {} elements, got {}",
                self.size, output.numel, input.numel
            )));
        }
        let sig = Signature {
            kind: CollectiveKind::ReduceScatter,
            dtype: input.dtype,
            op: red.op,
            count: output.numel as u64,
        };
        // An output inside the input (reduce_scatter in place) would be written before all of
        // the input is read: the input is read from a copy then, as when it is scaled first.
        let scaled = red.premul.is_some() && red.op == ReduceOp::PremulSum;
        let copy_input = scaled || input.buf.overlaps(&output.buf);
        let recorded = op("reduce_scatter", input.numel, output.numel, input.dtype);
        self.start(mode, "reduce_scatter", Some(recorded), move |eng| {
            let size = eng.size;
            eng.collective(sig, kernel_op(red.op), |tr, ctx, algos| {
                let mut staged;
                let src = if copy_input {
                    // SAFETY: the caller keeps both tensors alive and untouched until
                    // completion; no slice of the output exists yet.
                    staged = unsafe { input.buf.as_slice() }.to_vec();
                    if scaled {
                        red.before(input.dtype, &mut staged)?;
                    }
                    &staged[..]
                } else {
                    // SAFETY: as above, and the input shares no byte with the output.
                    unsafe { input.buf.as_slice() }
                };
                // SAFETY: as above; `src` is a copy whenever the two share a byte.
                let out = unsafe { output.buf.as_mut_slice() };
                algorithms::reduce_scatter(tr, ctx, src, out, algos)?;
                red.after(output.dtype, out, size)
            })?;
            Ok(None)
        })
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self, mode: Run) -> Result<Option<Work>> {
        let sig = Signature {
            kind: CollectiveKind::Barrier,
            dtype: DType::U8,
            op: ReduceOp::Sum,
            count: 0,
        };
        let recorded = op("barrier", 0, 0, DType::U8);
        self.start(mode, "barrier", Some(recorded), move |eng| {
            eng.collective(sig, ReduceOp::Sum, |tr, ctx, algos| {
                algorithms::barrier(tr, ctx, algos)
            })?;
            Ok(None)
        })
    }
}
