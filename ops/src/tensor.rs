//! Tensors: typed, shaped views of a byte range in one buffer.
//!
//! Tensors are row-major and contiguous; the last dimension is innermost.
//! A view of some rows is another tensor over a sub-range of the same bytes,
//! so the byte ranges a node declares follow directly from its tensors.

use crate::dtype::DType;
use crate::OpError;
use std::fmt;
use weft_graph::{BufferId, ByteRange};

/// Up to four dimensions, outermost first.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    dims: [usize; 4],
    rank: u8,
}

impl Shape {
    /// A shape from 1 to 4 dimensions.
    pub fn new(dims: &[usize]) -> Shape {
        assert!(
            (1..=4).contains(&dims.len()),
            "a shape has 1 to 4 dimensions, got {}",
            dims.len()
        );
        let mut d = [1usize; 4];
        d[..dims.len()].copy_from_slice(dims);
        Shape {
            dims: d,
            rank: dims.len() as u8,
        }
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank as usize]
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// Product of all dimensions.
    pub fn elements(&self) -> usize {
        self.dims().iter().product()
    }

    /// Innermost dimension (a row's length).
    pub fn cols(&self) -> usize {
        self.dims[self.rank as usize - 1]
    }

    /// Product of all but the innermost dimension.
    pub fn rows(&self) -> usize {
        self.dims[..self.rank as usize - 1].iter().product()
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

/// A typed, shaped, contiguous view of bytes `offset..offset + bytes()` of a buffer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tensor {
    /// The buffer holding the bytes.
    pub buffer: BufferId,
    /// Byte offset of the first element in the buffer.
    pub offset: u64,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Shape,
}

impl Tensor {
    /// A tensor, checking that rows are whole blocks of `dtype`.
    pub fn new(
        buffer: BufferId,
        offset: u64,
        dtype: DType,
        shape: Shape,
    ) -> Result<Tensor, OpError> {
        let t = Tensor {
            buffer,
            offset,
            dtype,
            shape,
        };
        t.checked_bytes()?;
        Ok(t)
    }

    fn checked_bytes(&self) -> Result<u64, OpError> {
        let row = self.dtype.row_bytes(self.shape.cols()).ok_or_else(|| {
            OpError::Shape(format!(
                "a {} row of {} elements is not a whole number of {}-element blocks",
                self.dtype,
                self.shape.cols(),
                self.dtype.block_len()
            ))
        })?;
        (row as u64)
            .checked_mul(self.shape.rows() as u64)
            .ok_or_else(|| {
                OpError::Shape(format!("tensor {} of {} overflows", self.shape, self.dtype))
            })
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.shape.cols()).unwrap_or(0)
    }

    /// Total bytes.
    pub fn bytes(&self) -> u64 {
        self.row_bytes() as u64 * self.shape.rows() as u64
    }

    /// The byte range this tensor covers.
    pub fn range(&self) -> ByteRange {
        ByteRange::new(self.buffer, self.offset, self.offset + self.bytes())
    }

    /// Number of rows (all but the innermost dimension).
    pub fn rows(&self) -> usize {
        self.shape.rows()
    }

    /// Innermost dimension.
    pub fn cols(&self) -> usize {
        self.shape.cols()
    }

    /// The same bytes with another shape of equal size and row layout.
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor, OpError> {
        let t = Tensor::new(self.buffer, self.offset, self.dtype, Shape::new(dims))?;
        if t.bytes() != self.bytes() {
            return Err(OpError::Shape(format!(
                "cannot reshape {} to {:?}: sizes differ",
                self.shape, dims
            )));
        }
        Ok(t)
    }

    /// Rows `start..start + count` of the outermost dimension... flattened:
    /// the result is 2-D `[count, cols]` over the same bytes.
    pub fn rows_view(&self, start: usize, count: usize) -> Result<Tensor, OpError> {
        if start + count > self.rows() || count == 0 {
            return Err(OpError::Shape(format!(
                "rows {start}..{} are outside a tensor of {} rows",
                start + count,
                self.rows()
            )));
        }
        Tensor::new(
            self.buffer,
            self.offset + (start * self.row_bytes()) as u64,
            self.dtype,
            Shape::new(&[count, self.cols()]),
        )
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{:?}@{}+{}",
            self.dtype, self.shape, self.buffer, self.offset
        )
    }
}
