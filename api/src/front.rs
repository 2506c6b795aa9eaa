//! The MCP front: `germline wrap`, an MCP server that an agent host launches (stdio) or
//! reaches (Streamable HTTP, `--listen`) instead of the real one. `tools/list` (and the
//! resource and prompt lists) come from a data-free copy, or from one holding the
//! start-up data with its label, every `tools/call` is a germline call whose result carries its
//! output label in `_meta`, and the rest of what clients expect (initialize, ping,
//! logging, notifications, JSON-RPC errors) is answered here without touching the release.
//! The release's runtime starts on a thread: `initialize`, `ping` and notifications are
//! answered while the germline imports the release; a request that needs it waits.
//!
//! Formation-consistent dispatch (DESIGN §8): every `tools/list` answer records its
//! formation snapshot in the ledger and names it in `_meta["dev.germline/snapshot"]`; a
//! session's calls are formed against the snapshot it saw (or the one a call names in its
//! own `_meta`, for a client resuming after a reconnect) and pass the final-hop fence. A
//! rollout is the wrapped path pointing at another release directory of the same name
//! (a deployment flips a link): the front admits and promotes it, and a call formed on the
//! release before runs only where the deployment's dispatch policy allows. A release whose
//! directory is gone is retired.
//!
//! [`Front`] is sans-I/O: one JSON-RPC message in, at most one out. The stdio loop and the
//! HTTP handlers in [`http`] are thin shells around it.

pub mod bridge;
pub mod http;

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use germline_executor::call::{attach_label, CallOutcome, CallRequest, LABEL_META_KEY};
use germline_executor::dispatch::{
    call_params, named_snapshot, Fence, FormationHost, HostedRelease, ReleaseRunner, RunResult, Session,
};
use germline_executor::germline::PythonRuntime;
use germline_executor::manifest::{Manifest, MANIFEST_FILE};
use germline_executor::policy::Policy;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_executor::ExecutorError;
use germline_model::{Clearance, ConsumerName, DispatchPolicy, Label, ReleaseHash, ReleaseName};
use serde_json::{json, Value};

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
/// The call was not run: its formation was refused or the final-hop fence stopped it.
const NOT_RUN: i64 = -32000;

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
    /// Which release may run a call formed on another: `call_specific` (default),
    /// `exact_pin`, `release_wide_deny` or `release_wide_allow` (or set
    /// GERMLINE_DISPATCH_POLICY).
    #[arg(long)]
    pub dispatch_policy: Option<DispatchPolicy>,
    /// Relay to the MCP endpoint of this `germline serve` (a loopback `http://` URL)
    /// instead of running the release here: the service's ledger, dampening, witnesses and
    /// fleet suppressions then hold for every agent host that wraps it this way. With
    /// `--token-file` (or GERMLINE_SERVICE_TOKEN) naming the service's API token.
    #[arg(long, requires = "release", conflicts_with_all = ["listen", "policy", "pool"])]
    pub service: Option<String>,
    /// The release name the service serves (with `--service`).
    #[arg(long, requires = "service")]
    pub release: Option<String>,
    /// A release directory (with `germline.toml`). Commands are not wrapped yet: an
    /// unsigned command has no manifest to declare its destinations.
    #[arg(last = true, required_unless_present = "service")]
    pub target: Vec<String>,
}

/// The wrapped release (and the releases it was rolled out to) and the MCP sessions
/// around it.
pub struct Front {
    formations: FormationHost,
    runner: Arc<FrontRunner>,
    name: ReleaseName,
    /// The wrapped path as given: a rollout points it at another release directory.
    target: PathBuf,
    /// Release directories deployed by this front, by hash.
    deployed: BTreeMap<ReleaseHash, PathBuf>,
    /// The directory `target` resolved to last, and its release.
    current: (PathBuf, ReleaseHash),
    /// The last call (its release, request and outcome), whose triggers are verified into
    /// witnesses once its answer is out.
    pending: Option<(ReleaseHash, CallRequest, CallOutcome)>,
    manifest: Manifest,
    kind: RuntimeKind,
    consumer: String,
    clearance: Clearance,
    /// The snapshot each session saw at its last `tools/list` (by transport session id;
    /// stdio has one session, `""`).
    sessions: BTreeMap<String, Session>,
    max_message_bytes: usize,
}

