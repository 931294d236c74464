//! The architectures that share the Llama forward pass, and what sets them
//! apart. All read the same metadata keys under their own prefix.
//!
//! - Llama (`llama`) itself: Llama 3's rope scaling arrives as
//!   `rope_freqs.weight`; an `attention.sliding_window` (Mistral) makes
//!   every layer a sliding-window layer.
//! - Qwen 2 / 2.5 (`qwen2`): NEOX-style rope (rotating the two halves of
//!   each head rather than adjacent pairs) and biases on the q, k and v
//!   projections.
//! - Qwen 3 (`qwen3`): NEOX rope, an RMS norm over each query and key head
//!   before rope (`attn_q_norm`, `attn_k_norm`), no biases.
//! - Qwen 3 MoE (`qwen3moe`): Qwen 3's attention, and in every layer
//!   experts instead of the feed-forward block: a softmax over the router
//!   logits, the top `expert_used_count` experts, their probabilities
//!   renormalised (`moe.rs`).
//! - Phi-3 (`phi3`): NEOX rope, the q, k and v projections fused into one
//!   matrix (`attn_qkv`, rows q then k then v) and the gate and up
//!   projections into another (`ffn_up`, rows gate then up); queries are
//!   scaled by `1/sqrt(head_dim)` before attention rather than inside it.
//!   Its `longrope` scaling arrives as `rope_factors_short.weight` and
//!   `rope_factors_long.weight` (the long ones taken when the cache is
//!   longer than `rope.scaling.original_context_length`, as llama.cpp
//!   chooses by its context) and `rope.scaling.attn_factor`.
//!   Its `attention.sliding_window` is read and not applied, as llama.cpp
//!   does for Phi-3.

use weft_ops::RopeMode;
use weft_runtime::Device;

/// A `general.architecture` the Llama forward pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlamaArch {
    /// `llama`: SmolLM2, Llama 2/3, Mistral-style models.
    Llama,
    /// `qwen2`: Qwen 2 and Qwen 2.5.
    Qwen2,
    /// `qwen3`: Qwen 3 (dense).
    Qwen3,
    /// `phi3`: Phi-3 and Phi-3.5 (dense).
    Phi3,
    /// `qwen3moe`: Qwen 3 mixture-of-experts.
    Qwen3Moe,
}

impl LlamaArch {
    /// Every architecture of the family, in the order error messages list them.
    pub const ALL: [LlamaArch; 5] = [
        LlamaArch::Llama,
        LlamaArch::Qwen2,
        LlamaArch::Qwen3,
        LlamaArch::Qwen3Moe,
        LlamaArch::Phi3,
    ];

    /// The architecture called `name` (`general.architecture`).
    pub fn from_name(name: &str) -> Option<LlamaArch> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// `general.architecture`, also the prefix of its metadata keys.
    pub fn name(self) -> &'static str {
        match self {
            LlamaArch::Llama => "llama",
            LlamaArch::Qwen2 => "qwen2",
            LlamaArch::Qwen3 => "qwen3",
            LlamaArch::Phi3 => "phi3",
            LlamaArch::Qwen3Moe => "qwen3moe",
        }
    }

    /// Whether attention rounds as llama.cpp's flash-attention kernels do
    /// on `device` (else as llama.cpp with flash attention off). Llama
    /// models follow llama.cpp's tools (flash attention on); the others on
    /// the CPU follow llama.cpp with flash attention off, the default of
    /// llama-cpp-python, which is how their reference outputs are made.
    /// Other backends have only the flash-attention path.
    pub fn flash_attention(self, device: Device) -> bool {
        match self {
            LlamaArch::Llama => true,
            LlamaArch::Qwen2 | LlamaArch::Qwen3 | LlamaArch::Qwen3Moe | LlamaArch::Phi3 => {
                device != Device::Cpu
            }
        }
    }

    /// How rope pairs the dimensions of a head (llama.cpp's
    /// `llama_model_rope_type`: `NORM` for Llama, `NEOX` for the others).
    pub fn rope_mode(self) -> RopeMode {
        match self {
            LlamaArch::Llama => RopeMode::Normal,
            LlamaArch::Qwen2 | LlamaArch::Qwen3 | LlamaArch::Qwen3Moe | LlamaArch::Phi3 => {
                RopeMode::Neox
            }
        }
    }

    /// Whether each query and key head is RMS-normed before rope.
    pub fn qk_norm(self) -> bool {
        matches!(self, LlamaArch::Qwen3 | LlamaArch::Qwen3Moe)
    }

    /// Whether `attention.sliding_window` applies to every layer (Mistral
    /// as `llama`; llama.cpp runs `llama` files without one, and its
    /// converter writes none, so a file with the key comes from elsewhere).
    pub fn sliding_window(self) -> bool {
        self == LlamaArch::Llama
    }

    /// Whether every layer's feed-forward block is softmax-routed experts.
    pub fn moe(self) -> bool {
        self == LlamaArch::Qwen3Moe
    }

    /// Whether the q, k, v and the gate, up projections are stored fused.
    pub fn fused_projections(self) -> bool {
        self == LlamaArch::Phi3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_modes_follow_llama_cpp() {
        for a in LlamaArch::ALL {
            assert_eq!(LlamaArch::from_name(a.name()), Some(a));
        }
        assert_eq!(LlamaArch::from_name("qwen2moe"), None);
        assert_eq!(LlamaArch::Llama.rope_mode(), RopeMode::Normal);
        for a in [LlamaArch::Qwen2, LlamaArch::Qwen3, LlamaArch::Phi3] {
            assert_eq!(a.rope_mode(), RopeMode::Neox);
            assert!(!a.flash_attention(Device::Cpu));
            assert!(a.flash_attention(Device::Cuda(0)));
        }
        assert!(LlamaArch::Llama.flash_attention(Device::Cpu));
        assert!(LlamaArch::Qwen3.qk_norm() && !LlamaArch::Qwen2.qk_norm());
        assert!(LlamaArch::Phi3.fused_projections() && !LlamaArch::Llama.fused_projections());
    }
}
