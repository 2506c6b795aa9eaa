//! Issue 12 point 7: a web page cannot reach the tools behind `germline wrap --listen`.
//! The request a DNS-rebinding page sends (foreign `Origin`, foreign `Host`, no session,
//! `text/plain`, no `initialize`) is refused with the guard on, and each defect alone is
//! refused with its own status; with the guard off (debug-build test switch) the same
//! request gets the canary the tool returns.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Killed;

const CANARY: &str = "CANARY-front-7f3a9c";
const TOKEN: &str = "front-token-5d1e";

fn python() -> PathBuf {
    std::env::var_os("GERMLINE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

/// A release whose one tool answers the canary.
fn canary_release(dir: &Path) -> PathBuf {
    let rel = dir.join("canary");
    std::fs::create_dir_all(&rel).expect("release dir");
    std::fs::write(
        rel.join("germline.toml"),
        "[release]\nname = \"canary\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n[tools.secret]\nhosts = []\n",
    )
    .expect("manifest");
    std::fs::write(
        rel.join("server.py"),
        format!("from mcp.server.fastmcp import FastMCP\ndef create_server():\n    m = FastMCP('canary')\n    @m.tool()\n    def secret() -> str:\n        return '{CANARY}'\n    return m\n"),
    )
    .expect("server");
    rel
}

fn wrap(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mut c = Command::new(env!("CARGO_BIN_EXE_germline"));
    c.arg("wrap")
        .args(args)
        .env("GERMLINE_HOME", dir.join("home"))
        .env("GERMLINE_DATA_DIR", dir.join(format!("data-{n}")))
        .env("GERMLINE_PYTHON", python())
        .env_remove("GERMLINE_FRONT_TOKEN")
        .env_remove("GERMLINE_TEST_FRONT_GUARD_OFF")
        .envs(env.iter().copied());
    c
}

/// Starts `germline wrap --listen 127.0.0.1:0` and returns it with its address.
fn front(dir: &Path, rel: &Path, env: &[(&str, &str)]) -> (Killed, SocketAddr) {
    let rel = rel.to_string_lossy();
    let (front, url) = common::http_front(&mut wrap(dir, &["--listen", "127.0.0.1:0", "--", &rel], env));
    let addr = url.trim_start_matches("http://").trim_end_matches("/mcp").parse().expect("front address");
    (front, addr)
}

struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn session(&self) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("mcp-session-id").then(|| v.trim().to_owned())
        })
    }
}

/// One HTTP/1.1 request with exactly `headers` (the test writes `Host` itself).
fn request(addr: SocketAddr, method: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
    let mut req = format!("{method} /mcp HTTP/1.1\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).expect("send");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("answer");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Answer { status, head: head.to_owned(), body: body.to_owned() }
}

const CALL: &str = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"secret","arguments":{}}}"#;
const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// What a page on attacker.example sends after rebinding its name to the front.
fn rebinding_page(addr: SocketAddr) -> Answer {
    let host = format!("attacker.example:{}", addr.port());
    request(
        addr,
        "POST",
        &[("host", &host), ("origin", "http://attacker.example"), ("content-type", "text/plain"), ("accept", "*/*")],
        CALL,
    )
}

#[test]
fn a_browser_page_cannot_reach_the_tools() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rel = canary_release(dir.path());

    // Off: the page's request reaches the tool and the canary reaches the browser.
    {
        let (_front, addr) = front(dir.path(), &rel, &[("GERMLINE_TEST_FRONT_GUARD_OFF", "1")]);
        let a = rebinding_page(addr);
        assert_eq!(a.status, 200, "guard off: {} {}", a.head, a.body);
        assert!(a.body.contains(CANARY), "guard off: the canary reaches the page: {}", a.body);
    }

    // On (with a bearer token from the environment).
    let (_front, addr) = front(dir.path(), &rel, &[("GERMLINE_FRONT_TOKEN", TOKEN)]);
    let a = rebinding_page(addr);
    assert!(a.status >= 400 && !a.body.contains(CANARY), "guard on: {} {}", a.head, a.body);
    let a = request(
        addr,
        "POST",
        &[
            ("host", &format!("attacker.example:{}", addr.port())),
            ("origin", "http://attacker.example"),
            ("content-type", "text/plain"),
            ("authorization", &format!("Bearer {TOKEN}")),
        ],
        CALL,
    );
    assert!(a.status >= 400 && !a.body.contains(CANARY), "guard on, token known: {} {}", a.head, a.body);

    let host = addr.to_string();
    let bearer = format!("Bearer {TOKEN}");
    let good = |session: Option<&str>| -> Vec<(&'static str, String)> {
        let mut h = vec![
            ("host", host.clone()),
            ("content-type", "application/json".to_owned()),
            ("accept", "application/json, text/event-stream".to_owned()),
            ("authorization", bearer.clone()),
        ];
        if let Some(s) = session {
            h.push(("mcp-session-id", s.to_owned()));
        }
        h
    };
    let send = |headers: &[(&'static str, String)], method: &str, body: &str| {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        request(addr, method, &h, body)
    };
    // A call before any initialize has no session.
    let a = send(&good(None), "POST", CALL);
    assert_eq!(a.status, 400, "no session: {}", a.body);
    let init = send(&good(None), "POST", INIT);
    assert_eq!(init.status, 200, "initialize: {} {}", init.head, init.body);
    let session = init.session().expect("initialize issues Mcp-Session-Id");
    let ok = send(&good(Some(&session)), "POST", CALL);
    assert_eq!(ok.status, 200, "a proper client: {}", ok.body);
    assert!(ok.body.contains(CANARY), "a proper client gets the tool's answer: {}", ok.body);

    let with = |name: &'static str, value: &str| {
        let mut h: Vec<(&'static str, String)> = good(Some(&session)).into_iter().filter(|(k, _)| *k != name).collect();
        if !value.is_empty() {
            h.push((name, value.to_owned()));
        }
        h
    };
    for (what, headers, status) in [
        ("foreign Origin", with("origin", "http://attacker.example"), 403),
        ("foreign Host", with("host", &format!("attacker.example:{}", addr.port())), 421),
        ("no token", with("authorization", ""), 401),
        ("wrong token", with("authorization", "Bearer guess"), 401),
        ("text/plain", with("content-type", "text/plain"), 415),
        ("Accept without SSE", with("accept", "application/json"), 406),
        ("no session", with("mcp-session-id", ""), 400),
        ("unknown session", with("mcp-session-id", "00112233445566778899aabbccddeeff"), 404),
    ] {
        let a = send(&headers, "POST", CALL);
        assert_eq!(a.status, status, "{what}: {} {}", a.head, a.body);
        assert!(!a.body.contains(CANARY), "{what}: {}", a.body);
    }
    let get = send(&good(Some(&session)), "GET", "");
    assert_eq!(get.status, 405, "no SSE stream: {}", get.body);
    let del = send(&good(Some(&session)), "DELETE", "");
    assert_eq!(del.status, 204, "DELETE ends the session: {}", del.body);
    let after = send(&good(Some(&session)), "POST", CALL);
    assert_eq!(after.status, 404, "an ended session: {}", after.body);
    assert!(!after.body.contains(CANARY));
}

#[test]
fn the_front_listens_on_loopback_unless_told() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rel = canary_release(dir.path());
    let out = wrap(dir.path(), &["--listen", "0.0.0.0:0", "--", &rel.to_string_lossy()], &[])
        .stdin(Stdio::null())
        .output()
        .expect("germline wrap");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--listen-non-loopback"), "{err}");
}
