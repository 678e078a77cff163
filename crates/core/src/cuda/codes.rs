//! The one place that maps rustdist's dtypes and reductions to NCCL's, and decides what NCCL
//! cannot do (those run through host memory on the CPU engine).

use half::{bf16, f16};
use rustdist_nccl_sys::{NcclDataType, NcclRedOp};

use crate::error::{Error, Result};
use crate::group::Reduction;
use crate::reduce;
use crate::types::{DType, ReduceOp};

/// Data movement (broadcast, gathers, scatters, all_to_all, send/recv) is dtype-blind: it
/// travels as bytes, so every dtype (int16, complex, bool too) goes through NCCL.
pub(crate) const BYTES: NcclDataType = NcclDataType::UINT8;

/// A reduction NCCL can run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NcclReduction {
    pub dtype: NcclDataType,
    /// NCCL elements per rustdist element (complex numbers travel as pairs of floats).
    pub per_element: usize,
    pub op: OpSpec,
}

/// A built-in NCCL operator, or PREMUL_SUM with its factor (created per call on the comm).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum OpSpec {
    Builtin(NcclRedOp),
    PreMulSum(f64),
}

/// Where a reduction runs: on NCCL, or staged through host memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Route {
    Nccl(NcclReduction),
    Staged,
}

/// Checks `red` on `dtype` with the CPU engine's rules (same errors on both devices).
pub(crate) fn check(dtype: DType, red: &Reduction) -> Result<()> {
    let scaled = matches!(red.op, ReduceOp::Avg | ReduceOp::PremulSum);
    if scaled && !(dtype.is_float() || dtype.is_complex()) {
        return Err(Error::Runtime(format!(
            "ReduceOp.{} is not supported for {}",
            red.op.name(),
            dtype.name()
        )));
    }
    reduce::check_supported(dtype, if scaled { ReduceOp::Sum } else { red.op })
}

/// How `red` on `dtype` runs; an error for combinations no engine supports.
pub(crate) fn route(dtype: DType, red: &Reduction) -> Result<Route> {
    check(dtype, red)?;
    // NCCL has no int16, and no complex type: complex SUM/AVG/PREMUL_SUM are componentwise
    // on (re, im) float pairs; complex PRODUCT is not.
    let (nccl_dtype, per_element) = match dtype {
        DType::F32 => (NcclDataType::FLOAT32, 1),
        DType::F64 => (NcclDataType::FLOAT64, 1),
        DType::F16 => (NcclDataType::FLOAT16, 1),
        DType::BF16 => (NcclDataType::BFLOAT16, 1),
        DType::I8 => (NcclDataType::INT8, 1),
        DType::I32 => (NcclDataType::INT32, 1),
        DType::I64 => (NcclDataType::INT64, 1),
        DType::U8 | DType::Bool => (NcclDataType::UINT8, 1),
        DType::C64 => (NcclDataType::FLOAT32, 2),
        DType::C128 => (NcclDataType::FLOAT64, 2),
        DType::I16 => return Ok(Route::Staged),
    };
    let op = match (dtype, red.op) {
        (DType::C64 | DType::C128, ReduceOp::Product) => return Ok(Route::Staged),
        // Bools are 0/1 bytes: OR is MAX and AND is MIN (torch maps SUM and PRODUCT so too).
        (DType::Bool, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Bor) => NcclRedOp::MAX,
        (DType::Bool, ReduceOp::Product | ReduceOp::Min | ReduceOp::Band) => NcclRedOp::MIN,
        (_, ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor) => return Ok(Route::Staged),
        (_, ReduceOp::Sum) => NcclRedOp::SUM,
        (_, ReduceOp::Product) => NcclRedOp::PROD,
        (_, ReduceOp::Min) => NcclRedOp::MIN,
        (_, ReduceOp::Max) => NcclRedOp::MAX,
        (_, ReduceOp::Avg) => NcclRedOp::AVG,
        (_, ReduceOp::PremulSum) => {
            let factor = red.premul.ok_or_else(|| {
                Error::invalid(
                    "ReduceOp.PREMUL_SUM needs a scale factor (use make_premul_sum(factor))",
                )
            })?;
            return Ok(Route::Nccl(NcclReduction {
                dtype: nccl_dtype,
                per_element,
                op: OpSpec::PreMulSum(factor),
            }));
        }
    };
    Ok(Route::Nccl(NcclReduction {
        dtype: nccl_dtype,
        per_element,
        op: OpSpec::Builtin(op),
    }))
}

