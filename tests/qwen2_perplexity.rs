//! Perplexity of Qwen2.5-Coder-0.5B on the GPL-3 text at ctx 512 within
//! 0.5% of llama.cpp's (`llama-perplexity -c 512 -b 512`: 14 windows of
//! 512 tokens, no BOS, each scoring its second half).

mod common;

/// Where the text lies on Debian-based machines (the reference names it
/// `GPL-3`).
const TEXT: &str = "/usr/share/common-licenses/GPL-3";

#[test]
fn perplexity_is_within_half_a_percent_of_llama_cpp() {
    let Some(setup) = common::load_qwen2(2, None) else {
        return;
    };
    assert_eq!(
        common::reference_json("qwen2.json")["perplexity"][0]["file"].as_str(),
        Some("GPL-3")
    );
    common::check_perplexity(setup, "qwen2.json", Some(TEXT), 0.005);
}