impl Front {
    /// Admits the release and starts its runtime under `kind` on a thread, returning at
    /// once: `initialize`, `ping` and notifications are answered while the germline imports
    /// the release; a request that needs the release waits for it, and a start failure
    /// answers such requests with its error. The ledger under the data directory
    /// (`GERMLINE_DATA_DIR`) holds the formation snapshots, formations, dispatch records
    /// and release lifecycle; germline runtimes also refuse a suppressed release (by
    /// dampening or by a peer's witness) and turn triggers into witnesses there, as for
    /// `germline call`.
    pub fn start(
        release: &Path,
        policy: Policy,
        kind: RuntimeKind,
        consumer: String,
        dispatch_policy: DispatchPolicy,
    ) -> anyhow::Result<Front> {
        let manifest = Manifest::load(release)?;
        let name = ReleaseName::new(&manifest.name)?;
        let clearance = policy.consumer_clearance(&ConsumerName::new(&consumer)?)?;
        let python = PythonRuntime::discover(&germline_host::home()).context("finding the Python tool host")?;
        let max_message_bytes = policy.limits.max_message_bytes;
        let data_dir = germline_host::data_dir();
        let ledger = germline_host::open_ledger(&data_dir)?;
        let runner = Arc::new(FrontRunner {
            kind,
            policy,
            python: python.clone(),
            ledger: (kind == RuntimeKind::Germline).then(|| ledger.clone()),
            data_dir,
            hosts: Mutex::new(BTreeMap::new()),
            tools: Mutex::new(BTreeMap::new()),
            lists: Mutex::new(BTreeMap::new()),
        });
        let formations = FormationHost::open_with(ledger, runner.clone(), python)
            .context("replaying formations and release lifecycles from the ledger")?;
        formations.set_dispatch_policy(dispatch_policy);
        if fence_switched_off() {
            formations.switch_fence_off();
        }
        let dir = release.canonicalize().with_context(|| format!("release directory {}", release.display()))?;
        let mut front = Front {
            formations,
            runner,
            name,
            target: release.to_path_buf(),
            deployed: BTreeMap::new(),
            current: (dir.clone(), ReleaseHash([0; 32])),
            pending: None,
            manifest,
            kind,
            consumer,
            clearance,
            sessions: BTreeMap::new(),
            max_message_bytes,
        };
        front.deploy(&dir, Start::InBackground)?;
        Ok(front)
    }

    /// Makes the release in `dir` the one new formations use: admitted (or attached) and
    /// promoted, or rolled back to when it was current before; its runtime is started
    /// (`Start::InBackground`: on a thread, the first request that needs it waits).
    fn deploy(&mut self, dir: &Path, start: Start) -> anyhow::Result<()> {
        let manifest = Manifest::load(dir)?;
        if manifest.name != self.name.as_str() {
            bail!("{} holds release {}, not {}", dir.display(), manifest.name, self.name);
        }
        let hash = germline_host::release_id(dir)?;
        let hosted = self.formations.register(dir, Some(hash))?;
        let l = self.formations.lifecycle(&self.name).context("the release has no lifecycle")?;
        let state = l.releases.get(&hash).context("the release is not admitted")?;
        if state.retired {
            bail!("{} was retired on this host: it runs nothing any more", hosted.label());
        }
        match l.current {
            Some(c) if c == hash => {}
            Some(_) if state.was_promoted => self.formations.roll_back(&hash)?,
            _ => self.formations.promote(&hash)?,
        }
        match start {
            Start::Now => drop(self.runner.host(&hosted)?),
            Start::InBackground => self.runner.start_in_background(&hosted),
        }
        self.deployed.insert(hash, dir.to_path_buf());
        self.current = (dir.to_path_buf(), hash);
        self.manifest = manifest;
        Ok(())
    }

    /// Follows the deployment: a wrapped path that now resolves to another release
    /// directory is rolled out to; a deployed release whose directory is gone is retired.
    fn follow_deployment(&mut self) -> Result<(), String> {
        if let Ok(dir) = self.target.canonicalize() {
            if dir != self.current.0 {
                self.deploy(&dir, Start::Now).map_err(|e| format!("rolling out {}: {e:#}", dir.display()))?;
            }
        }
        let gone: Vec<ReleaseHash> = self
            .deployed
            .iter()
            .filter(|(h, d)| **h != self.current.1 && !d.join(MANIFEST_FILE).is_file())
            .map(|(h, _)| *h)
            .collect();
        for h in gone {
            self.deployed.remove(&h);
            self.formations.retire(&h).map_err(|e| format!("retiring {h}: {e}"))?;
        }
        Ok(())
    }

