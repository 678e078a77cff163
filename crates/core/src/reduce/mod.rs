//! Elementwise reduction kernels over raw byte buffers.
//!
//! Dispatch on (dtype, op) happens once per call; each kernel is a plain zip over typed slices
//! that LLVM vectorises, compiled for the vectors the CPU has ([`Isa::for_dtype`], chosen at
//! run time; f16/bf16 SUM and PRODUCT have AVX-512 kernels of their own, `avx512.rs`). Buffers may
//! be misaligned (user memory, `Vec<u8>` scratch): aligned
//! buffers are reinterpreted in place, misaligned ones go through aligned stack blocks.
//! f16/bf16 are widened to f32, reduced, and rounded back (round to nearest even), which is
//! exactly what per-element half arithmetic does: f16 in blocks through F16C conversions, bf16
//! with inline bit conversions that vectorise (`half_precision.rs`, which also sums many
//! contributions in f32 at once).

#[cfg(target_arch = "x86_64")]
mod avx512;
mod elementwise;
mod half_precision;
mod isa;

use bytemuck::Pod;
use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::types::{DType, ReduceOp};
use elementwise::{max_nan, min_nan, zip, BLOCK};
pub use half_precision::{accumulates_in_f32, reduce_in_f32, reduce_in_f32_with};
use half_precision::{bf16_float, f16_float};
pub use isa::Isa;

type C64 = [f32; 2];
type C128 = [f64; 2];

fn unsupported(dtype: DType, op: ReduceOp) -> Error {
    Error::Runtime(format!(
        "ReduceOp.{} is not supported for {}",
        op.name(),
        dtype.name()
    ))
}

/// Checks that `op` can reduce `dtype` (as a kernel op: SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR).
pub fn check_supported(dtype: DType, op: ReduceOp) -> Result<()> {
    match op {
        ReduceOp::Avg | ReduceOp::PremulSum => Err(Error::invalid(format!(
            "ReduceOp.{} is not an elementwise kernel op (it runs as SUM followed by a scale)",
            op.name()
        ))),
        ReduceOp::Sum | ReduceOp::Product => Ok(()),
        ReduceOp::Min | ReduceOp::Max if dtype.is_complex() => Err(unsupported(dtype, op)),
        ReduceOp::Min | ReduceOp::Max => Ok(()),
        ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor
            if dtype.is_float() || dtype.is_complex() =>
        {
            Err(unsupported(dtype, op))
        }
        ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => Ok(()),
    }
}

/// `dst[i] = dst[i] op src[i]` for every element; both slices hold whole elements of `dtype`
/// and have the same length.
pub fn reduce_into(dtype: DType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> Result<()> {
    reduce_into_with(Isa::for_dtype(dtype), dtype, op, dst, src)
}

/// [`reduce_into`] on the kernels of `isa` (an error where the CPU lacks it): every path gives
/// the same bytes.
pub fn reduce_into_with(
    isa: Isa,
    dtype: DType,
    op: ReduceOp,
    dst: &mut [u8],
    src: &[u8],
) -> Result<()> {
    let isa = isa.checked()?;
    check_supported(dtype, op)?;
    if dst.len() != src.len() {
        return Err(Error::invalid(format!(
            "reduce: buffers differ in length ({} vs {} bytes)",
            dst.len(),
            src.len()
        )));
    }
    if !dst.len().is_multiple_of(dtype.size()) {
        return Err(Error::invalid(format!(
            "reduce: {} bytes is not a whole number of {} elements",
            dst.len(),
            dtype.name()
        )));
    }
    use ReduceOp::*;
    match dtype {
        DType::F32 => float::<f32>(isa, op, dst, src),
        DType::F64 => float::<f64>(isa, op, dst, src),
        DType::F16 => f16_float(isa, op, dst, src),
        DType::BF16 => bf16_float(isa, op, dst, src),
        DType::I8 => integer::<i8>(isa, op, dst, src),
        DType::I16 => integer::<i16>(isa, op, dst, src),
        DType::I32 => integer::<i32>(isa, op, dst, src),
        DType::I64 => integer::<i64>(isa, op, dst, src),
        DType::U8 => integer::<u8>(isa, op, dst, src),
        DType::Bool => match op {
            Sum | Max | Bor => zip::<u8>(isa, dst, src, |a, b| ((a | b) != 0) as u8),
            Product | Min | Band => zip::<u8>(isa, dst, src, |a, b| (a != 0 && b != 0) as u8),
            Bxor => zip::<u8>(isa, dst, src, |a, b| ((a != 0) != (b != 0)) as u8),
            Avg | PremulSum => unreachable!("rejected by check_supported"),
        },
        // Complex SUM is a SUM over the interleaved real components.
        DType::C64 if op == Sum => zip::<f32>(isa, dst, src, |a, b| a + b),
        DType::C128 if op == Sum => zip::<f64>(isa, dst, src, |a, b| a + b),
        DType::C64 => zip::<C64>(isa, dst, src, |a, b| {
            [a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0]]
        }),
        DType::C128 => zip::<C128>(isa, dst, src, |a, b| {
            [a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0]]
        }),
    }
    Ok(())
}

