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
use germline_host::{data_dir, home, release_id, Host};

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

/// Starts the runtime of a release directory and opens the ledger ([`Host::open`]).
fn start_host(target: &RunTarget) -> anyhow::Result<Host> {
    Host::open(start(target)?, data_dir())
}

fn start(target: &RunTarget) -> anyhow::Result<Runtime> {
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
    rt.set_trigger_log(target.trigger_log.clone().unwrap_or_else(|| data_dir().join("triggers.jsonl")));
    Ok(rt)
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    p.canonicalize().with_context(|| format!("release directory {}", p.display()))
}

pub fn call(args: CallArgs) -> anyhow::Result<i32> {
    let arguments: serde_json::Value = serde_json::from_str(&args.args).context("--args must be a JSON object")?;
    let serde_json::Value::Object(arguments) = arguments else { bail!("--args must be a JSON object") };
    let req = CallRequest { tool: args.tool, arguments, items: args.items, consumers: args.consumers };
    let mut host = match start_host(&args.target) {
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
    // The command ends once its witness is recorded (SECURITY.md: the exit's time is one
    // reading of the replays' time per call).
    host.wait_verified(None);
    Ok(if outcome.error.is_some() { 1 } else { 0 })
}

pub fn session(args: SessionArgs) -> anyhow::Result<i32> {
    let file = std::fs::File::open(&args.calls).with_context(|| format!("opening {}", args.calls.display()))?;
    // A runtime that does not start is one JSON outcome on stdout, as for `call`, so a
    // caller reading the session's lines sees why (not only on stderr).
    let mut host = match start_host(&args.target) {
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
            // Verified off this session's calls: no outcome waits for a replay, whose time
            // the probe (holding items the session's consumers may not be cleared for)
            // chooses. A verdict refuses the release from the first call after it lands.
            host.after_call(&req, &outcome)?;
        }
    }
    // Nothing is lost at the end: the witnesses are recorded before the command exits.
    host.wait_verified(None);
    Ok(if failures > 0 { 1 } else { 0 })
}

fn print_outcome(o: &CallOutcome) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, o)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}
