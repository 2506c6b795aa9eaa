//! `germline call` and `germline session`: run a release's tool calls from the command
//! line under any runtime.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use germline_executor::call::{CallOutcome, CallRequest, CallStatus};
use germline_executor::germline::PythonRuntime;
use germline_executor::policy::Policy;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_ledger::Ledger;

/// Where the release runs and under which policy.
#[derive(Args, Debug, Clone)]
pub struct RunTarget {
    /// Release directory (manifest `germline.toml` at its root).
    #[arg(long)]
    pub release: PathBuf,
    /// The deployer's policy file (TOML).
    #[arg(long)]
    pub policy: PathBuf,
    /// `germline` (default); baselines: `nosplit` (one copy, splitting off), `sig-pin`
    /// (one long-lived unprotected process), `sig-ifc` (+ per-call labels),
    /// `confined-ifc` (+ egress allowlist, read-only files), `fresh-ifc` (+ fresh process
    /// per call).
    #[arg(long, default_value = "germline")]
    pub runtime: RuntimeKind,
    /// Where triggers are appended as JSON lines [default: $GERMLINE_DATA_DIR/triggers.jsonl,
    /// or ./germline-data/triggers.jsonl].
    #[arg(long)]
    pub trigger_log: Option<PathBuf>,
    /// Ready copies kept per germline (default: the policy's `[limits] pool`, else 2);
    /// 0 forks the copies of each call as it comes.
    #[arg(long)]
    pub pool: Option<usize>,
}

/// `germline call`.
#[derive(Args, Debug)]
pub struct CallArgs {
    #[command(flatten)]
    pub target: RunTarget,
    /// Tool name.
    #[arg(long)]
    pub tool: String,
    /// Tool arguments as a JSON object.
    #[arg(long, default_value = "{}")]
    pub args: String,
    /// A file item of the call (repeatable).
    #[arg(long = "item")]
    pub items: Vec<PathBuf>,
    /// A consumer of the result (repeatable; default `agent`).
    #[arg(long = "consumer")]
    pub consumers: Vec<String>,
}

/// `germline session`.
#[derive(Args, Debug)]
pub struct SessionArgs {
    #[command(flatten)]
    pub target: RunTarget,
    /// JSON lines: {"tool", "arguments", "items", "consumers"} per call.
    #[arg(long)]
    pub calls: PathBuf,
}

/// Where germline keeps its shim and other run-time files.
pub fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("GERMLINE_HOME") {
        return PathBuf::from(h);
    }
    if let Some(c) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(c).join("germline");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/germline"),
        None => PathBuf::from("/var/cache/germline/home"),
    }
}

/// A runtime with its dampening ledger. The ledger is shared: only one process may open
/// the RocksDB, so the CLI opens it once per command and the service once per process.
pub struct Host {
    /// The runtime.
    pub rt: Runtime,
    ledger: Option<Arc<Ledger>>,
    data_dir: PathBuf,
}

/// Opens the embedded ledger under `data_dir` (the RocksDB default).
pub fn open_ledger(data_dir: &Path) -> anyhow::Result<Arc<Ledger>> {
    open_ledger_as(data_dir, None)
}

/// Opens the ledger under `data_dir`, with `origin` as its log origin when it is new
/// (`None`: the stored one, or a fresh random one).
pub fn open_ledger_as(data_dir: &Path, origin: Option<String>) -> anyhow::Result<Arc<Ledger>> {
    let dir = data_dir.join("ledger");
    Ok(Arc::new(
        Ledger::open(&dir, germline_ledger::LedgerConfig { origin, ..Default::default() }).with_context(|| {
            format!("opening the ledger in {} (is another germline process using it?)", dir.display())
        })?,
    ))
}

impl Host {
    /// Starts the runtime of a release directory and opens the ledger (CLI commands).
    pub fn start(target: &RunTarget) -> anyhow::Result<Host> {
        let rt = start(target)?;
        let ledger = match &rt {
            Runtime::Germline(_) => Some(open_ledger(&data_dir())?),
            _ => None,
        };
        Ok(Host::new(rt, ledger, data_dir()))
    }