/// Multiplies every element by `factor` (for AVG and PREMUL_SUM on floating/complex types).
pub fn scale(dtype: DType, buf: &mut [u8], factor: f64) -> Result<()> {
    if !buf.len().is_multiple_of(dtype.size()) {
        return Err(Error::invalid(format!(
            "scale: {} bytes is not a whole number of {} elements",
            buf.len(),
            dtype.name()
        )));
    }
    // Complex numbers scale by a real factor componentwise. The product is formed in f64 so
    // that e.g. AVG's 1/3 rounds once, like a division would.
    match dtype {
        DType::F32 | DType::C64 => map::<f32>(buf, |x| (x as f64 * factor) as f32),
        DType::F64 | DType::C128 => map::<f64>(buf, |x| x * factor),
        DType::F16 => map::<f16>(buf, |x| f16::from_f64(x.to_f64() * factor)),
        DType::BF16 => map::<bf16>(buf, |x| bf16::from_f64(x.to_f64() * factor)),
        _ => {
            return Err(Error::Runtime(format!(
                "scaling (ReduceOp.AVG / PREMUL_SUM) is not supported for {}",
                dtype.name()
            )))
        }
    }
    Ok(())
}

/// SUM, PRODUCT, MIN, MAX on an IEEE float type. MIN/MAX propagate NaN, like `torch.minimum`.
#[inline(always)]
fn float<T: Pod + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>>(
    isa: Isa,
    op: ReduceOp,
    dst: &mut [u8],
    src: &[u8],
) {
    match op {
        ReduceOp::Sum => zip::<T>(isa, dst, src, |a, b| a + b),
        ReduceOp::Product => zip::<T>(isa, dst, src, |a, b| a * b),
        ReduceOp::Min => zip::<T>(isa, dst, src, min_nan),
        ReduceOp::Max => zip::<T>(isa, dst, src, max_nan),
        _ => unreachable!("rejected by check_supported"),
    }
}

/// The integer ops on a primitive integer type; SUM and PRODUCT wrap.
trait Int: Pod + Ord {
    fn wadd(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
}

macro_rules! impl_int {
    ($($t:ty),*) => {$(
        impl Int for $t {
            #[inline(always)]
            fn wadd(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)]
            fn wmul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)]
            fn and(self, o: Self) -> Self { self & o }
            #[inline(always)]
            fn or(self, o: Self) -> Self { self | o }
            #[inline(always)]
            fn xor(self, o: Self) -> Self { self ^ o }
        }
    )*};
}
impl_int!(i8, i16, i32, i64, u8);

#[inline(always)]
fn integer<T: Int>(isa: Isa, op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    match op {
        ReduceOp::Sum => zip::<T>(isa, dst, src, T::wadd),
        ReduceOp::Product => zip::<T>(isa, dst, src, T::wmul),
        ReduceOp::Min => zip::<T>(isa, dst, src, Ord::min),
        ReduceOp::Max => zip::<T>(isa, dst, src, Ord::max),
        ReduceOp::Band => zip::<T>(isa, dst, src, T::and),
        ReduceOp::Bor => zip::<T>(isa, dst, src, T::or),
        ReduceOp::Bxor => zip::<T>(isa, dst, src, T::xor),
        ReduceOp::Avg | ReduceOp::PremulSum => unreachable!("rejected by check_supported"),
    }
}

