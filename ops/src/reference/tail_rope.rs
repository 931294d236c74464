//! Reference of rotary embedding over each head's trailing dimensions
//! (`TailRope`).

use super::{f32_bytes, HostMemory};
use crate::family::TailRopeParams;
use crate::tensor::Tensor;
use crate::OpError;

pub(super) fn tail_rope(
    mem: &HostMemory,
    x: &Tensor,
    pos: &Tensor,
    p: &TailRopeParams,
) -> Result<Vec<u8>, OpError> {
    let mut v = mem.to_f32(x)?;
    let positions = mem.to_i32(pos);
    let freqs = p.inv_freq();
    let nope = p.head_dim - p.n_dims;
    let mut angles = Vec::new();
    for (row, &position) in v.chunks_mut(x.cols()).zip(&positions) {
        p.angles(&freqs, position, &mut angles);
        for head in row.chunks_mut(p.head_dim) {
            for (i, &(c, s)) in angles.iter().enumerate() {
                let j = nope + 2 * i;
                let (a, b) = (head[j] as f64, head[j + 1] as f64);
                let (c, s) = (c as f64, s as f64);
                head[j] = (a * c - b * s) as f32;
                head[j + 1] = (a * s + b * c) as f32;
            }
        }
    }
    Ok(f32_bytes(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::YarnScaling;

    #[test]
    fn inverse_rope_undoes_rope() {
        let mut p = TailRopeParams {
            head_dim: 8,
            n_dims: 4,
            base: 160000.0,
            yarn: Some(YarnScaling {
                factor: 16.0,
                orig_ctx: 65536,
                beta_fast: 32.0,
                beta_slow: 1.0,
            }),
            inverse: false,
        };
        let mut mem = HostMemory::default();
        let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.37 - 2.0).collect();
        let xt = mem.f32_tensor(&[2, 8], &x).unwrap();
        let pos = mem
            .tensor(crate::DType::I32, &[2], bytemuck::cast_slice(&[5i32, 300]))
            .unwrap();
        let y: Vec<f32> = bytemuck::pod_collect_to_vec(&tail_rope(&mem, &xt, &pos, &p).unwrap());
        // The first head_dim - n_dims values pass through.
        assert_eq!(&y[..4], &x[..4]);
        assert_ne!(&y[4..8], &x[4..8]);
        let yt = mem.f32_tensor(&[2, 8], &y).unwrap();
        p.inverse = true;
        let back: Vec<f32> = bytemuck::pod_collect_to_vec(&tail_rope(&mem, &yt, &pos, &p).unwrap());
        for (a, b) in back.iter().zip(&x) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }
}
