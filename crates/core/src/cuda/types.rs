//! The plain data types of the CUDA API that every layer of this module shares: [`DevTensor`]
//! (a device tensor as the operations name it), [`P2pOp`] (one transfer of a batch) and
//! [`Mode`] (how a group's operations run). Depends on nothing else in `cuda`.

use crate::types::DType;

/// A contiguous CUDA tensor: device address, dtype and element count. Never dereferenced on
/// the host.
#[derive(Debug, Clone, Copy)]
pub struct DevTensor {
    pub ptr: usize,
    pub dtype: DType,
    pub numel: usize,
}

impl DevTensor {
    pub fn nbytes(&self) -> usize {
        self.numel * self.dtype.size()
    }

    /// Elements `[start, start + numel)` of this tensor.
    pub(super) fn slice(&self, start: usize, numel: usize) -> DevTensor {
        DevTensor {
            ptr: self.ptr + start * self.dtype.size(),
            dtype: self.dtype,
            numel,
        }
    }
}

/// One transfer of a batched send/recv (torch's `P2POp`).
#[derive(Debug, Clone, Copy)]
pub struct P2pOp {
    pub send: bool,
    pub peer: usize,
    pub tensor: DevTensor,
    pub tag: i64,
}

/// How the group's operations run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every rank has its own GPU: an NCCL communicator.
    Nccl,
    /// Some ranks share a GPU: everything goes through host memory and the CPU engine.
    Staged,
}
