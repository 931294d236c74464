//! Fuzzing the GGUF reader with mutated bytes of a valid synthetic file.
//!
//! Each case flips bits, overwrites bytes, splices huge length values,
//! inserts, deletes or truncates, then parses. The reader must return `Ok`
//! (a file whose tensors lie inside it, apart from each other) or `Err`
//! without panicking, and its peak heap use while parsing must stay
//! within a small multiple of the input size (a counting allocator measures
//! it per thread). `PROPTEST_CASES` overrides the case count (CI keeps the
//! default, a few seconds).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;
use weft_models::gguf::{Array, GgufFile, GgufWriter, Value};
use weft_ops::DType;

/// Counts live and peak heap bytes of the current thread.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    // try_with: the thread-locals may be gone while a thread shuts down.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// bookkeeping only touches const-initialised thread-locals, which never
// allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        track(layout.size() as isize);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(-(layout.size() as isize));
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        track(new_size as isize - layout.size() as isize);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak heap growth of the current thread while `f` runs.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, (peak - start).max(0) as usize)
}

/// A small valid file exercising every structure the reader parses.
fn seed() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set_alignment(64).unwrap();
    w.set("general.architecture", "llama").unwrap();
    w.set("llama.block_count", 2u32).unwrap();
    w.set("llama.rope.freq_base", 10000.0f32).unwrap();
    w.set("tokenizer.ggml.add_bos_token", true).unwrap();
    w.set("tokenizer.ggml.tokens", vec!["<s>", "a", "b", "ab"])
        .unwrap();
    w.set("tokenizer.ggml.scores", vec![0.0f32, -1.0, -2.0, -3.0])
        .unwrap();
    w.set("tokenizer.ggml.token_type", vec![3i32, 1, 1, 1])
        .unwrap();
    w.set("x.i64", vec![i64::MIN, 3]).unwrap();
    w.set(
        "x.nested",
        Array::Array(vec![
            Array::U16(vec![1, 2]),
            Array::String(vec!["z".into()]),
        ]),
    )
    .unwrap();
    w.set("x.f64", Value::F64(0.5)).unwrap();
    w.add_tensor(
        "token_embd.weight",
        &[32, 4],
        DType::Q8_0,
        vec![7u8; 34 * 4],
    )
    .unwrap();
    w.add_tensor("blk.0.attn_norm.weight", &[8], DType::F32, vec![1u8; 32])
        .unwrap();
    w.add_tensor("blk.0.attn_q.weight", &[32, 2], DType::Q4_1, vec![2u8; 40])
        .unwrap();
    w.to_bytes().unwrap()
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Overwrite { at: usize, byte: u8 },
    Splice { at: usize, value: u64 },
    Insert { at: usize, bytes: Vec<u8> },
    Delete { at: usize, len: usize },
    Truncate { len: usize },
}

fn huge_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(u64::MAX),
        Just(u64::MAX / 2),
        Just(i64::MAX as u64),
        Just(1u64 << 32),
        Just(1u64 << 40),
        Just(1u64 << 62),
        Just(0),
        0u64..64,
        any::<u64>(),
    ]
}

/// Positions mostly in the header region (where the structure is), some anywhere.
fn position(header: usize, len: usize) -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0..header, 1 => 0..len]
}

fn mutation(header: usize, len: usize) -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (position(header, len), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (position(header, len), any::<u8>())
            .prop_map(|(at, byte)| Mutation::Overwrite { at, byte }),
        (position(header, len), huge_value())
            .prop_map(|(at, value)| Mutation::Splice { at, value }),
        (
            position(header, len),
            prop::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (position(header, len), 1usize..32).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (0..len).prop_map(|len| Mutation::Truncate { len }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let len = bytes.len();
    match m {
        Mutation::Flip { at, bit } => {
            if let Some(b) = bytes.get_mut(*at) {
                *b ^= 1 << bit;
            }
        }
        Mutation::Overwrite { at, byte } => {
            if let Some(b) = bytes.get_mut(*at) {
                *b = *byte;
            }
        }
        Mutation::Splice { at, value } => {
            for (i, v) in value.to_le_bytes().into_iter().enumerate() {
                if let Some(b) = bytes.get_mut(at + i) {
                    *b = v;
                }
            }
        }
        Mutation::Insert { at, bytes: new } => {
            let at = (*at).min(len);
            bytes.splice(at..at, new.iter().copied());
        }
        Mutation::Delete { at, len: n } => {
            let at = (*at).min(len);
            bytes.drain(at..(at + n).min(len));
        }
        Mutation::Truncate { len: n } => bytes.truncate(*n),
    }
}

/// Everything a caller might do with a file that parsed.
fn exercise(file: &GgufFile) {
    for (key, _) in file.metadata() {
        let _ = file.get_u32(key);
        let _ = file.get_f32(key);
        let _ = file.get_str(key);
        let _ = file.get_str_array(key);
        let _ = file.get_i32_array(key);
        let _ = file.get_u32_array(key);
        let _ = file.get_f32_array(key);
        let _ = file.get(key).map(ToString::to_string);
    }
    let mut ranges: Vec<(u64, u64)> = file
        .tensors()
        .iter()
        .filter(|t| t.bytes > 0)
        .map(|t| (t.offset, t.offset + t.bytes))
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "tensor data overlaps: {pair:?}");
    }
    for t in file.tensors() {
        assert_eq!(file.tensor_data(t).len() as u64, t.bytes, "{}", t.name);
        assert!(t.offset + t.bytes <= file.bytes().len() as u64);
        assert_eq!((t.offset - file.data_offset()) % file.alignment(), 0);
        assert_eq!(file.tensor(&t.name), Some(t));
    }
}

