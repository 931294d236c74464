//! weft-models: loading GGUF files, tokenizers, and model families written
//! against weft's builder API.
//!
//! Invariant: model code records nodes; it never calls a kernel.

mod architecture;
mod batch;
pub mod chat;
pub mod decode;
pub mod deepseek4;
mod error;
pub mod eval;
pub mod fetch;
mod finite;
pub mod gemma3;
pub mod gguf;
pub mod hparams;
pub mod identity;
pub mod llama;
pub mod model;
pub mod sampling;
mod session;
pub mod step;
pub mod tokenizer;
pub mod weights;

pub use error::ModelError;
pub use model::{Family, Model};
pub use step::LogitRows;
