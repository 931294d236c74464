//! Hostile model files: metadata values and tensor tables mutated on real
//! files (SmolLM2-135M, Gemma 3 270M when it can be fetched, and the
//! DeepSeek-V4 tiny fixture), loaded and run in process.
//!
//! `models/tests/gguf_fuzz.rs` covers the file structure (every corrupt
//! layout is refused by the reader); these cases keep the structure valid
//! and lie in the values: counts set to 0, 1, off by one, huge or 2^32-1;
//! floats set to NaN, infinities, -1 or 0; ids and token types out of
//! range; a tensor removed, one added, or one's data overlapping another's.
//! Each mutated file is re-emitted by the GGUF writer and loaded from
//! memory; each case states what must happen:
//!
//! - `Refused(needles)`: loading (or the first step) fails with an error
//!   naming the cause (one of the needles: the key or the tensor);
//! - `Same`: the mutation does not matter, and the logits of a short prompt
//!   are bit-identical to the unmutated file's.
//!
//! Never a panic (caught per case), never a hang (each case on its own
//! thread with a deadline), never an allocation blow-up (a counting
//! allocator bounds the heap growth of each case). The counts of cases
//! tried, clean errors, correct results, panics and hangs are printed.
//!
//! The last test truncates a model file under a running `weft run` and
//! expects the truncation guard's message and exit status, not SIGBUS.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use weft::models::gguf::{Array, GgufFile, GgufWriter, Value};
use weft::models::{LogitRows, Model};
use weft::ops::DType;
use weft::runtime::cache::ChunkPolicy;
use weft::runtime::{Device, ExecutorConfig, GraphExecutor};

#[path = "hostile_gguf/cases.rs"]
mod cases;
use cases::{dsv4_cases, gemma3_cases, smollm2_cases};

/// Counts live and peak heap bytes of the whole process.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

static PEAK: AtomicIsize = AtomicIsize::new(0);

