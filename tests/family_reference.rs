//! Tiny random-weight models of each family weft runs through the Llama
//! pass, against llama.cpp 0c1e57098 and transformers on the same GGUF.
//!
//! The fixtures (`tests/reference/families/FAMILY.{gguf,json}`) come
//! from `scripts/family_fixtures.py`: a transformers model of the
//! architecture (2 layers, width 64, 4 heads over 2 KV heads, f32
//! weights, random norm weights), converted by llama.cpp's
//! `convert_hf_to_gguf.py`, with a small trained tokenizer of the
//! family's kind. The JSON holds llama.cpp's prompt ids, its 16-token
//! greedy continuation and top-5 logits at every step (CPU, 2 threads, KV
//! cache f16, flash attention as weft runs the architecture), and
//! transformers' fp32 logits of the first step.
//!
//! Checked, in exact and in fast numerics: the prompt ids equal
//! llama.cpp's; the free-running greedy continuation equals llama.cpp's;
//! every top-5 logit at every step is within [`LLAMA_CPP_TOLERANCE`] of
//! llama.cpp's ([`LLAMA_CPP_TOLERANCE_FAST`] in fast numerics), and the first step's logits within
//! [`TRANSFORMERS_TOLERANCE`] of transformers' over the whole vocabulary.
//! One fixture, `mistral_swa` (a sliding window in the metadata, which
//! llama.cpp does not apply to `llama`), has transformers' outputs at
//! every step as its reference instead.

mod common;

use common::reference_dir;
use weft::models::sampling::argmax;
use weft::models::{LogitRows, Model};
use weft::runtime::{Device, DiagnosticsConfig, ExecutorConfig, GraphExecutor, Numerics};
use weft_testkit::reference::read_reference_json;

/// Largest difference allowed from llama.cpp's top-5 logits in exact
/// numerics. Both run f32 weights with f32 activations and round keys and
/// values to f16 in the cache; exact numerics follow llama.cpp's
/// arithmetic but for the order of some f32 sums (the f32 matmuls), so
/// logits (magnitude up to ~5) differ by a few ulps (measured: at most
/// 2.4e-7).
const LLAMA_CPP_TOLERANCE: f32 = 1e-5;

/// The same in fast numerics: attention sums in another order with its
/// own exponential, and its f16 roundings of the probabilities differ
/// from llama.cpp's, an error of about 2^-11 relative on each attention
/// output (measured: at most 2.1e-3).
const LLAMA_CPP_TOLERANCE_FAST: f32 = 1e-2;

/// [`LLAMA_CPP_TOLERANCE`] for the MoE family: the router's softmax takes
/// another exponential than ggml's and the experts' matmuls and weighted
/// sum add in another order, so exact numerics differ from llama.cpp at
/// the level of f32 rounding of every expert output (measured: at most
/// 2.3e-5).
const LLAMA_CPP_TOLERANCE_MOE: f32 = 1e-4;

/// Largest difference allowed from transformers' fp32 logits of the first
/// step: transformers keeps keys and values in f32, weft (like llama.cpp)
/// rounds them to f16, a relative error of 2^-11 on every cached value
/// (measured: at most 2.5e-3, first steps and `mistral_swa`'s every step).
const TRANSFORMERS_TOLERANCE: f32 = 2e-2;

struct Case {
    text: String,
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    top5: Vec<Vec<(usize, f32)>>,
    transformers_first: Vec<f32>,
}

/// The context llama.cpp ran `family`'s fixture with, also the cache's.
fn fixture_context(family: &str) -> u32 {
    let doc = read_reference_json(&reference_dir().join(format!("families/{family}.json")));
    doc["llama_cpp"]["n_ctx"].as_u64().expect("llama_cpp.n_ctx") as u32
}

fn cases(family: &str) -> Vec<Case> {
    let doc = read_reference_json(&reference_dir().join(format!("families/{family}.json")));
    assert_eq!(doc["family"].as_str(), Some(family));
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        serde_json::from_value(v.clone()).expect("token ids")
    };
    doc["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().expect("text").to_string(),
            prompt: ids(&c["prompt_ids"]),
            greedy: ids(&c["greedy_ids"]),
            top5: c["top5_steps"]
                .as_array()
                .expect("top5_steps")
                .iter()
                .map(|step| {
                    step.as_array()
                        .expect("top5")
                        .iter()
                        .map(|p| {
                            (
                                p[0].as_u64().expect("id") as usize,
                                p[1].as_f64().expect("logit") as f32,
                            )
                        })
                        .collect()
                })
                .collect(),
            transformers_first: serde_json::from_value(c["transformers_first_logits"].clone())
                .expect("transformers_first_logits"),
        })
        .collect()
}

fn load(family: &str, numerics: Numerics, threads: usize) -> (GraphExecutor, Model) {
    let config = ExecutorConfig {
        threads,
        diagnostics: DiagnosticsConfig::checked(),
        numerics,
        ..Default::default()
    };
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let path = reference_dir().join(format!("families/{family}.gguf"));
    let model =
        Model::load(&path, &mut exec).unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    (exec, model)
}

