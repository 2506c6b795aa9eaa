//! `germline ledger …` and `germline bench ledger`: argument types and entry points.
//!
//! Lives in the ledger crate so the `germline` binary only has to route to it; every
//! function returns the process exit code or a [`LedgerError`], never prints panics.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, Subcommand};
use germline_model::ReleaseHash;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::dampening::{self, Event, Pattern, SimConfig};
use crate::entry::{Entry, EntryKind};
use crate::merkle;
use crate::{Ledger, LedgerConfig, LedgerError};

/// Environment variable naming the germline data root (the ledger uses `<root>/ledger`).
pub const DATA_DIR_ENV: &str = "GERMLINE_DATA_DIR";
/// Data root used when neither `--data-dir` nor the environment names one.
pub const DEFAULT_DATA_ROOT: &str = "./germline-data";

/// `germline ledger [--data-dir DIR] <command>`.
#[derive(Debug, Args)]
pub struct LedgerArgs {
    /// Germline data root (the ledger lives in `<root>/ledger`); default
    /// `$GERMLINE_DATA_DIR`, else `./germline-data`.
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: LedgerCommand,
}

/// Ledger operations for operators and scripts.
#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Append one entry (durable when the command returns).
    Append {
        /// witness, dampening_event, admission or suppression.
        #[arg(long)]
        kind: EntryKind,
        /// Release hash (64 hex digits, optional `sha256:` prefix).
        #[arg(long)]
        release: ReleaseHash,
        /// JSON body, `@FILE` to read it from a file, or `-` for stdin.
        #[arg(long)]
        body: String,
    },
    /// Count one call attempt to a release for dampening and print its new state.
    Call {
        /// Release hash.
        #[arg(long)]
        release: ReleaseHash,
        /// none, unverified or verified.
        #[arg(long, default_value = "none")]
        event: Event,
    },
    /// Print one entry as JSON.
    Get {
        /// Entry index.
        index: u64,
    },
    /// List entries, of the whole log or of one release.
    List {
        /// Only entries about this release.
        #[arg(long)]
        release: Option<ReleaseHash>,
        /// First index (whole-log listing only).
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Most entries to print.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Print a release's dampening state.
    State {
        /// Release hash.
        release: ReleaseHash,
    },
    /// Sign and print a checkpoint of the current log (C2SP signed note).
    Checkpoint {
        /// Print the verifier key instead.
        #[arg(long)]
        vkey: bool,
    },
    /// Print (and self-check) an inclusion or consistency proof.
    #[command(subcommand)]
    Prove(ProveCommand),
    /// Audit the whole log; exit status 1 if anything is wrong.
    Verify,
    /// Recompute the release index and dampening state from the entries.
    RebuildIndex,
    /// Monte-Carlo table: how often a noisy-but-honest release gets suppressed.
    Simulate(SimulateArgs),
}

/// Which proof to print.
#[derive(Debug, Subcommand)]
pub enum ProveCommand {
    /// Entry `index` is in the tree of size `size` (default: current size).
    Inclusion {
        /// Entry index.
        index: u64,
        /// Tree size.
        #[arg(long)]
        size: Option<u64>,
    },
    /// The tree of size `old` is a prefix of the tree of size `new` (default: current).
    Consistency {
        /// Old tree size.
        old: u64,
        /// New tree size.
        new: Option<u64>,
    },
}

/// Options of `germline ledger simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Simulated releases per row (more: tighter error bars, slower).
    #[arg(long, default_value_t = 2_000)]
    pub trials: u32,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Length of each burst of divergences in the bursty pattern.
    #[arg(long, default_value_t = 5)]
    pub burst: u32,
}

/// `germline bench <what>`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Append throughput with durable group commit, and proof latency.
    Ledger(BenchLedgerArgs),
}

/// Options of `germline bench ledger`.
#[derive(Debug, Args)]
pub struct BenchLedgerArgs {
    /// Appending threads of the multi-writer runs.
    #[arg(long, default_value_t = 4)]
    pub threads: u64,
    /// Appends per run (split between the threads).
    #[arg(long, default_value_t = 4_000)]
    pub appends: u64,
    /// Runs per configuration; the median is printed.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Appends each thread keeps in flight in the pipelined runs.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// Proofs generated and verified per kind.
    #[arg(long, default_value_t = 1_000)]
    pub proofs: usize,
    /// Also time this many CLI processes (`<this program> ledger call`), each opening the
    /// ledger, counting one call and closing it, and compare the first with the last.
    #[arg(long, default_value_t = 0)]
    pub cli_calls: u64,
    /// Directory for the throw-away benchmark logs (default: a fresh temp directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// The ledger directory: `--data-dir`, else `$GERMLINE_DATA_DIR`, else
/// `./germline-data`, with `ledger` appended.
pub fn ledger_dir(data_dir: Option<&Path>) -> PathBuf {
    let root = match data_dir {
        Some(d) => d.to_path_buf(),
        None => std::env::var_os(DATA_DIR_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_ROOT)),
    };
    root.join("ledger")
}

