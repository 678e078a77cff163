//! Half precision (f16, bf16): reductions through f32, pairwise (`reduce_into`'s kernels) and
//! over many contributions at once ([`reduce_in_f32`]), and the conversions they share.

use half::f16;
#[cfg(not(target_arch = "aarch64"))]
use half::slice::HalfFloatSliceExt;

use super::elementwise::{max_nan, min_nan, with_isa, zip, zip_blocks, BLOCK};
use super::isa::Isa;
use crate::error::{Error, Result};
use crate::types::{DType, ReduceOp};

/// Whether [`reduce_in_f32`] is how `n` contributions of `dtype` reduce with `op`: SUM and
/// PRODUCT of f16/bf16 from three or more contributions (two round once either way).
pub fn accumulates_in_f32(dtype: DType, op: ReduceOp, n: usize) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
        && matches!(op, ReduceOp::Sum | ReduceOp::Product)
        && n > 2
}

/// `dst = part(0) op part(1) op ... op part(n - 1)`, accumulated in f32 and rounded once (to
/// nearest even), as torch's CPU `sum` of a half-precision tensor does: a pairwise fold would
/// round after every contribution, and bf16 keeps 8 bits. For the (dtype, op, n) of
/// [`accumulates_in_f32`]; every part holds `dst.len()` bytes.
pub fn reduce_in_f32<'a>(
    dtype: DType,
    op: ReduceOp,
    dst: &mut [u8],
    n: usize,
    part: impl Fn(usize) -> &'a [u8],
) -> Result<()> {
    reduce_in_f32_with(Isa::for_dtype(dtype), dtype, op, dst, n, part)
}

/// [`reduce_in_f32`] on the kernels of `isa` (an error where the CPU lacks it).
pub fn reduce_in_f32_with<'a>(
    isa: Isa,
    dtype: DType,
    op: ReduceOp,
    dst: &mut [u8],
    n: usize,
    part: impl Fn(usize) -> &'a [u8],
) -> Result<()> {
    let isa = isa.checked()?;
    if !accumulates_in_f32(dtype, op, n) {
        return Err(Error::Runtime(format!(
            "reduce_in_f32: not for {} {op:?} of {n} contributions",
            dtype.name()
        )));
    }
    if (0..n).any(|p| part(p).len() != dst.len()) || !dst.len().is_multiple_of(2) {
        return Err(Error::invalid(format!(
            "reduce: every contribution must hold {} bytes of whole 2-byte elements",
            dst.len()
        )));
    }
    // Compiled for `isa`, as the pairwise kernels are (`run_kernel`).
    with_isa(isa, || accumulate(isa, dtype, op, dst, n, &part));
    Ok(())
}

/// [`reduce_in_f32`]'s work, on checked arguments: block by block, the contributions widened
/// and folded into an f32 accumulator, rounded once into `dst`.
#[inline(always)]
fn accumulate<'a>(
    isa: Isa,
    dtype: DType,
    op: ReduceOp,
    dst: &mut [u8],
    n: usize,
    part: &impl Fn(usize) -> &'a [u8],
) {
    let (mut acc, mut next) = ([0f32; BLOCK], [0f32; BLOCK]);
    for (i, d) in dst.chunks_mut(2 * BLOCK).enumerate() {
        let at = i * 2 * BLOCK..i * 2 * BLOCK + d.len();
        let k = d.len() / 2;
        let acc = &mut acc[..k];
        widen(isa, dtype, &part(0)[at.clone()], acc);
        for p in 1..n {
            let bytes = &part(p)[at.clone()];
            match (dtype, bytemuck::try_cast_slice::<u8, u16>(bytes)) {
                // bf16 widens with a shift: fused into the accumulation, one pass.
                (DType::BF16, Ok(bits)) if op == ReduceOp::Sum => acc
                    .iter_mut()
                    .zip(bits)
                    .for_each(|(a, &b)| *a += bf16_to_f32(b)),
                (DType::BF16, Ok(bits)) => acc
                    .iter_mut()
                    .zip(bits)
                    .for_each(|(a, &b)| *a *= bf16_to_f32(b)),
                _ => {
                    let next = &mut next[..k];
                    widen(isa, dtype, bytes, next);
                    if op == ReduceOp::Sum {
                        acc.iter_mut().zip(&*next).for_each(|(a, b)| *a += *b);
                    } else {
                        acc.iter_mut().zip(&*next).for_each(|(a, b)| *a *= *b);
                    }
                }
            }
        }
        narrow(isa, dtype, acc, d);
    }
}

