//! Qwen 3 MoE's feed-forward block: softmax-routed experts.
//!
//! Per token: router logits `gate_inp x` (`[experts]`), their softmax, the
//! `expert_used_count` most probable experts, their probabilities divided
//! by their sum, and the weighted sum of each chosen expert's
//! `down(silu(gate x) * up x)`. The expert matmuls and the weighted sum
//! are DeepSeek-V4's ops (`MatMulId`, `MoeCombine`); the routing is
//! `MoeTopK` and `MoeGather` over the softmax.

use crate::deepseek4::weights::is_expert_type;
use crate::gguf::GgufFile;
use crate::hparams::{FloatRange, Hparams};
use crate::weights::WeightMap;
use crate::ModelError;
use weft_ops::builder::FamilyBuilder;
use weft_ops::{Builder, Tensor};
use weft_runtime::GraphSession;

use super::LlamaArch;

/// One layer's experts and router.
#[derive(Clone, Copy, Debug)]
pub struct LlamaMoe {
    /// Router `[experts, hidden]`.
    pub gate_inp: Tensor,
    /// `[experts, expert_ff, hidden]`.
    pub gate_exps: Tensor,
    /// `[experts, expert_ff, hidden]`.
    pub up_exps: Tensor,
    /// `[experts, hidden, expert_ff]`.
    pub down_exps: Tensor,
    /// Experts per token.
    pub experts_used: usize,
    /// Rows of each expert's gate and up projections.
    pub expert_ff: usize,
}

impl LlamaMoe {
    /// Layer `l`'s experts, sized by the `<arch>.expert_*` keys.
    pub fn load(
        weights: &WeightMap<'_>,
        file: &GgufFile,
        arch: LlamaArch,
        hidden: usize,
        l: usize,
    ) -> Result<LlamaMoe, ModelError> {
        let hp = Hparams::new(file, arch.name());
        let experts = hp.count("expert_count", None, 1, 1 << 16, "a sane expert count")?;
        let experts_used = hp.count(
            "expert_used_count",
            None,
            1,
            experts,
            &format!("{} = {experts}", hp.key("expert_count")),
        )?;
        let expert_ff = hp.width("expert_feed_forward_length", None)?;
        let scale = hp.float("expert_weights_scale", 0.0, FloatRange::NonNegative)?;
        if scale != 0.0 && scale != 1.0 {
            return Err(ModelError::Unsupported(format!(
                "{} = {scale}: scaled expert weights",
                hp.key("expert_weights_scale")
            )));
        }
        for t in ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"] {
            let name = format!("blk.{l}.{t}.weight");
            if file.tensor(&name).is_some() {
                return Err(ModelError::Unsupported(format!("{name}: shared experts")));
            }
        }
        let name = |n: &str| format!("blk.{l}.{n}.weight");
        let moe = LlamaMoe {
            gate_inp: weights.expect(&name("ffn_gate_inp"), &[experts, hidden])?,
            gate_exps: weights.expect(&name("ffn_gate_exps"), &[experts, expert_ff, hidden])?,
            up_exps: weights.expect(&name("ffn_up_exps"), &[experts, expert_ff, hidden])?,
            down_exps: weights.expect(&name("ffn_down_exps"), &[experts, hidden, expert_ff])?,
            experts_used,
            expert_ff,
        };
        if !crate::weights::is_supported_matrix(moe.gate_inp.dtype) {
            return Err(ModelError::Unsupported(format!(
                "{} is {}",
                name("ffn_gate_inp"),
                moe.gate_inp.dtype
            )));
        }
        for (n, t) in [
            ("ffn_gate_exps", moe.gate_exps),
            ("ffn_up_exps", moe.up_exps),
            ("ffn_down_exps", moe.down_exps),
        ] {
            if !is_expert_type(t.dtype) {
                return Err(ModelError::Unsupported(format!(
                    "{} is {}",
                    name(n),
                    t.dtype
                )));
            }
        }
        Ok(moe)
    }

    /// Records the block over `h` (the normed rows): `[n, hidden]`.
    pub fn record(
        &self,
        s: &mut GraphSession<'_>,
        h: Tensor,
        l: usize,
    ) -> Result<Tensor, ModelError> {
        let n = h.rows();
        let logits = s.matmul(h, self.gate_inp, "ffn_moe_logits")?;
        let probs = s.softmax(logits, 1.0, "ffn_moe_probs")?;
        s.tap(format_args!("ffn_moe_probs-{l}"), probs)?;
        let ids = s.moe_top_k(probs, self.experts_used, "ffn_moe_topk")?;
        let weights = s.moe_gather(probs, ids, true, "ffn_moe_weights")?;
        let g = s.matmul_id(h, self.gate_exps, ids, "ffn_moe_gate")?;
        let u = s.matmul_id(h, self.up_exps, ids, "ffn_moe_up")?;
        let a = s.silu_mul(g, u, "ffn_moe_swiglu")?;
        let a = a.reshape(&[n * self.experts_used, self.expert_ff])?;
        let y = s.matmul_id(a, self.down_exps, ids, "ffn_moe_down")?;
        Ok(s.moe_combine(y, weights, None, "ffn_moe_out")?)
    }
}