/// PREMUL_SUM's factor as NCCL reads it: one host scalar of the reduction's own type.
pub(crate) fn premul_scalar(dtype: NcclDataType, factor: f64) -> [u8; 8] {
    let mut out = [0u8; 8];
    match dtype {
        NcclDataType::FLOAT64 => out.copy_from_slice(&factor.to_ne_bytes()),
        NcclDataType::FLOAT32 => out[..4].copy_from_slice(&(factor as f32).to_ne_bytes()),
        NcclDataType::FLOAT16 => out[..2].copy_from_slice(&f16::from_f64(factor).to_ne_bytes()),
        NcclDataType::BFLOAT16 => out[..2].copy_from_slice(&bf16::from_f64(factor).to_ne_bytes()),
        // `route` gives PREMUL_SUM only floating types.
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn red(op: ReduceOp) -> Reduction {
        Reduction::new(op, (op == ReduceOp::PremulSum).then_some(0.5)).unwrap()
    }

    #[test]
    fn routes_follow_what_nccl_supports() {
        let nccl = |dtype, per_element, op| {
            Route::Nccl(NcclReduction {
                dtype,
                per_element,
                op: OpSpec::Builtin(op),
            })
        };
        use ReduceOp::*;
        assert_eq!(
            route(DType::F32, &red(Sum)).unwrap(),
            nccl(NcclDataType::FLOAT32, 1, NcclRedOp::SUM)
        );
        assert_eq!(
            route(DType::BF16, &red(Avg)).unwrap(),
            nccl(NcclDataType::BFLOAT16, 1, NcclRedOp::AVG)
        );
        assert_eq!(
            route(DType::C64, &red(Sum)).unwrap(),
            nccl(NcclDataType::FLOAT32, 2, NcclRedOp::SUM)
        );
        assert_eq!(
            route(DType::Bool, &red(Sum)).unwrap(),
            nccl(NcclDataType::UINT8, 1, NcclRedOp::MAX)
        );
        assert_eq!(
            route(DType::Bool, &red(Band)).unwrap(),
            nccl(NcclDataType::UINT8, 1, NcclRedOp::MIN)
        );
        assert_eq!(
            route(DType::C128, &red(PremulSum)).unwrap(),
            Route::Nccl(NcclReduction {
                dtype: NcclDataType::FLOAT64,
                per_element: 2,
                op: OpSpec::PreMulSum(0.5)
            })
        );
        for (dtype, op) in [
            (DType::I16, Sum),
            (DType::I32, Bor),
            (DType::U8, Bxor),
            (DType::Bool, Bxor),
            (DType::C64, Product),
        ] {
            assert_eq!(
                route(dtype, &red(op)).unwrap(),
                Route::Staged,
                "{dtype:?} {op:?}"
            );
        }
    }

    #[test]
    fn unsupported_reductions_fail_as_on_cpu() {
        use ReduceOp::*;
        assert!(matches!(
            route(DType::I32, &red(Avg)),
            Err(Error::Runtime(_))
        ));
        assert!(matches!(
            route(DType::F32, &red(Band)),
            Err(Error::Runtime(_))
        ));
        assert!(matches!(
            route(DType::C64, &red(Max)),
            Err(Error::Runtime(_))
        ));
    }

    #[test]
    fn premul_scalars_have_the_reduction_type() {
        assert_eq!(
            premul_scalar(NcclDataType::FLOAT64, 0.5)[..],
            0.5f64.to_ne_bytes()
        );
        assert_eq!(
            premul_scalar(NcclDataType::FLOAT32, 0.5)[..4],
            0.5f32.to_ne_bytes()
        );
        assert_eq!(
            premul_scalar(NcclDataType::FLOAT16, 0.5)[..2],
            f16::from_f32(0.5).to_ne_bytes()
        );
    }
}