fn track(delta: isize) {
    let now = LIVE.fetch_add(delta, Ordering::Relaxed) + delta;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// bookkeeping is two atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        track(layout.size() as isize);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        track(layout.size() as isize);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(-(layout.size() as isize));
        // SAFETY: `ptr` came from `System` with this layout.
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

/// Heap growth a case may cause beyond the mutated file's own bytes:
/// the tokenizer, the f32 copies of small matrices, a 64-token cache.
const CASE_HEAP_BYTES: isize = 512 << 20;

/// Longest a case may take before it counts as a hang.
const CASE_DEADLINE: Duration = Duration::from_secs(60);

/// A change to a file's metadata or tensor table.
#[derive(Clone, Debug)]
enum Edit {
    /// Set (or add) metadata key to a value.
    Set(&'static str, Value),
    /// Set element `index` of an array key.
    SetElement(&'static str, usize, Value),
    /// Drop the last element of an array key.
    Shorten(&'static str),
    /// Remove a metadata key.
    Remove(&'static str),
    /// Remove a tensor.
    DropTensor(&'static str),
    /// Add an f32 tensor of `n` zeros.
    AddTensor(&'static str, u64),
    /// Point the data of the first tensor at the second's.
    Overlap(&'static str, &'static str),
}

/// What a case must do.
#[derive(Clone, Debug)]
enum Expect {
    /// Fail (load or first step) with an error containing one of these.
    Refused(Vec<&'static str>),
    /// Load and give the unmutated file's logits.
    Same,
}

struct Case {
    edits: Vec<Edit>,
    expect: Expect,
}

fn case(edits: Vec<Edit>, expect: Expect) -> Case {
    Case { edits, expect }
}

/// The file's metadata and tensors re-emitted with `edits`.
fn mutate(file: &GgufFile, edits: &[Edit]) -> Vec<u8> {
    let mut metadata: Vec<(String, Value)> = file.metadata().to_vec();
    let mut dropped = Vec::new();
    let mut added = Vec::new();
    let mut overlaps = Vec::new();
    for e in edits {
        match e {
            Edit::Set(k, v) => match metadata.iter_mut().find(|(key, _)| key == k) {
                Some((_, value)) => *value = v.clone(),
                None => metadata.push((k.to_string(), v.clone())),
            },
            Edit::SetElement(k, i, v) => {
                let (_, value) = metadata
                    .iter_mut()
                    .find(|(key, _)| key == k)
                    .unwrap_or_else(|| panic!("no key {k}"));
                match (value, v) {
                    (Value::Array(Array::I32(a)), Value::I32(x)) => a[*i] = *x,
                    (Value::Array(Array::U32(a)), Value::U32(x)) => a[*i] = *x,
                    (Value::Array(Array::F32(a)), Value::F32(x)) => a[*i] = *x,
                    (other, _) => panic!("cannot set an element of {other:?}"),
                }
            }
            Edit::Shorten(k) => {
                let (_, value) = metadata
                    .iter_mut()
                    .find(|(key, _)| key == k)
                    .unwrap_or_else(|| panic!("no key {k}"));
                match value {
                    Value::Array(Array::String(a)) => {
                        a.pop();
                    }
                    Value::Array(Array::I32(a)) => {
                        a.pop();
                    }
                    other => panic!("cannot shorten {other:?}"),
                }
            }
            Edit::Remove(k) => metadata.retain(|(key, _)| key != k),
            Edit::DropTensor(n) => dropped.push(*n),
            Edit::AddTensor(n, len) => added.push((*n, *len)),
            Edit::Overlap(a, b) => overlaps.push((*a, *b)),
        }
    }
    let mut w = GgufWriter::new();
    for (k, v) in metadata {
        w.set(k, v).expect("metadata");
    }
    for t in file.tensors() {
        if !dropped.contains(&t.name.as_str()) {
            w.add_tensor(t.name.clone(), &t.dims, t.dtype, file.tensor_data(t))
                .expect("tensor");
        }
    }
    for (name, n) in added {
        w.add_tensor(name, &[n], DType::F32, vec![0u8; n as usize * 4])
            .expect("extra tensor");
    }
    let mut bytes = w.to_bytes().expect("write");
    for (a, b) in overlaps {
        overlap(&mut bytes, a, b);
    }
    bytes
}

/// Rewrites the data offset of tensor `a` in `bytes` to tensor `b`'s.
fn overlap(bytes: &mut [u8], a: &str, b: &str) {
    let field = |bytes: &[u8], name: &str| -> usize {
        let mut pattern = (name.len() as u64).to_le_bytes().to_vec();
        pattern.extend_from_slice(name.as_bytes());
        let at = bytes
            .windows(pattern.len())
            .position(|w| w == pattern.as_slice())
            .unwrap_or_else(|| panic!("tensor info {name}"));
        let dims_at = at + pattern.len();
        let n_dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().unwrap());
        dims_at + 4 + 8 * n_dims as usize + 4
    };
    let (fa, fb) = (field(bytes, a), field(bytes, b));
    let offset: [u8; 8] = bytes[fb..fb + 8].try_into().unwrap();
    bytes[fa..fa + 8].copy_from_slice(&offset);
}

fn exec() -> GraphExecutor {
    let config = ExecutorConfig {
        threads: 2,
        ..ExecutorConfig::default()
    };
    GraphExecutor::with_config(Device::Cpu, config).expect("executor")
}

/// Loads `bytes` and prefills `prompt`: the last position's logits.
fn load_and_run(bytes: Vec<u8>, prompt: &[u32]) -> Result<Vec<f32>, String> {
    let file = GgufFile::from_bytes(bytes).map_err(|e| e.to_string())?;
    let mut exec = exec();
    let model = Model::from_file(file, "mutated.gguf", &mut exec).map_err(|e| e.to_string())?;
    let mut cache = model
        .new_cache(&mut exec, 64, 64)
        .map_err(|e| e.to_string())?;
    model
        .prefill(
            &mut exec,
            &mut cache,
            prompt,
            &ChunkPolicy::single(64),
            LogitRows::Last,
        )
        .map_err(|e| e.to_string())
}

#[derive(Default, Debug)]
struct Tally {
    tried: usize,
    clean_errors: usize,
    correct: usize,
    panics: usize,
    hangs: usize,
    wrong: Vec<String>,
}

/// Runs every case of `cases` over `file` and tallies the outcomes.
fn run_cases(
    label: &str,
    file: Arc<GgufFile>,
    prompt: &[u32],
    cases: Vec<Case>,
    tally: &mut Tally,
) {
    let baseline = load_and_run(mutate(&file, &[]), prompt).expect("the unmutated file runs");
    for c in cases {
        tally.tried += 1;
        let what = format!("{label} {:?}", c.edits);
        let bytes = mutate(&file, &c.edits);
        let len = bytes.len() as isize;
        let (send, recv) = mpsc::channel();
        let prompt = prompt.to_vec();
        let start = LIVE.load(Ordering::Relaxed);
        PEAK.store(start, Ordering::Relaxed);
        std::thread::spawn(move || {
            let out = std::panic::catch_unwind(move || load_and_run(bytes, &prompt));
            let _ = send.send(out);
        });
        let outcome = match recv.recv_timeout(CASE_DEADLINE) {
            Ok(o) => o,
            Err(_) => {
                tally.hangs += 1;
                tally
                    .wrong
                    .push(format!("{what}: no answer in {CASE_DEADLINE:?}"));
                // The thread keeps running; its peak would count against
                // the next cases, so stop here.
                return;
            }
        };
        let grown = PEAK.load(Ordering::Relaxed) - start;
        if grown > len + CASE_HEAP_BYTES {
            tally
                .wrong
                .push(format!("{what}: the heap grew by {grown} bytes"));
        }
        match (outcome, &c.expect) {
            (Err(_), _) => {
                tally.panics += 1;
                tally.wrong.push(format!("{what}: panicked"));
            }
            (Ok(Err(e)), Expect::Refused(needles)) => {
                if needles.iter().any(|n| e.contains(n)) {
                    tally.clean_errors += 1;
                } else {
                    tally
                        .wrong
                        .push(format!("{what}: refused without naming {needles:?}: {e}"));
                }
            }
            (Ok(Err(e)), Expect::Same) => {
                tally
                    .wrong
                    .push(format!("{what}: refused a harmless change: {e}"));
            }
            (Ok(Ok(logits)), Expect::Same) => {
                let same = logits.len() == baseline.len()
                    && logits
                        .iter()
                        .zip(&baseline)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                if same {
                    tally.correct += 1;
                } else {
                    tally
                        .wrong
                        .push(format!("{what}: ran with different logits"));
                }
            }
            (Ok(Ok(_)), Expect::Refused(needles)) => {
                tally.wrong.push(format!(
                    "{what}: loaded and ran; expected an error naming {needles:?}"
                ));
            }
        }
    }
}

const BIG: u32 = u32::MAX;

fn u(v: u32) -> Value {
    Value::U32(v)
}

fn f(v: f32) -> Value {
    Value::F32(v)
}

/// Counts of key `k` that must all be refused with an error naming `k`.
fn refused_counts(k: &'static str, values: &[u32], out: &mut Vec<Case>) {
    for &v in values {
        out.push(case(vec![Edit::Set(k, u(v))], Expect::Refused(vec![k])));
    }
}

/// Floats of key `k` that must all be refused with an error naming `k`.
fn refused_floats(k: &'static str, values: &[f32], out: &mut Vec<Case>) {
    for &v in values {
        out.push(case(vec![Edit::Set(k, f(v))], Expect::Refused(vec![k])));
    }
}

/// NaN, an infinity, -1 and 0.
const BAD_FLOATS: [f32; 4] = [f32::NAN, f32::INFINITY, -1.0, 0.0];

fn report(tally: &Tally) {
    eprintln!(
        "hostile GGUF cases: {} tried, {} clean errors, {} correct results, {} panics, {} hangs, {} wrong",
        tally.tried,
        tally.clean_errors,
        tally.correct,
        tally.panics,
        tally.hangs,
        tally.wrong.len()
    );
    for w in &tally.wrong {
        eprintln!("  {w}");
    }
}

#[test]
fn mutated_metadata_and_tensor_tables_are_refused_or_harmless() {
    let mut tally = Tally::default();
    let dsv4 = common::reference_dir().join("dsv4_tiny/flash-tiny-short/model.gguf");
    let file = Arc::new(GgufFile::open(&dsv4).expect("the DeepSeek-V4 tiny fixture"));
    run_cases(
        "deepseek4",
        file,
        &[0, 5, 9, 17, 33],
        dsv4_cases(),
        &mut tally,
    );
    if let Some(path) = weft_testkit::require::model_path(&weft::models::fetch::SMOLLM2_135M_Q4_1) {
        let file = Arc::new(GgufFile::open(&path).expect("SmolLM2"));
        run_cases(
            "llama",
            file,
            &[504, 3575, 282, 4649, 314],
            smollm2_cases(),
            &mut tally,
        );
    }
    if let Some(path) = weft_testkit::require::model_path(&weft::models::fetch::GEMMA3_270M_Q4_K_M)
    {
        let file = Arc::new(GgufFile::open(&path).expect("Gemma 3"));
        run_cases(
            "gemma3",
            file,
            &[2, 100, 200, 300, 400],
            gemma3_cases(),
            &mut tally,
        );
    }
    report(&tally);
    assert!(
        tally.wrong.is_empty() && tally.panics == 0 && tally.hangs == 0,
        "{} of {} cases went wrong (listed above)",
        tally.wrong.len(),
        tally.tried
    );
    assert_eq!(tally.tried, tally.clean_errors + tally.correct);
}

/// A model file truncated while `weft run` decodes from it: the run ends
/// with the truncation guard's message naming the file and its exit
/// status (below 128), not with SIGBUS.
#[cfg(unix)]
#[test]
fn a_model_file_truncated_during_a_run_is_named_not_a_crash() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let src = common::reference_dir().join("dsv4_tiny/flash-tiny/model.gguf");
    let dir = std::env::temp_dir().join(format!("weft-truncated-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("model.gguf");
    std::fs::write(&path, std::fs::read(&src).expect("fixture")).expect("copy");
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["run", "--backend", "cpu", "--threads", "1", "--temp", "0"])
        .args([
            "--ignore-eos",
            "-n",
            "4000",
            "--prompt-ids",
            "1,2,3",
            "--model",
        ])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("weft run");
    // Truncate once the run is generating (its first output byte).
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 1];
    let _ = stdout.read(&mut first);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(4096))
        .expect("truncate");
    let reader = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = stdout.read_to_end(&mut rest);
    });
    let out = child.wait_with_output().expect("wait");
    let _ = reader.join();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    assert_eq!(
        code,
        Some(weft::models::gguf::TRUNCATED_EXIT_CODE),
        "exit {:?}, stderr: {stderr}",
        out.status
    );
    assert!(
        stderr.contains(&path.display().to_string()) && stderr.contains("truncated"),
        "{stderr}"
    );
}

/// Gemma 3's own keys, on a config-only file (the counts bounded by one
/// tensor: 12 blocks, nothing wider than 2048): each bad value is refused
/// naming its key, and the unmutated file reads.
#[test]
fn gemma3_metadata_out_of_range_is_refused() {
    use weft::models::gemma3::Gemma3Config;
    let build = |edit: Option<(&str, Value)>| {
        let mut w = GgufWriter::new();
        w.set("general.architecture", "gemma3").unwrap();
        let mut entries: Vec<(String, Value)> = [
            ("block_count", u(12)),
            ("embedding_length", u(640)),
            ("feed_forward_length", u(2048)),
            ("attention.head_count", u(4)),
            ("attention.head_count_kv", u(1)),
            ("attention.key_length", u(256)),
            ("attention.sliding_window", u(512)),
            ("rope.freq_base_swa", f(10_000.0)),
            ("attention.layer_norm_rms_epsilon", f(1e-6)),
        ]
        .into_iter()
        .map(|(k, v)| (format!("gemma3.{k}"), v))
        .collect();
        if let Some((k, v)) = edit {
            match entries.iter_mut().find(|(key, _)| key == k) {
                Some((_, value)) => *value = v,
                None => entries.push((k.to_string(), v)),
            }
        }
        for (k, v) in entries {
            w.set(k, v).unwrap();
        }
        w.add_tensor(
            "blk.11.ffn_norm.weight",
            &[2048],
            DType::F32,
            vec![0u8; 2048 * 4],
        )
        .unwrap();
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    };
    Gemma3Config::from_gguf(&build(None)).expect("the unmutated config");
    let cases: Vec<(&str, Value)> = vec![
        ("gemma3.attention.sliding_window", u(0)),
        ("gemma3.attention.sliding_window", u(BIG)),
        ("gemma3.block_count", u(0)),
        ("gemma3.block_count", u(13)),
        ("gemma3.block_count", u(BIG)),
        ("gemma3.embedding_length", u(BIG)),
        ("gemma3.attention.head_count", u(0)),
        ("gemma3.attention.key_length", u(BIG)),
        ("gemma3.rope.dimension_count", u(255)),
        ("gemma3.rope.dimension_count", u(0)),
        ("gemma3.attention.layer_norm_rms_epsilon", f(f32::NAN)),
        ("gemma3.attention.layer_norm_rms_epsilon", f(-1.0)),
        ("gemma3.rope.freq_base", f(0.0)),
        ("gemma3.rope.freq_base_swa", f(f32::NAN)),
        ("gemma3.final_logit_softcapping", f(f32::INFINITY)),
        ("gemma3.final_logit_softcapping", f(f32::NAN)),
    ];
    for (k, v) in cases {
        let shown = format!("{v:?}");
        match Gemma3Config::from_gguf(&build(Some((k, v)))) {
            Ok(_) => panic!("{k} = {shown} was accepted"),
            Err(e) => assert!(e.to_string().contains(k), "{k} = {shown}: {e}"),
        }
    }
}

/// weft's own synthetic DeepSeek-V4 files (what `weft synth-model` writes,
/// with its one multi-token-prediction block announced) satisfy every
/// check a loaded model makes: all tensors used, one vocabulary, counts in
/// bounds.
#[test]
fn synthetic_deepseek4_files_pass_the_loader_checks() {
    use weft::models::deepseek4::synthetic::{flash_config, random_gguf, TensorTypes};
    let mut c = flash_config();
    c.layers = 3;
    c.hidden = 256;
    c.vocab = 300;
    c.heads = 2;
    c.head_dim = 64;
    c.rope_dims = 16;
    c.q_lora = 64;
    c.out_groups = 2;
    c.out_rank = 32;
    c.window = 16;
    c.ratios = vec![0, 4, 16];
    c.indexer_heads = 4;
    c.indexer_dim = 32;
    c.indexer_top_k = 3;
    c.experts = 4;
    c.experts_used = 2;
    c.expert_ff = 256;
    c.hash_layers = 1;
    c.clamp_exp = vec![10.0; 3];
    c.clamp_shexp = vec![10.0; 3];
    c.context = 4096;
    let bytes = random_gguf(&c, &TensorTypes::flash_gguf(), 3).expect("gguf");
    let logits = load_and_run(bytes, &[1, 2, 3]).expect("a synthetic file loads and runs");
    assert_eq!(logits.len(), c.vocab);
}
