//! Formation-consistent dispatch over the API (DESIGN §8): `POST /v1/formations` forms a
//! call against the current release of a name (the delayed-approval path keeps it
//! pending), `POST /v1/formations/{id}/dispatch` runs it behind the final-hop fence, and
//! `POST /v1/releases/{hash}/lifecycle` promotes, rolls back or retires a release, and
//! `POST /v1/mcp/{name}` is an MCP endpoint (JSON-RPC over HTTP, `Mcp-Session-Id`
//! sessions) whose calls bind to the snapshot the session saw at `tools/list`. The
//! formed calls run on the service's own germlines (dampening and witnesses as for any
//! call); records and lifecycle events go to the service's ledger.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use germline_executor::call::CallRequest;
use germline_executor::dispatch::{
    call_params, named_snapshot, Fence, FormationHost, HostedRelease, ReleaseRunner, RunResult, Session,
};
use germline_executor::ExecutorError;
use germline_model::{FormationEntry, Label, Lifecycle, ReleaseHash, ReleaseName, Sha256Digest};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody, Guarded, JsonBody};
use super::releases::Releases;
use super::routes::{CallBody, CallResponse};
use super::AppState;

/// Runs formed calls on the service's germlines.
pub struct ServiceRunner {
    /// The service's releases.
    pub releases: Arc<Releases>,
}

impl ServiceRunner {
    fn with_host<T>(
        &self,
        release: &HostedRelease,
        f: impl FnOnce(&mut germline_host::Host) -> Result<T, ExecutorError>,
    ) -> Result<T, ExecutorError> {
        let slot = self
            .releases
            .get(&release.release)
            .ok_or_else(|| ExecutorError::Call(format!("release {} is not admitted here", release.label())))?;
        self.releases.with_host(&slot, f).map_err(ExecutorError::Call)?
    }
}

impl ReleaseRunner for ServiceRunner {
    /// Data-free only: the service forms calls from no list a copy holding data made.
    fn list_tools(&self, release: &HostedRelease) -> Result<(Value, Label), ExecutorError> {
        self.with_host(release, |h| Ok((h.rt.list_tools()?, Label::empty())))
    }

    fn run(&self, release: &HostedRelease, req: &CallRequest, fence: &mut Fence<'_>) -> RunResult {
        self.with_host(release, |h| {
            let outcome = h.fenced_call(req, fence)?;
            if let Err(e) = h.after_call(req, &outcome) {
                tracing::error!("recording the formed call in the ledger: {e:#}");
            }
            Ok(outcome)
        })
    }

    fn stop(&self, _release: &HostedRelease) {}
}

/// Registers every admitted release with the formation host: releases the ledger already
/// knows are attached, new ones admitted (and promoted when their name has no current
/// release yet).
pub fn register(host: &FormationHost, releases: &Releases) -> anyhow::Result<()> {
    for slot in releases.all() {
        register_one(host, slot.dir(), slot.hash)?;
    }
    Ok(())
}

/// Registers one admitted release (see [`register`]).
pub fn register_one(host: &FormationHost, dir: &std::path::Path, hash: ReleaseHash) -> anyhow::Result<()> {
    let hosted = host.register(dir, Some(hash))?;
    if host.lifecycle(&hosted.name).is_some_and(|l| l.current.is_none()) {
        host.promote(&hash)?;
    }
    Ok(())
}

/// `POST /v1/formations`: a call formed against the current release of `release`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FormationBody {
    /// Release name.
    #[schema(min_length = 1, max_length = 128, pattern = "^[a-z0-9._-]+$")]
    release: String,
    /// The snapshot id the caller formed the call from (from an earlier formation); if
    /// the current release's tools differ, the formation is refused.
    #[serde(default)]
    #[schema(pattern = "^[0-9a-f]{64}$")]
    snapshot: Option<String>,
    /// Tool name.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$")]
    tool: String,
    /// Tool arguments.
    #[serde(default)]
    #[schema(value_type = Object)]
    arguments: serde_json::Map<String, Value>,
    /// Absolute paths of the call's file items.
    #[serde(default)]
    #[schema(schema_with = super::routes::item_paths_schema)]
    items: Vec<String>,
    /// Consumers of the result (default `agent`).
    #[serde(default)]
    #[schema(schema_with = super::routes::consumers_schema)]
    consumers: Vec<String>,
}

