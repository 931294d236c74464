/// Errors of the op layer: shapes, types and parameters a builder call refuses.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// Shapes that do not fit together (the message names the op and shapes).
    #[error("[weft-ops] shape: {0}")]
    Shape(String),
    /// A type or case the op (or a backend's kernel) does not handle.
    #[error("[weft-ops] `{op}` does not support {what}")]
    Unsupported {
        /// The op's name.
        op: &'static str,
        /// What it does not support.
        what: String,
    },
    /// A parameter out of its range.
    #[error("[weft-ops] bad parameter for `{op}`: {message}")]
    Param {
        /// The op's name.
        op: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The graph layer refused the node (for example, inverted byte ranges).
    #[error(transparent)]
    Graph(#[from] weft_graph::GraphError),
    /// The recorder (a runtime session) refused the node.
    #[error("[weft-ops] recording refused: {0}")]
    Record(String),
}