/// Largest differences seen: from the reference's top-5 logits at every
/// step (llama.cpp's, or transformers' for `mistral_swa`), from
/// transformers' first-step logits.
#[derive(Default)]
struct Diffs {
    llama_cpp: f32,
    transformers: f32,
}

fn run_family(
    family: &str,
    arch: &str,
    exact_tolerance: f32,
    numerics: Numerics,
    threads: usize,
) -> Diffs {
    let (exec, model) = load(family, numerics, threads);
    let context = fixture_context(family);
    run_model(
        family,
        arch,
        exact_tolerance,
        (numerics, threads, context),
        exec,
        model,
    )
    .unwrap_or_else(|failures| panic!("{failures}"))
}

/// Runs every case of `family`'s fixture on `model`: the largest
/// differences, or every failure.
fn run_model(
    family: &str,
    arch: &str,
    exact_tolerance: f32,
    (numerics, threads, context): (Numerics, usize, u32),
    mut exec: GraphExecutor,
    model: Model,
) -> Result<Diffs, String> {
    assert_eq!(model.arch, arch);
    let mut failures = Vec::new();
    let mut diffs = Diffs::default();
    let tolerance = match numerics {
        Numerics::Exact => exact_tolerance,
        Numerics::Fast => LLAMA_CPP_TOLERANCE_FAST.max(exact_tolerance),
    };
    let cases = cases(family);
    assert!(!cases.is_empty());
    for (i, case) in cases.iter().enumerate() {
        assert_eq!(
            model.tokenizer.encode(&case.text),
            case.prompt,
            "{family} case {i}: prompt ids"
        );
        let mut cache = model.new_cache(&mut exec, context, context).expect("cache");
        let mut logits = model
            .prefill(
                &mut exec,
                &mut cache,
                &case.prompt,
                &model.chunk_policy(),
                LogitRows::Last,
            )
            .expect("prefill");
        assert_eq!(
            logits.len(),
            case.transformers_first.len(),
            "{family}: vocabulary"
        );
        for (id, (&got, &want)) in logits.iter().zip(&case.transformers_first).enumerate() {
            let d = (got - want).abs();
            diffs.transformers = diffs.transformers.max(d);
            if d > TRANSFORMERS_TOLERANCE {
                failures.push(format!(
                    "case {i} first step: logit of {id} is {got}, transformers {want}"
                ));
            }
        }
        let mut got = Vec::new();
        for (k, top5) in case.top5.iter().enumerate() {
            for &(id, want) in top5 {
                let d = (logits[id] - want).abs();
                diffs.llama_cpp = diffs.llama_cpp.max(d);
                if d > tolerance {
                    failures.push(format!(
                        "case {i} step {k}: logit of {id} is {}, llama.cpp {want}",
                        logits[id]
                    ));
                }
            }
            let t = argmax(&logits) as u32;
            got.push(t);
            if k + 1 < case.greedy.len() {
                // Teacher-forced with llama.cpp's token, so one early
                // disagreement cannot hide the later steps.
                logits = model
                    .step(&mut exec, &mut cache, &[case.greedy[k]], LogitRows::Last)
                    .expect("decode");
            }
        }
        if got != case.greedy {
            failures.push(format!(
                "case {i}: greedy\n  got  {got:?}\n  want {:?}",
                case.greedy
            ));
        }
    }
    if !failures.is_empty() {
        return Err(format!("{family} ({numerics:?}):\n{}", failures.join("\n")));
    }
    eprintln!(
        "{family} ({numerics:?}, {threads} threads): max |logit - reference| {:.3e} (every step), max |logit - transformers| {:.3e} (first step)",
        diffs.llama_cpp, diffs.transformers
    );
    Ok(diffs)
}

fn check_family(family: &str, arch: &str, exact_tolerance: f32) {
    for numerics in [Numerics::Exact, Numerics::Fast] {
        for threads in [1, 2] {
            run_family(family, arch, exact_tolerance, numerics, threads);
        }
    }
}

/// Llama 3.x: `llama` with `rope_freqs.weight` (the `llama3` rope
/// scaling, factor 8 over an original context of 64) and the `llama-bpe`
/// pre-tokenizer.
#[test]
fn llama3_matches_llama_cpp() {
    check_family("llama3", "llama", LLAMA_CPP_TOLERANCE);
}

/// Mistral: `llama` with a SentencePiece vocabulary.
#[test]
fn mistral_matches_llama_cpp() {
    check_family("mistral", "llama", LLAMA_CPP_TOLERANCE);
}

/// Qwen 3: `qwen3`, per-head q/k RMS norms before rope, NEOX rope, the
/// `qwen2` pre-tokenizer.
#[test]
fn qwen3_matches_llama_cpp() {
    check_family("qwen3", "qwen3", LLAMA_CPP_TOLERANCE);
}

/// Phi-3: `phi3`, fused qkv and gate/up matrices, queries scaled before
/// attention, a SentencePiece vocabulary with Phi-3's chat tokens.
#[test]
fn phi3_matches_llama_cpp() {
    check_family("phi3", "phi3", LLAMA_CPP_TOLERANCE);
}

