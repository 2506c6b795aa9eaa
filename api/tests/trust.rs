//! Configured trust of `germline serve` (the real binary, loopback only): admission names
//! a trust anchor of the service's configuration; a root, key or identity sent by the
//! caller is refused unless the operator allowed it; a followed TUF repository, served
//! over loopback HTTP, has its new targets admitted (G1–G3, germline start, the `admit`
//! lifecycle event in the ledger), a tampered target and a foreign publisher's metadata
//! refused; Sigstore admission over the API with a valid keyless bundle from a CA, CT log
//! and transparency log made in the test (offline), and refusals of a wrong identity, a
//! modified archive and a foreign CA.

mod common;

use common::serve::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ECHO: &str = "from mcp.server.fastmcp import FastMCP\ndef create_server():\n    m = FastMCP('echo')\n    @m.tool()\n    def echo(text: str) -> str:\n        \"\"\"Echo.\"\"\"\n        return 'echo: ' + text\n    return m\n";

/// Builds the archive of release `name` at `version` under `dir`; returns its path.
fn build(dir: &Path, name: &str, version: &str) -> PathBuf {
    let rel = dir.join(format!("src-{name}-{version}"));
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::write(
        rel.join("germline.toml"),
        format!("[release]\nname = \"{name}\"\nversion = \"{version}\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n"),
    )
    .unwrap();
    std::fs::write(rel.join("server.py"), ECHO).unwrap();
    let archive = dir.join(format!("{name}-{version}.tar.gz"));
    germline(&["release", "build", &rel.to_string_lossy(), "--out", &archive.to_string_lossy()], dir);
    archive
}

/// A TUF repository of `germline repo` at `dir/repo` with `archive` as its first target;
/// returns (repo, keys).
fn publish(dir: &Path, archive: &Path) -> (PathBuf, PathBuf) {
    let (repo, keys) = (dir.join("repo"), dir.join("keys"));
    germline(&["repo", "init", &repo.to_string_lossy(), "--keys", &keys.to_string_lossy()], dir);
    germline(
        &["repo", "add", &repo.to_string_lossy(), &archive.to_string_lossy(), "--keys", &keys.to_string_lossy()],
        dir,
    );
    (repo, keys)
}

/// What these tests ask of a running service beyond the shared harness.
trait TrustService {
    /// `germline serve` with the `extra` configuration lines in `dir/<tag>/`.
    fn start_tagged(dir: &Path, tag: &str, extra: &str) -> Service;
    /// POST with the service's token.
    fn send(&self, path: &str, body: &Value) -> Reply;
    /// The admitted release `name` at `version`, once its germline start was decided.
    fn started(&self, name: &str, version: &str) -> Option<Value>;
    /// The admitted release `name` at `version`, if any.
    fn release(&self, name: &str, version: &str) -> Option<Value>;
    /// Ledger entries of `kind` about `release`.
    fn entries(&self, kind: &str, release: &str) -> Vec<Value>;
    /// The value of the metric line starting with `line_prefix` (0 when absent).
    fn metric(&self, line_prefix: &str) -> f64;
}

impl TrustService for Service {
    fn start_tagged(dir: &Path, tag: &str, extra: &str) -> Service {
        Service::launch(&dir.join(tag), extra, &[], &[])
    }

    fn send(&self, path: &str, body: &Value) -> Reply {
        self.post(path, Some(&self.token()), body)
    }

    fn started(&self, name: &str, version: &str) -> Option<Value> {
        self.release(name, version).filter(|r| r["germline"] != "not_started")
    }

    fn release(&self, name: &str, version: &str) -> Option<Value> {
        let list = self.get("/v1/releases").json();
        list.as_array()?.iter().find(|r| r["name"] == name && r["version"] == version).cloned()
    }

    fn entries(&self, kind: &str, release: &str) -> Vec<Value> {
        let page = self.get("/v1/ledger/entries?limit=1000").json();
        page["entries"]
            .as_array()
            .map(|a| a.iter().filter(|e| e["kind"] == kind && e["release"] == release).cloned().collect())
            .unwrap_or_default()
    }

