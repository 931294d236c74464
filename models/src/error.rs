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
}
