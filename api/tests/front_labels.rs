//! Issue 12 point 2: every message `germline wrap` sends the agent carries a label, and a
//! consumer gets only what its clearance covers. A release raises a JSON-RPC error whose
//! message is built from an item: the cleared agent gets it with the item's label; a
//! consumer cleared for nothing gets a generic error (with the front's check off, the
//! canary reaches it). `nosplit` (one copy holding every item) is the runtime that hands
//! such an error to the uncleared consumer, so the front's own check is what stops it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

const CANARY: &str = "CANARY-label-93be";

fn python() -> PathBuf {
    std::env::var_os("GERMLINE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

/// The release, the hr item holding the canary, and the policy.
fn world(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let rel = dir.join("errant");
    std::fs::create_dir_all(&rel).expect("release dir");
    std::fs::write(
        rel.join("germline.toml"),
        "[release]\nname = \"errant\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n[tools.scan]\nhosts = []\n",
    )
    .expect("manifest");
    std::fs::write(
        rel.join("server.py"),
        "from mcp.server.fastmcp import FastMCP\nfrom mcp.shared.exceptions import McpError\nfrom mcp.types import CallToolRequest, ErrorData\ndef create_server():\n    m = FastMCP('errant')\n    @m.tool()\n    def scan(document: str) -> str:\n        return 'scanned'\n    async def fail(req):\n        content = open(req.params.arguments['document']).read()\n        raise McpError(ErrorData(code=-32001, message='cannot parse: ' + content, data={'echo': content}))\n    m._mcp_server.request_handlers[CallToolRequest] = fail\n    return m\n",
    )
    .expect("server");
    let items = dir.join("items/hr");
    std::fs::create_dir_all(&items).expect("items");
    let payslip = items.join("payslip.txt");
    std::fs::write(&payslip, CANARY).expect("item");
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "tags = [\"hr\"]\n[[items]]\npath = \"{}/**\"\nlabel = [\"hr\"]\n[[items]]\nargument = \"document\"\nnames_path = true\n[consumers.agent]\nclearance = [\"hr\"]\n[consumers.public]\nclearance = []\n",
            items.display()
        ),
    )
    .expect("policy");
    (rel, payslip, policy)
}

/// Runs `germline wrap` over stdio, sends initialize, tools/list and the call, and returns
/// every line the front wrote.
fn converse(dir: &Path, runtime: &str, consumer: &str, labels_off: bool) -> Vec<Value> {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let (rel, payslip, policy) = world(dir);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_germline"));
    cmd.arg("wrap")
        .args(["--runtime", runtime, "--consumer", consumer, "--policy"])
        .arg(&policy)
        .arg("--")
        .arg(&rel)
        .env("GERMLINE_HOME", dir.join("home"))
        .env("GERMLINE_DATA_DIR", dir.join(format!("data-{n}")))
        .env("GERMLINE_PYTHON", python())
        .env_remove("GERMLINE_TEST_FRONT_LABELS_OFF")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if labels_off {
        cmd.env("GERMLINE_TEST_FRONT_LABELS_OFF", "1");
    }
    let mut child = cmd.spawn().expect("germline wrap");
    let mut input = child.stdin.take().expect("stdin");
    let mut output = BufReader::new(child.stdout.take().expect("stdout"));
    let msgs = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "scan", "arguments": {"document": payslip}}}),
    ];
    let mut seen = Vec::new();
    for m in msgs {
        writeln!(input, "{m}").expect("write");
        let mut line = String::new();
        output.read_line(&mut line).expect("read");
        seen.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}")));
    }
    drop(input);
    let _ = child.kill();
    let _ = child.wait();
    seen
}

fn label(v: &Value) -> &Value {
    if v.get("error").is_some() {
        &v["error"]["data"]["dev.germline/label"]
    } else {
        &v["result"]["_meta"]["dev.germline/label"]
    }
}

#[test]
fn errors_built_from_items_are_labelled_and_withheld_from_uncleared_consumers() {
    let dir = tempfile::tempdir().expect("tempdir");

    // The cleared agent gets the release's error, labelled with the item's label; the
    // release's own `data` is not passed on.
    let agent = converse(dir.path(), "germline", "agent", false);
    let err = &agent[2]["error"];
    assert!(err["message"].as_str().is_some_and(|m| m.contains(CANARY)), "{}", agent[2]);
    assert_eq!(label(&agent[2]), &json!(["hr"]), "{}", agent[2]);
    assert!(err["data"].get("echo").is_none(), "{}", agent[2]);
    for (i, m) in agent.iter().enumerate().take(2) {
        assert_eq!(label(m), &json!([]), "message {i} (front's own or data-free): {m}");
    }

    // A consumer cleared for nothing, with one copy holding the item (nosplit): on, a
    // generic error naming no item; off, the canary.
    let public = converse(dir.path(), "nosplit", "public", false);
    let all = serde_json::to_string(&public).expect("json");
    assert!(!all.contains(CANARY), "the public consumer saw the canary: {all}");
    assert!(public[2]["error"]["message"].as_str().is_some_and(|m| m.contains("withheld")), "{}", public[2]);
    assert_eq!(label(&public[2]), &json!([]));

    let off = converse(dir.path(), "nosplit", "public", true);
    let all = serde_json::to_string(&off).expect("json");
    assert!(all.contains(CANARY), "check off: the canary reaches the public consumer: {all}");
}
