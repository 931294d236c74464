//! Softmax-gated MoE routing (Qwen 3 MoE): each row's top-k router
//! probabilities and their renormalised values, as llama.cpp computes
//! them (`argsort_top_k`, `get_rows`, `sum_rows` in order, the sum clamped
//! below at the smallest normal f16, one division per weight).

use super::HostTensor;

/// The smallest sum the renormalisation divides by.
const NORM_FLOOR: f32 = 6.103_515_6e-5;

/// Ids of the `k` largest values of each row in `rows`, descending, ties
/// to the lower id.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn top_k(
    probs: &HostTensor,
    out: &HostTensor,
    k: usize,
    rows: std::ops::Range<usize>,
) {
    let e = probs.tensor.cols();
    let v = probs.f32s();
    let o = out.ptr as *mut i32;
    let mut order: Vec<usize> = Vec::with_capacity(e);
    for r in rows {
        let row = &v[r * e..(r + 1) * e];
        order.clear();
        order.extend(0..e);
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for (j, &i) in order[..k].iter().enumerate() {
            *o.add(r * k + j) = i as i32;
        }
    }
}

/// `probs[ids]` for each row in `rows`, renormalised when `normalize`.
///
/// # Safety
/// See [`super::run_item`]; the ids are checked against the row width.
pub(super) unsafe fn gather(
    probs: &HostTensor,
    ids: &HostTensor,
    out: &HostTensor,
    normalize: bool,
    rows: std::ops::Range<usize>,
) -> Result<(), weft_ops::OpError> {
    let e = probs.tensor.cols();
    let k = ids.tensor.cols();
    let v = probs.f32s();
    let sel = std::slice::from_raw_parts(ids.ptr as *const i32, ids.tensor.shape.elements());
    let o = out.f32_rows_mut(rows.start, rows.len());
    for (i, r) in rows.enumerate() {
        let dst = &mut o[i * k..(i + 1) * k];
        for (d, &id) in dst.iter_mut().zip(&sel[r * k..(r + 1) * k]) {
            let id = usize::try_from(id)
                .ok()
                .filter(|&id| id < e)
                .ok_or_else(|| {
                    weft_ops::OpError::Shape(format!(
                        "moe_gather: expert id {id} outside {e} experts"
                    ))
                })?;
            *d = v[r * e + id];
        }
        if normalize {
            let sum = dst.iter().sum::<f32>().max(NORM_FLOOR);
            dst.iter_mut().for_each(|d| *d /= sum);
        }
    }
    Ok(())
}