    fn metric(&self, line_prefix: &str) -> f64 {
        let text = self.get("/metrics").body;
        text.lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
}

/// Waits (bounded) until `f` gives a value; panics with `what` and the log otherwise.
fn wait_for<T>(svc: &Service, what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> (T, Duration) {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return (v, start.elapsed());
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}\n{}", svc.log());
        std::thread::sleep(Duration::from_millis(200));
    }
}

// ---- TUF: configured anchors and caller-supplied roots ----

#[test]
fn admission_names_a_configured_tuf_anchor_and_caller_roots_are_refused_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let archive = build(dir, "echo", "1.0.0");
    let (repo, _) = publish(dir, &archive);
    let root_path = repo.join("metadata/1.root.json");
    let root = std::fs::read_to_string(&root_path).unwrap();
    let anchor = format!("[trust.tuf.registry]\nroot = \"{}\"\nrepo = \"{}\"\n", root_path.display(), repo.display());
    let caller = json!({"repo": repo, "root": root, "target": "echo"});

    // Default configuration: the caller's root is refused before anything is fetched.
    let svc = Service::start_tagged(dir, "default", &anchor);
    let r = svc.send("/v1/releases/tuf", &caller);
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r.error().contains("anchor") && r.error().contains("allow_caller_roots"), "a clear refusal: {r:?}");
    assert_eq!(svc.get("/v1/releases").json(), json!([]), "nothing admitted from a caller's root");
    let unknown = svc.send("/v1/releases/tuf", &json!({"anchor": "elsewhere", "target": "echo"}));
    assert!(unknown.status == 422 && unknown.error().contains("registry"), "{unknown:?}");
    let mixed = svc.send("/v1/releases/tuf", &json!({"anchor": "registry", "root": root, "target": "echo"}));
    assert_eq!(mixed.status, 422, "an anchor and a root together: {mixed:?}");
    let key = svc.send(
        "/v1/releases/sigstore",
        &json!({"archive_base64": "AAAA", "bundle": "c2ln", "key": "-----BEGIN PUBLIC KEY-----\n"}),
    );
    assert!(key.status == 403 && key.error().contains("allow_caller_roots"), "a caller's key too: {key:?}");

    // Naming the anchor admits: verified from the configured root, G1–G3, germline started.
    let r = svc.send("/v1/releases/tuf", &json!({"anchor": "registry", "target": "echo"}));
    assert_eq!(r.status, 201, "{r:?}\n{}", svc.log());
    let admitted = r.json();
    assert_eq!((admitted["version"].as_str(), admitted["germline"].as_str()), (Some("1.0.0"), Some("running")));
    let hash = admitted["hash"].as_str().unwrap().to_owned();
    let events = svc.entries("lifecycle", &hash);
    assert!(events.iter().any(|e| e["body"]["action"] == "admit"), "admit recorded: {events:?}");
    println!("anchor admission: 201, lifecycle events {}; caller root: 403, unknown anchor 422", events.len());
    drop(svc);

    // The operator's opt-in: the same caller-supplied root is accepted.
    let svc = Service::start_tagged(dir, "allowed", "trust.allow_caller_roots = true\n");
    let r = svc.send("/v1/releases/tuf", &caller);
    assert_eq!(r.status, 201, "allowed by the operator: {r:?}\n{}", svc.log());
    assert_eq!(r.json()["hash"], hash.as_str());
    println!("caller root: refused 403 by default, admitted 201 with allow_caller_roots");
}

// ---- TUF: following a repository over loopback HTTP ----

