//! Element types, including GGUF's block-quantized formats.
//!
//! A quantized type stores `block_len` weights in `block_bytes` bytes; a row
//! of `n` weights must be a whole number of blocks. Ids are GGUF's
//! `ggml_type` numbers.

use serde::Serialize;
use std::fmt;

/// Every tensor type weft can name. Which ones a backend computes with is up
/// to the backend; the GGUF reader accepts all of them.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// IEEE half float.
    F16,
    /// bfloat16.
    BF16,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer (ids, positions).
    I32,
    /// 64-bit integer.
    I64,
    /// 64-bit float.
    F64,
    /// 4-bit blocks of 32, one f16 scale.
    Q4_0,
    /// 4-bit blocks of 32, f16 scale and minimum.
    Q4_1,
    /// 5-bit blocks of 32, one f16 scale.
    Q5_0,
    /// 5-bit blocks of 32, f16 scale and minimum.
    Q5_1,
    /// 8-bit blocks of 32, one f16 scale.
    Q8_0,
    /// 8-bit blocks of 32, f16 scale and scaled sum (activations).
    Q8_1,
    /// 2-bit super-blocks of 256.
    Q2_K,
    /// 3-bit super-blocks of 256.
    Q3_K,
    /// 4-bit super-blocks of 256 with 6-bit sub-block scales and minimums.
    Q4_K,
    /// 5-bit super-blocks of 256.
    Q5_K,
    /// 6-bit super-blocks of 256 with 8-bit sub-block scales.
    Q6_K,
    /// 8-bit super-blocks of 256, f32 scale and 16-element sums (activations).
    Q8_K,
    /// 2.06-bit importance quants (named, not computed with).
    IQ2_XXS,
    /// 4-bit microscaling floats (named, not computed with).
    MXFP4,
}

impl DType {
    /// All types, for iteration in tests and tables.
    pub const ALL: [DType; 22] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F64,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::IQ2_XXS,
        DType::MXFP4,
    ];

    /// GGUF / ggml type id.
    pub fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q8_1 => 9,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::Q8_K => 15,
            DType::IQ2_XXS => 16,
            DType::I8 => 24,
            DType::I16 => 25,
            DType::I32 => 26,
            DType::I64 => 27,
            DType::F64 => 28,
            DType::BF16 => 30,
            DType::MXFP4 => 39,
        }
    }

    /// The type with GGUF id `id`, if weft knows it.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// Weights per block (1 for plain types).
    pub fn block_len(self) -> usize {
        match self {
            DType::F32
            | DType::F16
            | DType::BF16
            | DType::I8
            | DType::I16
            | DType::I32
            | DType::I64
            | DType::F64 => 1,
            DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q8_1
            | DType::MXFP4 => 32,
            DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::Q8_K
            | DType::IQ2_XXS => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::I8 => 1,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 | DType::F64 => 8,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q8_1 => 36,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::Q8_K => 292,
            DType::IQ2_XXS => 66,
            DType::MXFP4 => 17,
        }
    }

    /// True for block-quantized formats.
    pub fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole
    /// number of blocks or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_len()) {
            return None;
        }
        (n / self.block_len()).checked_mul(self.block_bytes())
    }

    /// Lower-case name as GGUF tools print it (`q4_1`, `f32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F64 => "f64",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q8_1 => "q8_1",
            DType::Q2_K => "q2_k",
            DType::Q3_K => "q3_k",
            DType::Q4_K => "q4_k",
            DType::Q5_K => "q5_k",
            DType::Q6_K => "q6_k",
            DType::Q8_K => "q8_k",
            DType::IQ2_XXS => "iq2_xxs",
            DType::MXFP4 => "mxfp4",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_rows_need_whole_blocks() {
        for t in DType::ALL {
            assert_eq!(DType::from_ggml_id(t.ggml_id()), Some(t));
        }
        assert_eq!(DType::from_ggml_id(4), None);
        assert_eq!(DType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(DType::Q4_K.row_bytes(576), None);
        assert_eq!(DType::F32.row_bytes(3), Some(12));
    }
}
