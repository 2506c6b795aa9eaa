//! `germline call` and `germline session`: run a release's tool calls from the command
//! line under any runtime.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use germline_executor::call::{CallOutcome, CallRequest};
use germline_executor::germline::PythonRuntime;
use germline_executor::policy::Policy;
use germline_executor::runtime::{Runtime, RuntimeKind};

/// Where the release runs and under which policy.
#[derive(Args, Debug, Clone)]
pub struct RunTarget {
    /// Release directory (manifest `germline.toml` at its root).
    #[arg(long)]
    pub release: PathBuf,
    /// The deployer's policy file (TOML).
    #[arg(long)]
    pub policy: PathBuf,
    /// `germline` (default), `nosplit` (one copy, splitting off) or `sig-pin` (one
    /// long-lived unprotected process).
    #[arg(long, default_value = "germline")]
    pub runtime: RuntimeKind,
    /// Where triggers are appended as JSON lines [default: $GERMLINE_DATA_DIR/triggers.jsonl,
    /// or ./germline-data/triggers.jsonl].
    #[arg(long)]
    pub trigger_log: Option<PathBuf>,
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

pub fn start(target: &RunTarget) -> anyhow::Result<Runtime> {
    let policy = Policy::load(&target.policy)?;
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
pub fn release_id(dir: &Path) -> anyhow::Result<germline_model::ReleaseHash> {
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
    let mut rt = match start(&args.target) {
        Ok(rt) => rt,
        Err(e) => {
            let outcome = CallOutcome::failed(format!("{e:#}"));
            print_outcome(&outcome)?;
            return Ok(1);
        }
    };
    let outcome = rt.call(&req);
    print_outcome(&outcome)?;
    witness(&mut rt, &req, &outcome);
    Ok(if outcome.error.is_some() { 1 } else { 0 })
}

fn data_dir() -> PathBuf {
    std::env::var_os("GERMLINE_DATA_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("germline-data"))
}

/// Off the call's critical path (its result is already out): verify each trigger and
/// write signed witnesses. Failures are logged, never turned into a call failure.
fn witness(rt: &mut Runtime, req: &CallRequest, outcome: &CallOutcome) {
    let Runtime::Germline(g) = rt else { return };
    if outcome.evidence.is_empty() {
        return;
    }
    let mut items = std::collections::BTreeMap::new();
    for p in &req.items {
        if let (Ok(name), Ok(bytes)) = (germline_model::ItemName::new(&p.to_string_lossy()), std::fs::read(p)) {
            items.insert(name, bytes);
        }
    }
    for (k, v) in &req.arguments {
        if let (Ok(name), Ok(bytes)) = (germline_model::ItemName::new(&format!("arg:{k}")), serde_json::to_vec(v)) {
            items.insert(name, bytes);
        }
    }
    if let Err(e) = crate::verify_cmd::witness_triggers(g, outcome, &items, &data_dir()) {
        tracing::error!("could not verify triggers: {e:#}");
    }
}

pub fn session(args: SessionArgs) -> anyhow::Result<i32> {
    let file = std::fs::File::open(&args.calls).with_context(|| format!("opening {}", args.calls.display()))?;
    let mut rt = start(&args.target)?;
    let mut failures = 0;
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", args.calls.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let (outcome, req) = match serde_json::from_str::<CallRequest>(&line) {
            Ok(req) => (rt.call(&req), Some(req)),
            Err(e) => (CallOutcome::failed(format!("line {}: {e}", n + 1)), None),
        };
        failures += usize::from(outcome.error.is_some());
        print_outcome(&outcome)?;
        if let Some(req) = req {
            witness(&mut rt, &req, &outcome);
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