/// A formation: its id, snapshot id and record.
#[derive(Serialize, ToSchema)]
pub struct FormationView {
    /// Formation id (SHA-256 of the record's canonical JSON).
    id: String,
    /// Snapshot id (SHA-256 of the snapshot's canonical JSON).
    snapshot: String,
    /// Ledger index of the snapshot's entry.
    snapshot_entry: u64,
    /// The record as stored in the ledger: snapshot (name, version, release, descriptor
    /// digests), tool, argument digest, policy, time, epoch, contract, captured successors.
    #[schema(value_type = Object)]
    record: Value,
}

fn formation_view(f: &FormationEntry, snapshot: &Session) -> FormationView {
    FormationView {
        id: f.id.to_hex(),
        snapshot: snapshot.id.to_hex(),
        snapshot_entry: snapshot.entry,
        record: serde_json::to_value(&f.record).unwrap_or(Value::Null),
    }
}

/// `POST /v1/releases/{hash}/lifecycle`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LifecycleBody {
    /// `promote`, `roll_back` or `retire`.
    #[schema(pattern = "^(promote|roll_back|retire)$")]
    action: String,
}

/// The lifecycle of a release name.
#[derive(Serialize, ToSchema)]
pub struct LifecycleView {
    /// Release name.
    name: String,
    /// Epoch of the last change.
    epoch: u64,
    /// The release new formations use.
    current: Option<String>,
    /// Admitted releases: hash → version and whether retired.
    #[schema(value_type = Object)]
    releases: Value,
}

fn lifecycle_view(l: &Lifecycle) -> LifecycleView {
    LifecycleView {
        name: l.name.to_string(),
        epoch: l.epoch,
        current: l.current.map(|c| c.to_hex()),
        releases: serde_json::to_value(&l.releases).unwrap_or(Value::Null),
    }
}

fn parse_name(s: &str) -> Result<ReleaseName, ApiError> {
    ReleaseName::new(s).map_err(|e| ApiError::BadRequest(e.to_string()))
}

fn parse_digest(s: &str) -> Result<Sha256Digest, ApiError> {
    s.parse().map_err(|e: germline_model::ModelError| ApiError::BadRequest(e.to_string()))
}

fn executor_error(e: ExecutorError) -> ApiError {
    match e {
        ExecutorError::Fence(m) | ExecutorError::Lifecycle(m) => ApiError::Refused(m),
        ExecutorError::Model(m) => ApiError::Refused(m.to_string()),
        ExecutorError::Formation(m) if m.starts_with("no formation") => ApiError::NotFound(m),
        ExecutorError::Formation(m) => ApiError::Refused(m),
        ExecutorError::Call(m) => ApiError::Refused(m),
        other => ApiError::Internal(other.to_string()),
    }
}

async fn blocking<T: Send + 'static>(
    st: &AppState,
    f: impl FnOnce(AppState) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let work = st.work()?;
    let st2 = st.clone();
    tokio::task::spawn_blocking(move || {
        let _work = work;
        f(st2)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("formation task: {e}")))?
}

#[utoipa::path(post, path = "/v1/formations", tag = "formations", request_body = FormationBody,
    security(("bearer" = [])),
    responses(
        Guarded,
        JsonBody,
        (status = 201, description = "The call is formed and pending", body = FormationView),
        (status = 409, description = "No current release of that name, a stale snapshot, or an unknown tool", body = ErrorBody)))]
pub async fn form(
    State(st): State<AppState>,
    body: Result<Json<FormationBody>, JsonRejection>,
) -> Result<(StatusCode, Json<FormationView>), ApiError> {
    let body = body?.0;
    let name = parse_name(&body.release)?;
    let want = body.snapshot.as_deref().map(parse_digest).transpose()?;
    let req = CallBody::new(body.tool, body.arguments, body.items, body.consumers).into_request()?;
    let view = blocking(&st, move |st| {
        let (_, session) = st.formations.list_tools(&name).map_err(executor_error)?;
        if want.is_some_and(|w| w != session.id) {
            return Err(ApiError::Refused(format!(
                "the tools of {name} changed since snapshot {}: list them again and re-form the call",
                want.map(|w| w.short()).unwrap_or_default()
            )));
        }
        let f = st.formations.form(&session.snapshot, &req).map_err(executor_error)?;
        Ok(formation_view(&f, &session))
    })
    .await?;
    Ok((StatusCode::CREATED, Json(view)))
}

#[utoipa::path(post, path = "/v1/formations/{id}/dispatch", tag = "formations",
    params(("id" = String, Path, description = "Formation id (64 lower-case hex digits)", pattern = "^[0-9a-f]{64}$")),
    security(("bearer" = [])),
    responses(
        Guarded,
        (status = 200, description = "The formed call ran (a tool failure is in `error`)", body = CallResponse),
        (status = 400, description = "Not a formation id", body = ErrorBody),
        (status = 404, description = "No such formation", body = ErrorBody),
        (status = 409, description = "The final-hop fence refused it (the error names formation, release and reason); nothing ran", body = ErrorBody)))]
