//! `germline serve`, the HTTP API service, run as the real binary on an ephemeral loopback
//! port: every documented endpoint answers, a call's copies and triggers reach /metrics
//! (its latency only when no copy held a label), mutating endpoints need the token, bad
//! input gets 4xx JSON errors while the service stays up, SIGTERM loses no ledger entry,
//! and schemathesis fuzzing the served OpenAPI document finds no server error and no
//! schema violation.

mod common;

use common::serve::*;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A release directory with one tool.
fn write_release(dir: &Path, name: &str, manifest_extra: &str, code: &str) -> PathBuf {
    let rel = dir.join(name);
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::write(
        rel.join("germline.toml"),
        format!("[release]\nname = \"{name}\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n{manifest_extra}"),
    )
    .unwrap();
    std::fs::write(rel.join("server.py"), code).unwrap();
    rel
}

const ECHO: &str = "from mcp.server.fastmcp import FastMCP\ndef create_server():\n    m = FastMCP('echo')\n    @m.tool()\n    def echo(text: str) -> str:\n        \"\"\"Echo.\"\"\"\n        return 'echo: ' + text\n    return m\n";

/// A loopback sink answering 200 "ok" to up to `max` connections and keeping every byte
/// it received; returns its port and those bytes.
fn recording_sink(max: usize) -> (u16, Arc<Mutex<Vec<u8>>>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    std::thread::spawn(move || {
        for mut c in l.incoming().take(max).flatten() {
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 65536];
            let n = c.read(&mut buf).unwrap_or(0);
            keep.lock().unwrap().extend_from_slice(&buf[..n]);
            let _ = c.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    (port, seen)
}

/// Extra `serve` arguments, extra environment, and the baseline `/readyz` must report.
type BaselineCase = (&'static [&'static str], &'static [(&'static str, &'static str)], Option<&'static str>);

/// The service runs the unprotected baseline only when `--baseline` says so: with
/// `GERMLINE_RUNTIME=sig-pin` in its environment it still runs germline (the hr payslip
/// never reaches the finance-only OCR sink, `/readyz` reports `"baseline": null`); with
/// `--baseline sig-pin` the mixer leaks the payslip to the sink and `/readyz` says
/// `"baseline": "sig-pin"`.
#[test]
fn only_the_baseline_flag_runs_a_baseline_and_readyz_reports_it() {
    let cases: [BaselineCase; 2] =
        [(&[], &[("GERMLINE_RUNTIME", "sig-pin")], None), (&["--baseline", "sig-pin"], &[], Some("sig-pin"))];
    for (args, envs, baseline) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (port, seen) = recording_sink(20);
        let rel = dir.join("mixer");
        common::mixer_release(&rel, "mixer", false);
        let (invoice, payslip, policy) = common::mixer_world_at(dir, port, "");
        let admit = publish(dir, &rel);
        let svc = Service::start_with(dir, &format!("policy = \"{}\"\n", policy.display()), args, envs);
        let ready = svc.get("/readyz").json();
        assert_eq!(ready["baseline"], json!(baseline), "{args:?} {envs:?}: {ready}");
        let token = svc.token();
        let admitted = svc.post("/v1/releases/tuf", Some(&token), &admit);
        assert_eq!(admitted.status, 201, "{admitted:?}\n{}", svc.log());
        let hash = admitted.json()["hash"].as_str().unwrap().to_owned();
        let call =
            json!({"tool": "scan", "arguments": {"document": invoice, "extra": payslip}, "items": [invoice, payslip]});
        let r = svc.post(&format!("/v1/releases/{hash}/calls"), Some(&token), &call);
        assert_eq!(r.status, 200, "{r:?}\n{}", svc.log());
        let out = r.json();
        assert!(out["result"].to_string().contains("scanned"), "{out}");
        let received = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
        assert!(received.contains("invoice 12"), "the OCR host got the invoice either way: {received:?}");
        let leaked = received.contains("salary 99");
        eprintln!(
            "{args:?} {envs:?}: baseline {baseline:?}, payslip at the finance-only sink: {leaked}, copies {}",
            out["copies"]
        );
        assert_eq!(leaked, baseline.is_some(), "{args:?} {envs:?}: {received:?} {out}");
        if baseline.is_none() {
            assert_eq!(out["copies"], 2, "germline split the call: {out}");
        }
    }
}

