//! The public face of a host's ledger: C2SP tlog-tiles over HTTP, plus `/lookup`, the
//! tlog-witness endpoint and `/fleet/status`.
//!
//! Tiles and entry bundles are immutable once full, so they are served with long cache
//! lifetimes and any CDN or object store can carry them; the checkpoint is the only
//! mutable resource.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use germline_ledger::tiles::{parse_tile_path, TileRequest};
use germline_ledger::{Ledger, LedgerError, TILE_WIDTH};
use germline_model::ReleaseHash;

use germline_fleet::lookup;
use germline_fleet::witness::{AddCheckpointError, WitnessService, MAX_REQUEST_BYTES};

/// An error answer: a status and a JSON body `{"error": …}`.
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

impl From<LedgerError> for ApiError {
    fn from(e: LedgerError) -> Self {
        let status = match e {
            LedgerError::NotFound(_) => StatusCode::NOT_FOUND,
            LedgerError::BadRequest(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!("ledger: {e}");
        }
        ApiError(status, e.to_string())
    }
}

/// `/checkpoint`, `/tile/<L>/<N>[.p/<W>]`, `/tile/entries/<N>[.p/<W>]` and
/// `/lookup/{sha256}` over this host's ledger.
pub fn public_routes(ledger: Arc<Ledger>) -> Router {
    Router::new()
        .route("/checkpoint", get(checkpoint))
        .route("/tile/{*path}", get(tile))
        .route("/lookup/{release}", get(lookup_release))
        .with_state(ledger)
}

/// `/fleet/status`: this host's view of its peers (JSON), for operators.
pub fn status_routes(ledger: Arc<Ledger>) -> Router {
    Router::new().route("/fleet/status", get(status)).with_state(ledger)
}

/// The latest signed checkpoint (C2SP tlog-checkpoint signed note).
#[utoipa::path(get, path = "/checkpoint", tag = "fleet", responses(
    (status = 200, description = "Signed note, with witness cosignatures once gathered", content_type = "text/plain", body = String),
    (status = 404, description = "No checkpoint signed yet", body = crate::service::error::ErrorBody)))]
pub async fn checkpoint(State(ledger): State<Arc<Ledger>>) -> Result<Response, ApiError> {
    // The latest signed checkpoint, with its witnesses' cosignatures once gathered.
    let note = blocking(move || {
        let Some(cp) = ledger.latest_checkpoint()? else { return Ok(None) };
        Ok(Some(match ledger.published_checkpoint()? {
            Some(p) if p.starts_with(&cp.note) => p,
            _ => cp.note,
        }))
    })
    .await?;
    let Some(note) = note else {
        return Err(ApiError(StatusCode::NOT_FOUND, "no checkpoint signed yet".into()));
    };
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], note)
        .into_response())
}

/// A C2SP tlog-tiles tile: `<L>/<N>[.p/<W>]` (hashes) or `entries/<N>[.p/<W>]` (entry bundle).
#[utoipa::path(get, path = "/tile/{path}", tag = "fleet",
    params(("path" = String, Path, description = "Tile path below /tile/, e.g. 0/000 or entries/x001/234.p/17",
        pattern = "^(entries|[0-9]{1,2})/(x[0-9]{3}/)*[0-9]{3}(\\.p/[0-9]{1,3})?$")),
    responses(
        (status = 200, description = "Tile bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "Not a tile path", body = crate::service::error::ErrorBody),
        (status = 404, description = "Beyond the log", body = crate::service::error::ErrorBody)))]
pub async fn tile(State(ledger): State<Arc<Ledger>>, Path(path): Path<String>) -> Result<Response, ApiError> {
    let full = format!("tile/{path}");
    let req = parse_tile_path(&full)
        .ok_or_else(|| ApiError(StatusCode::BAD_REQUEST, format!("{full:?} is not a C2SP tile path")))?;
    let (bytes, width) = blocking(move || match req {
        TileRequest::Hashes(l, n, w) => ledger.tile(l, n, w).map(|b| (b, w)),
        TileRequest::Entries(n, w) => ledger.entries_bundle(n, w).map(|b| (b, w)),
    })
    .await?;
    let cache =
        if u64::from(width) == TILE_WIDTH { "public, max-age=31536000, immutable" } else { "public, max-age=3600" };
    Ok(([(header::CONTENT_TYPE, "application/octet-stream"), (header::CACHE_CONTROL, cache)], bytes).into_response())
}

