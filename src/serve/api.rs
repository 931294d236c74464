//! The request bodies of the OpenAI endpoints, and what is checked before
//! a request reaches the engine.

use super::error::ApiError;
use serde::Deserialize;
use serde_json::Value;

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;
/// Most alternatives `top_logprobs` may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One chat message: a role and its text.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<Value>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<usize>,
    /// A session name (`--slots-dir`): continue from it and save into it.
    pub session: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Value,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Alternatives per token (0..=20); present: report log-probabilities.
    pub logprobs: Option<usize>,
    #[serde(default)]
    pub echo: bool,
    /// A session name (`--slots-dir`): continue from it and save into it.
    pub session: Option<String>,
}

/// The generation fields both endpoints share.
#[derive(Debug, Default, Deserialize)]
pub struct SamplingFields {
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Value>,
    pub n: Option<u64>,
    /// Never end at an end-of-generation token (vLLM's and llama-server's
    /// extension): generation runs to `max_tokens`, a stop string or the
    /// context's end.
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Parses a JSON body into `T`, answering malformed JSON and wrong field
/// types with a 400 that quotes serde's reason.
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            ApiError::invalid(format!("the request body is not valid JSON: {e}"))
        }
        _ => ApiError::invalid(format!("the request body does not match the API: {e}")),
    })
}

/// The messages of a chat request, each with a `role` and text `content`
/// (a string, or an array of `{"type": "text", "text": ...}` parts).
pub fn chat_messages(values: &[Value]) -> Result<Vec<ChatMessage>, ApiError> {
    if values.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` is empty; give at least one message",
        ));
    }
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let role = v.get("role").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid_param(
                    "messages",
                    format!("messages[{i}] has no string `role`"),
                )
            })?;
            let content = match v.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, part) in parts.iter().enumerate() {
                        match (part.get("type").and_then(Value::as_str), part.get("text")) {
                            (Some("text"), Some(Value::String(t))) => text.push_str(t),
                            _ => {
                                return Err(ApiError::invalid_param(
                                    "messages",
                                    format!("messages[{i}].content[{j}] is not a text part (`{{\"type\": \"text\", \"text\": ...}}`); only text is supported"),
                                ))
                            }
                        }
                    }
                    text
                }
                Some(other) => {
                    return Err(ApiError::invalid_param(
                        "messages",
                        format!("messages[{i}].content must be a string or an array of text parts, not {other}"),
                    ))
                }
            };
            Ok(ChatMessage {
                role: role.to_string(),
                content,
            })
        })
        .collect()
}

/// The stop strings: absent, one string, or an array of up to [`MAX_STOP`].
pub fn stop_strings(stop: &Option<Value>) -> Result<Vec<String>, ApiError> {
    let list = match stop {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::invalid_param("stop", format!("`stop` holds {v}, not a string"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "stop",
                format!("`stop` must be a string or an array of strings, not {other}"),
            ))
        }
    };
    if list.len() > MAX_STOP {
        return Err(ApiError::invalid_param(
            "stop",
            format!(
                "`stop` has {} strings; at most {MAX_STOP} are accepted",
                list.len()
            ),
        ));
    }
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

/// What a completion request's `prompt` is: text, or token ids.
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

/// `prompt`: a string, a one-string array, or an array of token ids.
pub fn completion_prompt(prompt: &Value) -> Result<PromptInput, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "prompt",
            "`prompt` must be a string, an array of one string, or an array of token ids (one prompt per request)",
        )
    };
    match prompt {
        Value::String(s) => Ok(PromptInput::Text(s.clone())),
        Value::Array(items) => match items.as_slice() {
            [Value::String(s)] => Ok(PromptInput::Text(s.clone())),
            ids if !ids.is_empty() && ids.iter().all(Value::is_u64) => ids
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|i| u32::try_from(i).ok())
                        .ok_or_else(bad)
                })
                .collect::<Result<Vec<_>, _>>()
                .map(PromptInput::Ids),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stop_takes_a_string_or_up_to_four() {
        assert_eq!(stop_strings(&None).ok(), Some(vec![]));
        assert_eq!(
            stop_strings(&Some(json!("\n"))).ok(),
            Some(vec!["\n".to_string()])
        );
        assert_eq!(
            stop_strings(&Some(json!(["a", "", "b"]))).ok(),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        let five = stop_strings(&Some(json!(["a", "b", "c", "d", "e"]))).unwrap_err();
        assert!(five.message.contains("at most 4"), "{}", five.message);
        assert_eq!(five.param.as_deref(), Some("stop"));
        assert!(stop_strings(&Some(json!([1]))).is_err());
    }

    #[test]
    fn prompts_are_text_or_token_ids() {
        assert!(matches!(completion_prompt(&json!("hi")), Ok(PromptInput::Text(t)) if t == "hi"));
        assert!(matches!(completion_prompt(&json!(["hi"])), Ok(PromptInput::Text(t)) if t == "hi"));
        assert!(
            matches!(completion_prompt(&json!([1, 2])), Ok(PromptInput::Ids(i)) if i == [1, 2])
        );
        assert!(completion_prompt(&json!(["a", "b"])).is_err());
        assert!(completion_prompt(&json!([])).is_err());
        assert!(completion_prompt(&json!([5_000_000_000u64])).is_err());
        assert!(completion_prompt(&json!(3)).is_err());
    }

    #[test]
    fn chat_messages_need_a_role_and_text() {
        let m = chat_messages(&[
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
            json!({"role": "assistant", "content": null}),
        ])
        .expect("valid messages");
        assert_eq!(m[0].content, "ab");
        assert_eq!(m[1].content, "");
        assert!(chat_messages(&[]).is_err());
        let e = chat_messages(&[json!({"content": "x"})]).unwrap_err();
        assert!(e.message.contains("messages[0]"), "{}", e.message);
        assert!(
            chat_messages(&[json!({"role": "user", "content": [{"type": "image_url"}]})]).is_err()
        );
    }

    #[test]
    fn malformed_json_and_wrong_types_are_told_apart() {
        let e = parse_body::<ChatRequest>(b"{\"messages\": [").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = parse_body::<ChatRequest>(b"{\"messages\": 3}").unwrap_err();
        assert!(e.message.contains("does not match"), "{}", e.message);
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
    }
}
