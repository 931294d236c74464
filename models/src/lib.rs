//! weft-models: loading GGUF files, tokenizers, and model families written
//! against weft's builder API.
//!
//! Invariant: model code records nodes; it never calls a kernel.

pub mod fetch;
pub mod gguf;
pub mod tokenizer;
