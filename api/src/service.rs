//! `germline serve`: the HTTP API service of one host. It admits releases (TUF or
//! Sigstore), runs calls and scripted sessions on their germlines under dampening, and
//! serves the ledger (checkpoints, entries, proofs), witnesses, dampening state, health,
//! readiness, Prometheus metrics and its own OpenAPI document.
//!
//! The service owns the only handle on the embedded ledger ([`Ledger`] behind an `Arc`),
//! shared by every release's [`Host`](germline_host::Host). Router and state are built
//! in one place, [`app`], so other route sets (the fleet's public log) can be merged.

mod auth;
pub mod config;
pub(crate) mod error;
mod formations;
mod metrics;
pub mod policies;
mod releases;
mod routes;
pub mod trust;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use germline_executor::germline::PythonRuntime;
use germline_ledger::Ledger;

pub use config::{ServeArgs, ServiceConfig};
use error::ApiError;
pub use metrics::Metrics;
use releases::{Releases, StartParams};

/// Everything the handlers share.
pub struct Shared {
    /// Resolved configuration.
    pub config: ServiceConfig,
    /// The one ledger handle of this process.
    pub ledger: Arc<Ledger>,
    /// Admitted releases and their germlines.
    pub releases: Arc<Releases>,
    /// Formation-consistent dispatch over those releases (DESIGN §8).
    pub formations: germline_executor::dispatch::FormationHost,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    tokens: auth::Tokens,
    in_flight: InFlight,
    ready: AtomicBool,
    admission: tokio::sync::Mutex<()>,
    mcp_sessions: formations::McpSessions,
}