fn read_body(spec: &str) -> Result<Vec<u8>, LedgerError> {
    if spec == "-" {
        let mut v = Vec::new();
        std::io::stdin()
            .read_to_end(&mut v)
            .map_err(|source| LedgerError::Io { context: "reading body from stdin".into(), source })?;
        Ok(v)
    } else if let Some(path) = spec.strip_prefix('@') {
        std::fs::read(path).map_err(|source| LedgerError::Io { context: format!("reading body from {path}"), source })
    } else {
        Ok(spec.as_bytes().to_vec())
    }
}

fn entry_json(index: u64, entry: &Entry) -> serde_json::Value {
    let body = serde_json::from_slice::<serde_json::Value>(&entry.body)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&entry.body).into()));
    serde_json::json!({
        "index": index,
        "kind": entry.kind.as_str(),
        "release": entry.release.to_hex(),
        "time_ms": entry.time_ms,
        "leaf_hash": hex::encode(merkle::leaf_hash(&entry.encode())),
        "body": body,
    })
}

fn hexes(hashes: &[merkle::Hash]) -> Vec<String> {
    hashes.iter().map(hex::encode).collect()
}

/// Runs `germline ledger …`; returns the exit code.
pub fn run_ledger_command(args: &LedgerArgs) -> Result<i32, LedgerError> {
    if let LedgerCommand::Simulate(sim) = &args.command {
        return Ok(run_simulate(sim));
    }
    let dir = ledger_dir(args.data_dir.as_deref());
    let ledger = Ledger::open(&dir, LedgerConfig::default())?;
    match &args.command {
        LedgerCommand::Append { kind, release, body } => {
            let r = ledger.append(Entry::new(*kind, *release, read_body(body)?))?;
            println!("{} {}", r.index, hex::encode(r.leaf_hash));
        }
        LedgerCommand::Call { release, event } => {
            let s = ledger.record_call(release, *event)?;
            println!(
                "{}",
                serde_json::json!({"release": release.to_hex(), "penalty": s.penalty,
                    "suppressed": s.suppressed, "calls": s.calls})
            );
        }
        LedgerCommand::Get { index } => {
            println!("{}", entry_json(*index, &ledger.get(*index)?));
        }
        LedgerCommand::List { release, from, limit } => {
            let rows: Vec<(u64, Entry)> = match release {
                Some(r) => ledger.entries_for_release(r)?.into_iter().take(*limit).collect(),
                None => {
                    let end = ledger.size().min(from.saturating_add(*limit as u64));
                    (*from..end).map(|i| ledger.get(i).map(|e| (i, e))).collect::<Result<_, _>>()?
                }
            };
            for (i, e) in rows {
                println!("{i}\t{}\t{}\t{}", e.kind.as_str(), e.release, String::from_utf8_lossy(&e.body));
            }
        }
        LedgerCommand::State { release } => {
            let s = ledger.dampening_state(release)?;
            println!(
                "{}",
                serde_json::json!({"release": release.to_hex(), "penalty": s.penalty,
                    "suppressed": s.suppressed, "calls": s.calls})
            );
        }
        LedgerCommand::Checkpoint { vkey } => {
            if *vkey {
                println!("{}", ledger.verifier().to_vkey());
            } else {
                print!("{}", ledger.checkpoint()?.note);
            }
        }
        LedgerCommand::Prove(ProveCommand::Inclusion { index, size }) => {
            let size = size.unwrap_or(ledger.size());
            let root = ledger.root_at(size)?;
            let leaf = merkle::leaf_hash(&ledger.get_raw(*index)?);
            let proof = ledger.inclusion_proof(*index, size)?;
            let ok = merkle::verify_inclusion(*index, size, &leaf, &proof, &root);
            println!(
                "{}",
                serde_json::json!({"index": index, "size": size, "root": hex::encode(root),
                    "leaf_hash": hex::encode(leaf), "proof": hexes(&proof), "verified": ok})
            );
            return Ok(if ok { 0 } else { 1 });
        }
        LedgerCommand::Prove(ProveCommand::Consistency { old, new }) => {
            let new = new.unwrap_or(ledger.size());
            let (old_root, new_root) = (ledger.root_at(*old)?, ledger.root_at(new)?);
            let proof = ledger.consistency_proof(*old, new)?;
            let ok = merkle::verify_consistency(*old, new, &old_root, &new_root, &proof);
            println!(
                "{}",
                serde_json::json!({"old": old, "new": new, "old_root": hex::encode(old_root),
                    "new_root": hex::encode(new_root), "proof": hexes(&proof), "verified": ok})
            );
            return Ok(if ok { 0 } else { 1 });
        }
        LedgerCommand::Verify => {
            let report = ledger.verify()?;
            println!(
                "entries {} hashes {} checkpoints {} releases {} root {}",
                report.entries,
                report.hashes,
                report.checkpoints,
                report.releases,
                report.root.map(hex::encode).unwrap_or_default()
            );
            println!(
                "formations {} lifecycle events {} snapshots {} dispatches {}",
                report.formations, report.lifecycle_events, report.snapshots, report.dispatches
            );
            for p in &report.problems {
                println!("PROBLEM: {p}");
            }
            println!("{}", if report.is_ok() { "OK" } else { "FAILED" });
            return Ok(if report.is_ok() { 0 } else { 1 });
        }
        LedgerCommand::RebuildIndex => {
            ledger.rebuild_index()?;
            println!("rebuilt index and dampening state of {} entries", ledger.size());
        }
        LedgerCommand::Simulate(_) => {}
    }
    Ok(0)
}