    /// Counts the last call's event (dampening) and queues the verification of its
    /// triggers into witnesses, which runs off the release's lane; the transports call this
    /// once the call's answer is sent. Failures are logged: the
    /// answer is out, and the trigger itself is already in the trigger log.
    pub fn after_response(&mut self) {
        if let Some((release, req, outcome)) = self.pending.take() {
            if let Err(e) = self.runner.after_call(&release, &req, &outcome) {
                tracing::error!("recording the call's witnesses and event: {e:#}");
            }
        }
    }

    /// Waits until the triggers of the calls run so far are verified and their witnesses
    /// recorded (they are verified off the release's lane, so no message waits for them):
    /// for a transport that is ending.
    pub fn wait_verified(&self) {
        self.runner.wait_verified();
    }

    /// A transport session ended: what it saw is forgotten.
    pub fn end_session(&mut self, session: &str) {
        self.sessions.remove(session);
    }

    /// Largest client message accepted.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Handles one raw client message of transport session `session` (`""` for stdio);
    /// `None` when nothing is to be sent back (notifications, responses).
    pub fn handle_bytes(&mut self, session: &str, raw: &[u8]) -> Option<Value> {
        if raw.len() > self.max_message_bytes {
            return Some(error(
                Value::Null,
                INVALID_REQUEST,
                &format!("message over {} bytes", self.max_message_bytes),
            ));
        }
        match serde_json::from_slice::<Value>(raw) {
            Ok(msg) => self.handle(session, msg),
            Err(e) => Some(error(Value::Null, PARSE_ERROR, &format!("parse error: {e}"))),
        }
    }

