//! Rotary embedding of the last `n_dims` of each head in interleaved pairs
//! (DeepSeek-V4), forward or inverse, with precomputed (YaRN) frequencies:
//! the angle is one f32 product `p * f`, as PyTorch computes it.

use super::family::i32s;
use super::HostTensor;
use weft_ops::OpError;
use weft_ops::TailRopeParams;

/// # Safety
/// See [`super::run_item`]. `out` may alias `x` (each row is read before it is written).
pub(super) unsafe fn tail_rope(
    x: &HostTensor,
    positions: &HostTensor,
    out: &HostTensor,
    p: &TailRopeParams,
    rows: std::ops::Range<usize>,
) -> Result<(), OpError> {
    let cols = x.tensor.cols();
    let pos = i32s(positions);
    let (src, dst) = (x.ptr as *const f32, out.ptr as *mut f32);
    let freqs = p.inv_freq();
    let nope = p.head_dim - p.n_dims;
    let mut angles = Vec::with_capacity(freqs.len());
    for r in rows {
        p.angles(&freqs, pos[r], &mut angles);
        for head in 0..cols / p.head_dim {
            let base = r * cols + head * p.head_dim;
            for d in 0..nope {
                *dst.add(base + d) = *src.add(base + d);
            }
            for (i, &(c, s)) in angles.iter().enumerate() {
                let j = base + nope + 2 * i;
                let (a, b) = (*src.add(j), *src.add(j + 1));
                *dst.add(j) = a * c - b * s;
                *dst.add(j + 1) = a * s + b * c;
            }
        }
    }
    Ok(())
}
