//! The MCP front: `germline wrap`, an MCP server that an agent host launches (stdio) or
//! reaches (Streamable HTTP, `--listen`) instead of the real one. `tools/list` comes
//! from a data-free copy, every `tools/call` is a germline call whose result carries its
//! output label in `_meta`, and the rest of what clients expect (initialize, ping,
//! logging, notifications, JSON-RPC errors) is answered here without touching the release.
//!
//! [`Front`] is sans-I/O: one JSON-RPC message in, at most one out. The stdio loop and the
//! HTTP handlers in [`http`] are thin shells around it.

pub mod http;

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use germline_executor::call::{attach_label, CallOutcome, CallRequest, LABEL_META_KEY};
use germline_executor::germline::PythonRuntime;
use germline_executor::manifest::{Manifest, MANIFEST_FILE};
use germline_executor::policy::Policy;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_model::{Clearance, ConsumerName, Label};
use serde_json::{json, Map, Value};

/// Protocol versions the front speaks; a client asking for another gets the newest.
const PROTOCOL_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// Without `--policy`, nothing is labelled and the agent is the only consumer: calls still
/// run in fresh copies (no cross-call carry-over), egress to undeclared hosts is denied.
const DEFAULT_POLICY: &str = "tags = []\n[consumers.agent]\nclearance = []\n";

/// JSON-RPC error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;

/// `germline wrap`.
#[derive(Args, Debug)]
pub struct WrapArgs {
    /// The deployer's policy (labels, clearances); default: nothing labelled.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// `germline` (default), `nosplit` or `sig-pin`.
    #[arg(long, default_value = "germline")]
    pub runtime: RuntimeKind,
    /// Ready copies kept per germline (default: the policy's `[limits] pool`, else 2);
    /// 0 forks the copies of each call as it comes.
    #[arg(long)]
    pub pool: Option<usize>,
    /// Serve Streamable HTTP on this address (IP and port; path `/mcp`) instead of stdio.
    #[arg(long)]
    pub listen: Option<String>,
    /// Allow `--listen` on an address other than loopback.
    #[arg(long)]
    pub listen_non_loopback: bool,
    /// A `Host` name the HTTP front also answers to (repeatable; the listen address always).
    #[arg(long = "allowed-host")]
    pub allowed_hosts: Vec<String>,
    /// A browser `Origin` allowed to call the HTTP front (repeatable; none by default).
    #[arg(long = "allowed-origin")]
    pub allowed_origins: Vec<String>,
    /// A file holding the bearer token the HTTP front requires (or set GERMLINE_FRONT_TOKEN).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The consumer the results go to.
    #[arg(long, default_value = "agent")]
    pub consumer: String,
    /// A release directory (with `germline.toml`). Commands are not wrapped yet: an
    /// unsigned command has no manifest to declare its destinations.
    #[arg(last = true, required = true)]
    pub target: Vec<String>,
}

/// One wrapped release and the MCP session state around it.
pub struct Front {
    host: crate::exec_cmd::Host,
    /// The last call, whose triggers are verified into witnesses once its answer is out.
    pending: Option<(CallRequest, CallOutcome)>,
    manifest: Manifest,
    consumer: String,
    clearance: Clearance,
    tools: Option<(Value, Label)>,
    max_message_bytes: usize,
}

impl Front {
    /// Starts the release under `kind`. Germline runtimes use the ledger under the data
    /// directory (`GERMLINE_DATA_DIR`): a suppressed release (by dampening or by a peer's
    /// witness) is refused, and triggers become witnesses there, as for `germline call`.
    pub fn start(release: &Path, policy: Policy, kind: RuntimeKind, consumer: String) -> anyhow::Result<Front> {
        let manifest = Manifest::load(release)?;
        let clearance = policy.consumer_clearance(&ConsumerName::new(&consumer)?)?;
        let python = PythonRuntime::discover(&crate::exec_cmd::home()).context("finding the Python tool host")?;
        let max_message_bytes = policy.limits.max_message_bytes;
        let mut runtime = Runtime::start(kind, release, policy, python)?;
        let data_dir = crate::exec_cmd::data_dir();
        runtime.set_trigger_log(data_dir.join("triggers.jsonl"));
        let ledger = match &mut runtime {
            Runtime::Germline(g) => {
                g.release = crate::exec_cmd::release_id(release)?;
                Some(crate::exec_cmd::open_ledger(&data_dir)?)
            }
            _ => None,
        };
        let host = crate::exec_cmd::Host::new(runtime, ledger, data_dir);
        Ok(Front { host, pending: None, manifest, consumer, clearance, tools: None, max_message_bytes })
    }

