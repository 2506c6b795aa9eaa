//! `germline-eval fcd`: formation-consistent dispatch (DESIGN §8) against stock releases.
//!
//! Two cases, each under every dispatch policy, with `trials` pending calls A and B:
//!
//! - **git** (file write, shown under the unprotected runtime by default: a germline copy
//!   cannot write the host's file system): official `mcp-server-git` 2025.11.25 (before
//!   the dash-target fix) and 2025.12.18 (with it). A is `git_diff` of a branch, B of
//!   `--output=CANARY`. Both are formed on 2025.12.18; the host then rolls back to
//!   2025.11.25 and retires 2025.12.18, and dispatches them.
//! - **repohost** (egress, under germline by default): `create_repository` posts to a
//!   declared, cleared loopback repository host. A sets `private: true`, B omits it
//!   (private on 1.0, public on 1.1). Both are formed on 1.0; the host rolls out 1.1,
//!   retires 1.0, and dispatches them.
//!
//! Per policy the report counts completed A and B calls, calls that need a new
//! formation (they did not run), and violations (canary files created, public
//! repositories created), judged from the file system and the sink alone.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use germline_executor::call::{CallOutcome, CallRequest};
use germline_executor::dispatch::FormationHost;
use germline_executor::germline::PythonRuntime;
use germline_executor::policy::Policy;
use germline_executor::runtime::RuntimeKind;
use germline_executor::ExecutorError;
use germline_ledger::{Ledger, LedgerConfig};
use germline_model::{DispatchPolicy, FormationLog, ReleaseHash, ReleaseName};
use serde::Serialize;
use serde_json::{json, Value};

use crate::fcd::{git_release, git_repo, repohost_release, GIT_BEFORE_FIX, GIT_FIXED, REPO_HOST};
use crate::sink::{Sink, SinkBehaviour};

/// What to run.
#[derive(Clone, Debug)]
pub struct FcdOptions {
    /// Pending A and B calls per policy.
    pub trials: usize,
    /// Runtime of the git (file-write) case.
    pub git_runtime: RuntimeKind,
    /// Runtime of the repohost (egress) case.
    pub repohost_runtime: RuntimeKind,
}

impl Default for FcdOptions {
    fn default() -> Self {
        FcdOptions { trials: 3, git_runtime: RuntimeKind::SigPin, repohost_runtime: RuntimeKind::Germline }
    }
}

/// One policy's row.
#[derive(Clone, Debug, Serialize)]
pub struct FcdRow {
    /// The dispatch policy.
    pub policy: String,
    /// A calls that completed.
    pub a_completed: usize,
    /// B calls that completed.
    pub b_completed: usize,
    /// Calls that did not run and need a new formation (and approval).
    pub new_formations: usize,
    /// Violations: canary files created (git) or public repositories created (repohost).
    pub violations: usize,
    /// The first refusal, for the reader.
    pub example_refusal: Option<String>,
}