#[test]
fn every_documented_endpoint_answers_and_calls_reach_the_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (rel, items, policy_line) = mixer_world(dir);
    let admit = publish(dir, &rel);
    let svc = Service::start(dir, &policy_line);
    let token = svc.token();
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut mark = |m: &str, p: &str| seen.insert((m.to_owned(), p.to_owned()));

    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(svc.data.join("api-token")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the generated token is private");
        assert!(svc.log().contains("api-token"), "the log says where the token is");
    }
    assert_eq!(svc.get("/healthz").json()["status"], "ok");
    mark("get", "/healthz");
    let ready = svc.get("/readyz").json();
    assert_eq!(ready["status"], "ready");
    let limits = ready["per_copy_limits"].as_str().unwrap_or_default().to_owned();
    assert!(
        limits.contains("per copy") || limits.starts_with("NO per-copy"),
        "/readyz says what limits copies: {ready}"
    );
    // The service runs with this test's privileges and environment: as root, the resident
    // root is the default; without root, `/readyz` names the channels left open.
    let resident = ready["resident_root"].as_str().unwrap_or_default();
    if germline_executor::policy::default_resident_root() {
        assert_eq!(resident, "on by default", "{ready}");
    } else {
        assert!(resident.starts_with("off by default (page-cache residency"), "{ready}");
    }
    mark("get", "/readyz");
    let doc = svc.get("/openapi.json").json();
    mark("get", "/openapi.json");

    // Admission: no token and a wrong token are refused before anything runs.
    assert!(svc.post("/v1/releases/tuf", None, &admit).client_error(401));
    assert!(svc.post("/v1/releases/tuf", Some("not-the-token"), &admit).client_error(401));
    assert_eq!(svc.get("/v1/releases").json(), json!([]), "nothing admitted without the token");
    let admitted = svc.post("/v1/releases/tuf", Some(&token), &admit);
    assert_eq!(admitted.status, 201, "{admitted:?}\n{}", svc.log());
    mark("post", "/v1/releases/tuf");
    let hash = admitted.json()["hash"].as_str().unwrap().to_owned();
    assert_eq!(admitted.json()["germline"], "running");
    let bogus = json!({"archive_base64": "AAAA", "bundle": "{}", "key": "not a key"});
    assert!(svc.post("/v1/releases/sigstore", Some(&token), &bogus).client_error(422));
    mark("post", "/v1/releases/sigstore");
    let list = svc.get("/v1/releases").json();
    assert_eq!(list[0]["hash"], hash.as_str());
    mark("get", "/v1/releases");
    assert_eq!(svc.get(&format!("/v1/releases/{hash}")).json()["name"], "mixer");
    mark("get", "/v1/releases/{hash}");

    // One call: result, label and copies come back; /metrics shows copies, triggers, latency.
    let call = json!({"tool": "scan", "arguments": {"document": items[0], "extra": items[1]}, "items": items});
    let r = svc.post(&format!("/v1/releases/{hash}/calls"), Some(&token), &call);
    assert_eq!(r.status, 200, "{r:?}");
    mark("post", "/v1/releases/{hash}/calls");
    let out = r.json();
    assert!(out["result"].to_string().contains("scanned"), "{out}");
    assert_eq!(out["label"], json!(["finance", "hr"]), "{out}");
    assert_eq!(out["copies"], 2, "{out}");
    assert_eq!(out["triggers"].as_array().map(Vec::len), Some(1), "{out}");
    let metrics = svc.get("/metrics");
    mark("get", "/metrics");
    assert!(metrics.content_type.starts_with("application/openmetrics-text"), "{}", metrics.content_type);
    let m = &metrics.body;
    assert_eq!(metric(m, "germline_call_copies_sum", &hash), Some(2.0), "{m}");
    assert_eq!(metric(m, "germline_call_copies_count", &hash), Some(1.0), "{m}");
    assert_eq!(metric(m, "germline_triggers_total", &hash), Some(1.0), "{m}");
    // The call's copies held labelled items, so how long it took is theirs to choose:
    // /metrics (read by anyone) gets no latency sample of it (`redteam_outputs`).
    assert_eq!(metric(m, "germline_call_duration_seconds_count", &hash), None, "{m}");
    assert!(m.contains(&format!("germline_calls_total{{release=\"{hash}\",outcome=\"ran\"}} 1")), "{m}");
    assert!(svc.log().contains("call{") && svc.log().contains("copies=2"), "a span per call: {}", svc.log());

    // A session runs its calls in order on the same germline.
    let session = json!({"calls": [call.clone(), {"tool": "scan", "arguments": {"document": items[0], "extra": items[0]}, "items": [items[0]]}]});
    let r = svc.post(&format!("/v1/releases/{hash}/sessions"), Some(&token), &session);
    assert_eq!(r.status, 200, "{r:?}");
    mark("post", "/v1/releases/{hash}/sessions");
    let outcomes = r.json()["outcomes"].as_array().cloned().unwrap();
    assert_eq!(outcomes.len(), 2);
    assert_eq!(outcomes[1]["label"], json!(["finance"]));

    // Witnesses follow the calls (verified after the result is out).
    let end = Instant::now() + Duration::from_secs(180);
    let witnesses = loop {
        let w = svc.get(&format!("/v1/releases/{hash}/witnesses")).json();
        if w.as_array().is_some_and(|a| a.len() >= 2) || Instant::now() > end {
            break w;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    mark("get", "/v1/releases/{hash}/witnesses");
    assert!(witnesses[0]["verdict"].is_string() && witnesses[0]["tool"] == "scan", "{witnesses}\n{}", svc.log());
    let damp = svc.get(&format!("/v1/releases/{hash}/dampening")).json();
    mark("get", "/v1/releases/{hash}/dampening");
    assert_eq!(damp["suppressed"], false, "undeclared determinism: three unverified events stay below 2000");
    assert!(
        damp["calls"].as_u64().is_some_and(|c| c >= 3) && damp["penalty"].as_f64().is_some_and(|p| p > 0.0),
        "{damp}"
    );
    // Counted once recorded (off the lane, right after the ledger entry).
    let want = witnesses.as_array().map(|a| a.len() as f64);
    let end = Instant::now() + Duration::from_secs(10);
    let mut m = svc.get("/metrics").body;
    while metric(&m, "germline_witnesses_total", &hash) != want && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
        m = svc.get("/metrics").body;
    }
    assert_eq!(metric(&m, "germline_witnesses_total", &hash), want, "{m}");

    // The ledger: sign, read, prove.
    assert!(svc.get("/v1/ledger/checkpoint").client_error(404) || svc.get("/v1/ledger/checkpoint").status == 200);
    assert!(svc.post("/v1/ledger/checkpoints", None, &json!({})).client_error(401));
    let signed = svc.post("/v1/ledger/checkpoints", Some(&token), &json!({})).json();
    mark("post", "/v1/ledger/checkpoints");
    let size = signed["size"].as_u64().unwrap();
    assert!(size >= 5, "{signed}");
    assert_eq!(svc.get("/v1/ledger/checkpoint").json()["root"], signed["root"]);
    mark("get", "/v1/ledger/checkpoint");
    let entries = svc.get("/v1/ledger/entries?start=0&limit=2").json();
    mark("get", "/v1/ledger/entries");
    assert_eq!(entries["entries"].as_array().map(Vec::len), Some(2));
    assert_eq!(svc.get("/v1/ledger/entries/0").json()["release"], hash.as_str());
    mark("get", "/v1/ledger/entries/{index}");
    let inc = svc.get(&format!("/v1/ledger/proofs/inclusion?index=1&size={size}")).json();
    mark("get", "/v1/ledger/proofs/inclusion");
    assert_eq!(inc["root"], signed["root"]);
    let con = svc.get(&format!("/v1/ledger/proofs/consistency?old=1&new={size}")).json();
    mark("get", "/v1/ledger/proofs/consistency");
    assert_eq!(con["new_root"], signed["root"]);

    // The fleet's public log: checkpoint, tiles, lookups, the witness endpoint, status.
    let note = svc.get("/checkpoint");
    mark("get", "/checkpoint");
    assert_eq!(note.status, 200, "{note:?}");
    assert!(note.body.starts_with(svc.get("/v1/ledger/checkpoint").json()["origin"].as_str().unwrap()), "{note:?}");
    let tile = http(svc.port, "GET", "/tile/0/000.p/1", None, None);
    mark("get", "/tile/{path}");
    assert_eq!(tile.status, 200, "the first leaf hash: {tile:?}");
    assert!(svc.get("/tile/not-a-tile").client_error(400));
    let lookup = svc.get(&format!("/lookup/{hash}")).json();
    mark("get", "/lookup/{release}");
    assert!(lookup["entries"].as_array().is_some_and(|e| !e.is_empty()), "{lookup}");
    assert!(svc.get("/lookup/nothex").client_error(400));
    assert_eq!(svc.get("/fleet/status").json(), json!([]), "no peers configured");
    mark("get", "/fleet/status");
    let refused = http(svc.port, "POST", "/add-checkpoint", None, Some(b"old 0\n\nnot a checkpoint\n"));
    mark("post", "/add-checkpoint");
    assert!(matches!(refused.status, 400 | 403 | 404), "a stranger's checkpoint is not cosigned: {refused:?}");

    // Formation-consistent dispatch: the first release of a name is promoted at admission;
    // a formed call is pending until dispatched; the current release cannot be retired.
    let formed = svc.post(
        "/v1/formations",
        Some(&token),
        &json!({"release": "mixer", "tool": "scan", "arguments": {"document": items[0], "extra": items[0]}, "items": [items[0]]}),
    );
    assert_eq!(formed.status, 201, "{formed:?}\n{}", svc.log());
    mark("post", "/v1/formations");
    let formation = formed.json();
    assert_eq!(formation["record"]["snapshot"]["release"], hash.as_str(), "{formation}");
    let id = formation["id"].as_str().unwrap().to_owned();
    let ran = svc.post(&format!("/v1/formations/{id}/dispatch"), Some(&token), &json!({}));
    assert_eq!(ran.status, 200, "{ran:?}");
    mark("post", "/v1/formations/{id}/dispatch");
    assert_eq!(ran.json()["label"], json!(["finance"]), "{ran:?}");
    assert!(svc
        .post(&format!("/v1/formations/{}/dispatch", "ab".repeat(32)), Some(&token), &json!({}))
        .client_error(404));
    let retire = svc.post(&format!("/v1/releases/{hash}/lifecycle"), Some(&token), &json!({"action": "retire"}));
    assert!(retire.client_error(409), "the current release cannot be retired: {retire:?}");
    mark("post", "/v1/releases/{hash}/lifecycle");
    let (status, sid, init) =
        mcp(svc.port, "mixer", &token, None, &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}));
    assert_eq!(status, 200, "{init}");
    mark("post", "/v1/mcp/{name}");
    let (_, _, pong) =
        mcp(svc.port, "mixer", &token, sid.as_deref(), &json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}));
    assert_eq!(pong["result"], json!({}), "{pong}");
    let (status, _, _) =
        mcp(svc.port, "mixer", &token, Some("nope"), &json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}));
    assert_eq!(status, 404, "an unknown session");

    // Policies: what is in force, and a reload that changes nothing restarts nothing.
    let policies = svc.get("/v1/policies");
    assert_eq!(policies.status, 200, "{policies:?}");
    assert!(policies.json()["default"]["sha256"].as_str().is_some_and(|d| d.len() == 64), "{policies:?}");
    mark("get", "/v1/policies");
    let reload = svc.post("/v1/policies/reload", Some(&token), &json!({}));
    assert_eq!(reload.status, 200, "{reload:?}");
    assert_eq!(reload.json()["restarted"], json!([]), "{reload:?}");
    mark("post", "/v1/policies/reload");

    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, ops)| ops.as_object().unwrap().keys().map(move |m| (m.clone(), p.clone())))
        .collect();
    assert_eq!(documented, seen, "every documented endpoint was exercised, and only those");
}

