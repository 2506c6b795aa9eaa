//! The comparison runtimes of the evaluation: honest models of the designs germline is
//! measured against, behind the same [`Runtime`](crate::runtime::Runtime) switch.
//!
//! - `sig-ifc`: the long-lived process of `sig-pin`, plus per-call output labels computed
//!   from the call's own inputs (CaMeL/FIDES class). The label is checked only where the
//!   result goes: a consumer not cleared for it gets no result.
//! - `confined-ifc`: `sig-ifc` confined the way MCPGuard/AgentBound-class systems confine a
//!   server: Landlock read-only file system limited to the interpreter, the release and the
//!   manifest's declared `read_paths`, no writes, and egress only through a relay that lets
//!   a call reach exactly the hosts its tool declares (an allowlist, no positional rule).
//! - `fresh-ifc`: `confined-ifc` with a fresh process for every call.
//!
//! None of them splits a call by view; that is what the evaluation shows.

use std::collections::BTreeSet;
use std::io::{self, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use germline_model::{ConsumerName, HostName, Label};
use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, ABI,
};
use serde_json::{json, Value};

use crate::call::{CallOutcome, CallRequest, LABEL_META_KEY};
use crate::germline::PythonRuntime;
use crate::http;
use crate::manifest::Manifest;
use crate::mcp::McpClient;
use crate::policy::Policy;
use crate::sigpin::SigPinRuntime;
use crate::wake::{Wake, Watchdog};
use crate::ExecutorError;

/// Which comparison design an [`IfcRuntime`] models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IfcMode {
    /// Long-lived unconfined process, per-call output labels.
    Sig,
    /// Long-lived confined process (read-only FS, egress allowlist), per-call labels.
    Confined,
    /// A fresh confined process per call, per-call labels.
    Fresh,
}

/// A release under one of the per-call-label designs.
pub struct IfcRuntime {
    mode: IfcMode,
    release_dir: PathBuf,
    manifest: Manifest,
    policy: Policy,
    python: PythonRuntime,
    sig: Option<SigPinRuntime>,
    confined: Option<ConfinedServer>,
}

impl IfcRuntime {
    /// Starts `release_dir` under `mode` (for `Fresh`, the first process starts with the
    /// first call).
    pub fn start(
        mode: IfcMode,
        release_dir: &Path,
        policy: Policy,
        python: PythonRuntime,
    ) -> Result<IfcRuntime, ExecutorError> {
        let manifest = Manifest::load_for(release_dir, &policy)?;
        let mut rt = IfcRuntime {
            mode,
            release_dir: release_dir.to_path_buf(),
            manifest,
            policy,
            python,
            sig: None,
            confined: None,
        };
        match mode {
            IfcMode::Sig => rt.sig = Some(SigPinRuntime::start(release_dir, rt.policy.clone(), &rt.python)?),
            IfcMode::Confined => rt.confined = Some(rt.start_confined()?),
            IfcMode::Fresh => {}
        }
        Ok(rt)
    }

    fn start_confined(&self) -> Result<ConfinedServer, ExecutorError> {
        ConfinedServer::start(&self.release_dir, &self.manifest, self.policy.clone(), &self.python)
    }

    /// `tools/list` (from a throw-away process under `fresh-ifc`).
    pub fn list_tools(&mut self) -> Result<Value, ExecutorError> {
        if let Some(s) = &mut self.sig {
            return s.list_tools();
        }
        if self.confined.is_none() {
            self.confined = Some(self.start_confined()?);
        }
        let server = self.confined.as_mut().ok_or_else(|| ExecutorError::internal("confined server"))?;
        let r = server.request("tools/list", json!({}), &BTreeSet::new());
        if self.mode == IfcMode::Fresh {
            self.confined = None;
        }
        r
    }

