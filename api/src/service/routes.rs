//! The handlers and the OpenAPI document they are described in. Input is parsed and
//! checked here, once; every failure becomes an [`ApiError`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use germline_executor::call::{CallOutcome, CallRequest};
use germline_ledger::{EntryKind, Hash};
use germline_model::ReleaseHash;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};

use super::error::{ApiError, ErrorBody, Guarded, JsonBody};
use super::metrics::{self, CallLabels};
use super::releases::{GermlineStatus, ReleaseSlot};
use super::AppState;
use germline_host::refused_as_suppressed;

const MAX_TOOL_NAME: usize = 256;
const MAX_ITEMS: usize = 256;
const MAX_CONSUMERS: usize = 32;
const MAX_NAME: usize = 128;
const MAX_PATH: usize = 4096;
const MAX_ENTRIES_PAGE: u64 = 1000;

/// The OpenAPI document of the service.
#[derive(OpenApi)]
#[openapi(
    info(title = "germline", description = "Admit signed MCP tool releases, run their calls under germline, and read the evidence ledger."),
    paths(
        healthz, readyz, metrics, openapi, list_releases, get_release, admit_tuf, admit_sigstore, call, session,
        witnesses, dampening, checkpoint, sign_checkpoint, entries, entry, inclusion, consistency,
        crate::fleet::routes::checkpoint, crate::fleet::routes::tile, crate::fleet::routes::lookup_release,
        crate::fleet::routes::status, crate::fleet::routes::add_checkpoint,
        super::formations::form, super::formations::dispatch, super::formations::lifecycle, super::formations::mcp,
        policies, reload_policies
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "operations", description = "Health, readiness, metrics"),
        (name = "releases", description = "Admission, calls, witnesses, dampening"),
        (name = "ledger", description = "The append-only evidence log"),
        (name = "formations", description = "Formation-consistent dispatch: formed calls, the final-hop fence, release lifecycles"),
        (name = "fleet", description = "C2SP tlog-tiles publishing of the ledger, lookups, the tlog-witness endpoint, peer status")
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Liveness.
#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok`, `ready`, `starting` or `shutting_down`.
    status: String,
    /// `/readyz` only: what holds each copy to its memory and process limits on this
    /// host; starts with `NO per-copy cgroup limits` where only rlimits apply.
    #[serde(skip_serializing_if = "Option::is_none")]
    per_copy_limits: Option<String>,
    /// `/readyz` only: the baseline releases run under instead of germline (`serve
    /// --baseline`, for evaluation), or null when they run under germline.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, nullable)]
    baseline: Option<Option<String>>,
    /// `/readyz` only: whether germlines bind a resident root (SECURITY.md, "Resident
    /// root"): `on by default` or `off by default (...)`, then each release whose policy
    /// chose otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    resident_root: Option<String>,
}

/// A release, its germline and its dampening.
#[derive(Serialize, ToSchema)]
pub struct ReleaseView {
    /// SHA-256 of the release archive.
    hash: String,
    /// Manifest name.
    name: String,
    /// Manifest version.
    version: String,
    /// When it was admitted (RFC 3339).
    admitted_at: Option<String>,
    /// `not_started`, `running` or `refused`.
    germline: String,
    /// Why the germline was refused (G1–G3 or start failure).
    refused_reason: Option<String>,
    /// Dampening state.
    dampening: DampeningView,
    /// Witnesses about this release in the ledger.
    witnesses: u64,
}

/// Dampening state of a release (DESIGN §2).
#[derive(Serialize, ToSchema)]
pub struct DampeningView {
    /// Release hash.
    release: String,
    /// Current penalty.
    penalty: f64,
    /// Whether calls are refused.
    suppressed: bool,
    /// Call attempts counted.
    calls: u64,
    /// Penalty at which a release is suppressed.
    suppress_at: f64,
    /// Penalty below which a suppressed release is usable again.
    reuse_below: f64,
}

/// One tool call.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallBody {
    /// Tool name.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$")]
    tool: String,
    /// Tool arguments.
    #[serde(default)]
    #[schema(value_type = Object)]
    arguments: Map<String, Value>,
    /// Absolute paths of the call's file items (labelled by the deployer's policy); each
    /// starts with `/`, has no NUL and at most 4096 characters.
    #[serde(default)]
    #[schema(schema_with = item_paths_schema)]
    items: Vec<String>,
    /// Consumers of the result (default `agent`); each 1 to 128 characters without
    /// control characters.
    #[serde(default)]
    #[schema(schema_with = consumers_schema)]
    consumers: Vec<String>,
}

/// Matches strings without control characters (Unicode category Cc).
const NO_CONTROL: &str = "^[^\\x00-\\x1F\\x7F-\\x9F]+$";

fn string_array(max_items: usize, max_length: usize, pattern: &str) -> utoipa::openapi::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(max_length))
                .pattern(Some(pattern)),
        )
        .max_items(Some(max_items))
        .build()
}

pub(super) fn item_paths_schema() -> utoipa::openapi::Array {
    string_array(MAX_ITEMS, MAX_PATH, "^/[^\\x00]*$")
}

pub(super) fn consumers_schema() -> utoipa::openapi::Array {
    string_array(MAX_CONSUMERS, MAX_NAME, NO_CONTROL)
}

impl CallBody {
    /// A call body from its parts (checked by [`CallBody::into_request`]).
    pub(super) fn new(tool: String, arguments: Map<String, Value>, items: Vec<String>, consumers: Vec<String>) -> Self {
        CallBody { tool, arguments, items, consumers }
    }

