/// Errors of the op layer: shapes, types and parameters a builder call refuses.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("[weft-ops] shape: {0}")]
    Shape(String),
    #[error("[weft-ops] `{op}` does not support {what}")]
    Unsupported { op: &'static str, what: String },
    #[error("[weft-ops] bad parameter for `{op}`: {message}")]
    Param { op: &'static str, message: String },
    #[error(transparent)]
    Graph(#[from] weft_graph::GraphError),
    #[error("[weft-ops] recording refused: {0}")]
    Record(String),
}
