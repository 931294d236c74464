//! Non-finite values, caught before they turn into text.
//!
//! A NaN or an infinity in the logits makes sampling meaningless (an argmax
//! over NaN picks whatever comparison order leaves it), so:
//!
//! - every step's logits are checked on the host, which reads them back
//!   anyway ([`check_logits`]), before anything samples them;
//! - greedy decoding on the device never reads its logits back, so each
//!   step also records their sum (a dot product with a row of ones) beside
//!   the id its argmax chooses: a sum is finite only if every term is (or
//!   the logits are too large to add up, garbage too);
//! - with the finiteness check on ([`crate::Model::set_check_finite`]),
//!   every layer's output is summed the same way into a [`LayerProbe`], and
//!   a step fails naming the first layer whose output is not finite.

use crate::ModelError;
use weft_ops::{Builder, DType, Op, Shape, Tensor};
use weft_runtime::{GraphExecutor, GraphSession};

/// Hint of a non-finite logits error when the layers were not checked.
pub(crate) const LOGITS_HINT: &str = "; the model's weights produce NaN or infinite values \
     (the per-layer check, `weft run --check-finite`, names the first layer)";
/// Hint of a non-finite logits error when every layer's output was finite.
const HEAD_HINT: &str =
    "; every layer's output is finite: the output norm or projection produces them";

/// The hint of a non-finite logits error, by whether the layers were checked.
pub(crate) fn logits_hint(layers_checked: bool) -> &'static str {
    if layers_checked {
        HEAD_HINT
    } else {
        LOGITS_HINT
    }
}

/// Checks `values` (logits read back from a step); `what` describes them,
/// `hint` says where to look.
pub(crate) fn check_logits(
    values: &[f32],
    hint: &'static str,
    what: impl FnOnce() -> String,
) -> Result<(), ModelError> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(index) => Err(ModelError::NonFinite {
            what: what(),
            value: values[index],
            index,
            hint,
        }),
    }
}

/// A persistent row of ones `f32 [1, width]` in `exec`, written once.
pub(crate) fn ones(
    exec: &mut GraphExecutor,
    cache: &std::sync::Mutex<Vec<Tensor>>,
    width: usize,
) -> Result<Tensor, ModelError> {
    let mut known = cache
        .lock()
        .map_err(|_| ModelError::Input("the model's row of ones was poisoned".into()))?;
    if let Some(t) = known.iter().find(|t| t.cols() == width) {
        return Ok(*t);
    }
    let t = exec.named_tensor(
        &format!("check_finite.ones.{width}"),
        DType::F32,
        &[1, width],
    )?;
    exec.write_bytes(&t, bytemuck::cast_slice(&vec![1.0f32; width]))?;
    known.push(t);
    Ok(t)
}

/// Records `sum(x[r, :])` for every row `r` of `x` (f32) into `out`
/// (`f32 [rows, 1]`), with `ones` a row of ones as wide as `x`.
pub(crate) fn record_row_sums(
    s: &mut GraphSession<'_>,
    x: Tensor,
    ones: Tensor,
    out: Tensor,
    label: String,
) -> Result<(), ModelError> {
    s.push(Op::MatMul, vec![x, ones], vec![out], label)?;
    Ok(())
}

/// Per-layer row sums of one step: `f32 [layers, rows]`, layer `l`'s
/// output rows at `l * rows`.
pub(crate) struct LayerProbe {
    ones: Tensor,
    out: Tensor,
    rows: usize,
    layers: usize,
    /// `(layer, rows)` of every layer recorded, in order.
    written: std::cell::RefCell<Vec<(usize, usize)>>,
}

impl LayerProbe {
    /// A probe for steps of `rows` rows over `layers` layers whose outputs
    /// are `width` wide; `tag` names its buffer (one per concurrent step).
    pub fn new(
        exec: &mut GraphExecutor,
        ones_cache: &std::sync::Mutex<Vec<Tensor>>,
        tag: &str,
        layers: usize,
        rows: usize,
        width: usize,
    ) -> Result<LayerProbe, ModelError> {
        let ones = ones(exec, ones_cache, width)?;
        let out = exec.named_tensor(
            &format!("check_finite.{tag}.{layers}x{rows}"),
            DType::F32,
            &[layers, rows],
        )?;
        Ok(LayerProbe {
            ones,
            out,
            rows,
            layers,
            written: Default::default(),
        })
    }

    /// Records the row sums of layer `l`'s output `x` (`[r, width]`, r at
    /// most the probe's rows).
    pub fn record(&self, s: &mut GraphSession<'_>, l: usize, x: Tensor) -> Result<(), ModelError> {
        if l >= self.layers || x.rows() > self.rows {
            return Err(ModelError::Input(format!(
                "check_finite: layer {l} of {} with {} rows for a probe of {}",
                self.layers,
                x.rows(),
                self.rows
            )));
        }
        let at = self.out.offset + (l * self.rows * 4) as u64;
        let view = Tensor::new(self.out.buffer, at, DType::F32, Shape::new(&[x.rows(), 1]))?;
        record_row_sums(s, x, self.ones, view, format!("check_finite-{l}"))?;
        self.written.borrow_mut().push((l, x.rows()));
        Ok(())
    }

    /// After the step: the first layer whose output was not finite, as an
    /// error; `at` is the step's position.
    pub fn check(&self, exec: &mut GraphExecutor, at: u32) -> Result<(), ModelError> {
        let sums = exec.read_f32(&self.out)?;
        for &(l, n) in self.written.borrow().iter() {
            let start = l * self.rows;
            let Some(row) = sums.get(start..start + n) else {
                continue;
            };
            if let Some(r) = row.iter().position(|v| !v.is_finite()) {
                return Err(ModelError::NonFinite {
                    what: format!(
                        "the output of layer {l} (the step at position {at}, row {r}: the sum of the row)"
                    ),
                    value: row[r],
                    index: r,
                    hint: if l == 0 {
                        ""
                    } else {
                        "; every layer before it is finite"
                    },
                });
            }
        }
        Ok(())
    }
}