    pub(super) fn into_request(self) -> Result<CallRequest, ApiError> {
        let bad = |m: String| Err(ApiError::BadRequest(m));
        if !plain_text(&self.tool, MAX_TOOL_NAME) {
            return bad(format!("tool must be 1 to {MAX_TOOL_NAME} characters without control characters"));
        }
        if self.items.len() > MAX_ITEMS {
            return bad(format!("at most {MAX_ITEMS} items"));
        }
        let mut items = Vec::with_capacity(self.items.len());
        for i in self.items {
            if !i.starts_with('/') || i.chars().count() > MAX_PATH || i.contains('\0') {
                return bad(format!("item {i:?} must be an absolute path without NUL, at most {MAX_PATH} characters"));
            }
            items.push(PathBuf::from(i));
        }
        if self.consumers.len() > MAX_CONSUMERS {
            return bad(format!("at most {MAX_CONSUMERS} consumers"));
        }
        if let Some(c) = self.consumers.iter().find(|c| !plain_text(c, MAX_NAME)) {
            return bad(format!("consumer {c:?} must be 1 to {MAX_NAME} characters without control characters"));
        }
        Ok(CallRequest { tool: self.tool, arguments: self.arguments, items, consumers: self.consumers })
    }
}

/// What a call produced.
#[derive(Serialize, ToSchema)]
pub struct CallResponse {
    /// How the call ended, as the host decided it.
    #[schema(pattern = "^(answered|failed|refused|suppressed)$")]
    status: String,
    /// The tool result for the first consumer (with the label in `_meta`).
    result: Option<Value>,
    /// Its output label (tags).
    label: Option<Value>,
    /// Copies forked.
    copies: u64,
    /// Triggers recorded (witnesses follow in the ledger once verified).
    triggers: Vec<Value>,
    /// Why the call failed, if it did.
    error: Option<String>,
    /// Per consumer: result, label, error.
    #[schema(value_type = Object)]
    consumers: BTreeMap<String, Value>,
    /// The broker's egress decisions.
    egress: Vec<Value>,
    /// Wall-clock time on the germline, in milliseconds.
    latency_ms: f64,
}

impl CallResponse {
    pub(super) fn new(o: &CallOutcome, latency: Duration) -> CallResponse {
        let v = |x: &dyn erased::Ser| x.value();
        CallResponse {
            status: v(&o.status).as_str().unwrap_or("failed").to_owned(),
            result: o.result.clone(),
            label: o.label.as_ref().map(|l| v(l)),
            copies: o.copies as u64,
            triggers: o.triggers.iter().map(|t| v(t)).collect(),
            error: o.error.clone(),
            consumers: o.consumers.iter().map(|(k, c)| (k.clone(), v(c))).collect(),
            egress: o.egress.iter().map(|e| v(e)).collect(),
            latency_ms: latency.as_secs_f64() * 1000.0,
        }
    }
}

mod erased {
    /// Serialises anything serialisable into a JSON value (`null` if it cannot).
    pub trait Ser {
        fn value(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Ser for T {
        fn value(&self) -> serde_json::Value {
            serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
        }
    }
}

/// A scripted session: calls run in order on one germline (slots persist between them).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionBody {
    /// The calls.
    #[schema(min_items = 1, max_items = 256)]
    calls: Vec<CallBody>,
}

/// One outcome per call of a session.
#[derive(Serialize, ToSchema)]
pub struct SessionResponse {
    /// Outcomes in call order; a call refused by dampening carries the refusal as `error`.
    outcomes: Vec<CallResponse>,
}

/// Admit a release through TUF: name a TUF trust anchor of the service's configuration
/// (`[trust.tuf.NAME]`: pinned root and repository), or, where the operator allowed
/// caller-supplied roots, send `repo` and `root`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TufAdmitBody {
    /// The configured TUF trust anchor whose root and repository to use.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    anchor: Option<String>,
    /// Caller-supplied repository (only with `allow_caller_roots`): an absolute local
    /// directory, or an http(s) URL under a configured `tuf_repo_urls` prefix.
    #[schema(min_length = 1, max_length = 4096, pattern = "^(/|https?://)[^\\x00]*$")]
    repo: Option<String>,
    /// Caller-supplied trust root (root.json text; only with `allow_caller_roots`).
    #[schema(min_length = 1)]
    root: Option<String>,
    /// Target path or release name.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$")]
    target: String,
}

/// Admit a release archive with a Sigstore bundle or a cosign key signature.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SigstoreAdmitBody {
    /// The release archive (.tar.gz), base64.
    #[schema(min_length = 1, format = Byte)]
    archive_base64: String,
    /// Sigstore bundle JSON, or a base64 cosign signature (with a key anchor or `key`).
    #[schema(min_length = 1)]
    bundle: String,
    /// The configured Sigstore identity (`[trust.sigstore.NAME]`) or cosign key
    /// (`[trust.cosign.NAME]`) the bundle must satisfy.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    anchor: Option<String>,
    /// Caller-supplied public key (PEM; only with `allow_caller_roots`); or identity and issuer.
    key: Option<String>,
    /// Caller-supplied certificate identity (SAN; only with `allow_caller_roots`).
    certificate_identity: Option<String>,
    /// Caller-supplied OIDC issuer (only with `allow_caller_roots`).
    certificate_oidc_issuer: Option<String>,
    /// Caller-supplied trusted root JSON (only with `allow_caller_roots`; default: the
    /// embedded Sigstore public-good root).
    trusted_root: Option<String>,
}

/// A witness in the ledger and its verdict.
#[derive(Serialize, ToSchema)]
pub struct WitnessView {
    /// Ledger index.
    index: u64,
    /// When it was appended (ms since the epoch).
    time_ms: u64,
    /// SHA-256 of the signed witness.
    witness_sha256: Option<String>,
    /// `item_witness`, `state_divergence`, `declared_broken` or `unverified`.
    verdict: Option<String>,
    /// Whether the release declared determinism for the tool.
    declared_deterministic: Option<bool>,
    /// The tool called.
    tool: Option<String>,
    /// The destination whose record diverged: never published (it is the release's
    /// choice, kept in the witness's opening), so always absent.
    destination: Option<String>,
    /// Signing host key (hex Ed25519).
    signer: Option<String>,
    /// The signed witness, base64 (absent when stored by path).
    witness: Option<String>,
    /// Where a large witness is kept on the recording host.
    path: Option<String>,
    /// Why the witness could not be decoded, if it could not.
    problem: Option<String>,
}

