//! Errors as OpenAI's API reports them: a status code and
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer to one request.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`,
    /// `not_found_error`, `server_error`, ...
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub param: Option<String>,
    pub message: String,
    /// Seconds for a `Retry-After` header (queue full, still loading).
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            code: None,
            param: None,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400: the request is malformed or asks for something unsupported.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending field.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..Self::invalid(message)
        }
    }

    /// 400: the prompt (plus the requested tokens) does not fit the context.
    pub fn context_exceeded(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("context_length_exceeded"),
            param: Some("messages".into()),
            ..Self::invalid(message)
        }
    }

    /// 401: a missing or wrong API key.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
        }
    }

    /// 404: no model of that name is served.
    pub fn unknown_model(given: &str, served: &str) -> ApiError {
        ApiError {
            code: Some("model_not_found"),
            param: Some("model".into()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model `{given}` does not exist; this server serves `{served}`"),
            )
        }
    }

    /// 404: no such endpoint.
    pub fn no_route(method: &str, path: &str) -> ApiError {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no endpoint {method} {path}; see GET /v1/models, POST /v1/chat/completions, POST /v1/completions, POST /v1/sessions/NAME/save|restore, GET /health, GET /metrics"),
        )
    }

    /// 413: the body is larger than the server takes.
    pub fn too_large(limit: usize) -> ApiError {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body exceeds the limit of {limit} bytes (--max-body)"),
        )
    }

    /// 503 with `Retry-After`: the queue is full, the model still loading,
    /// or the server shutting down.
    pub fn unavailable(message: impl Into<String>, retry_after: u32) -> ApiError {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    /// 504: the request ran past its time limit.
    pub fn timeout(seconds: f64) -> ApiError {
        ApiError {
            code: Some("timeout"),
            ..Self::new(
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                format!("the request did not finish within its limit of {seconds} s (--timeout)"),
            )
        }
    }

    /// 500: the engine failed.
    pub fn internal(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}