/// Peak parse allocation allowed for an input of `len` bytes: every parsed
/// structure is a small constant factor larger than its smallest encoding.
fn allocation_bound(len: usize) -> usize {
    16 * len + (64 << 10)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

#[test]
fn seed_is_valid() {
    let bytes = seed();
    let file = GgufFile::from_bytes(bytes).unwrap();
    exercise(&file);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_files_never_panic_or_over_allocate(
        mutations in {
            let bytes = seed();
            let header = GgufFile::from_bytes(bytes.clone()).map(|f| f.data_offset() as usize).unwrap_or(64);
            prop::collection::vec(mutation(header, bytes.len()), 1..6)
        }
    ) {
        let mut bytes = seed();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        let len = bytes.len();
        let (result, peak) = peak_during(|| GgufFile::from_bytes(bytes));
        prop_assert!(peak <= allocation_bound(len), "parse of {} bytes allocated {} bytes", len, peak);
        match result {
            Ok(file) => exercise(&file),
            Err(e) => prop_assert!(e.to_string().starts_with("[gguf]"), "{}", e),
        }
    }
}

/// Any finite-float metadata value, arrays nested up to three levels.
fn value() -> impl Strategy<Value = Value> {
    let leaf_array = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..8).prop_map(Array::U8),
        prop::collection::vec(any::<i16>(), 0..8).prop_map(Array::I16),
        prop::collection::vec(any::<i32>(), 0..8).prop_map(Array::I32),
        prop::collection::vec(-1e30f32..1e30, 0..8).prop_map(Array::F32),
        prop::collection::vec(any::<bool>(), 0..8).prop_map(Array::Bool),
        prop::collection::vec(".{0,6}", 0..8).prop_map(Array::String),
        prop::collection::vec(any::<u64>(), 0..4).prop_map(Array::U64),
        prop::collection::vec(-1e300f64..1e300, 0..4).prop_map(Array::F64),
    ];
    let array = leaf_array.prop_recursive(3, 16, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(Array::Array)
    });
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<u32>().prop_map(Value::U32),
        any::<i64>().prop_map(Value::I64),
        (-1e30f32..1e30).prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        ".{0,12}".prop_map(Value::String),
        array.prop_map(Value::Array),
    ]
}

/// A random valid file: metadata, F32/Q8_0 tensors, alignment 2^k.
fn random_file() -> impl Strategy<Value = Vec<u8>> {
    let metadata = prop::collection::btree_map("[a-z.]{1,10}", value(), 0..8);
    let tensors = prop::collection::vec((1u64..5, 1u64..4, any::<bool>(), any::<u8>()), 0..4);
    (metadata, tensors, 0u32..8).prop_map(|(metadata, tensors, log_align)| {
        let mut w = GgufWriter::new();
        w.set_alignment(1 << log_align).unwrap();
        for (k, v) in metadata {
            if k != "general.alignment" {
                w.set(k, v).unwrap();
            }
        }
        for (i, (blocks, rows, quantized, fill)) in tensors.into_iter().enumerate() {
            let (dtype, ne0, bytes) = if quantized {
                (DType::Q8_0, 32 * blocks, 34 * blocks)
            } else {
                (DType::F32, blocks, 4 * blocks)
            };
            w.add_tensor(
                format!("t{i}"),
                &[ne0, rows],
                dtype,
                vec![fill; (bytes * rows) as usize],
            )
            .unwrap();
        }
        w.to_bytes().unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases() / 20, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_files_round_trip_and_survive_mutation(
        bytes in random_file(),
        mutations in prop::collection::vec(mutation(256, 1024), 1..4),
    ) {
        let file = GgufFile::from_bytes(bytes.clone()).unwrap();
        let mut w = GgufWriter::new();
        for (k, v) in file.metadata() {
            w.set(k.clone(), v.clone()).unwrap();
        }
        for t in file.tensors() {
            w.add_tensor(t.name.clone(), &t.dims, t.dtype, file.tensor_data(t)).unwrap();
        }
        prop_assert_eq!(w.to_bytes().unwrap(), bytes.clone(), "write(read(x)) != x");

        let mut mutated = bytes;
        for m in &mutations {
            apply(&mut mutated, m);
        }
        let len = mutated.len();
        let (result, peak) = peak_during(|| GgufFile::from_bytes(mutated));
        prop_assert!(peak <= allocation_bound(len), "parse of {} bytes allocated {} bytes", len, peak);
        if let Ok(file) = result {
            exercise(&file);
        }
    }
}

#[test]
fn huge_counts_allocate_nothing_large() {
    // A header claiming 2^60 metadata entries, then garbage.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
    bytes.extend_from_slice(&[0xff; 4096]);
    let len = bytes.len();
    let (result, peak) = peak_during(|| GgufFile::from_bytes(bytes));
    assert!(result.is_err());
    assert!(peak <= allocation_bound(len), "{peak}");
}