/// A signed checkpoint of the ledger.
#[derive(Serialize, ToSchema)]
pub struct CheckpointView {
    /// Log origin.
    origin: String,
    /// Tree size.
    size: u64,
    /// Tree head (hex).
    root: String,
    /// C2SP signed note.
    note: String,
    /// Verifier key of the log.
    vkey: String,
}

/// One ledger entry.
#[derive(Serialize, ToSchema)]
pub struct EntryView {
    /// Position in the log.
    index: u64,
    /// `witness`, `dampening_event`, `admission` or `suppression`.
    kind: String,
    /// Release hash.
    release: String,
    /// Append time (ms since the epoch).
    time_ms: u64,
    /// RFC 6962 leaf hash (hex).
    leaf_hash: String,
    /// The entry's JSON body.
    body: Value,
}

/// A page of ledger entries.
#[derive(Serialize, ToSchema)]
pub struct EntriesView {
    /// Log size.
    size: u64,
    /// Entries from `start`.
    entries: Vec<EntryView>,
}

/// Page of entries.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EntriesQuery {
    /// First index (default 0).
    #[param(minimum = 0)]
    start: Option<i64>,
    /// Most entries (default 100, at most 1000).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

/// Inclusion proof request.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InclusionQuery {
    /// Entry index (below `size`).
    #[param(minimum = 0)]
    index: i64,
    /// Tree size (default: the current log size).
    #[param(minimum = 0)]
    size: Option<i64>,
}

/// Consistency proof request.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ConsistencyQuery {
    /// Older tree size (at most `new`).
    #[param(minimum = 0)]
    old: i64,
    /// Newer tree size (default: the current log size).
    #[param(minimum = 0)]
    new: Option<i64>,
}

/// An inclusion proof.
#[derive(Serialize, ToSchema)]
pub struct InclusionView {
    /// Entry index.
    index: u64,
    /// Tree size.
    size: u64,
    /// Leaf hash (hex).
    leaf_hash: String,
    /// Tree head at `size` (hex).
    root: String,
    /// Audit path (hex hashes).
    proof: Vec<String>,
}

/// A consistency proof.
#[derive(Serialize, ToSchema)]
pub struct ConsistencyView {
    /// Older size.
    old: u64,
    /// Newer size.
    new: u64,
    /// Tree head at `old` (hex).
    old_root: String,
    /// Tree head at `new` (hex).
    new_root: String,
    /// Proof (hex hashes).
    proof: Vec<String>,
}

/// Non-empty, at most `max` characters, no control characters.
fn plain_text(s: &str, max: usize) -> bool {
    !s.is_empty() && s.chars().count() <= max && !s.chars().any(char::is_control)
}

pub(super) fn parse_hash(s: &str) -> Result<ReleaseHash, ApiError> {
    let hex_part = s.strip_prefix("sha256:").unwrap_or(s);
    if hex_part.len() != 64 || !hex_part.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::BadRequest(format!("{s:?} is not a release hash (64 hex digits)")));
    }
    s.parse().map_err(|e| ApiError::BadRequest(format!("{s:?} is not a release hash: {e}")))
}

/// A non-negative query or path integer as an index or size.
fn index(name: &str, v: i64) -> Result<u64, ApiError> {
    u64::try_from(v).map_err(|_| ApiError::BadRequest(format!("{name} must not be negative")))
}

fn hexs(h: &[Hash]) -> Vec<String> {
    h.iter().map(hex::encode).collect()
}

impl AppState {
    /// A retired release runs nothing any more (DESIGN §8).
    fn not_retired(&self, hash: &ReleaseHash) -> Result<(), ApiError> {
        if self.formations.is_retired(hash) {
            return Err(ApiError::Refused(format!("release {hash} was retired")));
        }
        Ok(())
    }

    fn slot(&self, hash: &ReleaseHash) -> Result<Arc<ReleaseSlot>, ApiError> {
        self.releases.get(hash).ok_or_else(|| ApiError::NotFound(format!("release {hash} is not admitted here")))
    }

    fn dampening_view(&self, hash: &ReleaseHash) -> Result<DampeningView, ApiError> {
        let s = self.ledger.dampening_state(hash)?;
        let p = self.ledger.dampening_params();
        Ok(DampeningView {
            release: hash.to_hex(),
            penalty: s.penalty,
            suppressed: s.suppressed,
            calls: s.calls,
            suppress_at: p.suppress_at,
            reuse_below: p.reuse_below,
        })
    }

    fn release_view(&self, slot: &ReleaseSlot) -> Result<ReleaseView, ApiError> {
        let witnesses =
            self.ledger.entries_for_release(&slot.hash)?.iter().filter(|(_, e)| e.kind == EntryKind::Witness).count()
                as u64;
        let (germline, refused_reason) = match slot.status() {
            GermlineStatus::NotStarted => ("not_started", None),
            GermlineStatus::Running => ("running", None),
            GermlineStatus::Refused(why) => ("refused", Some(why)),
        };
        Ok(ReleaseView {
            hash: slot.hash.to_hex(),
            name: slot.name.clone(),
            version: slot.version.clone(),
            admitted_at: slot.admitted_at.clone(),
            germline: germline.to_owned(),
            refused_reason,
            dampening: self.dampening_view(&slot.hash)?,
            witnesses,
        })
    }
}

#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process serves requests", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into(), per_copy_limits: None, baseline: None, resident_root: None })
}

#[utoipa::path(get, path = "/readyz", tag = "operations", responses(
    (status = 200, description = "Ledger open and admitted germlines started", body = Health),
    (status = 503, description = "Starting or shutting down", body = Health)))]
pub async fn readyz(State(st): State<AppState>) -> (StatusCode, Json<Health>) {
    let limits = Some(germline_executor::cgroup::host_support().describe().to_owned());
    let baseline = Some(st.config.baseline.map(|k| k.name().to_owned()));
    let resident_root = Some(st.releases.resident_root());
    let health = |status: &str| {
        Json(Health {
            status: status.into(),
            per_copy_limits: limits.clone(),
            baseline: baseline.clone(),
            resident_root: resident_root.clone(),
        })
    };
    if st.in_flight.closed.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, health("shutting_down"))
    } else if st.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, health("ready"))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, health("starting"))
    }
}

