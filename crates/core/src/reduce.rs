//! Elementwise reduction kernels over raw byte buffers.

use crate::error::{Error, Result};
use crate::types::{DType, ReduceOp};

/// Checks that `op` can reduce `dtype` (as a kernel op: SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR).
pub fn check_supported(dtype: DType, op: ReduceOp) -> Result<()> {
    let _ = (dtype, op);
    Err(Error::Runtime("reduction kernels not built yet".into()))
}

/// `dst[i] = dst[i] op src[i]` for every element; both slices hold whole elements of `dtype`
/// and have the same length.
pub fn reduce_into(dtype: DType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> Result<()> {
    let _ = (dtype, op, dst, src);
    Err(Error::Runtime("reduction kernels not built yet".into()))
}

/// Multiplies every element by `factor` (for AVG and PREMUL_SUM on floating/complex types).
pub fn scale(dtype: DType, buf: &mut [u8], factor: f64) -> Result<()> {
    let _ = (dtype, buf, factor);
    Err(Error::Runtime("reduction kernels not built yet".into()))
}