/// The handlers' state: cheap to clone.
#[derive(Clone)]
pub struct AppState(pub Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// Counts work that must finish before the ledger closes (calls and the witness
/// verification after them, admissions); refuses new work once shutdown began.
#[derive(Default)]
struct InFlight {
    count: AtomicUsize,
    closed: AtomicBool,
}

/// One unit of in-flight work, movable onto blocking threads; dropping it ends it.
pub struct WorkGuard(AppState);

impl Drop for WorkGuard {
    fn drop(&mut self) {
        self.0.in_flight.count.fetch_sub(1, Ordering::SeqCst);
    }
}

impl InFlight {
    fn enter(&self) -> bool {
        self.count.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.count.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Refuses new work, then waits (bounded) for running work; true when none is left.
    async fn close_and_wait(&self, grace: Duration) -> bool {
        self.closed.store(true, Ordering::SeqCst);
        let end = Instant::now() + grace;
        loop {
            if self.count.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl AppState {
    /// Reads the configured policy files again; if all are valid, swaps them in and stops
    /// the germline of each release whose policy changed (it restarts at its next call).
    /// Returns those releases. Blocks (waits for their running calls).
    pub fn reload_policies(&self) -> anyhow::Result<Vec<germline_model::ReleaseHash>> {
        let c = &self.config;
        let set = policies::PolicySet::load(c.policy.as_deref(), &c.policies, c.pool)?;
        Ok(self.releases.reload(set))
    }

    /// Starts a unit of work, or 503 once shutdown began.
    fn work(&self) -> Result<WorkGuard, ApiError> {
        if self.in_flight.enter() {
            Ok(WorkGuard(self.clone()))
        } else {
            Err(ApiError::Unavailable("the service is shutting down".into()))
        }
    }
}

/// Builds the shared state: opens the ledger (the process's only handle), the release
/// store, the policy and the tokens (generating `<data-dir>/api-token` on first start).
pub fn state(config: ServiceConfig) -> anyhow::Result<AppState> {
    std::fs::create_dir_all(&config.data_dir).with_context(|| format!("creating {}", config.data_dir.display()))?;
    let ledger = germline_host::open_ledger_as(&config.data_dir, config.fleet.origin.clone())?;
    let policies = policies::PolicySet::load(config.policy.as_deref(), &config.policies, config.pool)?;
    let python = PythonRuntime::discover(&germline_host::home()).context("finding the Python tool host")?;
    let metrics = Arc::new(Metrics::new());
    let python_for_profiles = python.clone();
    let params = StartParams {
        runtime: config.runtime(),
        policies: Arc::new(std::sync::RwLock::new(policies)),
        python,
        ledger: ledger.clone(),
        data_dir: config.data_dir.clone(),
        metrics: metrics.clone(),
    };
    let releases = Arc::new(Releases::open(&config.store_dir, params)?);
    let formations = formations::host(
        ledger.clone(),
        releases.clone(),
        python_for_profiles,
        config.dispatch_policy,
        &config.data_dir,
    )
    .context("replaying formations and release lifecycles from the ledger")?;
    let (tokens, source) = auth::Tokens::load(config.tokens_file.as_deref(), &config.data_dir)?;
    match &source {
        auth::TokenSource::Generated(p) => {
            tracing::warn!(token_file = %p.display(), "generated an API token for the mutating endpoints");
            eprintln!("germline: API token generated in {} (send it as `Authorization: Bearer TOKEN`)", p.display());
        }
        auth::TokenSource::Existing(p) => eprintln!("germline: API token in {}", p.display()),
        auth::TokenSource::File(p) => eprintln!("germline: API token hashes from {}", p.display()),
    }
    Ok(AppState(Arc::new(Shared {
        config,
        ledger,
        releases,
        formations,
        metrics,
        tokens,
        in_flight: InFlight::default(),
        ready: AtomicBool::new(false),
        admission: tokio::sync::Mutex::new(()),
        mcp_sessions: formations::McpSessions::default(),
    })))
}

/// The service's router over `state`. Other route sets (e.g. the fleet's public log)
/// can be `.merge()`d onto it.
pub fn app(state: AppState) -> Router {
    let c = &state.config;
    let auth = middleware::from_fn_with_state(state.clone(), require_token);
    let admission = Router::new()
        .route("/v1/releases/tuf", post(routes::admit_tuf))
        .route("/v1/releases/sigstore", post(routes::admit_sigstore))
        .layer(DefaultBodyLimit::max(c.admission_body_limit_bytes))
        .route_layer(auth.clone());
    let mutating = Router::new()
        .route("/v1/releases/{hash}/calls", post(routes::call))
        .route("/v1/releases/{hash}/sessions", post(routes::session))
        .route("/v1/ledger/checkpoints", post(routes::sign_checkpoint))
        .route("/v1/formations", post(formations::form))
        .route("/v1/formations/{id}/dispatch", post(formations::dispatch))
        .route("/v1/releases/{hash}/lifecycle", post(formations::lifecycle))
        .route("/v1/policies/reload", post(routes::reload_policies))
        .layer(DefaultBodyLimit::max(c.body_limit_bytes))
        .route_layer(auth.clone());
    // The agent hosts' MCP endpoints (`germline wrap --service` relays to them): the
    // token, and the Host and Origin checks a Streamable HTTP server needs against web
    // pages (DNS rebinding, cross-origin requests).
    let mcp = Router::new()
        .route("/mcp/{name}", post(formations::mcp))
        .route("/v1/mcp/{name}", post(formations::mcp))
        .layer(DefaultBodyLimit::max(c.body_limit_bytes))
        .route_layer(auth.clone())
        .route_layer(middleware::from_fn_with_state(state.clone(), mcp_guard));
    let mut reads = Router::new()
        .route("/v1/releases", get(routes::list_releases))
        .route("/v1/releases/{hash}", get(routes::get_release))
        .route("/v1/releases/{hash}/witnesses", get(routes::witnesses))
        .route("/v1/releases/{hash}/dampening", get(routes::dampening))
        .route("/v1/policies", get(routes::policies))
        .route("/v1/ledger/checkpoint", get(routes::checkpoint))
        .route("/v1/ledger/entries", get(routes::entries))
        .route("/v1/ledger/entries/{index}", get(routes::entry))
        .route("/v1/ledger/proofs/inclusion", get(routes::inclusion))
        .route("/v1/ledger/proofs/consistency", get(routes::consistency))
        .route("/metrics", get(routes::metrics))
        .route("/openapi.json", get(routes::openapi));
    if c.read_requires_token {
        reads = reads.route_layer(auth);
    }
    Router::new()
        .route("/healthz", get(routes::healthz))
        .route("/readyz", get(routes::readyz))
        .merge(reads)
        .merge(mutating)
        .merge(mcp)
        .merge(admission)
        .fallback(|| async { ApiError::NotFound("no such endpoint".into()) })
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            ApiError::Internal("a request handler panicked".into()).into_response()
        }))
        .with_state(state)
}

/// The MCP endpoints' `Host` and `Origin` checks: `Host` names the listen address (any IP
/// literal when it listens on all addresses, `localhost` on loopback) or a configured name;
/// a present `Origin` must be configured.
async fn mcp_guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let c = &st.config;
    let host = req.headers().get(axum::http::header::HOST).and_then(|h| h.to_str().ok()).map(str::to_ascii_lowercase);
    let host_ok = host.as_deref().is_some_and(|h| {
        let name = match h.rsplit_once(':') {
            Some((n, p)) if p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => h,
        };
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        let ip = bare.parse::<std::net::IpAddr>().ok();
        let listen = c.listen.ip();
        ip == Some(listen)
            || (listen.is_unspecified() && ip.is_some())
            || (listen.is_loopback() && (bare == "localhost" || ip.is_some_and(|i| i.is_loopback())))
            || c.mcp_allowed_hosts.iter().any(|a| a == h || a == name)
    });
    if !host_ok {
        return ApiError::Forbidden("Host is not this service's address (see mcp_allowed_hosts)".into())
            .into_response();
    }
    if let Some(origin) = req.headers().get(axum::http::header::ORIGIN) {
        let o = origin.to_str().unwrap_or("").trim_end_matches('/').to_ascii_lowercase();
        if !c.mcp_allowed_origins.contains(&o) {
            return ApiError::Forbidden("Origin not allowed (see mcp_allowed_origins)".into()).into_response();
        }
    }
    next.run(req).await
}

async fn require_token(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let Some(header) = req.headers().get(AUTHORIZATION) else {
        return ApiError::Unauthorized("this endpoint needs `Authorization: Bearer TOKEN`").into_response();
    };
    let matched = header.to_str().ok().and_then(auth::bearer).and_then(|t| st.tokens.check(t)).map(str::to_owned);
    match matched {
        Some(name) => {
            tracing::debug!(token = %name, path = %req.uri().path(), "authenticated");
            next.run(req).await
        }
        None => ApiError::Unauthorized("invalid bearer token").into_response(),
    }
}

/// Starts every admitted release's germline in the background, then declares readiness.
fn start_admitted(state: AppState) {
    tokio::task::spawn_blocking(move || {
        for slot in state.releases.all() {
            if state.in_flight.closed.load(Ordering::SeqCst) {
                return;
            }
            if let Err(why) = state.releases.ensure_started(&slot) {
                tracing::warn!(release = %slot.hash, "{why}");
            }
        }
        state.ready.store(true, Ordering::SeqCst);
        tracing::info!("ready: {} admitted release(s)", state.releases.all().len());
    });
}

/// SIGHUP reloads the policies, as `POST /v1/policies/reload` does (logged either way).
fn reload_on_sighup(state: AppState) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot watch SIGHUP (reload policies over the API instead): {e}");
            return;
        }
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let st = state.clone();
            let done = tokio::task::spawn_blocking(move || st.reload_policies()).await;
            match done {
                Ok(Ok(restarted)) => tracing::info!(restarted = restarted.len(), "SIGHUP: policies reloaded"),
                Ok(Err(e)) => tracing::error!("SIGHUP: policies not reloaded, the previous ones stay: {e:#}"),
                Err(e) => tracing::error!("SIGHUP: policy reload task: {e}"),
            }
        }
    });
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot watch SIGTERM: {e}");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = term => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}

