//! GGUF writer -> reader round trips, typed accessors, and one crafted file
//! per validation rule (each error must name the field and where it lies).

use weft_models::gguf::{type_id, Array, GgufError, GgufFile, GgufWriter, Value};
use weft_ops::DType;

/// Deterministic filler bytes for tensor data.
fn filler(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60_000)),
        ("t.i16", Value::I16(-30_000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(1.5e-5)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::String("héllo, wörld ✓".into())),
        ("t.empty_string", Value::String(String::new())),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(-2.25e300)),
        ("a.u8", Array::U8(vec![0, 1, 255]).into()),
        ("a.i8", Array::I8(vec![-128, 0, 127]).into()),
        ("a.u16", Array::U16(vec![1, 65535]).into()),
        ("a.i16", Array::I16(vec![-1, 2]).into()),
        ("a.u32", Array::U32(vec![7, 8, 9]).into()),
        ("a.i32", Array::I32(vec![-7, 8, -9]).into()),
        ("a.f32", Array::F32(vec![0.5, -1.0, f32::MAX]).into()),
        ("a.bool", Array::Bool(vec![true, false, true]).into()),
        (
            "a.string",
            Array::String(vec!["Ġthe".into(), String::new(), "<|im_end|>".into()]).into(),
        ),
        ("a.u64", Array::U64(vec![u64::MAX, 0]).into()),
        ("a.i64", Array::I64(vec![i64::MIN, i64::MAX]).into()),
        ("a.f64", Array::F64(vec![1e-300, 2.0]).into()),
        ("a.empty", Array::F32(vec![]).into()),
        (
            "a.nested",
            Array::Array(vec![
                Array::String(vec!["a".into(), "b".into()]),
                Array::Array(vec![Array::I32(vec![1, 2]), Array::Array(vec![])]),
                Array::U8(vec![]),
            ])
            .into(),
        ),
    ]
}

/// Name, dims, type and data of a tensor the tests write.
type TensorSpec = (&'static str, Vec<u64>, DType, Vec<u8>);

fn build(alignment: Option<u32>) -> (Vec<u8>, Vec<TensorSpec>) {
    let tensors = vec![
        (
            "token_embd.weight",
            vec![64, 3],
            DType::Q8_0,
            filler(2 * 34 * 3, 1),
        ),
        (
            "blk.0.attn_q.weight",
            vec![32, 2, 1, 2],
            DType::Q4_1,
            filler(20 * 4, 2),
        ),
        ("blk.0.attn_norm.weight", vec![5], DType::F32, filler(20, 3)),
        (
            "blk.0.ffn_down.weight",
            vec![256, 1],
            DType::Q4_K,
            filler(144, 4),
        ),
        ("blk.0.half", vec![3, 3], DType::F16, filler(18, 5)),
        ("empty", vec![0, 4], DType::F32, vec![]),
    ];
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.set_alignment(a).unwrap();
    }
    w.set("general.architecture", "llama").unwrap();
    for (k, v) in every_value() {
        w.set(k, v).unwrap();
    }
    for (name, dims, dtype, data) in &tensors {
        w.add_tensor(*name, dims, *dtype, data.as_slice()).unwrap();
    }
    (w.to_bytes().unwrap(), tensors)
}

#[test]
fn round_trip_every_value_type_and_tensors_at_alignments_32_and_64() {
    for alignment in [None, Some(64), Some(1)] {
        let (bytes, tensors) = build(alignment);
        let len = bytes.len();
        let file = GgufFile::from_bytes(bytes).unwrap();
        let expected_alignment = u64::from(alignment.unwrap_or(32));
        assert_eq!(file.version(), 3);
        assert_eq!(file.alignment(), expected_alignment);
        assert_eq!(file.data_offset() % expected_alignment, 0);
        assert_eq!(file.bytes().len(), len);
        assert_eq!(file.architecture().unwrap(), "llama");
        let skip = usize::from(alignment.is_some()) + 1;
        let read: Vec<_> = file
            .metadata()
            .iter()
            .skip(skip)
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        assert_eq!(read, every_value());
        for (k, v) in every_value() {
            assert_eq!(file.get(k), Some(&v), "{k}");
        }
        assert_eq!(file.tensors().len(), tensors.len());
        for (t, (name, dims, dtype, data)) in file.tensors().iter().zip(&tensors) {
            assert_eq!((t.name.as_str(), &t.dims, t.dtype), (*name, dims, *dtype));
            assert_eq!(t.bytes, data.len() as u64);
            assert_eq!(
                (t.offset - file.data_offset()) % expected_alignment,
                0,
                "{name}"
            );
            assert_eq!(file.tensor_data(t), data.as_slice(), "{name}");
            assert_eq!(file.tensor(name), Some(t));
        }
        assert_eq!(file.tensor("missing"), None);
        assert_eq!(
            file.tensor("blk.0.attn_q.weight").unwrap().n_elements(),
            128
        );
    }
}

