//! Perplexity of SmolLM2 on the reference text within 1% of llama.cpp's.

mod common;

#[test]
fn perplexity_is_within_one_percent_of_llama_cpp() {
    let Some(common::Setup { mut exec, model }) = common::load_smollm2(2, None) else {
        return;
    };
    let reference = common::reference_json("smollm2.json");
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
        "perplexity {:.4} vs llama.cpp {want} over {} chunks",
        got.ppl, got.chunks
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
