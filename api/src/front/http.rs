//! The MCP front over Streamable HTTP: `POST /mcp` carries one JSON-RPC message and gets
//! a JSON response (or 202 for notifications); the server opens no stream of its own, so
//! `GET /mcp` is 405 as the transport allows. Calls run one at a time on a blocking thread
//! (copies of a call are sequential anyway, and the front holds one germline).
//!
//! A web page must not reach the tools (DNS rebinding, cross-origin `fetch`), so every
//! request passes the [`Guard`] first, as the transport's security warning asks: `Host`
//! must name the listen address (or a configured name), a present `Origin` must be
//! configured, an optional bearer token must match, the body must be JSON and the client
//! must accept JSON and SSE, and every message after `initialize` carries the
//! `Mcp-Session-Id` issued there.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{error, Front, INTERNAL_ERROR, INVALID_REQUEST};

const SESSION_HEADER: &str = "mcp-session-id";

/// Most sessions alive at once; `initialize` past it is refused until one is deleted.
const MAX_SESSIONS: usize = 256;

/// Who may talk to the front, beyond the listen address itself.
#[derive(Clone, Debug, Default)]
pub struct GuardConfig {
    /// Extra accepted `Host` names (with or without a port).
    pub allowed_hosts: Vec<String>,
    /// Accepted `Origin` values (`scheme://host[:port]`); a request without `Origin`
    /// (not a browser) is accepted.
    pub allowed_origins: Vec<String>,
    /// The bearer token every request must carry, if any.
    pub token: Option<String>,
}

/// The checks every request passes before it reaches the front.
struct Guard {
    hosts: BTreeSet<String>,
    origins: BTreeSet<String>,
    token: Option<[u8; 32]>,
    sessions: Mutex<BTreeSet<String>>,
    enforce: bool,
}

/// Why a request was turned away.
#[derive(Debug, PartialEq, Eq)]
struct Refusal(StatusCode, &'static str);

impl Guard {
    fn new(config: &GuardConfig, bound: SocketAddr) -> Guard {
        let mut hosts = BTreeSet::new();
        let port = bound.port();
        hosts.insert(bound.to_string());
        if bound.ip().is_loopback() {
            hosts.insert(format!("localhost:{port}"));
        }
        for h in &config.allowed_hosts {
            hosts.insert(h.to_ascii_lowercase());
        }
        Guard {
            hosts,
            origins: config.allowed_origins.iter().map(|o| o.trim_end_matches('/').to_ascii_lowercase()).collect(),
            token: config.token.as_deref().map(|t| Sha256::digest(t.as_bytes()).into()),
            sessions: Mutex::new(BTreeSet::new()),
            enforce: guard_enforced(),
        }
    }

    /// `Host`, `Origin` and the bearer token: checked on every method.
    fn check_caller(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if !self.enforce {
            return Ok(());
        }
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).map(str::to_ascii_lowercase);
        let host_ok = host.as_deref().is_some_and(|h| {
            let name = h.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map_or(h, |(n, _)| n);
            self.hosts.contains(h) || self.hosts.contains(name)
        });
        if !host_ok {
            return Err(Refusal(StatusCode::MISDIRECTED_REQUEST, "Host is not this server's address"));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let o = origin.to_str().unwrap_or("").trim_end_matches('/').to_ascii_lowercase();
            if !self.origins.contains(&o) {
                return Err(Refusal(StatusCode::FORBIDDEN, "Origin not allowed (see --allowed-origin)"));
            }
        }
        if let Some(want) = &self.token {
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|h| h.to_str().ok())
                .and_then(|h| h.strip_prefix("Bearer "))
                .map(|t| <[u8; 32]>::from(Sha256::digest(t.trim().as_bytes())));
            if !given.is_some_and(|g| bool::from(g.ct_eq(want))) {
                return Err(Refusal(StatusCode::UNAUTHORIZED, "missing or wrong bearer token"));
            }
        }
        Ok(())
    }

    /// A POST's media types: a JSON body, and a client that accepts JSON and SSE.
    fn check_media(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if !self.enforce {
            return Ok(());
        }
        let content_type = headers.get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or("");
        if media_types(content_type).next().as_deref() != Some("application/json") {
            return Err(Refusal(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json"));
        }
        let accept: Vec<String> =
            headers.get_all(header::ACCEPT).iter().filter_map(|h| h.to_str().ok()).flat_map(media_types).collect();
        if !(accept.iter().any(|a| a == "application/json") && accept.iter().any(|a| a == "text/event-stream")) {
            return Err(Refusal(StatusCode::NOT_ACCEPTABLE, "Accept must list application/json and text/event-stream"));
        }
        Ok(())
    }

    /// The session a request after `initialize` must name.
    fn check_session(&self, headers: &HeaderMap) -> Result<Option<String>, Refusal> {
        if !self.enforce {
            return Ok(None);
        }
        let Some(id) = headers.get(SESSION_HEADER).and_then(|h| h.to_str().ok()) else {
            return Err(Refusal(StatusCode::BAD_REQUEST, "Mcp-Session-Id missing: send initialize first"));
        };
        if !self.sessions.lock().unwrap_or_else(|p| p.into_inner()).contains(id) {
            return Err(Refusal(StatusCode::NOT_FOUND, "unknown or ended session: initialize again"));
        }
        Ok(Some(id.to_owned()))
    }

    fn new_session(&self) -> Result<String, Refusal> {
        let id =
            random_id().map_err(|_| Refusal(StatusCode::INTERNAL_SERVER_ERROR, "no randomness for a session id"))?;
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if sessions.len() >= MAX_SESSIONS {
            return Err(Refusal(StatusCode::SERVICE_UNAVAILABLE, "too many sessions: delete one first"));
        }
        sessions.insert(id.clone());
        Ok(id)
    }

    fn end_session(&self, id: &str) {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }
}

/// A fresh session id: 16 random bytes, hex.
pub(crate) fn random_id() -> std::io::Result<String> {
    let mut seed = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))?;
    Ok(hex::encode(seed))
}

