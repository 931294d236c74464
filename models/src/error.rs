use crate::gguf::GgufError;
use weft_ops::OpError;
use weft_runtime::RuntimeError;

/// Errors of model loading and running.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Op(#[from] OpError),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("[weft-models] the model file has no tensor `{0}`")]
    MissingTensor(String),
    #[error("[weft-models] {0}")]
    Shape(String),
    #[error("[weft-models] unsupported model: {0}")]
    Unsupported(String),
    #[error("[weft-models] {0}")]
    Input(String),
    /// A metadata value outside the range where it means something.
    #[error("[weft-models] metadata key `{key}` is {value}; accepted: {accepted}")]
    Metadata {
        key: String,
        value: String,
        accepted: String,
    },
    /// A tensor of the file that the model family neither uses nor knows
    /// to be unused: the metadata and the tensors disagree.
    #[error("[weft-models] tensor `{name}` of the file is not used by the {arch} model its metadata describes ({why})")]
    UnusedTensor {
        name: String,
        arch: String,
        why: String,
    },
    /// A computed value that is NaN or infinite.
    #[error("[weft-models] not finite: {what} holds {value} at index {index}{hint}")]
    NonFinite {
        what: String,
        value: f32,
        index: usize,
        hint: &'static str,
    },
}
