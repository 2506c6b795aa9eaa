//! `germline wrap --service URL --release NAME`: the stdio MCP server an agent host
//! launches, relaying each message to the MCP endpoint of a `germline serve` on this
//! machine (`/mcp/NAME`). The bridge holds no ledger and runs no release: dampening,
//! witnesses and fleet suppressions are the service's, so every agent host wrapping a
//! release this way shares them.
//!
//! One message at a time: a line of JSON-RPC on stdin goes to the service with the API
//! token and the session `initialize` opened; the service's answer is one line on stdout.
//! A service that cannot be reached, or answers with an HTTP error, becomes a JSON-RPC
//! error for the request (notifications get no answer), so the agent host sees why.

use std::io::{BufRead, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::{INTERNAL_ERROR, PARSE_ERROR};

/// The longest answer relayed (the service's own message limit is lower).
const MAX_ANSWER: u64 = 64 << 20;

/// The endpoint of `name` on `service`, which must be a loopback `http://` URL: the token
/// goes in the clear.
pub fn endpoint(service: &str, name: &str) -> anyhow::Result<String> {
    let rest = service.strip_prefix("http://").with_context(|| {
        format!("--service {service}: give the service's loopback URL, http://127.0.0.1:PORT (the token is sent in the clear)")
    })?;
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() => h,
        _ => authority,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        bail!("--service {service}: only a service on this machine (a loopback address) is accepted, as the token is sent in the clear");
    }
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)) {
        bail!("--release {name:?}: a release name is [a-z0-9._-]+");
    }
    Ok(format!("http://{authority}/mcp/{name}"))
}

/// Relays stdin to the service until stdin closes.
pub fn run(service: &str, name: &str, token: &str) -> anyhow::Result<()> {
    let url = endpoint(service, name)?;
    if token.is_empty() {
        bail!("the service's API token is empty");
    }
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        // A call may run as long as the service lets it (its own deadline answers first).
        .timeout_read(Duration::from_secs(3600))
        .build();
    let auth = format!("Bearer {token}");
    let mut session: Option<String> = None;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let msg: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                answer(&mut out, &error(&Value::Null, PARSE_ERROR, &format!("not JSON: {e}")))?;
                continue;
            }
        };
        let id = msg.get("id").cloned().filter(|_| msg.get("method").is_some());
        let initialize = msg.get("method").and_then(Value::as_str) == Some("initialize");
        let mut req = agent
            .post(&url)
            .set("Authorization", &auth)
            .set("Content-Type", "application/json")
            .set("Accept", "application/json, text/event-stream");
        if let (Some(s), false) = (&session, initialize) {
            req = req.set("Mcp-Session-Id", s);
        }
        let reply = match req.send_string(&line) {
            Ok(resp) => {
                if initialize {
                    session = resp.header("mcp-session-id").map(str::to_owned);
                }
                if resp.status() == 202 {
                    continue;
                }
                let mut body = String::new();
                use std::io::Read;
                resp.into_reader()
                    .take(MAX_ANSWER)
                    .read_to_string(&mut body)
                    .context("reading the service's answer")?;
                match serde_json::from_str::<Value>(&body) {
                    Ok(v) => v,
                    Err(_) => match &id {
                        Some(id) => error(id, INTERNAL_ERROR, "the service's answer is not JSON"),
                        None => continue,
                    },
                }
            }
            Err(ureq::Error::Status(code, resp)) => {
                let text = resp.into_string().unwrap_or_default();
                let why = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or(text);
                match &id {
                    Some(id) => error(id, INTERNAL_ERROR, &format!("the service answered {code}: {why}")),
                    None => continue,
                }
            }
            Err(e) => match &id {
                Some(id) => error(id, INTERNAL_ERROR, &format!("the service at {service} cannot be reached: {e}")),
                None => continue,
            },
        };
        answer(&mut out, &reply)?;
    }
    Ok(())
}

fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn answer(out: &mut impl Write, v: &Value) -> anyhow::Result<()> {
    let mut line = serde_json::to_vec(v)?;
    line.push(b'\n');
    out.write_all(&line).and_then(|()| out.flush()).context("writing stdout")
}

#[cfg(test)]
mod tests {
    use super::endpoint;

    #[test]
    fn only_a_loopback_service_gets_the_token() {
        assert_eq!(endpoint("http://127.0.0.1:8420", "mixer").unwrap(), "http://127.0.0.1:8420/mcp/mixer");
        assert_eq!(endpoint("http://localhost:9/", "a.b-c").unwrap(), "http://localhost:9/mcp/a.b-c");
        assert_eq!(endpoint("http://[::1]:9", "x").unwrap(), "http://[::1]:9/mcp/x");
        for bad in ["https://127.0.0.1:1", "http://10.0.0.1:8420", "http://example.com", "127.0.0.1:8420"] {
            assert!(endpoint(bad, "x").is_err(), "{bad}");
        }
        assert!(endpoint("http://127.0.0.1:1", "../x").is_err());
    }
}
