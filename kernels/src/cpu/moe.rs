//! Mixture-of-experts kernels on the CPU: the indexed (expert) matmul,
//! routing (top-k of biased sqrt-softplus scores, or a hash table), the
//! expert weights, clamped SwiGLU and the weighted combination.
//!
//! The indexed matmul groups the (token, slot) pairs by expert and runs
//! the quantized matmul kernels (`quant::matmul`) once per expert over the
//! gathered activations, so an expert's weight rows stream once per step;
//! formats without a matmul kernel (IQ2_XXS, MXFP4) use the reference dot
//! products of `weft_ops::quant`.

use super::family::i32s;
use super::quant::{self, OutColumns, REFERENCE_WEIGHTS, SUPPORTED_WEIGHTS};
use super::{HostTensor, WorkSplit};
use std::cell::RefCell;
use std::ops::Range;
use weft_ops::quant::vec_dot_type;
use weft_ops::{DType, OpError, Tensor};
use weft_ops::{MoeRouteParams, MoeSelect, MoeWeightsParams};

/// Weight formats the dot products of `weft_ops::quant` cover beyond the
/// matmul kernels'.
fn reference_only(dtype: DType) -> bool {
    matches!(dtype, DType::IQ2_XXS | DType::MXFP4)
}

fn has_kernel(dtype: DType) -> bool {
    SUPPORTED_WEIGHTS.contains(&dtype) || REFERENCE_WEIGHTS.contains(&dtype)
}

pub(super) fn supports(w: &Tensor) -> Result<(), OpError> {
    if has_kernel(w.dtype) || reference_only(w.dtype) {
        return Ok(());
    }
    Err(OpError::Unsupported {
        op: "matmul_id",
        what: format!("{} expert weights on the CPU", w.dtype),
    })
}

/// Split over the rows of each expert matrix.
pub(super) fn split(w: &Tensor, threads: usize) -> WorkSplit {
    let m = w.shape.dims().get(1).copied().unwrap_or(1);
    let per = m
        .div_ceil(threads * 4)
        .max(4)
        .next_multiple_of(4)
        .min(m.max(1));
    WorkSplit::new(m, per)
}

