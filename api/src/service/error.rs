//! Every failure of a request, mapped to a status and a `{"error": "..."}` body in one place.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong, for a person.
    pub error: String,
}

/// The refusals every authenticated endpoint shares, described once in the OpenAPI
/// document (never constructed: only its description is used).
#[allow(dead_code)]
#[derive(utoipa::IntoResponses)]
pub enum Guarded {
    /// Missing or wrong token
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// Shutting down (or, for MCP sessions, too many sessions)
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// The refusals of a JSON request body, described once in the OpenAPI document (never
/// constructed: only its description is used).
#[allow(dead_code)]
#[derive(utoipa::IntoResponses)]
pub enum JsonBody {
    /// Malformed request
    #[response(status = 400)]
    Malformed(ErrorBody),
    /// Body too large
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// Not JSON
    #[response(status = 415)]
    NotJson(ErrorBody),
}

/// What a request can fail with.
#[derive(Debug)]
pub enum ApiError {
    /// Malformed input (400).
    BadRequest(String),
    /// No or wrong bearer token (401).
    Unauthorized(&'static str),
    /// Authenticated but not allowed by configuration (403).
    Forbidden(String),
    /// No such release, entry or checkpoint (404).
    NotFound(String),
    /// The release refuses calls: suppressed, or its germline failed G1–G3 (409).
    Refused(String),
    /// Body over the limit (413).
    TooLarge(String),
    /// Well-formed but rejected, e.g. admission failed verification (422).
    Unprocessable(String),
    /// The service is shutting down or not ready (503).
    Unavailable(String),
    /// The call did not finish within the call deadline (504); it still completes.
    Timeout(String),
    /// A fault of ours (500); the detail goes to the log, not the client.
    Internal(String),
    /// A rejection from an extractor, keeping its status.
    Rejected(StatusCode, String),
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Refused(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Rejected(s, _) => *s,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = match self {
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                "internal error (see the service log)".to_owned()
            }
            ApiError::Unauthorized(m) => m.to_owned(),
            ApiError::BadRequest(m)
            | ApiError::Forbidden(m)
            | ApiError::NotFound(m)
            | ApiError::Refused(m)
            | ApiError::TooLarge(m)
            | ApiError::Unprocessable(m)
            | ApiError::Unavailable(m)
            | ApiError::Timeout(m)
            | ApiError::Rejected(_, m) => m,
        };
        let mut resp = (status, Json(ErrorBody { error: message })).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge("request body over the size limit".into()),
            // Well-formed JSON of the wrong shape is as much a client error as broken JSON.
            StatusCode::UNPROCESSABLE_ENTITY => ApiError::BadRequest(r.body_text()),
            s => ApiError::Rejected(s, r.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::BadRequest(r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::BadRequest(r.body_text())
    }
}

impl From<germline_ledger::LedgerError> for ApiError {
    fn from(e: germline_ledger::LedgerError) -> Self {
        use germline_ledger::LedgerError as L;
        match e {
            L::NotFound(m) => ApiError::NotFound(m),
            L::BadRequest(m) => ApiError::BadRequest(m),
            L::Tree(germline_ledger::merkle::TreeError::BadRequest(m)) => ApiError::BadRequest(m),
            other => ApiError::Internal(other.to_string()),
        }
    }
}