    /// Handles one parsed client message of transport session `session`.
    pub fn handle(&mut self, session: &str, msg: Value) -> Option<Value> {
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
        let (answer, label) = self.request(session, method, &params);
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
    fn request(&mut self, session: &str, method: &str, params: &Value) -> (Result<Value, (i64, String)>, Label) {
        let (answer, label) = match method {
            "tools/call" => self.tools_call(session, params),
            "tools/list" => self.tools_list(session),
            "resources/list" => self.other_list("resources/list", "resources"),
            "resources/templates/list" => self.other_list("resources/templates/list", "resourceTemplates"),
            "prompts/list" => self.other_list("prompts/list", "prompts"),
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
            _ => Err((METHOD_NOT_FOUND, format!("Method not found: {method}"))),
        }
    }

    /// `tools/list` from a data-free copy (germline), or, for a server that needs its
    /// start-up data, from a copy holding it, with that data's label; a baseline's list
    /// comes from a process that may hold data, so it is refused rather than labelled
    /// data-free. The answer's snapshot is recorded and becomes the session's.
    fn tools_list(&mut self, session: &str) -> (Result<Value, (i64, String)>, Label) {
        if self.kind != RuntimeKind::Germline && labels_enforced() {
            return (
                Err((INTERNAL_ERROR, "tools/list: this runtime has no data-free copy to list tools".into())),
                Label::empty(),
            );
        }
        match self.list(session) {
            Ok((mut tools, s)) => {
                s.attach_to(&mut tools);
                (Ok(tools), s.snapshot.label)
            }
            Err(e) => (Err((INTERNAL_ERROR, format!("tools/list: {e}"))), Label::empty()),
        }
    }

    /// `resources/list`, `resources/templates/list` or `prompts/list` of the current
    /// release as it answers it, listed like `tools/list` (from a data-free copy, or from a
    /// copy holding the start-up data, with its label). A release that has none (its
    /// server does not implement the method), or a runtime with no data-free copy, gets an
    /// empty list. These lists are not part of a formation snapshot.
    fn other_list(&mut self, method: &'static str, key: &str) -> (Result<Value, (i64, String)>, Label) {
        let listed = self
            .follow_deployment()
            .and_then(|()| {
                let hosted = self
                    .formations
                    .release(&self.current.1)
                    .ok_or_else(|| format!("release {} is not on this host", self.current.1))?;
                self.runner.list_other(&hosted, method, key).map_err(|e| e.to_string())
            })
            .unwrap_or_else(|e| {
                tracing::info!("{method}: answering an empty list ({e})");
                (json!({ key: [] }), Label::empty())
            });
        (Ok(listed.0), listed.1)
    }

    /// Lists the tools of the current release for `session`, which binds to the snapshot.
    fn list(&mut self, session: &str) -> Result<(Value, Session), String> {
        self.follow_deployment()?;
        let (tools, s) = self.formations.list_tools(&self.name).map_err(|e| e.to_string())?;
        self.sessions.insert(session.to_owned(), s.clone());
        Ok((tools, s))
    }

    /// The snapshot a call binds to: the one it names in `_meta`, else the one its session
    /// saw, else (a session that never listed) the current release's, listed now.
    fn bound_snapshot(&mut self, session: &str, params: &Value) -> Result<Session, (i64, String)> {
        match named_snapshot(params).map_err(|e| (INVALID_PARAMS, e))? {
            Some(id) => self.formations.resume_session(&id).map_err(|e| (NOT_RUN, e.to_string())),
            None => match self.sessions.get(session) {
                Some(s) => Ok(s.clone()),
                None => self.list(session).map(|(_, s)| s).map_err(|e| (INTERNAL_ERROR, e)),
            },
        }
    }

    fn tools_call(&mut self, session: &str, params: &Value) -> (Result<Value, (i64, String)>, Label) {
        let (tool, arguments) = match call_params(params) {
            Ok(c) => c,
            Err(e) => return (Err((INVALID_PARAMS, e.into())), Label::empty()),
        };
        if let Err(e) = self.follow_deployment() {
            return (Err((INTERNAL_ERROR, e)), Label::empty());
        }
        let bound = match self.bound_snapshot(session, params) {
            Ok(s) => s,
            Err(e) => return (Err(e), Label::empty()),
        };
        // A list made by a copy holding start-up data is that data's: which names it has
        // decides whether a call runs or is an unknown tool, and how soon it is answered.
        // A consumer not cleared for its label gets the same refusal for every name.
        if listed_label_enforced() && !bound.snapshot.label.flows_to(&self.clearance) {
            return (Err((INTERNAL_ERROR, LIST_WITHHELD.to_owned())), Label::empty());
        }
        if !bound.snapshot.tools.contains_key(&tool) {
            // What the server itself answers for a tool it does not have.
            return (Err((INVALID_PARAMS, format!("Unknown tool: {tool}"))), Label::empty());
        }
        let req = CallRequest { tool, arguments, items: Vec::new(), consumers: vec![self.consumer.clone()] };
        let outcome = match self.formations.session_call(&bound, &req) {
            Ok(o) => o,
            Err(e @ (ExecutorError::Fence(_) | ExecutorError::Formation(_) | ExecutorError::Lifecycle(_))) => {
                return (Err((NOT_RUN, e.to_string())), Label::empty())
            }
            Err(e) => return (Err((INTERNAL_ERROR, format!("{e:#}"))), Label::empty()),
        };
        let label = outcome.label.clone().unwrap_or_default();
        let answer = match (&outcome.result, &outcome.error) {
            (Some(result), _) => Ok(result.clone()),
            (None, Some(e)) => Err(tool_error(e)),
            (None, None) => Err((INTERNAL_ERROR, "the call produced no result".into())),
        };
        self.pending = Some((self.current.1, req, outcome));
        (answer, label)
    }
}

/// When [`Front::deploy`] starts a release's runtime.
#[derive(Clone, Copy)]
enum Start {
    /// Before it returns (a rollout: its error is the rollout's).
    Now,
    /// On a thread (the wrapped release at start-up: `initialize` does not wait for it).
    InBackground,
}

/// A release's runtime: starting on a thread (the germline imports the release, which can
/// take seconds), started, or failed to start (the error answers every request that needs
/// the release).
enum Starting {
    Pending(std::thread::JoinHandle<Result<germline_host::Host, String>>),
    Ready(Arc<Mutex<germline_host::Host>>),
    Failed(String),
}

/// Runs the front's releases, one [`germline_host::Host`] each (dampening before a call,
/// witnesses after it), behind the fence the formation host hands it.
struct FrontRunner {
    kind: RuntimeKind,
    policy: Policy,
    python: PythonRuntime,
    /// The dampening ledger (germline runtimes).
    ledger: Option<Arc<germline_ledger::Ledger>>,
    data_dir: PathBuf,
    hosts: Mutex<BTreeMap<ReleaseHash, Starting>>,
    /// Each release's labelled `tools/list`, from its first listing.
    tools: Mutex<BTreeMap<ReleaseHash, Listed>>,
    /// Each release's labelled resource, resource template and prompt lists, each listed
    /// once.
    lists: Mutex<BTreeMap<(ReleaseHash, &'static str), Listed>>,
}

/// A listing and the label of the copy that produced it.
type Listed = (Value, Label);

impl FrontRunner {
    /// Starts the runtime of `release` on a thread, unless it is started or starting.
    fn start_in_background(&self, release: &HostedRelease) {
        let mut hosts = lock(&self.hosts);
        if hosts.contains_key(&release.release) {
            return;
        }
        let (kind, policy, python) = (self.kind, self.policy.clone(), self.python.clone());
        let (ledger, data_dir) = (self.ledger.clone(), self.data_dir.clone());
        let (dir, hash) = (release.dir.clone(), release.release);
        let starting = std::thread::spawn(move || {
            Self::start_host(kind, policy, python, ledger, data_dir, &dir, hash).map_err(|e| e.to_string())
        });
        hosts.insert(release.release, Starting::Pending(starting));
    }

