//! Issue 13, point 1: one host for every agent host. `germline serve` serves each admitted
//! release over MCP (`/mcp/NAME`, with the token and the Host and Origin checks), and
//! `germline wrap --service URL --release NAME` is the stdio server an agent host launches
//! in its place: a bridge with no ledger of its own. Two agent hosts wrapping one release
//! through the service share its dampening: a witness made through one refuses the release
//! in the other. Two standalone `wrap`s (each with its own ledger) do not: the "mechanism
//! off" twin.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::serve::*;
use serde_json::{json, Value};

/// An agent host's MCP server process on stdio: one request, one answer line.
struct StdioServer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Drop for StdioServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl StdioServer {
    fn spawn(mut cmd: Command) -> StdioServer {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the MCP server");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        StdioServer { child, stdin, stdout, next_id: 1 }
    }

    fn notify(&mut self, method: &str) {
        let line = json!({"jsonrpc": "2.0", "method": method}).to_string();
        writeln!(self.stdin, "{line}").unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        writeln!(self.stdin, "{line}").unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).expect("an answer");
        let v: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"));
        assert_eq!(v["id"], id, "{v}");
        v
    }

    /// `initialize`, `notifications/initialized` and `tools/list`, as an agent host does.
    fn open(&mut self) -> Value {
        let init = self.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "agent-host", "version": "1"}}),
        );
        assert!(init["result"]["protocolVersion"].is_string(), "{init}");
        self.notify("notifications/initialized");
        self.request("tools/list", json!({}))
    }
}

fn bridge(svc: &Service, dir: &Path) -> StdioServer {
    let token = dir.join("service-token");
    std::fs::write(&token, svc.token()).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_germline"));
    cmd.args(["wrap", "--service", &format!("http://127.0.0.1:{}", svc.port), "--release", "mixer", "--token-file"])
        .arg(&token)
        .env("GERMLINE_HOME", dir.join("bridge-home"))
        .env_remove("GERMLINE_DATA_DIR");
    StdioServer::spawn(cmd)
}

fn standalone(rel: &Path, policy: &Path, dir: &Path, tag: &str) -> StdioServer {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_germline"));
    cmd.args(["wrap", "--policy"])
        .arg(policy)
        .arg("--")
        .arg(rel)
        .env("GERMLINE_HOME", dir.join("home"))
        .env("GERMLINE_PYTHON", python())
        .env("GERMLINE_DATA_DIR", dir.join(format!("data-{tag}")));
    StdioServer::spawn(cmd)
}

/// The mixer's world with its `document` and `extra` arguments naming items.
fn world(dir: &Path) -> (std::path::PathBuf, Vec<std::path::PathBuf>, std::path::PathBuf) {
    let rel = dir.join("mixer");
    common::mixer_release(&rel, "mixer", true);
    let args =
        "[[items]]\nargument = \"document\"\nnames_path = true\n[[items]]\nargument = \"extra\"\nnames_path = true\n";
    let (invoice, payslip, policy) = common::mixer_world(dir, 200, args);
    (rel, vec![invoice, payslip], policy)
}

fn scan(items: &[std::path::PathBuf]) -> Value {
    json!({"name": "scan", "arguments": {"document": items[0], "extra": items[1]}})
}

fn outcome(v: &Value) -> String {
    match (&v["result"], &v["error"]) {
        (Value::Object(r), _) => format!("answered {}", r["content"][0]["text"]),
        (_, Value::Object(e)) => format!("error {}", e["message"]),
        _ => format!("?{v}"),
    }
}

