//! `germline bench`: per-call latency of a noop tool under germline with 1, 2 and 3
//! copies, beside the unprotected long-lived server (sig-pin) and a fresh process per
//! call, measured in one run so the ratios are comparable on a noisy machine.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use germline_executor::call::CallRequest;
use germline_executor::germline::PythonRuntime;
use germline_executor::policy::Policy;
use germline_executor::runtime::{Runtime, RuntimeKind};
use serde_json::json;

/// `germline bench` options.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Calls per germline and sig-pin configuration (at least 200 recommended).
    #[arg(long, default_value_t = 200)]
    pub calls: usize,
    /// Calls for the fresh-process-per-call reference (each starts an interpreter).
    #[arg(long, default_value_t = 20)]
    pub fresh_calls: usize,
    /// Write the figures as JSON here too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Benchmark something else than per-call latency.
    #[command(subcommand)]
    pub what: Option<BenchWhat>,
    /// Instead of the noop release, an unmodified official server (vendored by
    /// `scripts/setup.sh`): unprotected vs germline, interleaved call by call.
    #[arg(long, value_parser = ["time", "sqlite", "git"])]
    pub server: Option<String>,
}

/// `germline bench <what>`.
#[derive(clap::Subcommand, Debug)]
pub enum BenchWhat {
    /// Witness verification time (probe and control replays) and witness file checks.
    Verify(crate::bench_verify::BenchVerifyArgs),
    /// Ledger append throughput with durable group commit, and proof latency.
    Ledger(germline_ledger::cli::BenchLedgerArgs),
}

const NOOP: &str = r#"
from mcp.server.fastmcp import FastMCP
def create_server():
    m = FastMCP("noop")
    @m.tool()
    def noop() -> str:
        return "ok"
    return m
"#;

struct Row {
    name: String,
    copies: usize,
    samples: Vec<Duration>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs the benchmark and prints the table.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    match &args.what {
        Some(BenchWhat::Verify(v)) => return crate::bench_verify::run(v),
        Some(BenchWhat::Ledger(_)) => anyhow::bail!("dispatched by main"),
        None => {}
    }
    if let Some(server) = &args.server {
        return run_server(server, args);
    }
    let dir = tempfile::tempdir().context("temporary directory")?;
    let rel = dir.path().join("noop");
    let data = dir.path().join("data");
    for d in [&rel, &data.join("x"), &data.join("y")] {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(
        rel.join("germline.toml"),
        "[release]\nname = \"noop\"\nversion = \"1\"\nruntime = \"python\"\nfactory = \"noop:create_server\"\n\n[tools.noop2]\nhosts = [\"h1.example\"]\n\n[tools.noop3]\nhosts = [\"h1.example\", \"h2.example\"]\n",
    )?;
    std::fs::write(rel.join("noop.py"), NOOP.to_owned() + &alias_tools())?;
    let x = data.join("x/item.txt");
    let y = data.join("y/item.txt");
    std::fs::write(&x, "x")?;
    std::fs::write(&y, "y")?;
    let policy_text = format!(
        "tags = [\"x\", \"y\"]\n[[items]]\npath = \"{d}/x/**\"\nlabel = [\"x\"]\n[[items]]\npath = \"{d}/y/**\"\nlabel = [\"y\"]\n\
         [destinations.\"h1.example\"]\nclearance = []\n[destinations.\"h2.example\"]\nclearance = [\"x\"]\n\
         [consumers.agent]\nclearance = [\"x\", \"y\"]\n",
        d = data.display()
    );
    let policy = Policy::parse(&policy_text)?;
    let python = PythonRuntime::discover(&crate::exec_cmd::home())?;
    let mut rows = Vec::new();

    let cases: [(&str, &str, Vec<&Path>, usize); 3] = [
        ("noop", "germline, 1 copy", vec![], 1),
        ("noop2", "germline, 2 copies", vec![&x], 2),
        ("noop3", "germline, 3 copies", vec![&x, &y], 3),
    ];
    let mut rt = Runtime::start(RuntimeKind::Germline, &rel, policy.clone(), python.clone())?;
    for (tool, name, items, copies) in cases {
        let req = CallRequest {
            tool: tool.into(),
            items: items.iter().map(|p| p.to_path_buf()).collect(),
            ..Default::default()
        };
        let o = rt.call(&req);
        anyhow::ensure!(o.error.is_none() && o.copies == copies, "{name}: {:?} ({} copies)", o.error, o.copies);
        rows.push(Row { name: name.into(), copies, samples: time_calls(&mut rt, &req, args.calls)? });
    }
    drop(rt);

    let mut pin = Runtime::start(RuntimeKind::SigPin, &rel, policy.clone(), python.clone())?;
    let req = CallRequest { tool: "noop".into(), ..Default::default() };
    rows.push(Row {
        name: "sig-pin (unprotected, long-lived)".into(),
        copies: 1,
        samples: time_calls(&mut pin, &req, args.calls)?,
    });
    drop(pin);

    let mut fresh = Vec::new();
    for _ in 0..args.fresh_calls {
        let t0 = Instant::now();
        let mut rt = Runtime::start(RuntimeKind::SigPin, &rel, policy.clone(), python.clone())?;
        let o = rt.call(&req);
        drop(rt);
        anyhow::ensure!(o.error.is_none(), "fresh process: {:?}", o.error);
        fresh.push(t0.elapsed());
    }
    rows.push(Row { name: "fresh process per call".into(), copies: 1, samples: fresh });

    print_rows(&mut rows, args)
}

fn alias_tools() -> String {
    // noop2/noop3 are the same noop under names whose manifest entries declare hosts,
    // so Plan makes 2 and 3 copies.
    "\n_create = create_server\ndef create_server():\n    m = _create()\n    @m.tool()\n    def noop2() -> str:\n        return 'ok'\n    @m.tool()\n    def noop3() -> str:\n        return 'ok'\n    return m\n".into()
}

fn time_calls(rt: &mut Runtime, req: &CallRequest, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t0 = Instant::now();
        let o = rt.call(req);
        out.push(t0.elapsed());
        anyhow::ensure!(o.error.is_none(), "call {i}: {:?}", o.error);
    }
    Ok(out)
}

