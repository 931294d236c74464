//! The family-module ops ([`weft_ops::OpFamily`]) on CUDA against the CPU kernels, on fresh random
//! inputs: one module per kernel family (`cuda_family_ops/*.rs`). Skipped without
//! a GPU (failures with `WEFT_TEST_REQUIRE_CUDA=1`); `WEFT_TEST_CUDA_DRY_RUN=1` runs
//! the CPU side only, to check the harness.

#![cfg(feature = "cuda")]

mod cuda_common;

#[path = "cuda_family_ops/compress.rs"]
mod compress;
#[path = "cuda_family_ops/hyper.rs"]
mod hyper;
#[path = "cuda_family_ops/matmul_id.rs"]
mod matmul_id;
#[path = "cuda_family_ops/moe.rs"]
mod moe;
#[path = "cuda_family_ops/sink_attention.rs"]
mod sink_attention;
#[path = "cuda_family_ops/tail_rope.rs"]
mod tail_rope;