    fn start_host(
        kind: RuntimeKind,
        policy: Policy,
        python: PythonRuntime,
        ledger: Option<Arc<germline_ledger::Ledger>>,
        data_dir: PathBuf,
        dir: &Path,
        release: ReleaseHash,
    ) -> Result<germline_host::Host, ExecutorError> {
        let mut rt = Runtime::start(kind, dir, policy, python)?;
        rt.set_trigger_log(data_dir.join("triggers.jsonl"));
        if let Runtime::Germline(g) = &mut rt {
            g.release = release;
        }
        germline_host::Host::new(rt, ledger, data_dir).map_err(|e| ExecutorError::Policy(format!("{e:#}")))
    }

    /// The host of `release`: its runtime started on first use, or waited for while it
    /// starts on a thread. A runtime that failed to start on its thread answers with that
    /// error from then on; one started here is tried again by the next use.
    fn host(&self, release: &HostedRelease) -> Result<Arc<Mutex<germline_host::Host>>, ExecutorError> {
        let mut hosts = lock(&self.hosts);
        if let Some(Starting::Pending(_)) = hosts.get(&release.release) {
            let Some(Starting::Pending(handle)) = hosts.remove(&release.release) else {
                unreachable!("checked above");
            };
            let started = match handle.join() {
                Ok(Ok(h)) => Starting::Ready(Arc::new(Mutex::new(h))),
                Ok(Err(e)) => Starting::Failed(e),
                Err(_) => Starting::Failed("starting the release panicked".into()),
            };
            hosts.insert(release.release, started);
        }
        match hosts.get(&release.release) {
            Some(Starting::Ready(h)) => return Ok(h.clone()),
            Some(Starting::Failed(e)) => return Err(ExecutorError::Call(format!("the release did not start: {e}"))),
            Some(Starting::Pending(_)) => unreachable!("joined above"),
            None => {}
        }
        let h = Self::start_host(
            self.kind,
            self.policy.clone(),
            self.python.clone(),
            self.ledger.clone(),
            self.data_dir.clone(),
            &release.dir,
            release.release,
        )?;
        let h = Arc::new(Mutex::new(h));
        hosts.insert(release.release, Starting::Ready(h.clone()));
        Ok(h)
    }

    /// `method` (a resource, resource template or prompt list, under `key`) of `release`
    /// and its label, listed once: a release that cannot list it (its server does not
    /// implement the method, or its runtime has no data-free copy) has an empty list.
    fn list_other(
        &self,
        release: &HostedRelease,
        method: &'static str,
        key: &str,
    ) -> Result<(Value, Label), ExecutorError> {
        if let Some(listed) = lock(&self.lists).get(&(release.release, method)) {
            return Ok(listed.clone());
        }
        let host = self.host(release)?;
        let listed = lock(&host).rt.list_labelled(method).unwrap_or_else(|e| {
            tracing::info!("{method}: answering an empty list ({e})");
            (json!({ key: [] }), Label::empty())
        });
        lock(&self.lists).insert((release.release, method), listed.clone());
        Ok(listed)
    }

    fn wait_verified(&self) {
        let hosts: Vec<_> = lock(&self.hosts)
            .values()
            .filter_map(|s| match s {
                Starting::Ready(h) => lock(h).verifier().cloned(),
                _ => None,
            })
            .collect();
        for v in hosts {
            v.wait_idle(None);
        }
    }

    fn after_call(&self, release: &ReleaseHash, req: &CallRequest, outcome: &CallOutcome) -> anyhow::Result<()> {
        let host = match lock(&self.hosts).get(release) {
            Some(Starting::Ready(h)) => Some(h.clone()),
            _ => None,
        };
        if let Some(h) = host {
            lock(&h).after_call(req, outcome)?;
        }
        Ok(())
    }
}

impl ReleaseRunner for FrontRunner {
    fn list_tools(&self, release: &HostedRelease) -> Result<(Value, Label), ExecutorError> {
        if let Some(listed) = lock(&self.tools).get(&release.release) {
            return Ok(listed.clone());
        }
        let host = self.host(release)?;
        let listed = lock(&host).rt.list_tools_labelled()?;
        lock(&self.tools).insert(release.release, listed.clone());
        Ok(listed)
    }

