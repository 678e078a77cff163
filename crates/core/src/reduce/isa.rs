//! The instruction set a kernel runs with. The wheel is built for the baseline of its target
//! (x86-64 with SSE2, aarch64 with NEON); kernels compiled for wider vectors are chosen at run
//! time from what the CPU has ([`Isa::best`]). Benches and tests name one to compare paths.

use crate::error::{Error, Result};
use crate::types::DType;

/// Kernel paths, each needing the features of the one before (the CPUs with AVX-512 have
/// AVX2 and F16C).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// The build target's baseline (SSE2 on x86-64; NEON, with its f16 conversions, on aarch64).
    Baseline,
    /// AVX2, with F16C's f16 conversions.
    Avx2,
    /// AVX-512 F, BW and VL: 512-bit vectors, f16 conversions of 16 elements, masked tails.
    Avx512,
    /// AVX-512 with AVX512_BF16's f32 to bf16 rounding instruction.
    Avx512Bf16,
}

impl Isa {
    /// Every path, narrowest first.
    pub const ALL: [Isa; 4] = [Isa::Baseline, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16];

    /// The widest path this CPU runs, detected once (every reduction asks).
    #[inline]
    pub fn best() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(Isa::detect)
    }

    /// The path a reduction of `dtype` takes: f16 and bf16 at the widest the CPU has (their
    /// conversions are the cost, and AVX-512 halves it); the rest at AVX2 width at most, where
    /// they are already cache- and memory-bound from 64 KiB and 512-bit instructions can lower
    /// an Intel core's clock for everything else the rank runs.
    #[inline]
    pub fn for_dtype(dtype: DType) -> Isa {
        match dtype {
            DType::F16 | DType::BF16 => Isa::best(),
            _ => Isa::best().min(Isa::Avx2),
        }
    }

    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
                return if has!("avx512bf16") {
                    Isa::Avx512Bf16
                } else {
                    Isa::Avx512
                };
            }
            if has!("avx2") && has!("f16c") {
                return Isa::Avx2;
            }
        }
        Isa::Baseline
    }

    /// Whether this CPU runs the path.
    pub fn supported(self) -> bool {
        self <= Isa::best()
    }

    /// The paths this CPU runs.
    pub fn supported_all() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.supported()).collect()
    }

    /// `Ok(self)` where this CPU runs the path, else an error naming it.
    pub fn checked(self) -> Result<Isa> {
        if self.supported() {
            Ok(self)
        } else {
            Err(Error::invalid(format!(
                "this CPU cannot run the {} kernels",
                self.name()
            )))
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Baseline => "baseline",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512bf16",
        }
    }
}
