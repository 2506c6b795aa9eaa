//! Formation-consistent dispatch over the API (DESIGN §8): `POST /v1/formations` forms a
//! call against the current release of a name (the delayed-approval path keeps it
//! pending), `POST /v1/formations/{id}/dispatch` runs it behind the final-hop fence, and
//! `POST /v1/releases/{hash}/lifecycle` promotes, rolls back or retires a release. The
//! formed calls run on the service's own germlines (dampening and witnesses as for any
//! call); records and lifecycle events go to the service's ledger.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use germline_executor::call::{CallOutcome, CallRequest};
use germline_executor::dispatch::{Fence, FormationHost, HostedRelease, ReleaseRunner};
use germline_executor::ExecutorError;
use germline_model::{FormationEntry, Lifecycle, ReleaseHash, ReleaseName, Sha256Digest};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
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
        f: impl FnOnce(&mut crate::exec_cmd::Host) -> Result<T, ExecutorError>,
    ) -> Result<T, ExecutorError> {
        let slot = self
            .releases
            .get(&release.release)
            .ok_or_else(|| ExecutorError::Call(format!("release {} is not admitted here", release.label())))?;
        self.releases.with_host(&slot, f).map_err(ExecutorError::Call)?
    }
}

impl ReleaseRunner for ServiceRunner {
    fn list_tools(&self, release: &HostedRelease) -> Result<Value, ExecutorError> {
        self.with_host(release, |h| h.rt.list_tools())
    }

    fn run(
        &self,
        release: &HostedRelease,
        req: &CallRequest,
        fence: &mut Fence<'_>,
    ) -> Result<CallOutcome, ExecutorError> {
        self.with_host(release, |h| {
            fence(&h.rt)?;
            let outcome = h.call(req).map_err(|e| ExecutorError::Call(format!("{e:#}")))?;
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
    if host.attach(dir, Some(hash)).is_ok() {
        return Ok(());
    }
    host.admit_as(dir, Some(hash))?;
    let name = host.release(&hash).map(|h| h.name.clone());
    if let Some(name) = name {
        if host.lifecycle(&name).is_some_and(|l| l.current.is_none()) {
            host.promote(&hash)?;
        }
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
    /// The record as stored in the ledger: snapshot (name, version, release, descriptor
    /// digests), tool, argument digest, policy, time, epoch, contract, captured successors.
    #[schema(value_type = Object)]
    record: Value,
}

fn formation_view(f: &FormationEntry) -> FormationView {
    FormationView {
        id: f.id.to_hex(),
        snapshot: f.record.snapshot.id().to_hex(),
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
        (status = 201, description = "The call is formed and pending", body = FormationView),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 409, description = "No current release of that name, a stale snapshot, or an unknown tool", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 503, description = "Shutting down", body = ErrorBody)))]
pub async fn form(
    State(st): State<AppState>,
    body: Result<Json<FormationBody>, JsonRejection>,
) -> Result<(StatusCode, Json<FormationView>), ApiError> {
    let body = body?.0;
    let name = ReleaseName::new(&body.release).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let want = match &body.snapshot {
        Some(s) => Some(s.parse::<Sha256Digest>().map_err(|e| ApiError::BadRequest(e.to_string()))?),
        None => None,
    };
    let req = CallBody::new(body.tool, body.arguments, body.items, body.consumers).into_request()?;
    let f = blocking(&st, move |st| {
        let (_, snapshot) = st.formations.list_tools(&name).map_err(executor_error)?;
        if want.is_some_and(|w| w != snapshot.id()) {
            return Err(ApiError::Refused(format!(
                "the tools of {name} changed since snapshot {}: list them again and re-form the call",
                want.map(|w| w.short()).unwrap_or_default()
            )));
        }
        st.formations.form(&snapshot, &req).map_err(executor_error)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(formation_view(&f))))
}

#[utoipa::path(post, path = "/v1/formations/{id}/dispatch", tag = "formations",
    params(("id" = String, Path, description = "Formation id (64 lower-case hex digits)", pattern = "^[0-9a-f]{64}$")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The formed call ran (a tool failure is in `error`)", body = CallResponse),
        (status = 400, description = "Not a formation id", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "No such formation", body = ErrorBody),
        (status = 409, description = "The final-hop fence refused it (the error names formation, release and reason); nothing ran", body = ErrorBody),
        (status = 503, description = "Shutting down", body = ErrorBody)))]
pub async fn dispatch(
    State(st): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<CallResponse>, ApiError> {
    let id: Sha256Digest =
        id?.0.parse().map_err(|e: germline_model::ModelError| ApiError::BadRequest(e.to_string()))?;
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
        (status = 200, description = "The change is recorded; the name's lifecycle now", body = LifecycleView),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 404, description = "Release not admitted here", body = ErrorBody),
        (status = 409, description = "The change is not allowed now", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 503, description = "Shutting down", body = ErrorBody)))]
pub async fn lifecycle(
    State(st): State<AppState>,
    hash: Result<Path<String>, PathRejection>,
    body: Result<Json<LifecycleBody>, JsonRejection>,
) -> Result<Json<LifecycleView>, ApiError> {
    let body = body?.0;
    let hash: ReleaseHash =
        hash?.0.parse().map_err(|e: germline_model::ModelError| ApiError::BadRequest(e.to_string()))?;
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