fn print_rows(rows: &mut [Row], args: &BenchArgs) -> anyhow::Result<()> {
    for r in rows.iter_mut() {
        r.samples.sort();
    }
    let p50 =
        |name: &str, rows: &[Row]| rows.iter().find(|r| r.name.starts_with(name)).map(|r| percentile(&r.samples, 0.5));
    let pin = p50("sig-pin", rows).unwrap_or(Duration::from_millis(1));
    let fresh = p50("fresh", rows).unwrap_or(Duration::from_millis(1));
    println!(
        "{:<36} {:>6} {:>6} {:>10} {:>10} {:>12} {:>12}",
        "configuration", "copies", "calls", "P50 ms", "P99 ms", "P50/sig-pin", "P50/fresh"
    );
    let mut json_rows = Vec::new();
    for r in rows.iter() {
        let (a, b) = (percentile(&r.samples, 0.5), percentile(&r.samples, 0.99));
        println!(
            "{:<36} {:>6} {:>6} {:>10.2} {:>10.2} {:>12.2} {:>12.3}",
            r.name,
            r.copies,
            r.samples.len(),
            ms(a),
            ms(b),
            a.as_secs_f64() / pin.as_secs_f64(),
            a.as_secs_f64() / fresh.as_secs_f64()
        );
        json_rows.push(json!({"configuration": r.name, "copies": r.copies, "calls": r.samples.len(), "p50_ms": ms(a), "p99_ms": ms(b)}));
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&json_rows)?)?;
    }
    Ok(())
}

/// Where `scripts/setup.sh` vendors the official servers.
fn real_servers() -> std::path::PathBuf {
    std::env::var_os("GERMLINE_REAL_SERVERS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("/var/cache/germline/real-servers"))
}

fn manifest_of(server: &str) -> &'static str {
    match server {
        "time" => include_str!("../../tests/real_servers/time.toml"),
        "sqlite" => include_str!("../../tests/real_servers/sqlite.toml"),
        _ => include_str!("../../tests/real_servers/git.toml"),
    }
}

fn sh(cmd: &mut std::process::Command) -> anyhow::Result<()> {
    let st = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    anyhow::ensure!(st.success(), "{cmd:?} failed");
    Ok(())
}