fn run_simulate(args: &SimulateArgs) -> i32 {
    let config = SimConfig {
        trials: args.trials,
        seed: args.seed,
        patterns: vec![Pattern::Random, Pattern::Bursty { burst: args.burst }],
        ..SimConfig::default()
    };
    let p = config.params;
    println!(
        "dampening: h = {} calls, S = {}, R = {}, w = {} (unverified) / {} (verified)",
        p.half_life_calls, p.suppress_at, p.reuse_below, p.unverified_weight, p.verified_weight
    );
    println!("stationary threshold rate p*: {:.1}%", p.stationary_threshold_rate() * 100.0);
    print!("{}", dampening::format_table(&dampening::simulate(&config), args.trials));
    0
}

/// Runs `germline bench …`; returns the exit code.
pub fn run_bench_command(cmd: &BenchCommand) -> Result<i32, LedgerError> {
    match cmd {
        BenchCommand::Ledger(args) => bench_ledger(args),
    }
}

fn median_us(v: Vec<f64>) -> f64 {
    quantile(v, 0.5)
}

/// The `q` quantile (nearest rank below) of `v`; 0 for no samples.
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let at = ((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1));
    v.get(at).copied().unwrap_or(0.0)
}

fn bench_ledger(args: &BenchLedgerArgs) -> Result<i32, LedgerError> {
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("germline-ledger-bench-{}", std::process::id())),
    };
    if dir.exists() {
        return Err(LedgerError::Config(format!("{} exists; the benchmark needs a fresh directory", dir.display())));
    }
    let result = bench_in(&dir, args);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn bench_config() -> LedgerConfig {
    LedgerConfig { origin: Some("bench.germline/ledger".into()), ..Default::default() }
}

