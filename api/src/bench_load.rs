//! `germline bench --concurrency C --releases R`: sustained calls through the service
//! path. R noop releases are built, published in one local TUF repository and admitted
//! into a `germline serve` child process (loopback only); C client threads then call them
//! round-robin over HTTP for a fixed time. Prints calls per second and the latency
//! percentiles the clients saw, the CPU time per call, and the memory of the service's processes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

const NOOP: &str = "from mcp.server.fastmcp import FastMCP\n\
def create_server():\n    m = FastMCP('noop')\n    @m.tool()\n    def noop() -> str:\n        return 'ok'\n    return m\n";

/// The service child; killed when the bench ends, pass or fail.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn germline(exe: &Path, dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(exe).args(args).current_dir(dir).output().with_context(|| format!("germline {args:?}"))?;
    anyhow::ensure!(
        out.status.success(),
        "germline {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Builds, publishes and admits `releases` noop releases, then runs the load.
pub fn run(clients: usize, releases: usize, seconds: u64, pool: usize, lanes: usize) -> anyhow::Result<()> {
    anyhow::ensure!(clients > 0 && releases > 0, "--concurrency and --releases must be positive");
    let exe = std::env::current_exe().context("this executable")?;
    let tmp = tempfile::tempdir().context("temporary directory")?;
    let dir = tmp.path();
    let repo = dir.join("repo");
    let keys = dir.join("keys");
    germline(&exe, dir, &["repo", "init", &repo.to_string_lossy(), "--keys", &keys.to_string_lossy()])?;
    let mut names = Vec::new();
    for i in 0..releases {
        let name = format!("noop{i}");
        let rel = dir.join(&name);
        std::fs::create_dir_all(&rel)?;
        std::fs::write(
            rel.join("germline.toml"),
            format!("[release]\nname = \"{name}\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n"),
        )?;
        std::fs::write(rel.join("server.py"), NOOP)?;
        let archive = format!("{name}.tar.gz");
        germline(&exe, dir, &["release", "build", &rel.to_string_lossy(), "--out", &archive])?;
        germline(&exe, dir, &["repo", "add", &repo.to_string_lossy(), &archive, "--keys", &keys.to_string_lossy()])?;
        names.push(name);
    }
    let root = std::fs::read_to_string(repo.join("metadata/1.root.json"))?;
    let data = dir.join("data");
    let config = dir.join("serve.toml");
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, format!("{}[limits]\nlanes = {lanes}\n", crate::service::policies::DEFAULT_POLICY))?;
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\npolicy = \"{}\"\npool = {pool}\nmax_session_calls = 10000\n\
             trust.allow_caller_roots = true\n",
            data.display(),
            policy.display()
        ),
    )?;
    if let Ok(python) = germline_executor::germline::PythonRuntime::discover(&germline_host::home()) {
        println!("tool host: {}", python.describe());
    }
    let (served, port) = serve(&exe, dir, &config)?;
    // Before any germline starts: they and their copies inherit the accounting group.
    let account = CpuAccount::new(served.0.id());
    let token = std::fs::read_to_string(data.join("api-token")).context("the service's token")?;
    let token = token.trim().to_owned();
    let base = format!("http://127.0.0.1:{port}");
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
    let mut hashes = Vec::new();
    let t_admit = Instant::now();
    for name in &names {
        let body = json!({"repo": repo, "root": root, "target": name});
        let r = post(&agent, &format!("{base}/v1/releases/tuf"), &token, &body)
            .with_context(|| format!("admitting {name}"))?;
        hashes.push(r["hash"].as_str().context("admission answer without a hash")?.to_owned());
    }
    eprintln!("admitted {releases} releases in {:.1} s", t_admit.elapsed().as_secs_f64());
    let call = |agent: &ureq::Agent, hash: &str| -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        let r = post(agent, &format!("{base}/v1/releases/{hash}/calls"), &token, &json!({"tool": "noop"}))?;
        anyhow::ensure!(r["error"].is_null(), "call failed: {r}");
        Ok(t0.elapsed())
    };
    for h in &hashes {
        call(&agent, h)?;
    }
    // `clients` threads calling the releases round-robin until `until`; every latency, sorted.
    let load = |until: Instant| -> anyhow::Result<Vec<Duration>> {
        let results: Vec<anyhow::Result<Vec<Duration>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..clients)
                .map(|c| {
                    let (hashes, call, agent) = (&hashes, &call, agent.clone());
                    s.spawn(move || {
                        let mut lat = Vec::new();
                        let mut k = c;
                        // Bounded in time and count.
                        while Instant::now() < until && lat.len() < 1_000_000 {
                            lat.push(call(&agent, &hashes[k % hashes.len()])?);
                            k += clients;
                        }
                        Ok(lat)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("client panicked")))).collect()
        });
        let mut lat = Vec::new();
        for r in results {
            lat.extend(r?);
        }
        lat.sort();
        Ok(lat)
    };
    // The same load for a while first, unmeasured: the germlines it needs (more than one
    // per release where calls to one release overlap) are started before the measurement.
    load(Instant::now() + Duration::from_secs((seconds / 4).clamp(3, 15)))?;
    // Let every pool refill after the warm-up.
    std::thread::sleep(Duration::from_secs(3));
    let memory_before = service_memory(served.0.id() as i32);
    let cpu_before = machine_cpu();
    let (service0, broker0) = (account.as_ref().and_then(CpuAccount::usage), process_cpu(served.0.id()));
    let t0 = Instant::now();
    let lat = load(t0 + Duration::from_secs(seconds))?;
    let wall = t0.elapsed();
    let cpu_after = machine_cpu();
    let (service1, broker1) = (account.as_ref().and_then(CpuAccount::usage), process_cpu(served.0.id()));
    let pct = |p: f64| lat.get(((lat.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied().unwrap_or_default();
    println!(
        "service path, pool {pool}, lanes {lanes}: {clients} clients, {releases} releases: {} calls in {:.1} s = {:.1} calls/s; \
         P50 {:.2} ms, P99 {:.2} ms",
        lat.len(),
        wall.as_secs_f64(),
        lat.len() as f64 / wall.as_secs_f64(),
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3
    );
    // Where the time goes under load: the whole machine's busy CPU time per call (this
    // client included), against the cores there are.
    if let (Some((busy0, all0)), Some((busy1, all1))) = (cpu_before, cpu_after) {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let busy = (busy1 - busy0) as f64 / (all1 - all0).max(1) as f64;
        let per_call_ms = busy * cores as f64 * wall.as_secs_f64() * 1e3 / lat.len().max(1) as f64;
        println!(
            "CPU: {:.1} ms busy per call, machine {:.0}% busy ({} cores): at most {:.0} calls/s at this cost",
            per_call_ms,
            100.0 * busy,
            cores,
            cores as f64 * 1e3 / per_call_ms.max(1e-9)
        );
    }
    if let (Some(s0), Some(s1), Some(b0), Some(b1)) = (service0, service1, broker0, broker1) {
        let calls = lat.len().max(1) as f64;
        let all = (s1 - s0).as_secs_f64() * 1e3 / calls;
        let broker = (b1 - b0).as_secs_f64() * 1e3 / calls;
        println!(
            "CPU of the service per call: {all:.1} ms: broker process {broker:.1} ms (HTTP, ledger, broker threads, \
             view helpers), germlines and copies {:.1} ms (forks, copies' start, MCP, answer, exit)",
            all - broker
        );
    }
    if let Some((germlines, copies)) = memory_before {
        let mib = |v: &[Memory], f: fn(&Memory) -> f64| median_kib(&v.iter().map(f).collect::<Vec<_>>()) / 1024.0;
        println!(
            "memory (idle): {} germlines, median PSS {:.1} MiB each; {} idle pooled copies, median PSS {:.2} MiB, \
             private {:.2} MiB each (what a copy adds)",
            germlines.len(),
            mib(&germlines, |m| m.pss),
            copies.len(),
            mib(&copies, |m| m.pss),
            mib(&copies, |m| m.private)
        );
    }
    drop(served);
    Ok(())
}

fn post(agent: &ureq::Agent, url: &str, token: &str, body: &Value) -> anyhow::Result<Value> {
    let sent = agent
        .post(url)
        .set("authorization", &format!("Bearer {token}"))
        .set("content-type", "application/json")
        .send_string(&body.to_string());
    let text = match sent {
        Ok(r) => r.into_string()?,
        // The service's answer says why (its JSON error), not only the status.
        Err(ureq::Error::Status(code, r)) => {
            anyhow::bail!("HTTP {code}: {}", r.into_string().unwrap_or_default())
        }
        Err(e) => return Err(e.into()),
    };
    Ok(serde_json::from_str(&text)?)
}

fn serve(exe: &Path, dir: &Path, config: &Path) -> anyhow::Result<(Served, u16)> {
    let mut child = Command::new(exe)
        .args(["serve", "--config"])
        .arg(config)
        .current_dir(dir)
        .env_remove("GERMLINE_DATA_DIR")
        .env_remove("GERMLINE_LISTEN")
        .env_remove("GERMLINE_POOL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("germline serve")?;
    let mut err = BufReader::new(child.stderr.take().context("stderr")?);
    let served = Served(child);
    let mut line = String::new();
    let mut seen = String::new();
    let port = loop {
        line.clear();
        anyhow::ensure!(err.read_line(&mut line)? > 0, "the service exited: {seen}");
        seen.push_str(&line);
        if let Some(rest) = line.trim().strip_prefix("germline: serving the API on http://127.0.0.1:") {
            break rest.parse::<u16>().context("port")?;
        }
    };
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut line = String::new();
        while err.read_line(&mut line).is_ok_and(|n| n > 0) {
            line.clear();
        }
    });
    Ok((served, port))
}

/// Memory of the service's germlines and idle pooled copies: germlines are the
/// processes named `python…` whose parent is not a germline; pooled copies are the
/// stopped children of a germline.
fn service_memory(service: i32) -> Option<(Vec<Memory>, Vec<Memory>)> {
    let mut procs: Vec<(i32, i32, String, char)> = Vec::new();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let comm = stat[open + 1..close].to_owned();
        let rest: Vec<&str> = stat[close + 2..].split(' ').collect();
        let (Some(state), Some(ppid)) = (rest.first().and_then(|s| s.chars().next()), rest.get(1)) else { continue };
        procs.push((pid, ppid.parse().unwrap_or(0), comm, state));
    }
    let descends = |mut p: i32| {
        for _ in 0..64 {
            if p == service {
                return true;
            }
            match procs.iter().find(|q| q.0 == p) {
                Some(q) => p = q.1,
                None => return false,
            }
        }
        false
    };
    let ours: Vec<&(i32, i32, String, char)> =
        procs.iter().filter(|p| p.2.starts_with("python") && descends(p.0)).collect();
    // A germline is stopped between forks, and its parent (the first process, or the
    // service) is not a stopped Python; an idle pooled copy is a stopped child of one.
    let stopped = |pid: i32| ours.iter().any(|q| q.0 == pid && q.3 == 'T');
    let germlines: Vec<i32> = ours.iter().filter(|p| p.3 == 'T' && !stopped(p.1)).map(|p| p.0).collect();
    let copies: Vec<i32> = ours.iter().filter(|p| p.3 == 'T' && germlines.contains(&p.1)).map(|p| p.0).collect();
    let mem = |pids: &[i32]| -> Vec<Memory> { pids.iter().filter_map(|p| memory_kib(*p)).collect() };
    Some((mem(&germlines), mem(&copies)))
}

