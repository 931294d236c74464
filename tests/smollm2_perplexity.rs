//! Perplexity of SmolLM2 on the reference text within 1% of llama.cpp's.

mod common;

#[test]
fn perplexity_is_within_one_percent_of_llama_cpp() {
    let Some(setup) = common::load_smollm2(2, None) else {
        return;
    };
    common::check_perplexity(setup, "smollm2.json", None, 0.01);
}