#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, description = "Prometheus metrics", content_type = "application/openmetrics-text", body = String)))]
pub async fn metrics(State(st): State<AppState>) -> Result<Response, ApiError> {
    let text = st.metrics.encode().map_err(|e| ApiError::Internal(format!("encoding metrics: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response())
}

#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "This document", body = Object)))]
pub async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

#[utoipa::path(get, path = "/v1/releases", tag = "releases",
    responses((status = 200, description = "Admitted releases", body = [ReleaseView])))]
pub async fn list_releases(State(st): State<AppState>) -> Result<Json<Vec<ReleaseView>>, ApiError> {
    let views = st.releases.all().iter().map(|s| st.release_view(s)).collect::<Result<Vec<_>, _>>()?;
    Ok(Json(views))
}

#[utoipa::path(get, path = "/v1/releases/{hash}", tag = "releases",
    params(("hash" = String, Path, description = "Release hash (64 lower-case hex digits)", pattern = "^(sha256:)?[0-9a-f]{64}$")),
    responses(
        (status = 200, description = "The release", body = ReleaseView),
        (status = 400, description = "Not a release hash", body = ErrorBody),
        (status = 404, description = "Not admitted here", body = ErrorBody)))]
pub async fn get_release(
    State(st): State<AppState>,
    hash: Result<Path<String>, PathRejection>,
) -> Result<Json<ReleaseView>, ApiError> {
    let slot = st.slot(&parse_hash(&hash?.0)?)?;
    Ok(Json(st.release_view(&slot)?))
}

#[utoipa::path(post, path = "/v1/releases/tuf", tag = "releases", request_body = TufAdmitBody,
    security(("bearer" = [])),
    responses(
        Guarded,
        JsonBody,
        (status = 201, description = "Verified, extracted, G1–G3 passed, germline started", body = ReleaseView),
        (status = 403, description = "Caller-supplied root refused (name a configured `anchor`), or repository URL not under a configured prefix", body = ErrorBody),
        (status = 409, description = "Admitted but its germline refused", body = ErrorBody),
        (status = 422, description = "Unknown anchor, an anchor with a caller's root, verification or the germline check failed", body = ErrorBody)))]
pub async fn admit_tuf(
    State(st): State<AppState>,
    body: Result<Json<TufAdmitBody>, JsonRejection>,
) -> Result<(StatusCode, Json<ReleaseView>), ApiError> {
    let b = body?.0;
    if !plain_text(&b.target, MAX_TOOL_NAME) {
        return Err(ApiError::BadRequest("target must be 1 to 256 characters without control characters".into()));
    }
    let req = match (b.anchor, b.repo, b.root) {
        (Some(name), None, None) => st.config.trust.tuf_anchor(&name)?.admission(b.target),
        (Some(_), _, _) => {
            return Err(ApiError::Unprocessable(
                "a request naming an anchor takes root and repository from the configuration: send only `anchor` and `target`".into(),
            ))
        }
        (None, repo, root) => {
            st.config.trust.caller_trust("a TUF root")?;
            let (Some(repo), Some(root)) = (repo, root) else {
                return Err(ApiError::Unprocessable("send `anchor`, or `repo` with `root`".into()));
            };
            caller_tuf(&st, repo, root, b.target)?
        }
    };
    admit(st, move |store, check| store.admit_tuf(&req, check)).await
}

/// A caller-supplied TUF repository and root (the operator allowed them), checked.
fn caller_tuf(
    st: &AppState,
    repo: String,
    root: String,
    target: String,
) -> Result<germline_admission::TufAdmission, ApiError> {
    let url = repo.starts_with("http://") || repo.starts_with("https://");
    if !(url || repo.starts_with('/')) || repo.contains('\0') || repo.chars().count() > MAX_PATH {
        return Err(ApiError::BadRequest(format!(
            "repository {repo:?} is not an absolute directory or an http(s) URL"
        )));
    }
    if url && !st.config.tuf_repo_urls.iter().any(|p| repo.starts_with(p.as_str())) {
        return Err(ApiError::Forbidden(format!("repository {repo:?} is not under a configured tuf_repo_urls prefix")));
    }
    if !url && !std::path::Path::new(&repo).is_dir() {
        return Err(ApiError::Unprocessable(format!("repository directory {repo:?} does not exist")));
    }
    if serde_json::from_str::<Value>(&root).map(|v| !v.is_object()).unwrap_or(true) {
        return Err(ApiError::Unprocessable("root must be the text of a root.json (a JSON object)".into()));
    }
    Ok(germline_admission::TufAdmission::new(repo, root.into_bytes(), target))
}

#[utoipa::path(post, path = "/v1/releases/sigstore", tag = "releases", request_body = SigstoreAdmitBody,
    security(("bearer" = [])),
    responses(
        Guarded,
        JsonBody,
        (status = 201, description = "Verified, extracted, G1–G3 passed, germline started", body = ReleaseView),
        (status = 403, description = "Caller-supplied key, identity or trusted root refused (name a configured `anchor`)", body = ErrorBody),
        (status = 409, description = "Admitted but its germline refused", body = ErrorBody),
        (status = 422, description = "Unknown anchor, an anchor with a caller's key or identity, verification or the germline check failed", body = ErrorBody)))]
