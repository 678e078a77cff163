//! The NCCL calls of each operation, one function per operation body: what the group hands to
//! `Comm::launch` (through the engine's `Plan::Nccl`) to enqueue an all_reduce, a reduce, a
//! broadcast, an all_gather, a reduce_scatter, grouped sends and receives, or the barrier.
//! Each function only makes its calls; validation, routing and the plan are the group's.
//!
//! # Safety
//!
//! The precondition every function here shares, so each `// SAFETY:` comment below states only
//! what its own call adds: it runs inside `Comm::launch` (between ncclGroupStart and
//! ncclGroupEnd, on the thread holding the live communicator's lock), `comm` is that
//! communicator and `s` the group's internal stream; every device address comes from a
//! [`DevTensor`] of the operation, a live device tensor of the size it says, which the
//! operation's Work keeps alive (its keepalive) until the operation's end event has fired.
//!
//! Depends only on the shared types ([`super::types`]) and NCCL's codes ([`super::codes`]).

use std::ffi::{c_int, c_void};

use rustdist_nccl_sys::{
    CudaMemcpyKind, CudaStream, Cudart, Nccl, NcclComm, NcclDataType, NcclRedOp, NcclResult,
};

use super::codes::{NcclReduction, BYTES};
use super::types::DevTensor;
use crate::error::Result;

/// `Ok` for success and ncclInProgress (settled at ncclGroupEnd), else NCCL's error.
fn nccl_ok(nccl: &Nccl, r: NcclResult, call: &'static str, comm: NcclComm) -> Result<()> {
    if r == NcclResult::IN_PROGRESS {
        return Ok(());
    }
    // SAFETY: called only inside `Comm::launch`, which holds the live communicator's lock.
    Ok(unsafe { nccl.check_comm(r, call, comm) }?)
}

fn int(v: usize) -> c_int {
    v as c_int
}

/// all_reduce: ncclAllReduce of `t` in place, as `r`'s NCCL elements.
pub(super) fn all_reduce(
    nccl: &Nccl,
    comm: NcclComm,
    op: NcclRedOp,
    s: CudaStream,
    t: DevTensor,
    r: NcclReduction,
) -> Result<()> {
    let ptr = t.ptr as *mut c_void;
    let count = t.numel * r.per_element;
    // SAFETY: `t` is a live device tensor (kept by the Work) of `count` NCCL
    // elements; in place, as NCCL allows.
    let res = unsafe { (nccl.all_reduce)(ptr, ptr, count, r.dtype, op, comm, s) };
    nccl_ok(nccl, res, "ncclAllReduce", comm)
}

/// reduce: ncclReduce of `t` in place onto `root`.
pub(super) fn reduce(
    nccl: &Nccl,
    comm: NcclComm,
    op: NcclRedOp,
    s: CudaStream,
    t: DevTensor,
    r: NcclReduction,
    root: usize,
) -> Result<()> {
    let ptr = t.ptr as *mut c_void;
    let count = t.numel * r.per_element;
    // SAFETY: as for all_reduce; NCCL writes only the root's buffer.
    let res = unsafe { (nccl.reduce)(ptr, ptr, count, r.dtype, op, int(root), comm, s) };
    nccl_ok(nccl, res, "ncclReduce", comm)
}

/// broadcast: ncclBroadcast of `t`'s bytes in place from `root`.
pub(super) fn broadcast(
    nccl: &Nccl,
    comm: NcclComm,
    s: CudaStream,
    t: DevTensor,
    root: usize,
) -> Result<()> {
    let ptr = t.ptr as *mut c_void;
    // SAFETY: `t` is a live device tensor of nbytes bytes; in place.
    let res = unsafe { (nccl.broadcast)(ptr, ptr, t.nbytes(), BYTES, int(root), comm, s) };
    nccl_ok(nccl, res, "ncclBroadcast", comm)
}

/// all_gather (list, possibly uneven): one grouped ncclBroadcast per rank r, from this rank's
/// `input` when r is this `rank`, into `outputs[r]` everywhere.
pub(super) fn all_gather(
    nccl: &Nccl,
    comm: NcclComm,
    s: CudaStream,
    rank: usize,
    input: DevTensor,
    outputs: &[DevTensor],
) -> Result<()> {
    for (r, out) in outputs.iter().enumerate() {
        let src = if r == rank { input.ptr } else { out.ptr };
        // SAFETY: live device tensors of the given sizes (kept by the Work).
        let res = unsafe {
            (nccl.broadcast)(
                src as *const c_void,
                out.ptr as *mut c_void,
                out.nbytes(),
                BYTES,
                int(r),
                comm,
                s,
            )
        };
        nccl_ok(nccl, res, "ncclBroadcast", comm)?;
    }
    Ok(())
}

