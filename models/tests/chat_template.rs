//! Chat templates rendered by minijinja against Python's jinja2.
//!
//! `tests/data/chat_templates/*.json` hold real templates (SmolLM2's from
//! its GGUF; Qwen2.5, Gemma and Llama 3.1 as Hugging Face publishes them),
//! conversations, and what jinja2 rendered for each as `transformers`
//! configures it, or the exception the template raised (made by
//! `scripts/chat_template_fixtures.py`). Every render must match exactly.
//! The end-of-turn tests read the real vocabularies from `fetch::ensure`
//! and pass with a message when a model cannot be obtained, unless
//! `WEFT_TEST_REQUIRE_MODEL=1`.

use serde_json::Value;
use weft_models::chat::{encode_rendered, ChatTemplate, ChatTemplateError, Message, TemplateFault};
use weft_models::fetch::{ModelSpec, GEMMA3_270M_Q4_K_M, SMOLLM2_135M_Q4_1};
use weft_models::gguf::GgufFile;
use weft_models::tokenizer::Tokenizer;

const DATA_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/chat_templates");

fn fixture(name: &str) -> Value {
    let path = format!("{DATA_DIR}/{name}.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn template_of(f: &Value) -> ChatTemplate {
    ChatTemplate::new(
        f["source"].as_str().expect("source"),
        f["name"].as_str().expect("name"),
        f["bos_token"].as_str().expect("bos_token"),
        f["eos_token"].as_str().expect("eos_token"),
    )
    .unwrap_or_else(|e| panic!("{} does not compile: {e}", f["name"]))
}

/// Renders every case of fixture `name`; returns (renders, refusals).
fn check_fixture(name: &str) -> (usize, usize) {
    let f = fixture(name);
    let template = template_of(&f);
    let (mut renders, mut refusals) = (0, 0);
    for (i, case) in f["cases"].as_array().expect("cases").iter().enumerate() {
        let add = case["add_generation_prompt"].as_bool().expect("flag");
        let tools = case.get("tools");
        let got = template.render_with_tools(&case["messages"], tools, add);
        match (case.get("expected"), got) {
            (Some(want), Ok(text)) => {
                assert_eq!(text, want.as_str().expect("text"), "{name} case {i}");
                renders += 1;
            }
            (None, Err(e)) => {
                let want = case["error"].as_str().expect("error");
                let fault = e.fault().unwrap_or_else(|| panic!("{name} case {i}: {e}"));
                assert!(
                    fault.message.contains(want),
                    "{name} case {i}: {} does not say `{want}`",
                    fault.message
                );
                assert!(
                    fault.line.is_some() && fault.column.is_some(),
                    "{name} case {i}: {e}"
                );
                refusals += 1;
            }
            (Some(_), Err(e)) => panic!("{name} case {i} failed: {e}"),
            (None, Ok(text)) => panic!("{name} case {i} rendered {text:?}; jinja2 refused it"),
        }
    }
    (renders, refusals)
}

#[test]
fn smollm2_renders_as_jinja2() {
    assert_eq!(check_fixture("smollm2"), (10, 0));
}

#[test]
fn qwen2_5_renders_as_jinja2_with_tools() {
    assert_eq!(check_fixture("qwen2_5"), (13, 0));
}

#[test]
fn gemma_renders_and_refuses_as_jinja2() {
    assert_eq!(check_fixture("gemma2"), (5, 5));
}

#[test]
fn llama3_1_renders_as_jinja2_with_indented_json() {
    assert_eq!(check_fixture("llama3_1"), (13, 0));
}

fn fault_of(source: &str, messages: &[Message]) -> TemplateFault {
    let t = match ChatTemplate::new(source, "test.jinja", "<s>", "</s>") {
        Ok(t) => t,
        Err(ChatTemplateError::Template(f)) => return *f,
        Err(e) => panic!("{e}"),
    };
    match t.render(messages, true) {
        Err(ChatTemplateError::Template(f)) => *f,
        Err(e) => panic!("{e}"),
        Ok(text) => panic!("rendered {text:?}"),
    }
}

#[test]
fn failures_say_where_and_what() {
    let msgs = [Message::new("user", "hi")];
    // An undefined attribute two lines down, column 4.
    let f = fault_of(
        "{% for m in messages %}\n{{ m.role }}\n   {{ m.meta.name }}\n{% endfor %}",
        &msgs,
    );
    assert_eq!(
        (f.origin.as_str(), f.line, f.column),
        ("test.jinja", Some(3), Some(7)),
        "{f}"
    );
    assert!(f.message.contains("undefined"), "{f}");
    assert_eq!(f.expression.as_deref(), Some("m.meta.name"), "{f}");
    // raise_exception's words, verbatim.
    let f = fault_of(
        "{% if messages[0].role != 'system' %}\n  {{ raise_exception('a system message first') }}{% endif %}",
        &msgs,
    );
    assert_eq!(f.line, Some(2), "{f}");
    assert_eq!(
        f.message,
        "the template raised an exception: a system message first"
    );
    // A syntax error at compile time.
    let f = fault_of(
        "{% for m in messages %}\n{{ m.content }\n{% endfor %}",
        &msgs,
    );
    assert_eq!(f.line, Some(2), "{f}");
    assert!(f.message.contains("syntax error"), "{f}");
    let shown = f.to_string();
    assert!(shown.starts_with("line 2"), "{shown}");
}

#[test]
fn an_endless_template_stops() {
    let f = fault_of(
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        &[Message::new("user", "hi")],
    );
    assert!(f.message.contains("did not finish"), "{f}");
}

#[test]
fn python_string_methods_and_loop_controls() {
    let t = ChatTemplate::new(
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}\
         [{{ m.content.strip().split(' ')|join('|') }}|{{ m.content.startswith(' a') }}]\
         {% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}{{ strftime_now('%Y')|length }}",
        "t",
        "",
        "",
    )
    .unwrap();
    let msgs = [
        Message::new("system", "x"),
        Message::new("user", " a b "),
        Message::new("assistant", "c"),
        Message::new("user", "never"),
    ];
    assert_eq!(t.render(&msgs, false).unwrap(), "[a|b|True][c|False]4");
}

