//! weft-ops: the op set.
//!
//! Each op is declared once: its parameters and shape/dtype rules ([`op`]),
//! the builder method a model calls to record it ([`builder`]), and a plain
//! reference implementation that every backend is tested against
//! ([`reference`](mod@reference)). Block-quantized formats live in [`quant`].
//!
//! Invariant: weft-ops knows nothing about devices, threads or caches; it
//! records nodes through the [`builder::Recorder`] trait a runtime implements.

#![warn(missing_docs)]

pub mod dtype;
mod error;
pub mod fused;
pub mod launch;
pub mod quant;
pub mod tensor;

pub use dtype::DType;
pub use error::OpError;
pub use tensor::{Shape, Tensor};
pub mod builder;
pub mod family;
pub mod op;
pub mod reference;
mod rules;

pub use builder::{Builder, Recorder};
pub use family::{
    CompressParams, HcMixParams, IndexerParams, MoeRouteParams, MoeSelect, MoeWeightsParams,
    OpFamily, SinkAttentionParams, TailRopeParams, YarnScaling,
};
pub use op::{
    AttentionParams, Op, OpNode, ProjAttentionParams, ProjWrite, RopeMode, RopeParams, RowsWrite,
};
