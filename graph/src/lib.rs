//! weft-graph: the recorded op graph.
//!
//! A recording is a list of [`Node`]s, each naming the exact half-open byte
//! ranges it reads and writes. From those ranges alone this crate derives
//! hazards, assigns every node a level with the fewest possible barriers
//! ([`reorder`]), cuts recordings into command buffers ([`cut`]), checks a
//! schedule independently ([`checker`]) and writes dumps ([`dump`]).
//!
//! Invariant: weft-graph knows nothing about devices, kernels or models. An op
//! is just a name here; what it computes lives in `weft-ops`.

pub mod baseline;
pub mod checker;
pub mod cut;
pub mod dot;
pub mod dump;
mod error;
pub mod html;
mod interval;
pub mod node;
pub mod range;
pub mod reorder;
pub mod synth;

pub use error::GraphError;
pub use node::{Label, Node};
pub use range::{BufferId, ByteRange};
pub use reorder::{CommandBufferSchedule, CommandBufferStats, Schedule};