fn bench_body(t: u64, j: u64) -> Entry {
    let body = format!(r#"{{"thread":{t},"seq":{j},"pad":"{}"}}"#, "x".repeat(200));
    Entry::new(EntryKind::Witness, ReleaseHash::of_bytes(b"bench"), body.into_bytes())
}

/// Appends `total` entries from `threads` threads into a fresh log under `dir`; each
/// thread keeps up to `window` appends in flight (1: wait for each before the next).
/// Every append counted is durable (acknowledged after the group's fsync).
fn append_run(dir: &Path, threads: u64, total: u64, window: usize) -> Result<f64, LedgerError> {
    let ledger = Ledger::open(dir, bench_config())?;
    let per_thread = total.div_ceil(threads);
    let started = Instant::now();
    std::thread::scope(|s| -> Result<(), LedgerError> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let ledger = &ledger;
                s.spawn(move || -> Result<(), LedgerError> {
                    let mut in_flight: std::collections::VecDeque<crate::PendingAppend> =
                        std::collections::VecDeque::with_capacity(window);
                    for j in 0..per_thread {
                        if in_flight.len() >= window.max(1) {
                            if let Some(p) = in_flight.pop_front() {
                                p.wait()?;
                            }
                        }
                        in_flight.push_back(ledger.append_async(bench_body(t, j))?);
                    }
                    for p in in_flight {
                        p.wait()?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| LedgerError::Write("benchmark thread panicked".into()))??;
        }
        Ok(())
    })?;
    let secs = started.elapsed().as_secs_f64();
    if ledger.size() != per_thread * threads {
        return Err(LedgerError::Inconsistent(format!("{} entries after {} appends", ledger.size(), total)));
    }
    Ok((per_thread * threads) as f64 / secs)
}

fn bench_in(dir: &Path, args: &BenchLedgerArgs) -> Result<i32, LedgerError> {
    std::fs::create_dir_all(dir)
        .map_err(|source| LedgerError::Io { context: format!("creating {}", dir.display()), source })?;
    let configs = [
        ("1 writer, one append at a time", 1, 1),
        ("writers, one append at a time each", args.threads, 1),
        ("writers, pipelined", args.threads, args.window),
    ];
    let mut run = 0;
    for (name, threads, window) in configs {
        let mut rates = Vec::with_capacity(args.runs);
        for _ in 0..args.runs.max(1) {
            let d = dir.join(format!("run-{run}"));
            run += 1;
            rates.push(append_run(&d, threads, args.appends, window)?);
            let _ = std::fs::remove_dir_all(&d);
        }
        let label = if threads == 1 { name.to_string() } else { format!("{threads} {name}") };
        let label = if window > 1 { format!("{label} ({window} in flight each)") } else { label };
        let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let max = rates.iter().copied().fold(0.0, f64::max);
        println!(
            "append, durable group commit (WAL + fsync before ack), {label}: median {:.0} entries/s over {} runs of {} (min {:.0}, max {:.0})",
            median_us(rates.clone()),
            rates.len(),
            args.appends,
            min,
            max
        );
    }

    let proofs_dir = dir.join("proofs");
    append_run(&proofs_dir, args.threads, args.appends, args.window)?;
    let ledger = Ledger::open(&proofs_dir, bench_config())?;
    let size = ledger.size();
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let mut incl = Vec::with_capacity(args.proofs);
    let mut cons = Vec::with_capacity(args.proofs);
    for _ in 0..args.proofs {
        let n = rng.gen_range(1..=size);
        let i = rng.gen_range(0..n);
        let t = Instant::now();
        let root = ledger.root_at(n)?;
        let leaf = merkle::leaf_hash(&ledger.get_raw(i)?);
        let proof = ledger.inclusion_proof(i, n)?;
        let ok = merkle::verify_inclusion(i, n, &leaf, &proof, &root);
        incl.push(t.elapsed().as_secs_f64() * 1e6);
        if !ok {
            return Err(LedgerError::Corrupt(format!("inclusion proof {i}/{n} failed")));
        }
        let old = rng.gen_range(1..=n);
        let t = Instant::now();
        let (r0, r1) = (ledger.root_at(old)?, ledger.root_at(n)?);
        let proof = ledger.consistency_proof(old, n)?;
        let ok = merkle::verify_consistency(old, n, &r0, &r1, &proof);
        cons.push(t.elapsed().as_secs_f64() * 1e6);
        if !ok {
            return Err(LedgerError::Corrupt(format!("consistency proof {old}->{n} failed")));
        }
    }
    println!(
        "proofs over a {size}-entry log (generate from store + verify, incl. root reads): inclusion median {:.1} us, consistency median {:.1} us ({} each)",
        median_us(incl),
        median_us(cons),
        args.proofs
    );
    drop(ledger);
    if args.cli_calls > 0 {
        bench_cli_calls(&dir.join("cli"), args.cli_calls)?;
    }
    Ok(0)
}

/// Files and bytes under `dir` (recursively).
pub fn dir_usage(dir: &Path) -> std::io::Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let meta = e.metadata()?;
        if meta.is_dir() {
            let (f, b) = dir_usage(&e.path())?;
            files += f;
            bytes += b;
        } else {
            files += 1;
            bytes += meta.len();
        }
    }
    Ok((files, bytes))
}

fn cli_call(exe: &Path, data: &Path, release: &str) -> Result<f64, LedgerError> {
    let t = Instant::now();
    let out = std::process::Command::new(exe)
        .args(["ledger", "--data-dir"])
        .arg(data)
        .args(["call", "--release", release, "--event", "none"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|source| LedgerError::Io { context: format!("running {}", exe.display()), source })?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        return Err(LedgerError::Write(format!("CLI call on {} failed: {}", data.display(), out.status)));
    }
    Ok(ms)
}

