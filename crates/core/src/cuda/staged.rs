//! Host-staged plans: what a CUDA operation does when it cannot run on NCCL (ranks sharing a
//! GPU, or a dtype/operator/tag NCCL lacks). Every plan has one shape, [`staged`]: device
//! ranges copied into a pinned staging buffer ([`HostCopy`], placed by [`Layout`]), a step run
//! on the CPU engine's group over views of that buffer ([`host_tensor`]), the results copied
//! back. The engine runs the plan ([`Staged`], in `Inner::run_staged`) on its helper thread.
//!
//! Depends only on the shared types ([`super::types`]) and the CPU engine; the engine uses
//! [`Staged`] and [`HostCopy`], the group builds the plans.

use std::sync::Arc;

use super::types::{DevTensor, P2pOp};
use crate::error::Result;
use crate::group::{Blocks, ProcessGroup, Reduction, Run};
use crate::tensor::{RawBuf, Tensor};
use crate::types::{CollectiveKind, DType};
use crate::work::Work;

/// The CPU part of a staged operation, given the staging buffer's address; returns the source
/// rank of a receive.
pub(super) type Step = Box<dyn FnOnce(usize) -> Result<Option<usize>> + Send>;

/// A copy between a device range and the staging buffer (at `host` bytes from its start).
pub(super) struct HostCopy {
    pub(super) dev: usize,
    pub(super) host: usize,
    pub(super) len: usize,
}

impl HostCopy {
    /// All of `t`, at `host` in the staging buffer.
    fn of(t: &DevTensor, host: usize) -> HostCopy {
        HostCopy {
            dev: t.ptr,
            host,
            len: t.nbytes(),
        }
    }
}

/// A staged operation as the engine runs it: a staging buffer of `host_bytes`, `to_host`
/// copied in, `step` run, `from_host` copied out.
pub(super) struct Staged {
    pub(super) host_bytes: usize,
    pub(super) to_host: Vec<HostCopy>,
    pub(super) from_host: Vec<HostCopy>,
    pub(super) step: Step,
}

/// The skeleton every staged plan fills in: copy in `to_host`, run `step` on the CPU group,
/// copy out `from_host`, in a staging buffer laid out by `layout`.
fn staged(layout: Layout, to_host: Vec<HostCopy>, from_host: Vec<HostCopy>, step: Step) -> Staged {
    Staged {
        host_bytes: layout.bytes,
        to_host,
        from_host,
        step,
    }
}

/// Places blocks in the staging buffer, 64-byte aligned (the CPU kernels' fast path).
#[derive(Default)]
struct Layout {
    bytes: usize,
}

impl Layout {
    fn add(&mut self, len: usize) -> usize {
        let at = self.bytes.next_multiple_of(64);
        self.bytes = at + len;
        at
    }
}

/// A CPU-engine view of `numel` elements at `base + off` in the staging buffer.
fn host_tensor(base: usize, off: usize, dtype: DType, numel: usize) -> Tensor {
    // SAFETY: the staging lease outlives the step, which waits for every CPU Work it starts;
    // nothing else touches the buffer meanwhile.
    unsafe { Tensor::new((base + off) as *mut u8, dtype, numel) }
}

/// Waits for a CPU Work; its source rank (receives).
fn finish_cpu(work: Result<Work>) -> Result<Option<usize>> {
    let work = work?;
    work.wait(None)?;
    Ok(work.source_rank())
}

/// The outcome of a CPU collective run synchronously ([`Run::Sync`]).
fn sync_cpu(done: Result<Option<Work>>) -> Result<Option<usize>> {
    done.map(|_| None)
}

/// The skeleton for one tensor `t`, alone in the staging buffer: copied in when `copy_in`,
/// `run` on its host view, copied back when `copy_out`.
fn one_tensor(
    t: DevTensor,
    copy_in: bool,
    copy_out: bool,
    run: impl FnOnce(Tensor) -> Result<Option<usize>> + Send + 'static,
) -> Staged {
    let mut layout = Layout::default();
    let at = layout.add(t.nbytes());
    let copy = |wanted: bool| {
        if wanted {
            vec![HostCopy::of(&t, at)]
        } else {
            Vec::new()
        }
    };
    staged(
        layout,
        copy(copy_in),
        copy(copy_out),
        Box::new(move |base| run(host_tensor(base, at, t.dtype, t.numel))),
    )
}