pub async fn dispatch(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<CallResponse>, ApiError> {
    let id = parse_digest(&id?.0)?;
    let (o, latency) = blocking(&st, move |st| {
        let t0 = Instant::now();
        let o = st.formations.dispatch(&id, None).map_err(executor_error)?;
        Ok((o, t0.elapsed()))
    })
    .await?;
    Ok(Json(CallResponse::new(&o, latency)))
}

#[utoipa::path(post, path = "/v1/releases/{hash}/lifecycle", tag = "formations", request_body = LifecycleBody,
    params(("hash" = String, Path, description = "Release hash (64 lower-case hex digits)", pattern = "^(sha256:)?[0-9a-f]{64}$")),
    security(("bearer" = [])),
    responses(
        Guarded,
        JsonBody,
        (status = 200, description = "The change is recorded; the name's lifecycle now", body = LifecycleView),
        (status = 404, description = "Release not admitted here", body = ErrorBody),
        (status = 409, description = "The change is not allowed now", body = ErrorBody)))]
pub async fn lifecycle(
    State(st): State<AppState>,
    hash: Result<Path<String>, PathRejection>,
    body: Result<Json<LifecycleBody>, JsonRejection>,
) -> Result<Json<LifecycleView>, ApiError> {
    let body = body?.0;
    let hash = super::routes::parse_hash(&hash?.0)?;
    let view = blocking(&st, move |st| {
        let hosted = st
            .formations
            .release(&hash)
            .ok_or_else(|| ApiError::NotFound(format!("release {hash} is not admitted here")))?;
        match body.action.as_str() {
            "promote" => st.formations.promote(&hash),
            "roll_back" => st.formations.roll_back(&hash),
            "retire" => st.formations.retire(&hash),
            other => {
                return Err(ApiError::BadRequest(format!("unknown action {other:?} (promote, roll_back, retire)")))
            }
        }
        .map_err(executor_error)?;
        let l = st.formations.lifecycle(&hosted.name).ok_or_else(|| ApiError::Internal("lifecycle vanished".into()))?;
        Ok(lifecycle_view(&l))
    })
    .await?;
    Ok(Json(view))
}

/// The formation host of the service over its ledger and releases.
pub fn host(
    ledger: Arc<germline_ledger::Ledger>,
    releases: Arc<Releases>,
    python: germline_executor::germline::PythonRuntime,
    policy: germline_model::DispatchPolicy,
    data_dir: &std::path::Path,
) -> anyhow::Result<FormationHost> {
    let host = FormationHost::open_with(ledger, Arc::new(ServiceRunner { releases: releases.clone() }), python)?;
    host.set_dispatch_policy(policy);
    host.keep_pending_in(&data_dir.join("formations"))?;
    register(&host, &releases)?;
    Ok(host)
}

/// Most MCP sessions alive at once.
const MAX_MCP_SESSIONS: usize = 1024;
const SESSION_HEADER: &str = "mcp-session-id";

/// One MCP session of the service endpoint: the name it talks to and the snapshot it saw.
#[derive(Clone)]
struct McpSession {
    name: ReleaseName,
    session: Option<Session>,
}

/// The service's MCP sessions, by id.
#[derive(Default)]
pub struct McpSessions(std::sync::Mutex<std::collections::BTreeMap<String, McpSession>>);

impl McpSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, McpSession>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn rpc_ok(id: &Value, result: Value) -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn rpc_err(id: &Value, code: i64, message: &str) -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// JSON-RPC: invalid request, method not found, invalid params; -32000: the call was not
/// run (formation refused or final-hop fence).
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const NOT_RUN: i64 = -32000;

#[utoipa::path(post, path = "/v1/mcp/{name}", tag = "formations",
    request_body(content = Object, description = "One JSON-RPC 2.0 message (MCP): initialize, ping, tools/list, tools/call, or a notification"),
    params(
        ("name" = String, Path, description = "Release name", pattern = "^[a-z0-9._-]{1,128}$"),
        ("Mcp-Session-Id" = Option<String>, Header, description = "The session `initialize` returned (every message but initialize)")),
    security(("bearer" = [])),
    responses(
        Guarded,
        JsonBody,
        (status = 200, description = "The JSON-RPC response (a refused or fenced call is error -32000 naming formation, release and reason)", body = Object),
        (status = 202, description = "A notification was accepted"),
        (status = 404, description = "Unknown or ended session: initialize again", body = ErrorBody)))]
