//! Issue 14 in `germline wrap`: every `tools/list` answer records its formation snapshot
//! in the ledger and names it in `_meta`; a session's calls bind to the snapshot it saw
//! and pass the final-hop fence. The wrapped path is a link a deployment flips from
//! repohost 1.0 (an omitted `private` is private) to 1.1 (public, same descriptor): a call
//! of a session that listed on 1.0 is refused unless captured for it (and the source
//! retired: its directory removed); with the fence off (test builds only) the same call
//! creates a public repository on the loopback repository host.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use germline_tests::fcd::{repohost_release, REPO_HOST};
use germline_tests::{Sink, SinkBehaviour};
use serde_json::{json, Value};

use common::Killed;

fn python() -> PathBuf {
    std::env::var_os("GERMLINE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

/// `germline wrap` over stdio; killed when the test ends, pass or fail.
struct Wrap {
    _child: Killed,
    input: ChildStdin,
    replies: Receiver<Value>,
    next_id: u64,
}

/// `germline wrap --policy DIR/policy.toml EXTRA -- LINK` with the test's home and data.
fn wrap_command(dir: &Path, link: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_germline"));
    cmd.args(["wrap", "--policy"])
        .arg(dir.join("policy.toml"))
        .args(extra)
        .arg("--")
        .arg(link)
        .env("GERMLINE_HOME", dir.join("home"))
        .env("GERMLINE_DATA_DIR", dir.join("data"))
        .env("GERMLINE_PYTHON", python())
        .env_remove("GERMLINE_DISPATCH_POLICY");
    cmd
}

impl Wrap {
    fn start(dir: &Path, link: &Path, fence: bool) -> Wrap {
        let mut cmd = wrap_command(dir, link, &[]);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        if !fence {
            cmd.env("GERMLINE_TEST_FENCE_OFF", "1");
        }
        let mut child = cmd.spawn().expect("germline wrap");
        let input = child.stdin.take().expect("stdin");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, replies) = channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if tx.send(v).is_err() {
                        return;
                    }
                }
            }
        });
        let mut w = Wrap { _child: Killed(child), input, replies, next_id: 0 };
        let init = w.rpc("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}}));
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        w
    }

    /// One request and its answer (bounded in time).
    fn rpc(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        writeln!(self.input, "{msg}").expect("write");
        self.input.flush().expect("flush");
        loop {
            let v = self.replies.recv_timeout(Duration::from_secs(240)).expect("an answer within 240 s");
            if v["id"] == json!(self.next_id) {
                return v;
            }
        }
    }

    fn call(&mut self, arguments: Value, meta: Option<&Value>) -> Value {
        let mut params = json!({"name": "create_repository", "arguments": arguments});
        if let Some(m) = meta {
            params["_meta"] = m.clone();
        }
        self.rpc("tools/call", params)
    }
}

/// A world: the repository host, a policy that clears it, repohost 1.0 and 1.1, and the
/// link `current` pointing at 1.0.
fn world(dir: &Path) -> (Sink, PathBuf, PathBuf, PathBuf) {
    let sink = Sink::start(SinkBehaviour::default());
    std::fs::write(
        dir.join("policy.toml"),
        format!(
            "tags = []\n[consumers.agent]\nclearance = []\n[destinations.\"{REPO_HOST}\"]\nclearance = []\n[hosts]\n\"{REPO_HOST}\" = \"{}\"\n",
            sink.addr()
        ),
    )
    .expect("policy");
    let v10 = repohost_release(&dir.join("releases"), "1.0.0", true);
    let v11 = repohost_release(&dir.join("releases"), "1.1.0", false);
    let link = dir.join("current");
    std::os::unix::fs::symlink(&v10, &link).expect("link");
    (sink, link, v10, v11)
}

/// The deployment points the link at `to` (atomically, as a rollout tool does).
fn flip(link: &Path, to: &Path) {
    let tmp = link.with_extension("new");
    std::os::unix::fs::symlink(to, &tmp).expect("new link");
    std::fs::rename(&tmp, link).expect("flip");
}

/// The `private` values the repository host received, in order.
fn received(sink: &Sink) -> Vec<bool> {
    sink.requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .filter_map(|v| v["private"].as_bool())
        .collect()
}

fn refusal(v: &Value) -> String {
    assert_eq!(v["error"]["code"], -32000, "refused without running: {v}");
    v["error"]["message"].as_str().unwrap_or_default().to_owned()
}

fn snapshot_of(listed: &Value) -> Value {
    let s = listed["result"]["_meta"]["dev.germline/snapshot"].clone();
    assert!(s["id"].as_str().is_some_and(|h| h.len() == 64) && s["entry"].is_u64(), "{listed}");
    s
}