/// all_reduce of `t` in place.
pub(super) fn staged_all_reduce(cpu: Arc<ProcessGroup>, t: DevTensor, red: Reduction) -> Staged {
    one_tensor(t, true, true, move |h| {
        sync_cpu(cpu.all_reduce(h, red, Run::Sync))
    })
}

/// reduce of `t` onto `root`; only the root (this `rank` or not) copies the result back.
pub(super) fn staged_reduce(
    cpu: Arc<ProcessGroup>,
    t: DevTensor,
    rank: usize,
    root: usize,
    red: Reduction,
) -> Staged {
    one_tensor(t, true, rank == root, move |h| {
        sync_cpu(cpu.reduce(h, root, red, Run::Sync))
    })
}

/// broadcast of `t` from `root`: the root copies in, the others copy back.
pub(super) fn staged_broadcast(
    cpu: Arc<ProcessGroup>,
    t: DevTensor,
    rank: usize,
    root: usize,
) -> Staged {
    let is_root = rank == root;
    one_tensor(t, is_root, !is_root, move |h| {
        sync_cpu(cpu.broadcast(h, root, Run::Sync))
    })
}

/// A receive into `t` from any source with `tag`.
pub(super) fn staged_recv_any(cpu: Arc<ProcessGroup>, t: DevTensor, tag: i64) -> Staged {
    one_tensor(t, false, true, move |h| {
        finish_cpu(cpu.recv(h, None, tag, None))
    })
}

/// The CPU engine's barrier, once the stream has reached it.
pub(super) fn staged_barrier(cpu: Arc<ProcessGroup>) -> Staged {
    staged(
        Layout::default(),
        Vec::new(),
        Vec::new(),
        Box::new(move |_| sync_cpu(cpu.barrier(Run::Sync))),
    )
}

/// all_gather of every rank's `input` into `outputs` (uneven sizes through an exchange).
pub(super) fn staged_all_gather(
    cpu: Arc<ProcessGroup>,
    input: DevTensor,
    outputs: Vec<DevTensor>,
) -> Staged {
    let mut layout = Layout::default();
    let at_in = layout.add(input.nbytes());
    let at_out: Vec<usize> = outputs.iter().map(|o| layout.add(o.nbytes())).collect();
    let to = vec![HostCopy::of(&input, at_in)];
    let back = outputs
        .iter()
        .zip(&at_out)
        .map(|(o, &host)| HostCopy::of(o, host))
        .collect();
    let even = outputs.iter().all(|o| o.numel == input.numel);
    let dtype = input.dtype;
    let sizes: Vec<usize> = outputs.iter().map(|o| o.numel).collect();
    staged(
        layout,
        to,
        back,
        Box::new(move |base| {
            let h_in = host_tensor(base, at_in, dtype, input.numel);
            let h_out: Vec<RawBuf> = at_out
                .iter()
                .zip(&sizes)
                .map(|(&at, &n)| host_tensor(base, at, dtype, n).buf)
                .collect();
            if even {
                return sync_cpu(cpu.all_gather(h_in, h_out, Run::Sync));
            }
            let blocks = Blocks {
                sends: (0..h_out.len()).map(|p| (p, h_in.buf)).collect(),
                recvs: h_out.into_iter().enumerate().collect(),
            };
            sync_cpu(cpu.exchange(CollectiveKind::AllGather, dtype, 0, blocks, Run::Sync))
        }),
    )
}

/// reduce_scatter of `inputs` (one block per rank) into `output`.
pub(super) fn staged_reduce_scatter(
    cpu: Arc<ProcessGroup>,
    inputs: Vec<DevTensor>,
    output: DevTensor,
    red: Reduction,
) -> Staged {
    let nb = output.nbytes();
    let mut layout = Layout::default();
    let at_in = layout.add(nb * inputs.len());
    let at_out = layout.add(nb);
    let to = inputs
        .iter()
        .enumerate()
        .map(|(r, i)| HostCopy::of(i, at_in + r * nb))
        .collect();
    let back = vec![HostCopy::of(&output, at_out)];
    let n = inputs.len();
    staged(
        layout,
        to,
        back,
        Box::new(move |base| {
            let h_in = host_tensor(base, at_in, output.dtype, output.numel * n);
            let h_out = host_tensor(base, at_out, output.dtype, output.numel);
            sync_cpu(cpu.reduce_scatter(h_in, h_out, red, Run::Sync))
        }),
    )
}