    /// A host around a started runtime; dampening and witnesses go to `ledger` (germline
    /// runtimes), witness files under `data_dir`.
    pub fn new(rt: Runtime, ledger: Option<Arc<Ledger>>, data_dir: PathBuf) -> Host {
        Host { rt, ledger, data_dir }
    }

    /// One call under dampening: a suppressed release is refused (and the refusal still
    /// counts as a call); otherwise the call runs, its triggers are verified into
    /// witnesses after its result is out, and the call's event updates the penalty.
    pub fn call(&mut self, req: &CallRequest) -> anyhow::Result<CallOutcome> {
        let (Runtime::Germline(g), Some(ledger)) = (&mut self.rt, self.ledger.as_deref()) else {
            return Ok(self.rt.call(req));
        };
        let release = g.release;
        let state = ledger.dampening_state(&release)?;
        if state.suppressed {
            let after = ledger.record_call(&release, germline_ledger::Event::None)?;
            let witnesses: Vec<String> = ledger
                .entries_for_release(&release)?
                .into_iter()
                .filter(|(_, e)| e.kind == germline_ledger::EntryKind::Witness)
                .map(|(i, _)| format!("ledger entry {i}"))
                .collect();
            let fleet: Vec<String> = ledger
                .fleet_suppressions(&release)?
                .into_iter()
                .map(|f| {
                    format!("fleet suppression entry {} (peer witness {})", f.index, hex::encode(f.witness_sha256))
                })
                .collect();
            if !fleet.is_empty() {
                return Ok(CallOutcome::suppressed(format!(
                    "release {release} is suppressed: a peer's verified witness ({})",
                    fleet.join(", ")
                )));
            }
            return Ok(CallOutcome::suppressed(format!(
                "release {release} is suppressed: dampening penalty {:.0} (suppressed at 2000, usable again below 750); witnesses: {}",
                after.penalty,
                if witnesses.is_empty() { "none".to_string() } else { witnesses.join(", ") }
            )));
        }
        Ok(g.call(req))
    }

    /// A formed call (DESIGN §8): `fence` is checked on this runtime's release right
    /// before [`Host::call`] forks its copies; nothing runs when it refuses.
    pub fn fenced_call(
        &mut self,
        req: &CallRequest,
        fence: &mut germline_executor::dispatch::Fence<'_>,
    ) -> germline_executor::dispatch::RunResult {
        fence(self.rt.release())?;
        self.call(req).map_err(|e| germline_executor::ExecutorError::Call(format!("{e:#}")))
    }

    /// After the outcome is printed: verify triggers into witnesses, log them, and count
    /// the call's event.
    pub fn after_call(&mut self, req: &CallRequest, outcome: &CallOutcome) -> anyhow::Result<AfterCall> {
        let (Runtime::Germline(g), Some(ledger)) = (&mut self.rt, self.ledger.as_deref()) else {
            return Ok(AfterCall::default());
        };
        if refused_as_suppressed(outcome) {
            // Counted when it was refused; no copy ran, so nothing to witness.
            return Ok(AfterCall::default());
        }
        let release = g.release;
        let witnessed = witness(g, req, outcome, &self.data_dir);
        let mut after = AfterCall::default();
        let mut event =
            if outcome.triggers.is_empty() { germline_ledger::Event::None } else { germline_ledger::Event::Unverified };
        for w in &witnessed {
            // Ledger entries are JSON and bounded (C2SP bundles use 16-bit lengths): the
            // witness travels base64-encoded, or by hash and path when it is large (the
            // file itself is kept beside the ledger).
            use base64::Engine;
            use sha2::Digest;
            let sha = hex::encode(sha2::Sha256::digest(&w.bytes));
            let body = if w.bytes.len() <= 45_000 {
                serde_json::to_vec(&serde_json::json!({
                    "format": "germline-witness v2",
                    "witness_sha256": sha,
                    "witness": base64::engine::general_purpose::STANDARD.encode(&w.bytes),
                }))?
            } else {
                serde_json::to_vec(&serde_json::json!({
                    "format": "germline-witness v2",
                    "witness_sha256": sha,
                    "path": w.path,
                }))?
            };
            let receipt =
                ledger.append(germline_ledger::Entry::new(germline_ledger::EntryKind::Witness, release, body))?;
            after.witnesses.push(receipt.index);
            if w.verdict.weight(w.declared) >= 2000 {
                event = germline_ledger::Event::Verified;
            }
        }
        let before = ledger.dampening_state(&release)?;
        let state = ledger.record_call(&release, event)?;
        if state.suppressed {
            tracing::warn!(%release, penalty = state.penalty, "release suppressed by dampening");
        }
        after.newly_suppressed = state.suppressed && !before.suppressed;
        after.state = Some(state);
        if !after.witnesses.is_empty() {
            // Publish the witness now: peers see a log only up to its signed checkpoint.
            if let Err(e) = ledger.checkpoint() {
                tracing::error!("signing a checkpoint after a witness: {e}");
            }
        }
        Ok(after)
    }
}

