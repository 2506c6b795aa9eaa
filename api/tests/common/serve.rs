//! The `germline serve` test harness: start the real binary on an ephemeral loopback
//! port, publish releases in TUF repositories, and talk HTTP to it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub fn python() -> PathBuf {
    std::env::var_os("GERMLINE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

pub fn germline(args: &[&str], cwd: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(args)
        .current_dir(cwd)
        .env("GERMLINE_HOME", cwd.join("home"))
        .env("GERMLINE_PYTHON", python())
        .output()
        .expect("run germline");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "germline {args:?}: {text}");
    text
}

/// Builds `rel`'s archive and publishes it in a fresh TUF repository under `dir`; returns
/// the admission request body.
pub fn publish(dir: &Path, rel: &Path) -> Value {
    let name = rel.file_name().unwrap().to_string_lossy().into_owned();
    let archive = format!("{name}.tar.gz");
    germline(&["release", "build", &rel.to_string_lossy(), "--out", &archive], dir);
    let repo = dir.join(format!("repo-{name}"));
    let keys = dir.join(format!("keys-{name}"));
    germline(&["repo", "init", &repo.to_string_lossy(), "--keys", &keys.to_string_lossy()], dir);
    germline(&["repo", "add", &repo.to_string_lossy(), &archive, "--keys", &keys.to_string_lossy()], dir);
    let root = std::fs::read_to_string(repo.join("metadata/1.root.json")).unwrap();
    json!({"repo": repo, "root": root, "target": name})
}

/// The running service; killed when the test ends, pass or fail.
pub struct Service {
    pub child: Child,
    pub port: u16,
    pub log: Arc<Mutex<String>>,
    pub data: PathBuf,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    /// Starts `germline serve --config CONFIG` (the config is written from `extra` lines,
    /// listen and data_dir are set here) and waits for its address.
    pub fn start(dir: &Path, extra: &str) -> Service {
        Service::start_with(dir, extra, &[], &[])
    }

    /// [`Service::start`] with more `serve` arguments and environment variables.
    pub fn start_with(dir: &Path, extra: &str, args: &[&str], envs: &[(&str, &str)]) -> Service {
        // These tests admit from repositories they publish as they go, with the root in
        // the request: the operator's opt-in (`trust.rs` tests the configured anchors).
        Service::launch(dir, &format!("trust.allow_caller_roots = true\n{extra}"), args, envs)
    }

    /// `germline serve` in `dir` with exactly the `extra` configuration lines (listen and
    /// data_dir are set here), more arguments and environment variables; waits until ready.
    pub fn launch(dir: &Path, extra: &str, args: &[&str], envs: &[(&str, &str)]) -> Service {
        std::fs::create_dir_all(dir).unwrap();
        let data = dir.join("data");
        let config = dir.join("serve.toml");
        std::fs::write(&config, format!("listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n{extra}", data.display()))
            .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_germline"))
            .args(["serve", "--config"])
            .arg(&config)
            .args(args)
            .current_dir(dir)
            .env("GERMLINE_HOME", dir.join("home"))
            .env("GERMLINE_PYTHON", python())
            .env_remove("GERMLINE_DATA_DIR")
            .env_remove("GERMLINE_LISTEN")
            .env_remove("GERMLINE_RUNTIME")
            .env_remove("GERMLINE_CONFIG")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("germline serve");
        let mut err = BufReader::new(child.stderr.take().expect("stderr"));
        let log = Arc::new(Mutex::new(String::new()));
        let mut line = String::new();
        let port = loop {
            line.clear();
            let n = err.read_line(&mut line).expect("service stderr");
            log.lock().unwrap().push_str(&line);
            assert!(n > 0, "the service exited: {}", log.lock().unwrap());
            if let Some(rest) = line.trim().strip_prefix("germline: serving the API on http://127.0.0.1:") {
                break rest.parse::<u16>().expect("port");
            }
        };
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while err.read_line(&mut line).is_ok_and(|n| n > 0) {
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let svc = Service { child, port, log, data };
        svc.wait_ready();
        svc
    }

    pub fn wait_ready(&self) {
        let end = Instant::now() + Duration::from_secs(120);
        while Instant::now() < end {
            if self.get("/readyz").status == 200 {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("not ready in 120 s: {}", self.log());
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data.join("api-token")).expect("generated token").trim().to_owned()
    }

    pub fn get(&self, path: &str) -> Reply {
        http(self.port, "GET", path, None, None)
    }

    pub fn post(&self, path: &str, token: Option<&str>, body: &Value) -> Reply {
        http(self.port, "POST", path, token, Some(body.to_string().as_bytes()))
    }
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{} is not JSON ({e}): {}", self.status, self.body))
    }

    /// The `error` of a JSON error body (empty when there is none).
    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or_default().to_owned()
    }

    /// A 4xx with a `{"error": "..."}` body.
    pub fn client_error(&self, status: u16) -> bool {
        self.status == status && self.json()["error"].as_str().is_some_and(|e| !e.is_empty())
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`), bounded in time.
pub fn http(port: u16, method: &str, path: &str, token: Option<&str>, body: Option<&[u8]>) -> Reply {
    http_raw(port, method, path, token, body, "application/json").expect("request")
}

pub fn http_raw(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
    content_type: &str,
) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(180)))?;
    s.set_write_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!("Content-Type: {content_type}\r\nContent-Length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    if let Some(b) = body {
        // The server may answer (413) and close before reading all of an oversized body.
        let _ = s.write_all(b);
    }
    let mut raw = Vec::new();
    s.take(32 << 20).read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.into() };
    Ok(Reply { status, content_type, body })
}

pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The value of the metric line `name{labels} value`.
pub fn metric(text: &str, name: &str, release: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("release=\"{release}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

pub fn mixer_world(dir: &Path) -> (PathBuf, Vec<PathBuf>, String) {
    mixer_world_declared(dir, false)
}

/// The mixer release (optionally declaring determinism), its two items and the policy line.
pub fn mixer_world_declared(dir: &Path, deterministic: bool) -> (PathBuf, Vec<PathBuf>, String) {
    let rel = dir.join("mixer");
    super::mixer_release(&rel, "mixer", deterministic);
    let (invoice, payslip, policy) = super::mixer_world(dir, 200, "");
    (rel, vec![invoice, payslip], format!("policy = \"{}\"\n", policy.display()))
}

/// The fleet keys of the service whose data directory is `data` (`germline fleet keys`).
pub fn fleet_keys(data: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(["fleet", "keys", "--data-dir"])
        .arg(data)
        .output()
        .expect("germline fleet keys");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("keys JSON")
}