/// Waits (up to 120 s) until the service reports `hash` suppressed: a verdict lands after
/// the call that triggered it is answered.
fn wait_suppressed(svc: &Service, hash: &str) {
    let until = std::time::Instant::now() + Duration::from_secs(120);
    while svc.get(&format!("/v1/releases/{hash}/dampening")).json()["suppressed"] != true {
        assert!(std::time::Instant::now() < until, "never suppressed\n{}", svc.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Dampening through the API: one verified witness suppresses a release that declared
/// determinism, and its next call is refused (409) without running; the undeclared twin
/// in the test above keeps running after three diverging calls.
#[test]
fn a_suppressed_release_is_refused_with_409() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (rel, items, policy_line) = mixer_world_declared(dir, true);
    let admit = publish(dir, &rel);
    let svc = Service::start(dir, &policy_line);
    let token = svc.token();
    let admitted = svc.post("/v1/releases/tuf", Some(&token), &admit);
    assert_eq!(admitted.status, 201, "{admitted:?}");
    let hash = admitted.json()["hash"].as_str().unwrap().to_owned();
    let call = json!({"tool": "scan", "arguments": {"document": items[0], "extra": items[1]}, "items": items});
    let first = svc.post(&format!("/v1/releases/{hash}/calls"), Some(&token), &call);
    assert_eq!(first.status, 200, "{first:?}");
    // The witness is verified after the first answer, off the release's lane; the release
    // is suppressed once its verdict lands.
    wait_suppressed(&svc, &hash);
    let second = svc.post(&format!("/v1/releases/{hash}/calls"), Some(&token), &call);
    assert!(second.client_error(409), "{second:?}\n{}", svc.log());
    assert!(second.json()["error"].as_str().unwrap().contains("suppressed"), "{second:?}");
    let damp = svc.get(&format!("/v1/releases/{hash}/dampening")).json();
    assert_eq!(damp["suppressed"], true, "{damp}");
    assert_eq!(svc.get(&format!("/v1/releases/{hash}")).json()["dampening"]["suppressed"], true);
    // The verdict's suppression is counted right after its ledger batch, off the lane.
    let end = Instant::now() + Duration::from_secs(10);
    let mut m = svc.get("/metrics").body;
    while metric(&m, "germline_suppressions_total", &hash).is_none() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
        m = svc.get("/metrics").body;
    }
    assert_eq!(metric(&m, "germline_dampening_refusals_total", &hash), Some(1.0), "{m}");
    assert_eq!(metric(&m, "germline_suppressions_total", &hash), Some(1.0), "{m}");
    assert_eq!(metric(&m, "germline_call_copies_count", &hash), Some(1.0), "the refused call forked nothing: {m}");
}

#[test]
fn bad_requests_get_json_4xx_and_the_service_stays_up() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let tokens = dir.join("tokens.toml");
    // SHA-256 of "s3cret": the file holds hashes only.
    std::fs::write(
        &tokens,
        "[[tokens]]\nname = \"ops\"\nsha256 = \"1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0\"\n",
    )
    .unwrap();
    let svc = Service::start(dir, &format!("tokens_file = \"{}\"\nbody_limit_bytes = 4096\n", tokens.display()));
    assert!(!svc.data.join("api-token").exists(), "no token generated when a tokens file is configured");
    let unknown = format!("/v1/releases/{}/calls", "ab".repeat(32));
    let call = json!({"tool": "echo", "arguments": {"text": "x"}});

    // Authentication, off and on: the same request passes the check only with the token.
    assert!(svc.post(&unknown, None, &call).client_error(401));
    assert!(svc.post(&unknown, Some("s3cret-not"), &call).client_error(401));
    assert!(svc
        .post(&unknown, Some("1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0"), &call)
        .client_error(401));
    assert!(svc.post(&unknown, Some("s3cret"), &call).client_error(404), "token accepted, release unknown");
    assert_eq!(svc.post("/v1/ledger/checkpoints", Some("s3cret"), &json!({})).status, 200);
    assert_eq!(svc.get("/v1/ledger/entries").status, 200, "reads are open by default");

    // Every documented POST needs the token (no mutating endpoint is left open).
    let doc = svc.get("/openapi.json").json();
    // The one exception is C2SP tlog-witness `add-checkpoint`, authenticated by the
    // peer log's signature instead; it must say so (no bearer security) and refuse a
    // stranger's body.
    type Posts = Vec<(String, bool)>;
    let (posts, unsigned): (Posts, Posts) = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(p, ops)| {
            ops.get("post").map(|op| (p.replace("{hash}", &"ab".repeat(32)), op.get("security").is_some()))
        })
        .partition(|(_, bearer)| *bearer);
    assert_eq!(unsigned, vec![("/add-checkpoint".to_owned(), false)], "only the witness endpoint takes no token");
    let refused = svc.post("/add-checkpoint", None, &json!({}));
    assert!(matches!(refused.status, 400 | 403 | 404), "{refused:?}");
    let posts: Vec<String> = posts.into_iter().map(|(p, _)| p).collect();
    assert!(posts.len() >= 5, "{posts:?}");
    for p in &posts {
        assert!(svc.post(p, None, &json!({})).client_error(401), "{p} without a token");
        assert!(svc.post(p, Some("wrong"), &json!({})).client_error(401), "{p} with a wrong token");
        assert_ne!(svc.post(p, Some("s3cret"), &json!({})).status, 401, "{p} with the token");
    }

    // Body limit, under and over.
    let under = json!({"tool": "echo", "arguments": {"text": "a".repeat(3000)}});
    assert!(svc.post(&unknown, Some("s3cret"), &under).client_error(404));
    let over = json!({"tool": "echo", "arguments": {"text": "a".repeat(64 << 10)}});
    assert!(svc.post(&unknown, Some("s3cret"), &over).client_error(413));

    // Malformed input.
    let raw =
        |path: &str, body: &[u8], ct: &str| http_raw(svc.port, "POST", path, Some("s3cret"), Some(body), ct).unwrap();
    assert!(raw(&unknown, b"{not json", "application/json").client_error(400));
    assert!(raw(&unknown, b"{\"tool\": 5}", "application/json").client_error(400));
    assert!(raw(&unknown, b"{\"tool\": \"x\", \"surprise\": 1}", "application/json").client_error(400));
    assert!(raw(&unknown, b"{}", "text/plain").client_error(415));
    assert!(svc.post("/v1/releases/nothex/calls", Some("s3cret"), &call).client_error(400));
    assert!(svc.get(&format!("/v1/releases/{}", "AB".repeat(32))).client_error(400));
    assert!(svc.get(&format!("/v1/releases/{}", "ab".repeat(32))).client_error(404));
    assert!(svc.get("/v1/ledger/entries/-1").client_error(400));
    assert!(svc.get("/v1/ledger/entries/999").client_error(404));
    assert!(svc.get("/v1/ledger/entries?limit=0").client_error(400));
    assert!(svc.get("/v1/ledger/proofs/inclusion?index=x").client_error(400));
    assert!(svc.get("/v1/ledger/proofs/consistency?old=0&new=99").client_error(404));
    assert!(svc.get("/no/such/thing").client_error(404));
    let tuf = json!({"repo": "http://example.invalid/repo", "root": "{}", "target": "x"});
    assert!(svc.post("/v1/releases/tuf", Some("s3cret"), &tuf).client_error(403), "no URL is fetched unless allowed");
    let session = json!({"calls": []});
    assert!(svc.post(&format!("/v1/releases/{}/sessions", "ab".repeat(32)), Some("s3cret"), &session).status >= 400);

    assert_eq!(svc.get("/healthz").status, 200, "still up: {}", svc.log());
    assert!(!svc.log().contains("panicked"), "{}", svc.log());
}