/// What [`Host::after_call`] recorded.
#[derive(Debug, Default)]
pub struct AfterCall {
    /// Ledger indexes of the witnesses appended.
    pub witnesses: Vec<u64>,
    /// Whether this call's event suppressed the release.
    pub newly_suppressed: bool,
    /// Dampening state after the call's event (none for refused or non-germline calls).
    pub state: Option<germline_ledger::DampeningState>,
}

/// Whether the host refused the call because the release is suppressed: the status the
/// host set, never the error text (which may be whatever a copy answered).
///
/// Debug builds only: `GERMLINE_TEST_TYPED_OUTCOMES_OFF=1` decides by the text match this
/// replaced, so a test can show the release that dodges it.
pub fn refused_as_suppressed(outcome: &CallOutcome) -> bool {
    #[cfg(debug_assertions)]
    if std::env::var_os("GERMLINE_TEST_TYPED_OUTCOMES_OFF").is_some_and(|v| v == "1") {
        return outcome.error.as_deref().is_some_and(|e| e.contains("is suppressed"));
    }
    outcome.status == CallStatus::Suppressed
}

pub fn start(target: &RunTarget) -> anyhow::Result<Runtime> {
    let mut policy = Policy::load(&target.policy)?;
    if let Some(n) = target.pool {
        policy.limits.pool = n;
    }
    let python = PythonRuntime::discover(&home()).context("finding the Python tool host")?;
    let release = absolute(&target.release)?;
    let id = release_id(&release)?;
    let mut rt = Runtime::start(target.runtime, &release, policy, python)?;
    if let Runtime::Germline(g) = &mut rt {
        g.release = id;
    }
    let data_dir =
        std::env::var_os("GERMLINE_DATA_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("germline-data"));
    rt.set_trigger_log(target.trigger_log.clone().unwrap_or_else(|| data_dir.join("triggers.jsonl")));
    Ok(rt)
}

/// A release directory's identity: the SHA-256 of the canonical archive `germline
/// release build` makes of it, the same bytes a publisher signs and a host admits.
/// Archiving a large release takes seconds, so the hash is kept in the germline home under
/// the directory's state ([`germline_admission::directory_state`]: every file's size,
/// inode and change time), and a start with the directory unchanged reads it back.
pub fn release_id(dir: &Path) -> anyhow::Result<germline_model::ReleaseHash> {
    let state = germline_admission::directory_state(dir).with_context(|| format!("state of {}", dir.display()))?;
    let cached = home().join("release-ids").join(hex::encode(state));
    if let Some(id) = std::fs::read_to_string(&cached).ok().and_then(|s| s.trim().parse().ok()) {
        return Ok(id);
    }
    let id = archive_id(dir)?;
    // A cache that cannot be written only costs the next start its time.
    if let Some(parent) = cached.parent() {
        if std::fs::create_dir_all(parent).is_ok() {
            let tmp = parent.join(format!(".{}.{}", hex::encode(state), std::process::id()));
            if std::fs::write(&tmp, id.to_string()).is_ok() {
                let _ = std::fs::rename(&tmp, &cached);
            }
        }
    }
    Ok(id)
}

fn archive_id(dir: &Path) -> anyhow::Result<germline_model::ReleaseHash> {
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("release.tar.gz");
    let built = germline_admission::build_release_archive(dir, &out, &germline_admission::BuildOptions::default())
        .with_context(|| format!("canonical archive of {}", dir.display()))?;
    Ok(built.hash)
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    p.canonicalize().with_context(|| format!("release directory {}", p.display()))
}

pub fn call(args: CallArgs) -> anyhow::Result<i32> {
    let arguments: serde_json::Value = serde_json::from_str(&args.args).context("--args must be a JSON object")?;
    let serde_json::Value::Object(arguments) = arguments else { bail!("--args must be a JSON object") };
    let req = CallRequest { tool: args.tool, arguments, items: args.items, consumers: args.consumers };
    let mut host = match Host::start(&args.target) {
        Ok(h) => h,
        Err(e) => {
            let outcome = CallOutcome::failed(format!("{e:#}"));
            print_outcome(&outcome)?;
            return Ok(1);
        }
    };
    let outcome = host.call(&req)?;
    print_outcome(&outcome)?;
    host.after_call(&req, &outcome)?;
    Ok(if outcome.error.is_some() { 1 } else { 0 })
}

pub fn data_dir() -> PathBuf {
    std::env::var_os("GERMLINE_DATA_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("germline-data"))
}

/// Off the call's critical path (its result is already out): verify each trigger and
/// write signed witnesses. Failures are logged, never turned into a call failure.
fn witness(
    g: &mut germline_executor::call::GermlineRuntime,
    req: &CallRequest,
    outcome: &CallOutcome,
    data_dir: &Path,
) -> Vec<crate::verify_cmd::Witnessed> {
    if outcome.evidence.is_empty() {
        return Vec::new();
    }
    let mut items = std::collections::BTreeMap::new();
    // File items: those the host listed and those the call found itself (paths named by
    // arguments, files the tool declares); the replay checks each against its recorded
    // SHA-256, so a file changed since the call fails verification instead of lying.
    let recorded = outcome.evidence.iter().flat_map(|e| &e.items).map(|r| PathBuf::from(r.name.as_str()));
    for p in req.items.iter().cloned().chain(recorded.filter(|p| p.is_absolute())) {
        if let (Ok(name), Ok(bytes)) = (germline_model::ItemName::new(&p.to_string_lossy()), std::fs::read(&p)) {
            items.insert(name, bytes);
        }
    }
    for (k, v) in &req.arguments {
        if let (Ok(name), Ok(bytes)) = (germline_model::ItemName::new(&format!("arg:{k}")), serde_json::to_vec(v)) {
            items.insert(name, bytes);
        }
    }
    match crate::verify_cmd::witness_triggers(g, outcome, &items, data_dir) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!("could not verify triggers: {e:#}");
            Vec::new()
        }
    }
}

pub fn session(args: SessionArgs) -> anyhow::Result<i32> {
    let file = std::fs::File::open(&args.calls).with_context(|| format!("opening {}", args.calls.display()))?;
    // A runtime that does not start is one JSON outcome on stdout, as for `call`, so a
    // caller reading the session's lines sees why (not only on stderr).
    let mut host = match Host::start(&args.target) {
        Ok(h) => h,
        Err(e) => {
            print_outcome(&CallOutcome::failed(format!("{e:#}")))?;
            return Ok(1);
        }
    };
    let mut failures = 0;
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", args.calls.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let (outcome, req) = match serde_json::from_str::<CallRequest>(&line) {
            Ok(req) => (host.call(&req)?, Some(req)),
            Err(e) => (CallOutcome::failed(format!("line {}: {e}", n + 1)), None),
        };
        failures += usize::from(outcome.error.is_some());
        print_outcome(&outcome)?;
        if let Some(req) = req {
            host.after_call(&req, &outcome)?;
        }
    }
    Ok(if failures > 0 { 1 } else { 0 })
}

fn print_outcome(o: &CallOutcome) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, o)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}