    /// Verifies the last call's triggers into witnesses and counts its event (dampening);
    /// the transports call this once the call's answer is sent. Failures are logged: the
    /// answer is out, and the trigger itself is already in the trigger log.
    pub fn after_response(&mut self) {
        if let Some((req, outcome)) = self.pending.take() {
            if let Err(e) = self.host.after_call(&req, &outcome) {
                tracing::error!("recording the call's witnesses and event: {e:#}");
            }
        }
    }

    /// Largest client message accepted.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Handles one raw client message; `None` when nothing is to be sent back
    /// (notifications, responses).
    pub fn handle_bytes(&mut self, raw: &[u8]) -> Option<Value> {
        if raw.len() > self.max_message_bytes {
            return Some(error(
                Value::Null,
                INVALID_REQUEST,
                &format!("message over {} bytes", self.max_message_bytes),
            ));
        }
        match serde_json::from_slice::<Value>(raw) {
            Ok(msg) => self.handle(msg),
            Err(e) => Some(error(Value::Null, PARSE_ERROR, &format!("parse error: {e}"))),
        }
    }

    /// Handles one parsed client message.
    pub fn handle(&mut self, msg: Value) -> Option<Value> {
        // A transport that never reported its answer sent still gets the work done.
        self.after_response();
        let Value::Object(msg) = msg else {
            return Some(error(Value::Null, INVALID_REQUEST, "expected one JSON-RPC object (no batches)"));
        };
        let id = msg.get("id").cloned();
        let Some(method) = msg.get("method").and_then(Value::as_str) else {
            // A response to a server request (we send none) or garbage.
            return id.map(|id| error(id, INVALID_REQUEST, "expected a request"));
        };
        let Some(id) = id else {
            // Notifications: initialized, cancelled, roots changed... nothing to answer.
            return None;
        };
        if !(id.is_string() || id.is_number()) {
            return Some(error(Value::Null, INVALID_REQUEST, "id must be a string or a number"));
        }
        let params = msg.get("params").cloned().unwrap_or_else(|| json!({}));
        let (answer, label) = self.request(method, &params);
        Some(match answer {
            Ok(mut result) => {
                attach_label(&mut result, &label);
                json!({"jsonrpc": "2.0", "id": id, "result": result})
            }
            Err((code, message)) => labelled_error(id, code, &message, &label),
        })
    }

    /// The answer to one request and its label: the call's for `tools/call`, empty for what
    /// the front answers itself or from a data-free copy. An answer whose label the
    /// consumer's clearance does not cover is replaced by an error that names nothing.
    fn request(&mut self, method: &str, params: &Value) -> (Result<Value, (i64, String)>, Label) {
        let (answer, label) = match method {
            "tools/call" => self.tools_call(params),
            "tools/list" => self.tools_list(),
            _ => return (self.request_data_free(method, params), Label::empty()),
        };
        if labels_enforced() && !label.flows_to(&self.clearance) {
            return (Err((INTERNAL_ERROR, WITHHELD.to_owned())), Label::empty());
        }
        (answer, label)
    }

    fn request_data_free(&mut self, method: &str, params: &Value) -> Result<Value, (i64, String)> {
        match method {
            "initialize" => {
                let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or("");
                let version = PROTOCOL_VERSIONS.iter().find(|v| **v == asked).unwrap_or(&PROTOCOL_VERSIONS[0]);
                Ok(json!({
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": false}, "logging": {}},
                    "serverInfo": {"name": self.manifest.name, "version": self.manifest.version},
                    "instructions": "Tool calls run under germline: each result carries its output label in _meta[\"dev.germline/label\"]."
                }))
            }
            "ping" | "logging/setLevel" => Ok(json!({})),
            "resources/list" => Ok(json!({"resources": []})),
            "resources/templates/list" => Ok(json!({"resourceTemplates": []})),
            "prompts/list" => Ok(json!({"prompts": []})),
            _ => Err((METHOD_NOT_FOUND, format!("Method not found: {method}"))),
        }
    }