/// A release's entries, each with an inclusion proof to the latest checkpoint.
#[utoipa::path(get, path = "/lookup/{release}", tag = "fleet",
    params(("release" = String, Path, description = "Release SHA-256 (64 lower-case hex digits)", pattern = "^(sha256:)?[0-9a-f]{64}$")),
    responses(
        (status = 200, description = "Entries and proofs", body = lookup::LookupAnswer),
        (status = 400, description = "Not a SHA-256", body = crate::service::error::ErrorBody),
        (status = 404, description = "No checkpoint signed yet", body = crate::service::error::ErrorBody)))]
pub async fn lookup_release(
    State(ledger): State<Arc<Ledger>>,
    Path(release): Path<String>,
) -> Result<Json<lookup::LookupAnswer>, ApiError> {
    let release: ReleaseHash = release
        .parse()
        .map_err(|_| ApiError(StatusCode::BAD_REQUEST, "release must be 64 hex digits (SHA-256)".into()))?;
    Ok(Json(blocking(move || lookup::answer(&ledger, &release)).await?))
}

/// This host's view of its peers.
#[utoipa::path(get, path = "/fleet/status", tag = "fleet", responses(
    (status = 200, description = "One object per peer: status, message, size, root, processed entries, evidence", body = Vec<serde_json::Value>)))]
pub async fn status(State(ledger): State<Arc<Ledger>>) -> Result<Json<serde_json::Value>, ApiError> {
    let peers = blocking(move || ledger.peer_records()).await?;
    Ok(Json(serde_json::json!(peers.into_iter().map(|(n, r)| germline_fleet::status_json(&n, &r)).collect::<Vec<_>>())))
}

/// `POST /add-checkpoint` (C2SP tlog-witness).
pub fn witness_routes(service: Arc<WitnessService>) -> Router {
    Router::new().route("/add-checkpoint", post(add_checkpoint)).with_state(service)
}

/// C2SP tlog-witness `add-checkpoint`: cosigns a configured peer's checkpoint that is
/// consistent with what this host cosigned before.
#[utoipa::path(post, path = "/add-checkpoint", tag = "fleet",
    request_body(content = String, content_type = "text/plain", description = "old size, consistency proof and signed checkpoint"),
    responses(
        (status = 200, description = "Cosignature lines", content_type = "text/plain", body = String),
        (status = 400, description = "Malformed request", body = crate::service::error::ErrorBody),
        (status = 403, description = "Not signed by a configured peer", body = crate::service::error::ErrorBody),
        (status = 404, description = "Unknown log", body = crate::service::error::ErrorBody),
        (status = 409, description = "Old size is not the latest cosigned size", content_type = "text/x.tlog.size", body = String),
        (status = 413, description = "Request too large", body = crate::service::error::ErrorBody),
        (status = 422, description = "Inconsistent with the cosigned checkpoint", body = crate::service::error::ErrorBody)))]
pub async fn add_checkpoint(State(w): State<Arc<WitnessService>>, body: axum::body::Bytes) -> Response {
    let err = |status: StatusCode, msg: String| (status, Json(serde_json::json!({ "error": msg }))).into_response();
    if body.len() > MAX_REQUEST_BYTES {
        return err(StatusCode::PAYLOAD_TOO_LARGE, "request too large".into());
    }
    let Ok(text) = String::from_utf8(body.to_vec()) else {
        return err(StatusCode::BAD_REQUEST, "body is not UTF-8".into());
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(1);
    let result = tokio::task::spawn_blocking(move || w.add_checkpoint(&text, now)).await;
    match result {
        Ok(Ok(lines)) => ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], lines).into_response(),
        Ok(Err(AddCheckpointError::Conflict(size))) => {
            (StatusCode::CONFLICT, [(header::CONTENT_TYPE, "text/x.tlog.size")], format!("{size}\n")).into_response()
        }
        Ok(Err(AddCheckpointError::BadRequest(m))) => err(StatusCode::BAD_REQUEST, m),
        Ok(Err(AddCheckpointError::Forbidden(m))) => err(StatusCode::FORBIDDEN, m),
        Ok(Err(AddCheckpointError::UnknownLog(m))) => err(StatusCode::NOT_FOUND, format!("unknown log {m:?}")),
        Ok(Err(AddCheckpointError::Unprocessable(m))) => {
            tracing::error!("refused to cosign an inconsistent checkpoint: {m}");
            err(StatusCode::UNPROCESSABLE_ENTITY, m)
        }
        Ok(Err(AddCheckpointError::Internal(m))) => err(StatusCode::INTERNAL_SERVER_ERROR, m),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, format!("worker failed: {e}")),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, LedgerError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("worker failed: {e}")))?
        .map_err(ApiError::from)
}