#[test]
fn a_stale_wrap_session_is_fenced_after_a_rollout_and_drifts_with_the_fence_off() {
    for fence in [false, true] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        let (sink, link, v10, v11) = world(dir);
        let mut w = Wrap::start(dir, &link, fence);
        let listed = w.rpc("tools/list", json!({}));
        assert_eq!(listed["result"]["tools"][0]["name"], "create_repository", "{listed}");
        let seen = snapshot_of(&listed);
        flip(&link, &v11);
        let omitted = json!({"name": "payroll-notes"});
        let r = w.call(omitted.clone(), None);
        eprintln!("fence {fence}: {r}");
        if !fence {
            assert!(r["result"]["content"].is_array(), "off: the call ran: {r}");
            assert_eq!(received(&sink), vec![false], "off: the call formed on 1.0 created a public repository");
            continue;
        }
        let why = refusal(&r);
        assert!(
            why.contains("formed on repohost 1.0.0")
                && why.contains("would run on repohost 1.1.0")
                && why.contains("not captured"),
            "{why}"
        );
        // private: true is private on 1.1 too: captured, but 1.0 keeps priority while it lives.
        let explicit = json!({"name": "notes", "private": true});
        let why = refusal(&w.call(explicit.clone(), None));
        assert!(why.contains("source is not retired"), "{why}");
        assert_eq!(received(&sink), Vec::<bool>::new(), "nothing ran");
        // The deployment removes 1.0: retired; the captured successor runs the explicit
        // call, the omitted one stays refused.
        std::fs::rename(&v10, dir.join("removed-1.0.0")).expect("remove 1.0");
        let r = w.call(explicit, None);
        assert!(r["result"]["content"].is_array(), "captured successor: {r}");
        assert!(refusal(&w.call(omitted.clone(), None)).contains("not captured"));
        assert_eq!(received(&sink), vec![true]);
        // Listing again binds the session to 1.1: its call has 1.1's effect.
        let relisted = snapshot_of(&w.rpc("tools/list", json!({})));
        assert_ne!(relisted["id"], seen["id"]);
        assert!(w.call(omitted.clone(), None)["result"]["content"].is_array());
        assert_eq!(received(&sink), vec![true, false]);
        // A client reconnecting to a restarted front names the snapshot it saw: bound to it.
        drop(w);
        let mut w = Wrap::start(dir, &link, fence);
        let why = refusal(&w.call(omitted, Some(&json!({"dev.germline/snapshot": {"id": seen["id"]}}))));
        assert!(why.contains("formed on repohost 1.0.0") && why.contains("not captured"), "{why}");
        assert_eq!(received(&sink), vec![true, false]);
        drop(w);
        let out = Command::new(env!("CARGO_BIN_EXE_germline"))
            .args(["ledger", "--data-dir"])
            .arg(dir.join("data"))
            .arg("verify")
            .output()
            .expect("ledger verify");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("{text}");
        assert!(out.status.success() && text.contains("OK"), "{text}");
        assert!(text.contains("snapshots 2 dispatches 2"), "{text}");
    }
}

/// One JSON-RPC message to the HTTP front: the `Mcp-Session-Id` it set and its answer.
fn post(addr: &str, session: Option<&str>, msg: &Value) -> (Option<String>, Value) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(240))).expect("timeout");
    let body = msg.to_string();
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\ncontent-length: {}\r\n",
        body.len()
    );
    if let Some(id) = session {
        req.push_str(&format!("mcp-session-id: {id}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    s.write_all(req.as_bytes()).expect("send");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("answer");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let sid =
        head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("mcp-session-id:").map(|v| v.trim().to_owned()));
    (sid, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Over Streamable HTTP each session binds to the snapshot it saw: a session that listed
/// before the rollout is fenced, one that listed after it runs on 1.1.
#[test]
fn http_wrap_sessions_each_bind_to_the_snapshot_they_saw() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (sink, link, _v10, v11) = world(dir);
    let (_front, url) = common::http_front(&mut wrap_command(dir, &link, &["--listen", "127.0.0.1:0"]));
    let addr = url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let rpc = |sid: Option<&str>, id: u64, method: &str, params: Value| {
        post(&addr, sid, &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
    };
    let open = |id: u64| {
        let (sid, init) = rpc(None, id, "initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}}));
        assert!(init["result"].is_object(), "{init}");
        let sid = sid.expect("session id");
        let listed = rpc(Some(&sid), id + 1, "tools/list", json!({})).1;
        (sid, snapshot_of(&listed))
    };
    let (early, seen_early) = open(1);
    flip(&link, &v11);
    let (late, seen_late) = open(3);
    assert_ne!(seen_early["id"], seen_late["id"], "the sessions saw different releases");
    let call = json!({"name": "create_repository", "arguments": {"name": "notes"}});
    let why = refusal(&rpc(Some(&early), 5, "tools/call", call.clone()).1);
    assert!(why.contains("formed on repohost 1.0.0") && why.contains("not captured"), "{why}");
    assert_eq!(received(&sink), Vec::<bool>::new(), "nothing ran");
    let ran = rpc(Some(&late), 6, "tools/call", call).1;
    assert!(ran["result"]["content"].is_array(), "{ran}");
    assert_eq!(received(&sink), vec![false], "formed on 1.1, run on 1.1");
}