    /// `tools/list` from a data-free copy (germline), or, for a server that needs its
    /// start-up data, from a copy holding it, with that data's label; a baseline's list
    /// comes from a process that may hold data, so it is refused rather than labelled
    /// data-free.
    fn tools_list(&mut self) -> (Result<Value, (i64, String)>, Label) {
        if !matches!(self.host.rt, Runtime::Germline(_)) && labels_enforced() {
            return (
                Err((INTERNAL_ERROR, "tools/list: this runtime has no data-free copy to list tools".into())),
                Label::empty(),
            );
        }
        if self.tools.is_none() {
            match self.host.rt.list_tools_labelled() {
                Ok(listed) => self.tools = Some(listed),
                Err(e) => return (Err((INTERNAL_ERROR, format!("tools/list: {e}"))), Label::empty()),
            }
        }
        match self.tools.clone() {
            Some((tools, label)) => (Ok(tools), label),
            None => (Ok(json!({"tools": []})), Label::empty()),
        }
    }

    fn tools_call(&mut self, params: &Value) -> (Result<Value, (i64, String)>, Label) {
        let Some(name) = params.get("name").and_then(Value::as_str) else {
            return (Err((INVALID_PARAMS, "tools/call needs a tool name".into())), Label::empty());
        };
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => return (Err((INVALID_PARAMS, "arguments must be an object".into())), Label::empty()),
        };
        let req =
            CallRequest { tool: name.to_owned(), arguments, items: Vec::new(), consumers: vec![self.consumer.clone()] };
        let outcome = match self.host.call(&req) {
            Ok(o) => o,
            Err(e) => return (Err((INTERNAL_ERROR, format!("{e:#}"))), Label::empty()),
        };
        let label = outcome.label.clone().unwrap_or_default();
        let answer = match (&outcome.result, &outcome.error) {
            (Some(result), _) => Ok(result.clone()),
            (None, Some(e)) => Err(tool_error(e)),
            (None, None) => Err((INTERNAL_ERROR, "the call produced no result".into())),
        };
        self.pending = Some((req, outcome));
        (answer, label)
    }
}

/// Recovers the server's own JSON-RPC error (code and message) from a failed call, so a
/// client sees what the bare server would have said; anything else is an internal error.
fn tool_error(e: &str) -> (i64, String) {
    if let Some((_, rest)) = e.split_once("tool error: ") {
        if let Ok(v) = serde_json::from_str::<Value>(rest) {
            if let (Some(code), Some(message)) = (v.get("code").and_then(Value::as_i64), v.get("message")) {
                return (code, message.as_str().map(str::to_owned).unwrap_or_else(|| message.to_string()));
            }
        }
    }
    (INTERNAL_ERROR, e.to_owned())
}

/// What a consumer gets instead of an answer its clearance does not cover.
const WITHHELD: &str = "the tool's answer is withheld: its label is not covered by this consumer's clearance";

/// Whether answers carry labels and are held to the consumer's clearance: always in
/// release builds; debug builds (tests) may turn it off with
/// `GERMLINE_TEST_FRONT_LABELS_OFF=1` to show what it stops.
fn labels_enforced() -> bool {
    #[cfg(debug_assertions)]
    if std::env::var_os("GERMLINE_TEST_FRONT_LABELS_OFF").is_some_and(|v| v == "1") {
        return false;
    }
    true
}

/// A JSON-RPC error the front itself raises: it holds no data, so its label is empty.
fn error(id: Value, code: i64, message: &str) -> Value {
    labelled_error(id, code, message, &Label::empty())
}

/// A JSON-RPC error carrying `label` in its `data` (the release's own `data` is dropped).
fn labelled_error(id: Value, code: i64, message: &str, label: &Label) -> Value {
    let mut e = json!({"code": code, "message": message});
    if labels_enforced() {
        e["data"] = json!({ LABEL_META_KEY: label });
    }
    json!({"jsonrpc": "2.0", "id": id, "error": e})
}

fn load_policy(path: Option<&Path>) -> anyhow::Result<Policy> {
    Ok(match path {
        Some(p) => Policy::load(p)?,
        None => Policy::parse(DEFAULT_POLICY)?,
    })
}

