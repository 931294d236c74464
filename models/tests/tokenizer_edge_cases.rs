//! Hand-picked edge cases on the real models, each with the ids llama.cpp
//! gives (llama-cpp-python 0.3.36, `tokenize(text, add_bos=True,
//! special=False)` unless noted), plus streaming decode of characters split
//! across tokens.
//!
//! Models come from `fetch::ensure`; without them the tests print why and
//! pass, unless `WEFT_TEST_REQUIRE_MODEL=1`.

use std::sync::OnceLock;

use weft_models::fetch::{ModelSpec, GEMMA3_270M_Q4_K_M, SMOLLM2_135M_Q4_1};
use weft_models::gguf::GgufFile;
use weft_models::tokenizer::{EncodeOptions, TokenId, Tokenizer};

fn load(spec: &ModelSpec) -> Option<Tokenizer> {
    let path = weft_testkit::require::model_path(spec)?;
    let file = GgufFile::open(&path).expect("the cached model opens");
    Some(Tokenizer::from_gguf(&file).expect("the tokenizer loads"))
}

fn smollm2() -> Option<&'static Tokenizer> {
    static TOKENIZER: OnceLock<Option<Tokenizer>> = OnceLock::new();
    TOKENIZER.get_or_init(|| load(&SMOLLM2_135M_Q4_1)).as_ref()
}

fn gemma3() -> Option<&'static Tokenizer> {
    static TOKENIZER: OnceLock<Option<Tokenizer>> = OnceLock::new();
    TOKENIZER.get_or_init(|| load(&GEMMA3_270M_Q4_K_M)).as_ref()
}

const PARSE_SPECIAL: EncodeOptions = EncodeOptions {
    add_special: true,
    parse_special: true,
};

/// Encodes, compares with llama.cpp's ids, and checks the text round-trips.
fn check(tokenizer: &Tokenizer, text: &str, expected: &[TokenId]) {
    let ids = tokenizer.encode(text);
    assert_eq!(ids, expected, "ids of {text:?}");
    assert_eq!(
        tokenizer.decode(&ids, false).expect("ids in range"),
        text,
        "round trip of {text:?}"
    );
}

/// Streams `ids` one at a time: the chunks, and their concatenation with the flush.
fn stream(tokenizer: &Tokenizer, ids: &[TokenId]) -> (Vec<String>, String) {
    let mut decoder = tokenizer.stream_decoder(false);
    let chunks: Vec<String> = ids
        .iter()
        .map(|&id| decoder.push(id).expect("id in range"))
        .collect();
    let whole = chunks.concat() + &decoder.flush();
    (chunks, whole)
}

#[test]
fn smollm2_digits_split_one_by_one() {
    let Some(t) = smollm2() else { return };
    check(t, "1234567890", &[33, 34, 35, 36, 37, 38, 39, 40, 41, 32]);
    for (id, digit) in t.encode("9876543210").iter().zip("9876543210".chars()) {
        assert_eq!(
            t.decode(&[*id], false).expect("in range"),
            digit.to_string()
        );
    }
}

#[test]
fn smollm2_whitespace_runs_and_edges() {
    let Some(t) = smollm2() else { return };
    check(
        t,
        "a  b   c\n\n\nd",
        &[81, 216, 278, 256, 265, 1116, 198, 84],
    );
    check(t, "  leading", &[216, 2899]);
    check(t, "trailing  ", &[4861, 4966, 256]);
    check(t, "\n\nboth\n\n", &[198, 198, 15135, 1116]);
}

#[test]
fn smollm2_contractions_and_punctuation() {
    let Some(t) = smollm2() else { return };
    check(
        t,
        "I'm you're we've they'll he'd it's can't",
        &[
            57, 5248, 346, 2316, 392, 3543, 502, 3060, 384, 6737, 357, 506, 416, 982,
        ],
    );
    check(
        t,
        "Wait... what?!?! ---",
        &[33359, 2026, 732, 17593, 17593, 21749],
    );
}

#[test]
fn smollm2_non_ascii_emoji_and_cjk() {
    let Some(t) = smollm2() else { return };
    check(
        t,
        "naïve café Ελληνικά",
        &[
            3546, 46494, 37366, 5664, 239, 17162, 17162, 25723, 11517, 12001, 21118, 26112,
        ],
    );
    check(
        t,
        "🦀 日本語",
        &[10813, 116, 218, 17097, 241, 115, 40993, 179, 120, 248],
    );
}

