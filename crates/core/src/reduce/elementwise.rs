//! The loops every kernel runs in: element by element over byte buffers viewed as `T`, in place
//! where aligned, through stack blocks where not, compiled for the path chosen ([`Isa`]); and
//! the NaN-propagating min and max.

use bytemuck::Pod;

use super::isa::Isa;

/// Elements per stack block (misaligned fallback and half-precision widening).
pub(super) const BLOCK: usize = 1024;

#[inline(always)]
#[allow(clippy::eq_op)] // `a != a` is the generic NaN test.
pub(super) fn min_nan<T: PartialOrd + Copy>(a: T, b: T) -> T {
    if a < b || a != a {
        a
    } else {
        b
    }
}

#[inline(always)]
#[allow(clippy::eq_op)]
pub(super) fn max_nan<T: PartialOrd + Copy>(a: T, b: T) -> T {
    if a > b || a != a {
        a
    } else {
        b
    }
}

/// `dst[i] = f(dst[i], src[i])` over `T` elements stored in byte buffers.
#[inline(always)]
pub(super) fn zip<T: Pod>(isa: Isa, dst: &mut [u8], src: &[u8], f: impl Fn(T, T) -> T + Copy) {
    zip_blocks::<T>(isa, dst, src, |d, s| {
        for (x, y) in d.iter_mut().zip(s) {
            *x = f(*x, *y);
        }
    })
}

/// Runs `kernel` over the typed views of `dst` and `src`: in place when both are aligned for
/// `T`, otherwise through aligned stack copies, one block at a time. `isa` is one the CPU runs.
#[inline(always)]
pub(super) fn zip_blocks<T: Pod>(
    isa: Isa,
    dst: &mut [u8],
    src: &[u8],
    kernel: impl Fn(&mut [T], &[T]),
) {
    if let (Ok(d), Ok(s)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        run_kernel(isa, d, s, &kernel);
        return;
    }
    let bytes = BLOCK * std::mem::size_of::<T>();
    let mut a = [T::zeroed(); BLOCK];
    let mut b = [T::zeroed(); BLOCK];
    for (dc, sc) in dst.chunks_mut(bytes).zip(src.chunks(bytes)) {
        let k = dc.len() / std::mem::size_of::<T>();
        let (a, b) = (&mut a[..k], &mut b[..k]);
        bytemuck::cast_slice_mut::<T, u8>(a).copy_from_slice(dc);
        bytemuck::cast_slice_mut::<T, u8>(b).copy_from_slice(sc);
        run_kernel(isa, a, b, &kernel);
        dc.copy_from_slice(bytemuck::cast_slice::<T, u8>(a));
    }
}

/// Runs `kernel` compiled for `isa` (one the CPU runs): LLVM vectorises it at that width.
#[inline(always)]
fn run_kernel<T>(isa: Isa, d: &mut [T], s: &[T], kernel: &impl Fn(&mut [T], &[T])) {
    with_isa(isa, || kernel(d, s))
}

/// Runs `f` compiled for `isa`, which must be one the CPU runs (`Isa::checked`): `f` is
/// inlined into a function with those target features.
#[inline(always)]
pub(super) fn with_isa<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 | Isa::Avx512Bf16 => {
            #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
            unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            // SAFETY: callers pass an `isa` the CPU runs.
            return unsafe { avx512(f) };
        }
        Isa::Avx2 => {
            #[target_feature(enable = "avx2,f16c")]
            unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            // SAFETY: as above.
            return unsafe { avx2(f) };
        }
        Isa::Baseline => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    f()
}