/// One step of concurrent transfers, as the CPU group's `exchange` (see `CudaGroup::exchange`).
pub(super) fn staged_exchange(
    cpu: Arc<ProcessGroup>,
    kind: CollectiveKind,
    dtype: DType,
    count: u64,
    sends: Vec<(usize, DevTensor)>,
    recvs: Vec<(usize, DevTensor)>,
) -> Staged {
    let mut layout = Layout::default();
    let place = |list: &[(usize, DevTensor)], layout: &mut Layout| -> Vec<HostCopy> {
        list.iter()
            .map(|(_, t)| HostCopy::of(t, layout.add(t.nbytes())))
            .collect()
    };
    let to = place(&sends, &mut layout);
    let back = place(&recvs, &mut layout);
    let blocks = |list: &[(usize, DevTensor)], copies: &[HostCopy]| -> Vec<(usize, usize, usize)> {
        list.iter()
            .zip(copies)
            .map(|((p, t), c)| (*p, c.host, t.numel))
            .collect()
    };
    let (s_blocks, r_blocks) = (blocks(&sends, &to), blocks(&recvs, &back));
    staged(
        layout,
        to,
        back,
        Box::new(move |base| {
            let host = |list: Vec<(usize, usize, usize)>| -> Vec<(usize, RawBuf)> {
                list.into_iter()
                    .map(|(p, at, n)| (p, host_tensor(base, at, dtype, n).buf))
                    .collect()
            };
            let blocks = Blocks {
                sends: host(s_blocks),
                recvs: host(r_blocks),
            };
            sync_cpu(cpu.exchange(kind, dtype, count, blocks, Run::Sync))
        }),
    )
}

/// The host-staged part of a batch of sends and receives (tags NCCL does not serve).
pub(super) fn staged_p2p(cpu: Arc<ProcessGroup>, staged_ops: Vec<P2pOp>) -> Staged {
    let mut layout = Layout::default();
    let placed: Vec<(P2pOp, usize)> = staged_ops
        .into_iter()
        .map(|op| (op, layout.add(op.tensor.nbytes())))
        .collect();
    let copies = |send: bool| -> Vec<HostCopy> {
        placed
            .iter()
            .filter(|(op, _)| op.send == send)
            .map(|(op, at)| HostCopy::of(&op.tensor, *at))
            .collect()
    };
    let (to, back) = (copies(true), copies(false));
    staged(
        layout,
        to,
        back,
        Box::new(move |base| {
            // All posted at once (they progress concurrently), then waited for.
            let works: Vec<Result<Work>> = placed
                .iter()
                .map(|(op, at)| {
                    let h = host_tensor(base, *at, op.tensor.dtype, op.tensor.numel);
                    if op.send {
                        cpu.send(h, op.peer, op.tag, None)
                    } else {
                        cpu.recv(h, Some(op.peer), op.tag, None)
                    }
                })
                .collect();
            let mut source = None;
            for w in works {
                source = finish_cpu(w)?.or(source);
            }
            Ok(source)
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_blocks_are_aligned_and_disjoint() {
        let mut layout = Layout::default();
        assert_eq!(layout.add(10), 0);
        assert_eq!(layout.add(3), 64);
        assert_eq!(layout.add(0), 128);
        assert_eq!(layout.add(100), 128);
        assert_eq!(layout.bytes, 228);
    }

    #[test]
    fn slices_offset_by_whole_elements() {
        let t = DevTensor {
            ptr: 0x1000,
            dtype: DType::C128,
            numel: 10,
        };
        let s = t.slice(3, 4);
        assert_eq!((s.ptr, s.numel, s.nbytes()), (0x1000 + 48, 4, 64));
        let copy = HostCopy::of(&s, 64);
        assert_eq!((copy.dev, copy.host, copy.len), (0x1030, 64, 64));
    }
}