/// `buf[i] = f(buf[i])` over `T` elements stored in a byte buffer.
#[inline(always)]
fn map<T: Pod>(buf: &mut [u8], f: impl Fn(T) -> T + Copy) {
    let apply = |xs: &mut [T]| {
        for x in xs.iter_mut() {
            *x = f(*x);
        }
    };
    if let Ok(xs) = bytemuck::try_cast_slice_mut::<u8, T>(buf) {
        apply(xs);
        return;
    }
    let bytes = BLOCK * std::mem::size_of::<T>();
    let mut a = [T::zeroed(); BLOCK];
    for c in buf.chunks_mut(bytes) {
        let a = &mut a[..c.len() / std::mem::size_of::<T>()];
        bytemuck::cast_slice_mut::<T, u8>(a).copy_from_slice(c);
        apply(a);
        c.copy_from_slice(bytemuck::cast_slice::<T, u8>(a));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random bytes (splitmix64).
    pub(super) fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                (z ^ (z >> 31)) as u8
            })
            .collect()
    }

    /// Values that are meaningful for `dtype` (bools 0/1, finite floats).
    fn values(dtype: DType, numel: usize, seed: u64) -> Vec<u8> {
        let raw = bytes(numel * dtype.size(), seed);
        let f = |i: usize| ((raw[i] % 17) as f64 - 8.0) * 0.75;
        let mut out = Vec::with_capacity(raw.len());
        for i in 0..numel {
            match dtype {
                DType::Bool => out.push(raw[i] & 1),
                DType::F32 => out.extend((f(i) as f32).to_le_bytes()),
                DType::F64 => out.extend(f(i).to_le_bytes()),
                DType::F16 => out.extend(f16::from_f64(f(i)).to_le_bytes()),
                DType::BF16 => out.extend(bf16::from_f64(f(i)).to_le_bytes()),
                DType::C64 => {
                    out.extend((f(i) as f32).to_le_bytes());
                    out.extend((f(i + 1) as f32).to_le_bytes());
                }
                DType::C128 => {
                    out.extend(f(i).to_le_bytes());
                    out.extend(f(i + 1).to_le_bytes());
                }
                _ => {
                    let s = dtype.size();
                    out.extend_from_slice(&raw[i * s..(i + 1) * s]);
                }
            }
        }
        out
    }

    /// Scalar reference of one element, written independently of the kernels.
    fn scalar(dtype: DType, op: ReduceOp, a: &[u8], b: &[u8]) -> Vec<u8> {
        use ReduceOp::*;
        macro_rules! int {
            ($t:ty) => {{
                let x = <$t>::from_le_bytes(a.try_into().unwrap());
                let y = <$t>::from_le_bytes(b.try_into().unwrap());
                let r = match op {
                    Sum => x.wrapping_add(y),
                    Product => x.wrapping_mul(y),
                    Min => x.min(y),
                    Max => x.max(y),
                    Band => x & y,
                    Bor => x | y,
                    Bxor => x ^ y,
                    _ => unreachable!(),
                };
                r.to_le_bytes().to_vec()
            }};
        }
        macro_rules! flt {
            ($t:ty) => {{
                let x = <$t>::from_le_bytes(a.try_into().unwrap());
                let y = <$t>::from_le_bytes(b.try_into().unwrap());
                let r = match op {
                    Sum => x + y,
                    Product => x * y,
                    Min => {
                        if x.is_nan() || y.is_nan() {
                            <$t>::NAN
                        } else if y < x {
                            y
                        } else {
                            x
                        }
                    }
                    Max => {
                        if x.is_nan() || y.is_nan() {
                            <$t>::NAN
                        } else if y > x {
                            y
                        } else {
                            x
                        }
                    }
                    _ => unreachable!(),
                };
                r.to_le_bytes().to_vec()
            }};
        }
        match dtype {
            DType::I8 => int!(i8),
            DType::I16 => int!(i16),
            DType::I32 => int!(i32),
            DType::I64 => int!(i64),
            DType::U8 => int!(u8),
            DType::F32 => flt!(f32),
            DType::F64 => flt!(f64),
            DType::F16 => flt!(f16),
            DType::BF16 => flt!(bf16),
            DType::Bool => {
                let (x, y) = (a[0] != 0, b[0] != 0);
                let r = match op {
                    Sum | Max | Bor => x || y,
                    Product | Min | Band => x && y,
                    Bxor => x != y,
                    _ => unreachable!(),
                };
                vec![r as u8]
            }
            DType::C64 | DType::C128 => {
                let h = dtype.size() / 2;
                let comp = |s: &[u8]| -> f64 {
                    if h == 4 {
                        f32::from_le_bytes(s.try_into().unwrap()) as f64
                    } else {
                        f64::from_le_bytes(s.try_into().unwrap())
                    }
                };
                let (ar, ai, br, bi) = (comp(&a[..h]), comp(&a[h..]), comp(&b[..h]), comp(&b[h..]));
                let (r, i) = match op {
                    Sum => (ar + br, ai + bi),
                    Product => (ar * br - ai * bi, ar * bi + ai * br),
                    _ => unreachable!(),
                };
                if h == 4 {
                    [(r as f32).to_le_bytes(), (i as f32).to_le_bytes()].concat()
                } else {
                    [r.to_le_bytes(), i.to_le_bytes()].concat()
                }
            }
        }
    }

    fn supported_ops(dtype: DType) -> Vec<ReduceOp> {
        ReduceOp::ALL
            .into_iter()
            .filter(|&op| check_supported(dtype, op).is_ok())
            .collect()
    }

    #[test]
    fn kernels_match_scalar_reference_aligned_and_misaligned() {
        // Lengths cross the block size; offsets 0 and 1 hit the in-place and the copy paths.
        for dtype in DType::ALL {
            for op in supported_ops(dtype) {
                for numel in [0, 1, 7, BLOCK - 1, BLOCK + 3, 3 * BLOCK + 5] {
                    let a = values(dtype, numel, 1);
                    let b = values(dtype, numel, 2);
                    let s = dtype.size();
                    let mut want = Vec::new();
                    for i in 0..numel {
                        want.extend(scalar(
                            dtype,
                            op,
                            &a[i * s..(i + 1) * s],
                            &b[i * s..(i + 1) * s],
                        ));
                    }
                    for (isa, (da, sa)) in Isa::supported_all()
                        .into_iter()
                        .flat_map(|i| [(0, 0), (1, 0), (0, 1), (1, 3)].map(|o| (i, o)))
                    {
                        let mut dst = vec![0u8; a.len() + 8];
                        let mut src = vec![0u8; b.len() + 8];
                        dst[da..da + a.len()].copy_from_slice(&a);
                        src[sa..sa + b.len()].copy_from_slice(&b);
                        let (d, sr) = (&mut dst[da..da + a.len()], &src[sa..sa + b.len()]);
                        reduce_into_with(isa, dtype, op, d, sr).unwrap();
                        assert_eq!(
                            d,
                            &want[..],
                            "{dtype:?} {op:?} numel {numel} off {da},{sa} {isa:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_path_gives_the_same_half_precision_bytes() {
        // Every f16/bf16 against a shuffle of every one: NaNs, infinities,
        // overflow, subnormal inputs, and (bf16 PRODUCT of small values) subnormal f32 results,
        // which AVX512_BF16's rounding instruction would flush. Tails of every length < 16.
        let all: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
        let shuffled: Vec<u8> = (0..=u16::MAX)
            .flat_map(|b| b.wrapping_mul(40_503).rotate_left(5).to_le_bytes())
            .collect();
        for dtype in [DType::F16, DType::BF16] {
            for op in supported_ops(dtype) {
                for len in [all.len(), all.len() - 2 * 15, 2 * 9] {
                    let mut want = all[..len].to_vec();
                    reduce_into_with(Isa::Baseline, dtype, op, &mut want, &shuffled[..len])
                        .unwrap();
                    for isa in Isa::supported_all() {
                        let mut got = all[..len].to_vec();
                        reduce_into_with(isa, dtype, op, &mut got, &shuffled[..len]).unwrap();
                        // NaN payloads are not kept alike (which operand's NaN an add
                        // returns differs between vector widths, F16C quiets signalling ones):
                        // a NaN matches any NaN.
                        let nan = |b: &[u8]| {
                            let bits = u16::from_le_bytes([b[0], b[1]]);
                            match dtype {
                                DType::F16 => bits & 0x7C00 == 0x7C00 && bits & 0x03FF != 0,
                                _ => bits & 0x7F80 == 0x7F80 && bits & 0x007F != 0,
                            }
                        };
                        let differ = got
                            .chunks(2)
                            .zip(want.chunks(2))
                            .position(|(g, w)| g != w && !(nan(g) && nan(w)));
                        assert_eq!(differ, None, "{dtype:?} {op:?} {isa:?} len {len}");
                    }
                }
            }
        }
        for isa in Isa::ALL.into_iter().filter(|i| !i.supported()) {
            assert!(reduce_into_with(isa, DType::F32, ReduceOp::Sum, &mut [], &[]).is_err());
        }
    }

    #[test]
    fn float_min_max_propagate_nan() {
        let mut d: Vec<u8> = [1.0f32, f32::NAN]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let s: Vec<u8> = [f32::NAN, 2.0f32]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        reduce_into(DType::F32, ReduceOp::Max, &mut d, &s).unwrap();
        let r: &[f32] = bytemuck::cast_slice(&d);
        assert!(r[0].is_nan() && r[1].is_nan());
    }

    #[test]
    fn unsupported_combinations_are_rejected() {
        let e = check_supported(DType::F32, ReduceOp::Band).unwrap_err();
        assert_eq!(
            e,
            Error::Runtime("ReduceOp.BAND is not supported for float32".into())
        );
        let e = check_supported(DType::C64, ReduceOp::Max).unwrap_err();
        assert_eq!(
            e,
            Error::Runtime("ReduceOp.MAX is not supported for complex64".into())
        );
        for dtype in [DType::F16, DType::BF16, DType::F64, DType::C128] {
            for op in [ReduceOp::Band, ReduceOp::Bor, ReduceOp::Bxor] {
                assert!(matches!(check_supported(dtype, op), Err(Error::Runtime(_))));
            }
        }
        for dtype in DType::ALL {
            for op in [ReduceOp::Avg, ReduceOp::PremulSum] {
                assert!(matches!(
                    check_supported(dtype, op),
                    Err(Error::InvalidArgument(_))
                ));
                let mut d = vec![0u8; dtype.size()];
                assert!(reduce_into(dtype, op, &mut d, &[0u8; 16][..dtype.size()]).is_err());
            }
        }
        let mut d = vec![0u8; 8];
        let e = reduce_into(DType::I32, ReduceOp::Sum, &mut d, &[0u8; 4]).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)));
        let e = reduce_into(DType::I32, ReduceOp::Sum, &mut d[..6], &[0u8; 6]).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)));
    }

    #[test]
    fn scale_floats_and_complex_rejects_integers() {
        let mut f: Vec<u8> = [3.0f32, -6.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        scale(DType::F32, &mut f, 1.0 / 3.0).unwrap();
        let got: Vec<f32> = f
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![1.0, -2.0]);
        // Misaligned complex128 buffer.
        let mut c = [0u8; 33];
        for (i, x) in [1.0f64, -2.0].iter().enumerate() {
            c[1 + 8 * i..9 + 8 * i].copy_from_slice(&x.to_le_bytes());
        }
        scale(DType::C128, &mut c[1..17], 0.5).unwrap();
        assert_eq!(f64::from_le_bytes(c[1..9].try_into().unwrap()), 0.5);
        assert_eq!(f64::from_le_bytes(c[9..17].try_into().unwrap()), -1.0);
        let mut h: Vec<u8> = [f16::from_f32(3.0), f16::from_f32(1.5)]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        scale(DType::F16, &mut h, 2.0).unwrap();
        assert_eq!(
            h,
            [f16::from_f32(6.0), f16::from_f32(3.0)]
                .map(|x| x.to_le_bytes())
                .concat()
        );
        let mut b = bf16::from_f32(3.0).to_le_bytes().to_vec();
        scale(DType::BF16, &mut b, 0.25).unwrap();
        assert_eq!(b, bf16::from_f32(0.75).to_le_bytes());
        for dtype in [
            DType::I8,
            DType::I16,
            DType::I32,
            DType::I64,
            DType::U8,
            DType::Bool,
        ] {
            let mut v = vec![0u8; dtype.size()];
            assert!(matches!(scale(dtype, &mut v, 2.0), Err(Error::Runtime(_))));
        }
    }
}
