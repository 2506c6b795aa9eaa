//! `germline bench`: per-call latency of a noop tool under germline with 1, 2 and 3
//! copies, beside the unprotected long-lived server (sig-pin) and a fresh process per
//! call, measured in one run so the ratios are comparable on a noisy machine.
//! `--breakdown` adds the median of each phase of a copy's life (fork, checks, set-up,
//! channel, MCP, answer, teardown); `--server` compares an official server under
//! germline with the same server bare on stdio.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use germline_executor::call::CallRequest;
use germline_executor::germline::PythonRuntime;
use germline_executor::mcp::McpClient;
use germline_executor::policy::Policy;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_executor::timings::CopyTimings;
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
    /// Print the median of each phase of a copy's life (where a call's time goes).
    #[arg(long)]
    pub breakdown: bool,
    /// Ready copies per germline for the pooled rows (at least 3, one per copy of the
    /// largest case).
    #[arg(long, default_value_t = 3)]
    pub pool: usize,
    /// Sustained load in the service path: this many concurrent clients calling
    /// `--releases` admitted releases through `germline serve` (HTTP API).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Releases admitted for `--concurrency`.
    #[arg(long, default_value_t = 20)]
    pub releases: usize,
    /// Germlines each release may run on at once under `--concurrency` (the policy's
    /// `[limits] lanes`; 1, the default, queues the calls to one release).
    #[arg(long, default_value_t = 1)]
    pub lanes: usize,
    /// Seconds of load for `--concurrency`.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
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
    /// Per call, each copy's phases (germline rows only).
    timings: Vec<Vec<CopyTimings>>,
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
    if let Some(c) = args.concurrency {
        return crate::bench_load::run(c, args.releases, args.seconds, args.pool, args.lanes);
    }
    let dir = tempfile::tempdir().context("temporary directory")?;
    let rel = dir.path().join("noop");
    let data = dir.path().join("data");
    for d in [&rel, &data.join("x"), &data.join("y")] {
        std::fs::create_dir_all(d)?;
    }
    // Each tool declares its warm-up call (manifest `warm_up`), as a release would whose
    // tools can run without data: a pooled copy then has the tool's own path warm, not
    // only the server's dispatch.
    std::fs::write(
        rel.join("germline.toml"),
        "[release]\nname = \"noop\"\nversion = \"1\"\nruntime = \"python\"\nfactory = \"noop:create_server\"\n\n\
         [tools.noop]\nwarm_up = {}\n\n[tools.noop2]\nhosts = [\"h1.example\"]\nwarm_up = {}\n\n\
         [tools.noop3]\nhosts = [\"h1.example\", \"h2.example\"]\nwarm_up = {}\n",
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
    let python = PythonRuntime::discover(&germline_host::home())?;
    println!("tool host: {}", python.describe());
    let mut rows = Vec::new();

    let cases: [(&str, &str, Vec<&Path>, usize); 3] =
        [("noop", "1 copy", vec![], 1), ("noop2", "2 copies", vec![&x], 2), ("noop3", "3 copies", vec![&x, &y], 3)];
    // From a full pool (each call waits, unmeasured, until the pool is full again: the
    // latency a call sees when calls come slower than the pool refills), then
    // with the pool off (fork per call). Sustained load is `--concurrency`.
    for pool in [args.pool.max(3), 0] {
        let mut policy = policy.clone();
        policy.limits.pool = pool;
        let mut rt = Runtime::start(RuntimeKind::Germline, &rel, policy, python.clone())?;
        for (tool, name, items, copies) in &cases {
            let req = CallRequest {
                tool: (*tool).into(),
                items: items.iter().map(|p| p.to_path_buf()).collect(),
                ..Default::default()
            };
            let o = rt.call(&req);
            anyhow::ensure!(o.error.is_none() && o.copies == *copies, "{name}: {:?} ({} copies)", o.error, o.copies);
            // A full pool: its refill done, so no copy is being readied (a call kills those
            // first) and every earlier copy is gone.
            let (samples, timings) = time_calls_pooled(&mut rt, &req, args.calls, pool)?;
            let how = if pool > 0 { "pooled" } else { "fork per call" };
            rows.push(Row { name: format!("germline, {name}, {how}"), copies: *copies, samples, timings });
        }
    }

    let mut pin = Runtime::start(RuntimeKind::SigPin, &rel, policy.clone(), python.clone())?;
    let req = CallRequest { tool: "noop".into(), ..Default::default() };
    rows.push(Row {
        name: "sig-pin (unprotected, long-lived)".into(),
        copies: 1,
        samples: time_calls(&mut pin, &req, args.calls)?.0,
        timings: Vec::new(),
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
    rows.push(Row { name: "fresh process per call".into(), copies: 1, samples: fresh, timings: Vec::new() });

    print_rows(&mut rows, args)?;
    if args.breakdown {
        print_breakdown(&rows);
    }
    Ok(())
}

/// The median of each phase: per copy (over every copy of every call) and per call (the
/// phase summed over the call's copies); what no phase covers (Plan, reading items,
/// labels) is the call's median minus the phases' sum.
fn print_breakdown(rows: &[Row]) {
    let rows: Vec<&Row> = rows.iter().filter(|r| !r.timings.is_empty()).collect();
    println!();
    print!("{:<24}", "phase (median ms)");
    for r in &rows {
        print!(" {:>13} {:>13}", format!("{}c per copy", r.copies), format!("{}c per call", r.copies));
    }
    println!();
    let median = |mut v: Vec<Duration>| {
        v.sort();
        percentile(&v, 0.5)
    };
    let names = CopyTimings::default().phases().map(|(n, _)| n);
    for (i, name) in names.iter().enumerate() {
        print!("{name:<24}");
        for r in &rows {
            let per_copy = median(r.timings.iter().flatten().map(|t| t.phases()[i].1).collect());
            let per_call = median(r.timings.iter().map(|c| c.iter().map(|t| t.phases()[i].1).sum()).collect());
            print!(" {:>13.3} {:>13.3}", ms(per_copy), ms(per_call));
        }
        println!();
    }
    print!("{:<24}", "sum of phases");
    for r in &rows {
        let per_copy = median(r.timings.iter().flatten().map(CopyTimings::total).collect());
        let per_call = median(r.timings.iter().map(|c| c.iter().map(CopyTimings::total).sum()).collect());
        print!(" {:>13.3} {:>13.3}", ms(per_copy), ms(per_call));
    }
    println!();
    print!("{:<24}", "call (wall clock)");
    for r in &rows {
        print!(" {:>13} {:>13.3}", "", ms(median(r.samples.clone())));
    }
    println!();
}

fn alias_tools() -> String {
    // noop2/noop3 are the same noop under names whose manifest entries declare hosts,
    // so Plan makes 2 and 3 copies.
    "\n_create = create_server\ndef create_server():\n    m = _create()\n    @m.tool()\n    def noop2() -> str:\n        return 'ok'\n    @m.tool()\n    def noop3() -> str:\n        return 'ok'\n    return m\n".into()
}

type Timed = (Vec<Duration>, Vec<Vec<CopyTimings>>);

fn time_calls(rt: &mut Runtime, req: &CallRequest, n: usize) -> anyhow::Result<Timed> {
    time_calls_pooled(rt, req, n, 0)
}

/// [`time_calls`], each call after `ready` pooled copies are ready (not measured).
fn time_calls_pooled(rt: &mut Runtime, req: &CallRequest, n: usize, ready: usize) -> anyhow::Result<Timed> {
    let mut out = Vec::with_capacity(n);
    let mut timings = Vec::new();
    for i in 0..n {
        if ready > 0 {
            let have = rt.wait_pool_ready(ready, Duration::from_secs(30))?;
            anyhow::ensure!(have >= ready, "call {i}: the pool holds {have} ready copies, {ready} wanted");
        }
        let t0 = Instant::now();
        let o = rt.call(req);
        out.push(t0.elapsed());
        anyhow::ensure!(o.error.is_none(), "call {i}: {:?}", o.error);
        if !o.timings.is_empty() {
            timings.push(o.timings);
        }
    }
    Ok((out, timings))
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
    let python = PythonRuntime::discover(&germline_host::home())?;
    println!("tool host: {}", python.describe());
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
    let mut bare = BareServer::start(&python, &rel)?;
    let mut pin = Runtime::start(RuntimeKind::SigPin, &rel, policy.clone(), python.clone())?;
    let pool = policy.limits.pool;
    let mut gl = Runtime::start(RuntimeKind::Germline, &rel, policy, python)?;
    bare.call(&req)?;
    for rt in [&mut pin, &mut gl] {
        let o = rt.call(&req);
        anyhow::ensure!(o.error.is_none(), "warm-up: {:?}", o.error);
    }
    let (mut a, mut b, mut c) =
        (Vec::with_capacity(args.calls), Vec::with_capacity(args.calls), Vec::with_capacity(args.calls));
    let mut timings = Vec::new();
    for _ in 0..args.calls {
        let t0 = Instant::now();
        bare.call(&req)?;
        a.push(t0.elapsed());
        b.extend(time_calls(&mut pin, &req, 1)?.0);
        let (g, t) = time_calls(&mut gl, &req, 1)?;
        c.extend(g);
        timings.extend(t);
        // A copy dies after its answer is returned and the pool refills after the call:
        // let both finish outside every measurement, so neither lands in the next round's
        // calls (each germline call is taken from a full pool; sustained load is
        // `--concurrency`). A release that is not pooled forks per call.
        gl.wait_pool_ready(pool, Duration::from_secs(30))?;
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut rows = vec![
        Row {
            name: format!("bare server (stdio, no relay) {server} {tool}"),
            copies: 1,
            samples: a,
            timings: Vec::new(),
        },
        Row { name: format!("sig-pin (unprotected) {server} {tool}"), copies: 1, samples: b, timings: Vec::new() },
        Row { name: format!("germline {server} {tool}"), copies: 1, samples: c, timings },
    ];
    for r in rows.iter_mut() {
        r.samples.sort();
    }
    println!("{:<50} {:>6} {:>10} {:>10} {:>10}", "configuration", "calls", "P50 ms", "P99 ms", "P50/bare");
    let mut json_rows = Vec::new();
    let bare_p50 = ms(percentile(&rows[0].samples, 0.5)).max(1e-9);
    for r in &rows {
        let (p50, p99) = (percentile(&r.samples, 0.5), percentile(&r.samples, 0.99));
        println!(
            "{:<50} {:>6} {:>10.2} {:>10.2} {:>10.2}",
            r.name,
            r.samples.len(),
            ms(p50),
            ms(p99),
            ms(p50) / bare_p50
        );
        json_rows
            .push(json!({"configuration": r.name, "calls": r.samples.len(), "p50_ms": ms(p50), "p99_ms": ms(p99)}));
    }
    let ratio =
        |row: usize, p: f64| ms(percentile(&rows[row].samples, p)) / ms(percentile(&rows[0].samples, p)).max(1e-9);
    println!("germline/bare: P50 {:.2}x, P99 {:.2}x", ratio(2, 0.5), ratio(2, 0.99));
    println!("sig-pin/bare:  P50 {:.2}x, P99 {:.2}x", ratio(1, 0.5), ratio(1, 0.99));
    json_rows.push(json!({"ratio_p50": ratio(2, 0.5), "ratio_p99": ratio(2, 0.99),
        "sig_pin_ratio_p50": ratio(1, 0.5), "sig_pin_ratio_p99": ratio(1, 0.99)}));
    if args.breakdown {
        print_breakdown(&rows);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&json_rows)?)?;
    }
    Ok(())
}

/// The reference a user would otherwise run: the unmodified server on stdio (the tool
/// host's `serve` mode: no twin shim, no proxy variables), driven by a plain JSON-RPC
/// client, with no relay and no watchdog.
struct BareServer {
    child: std::process::Child,
    client: McpClient<std::io::BufReader<std::process::ChildStdout>, std::process::ChildStdin>,
}

impl BareServer {
    fn start(python: &PythonRuntime, release_dir: &Path) -> anyhow::Result<BareServer> {
        let mut child = germline_executor::sigpin::serve_command(python, release_dir)
            .spawn()
            .context("starting the bare server")?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            anyhow::bail!("bare server pipes");
        };
        let mut client = McpClient::new(std::io::BufReader::new(stdout), stdin, 64 << 20);
        client.initialize()?;
        Ok(BareServer { child, client })
    }

    fn call(&mut self, req: &CallRequest) -> anyhow::Result<()> {
        let r = self.client.request("tools/call", json!({"name": req.tool, "arguments": req.arguments}))?;
        anyhow::ensure!(r.is_ok(), "bare server: {r:?}");
        Ok(())
    }
}

impl Drop for BareServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