/// Qwen 3 MoE: `qwen3moe`, Qwen 3's attention and 8 experts per layer, 2
/// per token chosen by a softmax over the router logits, their
/// probabilities renormalised.
#[test]
fn qwen3moe_matches_llama_cpp() {
    check_family("qwen3moe", "qwen3moe", LLAMA_CPP_TOLERANCE_MOE);
}

/// Mistral with `llama.attention.sliding_window = 8` in its metadata and
/// prompts of 23 and 25 tokens: every layer attends over the last 8
/// positions. llama.cpp runs `llama` files without a window (and its
/// converter writes none), so this fixture's reference at every step is
/// transformers' (fp32, the window applied, K/V unrounded), within
/// [`TRANSFORMERS_TOLERANCE`] (measured: printed).
#[test]
fn mistral_sliding_window_matches_transformers() {
    check_family("mistral_swa", "llama", TRANSFORMERS_TOLERANCE);
}

/// The window is what the fixture tests: without it weft's greedy
/// continuation leaves transformers'.
#[test]
fn mistral_without_its_window_differs() {
    let (exec, mut model) = load("mistral_swa", Numerics::Exact, 2);
    match &mut model.family {
        weft::models::Family::Llama(m) => {
            assert_eq!(m.config.window, Some(8));
            m.config.window = None;
        }
        _ => panic!("mistral_swa loads as the Llama family"),
    }
    let result = run_model(
        "mistral_swa",
        "llama",
        TRANSFORMERS_TOLERANCE,
        (Numerics::Exact, 2, 64),
        exec,
        model,
    );
    let failures = result
        .err()
        .expect("full attention matched the windowed reference");
    assert!(failures.contains("greedy"), "{failures}");
}

/// Phi-3 with `longrope` scaling (short and long per-pair factors over an
/// original context of 64, `rope.scaling.attn_factor`): llama.cpp ran it
/// with a context of 128, so both it and weft take the long factors.
#[test]
fn phi3_longrope_matches_llama_cpp() {
    check_family("phi3_longrope", "phi3", LLAMA_CPP_TOLERANCE);
}

/// The factors follow the context: with a cache of 64 positions (not
/// longer than the original context) weft takes the short factors and
/// leaves the long-factor reference.
#[test]
fn phi3_longrope_takes_the_short_factors_in_a_short_context() {
    let (exec, model) = load("phi3_longrope", Numerics::Exact, 2);
    let failures = run_model(
        "phi3_longrope",
        "phi3",
        LLAMA_CPP_TOLERANCE,
        (Numerics::Exact, 2, 64),
        exec,
        model,
    )
    .err()
    .expect("the short factors matched the long-factor reference");
    assert!(failures.contains("logit"), "{failures}");
}

/// Every position's logits of case 0's prompt and of four decode steps
/// after it, under one schedule.
fn schedule_logits(
    family: &str,
    threads: usize,
    reorder: bool,
    fuse: bool,
    layers_per_cb: Option<u32>,
) -> Vec<u32> {
    let mut config = ExecutorConfig {
        threads,
        diagnostics: DiagnosticsConfig::checked(),
        reorder,
        fuse,
        ..Default::default()
    };
    config.cut.layers_per_cb = layers_per_cb;
    let mut exec = GraphExecutor::with_config(Device::Cpu, config).expect("executor");
    let path = reference_dir().join(format!("families/{family}.gguf"));
    let model = Model::load(&path, &mut exec).expect("load");
    let case = &cases(family)[0];
    let context = fixture_context(family);
    let mut cache = model.new_cache(&mut exec, context, context).expect("cache");
    let mut out = model
        .prefill(
            &mut exec,
            &mut cache,
            &case.prompt,
            &model.chunk_policy(),
            LogitRows::All,
        )
        .expect("prefill");
    for &t in &case.greedy[..4] {
        out.extend(
            model
                .step(&mut exec, &mut cache, &[t], LogitRows::Last)
                .expect("decode"),
        );
    }
    out.iter().map(|v| v.to_bits()).collect()
}

/// The schedule decides when a node runs, never what it computes: the
/// same bits with one thread or two, reorder and fusion on or off, one
/// layer per command buffer or all of them (a difference would be a
/// missing or wrong byte range of an op these families use).
#[test]
fn schedules_do_not_change_the_logits() {
    for family in [
        "llama3",
        "mistral_swa",
        "qwen3",
        "phi3_longrope",
        "qwen3moe",
    ] {
        let baseline = schedule_logits(family, 2, true, true, None);
        for (threads, reorder, fuse, layers) in [
            (1, false, false, Some(1)),
            (2, false, true, Some(1)),
            (2, true, false, None),
        ] {
            assert!(
                schedule_logits(family, threads, reorder, fuse, layers) == baseline,
                "{family}: {threads} threads, reorder {reorder}, fuse {fuse}, layers per cb {layers:?}"
            );
        }
    }
}
