//! A [`Recorder`] that runs every node at once with the reference
//! semantics: the builder API without a runtime, for op-level tests,
//! doc examples and checking a model's maths on small inputs.

use super::{run, HostMemory};
use crate::builder::Recorder;
use crate::dtype::DType;
use crate::op::OpNode;
use crate::tensor::Tensor;
use crate::OpError;
use weft_graph::Label;

/// Records by executing: `alloc` takes zeroed host memory, `record` runs the
/// node's reference implementation immediately.
///
/// ```
/// use weft_ops::reference::Interpreter;
/// use weft_ops::Builder;
///
/// let mut r = Interpreter::default();
/// let x = r.input_f32(&[2, 4], &[1.0, -2.0, 3.0, 0.5, 0.0, 1.0, 2.0, 3.0])?;
/// let w = r.input_f32(&[4], &[1.0; 4])?;
/// let b = r.input_f32(&[4], &[0.0; 4])?;
/// let h = r.layer_norm(x, w, b, 1e-5, "ln")?;
/// let y = r.gelu(h, "gelu")?;
/// let values = r.read_f32(&y)?;
/// assert_eq!(values.len(), 8);
/// assert_eq!(r.labels(), ["ln", "gelu"]);
/// # Ok::<(), weft_ops::OpError>(())
/// ```
#[derive(Debug, Default)]
pub struct Interpreter {
    memory: HostMemory,
    labels: Vec<String>,
}

impl Interpreter {
    /// An f32 tensor holding `values`.
    pub fn input_f32(&mut self, dims: &[usize], values: &[f32]) -> Result<Tensor, OpError> {
        self.memory.f32_tensor(dims, values)
    }

    /// An i32 tensor holding `values` (ids, positions).
    pub fn input_i32(&mut self, values: &[i32]) -> Result<Tensor, OpError> {
        self.memory
            .tensor(DType::I32, &[values.len()], bytemuck::cast_slice(values))
    }

    /// `t`'s values as f32.
    pub fn read_f32(&self, t: &Tensor) -> Result<Vec<f32>, OpError> {
        self.memory.to_f32(t)
    }

    /// Labels of the nodes run so far, in order.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The host memory behind every tensor.
    pub fn memory(&mut self) -> &mut HostMemory {
        &mut self.memory
    }
}

impl Recorder for Interpreter {
    fn alloc(&mut self, dtype: DType, dims: &[usize]) -> Result<Tensor, OpError> {
        self.memory.zeros(dtype, dims)
    }

    fn record(&mut self, node: OpNode, label: Label) -> Result<(), OpError> {
        run(&node, &mut self.memory)?;
        self.labels.push(label.into_owned());
        Ok(())
    }
}