fn tokenizer(spec: &ModelSpec) -> Option<(GgufFile, Tokenizer)> {
    let path = weft_testkit::require::model_path(spec)?;
    let file = GgufFile::open(&path).expect("gguf");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    Some((file, tok))
}

#[test]
fn smollm2_template_from_gguf_ends_turns_with_im_end() {
    let Some((file, tok)) = tokenizer(&SMOLLM2_135M_Q4_1) else {
        return;
    };
    let t = ChatTemplate::from_gguf(&file, &tok)
        .unwrap()
        .expect("SmolLM2 has a template");
    assert_eq!(t.end_of_turn(&tok), tok.token_id("<|im_end|>"));
    // The fixture's template is the GGUF's.
    let f = fixture("smollm2");
    assert_eq!(
        file.get_str("tokenizer.chat_template").unwrap(),
        f["source"].as_str()
    );
    let text = t
        .render(&[Message::new("user", "What is 2+2?")], true)
        .unwrap();
    let ids = encode_rendered(&tok, &text);
    let start = tok.token_id("<|im_start|>").unwrap();
    let end = tok.token_id("<|im_end|>").unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 3, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&i| i == end).count(), 2, "{ids:?}");
    assert_eq!(tok.decode(&ids, true).unwrap(), text);
}

#[test]
fn gemma_template_ends_turns_with_end_of_turn_and_one_bos() {
    let Some((file, tok)) = tokenizer(&GEMMA3_270M_Q4_K_M) else {
        return;
    };
    // This Gemma 3 file is the pretrained model: it carries no template.
    assert!(ChatTemplate::from_gguf(&file, &tok).unwrap().is_none());
    let f = fixture("gemma2");
    let t = ChatTemplate::with_tokenizer(f["source"].as_str().unwrap(), "gemma", &tok).unwrap();
    assert_eq!(t.end_of_turn(&tok), tok.token_id("<end_of_turn>"));
    let text = t.render(&[Message::new("user", "Hi")], true).unwrap();
    assert!(text.starts_with("<bos><start_of_turn>user"), "{text:?}");
    let ids = encode_rendered(&tok, &text);
    let bos = tok.bos().unwrap();
    assert_eq!(ids[0], bos);
    assert_eq!(ids.iter().filter(|&&i| i == bos).count(), 1, "{ids:?}");
}
