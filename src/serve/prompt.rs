//! Chat messages to prompt tokens: the one place a chat request's prompt is
//! made.
//!
//! The model's own `tokenizer.chat_template` is compiled once
//! ([`ChatPrompt::new`]) by the same engine `weft run --chat` and `weft
//! chat` use (`weft_models::chat`, rendered as Hugging Face's
//! `apply_chat_template` renders it), then rendered per request with
//! `messages`, `add_generation_prompt = true`, `bos_token` and `eos_token`.
//! A template's `raise_exception(msg)` is the client's fault (400 naming
//! the message); any other failure is the server's. A model without a
//! template gets ChatML (`<|im_start|>role\ncontent<|im_end|>\n`, then
//! `<|im_start|>assistant\n`).

use super::api::ChatMessage;
use super::error::ApiError;
use crate::models::chat::{encode_rendered, ChatTemplate, Message};
use crate::models::Model;

/// The model's chat template, compiled (or why it does not compile: then
/// chat requests fail with that reason and completions still work).
pub struct ChatPrompt {
    template: Result<Option<ChatTemplate>, String>,
}

impl ChatPrompt {
    /// Compiles `model`'s template once.
    pub fn new(model: &Model) -> ChatPrompt {
        let template =
            ChatTemplate::from_gguf(&model.file, &model.tokenizer).map_err(|e| e.to_string());
        ChatPrompt { template }
    }

    /// The prompt tokens for `messages`: control-token text becomes those
    /// tokens; BOS is added where the vocabulary asks for it unless the
    /// template already wrote it.
    pub fn tokens(&self, model: &Model, messages: &[ChatMessage]) -> Result<Vec<u32>, ApiError> {
        let text = self.text(messages)?;
        Ok(encode_rendered(&model.tokenizer, &text))
    }

    fn text(&self, messages: &[ChatMessage]) -> Result<String, ApiError> {
        let template = match &self.template {
            Ok(Some(template)) => template,
            Ok(None) => return Ok(chatml(messages)),
            Err(why) => {
                return Err(ApiError::internal(format!(
                    "the model's chat template does not compile: {why}"
                )))
            }
        };
        let messages: Vec<Message> = messages
            .iter()
            .map(|m| Message::new(&m.role, &m.content))
            .collect();
        template
            .render(&messages, true)
            .map_err(|e| match e.fault().and_then(|f| f.raised()) {
                Some(why) => ApiError::invalid_param(
                    "messages",
                    format!("the model's chat template refused the messages: {why}"),
                ),
                None => {
                    ApiError::internal(format!("rendering the model's chat template failed: {e}"))
                }
            })
    }
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
