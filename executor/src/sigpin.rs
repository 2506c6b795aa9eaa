//! `--runtime sig-pin`: the unprotected reference. One long-lived server process after
//! the signature check, as MCP hosts run servers today: it sees every call's data and
//! its egress goes wherever it asks (through a relay that only resolves the policy's test
//! host names). Used to show what germline prevents, and as the benign-output baseline.

use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use germline_model::{HostName, Label};
use serde_json::json;

use crate::call::{CallOutcome, CallRequest};
use crate::germline::PythonRuntime;
use crate::http;
use crate::mcp::McpClient;
use crate::policy::Policy;
use crate::wake::{Wake, Watchdog};
use crate::ExecutorError;

/// A release as one long-lived, unconfined process.
pub struct SigPinRuntime {
    child: Child,
    client: McpClient<BufReader<ChildStdout>, ChildStdin>,
    policy: Policy,
    stop: Arc<Wake>,
    relay: Option<thread::JoinHandle<()>>,
    watchdog: Watchdog,
}

impl SigPinRuntime {
    /// Starts the server and its relay.
    pub fn start(
        release_dir: &Path,
        mut policy: Policy,
        runtime: &PythonRuntime,
    ) -> Result<SigPinRuntime, ExecutorError> {
        let tls = policy.open_tls(&runtime.shim_dir.with_file_name("ca"))?;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(ExecutorError::io("binding the relay"))?;
        let port = listener.local_addr().map_err(ExecutorError::io("relay address"))?.port();
        let stop = Arc::new(Wake::new().map_err(ExecutorError::io("relay wake-up"))?);
        let relay = {
            let (stop, policy) = (stop.clone(), policy.clone());
            thread::spawn(move || relay_loop(listener, &stop, &policy))
        };
        let mut cmd = server_command(runtime, release_dir, port);
        // The environment a user configures the server with (`[release] env`, the policy's).
        let manifest = crate::manifest::Manifest::load_for(release_dir, &policy)?;
        cmd.envs(crate::germline::startup_environment(&manifest, &policy)?);
        for var in crate::tls::CA_TRUST_VARS {
            cmd.env(var, tls.ca_cert_path());
        }
        let mut child = cmd.spawn().map_err(ExecutorError::io("starting the sig-pin server"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(ExecutorError::internal("sig-pin pipes"));
        };
        let mut client = McpClient::new(BufReader::new(stdout), stdin, policy.limits.max_message_bytes);
        client.initialize()?;
        Ok(SigPinRuntime { child, client, policy, stop, relay: Some(relay), watchdog: Watchdog::new() })
    }

    /// `tools/list` from the long-lived process.
    pub fn list_tools(&mut self) -> Result<serde_json::Value, ExecutorError> {
        self.client
            .request("tools/list", json!({}))?
            .map_err(|e| ExecutorError::Copy(format!("tools/list failed: {e}")))
    }

    /// Runs one call in the long-lived process. Items are read where they lie; nothing
    /// is labelled beyond the call's own item labels.
    pub fn call(&mut self, req: &CallRequest) -> CallOutcome {
        let mut label = Label::empty();
        for p in &req.items {
            match self.policy.label_path(p) {
                Ok(l) => label = label.join(&l),
                Err(e) => return CallOutcome::failed(e),
            }
        }
        let pid = self.child.id() as i32;
        let r = self.watchdog.guard(pid, self.policy.limits.deadline, || {
            self.client.request("tools/call", json!({"name": req.tool, "arguments": req.arguments}))
        });
        match r {
            Ok(Ok(v)) => CallOutcome::answered(v),
            Ok(Err(e)) => CallOutcome::failed(format!("tool error: {e}")),
            Err(e) => CallOutcome::failed(e),
        }
    }
}

impl Drop for SigPinRuntime {
    fn drop(&mut self) {
        self.stop.wake();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.client.notify("exit", json!({}));
        if let Some(r) = self.relay.take() {
            let _ = r.join();
        }
    }
}

/// The tool host in `serve` mode on stdio, unprotected: what a user would run without
/// germline (the benchmarks' bare server).
pub fn serve_command(runtime: &PythonRuntime, release_dir: &Path) -> Command {
    let mut cmd = Command::new(&runtime.python);
    // `-B`, not `PYTHONDONTWRITEBYTECODE`, which `-I` ignores: the server writes no
    // bytecode into the release directory.
    cmd.args(["-I", "-B"])
        .arg(runtime.shim_dir.join("germline_host.py"))
        .arg("serve")
        .arg(release_dir)
        .current_dir(release_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    cmd
}

/// The command of a long-lived server process for the baselines: [`serve_command`] with
/// every proxy variable pointing at the relay on `port`.
pub(crate) fn server_command(runtime: &PythonRuntime, release_dir: &Path, port: u16) -> Command {
    let proxy = format!("http://127.0.0.1:{port}");
    let mut cmd = serve_command(runtime, release_dir);
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
        cmd.env(var, &proxy);
    }
    cmd.env_remove("NO_PROXY").env_remove("no_proxy");
    cmd
}

fn relay_loop(listener: TcpListener, stop: &Wake, policy: &Policy) {
    while let Some(mut conn) = stop.accept(&listener, None) {
        let deadline = Instant::now() + policy.limits.deadline;
        let _ = conn.set_read_timeout(Some(policy.limits.deadline));
        let max = policy.limits.max_message_bytes;
        let reply = match http::read_request(&mut conn, max) {
            Ok(Some(req)) if req.method == "CONNECT" => {
                match policy.tls() {
                    Some(tls) => {
                        let host = req.host.clone();
                        let _ = tls.serve_tunnel(conn, &host, req.port, max, |inner| relay(inner, policy, deadline));
                    }
                    None => {
                        let _ = conn.write_all(&http::denied_response("HTTPS is not configured"));
                    }
                }
                continue;
            }
            Ok(Some(req)) => relay(&req, policy, deadline),
            Ok(None) => continue,
            Err(e) => http::denied_response(&e.to_string()),
        };
        let _ = conn.write_all(&reply);
    }
}

/// Forwards one request as asked, with no rule at all, to the policy's test address for
/// its host (plain HTTP, or TLS that still verifies the host's certificate).
fn relay(req: &http::HttpRequest, policy: &Policy, deadline: Instant) -> Vec<u8> {
    let max = policy.limits.max_message_bytes;
    let Some(addr) = HostName::new(&req.host).ok().and_then(|h| policy.host_address(&h)) else {
        return http::denied_response("no test address for this host (sig-pin reaches only mapped hosts)");
    };
    let sent = match (req.scheme.as_str(), policy.tls()) {
        ("https", Some(tls)) => tls.forward(req, addr, deadline, max),
        ("https", None) => return http::denied_response("HTTPS is not configured"),
        _ => http::forward(req, addr, deadline, max),
    };
    sent.unwrap_or_else(|e| http::denied_response(&e.to_string()))
}
