//! Issue 15, acceptance: the pool is on by default in `session`, `wrap` and `serve` (and in
//! `call`, which starts its runtime as `session` does), and `--pool 0` makes the copies of
//! each call as it comes. The release's one tool counts the calls its process has served
//! and declares a warm-up call: a copy from the pool ran the warm-up while it was readied
//! and answers 2; a copy made for the call answers 1.
//!
//! A call that finds no ready copy (the pool still readying, or refilling after the call
//! before) is given a copy made for it, so the default runs call at a pace that lets the
//! pool fill and ask only that a pooled copy answers within a few calls.

mod common;

use common::serve::{publish, python, Service};
use common::Killed;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

const SERVER: &str = r#"from mcp.server.fastmcp import FastMCP
SEEN = {"calls": 0}
def create_server():
    m = FastMCP("look")
    @m.tool()
    def look(note: str = "") -> str:
        """How many calls this process has served, this one included."""
        SEEN["calls"] += 1
        return str(SEEN["calls"])
    return m
"#;

/// Calls of a default run, one a second: the first pooled answer ends it.
const DEFAULT_CALLS: usize = 8;
/// Calls of a `--pool 0` run, each after the same pause: none may be pooled.
const POOL_0_CALLS: usize = 3;

fn release(dir: &Path) -> PathBuf {
    let rel = dir.join("look");
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::write(
        rel.join("germline.toml"),
        "[release]\nname = \"look\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n\
         [tools.look]\nwarm_up = { note = \"warm-up\" }\n",
    )
    .unwrap();
    std::fs::write(rel.join("server.py"), SERVER).unwrap();
    rel
}

fn policy(dir: &Path) -> PathBuf {
    let p = dir.join("policy.toml");
    std::fs::write(&p, "tags = []\n[consumers.agent]\nclearance = []\n").unwrap();
    p
}

/// The text a tool result carries (an MCP `CallToolResult`).
fn text(result: &Value) -> String {
    result["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text in {result}")).to_owned()
}

/// Calls through `call` (which returns the tool's answer) up to `n` times, a second apart
/// (the first a second after the start too); stops at the first pooled answer when
/// `stop_when_pooled`. Returns every answer.
fn paced(n: usize, stop_when_pooled: bool, mut call: impl FnMut() -> String) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..n {
        std::thread::sleep(Duration::from_secs(1));
        let a = call();
        let pooled = a == "2";
        seen.push(a);
        if pooled && stop_when_pooled {
            break;
        }
    }
    seen
}

/// `--pool P`, when a pool size is given.
fn pool_arg(pool: Option<&str>) -> Vec<OsString> {
    pool.map(|p| vec!["--pool".into(), p.into()]).unwrap_or_default()
}

/// Runs `front` by default and with `--pool 0` (`run(pool, calls)` returns the answers).
/// Pooled by default: some answer is 2 and every one is 1 or 2. `--pool 0`: every answer
/// is 1.
fn check(front: &str, run: impl Fn(Option<&str>, usize) -> Vec<String>) {
    let (default, pool_0) = (run(None, DEFAULT_CALLS), run(Some("0"), POOL_0_CALLS));
    eprintln!("{front}: default {default:?}, --pool 0 {pool_0:?}");
    assert!(default.iter().all(|a| a == "1" || a == "2"), "{front}: each copy serves one call: {default:?}");
    assert!(default.iter().any(|a| a == "2"), "{front}: a call was served from the pool by default: {default:?}");
    assert!(pool_0.iter().all(|a| a == "1"), "{front} --pool 0: every copy made for its call: {pool_0:?}");
}

/// A `germline` command in `dir` with the test's home, data directory and Python, with no
/// pool setting from the environment.
fn germline(dir: &Path, args: &[OsString]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_germline"));
    c.args(args)
        .current_dir(dir)
        .env("GERMLINE_HOME", dir.join("home"))
        .env("GERMLINE_DATA_DIR", dir.join("data"))
        .env("GERMLINE_PYTHON", python())
        .env_remove("GERMLINE_POOL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    c
}

/// A child spoken to a line at a time on stdin and stdout.
struct Lines {
    _child: Killed,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Lines {
    fn spawn(mut cmd: Command) -> Lines {
        let mut child: Child = cmd.spawn().expect("germline");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        Lines { _child: Killed(child), input, output }
    }

    fn send(&mut self, v: &Value) {
        writeln!(self.input, "{v}").expect("write a line");
        self.input.flush().unwrap();
    }

    fn reply(&mut self) -> Value {
        let mut line = String::new();
        assert!(self.output.read_line(&mut line).expect("read a line") > 0, "the command ended");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }
}

#[test]
fn session_pools_by_default_and_pool_0_forks_per_call() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (rel, policy) = (release(dir), policy(dir));
    let run = |pool: Option<&str>, n: usize| {
        let mut args: Vec<OsString> = vec!["session".into(), "--release".into(), rel.clone().into()];
        args.extend(["--policy".into(), policy.clone().into(), "--calls".into(), "/dev/stdin".into()]);
        args.extend(pool_arg(pool));
        let mut s = Lines::spawn(germline(dir, &args));
        paced(n, pool.is_none(), || {
            s.send(&json!({"tool": "look", "arguments": {}}));
            let out = s.reply();
            assert!(out["error"].is_null(), "{out}");
            text(&out["result"])
        })
    };
    check("session", run);
}

#[test]
fn wrap_pools_by_default_and_pool_0_forks_per_call() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rel = release(dir);
    let run = |pool: Option<&str>, n: usize| {
        let mut args: Vec<OsString> = vec!["wrap".into()];
        args.extend(pool_arg(pool));
        args.extend(["--".into(), rel.clone().into()]);
        let mut w = Lines::spawn(germline(dir, &args));
        w.send(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}));
        assert!(w.reply()["result"]["serverInfo"].is_object(), "initialize");
        w.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let mut id = 0;
        paced(n, pool.is_none(), || {
            id += 1;
            w.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "look", "arguments": {}}}));
            let out = w.reply();
            assert_eq!(out["id"], id, "{out}");
            text(&out["result"])
        })
    };
    check("wrap", run);
}

#[test]
fn serve_pools_by_default_and_pool_0_forks_per_call() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rel = release(dir);
    let admit = publish(dir, &rel);
    let policy = policy(dir);
    let run = |pool: Option<&str>, n: usize| {
        let args: Vec<&str> = pool.map(|p| vec!["--pool", p]).unwrap_or_default();
        let sub = dir.join(format!("serve-{}", pool.unwrap_or("default")));
        let svc = Service::start_with(&sub, &format!("policy = \"{}\"\n", policy.display()), &args, &[]);
        let token = svc.token();
        let admitted = svc.post("/v1/releases/tuf", Some(&token), &admit);
        assert_eq!(admitted.status, 201, "{admitted:?}\n{}", svc.log());
        let hash = admitted.json()["hash"].as_str().unwrap().to_owned();
        paced(n, pool.is_none(), || {
            let r = svc.post(
                &format!("/v1/releases/{hash}/calls"),
                Some(&token),
                &json!({"tool": "look", "arguments": {}}),
            );
            assert_eq!(r.status, 200, "{r:?}\n{}", svc.log());
            text(&r.json()["result"])
        })
    };
    check("serve", run);
}