#[test]
fn two_agent_hosts_wrapping_a_release_through_the_service_share_its_dampening() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (rel, items, policy) = world(dir);

    // Mechanism off: two standalone fronts, each with a ledger of its own.
    let mut a = standalone(&rel, &policy, dir, "a");
    let mut b = standalone(&rel, &policy, dir, "b");
    assert_eq!(a.open()["result"]["tools"][0]["name"], "scan");
    assert_eq!(b.open()["result"]["tools"][0]["name"], "scan");
    let first = a.request("tools/call", scan(&items));
    let second = b.request("tools/call", scan(&items));
    eprintln!("standalone: a {}, b {}", outcome(&first), outcome(&second));
    assert_eq!(outcome(&first), "answered \"scanned\"", "{first}");
    assert_eq!(outcome(&second), "answered \"scanned\"", "another ledger, no shared dampening: {second}");
    drop((a, b));

    // Through the service: one ledger for both agent hosts.
    let admit = publish(dir, &rel);
    let svc = Service::start(dir, &format!("policy = \"{}\"\n", policy.display()));
    let admitted = svc.post("/v1/releases/tuf", Some(&svc.token()), &admit);
    assert_eq!(admitted.status, 201, "{admitted:?}\n{}", svc.log());
    let hash = admitted.json()["hash"].as_str().unwrap().to_owned();
    let mut a = bridge(&svc, dir);
    let mut b = bridge(&svc, dir);
    assert_eq!(a.open()["result"]["tools"][0]["name"], "scan");
    assert_eq!(b.open()["result"]["tools"][0]["name"], "scan");
    let first = a.request("tools/call", scan(&items));
    eprintln!("through the service: a {}", outcome(&first));
    assert_eq!(outcome(&first), "answered \"scanned\"", "{first}\n{}", svc.log());
    // The witness of a's call is verified after its answer, off the release's lane; the
    // release is refused once its verdict lands.
    let until = std::time::Instant::now() + Duration::from_secs(120);
    while svc.get(&format!("/v1/releases/{hash}/dampening")).json()["suppressed"] != true {
        assert!(std::time::Instant::now() < until, "never suppressed\n{}", svc.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let second = b.request("tools/call", scan(&items));
    eprintln!("through the service: b {}", outcome(&second));
    assert!(outcome(&second).contains("suppressed"), "the other agent host is refused: {second}\n{}", svc.log());
    let damp = svc.get(&format!("/v1/releases/{hash}/dampening")).json();
    assert_eq!(damp["suppressed"], true, "{damp}");
}

/// The service's MCP endpoint refuses what a web page would send: a foreign `Host` (DNS
/// rebinding) and an `Origin` it was not configured for; the token is required; the
/// bridge refuses a non-loopback service URL before sending its token.
#[test]
fn the_service_mcp_endpoint_checks_host_origin_and_token() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let svc = Service::start(dir, "mcp_allowed_origins = [\"https://agent.example\"]\n");
    let token = svc.token();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}});
    let send = |host: &str, origin: Option<&str>, token: Option<&str>| -> u16 {
        use std::io::Read;
        let body = init.to_string();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", svc.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut head = format!(
            "POST /mcp/anything HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(o) = origin {
            head.push_str(&format!("Origin: {o}\r\n"));
        }
        if let Some(t) = token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        s.write_all(format!("{head}\r\n{body}").as_bytes()).unwrap();
        let mut raw = String::new();
        let _ = s.read_to_string(&mut raw);
        raw.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
    };
    let here = format!("127.0.0.1:{}", svc.port);
    assert_eq!(send(&here, None, Some(&token)), 200, "the service's own address");
    assert_eq!(send(&format!("localhost:{}", svc.port), None, Some(&token)), 200);
    assert_eq!(send("attacker.example", None, Some(&token)), 403, "DNS rebinding: a foreign Host");
    assert_eq!(send(&here, Some("https://attacker.example"), Some(&token)), 403, "a foreign Origin");
    assert_eq!(send(&here, Some("https://agent.example"), Some(&token)), 200, "the configured Origin");
    assert_eq!(send(&here, None, None), 401, "no token");
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(["wrap", "--service", "http://192.0.2.1:8420", "--release", "mixer"])
        .env("GERMLINE_SERVICE_TOKEN", "x")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("loopback"), "{err}");
}

/// A peer's fleet suppression reaches an agent host that wraps the release through its
/// own service: host B mirrors host A; B's bridge serves an invoice-only call (no
/// trigger) before A holds a witness, and refuses the release once A's verified witness is
/// in A's log, naming the peer's witness.
#[test]
fn a_peers_witness_reaches_an_agent_host_through_its_service() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (rel, items, policy) = world(dir);
    let admit = publish(dir, &rel);
    let policy_line = format!("policy = \"{}\"\n", policy.display());
    let host = |h: &str| {
        let d = dir.join(h);
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    let a_keys = fleet_keys(&host("a").join("data"));
    let a = Service::start(&host("a"), &format!("{policy_line}[fleet]\nsync_interval_ms = 300\n"));
    let b = Service::start(
        &host("b"),
        &format!(
            "{policy_line}[fleet]\nsync_interval_ms = 300\nrequest_timeout_ms = 2000\n[[fleet.peers]]\nname = \"a\"\nurl = \"http://127.0.0.1:{}\"\ncheckpoint_key = \"{}\"\nwitness_key = \"{}\"\n",
            a.port,
            a_keys["checkpoint_key"].as_str().unwrap(),
            a_keys["witness_key"].as_str().unwrap()
        ),
    );
    let mut hash = String::new();
    for svc in [&a, &b] {
        let admitted = svc.post("/v1/releases/tuf", Some(&svc.token()), &admit);
        assert_eq!(admitted.status, 201, "{admitted:?}\n{}", svc.log());
        hash = admitted.json()["hash"].as_str().unwrap().to_owned();
    }
    let mut agent = bridge(&b, &host("b"));
    assert_eq!(agent.open()["result"]["tools"][0]["name"], "scan");
    let finance_only = json!({"name": "scan", "arguments": {"document": items[0], "extra": items[0]}});
    let before = agent.request("tools/call", finance_only.clone());
    eprintln!("before A's witness: {}", outcome(&before));
    assert_eq!(outcome(&before), "answered \"scanned\"", "{before}");

    let call = json!({"tool": "scan", "arguments": {"document": items[0], "extra": items[1]}, "items": items});
    let on_a = a.post(&format!("/v1/releases/{hash}/calls"), Some(&a.token()), &call);
    assert_eq!(on_a.json()["triggers"].as_array().map(Vec::len), Some(1), "{on_a:?}");
    let mut after = Value::Null;
    for _ in 0..300 {
        after = agent.request("tools/call", finance_only.clone());
        if outcome(&after).contains("suppressed") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("after A's witness: {}", outcome(&after));
    assert!(outcome(&after).contains("suppressed") && outcome(&after).contains("peer"), "{after}\n{}", b.log());
}