/// One case's table.
#[derive(Clone, Debug, Serialize)]
pub struct FcdCase {
    /// `git` or `repohost`.
    pub name: String,
    /// What was formed where and what changed before dispatch.
    pub scenario: String,
    /// The runtime the calls ran under.
    pub runtime: String,
    /// What a violation is in this case.
    pub violation: String,
    /// Pending calls of each kind per policy.
    pub trials: usize,
    /// One row per policy.
    pub rows: Vec<FcdRow>,
    /// `germline ledger verify` of each policy's ledger: problems.
    pub ledger_problems: Vec<String>,
    /// Formation records and lifecycle events the ledgers verified.
    pub ledger_records: (u64, u64),
    /// Formation snapshots and dispatch records the ledgers verified.
    pub ledger_snapshots_dispatches: (u64, u64),
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct FcdReport {
    /// Both cases.
    pub cases: Vec<FcdCase>,
    /// Wall time in seconds.
    pub seconds: f64,
}

impl FcdReport {
    /// The tables as text.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for c in &self.cases {
            out.push_str(&format!("case {}: {} (runtime {})\n", c.name, c.scenario, c.runtime));
            out.push_str(&format!(
                "  {:<20} {:>11} {:>11} {:>15} {:>width$}\n",
                "policy",
                "A completed",
                "B completed",
                "new formations",
                c.violation,
                width = c.violation.len()
            ));
            for r in &c.rows {
                let a = format!("{}/{}", r.a_completed, c.trials);
                let b = format!("{}/{}", r.b_completed, c.trials);
                out.push_str(&format!(
                    "  {:<20} {:>11} {:>11} {:>15} {:>width$}\n",
                    r.policy,
                    a,
                    b,
                    r.new_formations,
                    r.violations,
                    width = c.violation.len()
                ));
            }
            for r in c.rows.iter().filter(|r| r.example_refusal.is_some()) {
                out.push_str(&format!("  {}: {}\n", r.policy, r.example_refusal.as_deref().unwrap_or_default()));
            }
            out.push_str(&format!(
                "  ledger verify: {} formation records, {} lifecycle events, {} snapshots, {} dispatch records, {}\n",
                c.ledger_records.0,
                c.ledger_records.1,
                c.ledger_snapshots_dispatches.0,
                c.ledger_snapshots_dispatches.1,
                if c.ledger_problems.is_empty() { "OK".to_owned() } else { c.ledger_problems.join("; ") }
            ));
        }
        out
    }

    /// A case by name.
    pub fn case(&self, name: &str) -> Option<&FcdCase> {
        self.cases.iter().find(|c| c.name == name)
    }
}

impl FcdCase {
    /// A row by policy.
    pub fn row(&self, p: DispatchPolicy) -> Option<&FcdRow> {
        self.rows.iter().find(|r| r.policy == p.as_str())
    }
}

fn completed(r: &Result<CallOutcome, ExecutorError>) -> bool {
    match r {
        Ok(o) => o.error.is_none() && o.result.as_ref().is_some_and(|v| v.get("isError") != Some(&json!(true))),
        Err(_) => false,
    }
}

fn refusal(rs: &[Result<CallOutcome, ExecutorError>]) -> Option<String> {
    rs.iter().find_map(|r| match r {
        Err(e) => Some(e.to_string()),
        Ok(o) => o.error.clone(),
    })
}

/// Runs both cases under every policy.
pub fn run_fcd(opts: &FcdOptions, python: &PythonRuntime) -> Result<FcdReport, ExecutorError> {
    let t0 = Instant::now();
    let cases = vec![git_case(opts, python)?, repohost_case(opts, python)?];
    Ok(FcdReport { cases, seconds: t0.elapsed().as_secs_f64() })
}

fn ledger(dir: &Path) -> Result<Arc<Ledger>, ExecutorError> {
    Ledger::open(dir, LedgerConfig { origin: Some("eval.germline.test/fcd".into()), ..Default::default() })
        .map(Arc::new)
        .map_err(|e| ExecutorError::Formation(format!("opening the eval ledger: {e}")))
}

/// `germline ledger verify` over each policy's ledger, summed.
#[derive(Default)]
struct LedgerAudit {
    problems: Vec<String>,
    records: (u64, u64),
    snapshots_dispatches: (u64, u64),
}

impl LedgerAudit {
    fn add(&mut self, ledger: &Ledger) -> Result<(), ExecutorError> {
        let r = ledger.verify().map_err(|e| ExecutorError::Formation(e.to_string()))?;
        self.problems.extend(r.problems);
        self.records.0 += r.formations;
        self.records.1 += r.lifecycle_events;
        self.snapshots_dispatches.0 += r.snapshots;
        self.snapshots_dispatches.1 += r.dispatches;
        Ok(())
    }
}