/// A signed release whose initialisation starts a thread fails G1 at admission: 422 with
/// the check named, nothing admitted, and the refusal counted in /metrics.
#[test]
fn a_release_failing_g1_g3_is_refused_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let code = "import threading, time\nfrom mcp.server.fastmcp import FastMCP\ndef create_server():\n    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n    return FastMCP('x')\n";
    let rel = write_release(dir, "threaded", "", code);
    let admit = publish(dir, &rel);
    let svc = Service::start(dir, "");
    let r = svc.post("/v1/releases/tuf", Some(&svc.token()), &admit);
    assert!(r.client_error(422) && r.json()["error"].as_str().unwrap().contains("G1"), "{r:?}");
    assert_eq!(svc.get("/v1/releases").json(), json!([]));
    let m = svc.get("/metrics").body;
    assert_eq!(metric(&m, "germline_germline_refusals_total", "unadmitted"), Some(1.0), "{m}");
}

#[test]
fn reads_can_require_the_token_too() {
    let tmp = tempfile::tempdir().unwrap();
    let svc = Service::start(tmp.path(), "read_requires_token = true\n");
    let token = svc.token();
    for p in ["/v1/releases", "/v1/ledger/entries", "/metrics", "/openapi.json"] {
        assert!(svc.get(p).client_error(401), "{p} without a token");
        assert_eq!(http(svc.port, "GET", p, Some(&token), None).status, 200, "{p} with the token");
    }
    assert_eq!(svc.get("/healthz").status, 200, "health stays open for probes");
}

