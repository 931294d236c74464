//! Known architectures with a feature weft does not implement, and
//! architectures it does not run, are refused at load with the name of
//! what is missing. The files are the family fixtures
//! (`tests/reference/families`), re-emitted with one change each.

mod common;

use common::{read_reference, reference_dir};
use weft::models::gguf::{GgufFile, GgufWriter, Value};
use weft::models::Model;
use weft::ops::DType;
use weft::runtime::{Device, GraphExecutor};

/// One change to a fixture.
enum Edit {
    /// Set (or add) a metadata key.
    Set(&'static str, Value),
    /// Remove a tensor.
    Drop(&'static str),
    /// Add an f32 tensor of `n` ones.
    Add(&'static str, u64),
}

fn fixture(family: &str) -> GgufFile {
    let path = reference_dir().join(format!("families/{family}.gguf"));
    GgufFile::from_bytes(read_reference(&path)).expect("fixture parses")
}

/// The error of loading `family`'s fixture with `edits`, or a panic if it loads.
fn refusal(family: &str, edits: &[Edit]) -> String {
    let file = fixture(family);
    let mut metadata = file.metadata().to_vec();
    let mut w = GgufWriter::new();
    for e in edits {
        if let Edit::Set(k, v) = e {
            match metadata.iter_mut().find(|(key, _)| key == k) {
                Some((_, value)) => *value = v.clone(),
                None => metadata.push((k.to_string(), v.clone())),
            }
        }
    }
    for (k, v) in metadata {
        w.set(k, v).expect("metadata");
    }
    for t in file.tensors() {
        if !edits
            .iter()
            .any(|e| matches!(e, Edit::Drop(n) if *n == t.name))
        {
            w.add_tensor(t.name.clone(), &t.dims, t.dtype, file.tensor_data(t))
                .expect("tensor");
        }
    }
    for e in edits {
        if let Edit::Add(name, n) = e {
            let ones: Vec<u8> = (0..*n).flat_map(|_| 1f32.to_le_bytes()).collect();
            w.add_tensor(name.to_string(), &[*n], DType::F32, ones)
                .expect("extra tensor");
        }
    }
    let file = GgufFile::from_bytes(w.to_bytes().expect("write")).expect("parses");
    let mut exec = GraphExecutor::new(Device::Cpu).expect("executor");
    match Model::from_file(file, "edited.gguf", &mut exec) {
        Ok(_) => panic!("{family} loaded with an unsupported feature"),
        Err(e) => e.to_string(),
    }
}

fn assert_names(err: &str, names: &[&str]) {
    for n in names {
        assert!(err.contains(n), "the error does not name `{n}`: {err}");
    }
}

#[test]
fn unknown_rope_scaling_types_are_refused_by_name() {
    for (family, key) in [
        ("llama3", "llama.rope.scaling.type"),
        ("mistral", "llama.rope.scaling.type"),
        ("qwen3", "qwen3.rope.scaling.type"),
        ("phi3", "phi3.rope.scaling.type"),
    ] {
        let err = refusal(family, &[Edit::Set(key, Value::from("longrope"))]);
        assert_names(&err, &["rope scaling type", "longrope"]);
    }
}

#[test]
fn missing_or_unimplemented_tensors_are_refused_by_name() {
    // Qwen 3 without its per-head key norm.
    let err = refusal("qwen3", &[Edit::Drop("blk.1.attn_k_norm.weight")]);
    assert_names(&err, &["blk.1.attn_k_norm.weight"]);
    // Phi-3 without its fused projection.
    let err = refusal("phi3", &[Edit::Drop("blk.0.attn_qkv.weight")]);
    assert_names(&err, &["blk.0.attn_qkv.weight"]);
    // Phi-3's long-context rope factors (longrope) come in pairs.
    let err = refusal("phi3", &[Edit::Add("rope_factors_long.weight", 8)]);
    assert_names(&err, &["rope_factors_short.weight", "longrope"]);
    // Other architectures do not take them.
    let err = refusal(
        "qwen3",
        &[
            Edit::Add("rope_factors_long.weight", 8),
            Edit::Add("rope_factors_short.weight", 8),
        ],
    );
    assert_names(&err, &["longrope", "qwen3"]);
    // Llama 3's rope frequency factors must cover every rotated pair.
    let err = refusal(
        "llama3",
        &[
            Edit::Drop("rope_freqs.weight"),
            Edit::Add("rope_freqs.weight", 7),
        ],
    );
    assert_names(&err, &["rope_freqs.weight"]);
}

#[test]
fn architectures_weft_does_not_run_are_refused_with_the_ones_it_does() {
    let err = refusal(
        "qwen3",
        &[Edit::Set("general.architecture", Value::from("qwen2moe"))],
    );
    assert_names(
        &err,
        &[
            "qwen2moe",
            "llama",
            "qwen2",
            "qwen3",
            "qwen3moe",
            "phi3",
            "gemma3",
            "deepseek4",
        ],
    );
}
