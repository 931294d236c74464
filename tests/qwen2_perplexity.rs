//! Perplexity of Qwen2.5-Coder-0.5B on the GPL-3 text at ctx 512 within
//! 0.5% of llama.cpp's (`llama-perplexity -c 512 -b 512`: 14 windows of
//! 512 tokens, no BOS, each scoring its second half).

mod common;

/// Where the text lies on Debian-based machines (the reference names it
/// `GPL-3`).
const TEXT: &str = "/usr/share/common-licenses/GPL-3";

#[test]
fn perplexity_is_within_half_a_percent_of_llama_cpp() {
    let Some(common::Setup { mut exec, model }) = common::load_qwen2(2, None) else {
        return;
    };
    let reference = common::reference_json("qwen2.json");
    let case = &reference["perplexity"][0];
    assert_eq!(case["file"].as_str(), Some("GPL-3"));
    let Ok(text) = std::fs::read_to_string(TEXT) else {
        assert!(
            std::env::var_os("WEFT_TEST_REQUIRE_MODEL").is_none(),
            "the perplexity text {TEXT} is missing"
        );
        eprintln!("skipping: {TEXT} is not on this machine");
        return;
    };
    let want = case["ppl"].as_f64().expect("ppl");
    let ctx = case["ctx"].as_u64().expect("ctx") as usize;
    let tokens = model.tokenizer.encode(&text);
    assert_eq!(
        tokens.len() as u64,
        case["tokens"].as_u64().expect("tokens"),
        "tokens of {TEXT}"
    );
    let start = std::time::Instant::now();
    let got = weft::models::eval::perplexity(&model, &mut exec, &tokens, ctx, &mut |_, _| {})
        .expect("perplexity");
    eprintln!(
        "perplexity {:.4} vs llama.cpp {want} over {} chunks ({:+.3}%) in {:.1} s",
        got.ppl,
        got.chunks,
        (got.ppl - want) / want * 100.0,
        start.elapsed().as_secs_f64()
    );
    assert_eq!(
        got.chunks,
        case["chunks"].as_u64().expect("chunks") as usize
    );
    assert!(
        (got.ppl - want).abs() / want < 0.005,
        "perplexity {} vs {want}",
        got.ppl
    );
}