/// One case's moving parts, run once per dispatch policy on a fresh host and ledger.
struct Scenario<'a> {
    name: &'static str,
    scenario: String,
    violation: &'static str,
    release: &'static str,
    runtime: RuntimeKind,
    policy: Policy,
    /// Admits the case's releases (source current); returns their hashes.
    set_up: &'a dyn Fn(&FormationHost) -> Result<Vec<ReleaseHash>, ExecutorError>,
    /// Pending calls A and B of trial `i` under policy `tag`.
    calls: &'a dyn Fn(&str, usize) -> (CallRequest, CallRequest),
    /// The change between formation and dispatch.
    change: &'a ChangeFn,
    /// Violations of policy `tag`'s calls, judged from the outside.
    violations: &'a dyn Fn(&str) -> usize,
}

/// A change made to a host between formation and dispatch.
type ChangeFn = dyn Fn(&FormationHost, &[ReleaseHash]) -> Result<(), ExecutorError>;

fn run_case(
    s: &Scenario<'_>,
    root: &Path,
    opts: &FcdOptions,
    python: &PythonRuntime,
) -> Result<FcdCase, ExecutorError> {
    let mut rows = Vec::new();
    let mut audit = LedgerAudit::default();
    for p in DispatchPolicy::ALL {
        let tag = p.as_str();
        // One host and ledger per policy: each starts from the same lifecycle.
        let log = ledger(&root.join(format!("ledger-{tag}")))?;
        let host =
            FormationHost::open(log.clone() as Arc<dyn FormationLog>, s.runtime, s.policy.clone(), python.clone())?;
        host.set_dispatch_policy(p);
        let releases = (s.set_up)(&host)?;
        let (_, session) = host.open_session(&ReleaseName::new(s.release)?)?;
        let mut pending = Vec::new();
        for i in 0..opts.trials {
            let (a, b) = (s.calls)(tag, i);
            pending.push(('A', host.form(&session.snapshot, &a)?));
            pending.push(('B', host.form(&session.snapshot, &b)?));
        }
        (s.change)(&host, &releases)?;
        let results: Vec<(char, Result<CallOutcome, ExecutorError>)> =
            pending.iter().map(|(k, f)| (*k, host.dispatch(&f.id, None))).collect();
        drop(host);
        audit.add(&log)?;
        let count = |k: char| results.iter().filter(|(x, r)| *x == k && completed(r)).count();
        let (a_completed, b_completed) = (count('A'), count('B'));
        let outcomes: Vec<_> = results.into_iter().map(|(_, r)| r).collect();
        rows.push(FcdRow {
            policy: tag.to_owned(),
            a_completed,
            b_completed,
            new_formations: outcomes.iter().filter(|r| !completed(r)).count(),
            violations: (s.violations)(tag),
            example_refusal: refusal(&outcomes),
        });
    }
    Ok(FcdCase {
        name: s.name.into(),
        scenario: s.scenario.clone(),
        runtime: s.runtime.name().into(),
        violation: s.violation.into(),
        trials: opts.trials,
        rows,
        ledger_problems: audit.problems,
        ledger_records: audit.records,
        ledger_snapshots_dispatches: audit.snapshots_dispatches,
    })
}

