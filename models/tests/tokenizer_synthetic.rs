//! Tokenizers over tiny hand-made vocabularies: the merge orders, byte
//! fallback, special-token handling, streaming and every load error, without
//! any model file.

use weft_models::gguf::{GgufFile, GgufWriter, Value};
use weft_models::tokenizer::{EncodeOptions, TokenId, TokenType, Tokenizer, TokenizerError, Vocab};

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A byte-level BPE vocabulary: GPT-2 code points (`Ġ` is a space).
fn bpe_vocab(merges: &[&str]) -> Vocab {
    let tokens = [
        "<|end|>", "a", "b", "c", "Ġ", "ab", "bc", "abc", "Ġa", "aa", "!", "1", "2", "12", "<",
        "|", ">", "e", "n", "d",
    ];
    let mut types = vec![TokenType::Normal; tokens.len()];
    types[0] = TokenType::Control;
    Vocab {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens: strings(&tokens),
        token_types: types,
        merges: Some(strings(merges)),
        eos: Some(0),
        ..Vocab::default()
    }
}

fn id(tokenizer: &Tokenizer, text: &str) -> TokenId {
    tokenizer
        .token_id(text)
        .unwrap_or_else(|| panic!("no token {text:?}"))
}

#[test]
fn bpe_merges_by_rank_then_leftmost() {
    let t = Tokenizer::from_vocab(bpe_vocab(&["a b", "b c", "ab c", "Ġ a", "a a", "1 2"]))
        .expect("valid");
    assert_eq!(t.encode("abc"), [id(&t, "abc")]);
    // "a b" outranks "Ġ a", so " ab" is Ġ + ab even though Ġa is leftmost.
    assert_eq!(t.encode(" ab"), [id(&t, "Ġ"), id(&t, "ab")]);
    // Equal ranks: the leftmost pair merges first.
    assert_eq!(t.encode("aaa"), [id(&t, "aa"), id(&t, "a")]);
    // Merge order decides: with "b c" first, "abc" is a + bc.
    let t2 = Tokenizer::from_vocab(bpe_vocab(&["b c", "a b", "ab c"])).expect("valid");
    assert_eq!(t2.encode("abc"), [id(&t2, "a"), id(&t2, "bc")]);
    // Characters with no token are dropped, as llama.cpp drops them.
    assert_eq!(t.encode("z"), Vec::<u32>::new());
    assert_eq!(t.encode("12"), [id(&t, "12")]);
}

#[test]
fn bpe_special_tokens_bos_and_decoding() {
    let mut vocab = bpe_vocab(&["a b"]);
    vocab.add_eos = Some(true);
    let t = Tokenizer::from_vocab(vocab).expect("valid");
    // gpt2 vocabularies default to no BOS; EOS appended as asked.
    assert_eq!(t.encode("ab"), [id(&t, "ab"), 0]);
    let plain = EncodeOptions {
        add_special: false,
        parse_special: false,
    };
    assert_eq!(
        t.encode_with("ab<|end|>", plain),
        [5, 14, 15, 17, 18, 19, 15, 16]
    );
    let parse = EncodeOptions {
        add_special: false,
        parse_special: true,
    };
    assert_eq!(t.encode_with("ab<|end|>", parse), [5, 0]);
    assert_eq!(t.decode(&[8, 0, 10], false).expect("in range"), " a!");
    assert_eq!(t.decode(&[8, 0, 10], true).expect("in range"), " a<|end|>!");
    assert!(t.is_eog(0) && !t.is_eog(1));
    assert!(matches!(
        t.decode(&[99], false),
        Err(TokenizerError::TokenOutOfRange { id: 99, .. })
    ));
}

