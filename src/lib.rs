//! weft: an inference runtime built on recorded op graphs.
//!
//! This facade re-exports the crates a user of the library touches:
//! [`graph`] (recordings, the reorder pass, the checker), [`ops`] (the op set
//! and the builder API), [`kernels`], [`runtime`] (executor, sessions, cache,
//! pools) and [`models`] (GGUF, tokenizers, model families).

pub use weft_graph as graph;
pub use weft_kernels as kernels;
pub use weft_models as models;
pub use weft_ops as ops;
pub use weft_runtime as runtime;

pub mod npy;
pub mod serve;
pub mod settings;