#[test]
fn sigterm_lets_in_flight_calls_finish_and_loses_no_ledger_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rel = write_release(dir, "echo", "", ECHO);
    let admit = publish(dir, &rel);
    let mut svc = Service::start(dir, "");
    let token = svc.token();
    let admitted = svc.post("/v1/releases/tuf", Some(&token), &admit);
    assert_eq!(admitted.status, 201, "{admitted:?}");
    let hash = admitted.json()["hash"].as_str().unwrap().to_owned();

    // Eight calls queue on the release's germline; SIGTERM goes out once the first returns.
    let port = svc.port;
    let (tx, rx) = std::sync::mpsc::channel();
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let (tx, token, hash) = (tx.clone(), token.clone(), hash.clone());
            std::thread::spawn(move || {
                let body = json!({"tool": "echo", "arguments": {"text": format!("n{i}")}}).to_string();
                let r = http_raw(
                    port,
                    "POST",
                    &format!("/v1/releases/{hash}/calls"),
                    Some(&token),
                    Some(body.as_bytes()),
                    "application/json",
                );
                let _ = tx.send((Instant::now(), r.map(|r| r.status).unwrap_or(0)));
            })
        })
        .collect();
    let (first_at, first) = rx.recv_timeout(Duration::from_secs(120)).expect("a first answer");
    assert_eq!(first, 200);
    let term_at = Instant::now();
    let killed = Command::new("kill").args(["-TERM", &svc.child.id().to_string()]).status().expect("kill");
    assert!(killed.success());
    let mut answers = vec![(first_at, first)];
    for _ in 1..8 {
        answers.push(rx.recv_timeout(Duration::from_secs(120)).expect("every request is answered or refused"));
    }
    for w in workers {
        w.join().unwrap();
    }
    let end = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = svc.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "no exit 60 s after SIGTERM: {}", svc.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}: {}", svc.log());
    let ok = answers.iter().filter(|(_, s)| *s == 200).count();
    let after_term = answers.iter().filter(|(t, s)| *s == 200 && *t > term_at).count();
    assert!(after_term >= 1, "calls in flight at SIGTERM finished: {answers:?}\n{}", svc.log());
    assert!(answers.iter().all(|(_, s)| [200, 503, 0].contains(s)), "{answers:?}");

    // Reopen the ledger: one dampening event per answered call, and the log verifies.
    let listed = germline(&["ledger", "--data-dir", &svc.data.to_string_lossy(), "list"], dir);
    let events = listed.lines().filter(|l| l.contains("dampening_event")).count();
    assert_eq!(events, ok, "{listed}");
    let verified = germline(&["ledger", "--data-dir", &svc.data.to_string_lossy(), "verify"], dir);
    assert!(verified.contains("OK"), "{verified}");
}

fn schemathesis() -> PathBuf {
    let st = std::env::var_os("GERMLINE_SCHEMATHESIS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/germline/venv-schemathesis/bin/schemathesis"));
    assert!(st.is_file(), "{} is missing: run scripts/setup.sh", st.display());
    st
}

/// Cross-field rules OpenAPI cannot state: admission succeeds only for signed releases
/// (422 otherwise), and a proof needs `index < size` / `old <= new` (400 otherwise).
const SCHEMATHESIS_CONFIG: &str = r#"
[[operations]]
include-path-regex = "^/v1/releases/(tuf|sigstore)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422"]