/// `bytes` (f16 or bf16) as f32, in vectorised loops where they are aligned.
#[inline(always)]
fn widen(isa: Isa, dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match (dtype, bytemuck::try_cast_slice::<u8, u16>(bytes)) {
        (DType::BF16, Ok(bits)) => out
            .iter_mut()
            .zip(bits)
            .for_each(|(x, &b)| *x = bf16_to_f32(b)),
        (_, Ok(bits)) => f16_to_f32s(isa, bytemuck::cast_slice::<u16, f16>(bits), out),
        (_, Err(_)) => out
            .iter_mut()
            .zip(bytes.chunks_exact(2))
            .for_each(|(x, b)| {
                let bits = u16::from_le_bytes([b[0], b[1]]);
                *x = match dtype {
                    DType::BF16 => bf16_to_f32(bits),
                    _ => f16::from_bits(bits).to_f32(),
                }
            }),
    }
}

/// `values` rounded (to nearest even) into `bytes` as f16 or bf16.
#[inline(always)]
fn narrow(isa: Isa, dtype: DType, values: &[f32], bytes: &mut [u8]) {
    match (dtype, bytemuck::try_cast_slice_mut::<u8, u16>(bytes)) {
        (DType::BF16, Ok(bits)) => bits
            .iter_mut()
            .zip(values)
            .for_each(|(b, &x)| *b = f32_to_bf16(x)),
        (_, Ok(bits)) => f32s_to_f16(isa, values, bytemuck::cast_slice_mut::<u16, f16>(bits)),
        (_, Err(_)) => bytes.chunks_exact_mut(2).zip(values).for_each(|(b, &x)| {
            let bits = match dtype {
                DType::BF16 => f32_to_bf16(x),
                _ => f16::from_f32(x).to_bits(),
            };
            b.copy_from_slice(&bits.to_le_bytes());
        }),
    }
}

/// f16: widen blocks to f32, apply the f32 op, round back (SUM and PRODUCT in registers with
/// AVX-512).
pub(super) fn f16_float(isa: Isa, op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    if sum_or_product_avx512(isa, DType::F16, op, dst, src) {
        return;
    }
    match op {
        ReduceOp::Sum => zip_blocks::<f16>(isa, dst, src, |d, s| widened(isa, d, s, |a, b| a + b)),
        ReduceOp::Product => {
            zip_blocks::<f16>(isa, dst, src, |d, s| widened(isa, d, s, |a, b| a * b))
        }
        ReduceOp::Min => zip_blocks::<f16>(isa, dst, src, |d, s| widened(isa, d, s, min_nan)),
        ReduceOp::Max => zip_blocks::<f16>(isa, dst, src, |d, s| widened(isa, d, s, max_nan)),
        _ => unreachable!("rejected by check_supported"),
    }
}

/// SUM or PRODUCT of f16 or bf16 by the AVX-512 kernels (`avx512.rs`) where `isa` has them;
/// false where it does not or for another op.
#[inline(always)]
fn sum_or_product_avx512(isa: Isa, dtype: DType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 && matches!(op, ReduceOp::Sum | ReduceOp::Product) {
        let bf16_instruction = isa >= Isa::Avx512Bf16;
        zip_blocks::<u16>(isa, dst, src, |d, s| {
            // SAFETY: callers pass an `isa` the CPU runs, here one with AVX-512 (and
            // AVX512_BF16 for the instruction).
            unsafe { super::avx512::sum_or_product(dtype, op, d, s, bf16_instruction) }
        });
        return true;
    }
    let _ = (isa, dtype, op, dst, src);
    false
}

#[inline(always)]
fn widened(isa: Isa, dst: &mut [f16], src: &[f16], f: impl Fn(f32, f32) -> f32 + Copy) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: the CPU has the features the function is compiled with.
        unsafe { widened_f16c(dst, src, f) };
        return;
    }
    let mut a = [0f32; BLOCK];
    let mut b = [0f32; BLOCK];
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        let (a, b) = (&mut a[..d.len()], &mut b[..d.len()]);
        f16_to_f32s(isa, d, a);
        f16_to_f32s(isa, s, b);
        for (x, y) in a.iter_mut().zip(b.iter()) {
            *x = f(*x, *y);
        }
        f32s_to_f16(isa, a, d);
    }
}