    /// Runs one call; the result carries the join of the call's item labels and is
    /// withheld from a consumer whose clearance does not cover it.
    pub fn call(&mut self, req: &CallRequest) -> CallOutcome {
        let label = match self.call_label(req) {
            Ok(l) => l,
            Err(e) => return CallOutcome::failed(e),
        };
        let names: Vec<String> = if req.consumers.is_empty() { vec!["agent".into()] } else { req.consumers.clone() };
        for n in &names {
            let cleared = ConsumerName::new(n)
                .map_err(|e| ExecutorError::Call(e.to_string()))
                .and_then(|c| self.policy.consumer_clearance(&c));
            match cleared {
                Ok(c) if label.flows_to(&c) => {}
                Ok(_) => return CallOutcome::refused(format!("result labelled {label} withheld from consumer {n}")),
                Err(e) => return CallOutcome::failed(e),
            }
        }
        let mut outcome = match self.mode {
            IfcMode::Sig => match &mut self.sig {
                Some(s) => s.call(req),
                None => CallOutcome::failed("sig-ifc server not running"),
            },
            IfcMode::Confined | IfcMode::Fresh => self.call_confined(req),
        };
        if let Some(v) = outcome.result.as_mut() {
            if let Some(obj) = v.as_object_mut() {
                let meta = obj.entry("_meta").or_insert_with(|| json!({}));
                if let Some(m) = meta.as_object_mut() {
                    m.insert(LABEL_META_KEY.to_owned(), json!(label));
                }
            }
            outcome.label = Some(label);
        }
        outcome
    }

    fn call_confined(&mut self, req: &CallRequest) -> CallOutcome {
        if self.confined.is_none() {
            match self.start_confined() {
                Ok(s) => self.confined = Some(s),
                Err(e) => return CallOutcome::failed(e),
            }
        }
        let Some(server) = self.confined.as_mut() else {
            return CallOutcome::failed("confined server not running");
        };
        let mut allowed: BTreeSet<HostName> = self.manifest.tool(&req.tool).hosts.into_iter().collect();
        if let Some(arg) = self.manifest.tool(&req.tool).host_argument {
            if let Some(h) = req.arguments.get(&arg).and_then(Value::as_str).and_then(host_of) {
                allowed.insert(h);
            }
        }
        let r = server.request("tools/call", json!({"name": req.tool, "arguments": req.arguments}), &allowed);
        if self.mode == IfcMode::Fresh {
            self.confined = None;
        }
        match r {
            Ok(v) => CallOutcome::answered(v),
            Err(e) => {
                if !matches!(e, ExecutorError::Copy(_)) {
                    self.confined = None;
                }
                CallOutcome::failed(e)
            }
        }
    }

    fn call_label(&self, req: &CallRequest) -> Result<Label, ExecutorError> {
        let mut label = Label::empty();
        for p in &req.items {
            label = label.join(&self.policy.label_path(&self.policy.canonical_path(p)?)?);
        }
        for arg in req.arguments.keys() {
            if let Some(l) = self.policy.label_argument(&req.tool, arg) {
                label = label.join(&l);
            }
        }
        Ok(label)
    }
}

fn host_of(v: &str) -> Option<HostName> {
    let rest = v.split_once("://").map(|(_, r)| r).unwrap_or(v);
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map(|(_, a)| a).unwrap_or(authority);
    let host = authority.rsplit_once(':').map(|(h, _)| h).unwrap_or(authority);
    HostName::new(&host.to_ascii_lowercase()).ok()
}

/// One Landlock-confined server process and its allowlist relay.
struct ConfinedServer {
    child: Child,
    client: McpClient<BufReader<ChildStdout>, ChildStdin>,
    deadline: Duration,
    allowed: Arc<Mutex<BTreeSet<HostName>>>,
    stop: Arc<Wake>,
    relay: Option<thread::JoinHandle<()>>,
    watchdog: Watchdog,
}