pub async fn admit_sigstore(
    State(st): State<AppState>,
    body: Result<Json<SigstoreAdmitBody>, JsonRejection>,
) -> Result<(StatusCode, Json<ReleaseView>), ApiError> {
    use base64::Engine;
    use germline_admission::sigstore::{SignerPolicy, TrustedRootChoice};
    let b = body?.0;
    let caller = b.key.is_some()
        || b.certificate_identity.is_some()
        || b.certificate_oidc_issuer.is_some()
        || b.trusted_root.is_some();
    let anchor = match b.anchor {
        Some(_) if caller => {
            return Err(ApiError::Unprocessable(
                "a request naming an anchor takes key, identity, issuer and trusted root from the configuration".into(),
            ))
        }
        Some(name) => Some(st.config.trust.signer_anchor(&name)?.clone()),
        None => {
            st.config.trust.caller_trust("a key, identity or trusted root")?;
            None
        }
    };
    let policy = match (&anchor, b.key, b.certificate_identity, b.certificate_oidc_issuer) {
        (Some(a), ..) => a.policy.clone(),
        (None, Some(k), None, None) => SignerPolicy::Key(k),
        (None, None, Some(identity), Some(issuer)) => SignerPolicy::Identity { identity, issuer },
        _ => {
            return Err(ApiError::Unprocessable(
                "give either key, or certificate_identity with certificate_oidc_issuer".into(),
            ))
        }
    };
    let archive = base64::engine::general_purpose::STANDARD
        .decode(b.archive_base64.trim())
        .map_err(|e| ApiError::Unprocessable(format!("archive_base64: {e}")))?;
    let dir = tempfile::tempdir_in(&st.config.data_dir)
        .map_err(|e| ApiError::Internal(format!("temporary directory: {e}")))?;
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).map(|_| p).map_err(|e| ApiError::Internal(format!("writing {name}: {e}")))
    };
    let archive_path = write("release.tar.gz", &archive)?;
    let bundle_path = write("bundle", b.bundle.as_bytes())?;
    let root = match (anchor, b.trusted_root) {
        (Some(a), _) => a.trusted_root,
        (None, Some(r)) => TrustedRootChoice::File(write("trusted_root.json", r.as_bytes())?),
        (None, None) => TrustedRootChoice::default(),
    };
    admit(st, move |store, check| {
        let _keep = &dir;
        store.admit_sigstore(
            &archive_path,
            &bundle_path,
            &policy,
            &root,
            &germline_admission::ArchiveLimits::default(),
            check,
        )
    })
    .await
}

/// Runs one admission request (serialised with the others and with the followers of TUF
/// repositories), records it and starts its germline.
async fn admit(
    st: AppState,
    f: impl FnOnce(
            &germline_admission::ReleaseStore,
            &dyn germline_admission::GermlineCheck,
        ) -> germline_admission::Result<germline_admission::AdmittedRelease>
        + Send
        + 'static,
) -> Result<(StatusCode, Json<ReleaseView>), ApiError> {
    let work = st.work()?;
    let _one_at_a_time = st.admission.lock().await;
    let st2 = st.clone();
    let done = tokio::task::spawn_blocking(move || {
        let _work = work;
        admit_blocking(&st2, f)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("admission task: {e}")))?;
    let (slot, started) = match done {
        Ok(done) => done,
        Err(germline_admission::AdmissionError::GermlineRefused(why)) => {
            return Err(ApiError::Unprocessable(format!("germline check refused the release: {why}")))
        }
        Err(e) => return Err(ApiError::Unprocessable(format!("admission refused: {e}"))),
    };
    if let Err(why) = started {
        return Err(ApiError::Refused(why));
    }
    Ok((StatusCode::CREATED, Json(st.release_view(&slot)?)))
}

/// The admission path every admission takes, the API's and a follower's (blocking; the
/// caller holds the admission lock): verify and unpack with the germline check (G1–G3),
/// record the release, its `admit` lifecycle event in the ledger (and `promote` when its
/// name had no current release), then start its germline. `Ok` carries the start's
/// outcome (`Err` is the germline's refusal).
pub(super) fn admit_blocking(
    st: &AppState,
    f: impl FnOnce(
        &germline_admission::ReleaseStore,
        &dyn germline_admission::GermlineCheck,
    ) -> germline_admission::Result<germline_admission::AdmittedRelease>,
) -> germline_admission::Result<(Arc<ReleaseSlot>, Result<(), String>)> {
    tracing::info!("admission: verifying signatures, hash and length, then the germline check (G1–G3)");
    let check = crate::admission_cli::germline_check();
    match f(st.releases.store(), check.as_ref()) {
        Ok(a) => {
            tracing::info!(release = %a.hash, name = %a.info.name, version = %a.info.version, "admitted");
            let slot = st.releases.admitted(&a);
            if let Err(e) = super::formations::register_one(&st.formations, slot.dir(), slot.hash) {
                tracing::error!(release = %slot.hash, "recording the admission's lifecycle: {e:#}");
            }
            let started = st.releases.ensure_started(&slot);
            Ok((slot, started))
        }
        Err(e) => {
            if matches!(e, germline_admission::AdmissionError::GermlineRefused(_)) {
                st.metrics
                    .germline_refusals
                    .get_or_create(&metrics::ReleaseLabels { release: "unadmitted".into() })
                    .inc();
            }
            Err(e)
        }
    }
}

