//! Weights as tensors: the GGUF file is mapped once into a read-only buffer
//! of the executor and every weight is a view into it (no copy on the CPU).
//! The map remembers which tensors a model family took, so the loader can
//! refuse a file whose tensors its metadata does not account for.

use crate::gguf::{GgufBytes, GgufFile, TensorInfo};
use crate::ModelError;
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Arc;
use weft_graph::BufferId;
use weft_ops::{DType, Shape, Tensor};
use weft_runtime::{GraphExecutor, HostBytes};

impl HostBytes for GgufBytes {
    fn host_bytes(&self) -> &[u8] {
        self
    }
}

/// Tensors of one GGUF file, mapped into an executor.
pub struct WeightMap<'f> {
    file: &'f GgufFile,
    buffer: BufferId,
    /// Names of the tensors handed out so far.
    used: RefCell<HashSet<String>>,
}

impl<'f> WeightMap<'f> {
    /// Maps `file` into `exec` as one read-only buffer (uploaded once to a GPU).
    pub fn new(file: &'f GgufFile, exec: &mut GraphExecutor) -> Result<WeightMap<'f>, ModelError> {
        let buffer = exec.map_bytes(Arc::new(file.shared_bytes()), "weights")?;
        Ok(WeightMap {
            file,
            buffer,
            used: RefCell::new(HashSet::new()),
        })
    }

    /// The weight `name`, shaped outermost-first (GGUF's dims reversed).
    pub fn get(&self, name: &str) -> Result<Tensor, ModelError> {
        let info = self
            .file
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        self.tensor(info)
    }

    /// The weight `name` if the file has it.
    pub fn optional(&self, name: &str) -> Result<Option<Tensor>, ModelError> {
        self.file
            .tensor(name)
            .map(|info| self.tensor(info))
            .transpose()
    }

    /// The weight `name`, checked to have `dims` (outermost first).
    pub fn expect(&self, name: &str, dims: &[usize]) -> Result<Tensor, ModelError> {
        let t = self.get(name)?;
        if t.shape.dims() != dims {
            return Err(ModelError::Shape(format!(
                "tensor `{name}` has shape {:?}, expected {dims:?}",
                t.shape.dims()
            )));
        }
        Ok(t)
    }

    /// The tensors of the file no `get`, `optional` or `expect` took, in
    /// file order.
    pub fn unused(&self) -> Vec<&'f TensorInfo> {
        let used = self.used.borrow();
        self.file
            .tensors()
            .iter()
            .filter(|t| !used.contains(&t.name))
            .collect()
    }

    fn tensor(&self, info: &TensorInfo) -> Result<Tensor, ModelError> {
        self.used.borrow_mut().insert(info.name.clone());
        let dims: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
        if dims.is_empty() || dims.len() > 4 {
            return Err(ModelError::Shape(format!(
                "tensor `{}` has {} dimensions",
                info.name,
                dims.len()
            )));
        }
        let t = Tensor::new(self.buffer, info.offset, info.dtype, Shape::new(&dims))
            .map_err(|e| ModelError::Shape(format!("tensor `{}`: {e}", info.name)))?;
        if t.bytes() != info.bytes {
            return Err(ModelError::Shape(format!(
                "tensor `{}`: {} bytes for shape {dims:?} of {}",
                info.name, info.bytes, info.dtype
            )));
        }
        Ok(t)
    }

    /// The file the weights come from.
    pub fn file(&self) -> &GgufFile {
        self.file
    }
}

/// The output projection `output`, checked against the token embedding:
/// one row per token of the same vocabulary, `hidden` columns.
pub(crate) fn check_output(
    output: Tensor,
    token_embd: Tensor,
    hidden: usize,
) -> Result<Tensor, ModelError> {
    if output.rows() != token_embd.rows() || output.cols() != hidden {
        return Err(ModelError::Shape(format!(
            "output.weight has shape {:?}, expected [{}, {hidden}] (the vocabulary of token_embd.weight by the hidden size)",
            output.shape.dims(),
            token_embd.rows()
        )));
    }
    if !is_supported_matrix(output.dtype) {
        return Err(ModelError::Unsupported(format!(
            "output.weight is {}",
            output.dtype
        )));
    }
    Ok(output)
}

/// True for weight types the CPU backend multiplies with.
pub fn is_supported_matrix(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F16
            | DType::BF16
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q8_0
            | DType::Q4_K
            | DType::Q6_K
    )
}