#[test]
fn version_2_files_are_read() {
    let (mut bytes, _) = build(None);
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(GgufFile::from_bytes(bytes).unwrap().version(), 2);
}

#[test]
fn open_maps_a_file_and_reports_io_errors_with_the_path() {
    let dir = std::env::temp_dir().join(format!("weft-gguf-open-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama").unwrap();
    w.add_tensor("x", &[4], DType::F32, filler(16, 9)).unwrap();
    w.write_file(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(
        file.tensor_data(&file.tensors()[0]),
        filler(16, 9).as_slice()
    );
    let shared = file.shared_bytes();
    drop(file);
    assert_eq!(&shared[..4], b"GGUF");

    std::fs::write(dir.join("empty.gguf"), b"").unwrap();
    let err = GgufFile::open(&dir.join("empty.gguf"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("magic") && err.contains("0x0"), "{err}");
    let err = GgufFile::open(&dir.join("absent.gguf"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("absent.gguf"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn typed_accessors_convert_what_fits_and_name_the_key_otherwise() {
    let mut w = GgufWriter::new();
    w.set("u8", 7u8).unwrap();
    w.set("neg", -1i32).unwrap();
    w.set("big", u64::MAX).unwrap();
    w.set("f", 0.25f32).unwrap();
    w.set("s", "text").unwrap();
    w.set("b", false).unwrap();
    w.set("small_ints", vec![1u8, 2, 3]).unwrap();
    w.set("neg_ints", vec![5i64, -6]).unwrap();
    w.set("doubles", vec![0.5f64]).unwrap();
    w.set("words", vec!["a", "b"]).unwrap();
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();

    assert_eq!(file.get_u32("u8").unwrap(), Some(7));
    assert_eq!(file.get_i64("neg").unwrap(), Some(-1));
    assert_eq!(file.get_u64("big").unwrap(), Some(u64::MAX));
    assert_eq!(file.get_f32("u8").unwrap(), Some(7.0));
    assert_eq!(file.get_f32("f").unwrap(), Some(0.25));
    assert_eq!(file.get_bool("b").unwrap(), Some(false));
    assert_eq!(file.require_str("s").unwrap(), "text");
    assert_eq!(file.get_u32("absent").unwrap(), None);
    assert_eq!(file.get_str_array("words").unwrap().unwrap(), ["a", "b"]);
    assert_eq!(
        &*file.get_i32_array("small_ints").unwrap().unwrap(),
        [1, 2, 3]
    );
    assert_eq!(
        &*file.get_u32_array("small_ints").unwrap().unwrap(),
        [1, 2, 3]
    );
    assert_eq!(&*file.get_f32_array("doubles").unwrap().unwrap(), [0.5]);
    assert_eq!(file.get_array("words").unwrap().map(|a| a.len()), Some(2));

    let err = file.get_u32("neg").unwrap_err().to_string();
    assert!(
        err.contains("`neg`") && err.contains("-1") && err.contains("u32") && err.contains("0x"),
        "{err}"
    );
    let err = file.get_u32("big").unwrap_err().to_string();
    assert!(err.contains("`big`") && err.contains("u64"), "{err}");
    let err = file.get_str("u8").unwrap_err().to_string();
    assert!(
        err.contains("`u8`") && err.contains("type u8") && err.contains("expected string"),
        "{err}"
    );
    let err = file.get_u32("s").unwrap_err().to_string();
    assert!(err.contains("`s`") && err.contains("string"), "{err}");
    let err = file.get_str_array("small_ints").unwrap_err().to_string();
    assert!(
        err.contains("array<u8>") && err.contains("array<string>"),
        "{err}"
    );
    let err = file.get_u32_array("neg_ints").unwrap_err().to_string();
    assert!(
        err.contains("`neg_ints`") && err.contains("element 1"),
        "{err}"
    );
    let err = file.get_bool("f").unwrap_err().to_string();
    assert!(err.contains("`f`") && err.contains("f32"), "{err}");
    let err = file
        .require_u32("llama.block_count")
        .unwrap_err()
        .to_string();
    assert_eq!(err, "[gguf] missing metadata key `llama.block_count`");
    assert!(file
        .architecture()
        .unwrap_err()
        .to_string()
        .contains("general.architecture"));
}

#[test]
fn writer_refuses_what_the_reader_would_refuse() {
    let mut w = GgufWriter::new();
    w.set("k", 1u32).unwrap();
    assert!(w
        .set("k", 2u32)
        .unwrap_err()
        .to_string()
        .contains("`k` is set twice"));
    assert!(w
        .set("general.alignment", 48u32)
        .unwrap_err()
        .to_string()
        .contains("power of two"));
    assert!(w.set("general.alignment", "32").is_err());
    assert!(w.set_alignment(0).is_err());
    let mut deep = Array::U8(vec![1]);
    for _ in 0..8 {
        deep = Array::Array(vec![deep]);
    }
    assert!(w
        .set("deep", deep)
        .unwrap_err()
        .to_string()
        .contains("nested"));
    w.add_tensor("t", &[4], DType::F32, vec![0u8; 16]).unwrap();
    assert!(w
        .add_tensor("t", &[4], DType::F32, vec![0u8; 16])
        .unwrap_err()
        .to_string()
        .contains("`t` is added twice"));
    let err = w
        .add_tensor("short", &[4], DType::F32, vec![0u8; 15])
        .unwrap_err()
        .to_string();
    assert!(err.contains("`short`") && err.contains("16 bytes"), "{err}");
    assert!(w.add_tensor("nodims", &[], DType::F32, vec![]).is_err());
    assert!(w
        .add_tensor("fivedims", &[1, 1, 1, 1, 1], DType::F32, vec![0u8; 4])
        .is_err());
    let err = w
        .add_tensor("partial", &[33], DType::Q4_1, vec![0u8; 40])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`partial`") && err.contains("block length 32"),
        "{err}"
    );
    assert!(GgufFile::from_bytes(w.to_bytes().unwrap()).is_ok());
}

/// Hand-built GGUF bytes, for files the writer would never produce.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw::default()
            .bytes(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(self, v: u32) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(self, v: u64) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn string(self, s: &[u8]) -> Raw {
        self.u64(s.len() as u64).bytes(s)
    }
    fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.string(key.as_bytes()).u32(type_id::U32).u32(v)
    }
    fn tensor(self, name: &str, dims: &[u64], ggml_type: u32, offset: u64) -> Raw {
        let mut r = self.string(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ggml_type).u64(offset)
    }
    fn pad(mut self, alignment: usize) -> Raw {
        while !self.0.len().is_multiple_of(alignment) {
            self.0.push(0);
        }
        self
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn error(self) -> String {
        match GgufFile::from_bytes(self.0) {
            Ok(_) => panic!("crafted file was accepted"),
            Err(e) => e.to_string(),
        }
    }
}

fn assert_names(err: &str, parts: &[&str]) {
    for p in parts {
        assert!(err.contains(p), "error {err:?} should mention {p:?}");
    }
}

#[test]
fn header_errors_name_the_field() {
    assert_names(
        &Raw::default().bytes(b"GGML\x03\0\0\0").error(),
        &["magic", "0x0", "GGML"],
    );
    assert_names(&Raw::header(1, 0, 0).error(), &["version 1", "v1"]);
    assert_names(&Raw::header(4, 0, 0).error(), &["version 4", "2 and 3"]);
    assert_names(
        &Raw::header(3u32.swap_bytes(), 0, 0).error(),
        &["big-endian"],
    );
    assert_names(
        &Raw::default().bytes(b"GGUF\x03\0\0\0\x01").error(),
        &["tensor count", "0x8", "needs 8 bytes"],
    );
    assert_names(
        &Raw::header(3, u64::MAX, 0).error(),
        &["tensor count", "0x8", "18446744073709551615"],
    );
    assert_names(
        &Raw::header(3, 0, 1 << 40).error(),
        &["metadata entry count", "0x10"],
    );
    // 3 entries of at least 13 bytes cannot fit in 30 bytes.
    assert_names(
        &Raw::header(3, 0, 3).bytes(&[0; 30]).error(),
        &["metadata entry count", "13 bytes"],
    );
    assert!(GgufFile::from_bytes(Raw::header(3, 0, 0).0).is_ok());
}

#[test]
fn metadata_errors_name_the_key_and_offset() {
    let huge_key = Raw::header(3, 0, 1)
        .u64(u64::MAX / 2)
        .bytes(&[0; 16])
        .error();
    assert_names(&huge_key, &["key of metadata entry 0", "0x20"]);
    let bad_utf8 = Raw::header(3, 0, 1)
        .string(b"k\xff")
        .u32(type_id::U8)
        .bytes(&[1])
        .error();
    assert_names(&bad_utf8, &["key of metadata entry 0", "UTF-8", "0x20"]);
    let bad_value_utf8 = Raw::header(3, 0, 1)
        .string(b"k")
        .u32(type_id::STRING)
        .string(b"\xc3")
        .error();
    assert_names(&bad_value_utf8, &["`k`", "UTF-8", "0x2d"]);
    let unknown = Raw::header(3, 0, 1).string(b"weird").u32(13).u32(0).error();
    assert_names(&unknown, &["`weird`", "unknown value type 13", "0x25"]);
    let bad_bool = Raw::header(3, 0, 1)
        .string(b"flag")
        .u32(type_id::BOOL)
        .bytes(&[2])
        .error();
    assert_names(&bad_bool, &["`flag`", "holds 2", "0x28"]);
    let dup = Raw::header(3, 0, 2)
        .kv_u32("a.b", 1)
        .kv_u32("a.b", 2)
        .error();
    assert_names(&dup, &["`a.b`", "0x2b", "0x18"]);
    let truncated_value = Raw::header(3, 0, 1)
        .string(b"v")
        .u32(type_id::U64)
        .bytes(&[0; 4])
        .error();
    assert_names(
        &truncated_value,
        &["value of metadata key `v`", "needs 8 bytes"],
    );
}

#[test]
fn array_errors_name_the_key_and_never_reserve_what_is_not_there() {
    let arr = |elem: u32, n: u64| {
        Raw::header(3, 0, 1)
            .string(b"arr")
            .u32(type_id::ARRAY)
            .u32(elem)
            .u64(n)
    };
    assert_names(
        &arr(type_id::U32, u64::MAX / 2).bytes(&[0; 64]).error(),
        &["length of array `arr`", "4 bytes"],
    );
    assert_names(
        &arr(type_id::STRING, 1_000_000_000).bytes(&[0; 64]).error(),
        &["`arr`", "8 bytes"],
    );
    assert_names(
        &arr(type_id::ARRAY, 1 << 50).error(),
        &["`arr`", "12 bytes"],
    );
    assert_names(&arr(99, 0).error(), &["`arr`", "unknown value type 99"]);
    assert_names(
        &arr(type_id::BOOL, 2).bytes(&[1, 7]).error(),
        &["`arr`", "holds 7", "0x34"],
    );
    let strings = arr(type_id::STRING, 2).string(b"ok").u64(1 << 40).error();
    assert_names(&strings, &["element 1 of array `arr`"]);
    // Nine levels of arrays of arrays: refused at the eighth.
    let mut deep = Raw::header(3, 0, 1).string(b"deep").u32(type_id::ARRAY);
    for _ in 0..9 {
        deep = deep.u32(type_id::ARRAY).u64(1);
    }
    assert_names(
        &deep.bytes(&[0; 16]).error(),
        &["`deep`", "nested deeper than 8"],
    );
}

#[test]
fn alignment_must_be_a_nonzero_power_of_two() {
    for bad in [0u32, 3, 48] {
        let err = Raw::header(3, 0, 1)
            .kv_u32("general.alignment", bad)
            .error();
        assert_names(
            &err,
            &[
                "general.alignment",
                &format!("is {bad}"),
                "0x18",
                "power of two",
            ],
        );
    }
    let err = Raw::header(3, 0, 1)
        .string(b"general.alignment")
        .u32(type_id::STRING)
        .string(b"32")
        .error();
    assert_names(&err, &["general.alignment", "string"]);
    let ok = Raw::header(3, 0, 1).kv_u32("general.alignment", 64);
    assert_eq!(GgufFile::from_bytes(ok.0).unwrap().alignment(), 64);
}

/// One tensor info at 0x18 followed by `data` bytes of data.
fn one_tensor(name: &str, dims: &[u64], ggml_type: u32, offset: u64, data: usize) -> Raw {
    Raw::header(3, 1, 0)
        .tensor(name, dims, ggml_type, offset)
        .pad(32)
        .bytes(&vec![0; data])
}

#[test]
fn tensor_info_errors_name_the_tensor_and_offset() {
    assert_names(
        &one_tensor("t", &[], 0, 0, 64).error(),
        &["`t`", "0 dimensions", "0x21"],
    );
    assert_names(
        &one_tensor("t", &[1, 1, 1, 1, 1], 0, 0, 64).error(),
        &["`t`", "5 dimensions", "0x21"],
    );
    assert_names(
        &one_tensor("t", &[4, 1 << 63], 0, 0, 64).error(),
        &["`t`", "dimension 1", "0x2d", "i64::MAX"],
    );
    assert_names(
        &one_tensor("t", &[1 << 40, 1 << 40], 0, 0, 64).error(),
        &["`t`", "element count", "0x18"],
    );
    assert_names(
        &one_tensor("t", &[1 << 62], 0, 0, 64).error(),
        &["`t`", "byte size"],
    );
    assert_names(
        &one_tensor("blk.1.x", &[32], 4, 0, 64).error(),
        &["`blk.1.x`", "unknown type id 4", "0x33"],
    );
    assert_names(
        &one_tensor("q", &[33, 2], 3, 0, 64).error(),
        &["`q`", "33", "block length 32", "q4_1"],
    );
    assert_names(
        &one_tensor("m", &[4], 0, 16, 64).error(),
        &["`m`", "0x10", "alignment 32", "0x31"],
    );
    let name_too_long = Raw::header(3, 1, 0).u64(1 << 60).bytes(&[0; 64]).error();
    assert_names(&name_too_long, &["name of the tensor info at byte 0x18"]);
}

#[test]
fn tensor_data_outside_the_file_is_refused_with_its_range() {
    let raw = one_tensor("blk.3.attn_q.weight", &[576, 576], 3, 0, 100);
    let len = raw.len();
    let err = raw.error();
    let expected = format!(
        "[gguf] tensor `blk.3.attn_q.weight` data 0x{:x}..0x{:x} lies outside the file ({len} bytes)",
        len - 100,
        len - 100 + 18 * 20 * 576
    );
    assert_eq!(err, expected);
    // An offset so large that start + size overflows.
    assert_names(
        &one_tensor("o", &[4], 0, u64::MAX - 31, 64).error(),
        &["`o`", "outside the file"],
    );
    // Exactly fitting data is fine, one byte short is not.
    assert!(GgufFile::from_bytes(one_tensor("f", &[8], 0, 0, 32).0).is_ok());
    assert!(GgufFile::from_bytes(one_tensor("f", &[8], 0, 0, 31).0).is_err());
}

#[test]
fn duplicate_tensor_names_are_refused() {
    let raw = Raw::header(3, 2, 0)
        .tensor("w", &[4], 0, 0)
        .tensor("w", &[4], 0, 32)
        .pad(32)
        .bytes(&[0; 64]);
    assert_names(&raw.error(), &["`w`", "0x18", "0x39", "repeats"]);
}

#[test]
fn tensors_whose_data_overlap_are_refused_naming_both() {
    // `a` is 16 f32 at 0..64; `b` (8 f32) starts at `b_offset`.
    let overlapping = |b_offset: u64, b_len: u64| {
        Raw::header(3, 2, 0)
            .tensor("blk.0.a", &[16], 0, 0)
            .tensor("blk.0.b", &[b_len], 0, b_offset)
            .pad(32)
            .bytes(&[0; 128])
    };
    let err = overlapping(32, 8).error();
    assert_names(
        &err,
        &["`blk.0.b`", "`blk.0.a`", "overlaps", "bytes of its own"],
    );
    assert_names(
        &overlapping(0, 8).error(),
        &["`blk.0.a`", "`blk.0.b`", "overlaps"],
    );
    // Adjacent is fine, and so is an empty tensor anywhere.
    assert!(GgufFile::from_bytes(overlapping(64, 8).0).is_ok());
    let empty = Raw::header(3, 2, 0)
        .tensor("blk.0.a", &[16], 0, 0)
        .tensor("blk.0.e", &[0], 0, 32)
        .pad(32)
        .bytes(&[0; 64]);
    assert!(GgufFile::from_bytes(empty.0).is_ok());
}

#[test]
fn errors_are_typed() {
    let err =
        GgufFile::from_bytes(Raw::header(3, 0, 1).kv_u32("general.alignment", 0).0).unwrap_err();
    assert!(
        matches!(err, GgufError::BadAlignment { offset: 0x18, .. }),
        "{err:?}"
    );
}