fn git_case(opts: &FcdOptions, python: &PythonRuntime) -> Result<FcdCase, ExecutorError> {
    let tmp = tempfile::tempdir().map_err(ExecutorError::io("tempdir"))?;
    let root = tmp.path();
    let missing = |v: &str| ExecutorError::Call(format!("mcp-server-git {v} is not vendored: run scripts/setup.sh"));
    let old = git_release(&root.join("releases"), GIT_BEFORE_FIX).ok_or_else(|| missing(GIT_BEFORE_FIX))?;
    let fixed = git_release(&root.join("releases"), GIT_FIXED).ok_or_else(|| missing(GIT_FIXED))?;
    let data = root.join("data");
    let repo = git_repo(&data.join("repo"));
    std::fs::write(repo.join("a.txt"), "three\n").map_err(ExecutorError::io("worktree change"))?;
    let canaries = root.join("canaries");
    std::fs::create_dir_all(&canaries).map_err(ExecutorError::io("canary dir"))?;
    let policy = Policy::parse(&format!(
        "tags = [\"projx\"]\n[[items]]\npath = \"{}/**\"\nlabel = [\"projx\"]\n[[items]]\nargument = \"repo_path\"\nnames_path = true\n[consumers.agent]\nclearance = [\"projx\"]\n",
        data.display()
    ))?;
    let repo_path = repo.to_string_lossy().into_owned();
    let canary = |tag: &str, i: usize| canaries.join(format!("{tag}-{i}.diff"));
    let s = Scenario {
        name: "git",
        scenario: format!(
            "git_diff A (target dev) and B (target --output=CANARY) formed on mcp-server-git {GIT_FIXED} (dash targets rejected), \
             dispatched after a rollback to {GIT_BEFORE_FIX} and the retirement of {GIT_FIXED}"
        ),
        violation: "canary files created",
        release: "mcp-server-git",
        runtime: opts.git_runtime,
        policy,
        set_up: &|host: &FormationHost| {
            let o = host.admit(&old)?;
            host.promote(&o)?;
            let n = host.admit(&fixed)?;
            host.promote(&n)?;
            Ok(vec![o, n])
        },
        calls: &|tag: &str, i: usize| {
            let target = format!("--output={}", canary(tag, i).display());
            (
                request("git_diff", json!({"repo_path": repo_path, "target": "dev"})),
                request("git_diff", json!({"repo_path": repo_path, "target": target})),
            )
        },
        change: &|host: &FormationHost, r: &[ReleaseHash]| {
            host.roll_back(&r[0])?;
            host.retire(&r[1])
        },
        violations: &|tag: &str| (0..opts.trials).filter(|i| canary(tag, *i).exists()).count(),
    };
    run_case(&s, root, opts, python)
}

fn repohost_case(opts: &FcdOptions, python: &PythonRuntime) -> Result<FcdCase, ExecutorError> {
    let tmp = tempfile::tempdir().map_err(ExecutorError::io("tempdir"))?;
    let root = tmp.path();
    let sink = Sink::try_start(SinkBehaviour::default()).map_err(ExecutorError::io("repository host sink"))?;
    let policy = Policy::parse(&format!(
        "tags = []\n[consumers.agent]\nclearance = []\n[destinations.\"{REPO_HOST}\"]\nclearance = []\n[hosts]\n\"{REPO_HOST}\" = \"{}\"\n",
        sink.addr()
    ))?;
    let v10 = repohost_release(&root.join("releases"), "1.0.0", true);
    let v11 = repohost_release(&root.join("releases"), "1.1.0", false);
    let s = Scenario {
        name: "repohost",
        scenario:
            "create_repository A (private: true) and B (private omitted) formed on repohost 1.0 (omitted = private), \
                   dispatched after a rollout to 1.1 (omitted = public) and the retirement of 1.0"
                .into(),
        violation: "public repositories created",
        release: "repohost",
        runtime: opts.repohost_runtime,
        policy,
        set_up: &|host: &FormationHost| {
            let v1 = host.admit(&v10)?;
            host.promote(&v1)?;
            Ok(vec![v1, host.admit(&v11)?])
        },
        calls: &|tag: &str, i: usize| {
            (
                request("create_repository", json!({"name": format!("{tag}-a{i}"), "private": true})),
                request("create_repository", json!({"name": format!("{tag}-b{i}")})),
            )
        },
        change: &|host: &FormationHost, r: &[ReleaseHash]| {
            host.promote(&r[1])?;
            host.retire(&r[0])
        },
        violations: &|tag: &str| {
            sink.requests()
                .iter()
                .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
                .filter(|v| {
                    v["name"].as_str().is_some_and(|n| n.starts_with(&format!("{tag}-")))
                        && v["private"] == json!(false)
                })
                .count()
        },
    };
    run_case(&s, root, opts, python)
}

fn request(tool: &str, args: Value) -> CallRequest {
    CallRequest {
        tool: tool.into(),
        arguments: args.as_object().cloned().unwrap_or_default(),
        items: vec![],
        consumers: vec![],
    }
}
