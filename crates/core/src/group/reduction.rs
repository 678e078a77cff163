//! Reductions as the user asks for them: the checks of an op against a dtype, and the scaling
//! before (PREMUL_SUM) and after (AVG) the SUM that carries them on the wire.

use crate::error::{Error, Result};
use crate::reduce;
use crate::types::{DType, ReduceOp};

/// The kernel op that carries `op` on the wire: AVG and PREMUL_SUM travel as SUM.
pub(super) fn kernel_op(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Avg | ReduceOp::PremulSum => ReduceOp::Sum,
        other => other,
    }
}

/// A reduction as the user asked for it: the op, and PREMUL_SUM's factor.
#[derive(Debug, Clone, Copy)]
pub struct Reduction {
    pub op: ReduceOp,
    pub premul: Option<f64>,
}

impl Reduction {
    pub fn new(op: ReduceOp, premul: Option<f64>) -> Result<Reduction> {
        if op == ReduceOp::PremulSum && premul.is_none() {
            return Err(Error::invalid(
                "ReduceOp.PREMUL_SUM needs a scale factor (use make_premul_sum(factor))",
            ));
        }
        Ok(Reduction { op, premul })
    }

    pub(super) fn check(&self, dtype: DType) -> Result<()> {
        let scaled = matches!(self.op, ReduceOp::Avg | ReduceOp::PremulSum);
        if scaled && !(dtype.is_float() || dtype.is_complex()) {
            return Err(Error::Runtime(format!(
                "ReduceOp.{} is not supported for {}",
                self.op.name(),
                dtype.name()
            )));
        }
        reduce::check_supported(dtype, kernel_op(self.op))
    }

    /// Scales this rank's contribution before the SUM (PREMUL_SUM).
    pub(super) fn before(&self, dtype: DType, buf: &mut [u8]) -> Result<()> {
        match self.premul {
            Some(factor) if self.op == ReduceOp::PremulSum => reduce::scale(dtype, buf, factor),
            _ => Ok(()),
        }
    }

    /// Scales the reduced result (AVG divides by the group size).
    pub(super) fn after(&self, dtype: DType, buf: &mut [u8], size: usize) -> Result<()> {
        if self.op == ReduceOp::Avg {
            reduce::scale(dtype, buf, 1.0 / size as f64)?;
        }
        Ok(())
    }
}
