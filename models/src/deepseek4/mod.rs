//! DeepSeek-V4 (`general.architecture = deepseek4`, Flash and Pro):
//! hyper-connections (hc residual streams mixed by Sinkhorn-normalised
//! matrices), attention over a sliding window plus compressed rows (CSA:
//! overlapping ratio-4 rows chosen by a lightning indexer; HCA: every
//! ratio-128 row) with attention sinks, a grouped low-rank output
//! projection, and a hash-routed / top-k mixture of experts with clamped
//! SwiGLU.
//!
//! Files: `config.rs` (metadata), `reference.rs` (a plain f64 forward pass,
//! the specification the recorded forward pass is tested against).

pub mod config;
pub mod reference;

pub use config::{Dsv4Config, LayerKind};
pub use reference::{RefModel, RefOutput};
