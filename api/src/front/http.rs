//! The MCP front over Streamable HTTP: `POST /mcp` carries one JSON-RPC message and gets
//! a JSON response (or 202 for notifications); the server opens no stream of its own, so
//! `GET /mcp` is 405 as the transport allows. Calls run one at a time on a blocking thread
//! (copies of a call are sequential anyway, and the front holds one germline).

use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::{error, Front, INTERNAL_ERROR, INVALID_REQUEST};

const SESSION_HEADER: &str = "mcp-session-id";

#[derive(Clone)]
struct AppState {
    front: Arc<Mutex<Front>>,
    max: usize,
    session: String,
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

/// Serves `front` on `addr` until the process is stopped.
pub fn serve(front: Front, addr: &str) -> anyhow::Result<()> {
    let max = front.max_message_bytes();
    let mut seed = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))
        .context("session id")?;
    let session: String = seed.iter().map(|b| format!("{b:02x}")).collect();
    let state = AppState { front: Arc::new(Mutex::new(front)), max, session };
    let app = Router::new().route("/mcp", post(mcp_post).get(mcp_get).delete(mcp_delete)).with_state(state);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        eprintln!("germline: MCP front on http://{}/mcp", listener.local_addr()?);
        axum::serve(listener, app).with_graceful_shutdown(shutdown()).await?;
        Ok(())
    })
}

async fn shutdown() {
    let _ = tokio::signal::ctrl_c().await;
}

async fn mcp_post(State(st): State<AppState>, body: Body) -> Response {
    let bytes = match to_bytes(body, st.max).await {
        Ok(b) => b,
        Err(_) => {
            let v = error(Value::Null, INVALID_REQUEST, &format!("message over {} bytes", st.max));
            return Reply::Error(StatusCode::PAYLOAD_TOO_LARGE, v).into_response();
        }
    };
    let front = st.front.clone();
    let handled = tokio::task::spawn_blocking(move || {
        let mut f = front.lock().unwrap_or_else(|p| p.into_inner());
        f.handle_bytes(&bytes)
    })
    .await;
    let reply = match handled {
        Ok(Some(v)) if v.get("error").is_some() && v.get("id") == Some(&Value::Null) => {
            Reply::Error(StatusCode::BAD_REQUEST, v)
        }
        Ok(Some(v)) => Reply::Message(v),
        Ok(None) => Reply::Accepted,
        Err(e) => Reply::Error(StatusCode::INTERNAL_SERVER_ERROR, error(Value::Null, INTERNAL_ERROR, &e.to_string())),
    };
    let mut resp = reply.into_response();
    if let Ok(h) = HeaderValue::from_str(&st.session) {
        resp.headers_mut().insert(SESSION_HEADER, h);
    }
    // Witnesses and the dampening event after the answer: the next message waits for the
    // lock, so no call runs before the previous one is counted.
    let front = st.front.clone();
    tokio::task::spawn_blocking(move || front.lock().unwrap_or_else(|p| p.into_inner()).after_response());
    resp
}

async fn mcp_get() -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, Json(json!({"error": "this server opens no SSE stream"}))).into_response()
}

async fn mcp_delete() -> StatusCode {
    StatusCode::NO_CONTENT
}