    fn run(&self, release: &HostedRelease, req: &CallRequest, fence: &mut Fence<'_>) -> RunResult {
        let host = self.host(release)?;
        let mut h = lock(&host);
        h.fenced_call(req, fence)
    }

    fn stop(&self, release: &HostedRelease) {
        lock(&self.hosts).remove(&release.release);
        lock(&self.tools).remove(&release.release);
        lock(&self.lists).retain(|(r, _), _| *r != release.release);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Debug builds (tests) may dispatch without the final-hop fence with
/// `GERMLINE_TEST_FENCE_OFF=1`, to show what it stops; release builds ignore it.
fn fence_switched_off() -> bool {
    germline_executor::test_switch("GERMLINE_TEST_FENCE_OFF")
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

/// What a consumer gets for every `tools/call` when the release's tool list is labelled
/// beyond its clearance (listed by a copy holding start-up data).
const LIST_WITHHELD: &str =
    "tools/call: this release's tools are listed from data this consumer's clearance does not cover";

/// Whether `tools/call` is refused to a consumer not cleared for the label of the tool list
/// (see [`Front::tools_call`]): with [`labels_enforced`]; debug builds (tests) may turn it
/// off alone with `GERMLINE_TEST_LISTED_LABEL_OFF=1` to show what it stops.
fn listed_label_enforced() -> bool {
    !germline_executor::test_switch("GERMLINE_TEST_LISTED_LABEL_OFF") && labels_enforced()
}

/// Whether answers carry labels and are held to the consumer's clearance: always in
/// release builds; debug builds (tests) may turn it off with
/// `GERMLINE_TEST_FRONT_LABELS_OFF=1` to show what it stops.
fn labels_enforced() -> bool {
    !germline_executor::test_switch("GERMLINE_TEST_FRONT_LABELS_OFF")
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

/// The wrapped release directory, absolute but not resolved: a deployment may point it
/// at another release later (see [`Front`]).
fn release_dir(target: &[String]) -> anyhow::Result<PathBuf> {
    let [first, rest @ ..] = target else { bail!("name a release directory after --") };
    let p = PathBuf::from(first);
    if rest.is_empty() && p.join(MANIFEST_FILE).is_file() {
        return std::path::absolute(&p).with_context(|| format!("release directory {}", p.display()));
    }
    bail!(
        "{first:?} is not a release directory (no {MANIFEST_FILE}); wrapping a bare command needs a signed \
         manifest declaring its destinations: build one with `germline release build`"
    )
}

/// `germline wrap`.
pub fn wrap(args: WrapArgs) -> anyhow::Result<()> {
    if let (Some(service), Some(name)) = (&args.service, &args.release) {
        if !args.target.is_empty() {
            bail!("--service relays to a release the service admitted: give no release directory");
        }
        let token = match (&args.token_file, std::env::var("GERMLINE_SERVICE_TOKEN")) {
            (Some(p), _) => std::fs::read_to_string(p).with_context(|| format!("--token-file {}", p.display()))?,
            (None, Ok(t)) => t,
            (None, Err(_)) => {
                bail!("--service needs the service's API token: --token-file FILE or GERMLINE_SERVICE_TOKEN")
            }
        };
        return bridge::run(service, name, token.trim());
    }
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
    let dispatch_policy = match (args.dispatch_policy, std::env::var("GERMLINE_DISPATCH_POLICY")) {
        (Some(p), _) => p,
        (None, Ok(p)) => p.parse().context("GERMLINE_DISPATCH_POLICY")?,
        (None, Err(_)) => DispatchPolicy::default(),
    };
    let front = Front::start(&release, policy, args.runtime, args.consumer, dispatch_policy)?;
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
            // The agent host is gone: nobody waits on this process any more.
            front.after_response();
            front.wait_verified();
            return Ok(());
        }
        let reply = if over {
            Some(error(Value::Null, INVALID_REQUEST, &format!("message over {limit} bytes")))
        } else {
            let trimmed = line.trim_ascii();
            if trimmed.is_empty() {
                continue;
            }
            front.handle_bytes("", trimmed)
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
