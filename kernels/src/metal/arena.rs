//! Per-command-buffer memory for what a dispatch needs besides its tensors:
//! small parameter buffers (mlx-native's dispatchers take some parameters
//! as buffers), host bytes a `Write` node copies in, status words, and
//! scratch (a matmul prologue's f32 activations, argmax values).
//!
//! An arena belongs to one command buffer: the runtime resets it (and may
//! reuse it) only after that command buffer has completed, so host writes
//! here never race the GPU.

use super::{view_of, MlxDType};
use mlx_native::{MlxBuffer, MlxDevice};
use weft_ops::OpError;

/// Smallest chunk allocated (larger requests get a chunk of their own size).
const CHUNK_BYTES: usize = 1 << 20;
/// Alignment of every region (Metal's strictest buffer-offset rule).
const ALIGN: usize = 256;

struct Chunk {
    buffer: MlxBuffer,
    len: usize,
    used: usize,
}

/// Bump allocator over shared Metal buffers.
pub struct Arena {
    device: MlxDevice,
    chunks: Vec<Chunk>,
}

impl Arena {
    /// An empty arena on `device` (chunks are allocated on demand).
    pub fn new(device: MlxDevice) -> Arena {
        Arena {
            device,
            chunks: Vec::new(),
        }
    }

    /// Forgets every region, keeping the chunks. Only call once the GPU
    /// work that used them has completed.
    pub fn reset(&mut self) {
        for c in &mut self.chunks {
            c.used = 0;
        }
    }

    /// Bytes held by the arena's chunks.
    pub fn capacity(&self) -> usize {
        self.chunks.iter().map(|c| c.len).sum()
    }

    fn region(&mut self, bytes: usize) -> Result<(usize, usize), OpError> {
        let bytes = bytes.max(4);
        for (i, c) in self.chunks.iter_mut().enumerate() {
            let at = c.used.next_multiple_of(ALIGN);
            if at + bytes <= c.len {
                c.used = at + bytes;
                return Ok((i, at));
            }
        }
        let len = bytes.next_multiple_of(ALIGN).max(CHUNK_BYTES);
        let buffer = self
            .device
            .alloc_buffer(len, MlxDType::U8, vec![len])
            .map_err(|e| {
                OpError::Record(format!(
                    "[weft-kernels::metal] cannot allocate {len} bytes of per-command-buffer memory: {e}"
                ))
            })?;
        self.chunks.push(Chunk {
            buffer,
            len,
            used: bytes,
        });
        Ok((self.chunks.len() - 1, 0))
    }

    /// `bytes` of scratch the GPU writes (contents undefined), as `dtype`.
    pub fn scratch(&mut self, bytes: usize, dtype: MlxDType) -> Result<MlxBuffer, OpError> {
        let (c, at) = self.region(bytes)?;
        view_of(&self.chunks[c].buffer, at as u64, bytes as u64, dtype)
    }

    /// `values` copied into a fresh region, viewed as `dtype`.
    pub fn upload<T: bytemuck::Pod>(
        &mut self,
        values: &[T],
        dtype: MlxDType,
    ) -> Result<MlxBuffer, OpError> {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let (c, at) = self.region(bytes.len())?;
        let chunk = &self.chunks[c];
        let base = chunk.buffer.contents_ptr() as *mut u8;
        // SAFETY: `at..at + len` lies inside the chunk (checked by `region`);
        // the chunk is shared host-visible memory owned by this arena, and no
        // GPU work using it is in flight (arenas are reset only after their
        // command buffer completed), so nothing else reads or writes it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(at), bytes.len()) };
        view_of(&chunk.buffer, at as u64, bytes.len() as u64, dtype)
    }

    /// `bytes` zero bytes, viewed as `dtype`.
    pub fn zeroed(&mut self, bytes: usize, dtype: MlxDType) -> Result<MlxBuffer, OpError> {
        let (c, at) = self.region(bytes)?;
        let chunk = &self.chunks[c];
        let base = chunk.buffer.contents_ptr() as *mut u8;
        // SAFETY: as in `upload`.
        unsafe { std::ptr::write_bytes(base.add(at), 0, bytes) };
        view_of(&chunk.buffer, at as u64, bytes as u64, dtype)
    }
}

/// Reads `n` u32 words from a view (status words) once the GPU is done.
///
/// # Safety
/// No GPU work writing the view may be in flight, and the view must hold
/// at least `n` words.
pub unsafe fn read_u32s(view: &MlxBuffer, n: usize) -> Vec<u32> {
    let base = (view.contents_ptr() as *const u8).add(view.byte_offset() as usize);
    let mut out = vec![0u32; n];
    std::ptr::copy_nonoverlapping(base, out.as_mut_ptr() as *mut u8, n * 4);
    out
}
