//! Which float order a Q4_K / Q6_K product is summed in.
//!
//! llama.cpp's x86 CPU backend does not multiply K-quant weights with one
//! kernel: it picks, per matmul, between `ggml_vec_dot_*_q8_K`, the
//! CPU_REPACK `q4_K_8x8` gemv/gemm kernels and the tiled (VNNI) matmul,
//! and each sums the same exact integers into f32 in its own order. To
//! give llama.cpp's bits, weft picks the same way, from the same facts:
//! the weight's row count, the number of activation rows `n` of the call
//! (llama.cpp's `src1->ne[1]`), and for Q4_K the activation row's index.
//!
//! | weights | condition | order |
//! |---|---|---|
//! | Q4_K | weight rows % 8 == 0, row `t < n - n % 4` | [`DotOrder::RepackGemm`] |
//! | Q4_K | weight rows % 8 == 0, the last `n % 4` rows | [`DotOrder::RepackGemv`] |
//! | Q4_K | weight rows % 8 != 0, `n >= 8` | [`DotOrder::Tiled`] |
//! | Q6_K | `n >= 8` | [`DotOrder::Tiled`] |
//! | Q4_K, Q6_K | otherwise | [`DotOrder::VecDot`] |
//! | every other format | always | [`DotOrder::VecDot`] |
//!
//! (llama.cpp's `ggml_repack_get_optimal_repack_type`: Q4_K weights with a
//! multiple of 8 rows are repacked on AVX2 machines, and a repacked weight
//! is never tiled; `forward_mul_mat_one_chunk`: activation rows in groups
//! of four through the gemm kernel, the rest one by one through gemv;
//! `ggml_tiled_min_batch`: the tiled matmul from 8 activation rows.)
//!
//! `scalar.rs` spells out each order; every path follows them bit for bit.

use weft_ops::DType;

/// Activation rows from which llama.cpp's tiled matmul takes K-quant
/// products (`ggml_tiled_min_batch`).
pub(crate) const TILED_MIN_ROWS: usize = 8;

/// Q4_K weights whose row count is a multiple of this are repacked
/// (`q4_K_8x8_q8_K`: eight interleaved rows).
pub(crate) const REPACK_WEIGHT_ROWS: usize = 8;

/// The repacked gemm takes activation rows in groups of this many.
pub(crate) const GEMM_GROUP: usize = 4;

/// The float order of one (weight row, activation row) product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DotOrder {
    /// `ggml_vec_dot_*` (AVX2 build): eight f32 lanes, each fed by four
    /// elements of every 32-element chunk, one fused multiply-add per block
    /// and lane, reduced with `hsum_float_8`. Every 32-element format, and
    /// the K-quants where nothing below applies.
    VecDot,
    /// `ggml_gemv_q4_K_8x8_q8_K`: per 256-element super-block one exact
    /// integer sum of the scaled dot products and one of the scaled
    /// minimums, each added with one fused multiply-add; the minimums are
    /// subtracted at the end.
    RepackGemv,
    /// `ggml_gemm_q4_K_8x8_q8_K`: the same, one fused multiply-add per 64
    /// elements.
    RepackGemm,
    /// The tiled matmul (`tiled_run_micro_vnni_8x16`): per super-block the
    /// exact integer sum, scaled by the weight's `d` (Q4_K: minus
    /// `dmin * mins` in one fused step), then multiplied by the
    /// activation's `d` and added with one fused multiply-add.
    Tiled,
}

impl DotOrder {
    /// The order llama.cpp uses for `wdtype` weights of `weight_rows` rows
    /// times activation row `t` of a call with `n` activation rows.
    pub fn of(wdtype: DType, weight_rows: usize, n: usize, t: usize) -> DotOrder {
        let tiled = n >= TILED_MIN_ROWS;
        match wdtype {
            DType::Q4_K if weight_rows.is_multiple_of(REPACK_WEIGHT_ROWS) => {
                if t < n - n % GEMM_GROUP {
                    DotOrder::RepackGemm
                } else {
                    DotOrder::RepackGemv
                }
            }
            DType::Q4_K | DType::Q6_K if tiled => DotOrder::Tiled,
            _ => DotOrder::VecDot,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_follow_llama_cpp_dispatch() {
        use DotOrder::*;
        let q4 = |rows, n, t| DotOrder::of(DType::Q4_K, rows, n, t);
        assert_eq!(q4(640, 1, 0), RepackGemv);
        assert_eq!(q4(640, 7, 3), RepackGemm);
        assert_eq!(q4(640, 7, 4), RepackGemv);
        assert_eq!(q4(640, 512, 511), RepackGemm);
        assert_eq!(q4(644, 7, 0), VecDot);
        assert_eq!(q4(644, 8, 0), Tiled);
        assert_eq!(DotOrder::of(DType::Q6_K, 640, 7, 0), VecDot);
        assert_eq!(DotOrder::of(DType::Q6_K, 640, 8, 7), Tiled);
        assert_eq!(DotOrder::of(DType::Q8_0, 640, 64, 0), VecDot);
    }
}
