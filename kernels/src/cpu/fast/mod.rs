//! CPU kernels of the fast numerics mode: the same ops as the exact kernels
//! beside them (same file names), free to reorder floating-point work.
//! Each states its error bound against the reference semantics; an op
//! without a fast kernel here runs its exact one.

pub(super) mod attention;
pub(super) mod attention_prefill;
#[cfg(target_arch = "x86_64")]
mod lanes;

/// True when the AVX-512 paths run (decided once per process).
#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| matches!(super::quant::Isa::detect(), Ok(super::quant::Isa::Avx512)))
}

/// True when the AVX2 paths run: AVX2 with FMA and F16C, not AVX-512
/// (decided once per process).
#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2.get_or_init(|| matches!(super::quant::Isa::detect(), Ok(super::quant::Isa::Avx2)))
}
