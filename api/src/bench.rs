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
}

/// `germline bench <what>`.
#[derive(clap::Subcommand, Debug)]
pub enum BenchWhat {
    /// Witness verification time (probe and control replays) and witness file checks.
    Verify(crate::bench_verify::BenchVerifyArgs),
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
    if let Some(BenchWhat::Verify(v)) = &args.what {
        return crate::bench_verify::run(v);
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