/// The guard is always on in release builds; debug builds (tests) may turn it off with
/// `GERMLINE_TEST_FRONT_GUARD_OFF=1` to show what it stops.
fn guard_enforced() -> bool {
    if germline_executor::test_switch("GERMLINE_TEST_FRONT_GUARD_OFF") {
        tracing::warn!("GERMLINE_TEST_FRONT_GUARD_OFF=1: the HTTP front's guard is off (test builds only)");
        return false;
    }
    true
}

/// The media types of a header value, lower-case, parameters dropped.
fn media_types(h: &str) -> impl Iterator<Item = String> + '_ {
    h.split(',').map(|m| m.split(';').next().unwrap_or("").trim().to_ascii_lowercase()).filter(|m| !m.is_empty())
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, Json(error(Value::Null, INVALID_REQUEST, self.1))).into_response()
    }
}

#[derive(Clone)]
struct AppState {
    front: Arc<Mutex<Front>>,
    max: usize,
    guard: Arc<Guard>,
}

/// Everything a handler can answer, mapped to a response in one place.
enum Reply {
    Message(Value),
    Accepted,
    Error(StatusCode, Value),
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        match self {
            Reply::Accepted => StatusCode::ACCEPTED.into_response(),
            Reply::Message(v) => (StatusCode::OK, Json(v)).into_response(),
            Reply::Error(status, v) => (status, Json(v)).into_response(),
        }
    }
}

/// The address to listen on: an IP literal and port, on loopback unless
/// `non_loopback` says otherwise (names are not resolved).
pub fn listen_address(addr: &str, non_loopback: bool) -> anyhow::Result<SocketAddr> {
    let parsed: SocketAddr =
        addr.parse().with_context(|| format!("--listen {addr:?}: give an IP address and port, e.g. 127.0.0.1:8765"))?;
    if !parsed.ip().is_loopback() && !non_loopback {
        bail!("--listen {addr}: not a loopback address; a reachable front needs --listen-non-loopback (and a token)");
    }
    Ok(parsed)
}

/// Serves `front` on `addr` until the process is stopped.
pub fn serve(front: Front, addr: SocketAddr, config: GuardConfig) -> anyhow::Result<()> {
    let max = front.max_message_bytes();
    let front = Arc::new(Mutex::new(front));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let bound = listener.local_addr()?;
        let guard = Arc::new(Guard::new(&config, bound));
        let state = AppState { front, max, guard };
        let app = Router::new().route("/mcp", post(mcp_post).get(mcp_get).delete(mcp_delete)).with_state(state);
        eprintln!("germline: MCP front on http://{bound}/mcp");
        axum::serve(listener, app).with_graceful_shutdown(shutdown()).await?;
        Ok(())
    })
}

async fn shutdown() {
    let _ = tokio::signal::ctrl_c().await;
}

async fn mcp_post(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    if let Err(r) = st.guard.check_caller(&headers).and_then(|()| st.guard.check_media(&headers)) {
        return r.into_response();
    }
    let bytes = match to_bytes(body, st.max).await {
        Ok(b) => b,
        Err(_) => {
            let v = error(Value::Null, INVALID_REQUEST, &format!("message over {} bytes", st.max));
            return Reply::Error(StatusCode::PAYLOAD_TOO_LARGE, v).into_response();
        }
    };
    // `initialize` opens a session; everything else must name one.
    let initialize = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .is_some_and(|m| m.get("method").and_then(Value::as_str) == Some("initialize"));
    let session = if initialize {
        None
    } else {
        match st.guard.check_session(&headers) {
            Ok(s) => s,
            Err(r) => return r.into_response(),
        }
    };
    let front = st.front.clone();
    let key = session.clone().unwrap_or_default();
    let handled = tokio::task::spawn_blocking(move || {
        let mut f = front.lock().unwrap_or_else(|p| p.into_inner());
        f.handle_bytes(&key, &bytes)
    })
    .await;
    let opened = matches!(&handled, Ok(Some(v)) if initialize && v.get("result").is_some());
    let reply = match handled {
        Ok(Some(v)) if v.get("error").is_some() && v.get("id") == Some(&Value::Null) => {
            Reply::Error(StatusCode::BAD_REQUEST, v)
        }
        Ok(Some(v)) => Reply::Message(v),
        Ok(None) => Reply::Accepted,
        Err(e) => Reply::Error(StatusCode::INTERNAL_SERVER_ERROR, error(Value::Null, INTERNAL_ERROR, &e.to_string())),
    };
    let session = match (opened, session) {
        (true, _) => match st.guard.new_session() {
            Ok(id) => Some(id),
            Err(r) => return r.into_response(),
        },
        (false, s) => s,
    };
    let mut resp = reply.into_response();
    if let Some(h) = session.and_then(|s| HeaderValue::from_str(&s).ok()) {
        resp.headers_mut().insert(SESSION_HEADER, h);
    }
    // Witnesses and the dampening event after the answer: the next message waits for the
    // lock, so no call runs before the previous one is counted.
    let front = st.front.clone();
    tokio::task::spawn_blocking(move || front.lock().unwrap_or_else(|p| p.into_inner()).after_response());
    resp
}

