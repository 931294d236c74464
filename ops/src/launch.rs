//! What an op says about sharing a kernel launch: decode matvecs that read
//! one activation row with weights of one format and width can be computed
//! by one launch, each node's rows on their own blocks, without changing a
//! bit of any node's result. Whether a backend has such a launch for a
//! format, and how many nodes it takes, is the backend's kernels' answer;
//! which nodes of a level go together is the launch pass's (in the
//! runtime).

use crate::{DType, Op, OpNode};
use weft_graph::BufferId;

/// Nodes of equal keys may share one launch: the same activation row (its
/// bytes and type) and weights of the same format and width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SharedLaunchKey {
    activation: (BufferId, u64, DType),
    weights: (DType, usize),
}

impl OpNode {
    /// The key of a node that may share a launch with others of its key:
    /// a `matmul_rows` node, or a matmul of one activation row; `None` for
    /// every other node.
    pub fn shared_launch_key(&self) -> Option<SharedLaunchKey> {
        let (x, w) = (self.inputs.first()?, self.inputs.get(1)?);
        match self.op {
            Op::MatMulRows { .. } => {}
            Op::MatMul if x.rows() == 1 => {}
            _ => return None,
        }
        Some(SharedLaunchKey {
            activation: (x.buffer, x.offset, x.dtype),
            weights: (w.dtype, w.cols()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Shape, Tensor};

    fn t(buffer: u32, offset: u64, dtype: DType, dims: &[usize]) -> Tensor {
        Tensor::new(BufferId(buffer), offset, dtype, Shape::new(dims)).unwrap()
    }

    fn matmul(x: Tensor, w: Tensor) -> OpNode {
        let out = t(9, 0, DType::F32, &[x.rows(), w.rows()]);
        OpNode::new(Op::MatMul, vec![x, w], vec![out])
    }

    #[test]
    fn one_row_matmuls_of_one_activation_share_a_key() {
        let x = t(1, 64, DType::Q8_0, &[1, 64]);
        let q = matmul(x, t(2, 0, DType::Q4_0, &[64, 64]));
        let k = matmul(x, t(3, 0, DType::Q4_0, &[32, 64]));
        assert!(q.shared_launch_key().is_some());
        assert_eq!(q.shared_launch_key(), k.shared_launch_key());
        // Another activation row, another weight format, several rows.
        let other = matmul(
            t(1, 0, DType::Q8_0, &[1, 64]),
            t(3, 0, DType::Q4_0, &[32, 64]),
        );
        assert_ne!(q.shared_launch_key(), other.shared_launch_key());
        let q8 = matmul(x, t(3, 0, DType::Q8_0, &[32, 64]));
        assert_ne!(q.shared_launch_key(), q8.shared_launch_key());
        let rows = matmul(
            t(1, 0, DType::Q8_0, &[2, 64]),
            t(3, 0, DType::Q4_0, &[32, 64]),
        );
        assert_eq!(rows.shared_launch_key(), None);
        let add = OpNode::new(
            Op::Add,
            vec![t(1, 0, DType::F32, &[1, 8]), t(2, 0, DType::F32, &[1, 8])],
            vec![t(3, 0, DType::F32, &[1, 8])],
        );
        assert_eq!(add.shared_launch_key(), None);
    }
}