/// A SentencePiece vocabulary with byte fallback tokens for every byte.
fn spm_vocab() -> Vocab {
    let mut tokens = strings(&[
        "<unk>", "<s>", "</s>", "▁", "a", "b", "ab", "▁a", "▁ab", "aa",
    ]);
    let mut scores = vec![0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -0.5, -0.1, -3.0, -1.0];
    let mut types = vec![TokenType::Unknown, TokenType::Control, TokenType::Control];
    types.extend([TokenType::Normal; 7]);
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(TokenType::Byte);
    }
    Vocab {
        model: "llama".into(),
        tokens,
        scores,
        token_types: types,
        ..Vocab::default()
    }
}

#[test]
fn spm_merges_by_score_with_space_prefix_and_bos_defaults() {
    let t = Tokenizer::from_vocab(spm_vocab()).expect("valid");
    // Defaults for `llama` vocabularies: BOS 1 added, a space prefix.
    assert_eq!(t.bos(), Some(1));
    assert_eq!(t.encode("ab"), [1, id(&t, "▁ab")]);
    assert_eq!(
        t.encode_with(
            "aaa",
            EncodeOptions {
                add_special: false,
                parse_special: false
            }
        ),
        [7, 9]
    );
    let mut vocab = spm_vocab();
    vocab.add_space_prefix = Some(false);
    vocab.add_bos = Some(false);
    let t = Tokenizer::from_vocab(vocab).expect("valid");
    assert_eq!(t.encode("ab"), [id(&t, "ab")]);
    // Equal scores: the leftmost pair merges first.
    assert_eq!(t.encode("aaa"), [id(&t, "aa"), id(&t, "a")]);
    // 'c' and 'é' fall back to byte tokens.
    assert_eq!(
        t.encode("a c"),
        [id(&t, "a"), id(&t, "▁"), id(&t, "<0x63>")]
    );
    assert_eq!(t.encode("é"), [id(&t, "<0xC3>"), id(&t, "<0xA9>")]);
    assert_eq!(
        t.decode(&t.encode("ab a c é"), false).expect("in range"),
        "ab a c é"
    );
    assert_eq!(t.decode(&[1, 8, 2], false).expect("in range"), " ab");
    assert_eq!(t.decode(&[1, 8, 2], true).expect("in range"), "<s> ab</s>");
}

#[test]
fn stream_decoder_holds_back_incomplete_characters() {
    let t = Tokenizer::from_vocab(spm_vocab()).expect("valid");
    let byte = |b: u8| id(&t, &format!("<0x{b:02X}>"));
    let mut stream = t.stream_decoder(false);
    assert_eq!(stream.push(byte(0xC3)).expect("in range"), "");
    assert_eq!(stream.pending(), [0xC3]);
    assert_eq!(stream.push(byte(0xA9)).expect("in range"), "é");
    // A byte that can never start a character is replaced at once.
    assert_eq!(stream.push(byte(0xFF)).expect("in range"), "\u{FFFD}");
    // An incomplete sequence interrupted by ASCII: replaced, then the text.
    assert_eq!(stream.push(byte(0xE2)).expect("in range"), "");
    assert_eq!(stream.push(4).expect("in range"), "\u{FFFD}a");
    // Held bytes at the end flush lossily.
    assert_eq!(stream.push(byte(0xF0)).expect("in range"), "");
    assert_eq!(stream.push(byte(0x9F)).expect("in range"), "");
    assert_eq!(stream.flush(), "\u{FFFD}");
    assert_eq!(stream.flush(), "");
    assert!(stream.push(100_000).is_err());
}