pub async fn mcp(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    headers: axum::http::HeaderMap,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let msg = body?.0;
    let name = parse_name(&name?.0)?;
    let Value::Object(msg) = msg else {
        return Err(ApiError::BadRequest("expected one JSON-RPC object (no batches)".into()));
    };
    let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
    let id = msg.get("id").cloned();
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    if method.as_deref() == Some("initialize") {
        let Some(id) = id else { return Ok(StatusCode::ACCEPTED.into_response()) };
        let sid =
            crate::front::http::random_id().map_err(|_| ApiError::Internal("no randomness for a session id".into()))?;
        {
            let mut sessions = st.mcp_sessions.lock();
            if sessions.len() >= MAX_MCP_SESSIONS {
                return Err(ApiError::Unavailable("too many MCP sessions".into()));
            }
            sessions.insert(sid.clone(), McpSession { name: name.clone(), session: None });
        }
        let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or("2025-06-18").to_owned();
        let result = serde_json::json!({
            "protocolVersion": asked,
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": {"name": format!("germline:{name}"), "version": env!("CARGO_PKG_VERSION")},
            "instructions": "Calls bind to the tools this session listed: after a rollout, list them again.",
        });
        let mut resp = Json(rpc_ok(&id, result)).into_response();
        if let Ok(v) = axum::http::HeaderValue::from_str(&sid) {
            resp.headers_mut().insert(SESSION_HEADER, v);
        }
        return Ok(resp);
    }
    let sid = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let session = st.mcp_sessions.lock().get(&sid).cloned().filter(|s| s.name == name);
    let Some(session) = session else {
        return Err(ApiError::NotFound("unknown or ended session: initialize again".into()));
    };
    let (Some(method), Some(id)) = (method, id) else {
        return Ok(StatusCode::ACCEPTED.into_response());
    };
    if !(id.is_string() || id.is_number()) {
        return Ok(Json(rpc_err(&Value::Null, INVALID_REQUEST, "id must be a string or a number")).into_response());
    }
    let answer = match method.as_str() {
        "ping" => rpc_ok(&id, serde_json::json!({})),
        "tools/list" => {
            let n = name.clone();
            let listed = blocking(&st, move |st| Ok(st.formations.open_session(&n).map_err(|e| e.to_string()))).await?;
            match listed {
                Ok((mut tools, s)) => {
                    s.attach_to(&mut tools);
                    if let Some(m) = st.mcp_sessions.lock().get_mut(&sid) {
                        m.session = Some(s);
                    }
                    rpc_ok(&id, tools)
                }
                Err(e) => rpc_err(&id, NOT_RUN, &e),
            }
        }
        "tools/call" => {
            let parsed = call_params(&params).map_err(str::to_owned).and_then(|c| Ok((c, named_snapshot(&params)?)));
            let ((tool, arguments), named) = match parsed {
                Ok(p) => p,
                Err(e) => return Ok(Json(rpc_err(&id, INVALID_PARAMS, &e)).into_response()),
            };
            if named.is_none() && session.session.is_none() {
                let e = "list the tools first: calls bind to the tools this session saw";
                return Ok(Json(rpc_err(&id, INVALID_REQUEST, e)).into_response());
            }
            let req = CallRequest { tool, arguments, items: Vec::new(), consumers: Vec::new() };
            let ran = blocking(&st, move |st| {
                let call = || {
                    let s = match (named, session.session) {
                        (Some(named), _) => st.formations.resume_session(&named).and_then(|s| same_name(s, &name))?,
                        (None, Some(s)) => s,
                        (None, None) => {
                            return Err(ExecutorError::Formation("list the tools first".into()));
                        }
                    };
                    st.formations.session_call(&s, &req)
                };
                Ok(call().map_err(|e| e.to_string()))
            });
            match ran.await? {
                Ok(o) => match (o.result, o.error) {
                    (Some(result), _) => rpc_ok(&id, result),
                    (None, e) => rpc_err(&id, NOT_RUN, &e.unwrap_or_else(|| "the call produced no result".into())),
                },
                Err(e) => rpc_err(&id, NOT_RUN, &e),
            }
        }
        other => rpc_err(&id, METHOD_NOT_FOUND, &format!("Method not found: {other}")),
    };
    Ok(Json(answer).into_response())
}

/// A resumed session must have listed the tools of the endpoint's release name.
fn same_name(s: Session, name: &ReleaseName) -> Result<Session, ExecutorError> {
    if s.snapshot.name == *name {
        Ok(s)
    } else {
        Err(ExecutorError::Formation(format!("snapshot {} is of {}, not {name}", s.id.short(), s.snapshot.name)))
    }
}
