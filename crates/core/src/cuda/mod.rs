//! CUDA tensors: NCCL through `rustdist-nccl-sys`, with torch's stream semantics.
//!
//! A [`CudaGroup`] serves the CUDA operations of one process group on one device. Ranks that
//! each have their own GPU get an NCCL communicator; when two ranks share a GPU (NCCL refuses
//! that) every operation is *staged*: device → pinned host buffer, the CPU engine's collective
//! on the host buffer, host → device.
//!
//! What runs where, with an NCCL communicator:
//!
//! | operation | NCCL | staged through host memory |
//! |---|---|---|
//! | all_reduce, reduce, reduce_scatter(_tensor) | SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM on float16/bfloat16/float32/float64/int8/int32/int64/uint8; bool SUM/MAX/BOR (as MAX) and PRODUCT/MIN/BAND (as MIN); complex SUM/AVG/PREMUL_SUM (as float pairs) | int16; BAND/BOR/BXOR on integers; BXOR on bool; complex PRODUCT |
//! | broadcast, all_gather (list, uneven, into one tensor), gather, scatter, all_to_all(_single) | every dtype, as bytes | — |
//! | send, recv, batched send/recv | tag 0 with a known peer | tags other than 0 (on both sides, so they still match) |
//! | recv from any source | — (an error with tag 0: NCCL has no any-source receive) | with a nonzero tag |
//! | barrier | a one-element all_reduce | — |
//!
//! Stream semantics (torch's ProcessGroupNCCL): every operation runs on the group's internal
//! stream, which first waits for an event recorded on the caller's stream; the call returns once
//! the work is enqueued. [`CudaWork::wait_stream`] makes a caller stream wait for the operation's
//! end on the device, [`CudaWork::synchronize`] blocks the host. Host-staged operations run on
//! the group's helper thread (it waits for the device → host copy, runs the CPU collective, then
//! enqueues the host → device copy), and operations issued after one queue behind it so the
//! stream order stays the call order. A watchdog thread completes Works as their end events
//! fire, and on a timeout or an NCCL error aborts the communicator and fails every pending
//! Work: nothing hangs.
//!
//! Files, each using only those above it (never the other way):
//!
//! - `codes`, `rt`, `comm`, `work`: NCCL's codes, the CUDA runtime wrappers (streams, events,
//!   pinned and device memory), the NCCL communicator, the Work of one CUDA operation;
//! - `types`: the data types every layer shares ([`DevTensor`], [`P2pOp`], [`Mode`]);
//! - `nccl_calls`: the NCCL calls of each operation, one function each (their safety
//!   reasoning written there, once);
//! - `staged`: the host-staged plans, all of one shape (copy in, run on the CPU engine, copy
//!   out);
//! - `engine`: the job queue, the helper and watchdog threads, failure handling; runs the
//!   plans (uses `staged`'s plan type);
//! - `group`: [`CudaGroup`], the public API: validates, routes, builds the plans from
//!   `nccl_calls` and `staged`, submits them to the engine.

use rustdist_nccl_sys::{Error as SysError, NcclResult};

use crate::error::Error;

mod codes;
mod comm;
mod engine;
mod group;
mod nccl_calls;
mod p2p;
mod rt;
mod staged;
mod types;
mod work;

pub use group::{CudaGroup, SplitArgs};
pub use rustdist_nccl_sys::{Cudart, Loaded, Nccl};
pub use types::{DevTensor, Mode, P2pOp};
pub use work::CudaWork;

impl From<SysError> for Error {
    fn from(e: SysError) -> Self {
        let msg = e.to_string();
        match e {
            SysError::Load { .. } | SysError::Symbol { .. } => Error::Runtime(msg),
            // A peer or the network failed (NCCL's own classification).
            SysError::Nccl { code, .. }
                if code == NcclResult::REMOTE_ERROR || code == NcclResult::SYSTEM_ERROR =>
            {
                Error::Network(msg)
            }
            SysError::Nccl { .. } | SysError::Cuda { .. } => Error::Backend(msg),
        }
    }
}