/// `--server`: one official server under the unprotected long-lived process and under
/// germline (its data a labelled item), calls interleaved so noise hits both alike.
fn run_server(server: &str, args: &BenchArgs) -> anyhow::Result<()> {
    let vendored = real_servers().join(server);
    anyhow::ensure!(vendored.join(".complete").is_file(), "{} is missing: run scripts/setup.sh", vendored.display());
    let dir = tempfile::tempdir().context("temporary directory")?;
    let rel = dir.path().join(server);
    let data = dir.path().join("data");
    std::fs::create_dir_all(&rel)?;
    std::fs::create_dir_all(&data)?;
    let vendor = vendored.join("vendor");
    if sh(std::process::Command::new("cp").arg("-rl").arg(&vendor).arg(&rel)).is_err() {
        let _ = std::fs::remove_dir_all(rel.join("vendor"));
        sh(std::process::Command::new("cp").arg("-r").arg(&vendor).arg(&rel))?;
    }
    let python = PythonRuntime::discover(&crate::exec_cmd::home())?;
    let db = data.join("bench.db");
    let repo = data.join("repo");
    let (tool, arguments, extra_policy) = match server {
        "time" => (
            "convert_time",
            json!({"source_timezone": "Europe/London", "time": "12:30", "target_timezone": "Asia/Tokyo"}),
            "",
        ),
        "sqlite" => {
            sh(std::process::Command::new(&python.python).arg("-c").arg(
                "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\nc.execute('create table t(id integer primary key, v text)')\n\
                 c.executemany('insert into t(v) values (?)', [('v%d' % i,) for i in range(100)])\nc.commit()",
            ).arg(&db))?;
            ("read_query", json!({"query": "SELECT * FROM t WHERE id < 20"}), "")
        }
        _ => {
            std::fs::create_dir_all(&repo)?;
            let git = |a: &[&str]| sh(std::process::Command::new("git").args(a).current_dir(&repo));
            git(&["init", "-q"])?;
            git(&["config", "user.email", "bench@example.org"])?;
            git(&["config", "user.name", "bench"])?;
            for i in 0..10 {
                std::fs::write(repo.join("f.txt"), format!("{i}\n"))?;
                git(&["add", "."])?;
                git(&["commit", "-q", "-m", &format!("c{i}")])?;
            }
            (
                "git_log",
                json!({"repo_path": repo, "max_count": 5}),
                "[[items]]\nargument = \"repo_path\"\nnames_path = true\n",
            )
        }
    };
    std::fs::write(rel.join("germline.toml"), manifest_of(server).replace("{DB}", &db.to_string_lossy()))?;
    let policy = Policy::parse(&format!(
        "tags = [\"x\"]\n[[items]]\npath = \"{}/**\"\nlabel = [\"x\"]\n{extra_policy}[consumers.agent]\nclearance = [\"x\"]\n",
        data.display()
    ))?;
    let serde_json::Value::Object(arguments) = arguments else { anyhow::bail!("arguments") };
    let req = CallRequest { tool: tool.into(), arguments, ..Default::default() };
    let mut pin = Runtime::start(RuntimeKind::SigPin, &rel, policy.clone(), python.clone())?;
    let mut gl = Runtime::start(RuntimeKind::Germline, &rel, policy, python)?;
    for rt in [&mut pin, &mut gl] {
        let o = rt.call(&req);
        anyhow::ensure!(o.error.is_none(), "warm-up: {:?}", o.error);
    }
    let (mut a, mut b) = (Vec::with_capacity(args.calls), Vec::with_capacity(args.calls));
    for _ in 0..args.calls {
        a.extend(time_calls(&mut pin, &req, 1)?);
        b.extend(time_calls(&mut gl, &req, 1)?);
    }
    let mut rows = vec![
        Row { name: format!("sig-pin (unprotected) {server} {tool}"), copies: 1, samples: a },
        Row { name: format!("germline {server} {tool}"), copies: 1, samples: b },
    ];
    for r in rows.iter_mut() {
        r.samples.sort();
    }
    println!("{:<44} {:>6} {:>10} {:>10}", "configuration", "calls", "P50 ms", "P99 ms");
    let mut json_rows = Vec::new();
    for r in &rows {
        let (p50, p99) = (percentile(&r.samples, 0.5), percentile(&r.samples, 0.99));
        println!("{:<44} {:>6} {:>10.2} {:>10.2}", r.name, r.samples.len(), ms(p50), ms(p99));
        json_rows
            .push(json!({"configuration": r.name, "calls": r.samples.len(), "p50_ms": ms(p50), "p99_ms": ms(p99)}));
    }
    let ratio = |p: f64| ms(percentile(&rows[1].samples, p)) / ms(percentile(&rows[0].samples, p)).max(1e-9);
    println!("germline/unprotected: P50 {:.2}x, P99 {:.2}x", ratio(0.5), ratio(0.99));
    json_rows.push(json!({"ratio_p50": ratio(0.5), "ratio_p99": ratio(0.99)}));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&json_rows)?)?;
    }
    Ok(())
}
