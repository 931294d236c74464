//! weft-kernels: the kernels of every backend, one module per backend with the
//! same file names in each (`cpu/matmul.rs`, `cuda/matmul.rs`, ...).
//!
//! Every backend's kernels answer the runtime through one trait,
//! [`Kernels`] (supports, scratch, launch).
//!
//! Invariant: a kernel knows nothing about caches, pools or models; it gets
//! typed memory and parameters and computes one op.

pub mod cpu;
mod kernel_set;
mod numerics;

#[cfg(feature = "cuda")]
pub use kernel_set::CudaTarget;
#[cfg(all(feature = "metal", target_os = "macos"))]
pub use kernel_set::MetalTarget;
pub use kernel_set::{CpuItem, CpuKernels, Kernels};
pub use numerics::{Numerics, UnknownNumerics};
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(all(feature = "metal", target_os = "macos"))]
pub mod metal;