#[test]
fn load_errors_name_the_key_or_token() {
    let err = |vocab: Vocab| {
        Tokenizer::from_vocab(vocab)
            .expect_err("invalid vocabulary")
            .to_string()
    };

    let e = err(Vocab {
        model: "bert".into(),
        ..bpe_vocab(&[])
    });
    assert!(
        e.contains("`bert`") && e.contains("tokenizer.ggml.model"),
        "{e}"
    );
    let e = err(Vocab {
        pre: Some("no-such-pre".into()),
        ..bpe_vocab(&[])
    });
    assert!(
        e.contains("no-such-pre") && e.contains("tokenizer.ggml.pre") && e.contains("smollm"),
        "{e}"
    );
    let e = err(Vocab {
        merges: None,
        ..bpe_vocab(&[])
    });
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");
    let e = err(Vocab {
        tokens: Vec::new(),
        token_types: Vec::new(),
        ..bpe_vocab(&[])
    });
    assert!(e.contains("empty"), "{e}");
    let e = err(Vocab {
        tokens: strings(&["a", "b", "a"]),
        token_types: Vec::new(),
        ..bpe_vocab(&[])
    });
    assert!(e.contains("\"a\"") && e.contains("ids 0 and 2"), "{e}");
    let e = err(Vocab {
        token_types: vec![TokenType::Normal; 3],
        ..bpe_vocab(&[])
    });
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains("3 entries"),
        "{e}"
    );
    let e = err(Vocab {
        scores: vec![0.0; 2],
        ..spm_vocab()
    });
    assert!(e.contains("tokenizer.ggml.scores"), "{e}");
    // BOS asked for, but the id is out of range and gpt2's default (11) too.
    let e = err(Vocab {
        add_bos: Some(true),
        bos: Some(500),
        tokens: strings(&["a"]),
        token_types: vec![],
        ..bpe_vocab(&[])
    });
    assert!(
        e.contains("tokenizer.ggml.add_bos_token") && e.contains("tokenizer.ggml.bos_token_id"),
        "{e}"
    );
}

#[test]
fn empty_token_texts_are_renamed_like_llama_cpp() {
    let mut vocab = bpe_vocab(&["a b"]);
    vocab.tokens[13] = String::new();
    let t = Tokenizer::from_vocab(vocab).expect("valid");
    assert_eq!(t.token_text(13), Some("[EMPTY_13]"));
}

fn gguf_with(entries: Vec<(&str, Value)>) -> GgufFile {
    let mut writer = GgufWriter::new();
    for (key, value) in entries {
        writer.set(key, value).expect("metadata");
    }
    GgufFile::from_bytes(writer.to_bytes().expect("serialises")).expect("parses")
}

#[test]
fn reads_gguf_metadata() {
    let vocab = spm_vocab();
    let tokens: Vec<&str> = vocab.tokens.iter().map(String::as_str).collect();
    let types: Vec<i32> = vocab
        .token_types
        .iter()
        .map(|t| match t {
            TokenType::Unknown => 2,
            TokenType::Control => 3,
            TokenType::Byte => 6,
            _ => 1,
        })
        .collect();
    let file = gguf_with(vec![
        ("tokenizer.ggml.model", Value::from("llama")),
        ("tokenizer.ggml.tokens", Value::from(tokens)),
        ("tokenizer.ggml.scores", Value::from(vocab.scores.clone())),
        ("tokenizer.ggml.token_type", Value::from(types)),
        ("tokenizer.ggml.bos_token_id", Value::from(1u32)),
        ("tokenizer.ggml.add_space_prefix", Value::from(false)),
    ]);
    let read = Vocab::from_gguf(&file).expect("reads");
    assert_eq!(
        read,
        Vocab {
            bos: Some(1),
            add_space_prefix: Some(false),
            ..spm_vocab()
        }
    );
    let t = Tokenizer::from_gguf(&file).expect("builds");
    assert_eq!(t.encode("ab"), [1, 6]);

    let missing = gguf_with(vec![("tokenizer.ggml.model", Value::from("llama"))]);
    let e = Tokenizer::from_gguf(&missing)
        .expect_err("no tokens")
        .to_string();
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
    let wrong = gguf_with(vec![
        ("tokenizer.ggml.model", Value::from("llama")),
        ("tokenizer.ggml.tokens", Value::from(vec!["a"])),
        ("tokenizer.ggml.token_type", Value::from("normal")),
    ]);
    let e = Tokenizer::from_gguf(&wrong)
        .expect_err("wrong type")
        .to_string();
    assert!(e.contains("tokenizer.ggml.token_type"), "{e}");
}