/// `widened` with F16C conversions of whole blocks and an AVX f32 loop: the `half` crate's
/// slice conversions call a non-inlinable function per 8 elements, which halves throughput.
///
/// # Safety
/// The CPU must support AVX and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn widened_f16c(dst: &mut [f16], src: &[f16], f: impl Fn(f32, f32) -> f32 + Copy) {
    let mut a = [0f32; BLOCK];
    let mut b = [0f32; BLOCK];
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        let (a, b) = (&mut a[..d.len()], &mut b[..d.len()]);
        // SAFETY: this function's features are the callees'.
        unsafe { (f16_to_f32_f16c(d, a), f16_to_f32_f16c(s, b)) };
        for (x, y) in a.iter_mut().zip(b.iter()) {
            *x = f(*x, *y);
        }
        // SAFETY: as above.
        unsafe { f32_to_f16_f16c(a, d) };
    }
}

/// `src` as f32 into `out` (as long), 8 elements per F16C conversion.
///
/// # Safety
/// The CPU must support AVX and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
#[inline]
unsafe fn f16_to_f32_f16c(src: &[f16], out: &mut [f32]) {
    use std::arch::x86_64::{_mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let v = src.len() / 8 * 8;
    for i in (0..v).step_by(8) {
        // SAFETY: i + 8 <= v <= the length of src and of out; unaligned loads and stores.
        unsafe {
            let x = _mm_loadu_si128(src.as_ptr().add(i).cast());
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(x));
        }
    }
    for i in v..src.len() {
        out[i] = src[i].to_f32();
    }
}

/// `values` rounded to f16 (nearest even, like `f16::from_f32`) into `out` (as long), 8 elements
/// per F16C conversion.
///
/// # Safety
/// The CPU must support AVX and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
#[inline]
unsafe fn f32_to_f16_f16c(values: &[f32], out: &mut [f16]) {
    use std::arch::x86_64::{
        _mm256_cvtps_ph, _mm256_loadu_ps, _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };
    let v = values.len() / 8 * 8;
    for i in (0..v).step_by(8) {
        // SAFETY: i + 8 <= v <= the length of values and of out; unaligned loads and stores.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(
                values.as_ptr().add(i),
            ));
            _mm_storeu_si128(out.as_mut_ptr().add(i).cast(), h);
        }
    }
    for i in v..values.len() {
        out[i] = f16::from_f32(values[i]);
    }
}

