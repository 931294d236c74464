//! The architectures that share the Llama forward pass, and what sets them
//! apart: Qwen 2 / 2.5 (`qwen2`) is Llama with NEOX-style rope (rotating
//! the two halves of each head rather than adjacent pairs) and biases on
//! the q, k and v projections. Both read the same metadata keys under
//! their own prefix.

use weft_ops::RopeMode;
use weft_runtime::Device;

/// A `general.architecture` the Llama forward pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlamaArch {
    /// `llama`: SmolLM2, Llama 2/3, Mistral-style models.
    Llama,
    /// `qwen2`: Qwen 2 and Qwen 2.5.
    Qwen2,
}

impl LlamaArch {
    /// Every architecture of the family, in the order error messages list them.
    pub const ALL: [LlamaArch; 2] = [LlamaArch::Llama, LlamaArch::Qwen2];

    /// The architecture called `name` (`general.architecture`).
    pub fn from_name(name: &str) -> Option<LlamaArch> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// `general.architecture`, also the prefix of its metadata keys.
    pub fn name(self) -> &'static str {
        match self {
            LlamaArch::Llama => "llama",
            LlamaArch::Qwen2 => "qwen2",
        }
    }

    /// Whether attention rounds as llama.cpp's flash-attention kernels do
    /// on `device` (else as llama.cpp with flash attention off). Llama
    /// models follow llama.cpp's tools (flash attention on); Qwen 2 on the
    /// CPU follows llama.cpp with flash attention off, the default of
    /// llama-cpp-python, which is how its reference outputs are made. Other
    /// backends have only the flash-attention path.
    pub fn flash_attention(self, device: Device) -> bool {
        match self {
            LlamaArch::Llama => true,
            LlamaArch::Qwen2 => device != Device::Cpu,
        }
    }

    /// How rope pairs the dimensions of a head (llama.cpp's
    /// `llama_model_rope_type`: `NORM` for Llama, `NEOX` for Qwen 2).
    pub fn rope_mode(self) -> RopeMode {
        match self {
            LlamaArch::Llama => RopeMode::Normal,
            LlamaArch::Qwen2 => RopeMode::Neox,
        }
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
        assert_eq!(LlamaArch::from_name("qwen3"), None);
        assert_eq!(LlamaArch::Llama.rope_mode(), RopeMode::Normal);
        assert_eq!(LlamaArch::Qwen2.rope_mode(), RopeMode::Neox);
        assert!(LlamaArch::Llama.flash_attention(Device::Cpu));
        assert!(!LlamaArch::Qwen2.flash_attention(Device::Cpu));
        assert!(LlamaArch::Qwen2.flash_attention(Device::Cuda(0)));
    }
}