/// Runs `reqs` in order on the release's germline (on a blocking thread, holding the
/// release's lane), with dampening before and after each call; triggers are verified off
/// the lane. A single call's outcome is answered at once; a session's after the last call.
async fn run_calls(
    st: AppState,
    slot: Arc<ReleaseSlot>,
    reqs: Vec<CallRequest>,
) -> Result<Vec<CallResponse>, ApiError> {
    let work = st.work()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<Result<Vec<CallResponse>, ApiError>>();
    let deadline = st.config.call_deadline;
    let early = reqs.len() == 1;
    let st2 = st.clone();
    tokio::task::spawn_blocking(move || {
        let _work = work;
        let mut tx = Some(tx);
        let ran = st2.releases.with_host(&slot, |host| {
            let mut out = Vec::with_capacity(reqs.len());
            for req in &reqs {
                let span = tracing::info_span!(
                    "call",
                    release = %slot.hash,
                    tool = %req.tool,
                    copies = tracing::field::Empty,
                    triggers = tracing::field::Empty,
                    latency_ms = tracing::field::Empty
                );
                let _enter = span.enter();
                let t0 = Instant::now();
                let outcome = match host.call(req) {
                    Ok(o) => o,
                    Err(e) => {
                        let e = ApiError::Unavailable(format!("ledger unavailable, call not run: {e:#}"));
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(Err(e));
                        }
                        return out;
                    }
                };
                let latency = t0.elapsed();
                let refused = refused_as_suppressed(&outcome);
                record_call(&st2, &slot.hash, &outcome, latency, refused);
                // The log is read by parties cleared for nothing: how long the call took, how
                // many triggers it recorded and whether its copy answered are the copies'
                // choices, logged only when no copy held a label (`loggable`); otherwise
                // only whether the call recorded triggers (its dampening event's bit).
                span.record("copies", outcome.copies);
                let open = germline_executor::call::loggable(&outcome.held);
                if open {
                    span.record("triggers", outcome.triggers.len());
                    span.record("latency_ms", latency.as_secs_f64() * 1000.0);
                    // The status, not the error: a copy's error text is labelled data.
                    tracing::info!(status = ?outcome.status, "call done");
                } else {
                    span.record("triggers", usize::from(!outcome.triggers.is_empty()));
                    tracing::info!(labelled = true, "call done");
                }
                let resp = CallResponse::new(&outcome, latency);
                if early {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(if refused {
                            Err(ApiError::Refused(outcome.error.clone().unwrap_or_default()))
                        } else {
                            Ok(vec![resp])
                        });
                    }
                } else {
                    out.push(resp);
                }
                // Counts the call's event and queues its trigger verification, which runs
                // off this lane: the next call never waits for a replay (its witnesses are
                // counted in `/metrics` when they land, see `Releases::start`).
                match host.after_call(req, &outcome) {
                    Ok(after) => {
                        if after.newly_suppressed {
                            st2.metrics.suppressions.get_or_create(&metrics::release(&slot.hash)).inc();
                        }
                    }
                    Err(e) => tracing::error!("recording the call in the ledger: {e:#}"),
                }
            }
            out
        });
        if let Some(tx) = tx.take() {
            let _ = tx.send(match ran {
                Ok(out) => Ok(out),
                Err(why) => {
                    st2.metrics
                        .calls
                        .get_or_create(&CallLabels { release: slot.hash.to_hex(), outcome: "refused" })
                        .inc();
                    Err(ApiError::Refused(why))
                }
            });
        }
    });
    match tokio::time::timeout(deadline, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(ApiError::Internal("the call's worker ended without an answer".into())),
        Err(_) => Err(ApiError::Timeout(format!(
            "no outcome within {} ms; the call goes on and is recorded in the ledger and /metrics",
            deadline.as_millis()
        ))),
    }
}

fn record_call(st: &AppState, release: &ReleaseHash, o: &CallOutcome, latency: Duration, refused: bool) {
    let m = &st.metrics;
    let labels = metrics::release(release);
    // `/metrics` is read by parties cleared for nothing. Whether the first consumer's copy
    // answered, how long the call took and how many triggers it recorded are choices of
    // the copies: they are counted only for calls no copy of which held a label. A
    // labelled call counts as `ran`, adds no latency sample, and adds one trigger at most
    // (whether it recorded any: the bit its dampening event publishes in the ledger).
    let open = germline_executor::call::loggable(&o.held);
    let outcome = if refused {
        "refused"
    } else if !open {
        "ran"
    } else if o.error.is_some() {
        "error"
    } else {
        "ok"
    };
    m.calls.get_or_create(&CallLabels { release: labels.release.clone(), outcome }).inc();
    if refused {
        m.refusals.get_or_create(&labels).inc();
        return;
    }
    m.copies.get_or_create(&labels).observe(o.copies as f64);
    if open {
        m.latency.get_or_create(&labels).observe(latency.as_secs_f64());
        m.triggers.get_or_create(&labels).inc_by(o.triggers.len() as u64);
    } else {
        m.triggers.get_or_create(&labels).inc_by(u64::from(!o.triggers.is_empty()));
    }
}

#[utoipa::path(post, path = "/v1/releases/{hash}/calls", tag = "releases", request_body = CallBody,
    params(("hash" = String, Path, description = "Release hash (64 lower-case hex digits)", pattern = "^(sha256:)?[0-9a-f]{64}$")),
    security(("bearer" = [])),
    responses(
        Guarded,
        JsonBody,
        (status = 200, description = "The call ran (a tool failure is in `error`)", body = CallResponse),
        (status = 404, description = "Release not admitted here", body = ErrorBody),
        (status = 409, description = "Release suppressed by dampening, or its germline refused", body = ErrorBody),
        (status = 504, description = "No outcome within the call deadline", body = ErrorBody)))]
pub async fn call(
    State(st): State<AppState>,
    hash: Result<Path<String>, PathRejection>,
    body: Result<Json<CallBody>, JsonRejection>,
) -> Result<Json<CallResponse>, ApiError> {
    // The body's own failures (size, syntax) come first: they are the request's, whatever it names.
    let body = body?.0;
    let slot = st.slot(&parse_hash(&hash?.0)?)?;
    st.not_retired(&slot.hash)?;
    let req = body.into_request()?;
    let mut out = run_calls(st, slot, vec![req]).await?;
    out.pop().map(Json).ok_or_else(|| ApiError::Internal("no outcome".into()))
}

#[utoipa::path(post, path = "/v1/releases/{hash}/sessions", tag = "releases", request_body = SessionBody,
    params(("hash" = String, Path, description = "Release hash (64 lower-case hex digits)", pattern = "^(sha256:)?[0-9a-f]{64}$")),
    security(("bearer" = [])),
    responses(
        Guarded,
        JsonBody,
        (status = 200, description = "Every call's outcome, in order", body = SessionResponse),
        (status = 404, description = "Release not admitted here", body = ErrorBody),
        (status = 409, description = "The release's germline refused", body = ErrorBody),
        (status = 504, description = "No outcome within the call deadline", body = ErrorBody)))]
