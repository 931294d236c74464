//! Chat messages to prompt text: the one place a chat request's prompt is
//! made.
//!
//! The model's own `tokenizer.chat_template` (a Jinja template in the GGUF)
//! is rendered with `messages` (`role`, `content`), `add_generation_prompt
//! = true`, `bos_token` and `eos_token`, as Hugging Face's
//! `apply_chat_template` does; Python string methods the templates use
//! (`.strip()`, `.startswith()`, ...) come from minijinja's pycompat layer,
//! and `raise_exception(msg)` turns into a 400 naming the message. A model
//! without a template gets ChatML (`<|im_start|>role\ncontent<|im_end|>\n`,
//! then `<|im_start|>assistant\n`).

use super::api::ChatMessage;
use super::error::ApiError;
use crate::models::tokenizer::EncodeOptions;
use crate::models::Model;
use serde::Serialize;

#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: &'a str,
    content: &'a str,
}

/// The prompt text for `messages` under `model`'s chat template.
pub fn chat_prompt(model: &Model, messages: &[ChatMessage]) -> Result<String, ApiError> {
    let template = model
        .file
        .get_str("tokenizer.chat_template")
        .map_err(|e| ApiError::internal(format!("reading tokenizer.chat_template: {e}")))?;
    let Some(template) = template else {
        return Ok(chatml(messages));
    };
    let token_text = |id: Option<u32>| {
        id.and_then(|t| model.tokenizer.token_text(t))
            .unwrap_or("")
            .to_string()
    };
    let mut env = minijinja::Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_template("chat", template).map_err(|e| {
        ApiError::internal(format!("the model's chat template does not parse: {e}"))
    })?;
    let messages: Vec<TemplateMessage<'_>> = messages
        .iter()
        .map(|m| TemplateMessage {
            role: &m.role,
            content: &m.content,
        })
        .collect();
    let ctx = minijinja::context! {
        messages => messages,
        add_generation_prompt => true,
        bos_token => token_text(model.tokenizer.bos()),
        eos_token => token_text(model.tokenizer.eos()),
    };
    let tmpl = env
        .get_template("chat")
        .map_err(|e| ApiError::internal(format!("the model's chat template: {e}")))?;
    tmpl.render(ctx).map_err(|e| match e.kind() {
        minijinja::ErrorKind::InvalidOperation => ApiError::invalid_param(
            "messages",
            format!(
                "the model's chat template refused the messages: {}",
                e.detail().unwrap_or("")
            ),
        ),
        _ => ApiError::internal(format!("rendering the model's chat template failed: {e}")),
    })
}

/// ChatML, for models whose file carries no template.
fn chatml(messages: &[ChatMessage]) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            m.role, m.content
        ));
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

/// The token ids of a rendered chat prompt: control-token text becomes
/// those tokens; BOS is added where the vocabulary asks for it unless the
/// template already wrote it.
pub fn chat_tokens(model: &Model, text: &str) -> Vec<u32> {
    let starts_with_bos = model
        .tokenizer
        .bos()
        .and_then(|b| model.tokenizer.token_text(b))
        .is_some_and(|b| !b.is_empty() && text.starts_with(b));
    model.tokenizer.encode_with(
        text,
        EncodeOptions {
            add_special: !starts_with_bos,
            parse_special: true,
        },
    )
}