[[operations]]
include-path-regex = "^/v1/ledger/proofs/"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404"]

# A tlog-witness request is a size, a proof and a signed note in one text body; OpenAPI
# cannot say which texts are well formed, so a malformed one may be refused (400).
[[operations]]
include-path-regex = "^/add-checkpoint$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "403", "404", "409", "422"]
"#;

/// Runs schemathesis with every check against `url`; (passed, output).
fn run_schemathesis(dir: &Path, url: &str, token: &str, examples: u32) -> (bool, String) {
    let config = dir.join("schemathesis.toml");
    std::fs::write(&config, SCHEMATHESIS_CONFIG).unwrap();
    // `timeout` bounds the run; schemathesis's own --max-time is a budget it fills.
    let out = Command::new("timeout")
        .arg("600")
        .arg(schemathesis())
        .arg("--config-file")
        .arg(&config)
        .args(["--no-color", "run", url, "--checks", "all", "--max-examples", &examples.to_string()])
        // One worker: concurrent workers trip a CPython 3.11 ast bug inside hypothesis.
        .args(["--workers", "1", "--request-timeout", "120", "--seed", "1"])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("running schemathesis");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn schemathesis_finds_no_server_error_or_schema_violation() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rel = write_release(dir, "echo", "", ECHO);
    let admit = publish(dir, &rel);
    let svc = Service::start(dir, "");
    let token = svc.token();
    assert_eq!(svc.post("/v1/releases/tuf", Some(&token), &admit).status, 201);
    let (ok, out) = run_schemathesis(dir, &format!("http://127.0.0.1:{}/openapi.json", svc.port), &token, 25);
    assert!(ok, "schemathesis reported failures:\n{out}\n--- service log ---\n{}", svc.log());
    assert!(out.contains("passed"), "{out}");
    assert_eq!(svc.get("/healthz").status, 200);
    assert!(!svc.log().contains("panicked"), "{}", svc.log());
}

/// The same harness against a server whose answer breaks its own schema must fail, so a
/// passing run above means something.
#[test]
fn schemathesis_harness_fails_on_a_broken_response() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let server = dir.join("broken.py");
    std::fs::write(
        &server,
        r#"import http.server, json, sys
DOC = {"openapi": "3.1.0", "info": {"title": "broken", "version": "1"},
       "paths": {"/healthz": {"get": {"operationId": "healthz", "responses": {"200": {"description": "ok",
         "content": {"application/json": {"schema": {"type": "object", "required": ["status"],
           "properties": {"status": {"type": "string"}}, "additionalProperties": False}}}}}}}}}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(DOC if self.path == "/openapi.json" else {"status": 5}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.timeout = 1
import time
end = time.time() + 300
while time.time() < end:
    s.handle_request()
"#,
    )
    .unwrap();
    let mut child = Command::new("python3").arg(&server).stdout(Stdio::piped()).spawn().expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port: u16 = line.trim().parse().expect("port");
    let (ok, out) = run_schemathesis(dir, &format!("http://127.0.0.1:{port}/openapi.json"), "t", 5);
    let _ = child.kill();
    let _ = child.wait();
    assert!(!ok, "a response violating its schema must fail the run:\n{out}");
    assert!(out.contains("schema") || out.contains("Schema"), "{out}");
}

