//! AVX-512 kernels of f16 and bf16 SUM and PRODUCT: 16 elements at a time widened to f32 in
//! registers, one f32 operation, rounded once back to nearest even: the bytes of the portable
//! path (`half_precision.rs`) without its block buffers.
//!
//! bf16 rounds with integer operations, or with AVX512_BF16's `vcvtneps2bf16` where the CPU has
//! it. That instruction flushes subnormal f32 results to zero, so a vector holding one takes the
//! integer rounding instead (rare: a sum or product under 2^-126).

use std::arch::x86_64::*;

use crate::types::{DType, ReduceOp};

/// `dst[i] = round(dst[i] op src[i])` over f16 or bf16 bits, `op` SUM or PRODUCT; the slices
/// have the same length.
///
/// # Safety
/// The CPU must have AVX-512 F and BW, and AVX512_BF16 when `bf16_instruction`.
pub(super) unsafe fn sum_or_product(
    dtype: DType,
    op: ReduceOp,
    dst: &mut [u16],
    src: &[u16],
    bf16_instruction: bool,
) {
    let product = op == ReduceOp::Product;
    // SAFETY: the caller's CPU has each function's features.
    unsafe {
        match dtype {
            DType::F16 => f16_loop(dst, src, product),
            _ if bf16_instruction => bf16_loop_instruction(dst, src, product),
            _ => bf16_loop(dst, src, product),
        }
    }
}

/// Elements ahead of its loads that a loop prefetches the source (1 KiB). In an all_reduce
/// the source is a peer's contribution, written by another core just before, whose lines the
/// hardware prefetcher fetches late: a world-2 bf16 one-shot of 8-40 KiB took 20-30% longer
/// without. (The float32 loops gained nothing from it, and lost from 48 KiB.)
const PREFETCH_AHEAD: usize = 512;

/// 16 lanes at a time, unmasked, then a masked step for the tail, around `widen` and `narrow`.
macro_rules! lanes {
    ($dst:ident, $src:ident, $product:ident, $widen:ident, $narrow:ident) => {{
        let n = $dst.len().min($src.len());
        let (dst, src) = ($dst.as_mut_ptr(), $src.as_ptr());
        macro_rules! combine {
            ($d:expr, $s:expr) => {{
                let (a, b) = ($widen($d), $widen($s));
                $narrow(if $product {
                    _mm512_mul_ps(a, b)
                } else {
                    _mm512_add_ps(a, b)
                })
            }};
        }
        let whole = n / 16 * 16;
        let mut i = 0;
        while i < whole {
            // SAFETY: i + 16 <= whole <= n: the unaligned loads and the store are inside both
            // slices (a prefetch may name any address); the functions called have this one's
            // features.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(i + PREFETCH_AHEAD).cast());
                let r = combine!(
                    _mm256_loadu_si256(dst.add(i).cast()),
                    _mm256_loadu_si256(src.add(i).cast())
                );
                _mm256_storeu_si256(dst.add(i).cast(), r);
            }
            i += 16;
        }
        if whole < n {
            let mask = lanes_below(n - whole);
            // SAFETY: the masked loads and store touch only lanes whole + k < n.
            unsafe {
                let r = combine!(
                    _mm256_maskz_loadu_epi16(mask, dst.add(whole).cast()),
                    _mm256_maskz_loadu_epi16(mask, src.add(whole).cast())
                );
                _mm256_mask_storeu_epi16(dst.add(whole).cast(), mask, r);
            }
        }
    }};
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn f16_loop(dst: &mut [u16], src: &[u16], product: bool) {
    lanes!(dst, src, product, widen_f16, narrow_f16)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn bf16_loop(dst: &mut [u16], src: &[u16], product: bool) {
    lanes!(dst, src, product, widen_bf16, narrow_bf16)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn bf16_loop_instruction(dst: &mut [u16], src: &[u16], product: bool) {
    lanes!(dst, src, product, widen_bf16, narrow_bf16_instruction)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn widen_f16(h: __m256i) -> __m512 {
    _mm512_cvtph_ps(h)
}

/// Nearest even, as F16C's conversion and `half::f16::from_f32`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn narrow_f16(x: __m512) -> __m256i {
    _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)
}

/// A bf16 is the top half of an f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn widen_bf16(h: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
}

/// `f32_to_bf16` of `half_precision.rs` in 16 lanes: nearest even by adding 0x7FFF plus the
/// lowest kept bit, NaN kept and made quiet.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn narrow_bf16(x: __m512) -> __m256i {
    let bits = _mm512_castps_si512(x);
    let nan = _mm512_cmpgt_epi32_mask(
        _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF_FFFF)),
        _mm512_set1_epi32(0x7F80_0000),
    );
    let lowest_kept = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
    let bias = _mm512_add_epi32(lowest_kept, _mm512_set1_epi32(0x7FFF));
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, bias));
    let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(0x0040));
    _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet))
}

/// [`narrow_bf16`] in one instruction where no lane is subnormal (which it would flush).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
fn narrow_bf16_instruction(x: __m512) -> __m256i {
    let bits = _mm512_castps_si512(x);
    let zero_exponent = _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7F80_0000));
    let fraction = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x007F_FFFF));
    if zero_exponent & fraction != 0 {
        return narrow_bf16(x);
    }
    // SAFETY: __m256bh and __m256i are both 256 bits of plain data.
    unsafe { std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(x)) }
}

/// The mask of the first `left` of 16 lanes.
#[inline(always)]
fn lanes_below(left: usize) -> __mmask16 {
    if left >= 16 {
        0xFFFF
    } else {
        (1u16 << left) - 1
    }
}

/// f16 bits widened to f32, 16 lanes at a time.
///
/// # Safety
/// The CPU must have AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn f16_to_f32(src: &[u16], out: &mut [f32]) {
    let n = src.len().min(out.len());
    let mut i = 0;
    while i < n {
        let mask = lanes_below(n - i);
        // SAFETY: masked to the lanes below n - i, inside both slices.
        unsafe {
            let h = _mm256_maskz_loadu_epi16(mask, src.as_ptr().add(i).cast());
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), mask, widen_f16(h));
        }
        i += 16;
    }
}

/// f32 rounded to f16 bits (nearest even), 16 lanes at a time.
///
/// # Safety
/// The CPU must have AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn f32_to_f16(values: &[f32], out: &mut [u16]) {
    let n = values.len().min(out.len());
    let mut i = 0;
    while i < n {
        let mask = lanes_below(n - i);
        // SAFETY: masked to the lanes below n - i, inside both slices.
        unsafe {
            let x = _mm512_maskz_loadu_ps(mask, values.as_ptr().add(i));
            _mm256_mask_storeu_epi16(out.as_mut_ptr().add(i).cast(), mask, narrow_f16(x));
        }
        i += 16;
    }
}