pub async fn session(
    State(st): State<AppState>,
    hash: Result<Path<String>, PathRejection>,
    body: Result<Json<SessionBody>, JsonRejection>,
) -> Result<Json<SessionResponse>, ApiError> {
    let calls = body?.0.calls;
    let slot = st.slot(&parse_hash(&hash?.0)?)?;
    st.not_retired(&slot.hash)?;
    if calls.is_empty() || calls.len() > st.config.max_session_calls {
        return Err(ApiError::BadRequest(format!("a session has 1 to {} calls", st.config.max_session_calls)));
    }
    let reqs = calls.into_iter().map(CallBody::into_request).collect::<Result<Vec<_>, _>>()?;
    Ok(Json(SessionResponse { outcomes: run_calls(st, slot, reqs).await? }))
}

#[utoipa::path(get, path = "/v1/releases/{hash}/witnesses", tag = "releases",
    params(("hash" = String, Path, description = "Release hash (64 lower-case hex digits)", pattern = "^(sha256:)?[0-9a-f]{64}$")),
    responses(
        (status = 200, description = "Witnesses about the release, in log order", body = [WitnessView]),
        (status = 400, description = "Not a release hash", body = ErrorBody)))]
pub async fn witnesses(
    State(st): State<AppState>,
    hash: Result<Path<String>, PathRejection>,
) -> Result<Json<Vec<WitnessView>>, ApiError> {
    let hash = parse_hash(&hash?.0)?;
    let entries = st.ledger.entries_for_release(&hash)?;
    Ok(Json(
        entries.into_iter().filter(|(_, e)| e.kind == EntryKind::Witness).map(|(i, e)| witness_view(i, &e)).collect(),
    ))
}

fn witness_view(index: u64, e: &germline_ledger::Entry) -> WitnessView {
    use base64::Engine;
    let body: Value = serde_json::from_slice(&e.body).unwrap_or(Value::Null);
    let s = |k: &str| body.get(k).and_then(Value::as_str).map(str::to_owned);
    let mut v = WitnessView {
        index,
        time_ms: e.time_ms,
        witness_sha256: s("witness_sha256"),
        verdict: None,
        declared_deterministic: None,
        tool: None,
        destination: None,
        signer: None,
        witness: s("witness"),
        path: s("path"),
        problem: None,
    };
    let Some(b64) = &v.witness else {
        v.problem = Some("witness stored by path on the recording host".into());
        return v;
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| e.to_string())
        .and_then(|bytes| germline_verifier::Witness::decode(&bytes, None).map_err(|e| e.to_string()));
    match decoded {
        Ok(w) => {
            v.verdict = serde_json::to_value(w.body.report.verdict).ok().and_then(|x| x.as_str().map(str::to_owned));
            v.declared_deterministic = Some(w.body.declared_deterministic);
            v.tool = Some(w.body.evidence.tool.clone());
            v.signer = Some(hex::encode(w.public_key));
        }
        Err(e) => v.problem = Some(e),
    }
    v
}

#[utoipa::path(get, path = "/v1/releases/{hash}/dampening", tag = "releases",
    params(("hash" = String, Path, description = "Release hash (64 lower-case hex digits)", pattern = "^(sha256:)?[0-9a-f]{64}$")),
    responses(
        (status = 200, description = "Dampening state (penalty 0 for a hash never seen)", body = DampeningView),
        (status = 400, description = "Not a release hash", body = ErrorBody)))]
pub async fn dampening(
    State(st): State<AppState>,
    hash: Result<Path<String>, PathRejection>,
) -> Result<Json<DampeningView>, ApiError> {
    Ok(Json(st.dampening_view(&parse_hash(&hash?.0)?)?))
}

fn checkpoint_view(st: &AppState, c: germline_ledger::SignedCheckpoint) -> CheckpointView {
    CheckpointView {
        origin: c.checkpoint.origin,
        size: c.checkpoint.size,
        root: hex::encode(c.checkpoint.root),
        note: c.note,
        vkey: st.ledger.verifier().to_vkey(),
    }
}

#[utoipa::path(get, path = "/v1/ledger/checkpoint", tag = "ledger", responses(
    (status = 200, description = "The latest signed checkpoint", body = CheckpointView),
    (status = 404, description = "None signed yet", body = ErrorBody)))]
pub async fn checkpoint(State(st): State<AppState>) -> Result<Json<CheckpointView>, ApiError> {
    let c = st
        .ledger
        .latest_checkpoint()?
        .ok_or_else(|| ApiError::NotFound("no checkpoint signed yet (POST /v1/ledger/checkpoints signs one)".into()))?;
    Ok(Json(checkpoint_view(&st, c)))
}

#[utoipa::path(post, path = "/v1/ledger/checkpoints", tag = "ledger", security(("bearer" = [])), responses(
    (status = 200, description = "A checkpoint of the current log, signed now (or the latest if the log did not grow)", body = CheckpointView),
    (status = 401, description = "Missing or wrong token", body = ErrorBody)))]
pub async fn sign_checkpoint(State(st): State<AppState>) -> Result<Json<CheckpointView>, ApiError> {
    let _work = st.work()?;
    let c = st.ledger.checkpoint()?;
    Ok(Json(checkpoint_view(&st, c)))
}

fn entry_view(st: &AppState, index: u64) -> Result<EntryView, ApiError> {
    use base64::Engine;
    let raw = st.ledger.get_raw(index)?;
    let e = germline_ledger::Entry::decode(&raw)
        .map_err(|err| ApiError::Internal(format!("stored entry {index} does not decode: {err}")))?;
    let body = serde_json::from_slice(&e.body)
        .unwrap_or_else(|_| Value::String(base64::engine::general_purpose::STANDARD.encode(&e.body)));
    Ok(EntryView {
        index,
        kind: e.kind.as_str().to_owned(),
        release: e.release.to_hex(),
        time_ms: e.time_ms,
        leaf_hash: hex::encode(germline_ledger::merkle::leaf_hash(&raw)),
        body,
    })
}