/// f16 to f32: 16 elements per AVX-512 conversion, 8 per F16C one, with NEON on aarch64.
#[inline(always)]
fn f16_to_f32s(isa: Isa, src: &[f16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: callers pass an `isa` the CPU runs.
        unsafe { super::avx512::f16_to_f32(bytemuck::cast_slice(src), out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: as above; the CPUs with AVX2 (`Isa::Avx2`) have F16C.
        unsafe { f16_to_f32_f16c(src, out) };
        return;
    }
    let _ = isa;
    #[cfg(target_arch = "aarch64")]
    f16_to_f32_neon(src, out);
    #[cfg(not(target_arch = "aarch64"))]
    src.convert_to_f32_slice(out);
}

/// f32 to f16 (nearest even): 16 elements per AVX-512 conversion, 8 per F16C one, with NEON
/// on aarch64.
#[inline(always)]
fn f32s_to_f16(isa: Isa, values: &[f32], out: &mut [f16]) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: callers pass an `isa` the CPU runs.
        unsafe { super::avx512::f32_to_f16(values, bytemuck::cast_slice_mut(out)) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: as above; the CPUs with AVX2 (`Isa::Avx2`) have F16C.
        unsafe { f32_to_f16_f16c(values, out) };
        return;
    }
    let _ = isa;
    #[cfg(target_arch = "aarch64")]
    f32_to_f16_neon(values, out);
    #[cfg(not(target_arch = "aarch64"))]
    out.convert_from_f32_slice(values);
}

// aarch64: FCVTL/FCVTN convert half precision in Advanced SIMD on every aarch64 CPU (ARMv8.0,
// no run-time check), 8 elements per pair. `half` converts with them only where the CPU has
// FEAT_FP16 (half-precision arithmetic, which conversion does not need), and then through a
// call per 4 elements it cannot inline, as on x86; else in software. Inline assembly: the
// f16 NEON intrinsics are unstable. Rounding is FPCR's, nearest even unless a program changed
// it (as F16C's _MM_FROUND_TO_NEAREST_INT).

/// `src` as f32 into `out` (as long), 8 elements per FCVTL/FCVTL2 pair.
#[cfg(target_arch = "aarch64")]
#[inline]
fn f16_to_f32_neon(src: &[f16], out: &mut [f32]) {
    use std::arch::aarch64::{float32x4_t, vld1q_u16, vst1q_f32};
    use std::arch::asm;
    let v = src.len().min(out.len()) / 8 * 8;
    for i in (0..v).step_by(8) {
        // SAFETY: i + 8 <= v <= the length of src and of out (unaligned loads and stores are
        // fine); the instructions are baseline aarch64 and touch only the registers named.
        unsafe {
            let h = vld1q_u16(src.as_ptr().add(i).cast());
            let (lo, hi): (float32x4_t, float32x4_t);
            asm!(
                "fcvtl {lo:v}.4s, {h:v}.4h",
                "fcvtl2 {hi:v}.4s, {h:v}.8h",
                h = in(vreg) h,
                lo = out(vreg) lo,
                hi = out(vreg) hi,
                options(pure, nomem, nostack, preserves_flags),
            );
            vst1q_f32(out.as_mut_ptr().add(i), lo);
            vst1q_f32(out.as_mut_ptr().add(i + 4), hi);
        }
    }
    for i in v..src.len().min(out.len()) {
        out[i] = src[i].to_f32();
    }
}

/// `values` rounded to f16 into `out` (as long), 8 elements per FCVTN/FCVTN2 pair.
#[cfg(target_arch = "aarch64")]
#[inline]
fn f32_to_f16_neon(values: &[f32], out: &mut [f16]) {
    use std::arch::aarch64::{uint16x8_t, vld1q_f32, vst1q_u16};
    use std::arch::asm;
    let v = values.len().min(out.len()) / 8 * 8;
    for i in (0..v).step_by(8) {
        // SAFETY: as in f16_to_f32_neon; `h` is written whole by FCVTN (low half, high half
        // zeroed) before FCVTN2 fills its high half.
        unsafe {
            let lo = vld1q_f32(values.as_ptr().add(i));
            let hi = vld1q_f32(values.as_ptr().add(i + 4));
            let h: uint16x8_t;
            asm!(
                "fcvtn {h:v}.4h, {lo:v}.4s",
                "fcvtn2 {h:v}.8h, {hi:v}.4s",
                lo = in(vreg) lo,
                hi = in(vreg) hi,
                h = out(vreg) h,
                options(pure, nomem, nostack, preserves_flags),
            );
            vst1q_u16(out.as_mut_ptr().add(i).cast(), h);
        }
    }
    for i in v..values.len().min(out.len()) {
        out[i] = f16::from_f32(values[i]);
    }
}

/// bf16: the f32 op between widened operands, rounded back, element by element (SUM and
/// PRODUCT by the AVX-512 kernels where `isa` has them).
pub(super) fn bf16_float(isa: Isa, op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    if sum_or_product_avx512(isa, DType::BF16, op, dst, src) {
        return;
    }
    #[inline(always)]
    fn via_f32(f: impl Fn(f32, f32) -> f32 + Copy) -> impl Fn(u16, u16) -> u16 + Copy {
        move |a, b| f32_to_bf16(f(bf16_to_f32(a), bf16_to_f32(b)))
    }
    match op {
        ReduceOp::Sum => zip::<u16>(isa, dst, src, via_f32(|a, b| a + b)),
        ReduceOp::Product => zip::<u16>(isa, dst, src, via_f32(|a, b| a * b)),
        ReduceOp::Min => zip::<u16>(isa, dst, src, via_f32(min_nan)),
        ReduceOp::Max => zip::<u16>(isa, dst, src, via_f32(max_nan)),
        _ => unreachable!("rejected by check_supported"),
    }
}

#[inline(always)]
fn bf16_to_f32(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
}

/// Same result as `half::bf16::from_f32` (round to nearest even, NaN kept quiet), written
/// without branches so that the loop around it vectorises.
#[inline(always)]
fn f32_to_bf16(v: f32) -> u16 {
    let x = v.to_bits();
    // Signed compare: SSE2 has no unsigned one, and the masked value is non-negative.
    let nan = (x & 0x7FFF_FFFF) as i32 > 0x7F80_0000;
    // Adding 0x7FFF plus the lowest kept bit carries into bit 16 exactly when RNE rounds up.
    let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
    let quiet = (x >> 16) | 0x0040;
    (if nan { quiet } else { rounded }) as u16
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;
    use crate::reduce::reduce_into;
    use crate::reduce::tests::bytes;

    #[test]
    fn bf16_rounding_matches_half_crate() {
        let raw = bytes(4 * 200_000, 9);
        let mut bits: Vec<u32> = raw
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        // Ties, near-overflow, infinities, NaNs with payloads, subnormals.
        bits.extend([
            0x3F80_8000,
            0x3F81_8000,
            0x7F7F_FFFF,
            0x7F7F_8000,
            0x7F80_0000,
            0xFF80_0000,
        ]);
        bits.extend([
            0x7F80_0001,
            0xFFC0_1234,
            0x0000_8000,
            0x0001_8000,
            0x8000_0000,
        ]);
        for b in bits {
            let v = f32::from_bits(b);
            assert_eq!(f32_to_bf16(v), bf16::from_f32(v).to_bits(), "{b:#x}");
            assert_eq!(
                bf16_to_f32(f32_to_bf16(v)).to_bits(),
                bf16::from_f32(v).to_f32().to_bits()
            );
        }
    }

    #[test]
    fn f16_slice_conversions_match_the_scalar_ones() {
        // Every f16 widened; then rounded back, with the f32s halfway to and either side of
        // the next f16 (ties to even, overflow, subnormals) and NaNs with payloads. Lengths
        // not a multiple of 8 take the vector loops' tails too.
        for isa in Isa::supported_all() {
            f16_slice_conversions_on(isa);
        }
    }

    fn f16_slice_conversions_on(isa: Isa) {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut wide = vec![0f32; all.len() - 3];
        f16_to_f32s(isa, &all[..wide.len()], &mut wide);
        for (h, w) in all.iter().zip(&wide) {
            assert_eq!(
                w.to_bits(),
                h.to_f32().to_bits(),
                "{:#x} {isa:?}",
                h.to_bits()
            );
        }
        let raw = bytes(4 * 4096, 5);
        let values: Vec<f32> = [
            0x7F80_0001,
            0xFFC0_1234,
            0x7FBF_E000,
            0x477F_F000,
            0x477F_EFFF,
        ]
        .into_iter()
        .chain(
            raw.chunks(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap())),
        )
        .chain(
            wide.iter()
                .flat_map(|w| [0, 0x0FFF, 0x1000, 0x1001].map(|d| w.to_bits().wrapping_add(d))),
        )
        .map(f32::from_bits)
        .collect();
        let mut narrow = vec![f16::ZERO; values.len() - 3];
        f32s_to_f16(isa, &values[..narrow.len()], &mut narrow);
        for (v, h) in values.iter().zip(&narrow) {
            assert_eq!(
                h.to_bits(),
                f16::from_f32(*v).to_bits(),
                "{:#x}",
                v.to_bits()
            );
        }
    }

    #[test]
    fn half_precision_from_three_or_more_accumulates_in_f32() {
        // Spacing 2 at the first value: 0.75 added pairwise rounds away each time.
        for (dtype, big) in [(DType::BF16, 256.0f32), (DType::F16, 2048.0)] {
            let enc = |x: f32| match dtype {
                DType::BF16 => bf16::from_f32(x).to_le_bytes(),
                _ => f16::from_f32(x).to_le_bytes(),
            };
            let n = BLOCK + 3; // a whole block and a partial one
            let parts: Vec<Vec<u8>> = [big, 0.75, 0.75, 0.75]
                .iter()
                .map(|&x| enc(x).repeat(n))
                .collect();
            assert!(!accumulates_in_f32(dtype, ReduceOp::Sum, 2));
            assert!(!accumulates_in_f32(dtype, ReduceOp::Max, 4));
            assert!(!accumulates_in_f32(DType::F32, ReduceOp::Sum, 4));
            for (k, want) in [(3, big + 2.0), (4, big + 2.0)] {
                let mut dst = vec![0u8; 2 * n];
                for isa in Isa::supported_all() {
                    reduce_in_f32_with(isa, dtype, ReduceOp::Sum, &mut dst, k, |p| &parts[p])
                        .unwrap();
                    assert_eq!(dst, enc(want).repeat(n), "{dtype:?} of {k} {isa:?}");
                }
                assert_eq!(dst, enc(want).repeat(n), "{dtype:?} of {k}");
                let mut pairwise = parts[0].clone();
                for p in &parts[1..k] {
                    reduce_into(dtype, ReduceOp::Sum, &mut pairwise, p).unwrap();
                }
                assert_eq!(pairwise, enc(big).repeat(n), "pairwise rounds away");
                // Misaligned contributions and destination take the element-wise path.
                let shifted: Vec<Vec<u8>> =
                    parts.iter().map(|p| [&[0u8][..], p].concat()).collect();
                let mut dst = vec![0u8; 2 * n + 1];
                reduce_in_f32(dtype, ReduceOp::Sum, &mut dst[1..], k, |p| &shifted[p][1..])
                    .unwrap();
                assert_eq!(
                    dst[1..],
                    enc(want).repeat(n),
                    "{dtype:?} of {k}, misaligned"
                );
            }
            let mut dst = vec![0u8; 2 * n];
            let e = reduce_in_f32(dtype, ReduceOp::Sum, &mut dst, 2, |p| &parts[p]);
            assert!(e.is_err());
        }
    }
}
