//! Perplexity of Gemma 3 270M on the reference text at ctx 1024 within 1%
//! of llama.cpp's. The window is longer than the model's 512-token sliding
//! window, so the local layers really slide; every window's first token is
//! replaced by BOS, as llama-perplexity does for a model that adds BOS.

mod common;

#[test]
fn perplexity_is_within_one_percent_of_llama_cpp() {
    let Some(common::Setup { mut exec, model }) = common::load_gemma3(2, None) else {
        return;
    };
    let reference = common::reference_json("gemma3.json");
    let case = &reference["perplexity"][0];
    let path = case["file"].as_str().expect("file");
    let Ok(text) = std::fs::read_to_string(path) else {
        assert!(
            std::env::var_os("WEFT_TEST_REQUIRE_MODEL").is_none(),
            "the perplexity text {path} is missing"
        );
        eprintln!("skipping: {path} is not on this machine");
        return;
    };
    let want = case["ppl"].as_f64().expect("ppl");
    let ctx = case["ctx"].as_u64().expect("ctx") as usize;
    let tokens = model.tokenizer.encode(&text);
    let got = weft::models::eval::perplexity(&model, &mut exec, &tokens, ctx, &mut |_, _| {})
        .expect("perplexity");
    eprintln!(
        "perplexity {:.4} vs llama.cpp {want} over {} chunks ({:+.3}%)",
        got.ppl,
        got.chunks,
        (got.ppl - want) / want * 100.0
    );
    assert_eq!(
        got.chunks,
        case["chunks"].as_u64().expect("chunks") as usize
    );
    assert!(
        (got.ppl - want).abs() / want < 0.01,
        "perplexity {} vs {want}",
        got.ppl
    );
}
