//! Perplexity of Gemma 3 270M on the reference text at ctx 1024 within 1%
//! of llama.cpp's. The window is longer than the model's 512-token sliding
//! window, so the local layers really slide; every window's first token is
//! replaced by BOS, as llama-perplexity does for a model that adds BOS.

mod common;

#[test]
fn perplexity_is_within_one_percent_of_llama_cpp() {
    let Some(setup) = common::load_gemma3(2, None) else {
        return;
    };
    common::check_perplexity(setup, "gemma3.json", None, 0.01);
}