/// `germline fleet keys` of a data directory (creating its keys on first use).
/// Issue 6's fleet acceptance on three `germline serve` hosts: B and C mirror A; a call
/// on B succeeds before A holds a witness, and once A's verified witness is in its log,
/// B and C refuse calls to that release (409) without ever having run it leakily.
#[test]
fn a_witness_on_one_service_makes_its_peers_refuse_the_release() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (rel, items, policy_line) = mixer_world_declared(dir, true);
    let admit = publish(dir, &rel);
    let interval_ms = 500;
    let host_dir = |h: &str| {
        let d = dir.join(h);
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    let a_keys = fleet_keys(&host_dir("a").join("data"));
    let a = Service::start(&host_dir("a"), &format!("{policy_line}[fleet]\nsync_interval_ms = {interval_ms}\n"));
    let peer_a = format!(
        "[fleet]\nsync_interval_ms = {interval_ms}\nrequest_timeout_ms = 2000\n[[fleet.peers]]\nname = \"a\"\nurl = \"http://127.0.0.1:{}\"\ncheckpoint_key = \"{}\"\nwitness_key = \"{}\"\n",
        a.port,
        a_keys["checkpoint_key"].as_str().unwrap(),
        a_keys["witness_key"].as_str().unwrap()
    );
    let peers: Vec<Service> =
        ["b", "c"].iter().map(|h| Service::start(&host_dir(h), &format!("{policy_line}{peer_a}"))).collect();
    let call = json!({"tool": "scan", "arguments": {"document": items[0], "extra": items[1]}, "items": items});
    let mut hash = String::new();
    for svc in std::iter::once(&a).chain(&peers) {
        let admitted = svc.post("/v1/releases/tuf", Some(&svc.token()), &admit);
        assert_eq!(admitted.status, 201, "{admitted:?}\n{}", svc.log());
        hash = admitted.json()["hash"].as_str().unwrap().to_owned();
    }
    let calls = format!("/v1/releases/{hash}/calls");
    // Mechanism off: before A holds a witness, B serves the release (an invoice-only call,
    // which triggers nothing, so any later refusal on B is A's witness, not one of B's).
    let finance_only =
        json!({"tool": "scan", "arguments": {"document": items[0], "extra": items[0]}, "items": [items[0]]});
    let before = peers[0].post(&calls, Some(&peers[0].token()), &finance_only);
    assert_eq!(before.status, 200, "{before:?}\n{}", peers[0].log());
    assert_eq!(before.json()["triggers"].as_array().map(Vec::len), Some(0), "{before:?}");

    // A's call triggers; its verified witness lands in A's log.
    let on_a = a.post(&calls, Some(&a.token()), &call);
    assert_eq!(on_a.status, 200, "{on_a:?}");
    assert_eq!(on_a.json()["triggers"].as_array().map(Vec::len), Some(1), "{on_a:?}");
    // Witnesses are verified after the answer is out: wait (bounded) until A's log has it.
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let w = a.get(&format!("/v1/releases/{hash}/witnesses")).json();
        if w.as_array().is_some_and(|w| !w.is_empty()) {
            break;
        }
        assert!(Instant::now() < end, "A recorded no witness in 60 s: {w}\n{}", a.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let witnessed = Instant::now();

    // Mechanism on: B and C refuse once they mirrored A.
    for svc in &peers {
        let end = witnessed + Duration::from_secs(30);
        let refused = loop {
            let damp = svc.get(&format!("/v1/releases/{hash}/dampening")).json();
            if damp["suppressed"] == true {
                break witnessed.elapsed();
            }
            assert!(Instant::now() < end, "not suppressed within 30 s: {damp}\n{}", svc.log());
            std::thread::sleep(Duration::from_millis(50));
        };
        let r = svc.post(&calls, Some(&svc.token()), &call);
        assert!(r.client_error(409), "{r:?}");
        assert!(r.json()["error"].as_str().unwrap().contains("suppressed"), "{r:?}");
        eprintln!("peer suppressed {} ms after A's witness (sync interval {interval_ms} ms)", refused.as_millis());
        assert!(refused < Duration::from_millis(4 * interval_ms + 2000), "suppression took {refused:?}");
        let status = svc.get("/fleet/status").json();
        assert!(status.to_string().contains("\"ok\""), "peer A is healthy: {status}");
    }
}

/// Formation-consistent dispatch over the API: a call formed on repohost 1.0 (an omitted
/// `private` is private) is fenced after a rollout to 1.1 (public by default) with a 409
/// naming the formation, the release and the reason, and nothing reaches the repository
/// host; a call formed after the rollout runs on 1.1. The ledger holds the formations
/// and lifecycle events, and `germline ledger verify` covers them.
#[test]
fn formed_calls_are_fenced_after_a_rollout_over_the_api() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let sink = germline_tests::Sink::start(germline_tests::SinkBehaviour::default());
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "tags = []\n[consumers.agent]\nclearance = []\n[destinations.\"repos.example\"]\nclearance = []\n[hosts]\n\"repos.example\" = \"{}\"\n",
            sink.addr()
        ),
    )
    .unwrap();
    let releases = dir.join("releases");
    let v10 = germline_tests::fcd::repohost_release(&releases, "1.0.0", true);
    let v11 = germline_tests::fcd::repohost_release(&releases, "1.1.0", false);
    let (mut a10, mut a11) = (publish(dir, &v10), publish(dir, &v11));
    a10["target"] = json!("repohost-1.0.0.tar.gz");
    a11["target"] = json!("repohost-1.1.0.tar.gz");
    let svc = Service::start(dir, &format!("policy = \"{}\"\n", policy.display()));
    let token = svc.token();
    let admit = |a: &Value| {
        let r = svc.post("/v1/releases/tuf", Some(&token), a);
        assert_eq!(r.status, 201, "{r:?}\n{}", svc.log());
        r.json()["hash"].as_str().unwrap().to_owned()
    };
    let (h10, h11) = (admit(&a10), admit(&a11));
    let call = json!({"release": "repohost", "tool": "create_repository", "arguments": {"name": "notes"}});
    let formed = svc.post("/v1/formations", Some(&token), &call);
    assert_eq!(formed.status, 201, "{formed:?}\n{}", svc.log());
    let f = formed.json();
    assert_eq!(f["record"]["snapshot"]["release"], h10.as_str(), "1.0 is current: {f}");
    assert_eq!(f["record"]["contract"], "egress:private", "{f}");
    assert_eq!(f["record"]["successors"], json!([]), "1.1 makes it public: not captured: {f}");
    let id = f["id"].as_str().unwrap().to_owned();
    // An MCP session lists the tools on 1.0 before the rollout.
    let rpc = |sid: Option<&str>, id: u32, method: &str, params: Value| {
        mcp(svc.port, "repohost", &token, sid, &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
    };
    let (_, sid, _) = rpc(None, 1, "initialize", json!({"protocolVersion": "2025-06-18"}));
    let sid = sid.expect("session id");
    let (_, _, listed) = rpc(Some(&sid), 2, "tools/list", json!({}));
    assert_eq!(listed["result"]["tools"][0]["name"], "create_repository", "{listed}");
    let seen = &listed["result"]["_meta"]["dev.germline/snapshot"];
    assert_eq!(seen["id"], f["snapshot"], "the session saw the snapshot the formation was made on: {listed}");
    assert_eq!(seen["entry"], f["snapshot_entry"], "recorded once: {listed}");
    let promoted = svc.post(&format!("/v1/releases/{h11}/lifecycle"), Some(&token), &json!({"action": "promote"}));
    assert_eq!(promoted.json()["current"], h11.as_str(), "{promoted:?}");
    let fenced = svc.post(&format!("/v1/formations/{id}/dispatch"), Some(&token), &json!({}));
    assert!(fenced.client_error(409), "{fenced:?}");
    let why = fenced.json()["error"].as_str().unwrap().to_owned();
    assert!(why.contains(&id[..12]) && why.contains("repohost 1.1.0") && why.contains("not captured"), "{why}");
    assert_eq!(sink.request_count(), 0, "nothing ran");
    // The session reconnects after the rollout: its call binds to what it saw (1.0).
    let create = json!({"name": "create_repository", "arguments": {"name": "mcp-notes"}});
    let (_, _, stale) = rpc(Some(&sid), 3, "tools/call", create.clone());
    let msg = stale["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(msg.contains("formed on repohost 1.0.0") && msg.contains("not captured"), "{stale}");
    assert_eq!(sink.request_count(), 0, "nothing ran");
    // A stale snapshot is refused at formation; a fresh formation runs on 1.1.
    let stale = json!({"release": "repohost", "tool": "create_repository", "arguments": {"name": "notes"},
        "snapshot": f["snapshot"]});
    assert!(svc.post("/v1/formations", Some(&token), &stale).client_error(409));
    let fresh = svc.post("/v1/formations", Some(&token), &call).json();
    let ran = svc.post(&format!("/v1/formations/{}/dispatch", fresh["id"].as_str().unwrap()), Some(&token), &json!({}));
    assert_eq!(ran.status, 200, "{ran:?}");
    assert!(sink.wait_for_requests(1, Duration::from_secs(30)));
    let body: Value = serde_json::from_slice(&sink.requests()[0].body).unwrap();
    assert_eq!(body["private"], false, "formed on 1.1, run on 1.1: {body}");
    // Listing again rebinds the session to 1.1.
    rpc(Some(&sid), 4, "tools/list", json!({}));
    let (_, _, ran) = rpc(Some(&sid), 5, "tools/call", create);
    assert!(ran["result"]["content"].is_array(), "{ran}");
    assert!(sink.wait_for_requests(2, Duration::from_secs(30)));
    // A retired release runs nothing, by formation or by hash.
    let retired = svc.post(&format!("/v1/releases/{h10}/lifecycle"), Some(&token), &json!({"action": "retire"}));
    assert_eq!(retired.status, 200, "{retired:?}");
    let direct = json!({"tool": "create_repository", "arguments": {"name": "direct"}});
    let r = svc.post(&format!("/v1/releases/{h10}/calls"), Some(&token), &direct);
    assert!(r.client_error(409) && r.json()["error"].as_str().unwrap().contains("retired"), "{r:?}");
    assert_eq!(sink.request_count(), 2);
    drop(svc);
    // After a restart the formation that ran is refused, naming its dispatch record.
    let svc = Service::start(dir, &format!("policy = \"{}\"\n", policy.display()));
    let again =
        svc.post(&format!("/v1/formations/{}/dispatch", fresh["id"].as_str().unwrap()), Some(&token), &json!({}));
    assert!(again.client_error(409), "{again:?}");
    let why = again.json()["error"].as_str().unwrap().to_owned();
    assert!(why.contains("already ran (dispatch recorded at log entry"), "{why}");
    assert_eq!(sink.request_count(), 2);
    drop(svc);
    let verify = germline(&["ledger", "--data-dir", &dir.join("data").to_string_lossy(), "verify"], dir);
    eprintln!("{verify}");
    assert!(
        verify.contains("formations 4 lifecycle events 5 snapshots 2 dispatches 2") && verify.contains("OK"),
        "{verify}"
    );
}

/// One MCP message to the service's `/v1/mcp/NAME`: status, the `Mcp-Session-Id` it set,
/// and the JSON body (Null when there is none).
fn mcp(port: u16, name: &str, token: &str, session: Option<&str>, msg: &Value) -> (u16, Option<String>, Value) {
    let body = msg.to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(180))).unwrap();
    let mut head = format!(
        "POST /v1/mcp/{name} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(sid) = session {
        head.push_str(&format!("Mcp-Session-Id: {sid}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut raw = String::new();
    s.take(8 << 20).read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let sid =
        head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("mcp-session-id:").map(|v| v.trim().to_owned()));
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.into() };
    (status, sid, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Calls to one release through the API run side by side, each on a germline of its own
/// (`[limits] lanes`): two calls meet at a loopback rendezvous. With `lanes = 1` ("mechanism
/// off") the second call waits for the first, and each is alone there.
#[test]
fn calls_to_one_release_overlap_on_lanes_through_the_api() {
    const MEET: &str = "import urllib.request\nfrom mcp.server.fastmcp import FastMCP\ndef create_server():\n    m = FastMCP('meet')\n    @m.tool()\n    def meet() -> str:\n        \"\"\"Meet.\"\"\"\n        return urllib.request.urlopen('http://rendezvous.example/', timeout=20).read().decode()\n    return m\n";
    let at = germline_tests::sink::rendezvous(Duration::from_secs(3));
    let answers = |lanes: usize| -> Vec<String> {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let rel = write_release(dir, "meet", "[tools.meet]\nhosts = [\"rendezvous.example\"]\n", MEET);
        let policy = dir.join("policy.toml");
        std::fs::write(
            &policy,
            format!("tags = []\n[destinations.\"rendezvous.example\"]\nclearance = []\n[consumers.agent]\nclearance = []\n[hosts]\n\"rendezvous.example\" = \"{at}\"\n[limits]\nlanes = {lanes}\n"),
        )
        .unwrap();
        let admit = publish(dir, &rel);
        let svc = Service::start(dir, &format!("policy = \"{}\"\n", policy.display()));
        let token = svc.token();
        let admitted = svc.post("/v1/releases/tuf", Some(&token), &admit);
        assert_eq!(admitted.status, 201, "{admitted:?}");
        let hash = admitted.json()["hash"].as_str().unwrap().to_owned();
        let path = format!("/v1/releases/{hash}/calls");
        let mut out: Vec<String> = std::thread::scope(|s| {
            let calls: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let r = svc.post(&path, Some(&token), &json!({"tool": "meet"}));
                        assert_eq!(r.status, 200, "{r:?}\n{}", svc.log());
                        r.json()["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned()
                    })
                })
                .collect();
            calls.into_iter().map(|c| c.join().unwrap()).collect()
        });
        out.sort();
        out
    };
    assert_eq!(answers(1), ["alone", "alone"], "one lane: the calls queue");
    assert_eq!(answers(2), ["met", "met"], "two lanes: the calls overlap");
}
