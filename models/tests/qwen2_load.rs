//! Loading `qwen2` files: what is read from a tiny synthetic file (rope
//! layout and base, the q/k/v biases, a tied output), and what is refused
//! at load with the name of the missing or unimplemented feature.

use weft_models::gguf::{GgufFile, GgufWriter};
use weft_models::llama::{Llama, LlamaArch};
use weft_models::weights::WeightMap;
use weft_models::{Model, ModelError};
use weft_ops::{DType, RopeMode};
use weft_runtime::{Device, GraphExecutor};

const HIDDEN: usize = 64;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
const FFN: usize = 96;
const VOCAB: usize = 32;

fn f32s(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i % 7) as f32 * 0.01).to_le_bytes())
        .collect()
}

/// A one-layer `qwen2` file without the tensors named in `skip`; `edit`
/// adds to it before it is written.
fn tiny_without(skip: &[&str], edit: impl FnOnce(&mut GgufWriter<'static>)) -> GgufFile {
    let head_dim = HIDDEN / HEADS;
    let kv = KV_HEADS * head_dim;
    let mut w = GgufWriter::new();
    w.set("general.architecture", "qwen2").unwrap();
    w.set("qwen2.block_count", 1u32).unwrap();
    w.set("qwen2.context_length", 128u32).unwrap();
    w.set("qwen2.embedding_length", HIDDEN as u32).unwrap();
    w.set("qwen2.feed_forward_length", FFN as u32).unwrap();
    w.set("qwen2.attention.head_count", HEADS as u32).unwrap();
    w.set("qwen2.attention.head_count_kv", KV_HEADS as u32)
        .unwrap();
    w.set("qwen2.rope.freq_base", 1_000_000f32).unwrap();
    w.set("qwen2.attention.layer_norm_rms_epsilon", 1e-6f32)
        .unwrap();
    let mut t = |name: &str, dims: &[u64]| {
        if skip.contains(&name) {
            return;
        }
        let n = dims.iter().product::<u64>() as usize;
        w.add_tensor(name, dims, DType::F32, f32s(n)).unwrap();
    };
    let (h, f, k, v) = (HIDDEN as u64, FFN as u64, kv as u64, VOCAB as u64);
    t("token_embd.weight", &[h, v]);
    t("output_norm.weight", &[h]);
    t("blk.0.attn_norm.weight", &[h]);
    t("blk.0.attn_q.weight", &[h, h]);
    t("blk.0.attn_q.bias", &[h]);
    t("blk.0.attn_k.weight", &[h, k]);
    t("blk.0.attn_k.bias", &[k]);
    t("blk.0.attn_v.weight", &[h, k]);
    t("blk.0.attn_v.bias", &[k]);
    t("blk.0.attn_output.weight", &[h, h]);
    t("blk.0.ffn_norm.weight", &[h]);
    t("blk.0.ffn_gate.weight", &[h, f]);
    t("blk.0.ffn_up.weight", &[h, f]);
    t("blk.0.ffn_down.weight", &[f, h]);
    edit(&mut w);
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

/// The whole one-layer file, `edit` applied.
fn tiny(edit: impl FnOnce(&mut GgufWriter<'static>)) -> GgufFile {
    tiny_without(&[], edit)
}

fn load(file: &GgufFile) -> Result<Llama, ModelError> {
    let mut exec = GraphExecutor::new(Device::Cpu).unwrap();
    let weights = WeightMap::new(file, &mut exec)?;
    Llama::load(&weights, LlamaArch::Qwen2)
}

fn refusal(edit: impl FnOnce(&mut GgufWriter<'static>)) -> String {
    match load(&tiny(edit)) {
        Ok(_) => panic!("the file loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn reads_neox_rope_biases_and_tied_output() {
    let m = load(&tiny(|_| {})).unwrap();
    assert_eq!(m.config.rope.mode, RopeMode::Neox);
    assert_eq!(m.config.rope.base, 1_000_000.0);
    assert_eq!(m.config.rms_eps, 1e-6);
    let bias = m.layers[0].bias;
    assert_eq!(bias.q.map(|t| t.shape.dims().to_vec()), Some(vec![HIDDEN]));
    assert_eq!(
        bias.k.map(|t| t.shape.dims().to_vec()),
        Some(vec![HIDDEN / HEADS])
    );
    assert!(bias.v.is_some());
    assert_eq!(
        m.output, m.token_embd,
        "no output.weight: tied to the embedding"
    );
}

#[test]
fn refuses_an_unimplemented_rope_scaling_type_by_name() {
    let e = refusal(|w| {
        w.set("qwen2.rope.scaling.type", "longrope").unwrap();
    });
    assert!(e.contains("longrope"), "{e}");
}

#[test]
fn refuses_a_missing_weight_by_name() {
    let e = load(&tiny_without(&["blk.0.ffn_down.weight"], |_| {}))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("blk.0.ffn_down.weight"), "{e}");
}

#[test]
fn loads_without_biases() {
    let skip = [
        "blk.0.attn_q.bias",
        "blk.0.attn_k.bias",
        "blk.0.attn_v.bias",
    ];
    let m = load(&tiny_without(&skip, |_| {})).unwrap();
    let bias = m.layers[0].bias;
    assert!(bias.q.is_none() && bias.k.is_none() && bias.v.is_none());
}

#[test]
fn refuses_a_bias_the_forward_pass_would_drop() {
    let e = refusal(|w| {
        w.add_tensor(
            "blk.0.attn_output.bias",
            &[HIDDEN as u64],
            DType::F32,
            f32s(HIDDEN),
        )
        .unwrap();
    });
    assert!(e.contains("blk.0.attn_output.bias"), "{e}");
}

#[test]
fn refuses_a_bias_of_the_wrong_width() {
    let file = tiny_without(&["blk.0.attn_k.bias"], |w| {
        w.add_tensor("blk.0.attn_k.bias", &[3], DType::F32, f32s(3))
            .unwrap();
    });
    let e = load(&file).err().expect("refused").to_string();
    assert!(e.contains("blk.0.attn_k.bias"), "{e}");
}

#[test]
fn an_architecture_weft_does_not_run_is_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("weft-qwen2-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen2moe.gguf");
    let mut w = GgufWriter::new();
    w.set("general.architecture", "qwen2moe").unwrap();
    w.add_tensor("output_norm.weight", &[4], DType::F32, f32s(4))
        .unwrap();
    w.write_file(&path).unwrap();
    let mut exec = GraphExecutor::new(Device::Cpu).unwrap();
    let e = Model::load(&path, &mut exec)
        .err()
        .expect("refused")
        .to_string();
    std::fs::remove_dir_all(&dir).ok();
    assert!(e.contains("qwen2moe") && e.contains("qwen3"), "{e}");
}