#[derive(Default)]
struct Scratch {
    /// (expert, output row) pairs sorted by expert.
    pairs: Vec<(u32, u32)>,
    act: Vec<u8>,
    out: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Rows `rows` of every selected expert's output.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn matmul_id(
    x: &HostTensor,
    w: &HostTensor,
    ids: &HostTensor,
    out: &HostTensor,
    rows: Range<usize>,
) -> Result<(), OpError> {
    let dims = w.tensor.shape.dims();
    let (experts, m, k) = (dims[0], dims[1], dims[2]);
    let (n, slots) = (ids.tensor.rows(), ids.tensor.cols());
    let wdtype = w.tensor.dtype;
    let adtype = vec_dot_type(wdtype);
    let row_bytes = w.tensor.row_bytes();
    let act_row = adtype.row_bytes(k).ok_or_else(|| {
        OpError::Shape(format!("matmul_id: k = {k} does not fit {adtype} blocks"))
    })?;
    let idv = i32s(ids);
    let xv = x.f32s();
    let wb = w.bytes();
    let o = out.ptr as *mut f32;
    SCRATCH.with(|scratch| {
        let s = &mut *scratch.borrow_mut();
        s.pairs.clear();
        for (pair, &e) in idv.iter().enumerate() {
            if e < 0 || e as usize >= experts {
                return Err(OpError::Param {
                    op: "matmul_id",
                    message: format!("expert id {e} outside 0..{experts}"),
                });
            }
            s.pairs.push((e as u32, pair as u32));
        }
        s.pairs.sort_unstable();
        let mut start = 0;
        while start < s.pairs.len() {
            let e = s.pairs[start].0 as usize;
            let end = start
                + s.pairs[start..]
                    .iter()
                    .take_while(|p| p.0 as usize == e)
                    .count();
            let group = &s.pairs[start..end];
            let ne = group.len();
            s.act.resize(ne * act_row, 0);
            for (j, &(_, pair)) in group.iter().enumerate() {
                let pair = pair as usize;
                let xr = if x.tensor.rows() == n {
                    pair / slots
                } else {
                    pair
                };
                quant::quantize_activations(
                    adtype,
                    &xv[xr * k..(xr + 1) * k],
                    &mut s.act[j * act_row..(j + 1) * act_row],
                )?;
            }
            let we = &wb[e * m * row_bytes..(e + 1) * m * row_bytes];
            s.out.resize(ne * m, 0.0);
            if has_kernel(wdtype) {
                let mut view = OutColumns::from_raw(s.out.as_mut_ptr(), ne, m, rows.clone())?;
                quant::matmul(wdtype, we, k, &s.act, ne, &mut view)?;
            } else {
                for r in rows.clone() {
                    let wrow = &we[r * row_bytes..(r + 1) * row_bytes];
                    for j in 0..ne {
                        let a = &s.act[j * act_row..(j + 1) * act_row];
                        s.out[j * m + r] =
                            weft_ops::quant::vec_dot_reference(wdtype, wrow, adtype, a)?;
                    }
                }
            }
            for (j, &(_, pair)) in group.iter().enumerate() {
                let dst = o.add(pair as usize * m);
                for r in rows.clone() {
                    *dst.add(r) = s.out[j * m + r];
                }
            }
            start = end;
        }
        Ok(())
    })
}

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn route(
    ins: &[HostTensor],
    out: &HostTensor,
    p: &MoeRouteParams,
    rows: Range<usize>,
) -> Result<(), OpError> {
    let e = ins[0].tensor.cols();
    let logits = ins[0].f32s();
    let o = out.ptr as *mut i32;
    for r in rows {
        let dst = std::slice::from_raw_parts_mut(o.add(r * p.k), p.k);
        match p.select {
            MoeSelect::TopK => {
                let bias = ins[1].f32s();
                let ids = weft_ops::reference::route_top_k(&logits[r * e..(r + 1) * e], bias, p.k);
                dst.copy_from_slice(&ids);
            }
            MoeSelect::Hash => {
                let (table, tokens) = (i32s(&ins[1]), i32s(&ins[2]));
                let t = tokens[r];
                let row = usize::try_from(t)
                    .ok()
                    .filter(|&t| t < ins[1].tensor.rows())
                    .ok_or_else(|| OpError::Param {
                        op: "moe_route",
                        message: format!(
                            "token {t} outside the hash table of {} rows",
                            ins[1].tensor.rows()
                        ),
                    })?;
                dst.copy_from_slice(&table[row * p.k..(row + 1) * p.k]);
            }
        }
    }
    Ok(())
}

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn weights(
    logits: &HostTensor,
    ids: &HostTensor,
    out: &HostTensor,
    p: &MoeWeightsParams,
    rows: Range<usize>,
) -> Result<(), OpError> {
    let (e, k) = (logits.tensor.cols(), ids.tensor.cols());
    let (lv, iv) = (logits.f32s(), i32s(ids));
    let o = out.f32_rows_mut(rows.start, rows.len());
    for (i, r) in rows.enumerate() {
        let mut total = 0f64;
        let dst = &mut o[i * k..(i + 1) * k];
        for (j, &id) in iv[r * k..(r + 1) * k].iter().enumerate() {
            let s = usize::try_from(id)
                .ok()
                .filter(|&x| x < e)
                .ok_or_else(|| OpError::Param {
                    op: "moe_weights",
                    message: format!("expert id {id} outside 0..{e}"),
                })?;
            let score = weft_ops::reference::sqrt_softplus(lv[r * e + s]);
            total += score;
            dst[j] = score as f32;
        }
        for v in dst.iter_mut() {
            let w = if p.normalize {
                *v as f64 / total
            } else {
                *v as f64
            };
            *v = (w * p.scale as f64) as f32;
        }
    }
    Ok(())
}

/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn swiglu_clamp(
    gate: &HostTensor,
    up: &HostTensor,
    out: &HostTensor,
    limit: f32,
    rows: Range<usize>,
) -> Result<(), OpError> {
    let cols = gate.tensor.cols();
    let (g, u) = (gate.f32s(), up.f32s());
    let o = out.f32_rows_mut(rows.start, rows.len());
    let span = rows.start * cols..rows.end * cols;
    for ((dst, &g), &u) in o.iter_mut().zip(&g[span.clone()]).zip(&u[span]) {
        let g = g.min(limit);
        *dst = g / (1.0 + (-g).exp()) * u.clamp(-limit, limit);
    }
    Ok(())
}

/// `out = sum_j w[j] y[j]`, plus the shared expert's output when given.
///
/// # Safety
/// See [`super::run_item`].
pub(super) unsafe fn combine(
    ins: &[HostTensor],
    out: &HostTensor,
    rows: Range<usize>,
) -> Result<(), OpError> {
    let (y, w) = (&ins[0], &ins[1]);
    let (yc, k) = (y.tensor.cols(), w.tensor.cols());
    let d = yc / k;
    let (yv, wv) = (y.f32s(), w.f32s());
    let shared = ins.get(2).map(|t| t.f32s());
    let o = out.f32_rows_mut(rows.start, rows.len());
    for (i, r) in rows.enumerate() {
        let dst = &mut o[i * d..(i + 1) * d];
        dst.fill(0.0);
        for j in 0..k {
            let wt = wv[r * k + j];
            let src = &yv[r * yc + j * d..r * yc + (j + 1) * d];
            dst.iter_mut().zip(src).for_each(|(a, b)| *a += wt * b);
        }
        if let Some(s) = shared {
            dst.iter_mut()
                .zip(&s[r * d..(r + 1) * d])
                .for_each(|(a, b)| *a += b);
        }
    }
    Ok(())
}