/// `germline serve`: serves until SIGTERM or SIGINT, then stops accepting, lets in-flight
/// calls (and their witness verification) finish within the grace period, stops the
/// germlines and closes the ledger.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = ServiceConfig::resolve(&args, |k| std::env::var(k).ok())?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let grace = config.shutdown_grace;
    let state = rt.block_on(async { state(config) })?;
    let served = rt.block_on(serve(state.clone()));
    let t0 = std::time::Instant::now();
    let drained = rt.block_on(state.in_flight.close_and_wait(grace));
    if !drained {
        tracing::warn!(
            "shutdown grace period over with calls still running; their ledger entries are durable when written"
        );
    }
    // Trigger verifications run off the calls: what is left of the grace period is theirs.
    state.releases.stop_all(grace.saturating_sub(t0.elapsed()));
    rt.shutdown_timeout(Duration::from_secs(2));
    // The last handle closes the ledger (its writer thread finishes queued appends).
    match Arc::try_unwrap(state.0) {
        Ok(shared) => drop(shared),
        Err(_) => tracing::warn!("work still holds the ledger at exit; every acknowledged append is durable"),
    }
    eprintln!("germline: stopped");
    served
}

async fn serve(state: AppState) -> anyhow::Result<()> {
    let addr = state.config.listen;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    eprintln!("germline: serving the API on http://{local}");
    tracing::info!(%local, data_dir = %state.config.data_dir.display(), "listening");
    start_admitted(state.clone());
    trust::start_following(&state);
    reload_on_sighup(state.clone());
    // The fleet: this host's log as C2SP tiles, `/lookup`, the witness endpoint and the
    // peer mirror, on the same ledger.
    let (fleet_routes, fleet) = crate::fleet::start(state.ledger.clone(), &state.config.data_dir, &state.config.fleet)?;
    let app = app(state.clone()).merge(fleet_routes);
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let st = state.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown_signal().await;
        st.ready.store(false, Ordering::SeqCst);
        let _ = stop_tx.send(true);
    });
    let grace = state.config.shutdown_grace;
    let bounded = async move {
        let _ = stop_rx.wait_for(|s| *s).await;
        tokio::time::sleep(grace).await;
    };
    let served = tokio::select! {
        r = server => r.context("serving"),
        _ = bounded => {
            tracing::warn!("connections still open after the grace period; closing them");
            Ok(())
        }
    };
    tokio::task::spawn_blocking(move || fleet.stop()).await.context("stopping the fleet")?;
    served
}
