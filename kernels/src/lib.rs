//! weft-kernels: the kernels of every backend, one module per backend with the
//! same file names in each (`cpu/matmul.rs`, `cuda/matmul.rs`, ...).
//!
//! Invariant: a kernel knows nothing about caches, pools or models; it gets
//! typed memory and parameters and computes one op.

pub mod cpu;
mod numerics;

pub use numerics::{Numerics, UnknownNumerics};
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(all(feature = "metal", target_os = "macos"))]
pub mod metal;