#[test]
fn smollm2_empty_text_and_special_text() {
    let Some(t) = smollm2() else { return };
    check(t, "", &[]);
    // No BOS (add_bos_token = false), and the chat marker is plain text...
    check(
        t,
        "<|im_start|>user",
        &[44, 108, 306, 79, 3738, 108, 46, 4093],
    );
    // ...unless special tokens are parsed.
    assert_eq!(t.encode_with("<|im_start|>user", PARSE_SPECIAL), [1, 4093]);
    // Control tokens render as nothing unless asked.
    assert_eq!(t.decode(&[1, 4093, 2], false).expect("in range"), "user");
    assert_eq!(
        t.decode(&[1, 4093, 2], true).expect("in range"),
        "<|im_start|>user<|im_end|>"
    );
    assert!(t.is_eog(2) && t.is_eog(0) && !t.is_eog(1));
}

#[test]
fn smollm2_streams_characters_split_across_tokens() {
    let Some(t) = smollm2() else { return };
    // "🦀" is three tokens: F0 9F | A6 | 80.
    let ids = [10813, 116, 218, 17097, 241, 115];
    let (chunks, whole) = stream(t, &ids);
    assert_eq!(chunks, ["", "", "🦀", " ", "", "日"]);
    assert_eq!(whole, "🦀 日");
    // A stream cut in the middle of a character flushes lossily.
    let (chunks, whole) = stream(t, &ids[..2]);
    assert_eq!(chunks, ["", ""]);
    assert_eq!(whole, "\u{FFFD}");
}

#[test]
fn gemma3_bos_and_user_defined_whitespace() {
    let Some(t) = gemma3() else { return };
    assert_eq!(t.encode(""), [2]);
    assert_eq!(
        t.encode_with(
            "",
            EncodeOptions {
                add_special: false,
                parse_special: false
            }
        ),
        Vec::<u32>::new()
    );
    // Runs of spaces and newlines are user-defined tokens, matched before
    // SentencePiece runs; no space prefix follows them (add_space_prefix = false).
    assert_eq!(t.encode("Hello  world"), [2, 9259, 138, 12392]);
    assert_eq!(t.encode("\n\n\n"), [2, 109]);
    assert_eq!(t.encode("  leading"), [2, 138, 26016]);
    assert_eq!(t.encode("trailing  "), [2, 136697, 138]);
    assert_eq!(
        t.encode("1234567890"),
        [2, 236770, 236778, 236800, 236812, 236810, 236825, 236832, 236828, 236819, 236771]
    );
    assert_eq!(
        t.encode("I'm you're"),
        [2, 236777, 236789, 236757, 611, 236789, 500]
    );
}

#[test]
fn gemma3_byte_fallback_and_multibyte_tokens() {
    let Some(t) = gemma3() else { return };
    // U+1FAE9 is not in the vocabulary: four byte tokens.
    assert_eq!(
        t.encode("x\u{1FAE9}y"),
        [2, 236781, 478, 397, 409, 407, 236762]
    );
    assert_eq!(t.encode("𠀀"), [2, 478, 398, 366, 366]);
    assert_eq!(t.encode("🦀 日本語"), [2, 248714, 33375, 238582]);
    assert_eq!(
        t.decode(&t.encode("x\u{1FAE9}y 𠀀"), false)
            .expect("in range"),
        "x\u{1FAE9}y 𠀀"
    );
}

#[test]
fn gemma3_special_text() {
    let Some(t) = gemma3() else { return };
    assert_eq!(
        t.encode("<start_of_turn>user"),
        [2, 236820, 3041, 236779, 1340, 236779, 887, 236813, 2364]
    );
    assert_eq!(
        t.encode_with("<start_of_turn>user", PARSE_SPECIAL),
        [2, 105, 2364]
    );
    // `</s>` is user-defined in the file but llama.cpp makes it a control
    // (end-of-generation) token, so plain text does not match it; `<b>` is
    // user-defined and always matched.
    assert_eq!(
        t.encode("a</s>b<b>c"),
        [2, 236746, 954, 236751, 236813, 236763, 200, 236755]
    );
    assert_eq!(
        t.encode_with("a</s>b<b>c", PARSE_SPECIAL),
        [2, 236746, 212, 236763, 200, 236755]
    );
    assert_eq!(t.eog_ids(), [1, 106, 212]);
}

#[test]
fn gemma3_streams_byte_fallback() {
    let Some(t) = gemma3() else { return };
    let (chunks, whole) = stream(t, &[2, 236781, 478, 397, 409, 407, 236762]);
    assert_eq!(chunks, ["", "x", "", "", "", "\u{1FAE9}", "y"]);
    assert_eq!(whole, "x\u{1FAE9}y");
}