async fn mcp_get(State(st): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(r) = st.guard.check_caller(&headers) {
        return r.into_response();
    }
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST, DELETE")],
        Json(json!({"error": "this server opens no SSE stream"})),
    )
        .into_response()
}

async fn mcp_delete(State(st): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(r) = st.guard.check_caller(&headers) {
        return r.into_response();
    }
    match st.guard.check_session(&headers) {
        Ok(Some(id)) => {
            st.guard.end_session(&id);
            st.front.lock().unwrap_or_else(|p| p.into_inner()).end_session(&id);
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(None) => StatusCode::NO_CONTENT.into_response(),
        Err(r) => r.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn guard(config: GuardConfig) -> Guard {
        let mut g = Guard::new(&config, "127.0.0.1:8765".parse().unwrap());
        g.enforce = true;
        g
    }

    #[test]
    fn host_origin_and_token() {
        let g = guard(GuardConfig {
            allowed_hosts: vec!["mcp.internal".into()],
            allowed_origins: vec!["https://app.example".into()],
            token: Some("s3cret".into()),
        });
        let auth = ("authorization", "Bearer s3cret");
        for host in ["127.0.0.1:8765", "localhost:8765", "mcp.internal", "mcp.internal:9000"] {
            assert_eq!(g.check_caller(&headers(&[("host", host), auth])), Ok(()), "{host}");
        }
        for host in ["attacker.example:8765", "127.0.0.1:1", "127.0.0.1"] {
            assert_eq!(
                g.check_caller(&headers(&[("host", host), auth])).unwrap_err().0,
                StatusCode::MISDIRECTED_REQUEST
            );
        }
        let ok = ("host", "127.0.0.1:8765");
        assert_eq!(g.check_caller(&headers(&[ok, auth, ("origin", "https://app.example")])), Ok(()));
        for origin in ["http://attacker.example", "null", "https://app.example.attacker.example"] {
            assert_eq!(g.check_caller(&headers(&[ok, auth, ("origin", origin)])).unwrap_err().0, StatusCode::FORBIDDEN);
        }
        for bad in [None, Some("Bearer wrong"), Some("s3cret"), Some("Bearer s3cret2")] {
            let mut h = headers(&[ok]);
            if let Some(b) = bad {
                h.insert(header::AUTHORIZATION, HeaderValue::from_str(b).unwrap());
            }
            assert_eq!(g.check_caller(&h).unwrap_err().0, StatusCode::UNAUTHORIZED, "{bad:?}");
        }
    }

    #[test]
    fn media_and_sessions() {
        let g = guard(GuardConfig::default());
        let both = ("accept", "application/json, text/event-stream");
        assert_eq!(g.check_media(&headers(&[("content-type", "application/json; charset=utf-8"), both])), Ok(()));
        let e = g.check_media(&headers(&[("content-type", "text/plain"), both])).unwrap_err();
        assert_eq!(e.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let e = g.check_media(&headers(&[("content-type", "application/json"), ("accept", "application/json")]));
        assert_eq!(e.unwrap_err().0, StatusCode::NOT_ACCEPTABLE);
        assert_eq!(g.check_session(&headers(&[])).unwrap_err().0, StatusCode::BAD_REQUEST);
        assert_eq!(g.check_session(&headers(&[(SESSION_HEADER, "nope")])).unwrap_err().0, StatusCode::NOT_FOUND);
        let id = g.new_session().unwrap();
        assert_eq!(g.check_session(&headers(&[(SESSION_HEADER, &id)])), Ok(Some(id.clone())));
        g.end_session(&id);
        assert_eq!(g.check_session(&headers(&[(SESSION_HEADER, &id)])).unwrap_err().0, StatusCode::NOT_FOUND);
    }

    #[test]
    fn listens_on_loopback_unless_told() {
        assert!(listen_address("127.0.0.1:0", false).is_ok());
        assert!(listen_address("[::1]:0", false).is_ok());
        assert!(listen_address("0.0.0.0:0", false).is_err());
        assert!(listen_address("0.0.0.0:0", true).is_ok());
        assert!(listen_address("localhost:80", true).is_err());
    }
}