#[utoipa::path(get, path = "/v1/ledger/entries", tag = "ledger", params(EntriesQuery), responses(
    (status = 200, description = "A page of entries", body = EntriesView),
    (status = 400, description = "Bad paging", body = ErrorBody)))]
pub async fn entries(
    State(st): State<AppState>,
    q: Result<Query<EntriesQuery>, QueryRejection>,
) -> Result<Json<EntriesView>, ApiError> {
    let q = q?.0;
    let limit = index("limit", q.limit.unwrap_or(100))?;
    if !(1..=MAX_ENTRIES_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit must be 1 to {MAX_ENTRIES_PAGE}")));
    }
    let size = st.ledger.size();
    let start = index("start", q.start.unwrap_or(0))?.min(size);
    let end = start.saturating_add(limit).min(size);
    let entries = (start..end).map(|i| entry_view(&st, i)).collect::<Result<Vec<_>, _>>()?;
    Ok(Json(EntriesView { size, entries }))
}

#[utoipa::path(get, path = "/v1/ledger/entries/{index}", tag = "ledger",
    params(("index" = i64, Path, description = "Entry index", minimum = 0)),
    responses(
        (status = 200, description = "The entry", body = EntryView),
        (status = 400, description = "Not an index", body = ErrorBody),
        (status = 404, description = "Past the end of the log", body = ErrorBody)))]
pub async fn entry(
    State(st): State<AppState>,
    idx: Result<Path<i64>, PathRejection>,
) -> Result<Json<EntryView>, ApiError> {
    let index = index("index", idx?.0)?;
    if index >= st.ledger.size() {
        return Err(ApiError::NotFound(format!("entry {index} (log size {})", st.ledger.size())));
    }
    Ok(Json(entry_view(&st, index)?))
}

#[utoipa::path(get, path = "/v1/ledger/proofs/inclusion", tag = "ledger", params(InclusionQuery), responses(
    (status = 200, description = "Inclusion proof", body = InclusionView),
    (status = 400, description = "Index not below size", body = ErrorBody),
    (status = 404, description = "The log is not that large", body = ErrorBody)))]
pub async fn inclusion(
    State(st): State<AppState>,
    q: Result<Query<InclusionQuery>, QueryRejection>,
) -> Result<Json<InclusionView>, ApiError> {
    let q = q?.0;
    let current = st.ledger.size();
    let (i, size) = (index("index", q.index)?, index("size", q.size.unwrap_or(current as i64))?);
    if size > current {
        return Err(ApiError::NotFound(format!("the log has {current} entries, not {size}")));
    }
    if i >= size {
        return Err(ApiError::BadRequest(format!("index {i} is not below size {size}")));
    }
    let raw = st.ledger.get_raw(i)?;
    Ok(Json(InclusionView {
        index: i,
        size,
        leaf_hash: hex::encode(germline_ledger::merkle::leaf_hash(&raw)),
        root: hex::encode(st.ledger.root_at(size)?),
        proof: hexs(&st.ledger.inclusion_proof(i, size)?),
    }))
}

#[utoipa::path(get, path = "/v1/ledger/proofs/consistency", tag = "ledger", params(ConsistencyQuery), responses(
    (status = 200, description = "Consistency proof", body = ConsistencyView),
    (status = 400, description = "Old size past new size", body = ErrorBody),
    (status = 404, description = "The log is not that large", body = ErrorBody)))]
pub async fn consistency(
    State(st): State<AppState>,
    q: Result<Query<ConsistencyQuery>, QueryRejection>,
) -> Result<Json<ConsistencyView>, ApiError> {
    let q = q?.0;
    let current = st.ledger.size();
    let (old, new) = (index("old", q.old)?, index("new", q.new.unwrap_or(current as i64))?);
    if new > current {
        return Err(ApiError::NotFound(format!("the log has {current} entries, not {new}")));
    }
    if old > new {
        return Err(ApiError::BadRequest(format!("old size {old} is past new size {new}")));
    }
    Ok(Json(ConsistencyView {
        old,
        new,
        old_root: hex::encode(st.ledger.root_at(old)?),
        new_root: hex::encode(st.ledger.root_at(new)?),
        proof: hexs(&st.ledger.consistency_proof(old, new)?),
    }))
}

#[utoipa::path(get, path = "/v1/policies", tag = "operations",
    responses((status = 200, description = "The default policy and the per-release ones: file and SHA-256", body = super::policies::PoliciesView)))]
pub async fn policies(State(st): State<AppState>) -> Json<super::policies::PoliciesView> {
    Json(st.releases.policies_view())
}

/// What a policy reload did.
#[derive(Serialize, ToSchema)]
pub struct ReloadView {
    /// Releases whose policy changed: their germlines were stopped and start again, under
    /// the new policy, at their next call.
    pub restarted: Vec<String>,
    /// The policies now in force.
    pub policies: super::policies::PoliciesView,
}

#[utoipa::path(post, path = "/v1/policies/reload", tag = "operations",
    security(("bearer" = [])),
    responses(
        Guarded,
        (status = 200, description = "Every policy file was valid and is in force; releases whose policy changed restart at their next call", body = ReloadView),
        (status = 422, description = "A policy file is missing or invalid: nothing changed", body = ErrorBody)))]
pub async fn reload_policies(State(st): State<AppState>) -> Result<Json<ReloadView>, ApiError> {
    let work = st.work()?;
    let st2 = st.clone();
    let done = tokio::task::spawn_blocking(move || {
        let _work = work;
        st2.reload_policies()
    })
    .await
    .map_err(|e| ApiError::Internal(format!("policy reload task: {e}")))?;
    match done {
        Ok(restarted) => Ok(Json(ReloadView {
            restarted: restarted.iter().map(|h| h.to_hex()).collect(),
            policies: st.releases.policies_view(),
        })),
        Err(e) => Err(ApiError::Unprocessable(format!("policies not reloaded, the previous ones stay: {e:#}"))),
    }
}