/// all_gather_into_tensor: ncclAllGather of `input`'s bytes into `output` (size × input).
pub(super) fn all_gather_into(
    nccl: &Nccl,
    comm: NcclComm,
    s: CudaStream,
    input: DevTensor,
    output: DevTensor,
) -> Result<()> {
    // SAFETY: live device tensors; in place when the input is the rank's block.
    let res = unsafe {
        (nccl.all_gather)(
            input.ptr as *const c_void,
            output.ptr as *mut c_void,
            input.nbytes(),
            BYTES,
            comm,
            s,
        )
    };
    nccl_ok(nccl, res, "ncclAllGather", comm)
}

/// reduce_scatter (list): one grouped ncclReduce per rank, of `inputs[root]` onto `root`, whose
/// result lands in `output` on this `rank`.
#[allow(clippy::too_many_arguments)]
pub(super) fn reduce_scatter(
    nccl: &Nccl,
    comm: NcclComm,
    op: NcclRedOp,
    s: CudaStream,
    rank: usize,
    inputs: &[DevTensor],
    output: DevTensor,
    r: NcclReduction,
) -> Result<()> {
    for (root, input) in inputs.iter().enumerate() {
        // Only the root's receive buffer is written (NULL elsewhere).
        let recv = if root == rank {
            output.ptr as *mut c_void
        } else {
            std::ptr::null_mut()
        };
        let count = output.numel * r.per_element;
        // SAFETY: live device tensors of `count` NCCL elements.
        let res = unsafe {
            (nccl.reduce)(
                input.ptr as *const c_void,
                recv,
                count,
                r.dtype,
                op,
                int(root),
                comm,
                s,
            )
        };
        nccl_ok(nccl, res, "ncclReduce", comm)?;
    }
    Ok(())
}

/// reduce_scatter_tensor: ncclReduceScatter of `input` (size blocks) into `output`.
pub(super) fn reduce_scatter_tensor(
    nccl: &Nccl,
    comm: NcclComm,
    op: NcclRedOp,
    s: CudaStream,
    input: DevTensor,
    output: DevTensor,
    r: NcclReduction,
) -> Result<()> {
    // SAFETY: live device tensors; `input` holds size × recvcount elements.
    let res = unsafe {
        (nccl.reduce_scatter)(
            input.ptr as *const c_void,
            output.ptr as *mut c_void,
            output.numel * r.per_element,
            r.dtype,
            op,
            comm,
            s,
        )
    };
    nccl_ok(nccl, res, "ncclReduceScatter", comm)
}

/// Grouped transfers (exchange, send, recv, batch_isend_irecv): the blocks this `rank` sends
/// to itself as device copies (`to_self[i]` into `from_self[i]`, equal sizes checked by the
/// group), then an ncclSend per send and an ncclRecv per receive with another peer.
#[allow(clippy::too_many_arguments)]
pub(super) fn transfers(
    nccl: &Nccl,
    rt: &Cudart,
    comm: NcclComm,
    s: CudaStream,
    rank: usize,
    to_self: &[DevTensor],
    from_self: &[DevTensor],
    sends: &[(usize, DevTensor)],
    recvs: &[(usize, DevTensor)],
) -> Result<()> {
    for (src, dst) in to_self.iter().zip(from_self) {
        // SAFETY: live device tensors of equal size (checked by the group's `nccl_transfers`).
        let r = unsafe {
            (rt.memcpy_async)(
                dst.ptr as *mut c_void,
                src.ptr as *const c_void,
                src.nbytes(),
                CudaMemcpyKind::DEVICE_TO_DEVICE,
                s,
            )
        };
        rt.check(r, "cudaMemcpyAsync")?;
    }
    for (peer, t) in sends.iter().filter(|(p, _)| *p != rank) {
        // SAFETY: a live device tensor (kept by the Work).
        let r = unsafe {
            (nccl.send)(
                t.ptr as *const c_void,
                t.nbytes(),
                BYTES,
                int(*peer),
                comm,
                s,
            )
        };
        nccl_ok(nccl, r, "ncclSend", comm)?;
    }
    for (peer, t) in recvs.iter().filter(|(p, _)| *p != rank) {
        // SAFETY: as above.
        let r =
            unsafe { (nccl.recv)(t.ptr as *mut c_void, t.nbytes(), BYTES, int(*peer), comm, s) };
        nccl_ok(nccl, r, "ncclRecv", comm)?;
    }
    Ok(())
}

/// barrier: a one-element float32 ncclAllReduce on the group's scratch buffer at `ptr`.
pub(super) fn barrier(
    nccl: &Nccl,
    comm: NcclComm,
    op: NcclRedOp,
    s: CudaStream,
    ptr: usize,
) -> Result<()> {
    let p = ptr as *mut c_void;
    // SAFETY: the group's own 4-byte device buffer, alive with the group.
    let res = unsafe { (nccl.all_reduce)(p, p, 1, NcclDataType::FLOAT32, op, comm, s) };
    nccl_ok(nccl, res, "ncclAllReduce", comm)
}