impl ConfinedServer {
    fn start(
        release_dir: &Path,
        manifest: &Manifest,
        policy: Policy,
        runtime: &PythonRuntime,
    ) -> Result<ConfinedServer, ExecutorError> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(ExecutorError::io("binding the relay"))?;
        let port = listener.local_addr().map_err(ExecutorError::io("relay address"))?.port();
        let stop = Arc::new(Wake::new().map_err(ExecutorError::io("relay wake-up"))?);
        let allowed = Arc::new(Mutex::new(BTreeSet::new()));
        let relay = {
            let (stop, policy, allowed) = (stop.clone(), policy.clone(), allowed.clone());
            thread::spawn(move || allowlist_relay(listener, &stop, &policy, &allowed))
        };
        let mut readable: Vec<PathBuf> = runtime.read_paths.clone();
        readable.push(release_dir.to_path_buf());
        readable.push(runtime.shim_dir.clone());
        for p in ["/dev", "/proc", "/etc"] {
            readable.push(PathBuf::from(p));
        }
        for tool in manifest.tools.values() {
            readable.extend(tool.read_paths.iter().filter_map(|g| glob_root(g)));
        }
        let mut cmd = crate::sigpin::server_command(runtime, release_dir, port);
        let mut ruleset = Some(readonly_ruleset(&readable, port)?);
        // SAFETY: runs in the forked child before exec; `restrict_self` is a prctl and a
        // landlock syscall on a ruleset fd built in the parent.
        unsafe {
            cmd.pre_exec(move || {
                let rs = ruleset.take().ok_or_else(|| io::Error::other("ruleset used twice"))?;
                rs.restrict_self().map_err(io::Error::other)?;
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(ExecutorError::io("starting the confined server"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(ExecutorError::internal("confined server pipes"));
        };
        let mut client = McpClient::new(BufReader::new(stdout), stdin, policy.limits.max_message_bytes);
        if let Err(e) = client.initialize() {
            let _ = child.kill();
            let _ = child.wait();
            stop.wake();
            let _ = relay.join();
            return Err(e);
        }
        Ok(ConfinedServer {
            child,
            client,
            deadline: policy.limits.deadline,
            allowed,
            stop,
            relay: Some(relay),
            watchdog: Watchdog::new(),
        })
    }

    fn request(&mut self, method: &str, params: Value, allowed: &BTreeSet<HostName>) -> Result<Value, ExecutorError> {
        *self.allowed.lock().unwrap_or_else(|p| p.into_inner()) = allowed.clone();
        let pid = self.child.id() as i32;
        let r = self.watchdog.guard(pid, self.deadline, || self.client.request(method, params));
        self.allowed.lock().unwrap_or_else(|p| p.into_inner()).clear();
        r?.map_err(|e| ExecutorError::Copy(format!("tool error: {e}")))
    }
}

impl Drop for ConfinedServer {
    fn drop(&mut self) {
        self.stop.wake();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.relay.take() {
            let _ = r.join();
        }
    }
}

/// The fixed directory prefix of a glob (`/a/b/**` → `/a/b`).
fn glob_root(glob: &str) -> Option<PathBuf> {
    if !glob.starts_with('/') {
        return None;
    }
    let mut root = PathBuf::from("/");
    for comp in glob.split('/').filter(|c| !c.is_empty()) {
        if comp.contains(['*', '?', '[', '{']) {
            break;
        }
        root.push(comp);
    }
    (root != Path::new("/")).then_some(root)
}

fn readonly_ruleset(readable: &[PathBuf], relay_port: u16) -> Result<landlock::RulesetCreated, ExecutorError> {
    let abi = ABI::V4;
    let ll = |e: landlock::RulesetError| ExecutorError::Sandbox(format!("landlock: {e}"));
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(ll)?
        .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
        .map_err(ll)?
        .create()
        .map_err(ll)?;
    for p in readable.iter().filter(|p| p.exists()) {
        let fd = PathFd::new(p).map_err(|e| ExecutorError::Sandbox(format!("landlock path {}: {e}", p.display())))?;
        rs = rs.add_rule(PathBeneath::new(fd, AccessFs::from_read(abi))).map_err(ll)?;
    }
    let devnull = PathFd::new("/dev/null").map_err(|e| ExecutorError::Sandbox(format!("landlock: {e}")))?;
    rs = rs.add_rule(PathBeneath::new(devnull, AccessFs::ReadFile | AccessFs::WriteFile)).map_err(ll)?;
    rs = rs.add_rule(NetPort::new(relay_port, AccessNet::ConnectTcp)).map_err(ll)?;
    Ok(rs)
}

fn allowlist_relay(listener: TcpListener, stop: &Wake, policy: &Policy, allowed: &Mutex<BTreeSet<HostName>>) {
    while let Some(mut conn) = stop.accept(&listener, None) {
        let deadline = Instant::now() + policy.limits.deadline;
        let _ = conn.set_read_timeout(Some(policy.limits.deadline));
        let reply = match http::read_request(&mut conn, policy.limits.max_message_bytes) {
            Ok(Some(req)) => {
                let host = HostName::new(&req.host).ok();
                let ok = host.as_ref().is_some_and(|h| allowed.lock().unwrap_or_else(|p| p.into_inner()).contains(h));
                match host.and_then(|h| policy.host_address(&h)) {
                    Some(addr) if ok && req.method != "CONNECT" => {
                        http::forward(&req, addr, deadline, policy.limits.max_message_bytes)
                            .unwrap_or_else(|e| http::denied_response(&e.to_string()))
                    }
                    _ => http::denied_response("host not on this tool's allowlist"),
                }
            }
            Ok(None) => continue,
            Err(e) => http::denied_response(&e.to_string()),
        };
        let _ = conn.write_all(&reply);
    }
}
