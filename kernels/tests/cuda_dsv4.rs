//! The DeepSeek-V4 ops on CUDA against the CPU kernels, on fresh random
//! inputs: one module per kernel family (`cuda_dsv4/*.rs`). Skipped without
//! a GPU (failures with `WEFT_TEST_REQUIRE_CUDA=1`); `WEFT_TEST_CUDA_DRY_RUN=1` runs
//! the CPU side only, to check the harness.

#![cfg(feature = "cuda")]

mod cuda_common;

#[path = "cuda_dsv4/compress.rs"]
mod compress;
#[path = "cuda_dsv4/hyper.rs"]
mod hyper;
#[path = "cuda_dsv4/matmul_id.rs"]
mod matmul_id;
#[path = "cuda_dsv4/moe.rs"]
mod moe;
#[path = "cuda_dsv4/sink_attention.rs"]
mod sink_attention;
#[path = "cuda_dsv4/tail_rope.rs"]
mod tail_rope;
