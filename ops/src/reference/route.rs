//! Softmax-gated MoE routing: top-k of the router's probabilities and
//! their (renormalised) values.

use super::HostMemory;
use crate::tensor::Tensor;
use crate::OpError;

/// Ids of each row's `k` largest values, descending, ties to the lower id.
pub(super) fn top_k(mem: &HostMemory, probs: &Tensor, k: usize) -> Result<Vec<u8>, OpError> {
    let v = mem.to_f32(probs)?;
    let mut out = Vec::with_capacity(probs.rows() * k);
    for row in v.chunks(probs.cols()) {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        out.extend(order[..k].iter().map(|&i| i as i32));
    }
    Ok(bytemuck::cast_slice(&out).to_vec())
}

/// `probs[ids]` per row, divided by their sum (clamped below at 2^-14)
/// when `normalize`.
pub(super) fn gather(
    mem: &HostMemory,
    probs: &Tensor,
    ids: &Tensor,
    normalize: bool,
) -> Result<Vec<u8>, OpError> {
    let v = mem.to_f32(probs)?;
    let ids = mem.to_i32(ids);
    let (e, k) = (probs.cols(), ids.len() / probs.rows().max(1));
    let mut out = Vec::with_capacity(ids.len());
    for (r, sel) in ids.chunks(k.max(1)).enumerate() {
        let mut w = Vec::with_capacity(k);
        for &i in sel {
            let i = usize::try_from(i).ok().filter(|&i| i < e).ok_or_else(|| {
                OpError::Shape(format!("moe_gather: expert id {i} outside {e} experts"))
            })?;
            w.push(v[r * e + i]);
        }
        if normalize {
            let sum = w.iter().sum::<f32>().max(NORM_FLOOR);
            w.iter_mut().for_each(|x| *x /= sum);
        }
        out.extend(w);
    }
    Ok(super::f32_bytes(out))
}

/// The smallest sum the renormalisation divides by (the smallest normal
/// f16, as llama.cpp clamps it).
pub(super) const NORM_FLOOR: f32 = 6.103_515_6e-5;