/// Memory of one process, KiB: its proportional set size (shared pages split among their
/// sharers), and its private pages (what it adds: a copy's pages it wrote since the fork).
#[derive(Clone, Copy)]
struct Memory {
    pss: f64,
    private: f64,
}

fn memory_kib(pid: i32) -> Option<Memory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    };
    Some(Memory { pss: field("Pss:")?, private: field("Private_Clean:")? + field("Private_Dirty:")? })
}

/// CPU time of the service and every process it starts (germlines, copies, helpers), by a
/// cgroup v1 `cpuacct` group the service is moved into before it starts any (children
/// inherit it; germline moves copies only in the `memory` and `pids` hierarchies). `None`
/// where the host has no such hierarchy.
struct CpuAccount {
    dir: std::path::PathBuf,
}

impl CpuAccount {
    fn new(service: u32) -> Option<CpuAccount> {
        let root = Path::new("/sys/fs/cgroup/cpuacct");
        if !root.join("cpuacct.usage").exists() {
            return None;
        }
        let dir = root.join(format!("germline-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let account = CpuAccount { dir };
        std::fs::write(account.dir.join("cgroup.procs"), service.to_string()).ok()?;
        Some(account)
    }

    fn usage(&self) -> Option<Duration> {
        let ns = std::fs::read_to_string(self.dir.join("cpuacct.usage")).ok()?;
        Some(Duration::from_nanos(ns.trim().parse().ok()?))
    }
}

impl Drop for CpuAccount {
    fn drop(&mut self) {
        // Empty once the service and its processes are gone (dropped before this).
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// User and system CPU time of one process, all its threads (`/proc/PID/stat`, in the
/// kernel's fixed user tick of 1/100 s).
fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    // After the name, from field 3 (state): utime is field 14, stime 15, cutime 16 and
    // cstime 17 (waited-for children: the view helpers).
    let tick = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    let ticks = tick(14)? + tick(15)? + tick(16)? + tick(17)?;
    Some(Duration::from_millis(ticks * 10))
}

/// Busy and total CPU ticks of the whole machine (`/proc/stat`, first line).
fn machine_cpu() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user)
    let get = |i: usize| ticks.get(i).copied().unwrap_or(0);
    let idle = get(3) + get(4);
    let all: u64 = (0..8).map(get).sum();
    Some((all - idle, all))
}

fn median_kib(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