/// A static file server on 127.0.0.1 whose root can be switched in one step (a publisher
/// preparing the next repository state beside the served one, then swapping it in).
struct RepoServer {
    port: u16,
    root: Arc<Mutex<PathBuf>>,
    served: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl RepoServer {
    fn start(root: PathBuf) -> RepoServer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (root, served, stop) =
            (Arc::new(Mutex::new(root)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (r, n, s) = (root.clone(), served.clone(), stop.clone());
        std::thread::spawn(move || {
            // Bounded: at most this many connections, then the server stops.
            for c in l.incoming().take(50_000) {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(c) = c {
                    let dir = r.lock().unwrap().clone();
                    n.fetch_add(1, Ordering::SeqCst);
                    let _ = serve_file(c, &dir);
                }
            }
        });
        RepoServer { port, root, served, stop }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn switch(&self, to: PathBuf) {
        *self.root.lock().unwrap() = to;
    }
}

impl Drop for RepoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve_file(mut c: TcpStream, root: &Path) -> std::io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
        let n = c.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split(' ').nth(1).unwrap_or("/");
    let file = (!path.contains("..")).then(|| root.join(path.trim_start_matches('/')));
    match file.and_then(|f| std::fs::read(f).ok()) {
        Some(bytes) => {
            c.write_all(
                format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", bytes.len()).as_bytes(),
            )?;
            c.write_all(&bytes)
        }
        None => c.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"),
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().unwrap().is_dir() {
            copy_dir(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// The next state of the served repository: a copy of `current` with `archive` added
/// (its stored bytes altered after signing when `tamper`), in a new directory.
fn next_state(dir: &Path, current: &Path, keys: &Path, archive: &Path, tamper: bool) -> PathBuf {
    let next = dir.join(format!("served-{}", archive.file_name().unwrap().to_string_lossy()));
    copy_dir(current, &next);
    germline(
        &["repo", "add", &next.to_string_lossy(), &archive.to_string_lossy(), "--keys", &keys.to_string_lossy()],
        dir,
    );
    if tamper {
        let name = archive.file_name().unwrap().to_string_lossy().into_owned();
        let stored = std::fs::read_dir(next.join("targets"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().unwrap().to_string_lossy().ends_with(&format!(".{name}")))
            .expect("stored target");
        let mut bytes = std::fs::read(&stored).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x55;
        std::fs::write(&stored, bytes).unwrap();
    }
    next
}

#[test]
fn a_followed_repository_has_new_targets_admitted_and_tampered_ones_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let v1 = build(dir, "echo", "1.0.0");
    let (repo, keys) = publish(dir, &v1);
    // An older version signed after it: following takes the highest version of a name.
    let v0 = build(dir, "echo", "0.9.0");
    germline(&["repo", "add", &repo.to_string_lossy(), &v0.to_string_lossy(), "--keys", &keys.to_string_lossy()], dir);
    let root_path = dir.join("pinned-root.json");
    std::fs::copy(repo.join("metadata/1.root.json"), &root_path).unwrap();
    let server = RepoServer::start(repo.clone());
    let poll_ms = 300;
    let svc = Service::start_tagged(
        dir,
        "follower",
        &format!(
            "[trust.tuf.registry]\nroot = \"{}\"\nrepo = \"{}\"\nfollow = true\npoll_interval_ms = {poll_ms}\n",
            root_path.display(),
            server.url()
        ),
    );
    assert!(svc.log().contains("following TUF repository \"registry\""), "{}", svc.log());
    let limit = Duration::from_secs(120);
    let (first, t1) = wait_for(&svc, "the first target admitted", limit, || svc.started("echo", "1.0.0"));
    assert_eq!(first["germline"], "running", "{first}");
    assert!(svc.release("echo", "0.9.0").is_none(), "only the highest version of a name is followed");

    // A new version published (metadata and target swapped in at once) is admitted, and
    // its admission is a lifecycle event in the ledger.
    let v2 = build(dir, "echo", "1.1.0");
    let state2 = next_state(dir, &repo, &keys, &v2, false);
    server.switch(state2.clone());
    let (second, t2) = wait_for(&svc, "the new target admitted", limit, || svc.started("echo", "1.1.0"));
    assert_eq!(second["germline"], "running", "{second}");
    let hash2 = second["hash"].as_str().unwrap().to_owned();
    let events = svc.entries("lifecycle", &hash2);
    let admit = events.iter().find(|e| e["body"]["action"] == "admit").unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(admit["body"]["version"], "1.1.0", "{admit}");
    // The call path works on the followed release.
    let call = svc.send(&format!("/v1/releases/{hash2}/calls"), &json!({"tool": "echo", "arguments": {"text": "hi"}}));
    assert!(call.status == 200 && call.body.contains("echo: hi"), "{call:?}");

    // A target whose stored bytes differ from what targets.json signs: refused, counted,
    // not admitted, and not retried at every poll.
    let refused_metric = "germline_tuf_follow_targets_total{anchor=\"registry\",outcome=\"refused\"}";
    assert_eq!(svc.metric(refused_metric), 0.0);
    let v3 = build(dir, "echo", "1.2.0");
    let state3 = next_state(dir, &state2, &keys, &v3, true);
    server.switch(state3);
    let (_, t3) =
        wait_for(&svc, "the tampered target refused", limit, || (svc.metric(refused_metric) >= 1.0).then_some(()));
    let polls_then = svc.metric("germline_tuf_follow_polls_total{anchor=\"registry\",outcome=\"ok\"}");
    std::thread::sleep(Duration::from_millis(poll_ms * 5));
    let polls_after = svc.metric("germline_tuf_follow_polls_total{anchor=\"registry\",outcome=\"ok\"}");
    assert!(polls_after > polls_then, "the follower kept polling ({polls_then} -> {polls_after})");
    assert_eq!(svc.metric(refused_metric), 1.0, "refused once, not at every poll");
    assert!(svc.release("echo", "1.2.0").is_none(), "the tampered target is not admitted");
    assert!(svc.log().contains("refused target echo-1.2.0.tar.gz") && svc.log().contains("sha256"), "{}", svc.log());

    // The same location now serving another publisher's repository (its own keys, a new
    // version): the metadata does not verify from the pinned root, nothing is admitted.
    let failed_metric = "germline_tuf_follow_polls_total{anchor=\"registry\",outcome=\"failed\"}";
    assert_eq!(svc.metric(failed_metric), 0.0);
    let v4 = build(dir, "echo", "1.3.0");
    let (mallory, mallory_keys) = (dir.join("mallory-repo"), dir.join("mallory-keys"));
    germline(&["repo", "init", &mallory.to_string_lossy(), "--keys", &mallory_keys.to_string_lossy()], dir);
    germline(
        &["repo", "add", &mallory.to_string_lossy(), &v4.to_string_lossy(), "--keys", &mallory_keys.to_string_lossy()],
        dir,
    );
    server.switch(mallory);
    let (_, t4) =
        wait_for(&svc, "the foreign metadata refused", limit, || (svc.metric(failed_metric) >= 2.0).then_some(()));
    assert!(svc.release("echo", "1.3.0").is_none(), "a foreign publisher's target is not admitted");
    assert!(svc.release("echo", "0.9.0").is_none(), "the older version was never admitted");
    let admitted = svc.metric("germline_tuf_follow_targets_total{anchor=\"registry\",outcome=\"admitted\"}");
    assert_eq!(admitted, 2.0);
    assert_eq!(svc.get("/v1/releases").json().as_array().map(Vec::len), Some(2));
    println!(
        "followed (poll {poll_ms} ms): first target admitted after {} ms, new target after {} ms, tampered target refused after {} ms, foreign metadata refused (2 polls) after {} ms; polls ok {polls_after}, admitted {admitted}, refused 1; repository requests served {}",
        t1.as_millis(),
        t2.as_millis(),
        t3.as_millis(),
        t4.as_millis(),
        server.served.load(Ordering::SeqCst)
    );
}

// ---- Sigstore over the API: a keyless bundle from a test CA, and a cosign key ----

#[path = "../../admission/tests/common/sigstore_ca.rs"]
mod sigstore_ca;

#[test]
fn sigstore_admission_over_the_api_with_a_valid_bundle_and_a_pinned_cosign_key() {
    use base64::engine::general_purpose::STANDARD as B64;
    use base64::Engine;
    use sigstore_ca::{Fulcio, Log, IDENTITY, ISSUER};

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let archive = std::fs::read(build(dir, "echo", "1.0.0")).unwrap();
    let other = std::fs::read(build(dir, "echo-keyed", "1.0.0")).unwrap();
    let (log, fulcio) = (Log::new(), Fulcio::new());
    let trusted_root = dir.join("trusted_root.json");
    std::fs::write(&trusted_root, fulcio.trusted_root(&log)).unwrap();
    let cosign = sigstore_verify::crypto::KeyPair::generate_ecdsa_p256().unwrap();
    let cosign_pub = dir.join("cosign.pub");
    std::fs::write(&cosign_pub, cosign.public_key_der().unwrap().to_pem()).unwrap();
    let svc = Service::start_tagged(
        dir,
        "sigstore",
        &format!(
            "[trust.sigstore.ci]\nidentity = \"{IDENTITY}\"\nissuer = \"{ISSUER}\"\ntrusted_root = \"{}\"\n[trust.cosign.release-key]\npublic_key = \"{}\"\n",
            trusted_root.display(),
            cosign_pub.display()
        ),
    );
    let admit = |archive: &[u8], bundle: String, anchor: &str| {
        svc.send(
            "/v1/releases/sigstore",
            &json!({"archive_base64": B64.encode(archive), "bundle": bundle, "anchor": anchor}),
        )
    };

    // Refusals first, so the valid admission below is the only one.
    let wrong_identity = fulcio.bundle(&log, "mallory@germline.test", true, &archive).to_string();
    let r = admit(&archive, wrong_identity, "ci");
    assert!(r.status == 422 && r.error().to_lowercase().contains("identity"), "wrong identity: {r:?}");
    let good = fulcio.bundle(&log, IDENTITY, true, &archive).to_string();
    let mut modified = archive.clone();
    let mid = modified.len() / 2;
    modified[mid] ^= 1;
    let r = admit(&modified, good.clone(), "ci");
    assert_eq!(r.status, 422, "modified archive: {r:?}");
    let foreign = Fulcio::new().bundle(&log, IDENTITY, true, &archive).to_string();
    let r = admit(&archive, foreign, "ci");
    assert_eq!(r.status, 422, "a CA the pinned trusted root does not list: {r:?}");
    let caller = svc.send(
        "/v1/releases/sigstore",
        &json!({"archive_base64": B64.encode(&archive), "bundle": good, "certificate_identity": IDENTITY,
                "certificate_oidc_issuer": ISSUER, "trusted_root": fulcio.trusted_root(&log)}),
    );
    assert_eq!(caller.status, 403, "a caller's identity and trusted root: {caller:?}");
    assert_eq!(svc.get("/v1/releases").json(), json!([]), "nothing admitted by the refusals");

    // The valid keyless bundle: admitted, G1–G3 passed, germline running, lifecycle recorded.
    let r = admit(&archive, good, "ci");
    assert_eq!(r.status, 201, "{r:?}\n{}", svc.log());
    let v = r.json();
    let expected = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&archive))
    };
    assert_eq!((v["hash"].as_str(), v["germline"].as_str()), (Some(expected.as_str()), Some("running")), "{v}");
    assert!(svc.entries("lifecycle", &expected).iter().any(|e| e["body"]["action"] == "admit"));

    // A cosign signature with the pinned key; a signature by another key is refused.
    let stranger = sigstore_verify::crypto::KeyPair::generate_ecdsa_p256().unwrap();
    let r = admit(&other, B64.encode(stranger.sign(&other).unwrap().as_bytes()), "release-key");
    assert_eq!(r.status, 422, "another key's signature: {r:?}");
    let r = admit(&other, B64.encode(cosign.sign(&other).unwrap().as_bytes()), "release-key");
    assert_eq!(r.status, 201, "{r:?}\n{}", svc.log());
    assert_eq!(svc.get("/v1/releases").json().as_array().map(Vec::len), Some(2));
    println!("sigstore over the API: keyless bundle 201; wrong identity 422, modified archive 422, foreign CA 422, caller trust 403; cosign key 201, other key 422");
}