/// Runs `calls` CLI processes in a row, each `<this program> ledger --data-dir D call`
/// (open the ledger, count one call durably, close), printing latency and the
/// ledger's files as it grows. Then compares the grown ledger with a new one (a few
/// entries), alternating calls between them so both see the same machine load.
fn bench_cli_calls(data: &Path, calls: u64) -> Result<(), LedgerError> {
    let exe = std::env::current_exe()
        .map_err(|source| LedgerError::Io { context: "locating this program".into(), source })?;
    let release = ReleaseHash::of_bytes(b"bench-cli").to_hex();
    let window = (calls / 10).clamp(1, 200) as usize;
    let report_every = (calls / 10).max(1);
    let big = data.join("grown");
    let small = data.join("new");
    let usage = |d: &Path| {
        dir_usage(&d.join("ledger").join(crate::store::DB_DIR))
            .map_err(|source| LedgerError::Io { context: "listing the ledger".into(), source })
    };
    let mut lat = Vec::with_capacity(calls as usize);
    for i in 1..=calls {
        lat.push(cli_call(&exe, &big, &release)?);
        if i % report_every == 0 || i == calls {
            let (files, bytes) = usage(&big)?;
            let from = lat.len().saturating_sub(window);
            println!(
                "cli: call {i}: median of the last {} calls {:.1} ms; ledger db {files} files, {:.1} KiB",
                lat.len() - from,
                median_us(lat[from..].to_vec()),
                bytes as f64 / 1024.0
            );
        }
    }
    for _ in 0..3 {
        cli_call(&exe, &small, &release)?;
    }
    let (mut at_small, mut at_big) = (Vec::with_capacity(window), Vec::with_capacity(window));
    for _ in 0..window {
        at_small.push(cli_call(&exe, &small, &release)?);
        at_big.push(cli_call(&exe, &big, &release)?);
    }
    let (p90_small, p90_big) = (quantile(at_small.clone(), 0.9), quantile(at_big.clone(), 0.9));
    let (first, last) = (median_us(at_small), median_us(at_big));
    println!(
        "cli: `ledger call` latency, {window} calls alternating: new ledger (entries 4..{}) median {first:.1} ms, grown ledger (entries {}..{}) median {last:.1} ms, ratio {:.3}; P90 {p90_small:.1} and {p90_big:.1} ms, ratio {:.3}",
        3 + window,
        calls + 1,
        calls + window as u64,
        last / first,
        p90_big / p90_small
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct TestCli {
        #[command(flatten)]
        args: LedgerArgs,
    }

    fn run(dir: &Path, argv: &[&str]) -> i32 {
        let mut full = vec!["germline", "--data-dir", dir.to_str().expect("utf-8 path")];
        full.extend_from_slice(argv);
        let cli = TestCli::try_parse_from(full).expect("parses");
        run_ledger_command(&cli.args).expect("runs")
    }

    #[test]
    fn commands_parse_and_run_against_a_data_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let release = ReleaseHash::of_bytes(b"r").to_hex();
        assert_eq!(run(dir.path(), &["append", "--kind", "witness", "--release", &release, "--body", r#"{"a":1}"#]), 0);
        assert_eq!(run(dir.path(), &["call", "--release", &release, "--event", "verified"]), 0);
        assert_eq!(run(dir.path(), &["get", "0"]), 0);
        assert_eq!(run(dir.path(), &["list", "--release", &release]), 0);
        assert_eq!(run(dir.path(), &["checkpoint"]), 0);
        assert_eq!(run(dir.path(), &["prove", "inclusion", "1"]), 0);
        assert_eq!(run(dir.path(), &["prove", "consistency", "1"]), 0);
        assert_eq!(run(dir.path(), &["verify"]), 0);
        let ledger = Ledger::open(dir.path().join("ledger"), LedgerConfig::default()).expect("open");
        // append + call (event) + suppression entry
        assert_eq!(ledger.size(), 3);
        assert!(ledger.dampening_state(&release.parse().expect("hash")).expect("state").suppressed);
    }

    #[test]
    fn bad_arguments_are_rejected_by_the_parser() {
        let cases: [&[&str]; 3] = [
            &["germline", "append", "--kind", "nope", "--release", "00", "--body", "{}"],
            &["germline", "call", "--release", "xyz"],
            &["germline", "get", "-1"],
        ];
        for argv in cases {
            assert!(TestCli::try_parse_from(argv).is_err());
        }
    }

    #[test]
    fn data_dir_flag_wins_over_the_default() {
        assert_eq!(ledger_dir(Some(Path::new("/srv/g"))), PathBuf::from("/srv/g/ledger"));
    }
}