fn release_dir(target: &[String]) -> anyhow::Result<PathBuf> {
    let [first, rest @ ..] = target else { bail!("name a release directory after --") };
    let p = PathBuf::from(first);
    if rest.is_empty() && p.join(MANIFEST_FILE).is_file() {
        return p.canonicalize().with_context(|| format!("release directory {}", p.display()));
    }
    bail!(
        "{first:?} is not a release directory (no {MANIFEST_FILE}); wrapping a bare command needs a signed \
         manifest declaring its destinations: build one with `germline release build`"
    )
}

/// `germline wrap`.
pub fn wrap(args: WrapArgs) -> anyhow::Result<()> {
    let release = release_dir(&args.target)?;
    let mut policy = load_policy(args.policy.as_deref())?;
    if let Some(n) = args.pool {
        policy.limits.pool = n;
    }
    // The HTTP front's settings are checked before the release starts.
    let listen = match &args.listen {
        Some(addr) => Some((http::listen_address(addr, args.listen_non_loopback)?, guard_config(&args)?)),
        None => None,
    };
    let front = Front::start(&release, policy, args.runtime, args.consumer)?;
    match listen {
        Some((addr, guard)) => http::serve(front, addr, guard),
        None => serve_stdio(front),
    }
}

fn guard_config(args: &WrapArgs) -> anyhow::Result<http::GuardConfig> {
    let token = match (&args.token_file, std::env::var("GERMLINE_FRONT_TOKEN")) {
        (Some(p), _) => Some(std::fs::read_to_string(p).with_context(|| format!("--token-file {}", p.display()))?),
        (None, Ok(t)) => Some(t),
        (None, Err(_)) => None,
    };
    let token = token.map(|t| t.trim().to_owned());
    if token.as_deref().is_some_and(str::is_empty) {
        bail!("the front's bearer token is empty");
    }
    Ok(http::GuardConfig {
        allowed_hosts: args.allowed_hosts.clone(),
        allowed_origins: args.allowed_origins.clone(),
        token,
    })
}

/// Newline-delimited JSON-RPC on stdin/stdout, one message at a time, until stdin closes.
fn serve_stdio(mut front: Front) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut out = std::io::stdout().lock();
    let limit = front.max_message_bytes();
    let mut line = Vec::new();
    loop {
        line.clear();
        let (n, over) = read_line_bounded(&mut input, &mut line, limit)?;
        if n == 0 {
            return Ok(());
        }
        let reply = if over {
            Some(error(Value::Null, INVALID_REQUEST, &format!("message over {limit} bytes")))
        } else {
            let trimmed = line.trim_ascii();
            if trimmed.is_empty() {
                continue;
            }
            front.handle_bytes(trimmed)
        };
        if let Some(reply) = reply {
            serde_json::to_writer(&mut out, &reply)?;
            out.write_all(b"\n")?;
            out.flush()?;
        }
        front.after_response();
    }
}

/// Reads one line, keeping at most `limit` bytes; returns (bytes consumed, over limit).
fn read_line_bounded(input: &mut impl BufRead, line: &mut Vec<u8>, limit: usize) -> std::io::Result<(usize, bool)> {
    let mut consumed = 0;
    let mut over = false;
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok((consumed, over));
        }
        let (chunk, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..=i], true),
            None => (buf, false),
        };
        let n = chunk.len();
        if line.len() + n > limit + 1 {
            over = true;
        } else {
            line.extend_from_slice(chunk);
        }
        input.consume(n);
        consumed += n;
        if done {
            return Ok((consumed, over));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_errors_keep_the_servers_code() {
        assert_eq!(
            tool_error(r#"copy: tool error: {"code":-32602,"message":"Unknown tool: x"}"#),
            (-32602, "Unknown tool: x".to_owned())
        );
        assert_eq!(tool_error("deadline").0, INTERNAL_ERROR);
    }

    #[test]
    fn bounded_lines() {
        let mut input = std::io::Cursor::new(b"short\nlooooooong\nok\n".to_vec());
        let mut line = Vec::new();
        assert_eq!(read_line_bounded(&mut input, &mut line, 8).unwrap(), (6, false));
        line.clear();
        assert!(read_line_bounded(&mut input, &mut line, 8).unwrap().1);
        line.clear();
        assert_eq!(read_line_bounded(&mut input, &mut line, 8).unwrap(), (3, false));
        assert_eq!(line, b"ok\n");
    }
}
