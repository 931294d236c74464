//! The model identity KV checkpoints are bound to: it follows its written
//! definition byte for byte (checked against the GGUF file's own encoding
//! of its metadata), and every part of the definition changes it while the
//! context length and chunk size do not.

use sha2::{Digest, Sha256};
use weft_models::gguf::{Array, GgufFile, GgufWriter, Value};
use weft_models::identity::{identity_of, model_identity, GgufDigest};
use weft_ops::DType;
use weft_runtime::cache::{CacheConfig, LayerSpec};

type Metadata = Vec<(&'static str, Value)>;

/// Metadata of the test model; the last value ends in a non-zero byte so
/// the metadata section can be told from the padding after it.
fn metadata() -> Metadata {
    vec![
        ("general.architecture", Value::from("llama")),
        ("llama.block_count", Value::U32(2)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("t.bool", Value::Bool(true)),
        ("t.i64", Value::I64(-5)),
        ("t.f64", Value::F64(0.25)),
        (
            "t.nested",
            Array::Array(vec![
                Array::I16(vec![-1, 2]),
                Array::String(vec!["x".into()]),
            ])
            .into(),
        ),
        (
            "tokenizer.ggml.tokens",
            Array::String(vec!["a".into(), "Ġb".into()]).into(),
        ),
        ("t.last", Value::from("end")),
    ]
}

type TensorSpec = (&'static str, Vec<u64>, DType, Vec<u8>);

fn tensors() -> Vec<TensorSpec> {
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    vec![
        (
            "token_embd.weight",
            vec![4, 2],
            DType::F32,
            f32s(&[1., 2., 3., 4., 5., 6., 7., 8.]),
        ),
        (
            "output_norm.weight",
            vec![4],
            DType::F32,
            f32s(&[0.5, 0.25, -1., 2.]),
        ),
    ]
}

fn build(meta: &[(&'static str, Value)], tensors: &[TensorSpec]) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.set(*k, v.clone()).unwrap();
    }
    for (name, dims, dtype, data) in tensors {
        w.add_tensor(*name, dims, *dtype, data.as_slice()).unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn layout() -> CacheConfig {
    CacheConfig {
        layers: vec![
            LayerSpec {
                width: 64,
                window: None,
            },
            LayerSpec {
                width: 64,
                window: Some(16),
            },
        ],
        context: 256,
        max_chunk: 32,
        dtype: DType::F16,
    }
}

#[test]
fn digest_and_identity_follow_the_written_definition() {
    let (meta, tensors) = (metadata(), tensors());
    let file = build(&meta, &tensors);
    // The metadata section exactly as GGUF encodes it: the file without
    // tensors, past its 24-byte header, less the zero padding.
    let bare = build(&meta, &[]);
    let mut meta_bytes = bare.bytes()[24..].to_vec();
    while meta_bytes.last() == Some(&0) {
        meta_bytes.pop();
    }
    assert!(meta_bytes.ends_with(b"end"));

    let mut pre = b"weft gguf digest v1\0".to_vec();
    pre.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    pre.extend_from_slice(&meta_bytes);
    pre.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    for (name, dims, dtype, data) in &tensors {
        pre.extend_from_slice(&(name.len() as u64).to_le_bytes());
        pre.extend_from_slice(name.as_bytes());
        pre.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            pre.extend_from_slice(&d.to_le_bytes());
        }
        pre.extend_from_slice(&dtype.ggml_id().to_le_bytes());
        pre.extend_from_slice(&(data.len() as u64).to_le_bytes());
        pre.extend_from_slice(data);
    }
    let digest = GgufDigest::of(&file);
    let want: [u8; 32] = Sha256::digest(&pre).into();
    assert_eq!(digest.0, want, "GGUF digest");

    let mut pre = b"weft model identity v1\0".to_vec();
    pre.extend_from_slice(&want);
    pre.extend_from_slice(&5u64.to_le_bytes());
    pre.extend_from_slice(b"llama");
    pre.extend_from_slice(&1u32.to_le_bytes()); // f16
    pre.extend_from_slice(&2u64.to_le_bytes());
    pre.extend_from_slice(&64u64.to_le_bytes());
    pre.extend_from_slice(&0u32.to_le_bytes());
    pre.extend_from_slice(&64u64.to_le_bytes());
    pre.extend_from_slice(&16u32.to_le_bytes());
    let want: [u8; 32] = Sha256::digest(&pre).into();
    let got = identity_of(&file, &layout()).unwrap();
    assert_eq!(got.0, want, "model identity");
    assert_eq!(got, model_identity(&digest, "llama", &layout()));
}

#[test]
fn every_part_of_the_definition_changes_the_identity() {
    let base = identity_of(&build(&metadata(), &tensors()), &layout()).unwrap();
    let with_meta = |edit: &dyn Fn(&mut Metadata)| {
        let mut m = metadata();
        edit(&mut m);
        identity_of(&build(&m, &tensors()), &layout()).unwrap()
    };
    let with_tensors = |edit: &dyn Fn(&mut Vec<TensorSpec>)| {
        let mut t = tensors();
        edit(&mut t);
        identity_of(&build(&metadata(), &t), &layout()).unwrap()
    };
    let with_layout = |edit: &dyn Fn(&mut CacheConfig)| {
        let mut c = layout();
        edit(&mut c);
        identity_of(&build(&metadata(), &tensors()), &c).unwrap()
    };
    let variants = [
        (
            "a metadata value",
            with_meta(&|m| m[2].1 = Value::F32(10000.5)),
        ),
        ("a metadata type", with_meta(&|m| m[1].1 = Value::U64(2))),
        ("a metadata key", with_meta(&|m| m[3].0 = "t.boolean")),
        (
            "a string element",
            with_meta(&|m| m[7].1 = Array::String(vec!["a".into(), "Ġc".into()]).into()),
        ),
        (
            "a nested array",
            with_meta(&|m| {
                m[6].1 = Array::Array(vec![
                    Array::I16(vec![-1, 3]),
                    Array::String(vec!["x".into()]),
                ])
                .into()
            }),
        ),
        ("metadata order", with_meta(&|m| m.swap(3, 4))),
        (
            "a metadata entry more",
            with_meta(&|m| m.push(("t.extra", Value::U8(0)))),
        ),
        ("a tensor byte", with_tensors(&|t| t[1].3[0] ^= 1)),
        ("a tensor name", with_tensors(&|t| t[1].0 = "output.weight")),
        ("a tensor shape", with_tensors(&|t| t[0].1 = vec![2, 4])),
        ("tensor order", with_tensors(&|t| t.swap(0, 1))),
        ("the row type", with_layout(&|c| c.dtype = DType::F32)),
        ("a layer's width", with_layout(&|c| c.layers[0].width = 128)),
        (
            "a layer's window",
            with_layout(&|c| c.layers[1].window = Some(8)),
        ),
        (
            "a window removed",
            with_layout(&|c| c.layers[1].window = None),
        ),
        ("a layer more", with_layout(&|c| c.layers.push(c.layers[0]))),
    ];
    for (what, id) in &variants {
        assert_ne!(*id, base, "{what} does not change the identity");
    }
    for (i, (a, x)) in variants.iter().enumerate() {
        for (b, y) in &variants[i + 1..] {
            assert_ne!(x, y, "{a} and {b} give the same identity");
        }
    }
    let digest = GgufDigest::of(&build(&metadata(), &tensors()));
    assert_ne!(
        model_identity(&digest, "gemma3", &layout()),
        base,
        "architecture"
    );
}

#[test]
fn context_and_chunk_size_do_not_change_the_identity() {
    let file = build(&metadata(), &tensors());
    let base = identity_of(&file, &layout()).unwrap();
    let other = CacheConfig {
        context: 4096,
        max_chunk: 1,
        ..layout()
    };
    assert_eq!(identity_of(&file, &other).unwrap(), base);
    // The same file bytes, parsed twice, give the same digest.
    let again = GgufFile::from_bytes(file.bytes().to_vec()).unwrap();
    assert_eq!(GgufDigest::of(&again), GgufDigest::of(&file));
}
