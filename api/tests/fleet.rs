//! Fleet-wide suppression between real `germline fleet serve` processes on loopback.
//!
//! - A real verified witness on host A (a leaky release that declared determinism) makes
//!   B and C suppress that release within a sync interval, and a call on B's data is
//!   refused; a host configured with the wrong witness key for A (mechanism off) and a
//!   witness whose verdict does not suppress leave releases usable.
//! - A release whose replies are 1 MiB (evidence far over a ledger entry) is suppressed
//!   on a peer: the published witness is bounded; the same evidence in the clear
//!   (commitments off) could not even be a ledger entry.
//! - B killed with SIGKILL mid-sync and restarted loses no entry and processes none twice.
//! - A tampered tile and a forked checkpoint, served as static files, are reported by B
//!   and C; the forking peer is ignored afterwards.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use germline_ledger::{Entry, EntryKind, Ledger, LedgerConfig};
use germline_model::ReleaseHash;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_germline");

fn germline(args: &[&str], cwd: &Path, data: &Path, home: &Path) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env("RUST_BACKTRACE", "0")
        .env("GERMLINE_HOME", home)
        .env("GERMLINE_DATA_DIR", data)
        .output()
        .expect("run germline");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json_lines(s: &str) -> Vec<Value> {
    s.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect(l)).collect()
}

fn keys(data: &Path) -> Value {
    let (ok, out, err) =
        germline(&["fleet", "keys", "--data-dir", &data.to_string_lossy()], Path::new("/"), data, data);
    assert!(ok, "{err}");
    json_lines(&out).remove(0)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `germline fleet serve` process, killed when dropped.
struct Host {
    child: Child,
    url: String,
}

impl Host {
    fn start(data: &Path, listen: &str, config: &Path) -> Host {
        let mut child = Command::new(BIN)
            .args(["fleet", "serve", "--data-dir", &data.to_string_lossy(), "--listen", listen, "--config"])
            .arg(config)
            .env("GERMLINE_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fleet serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("fleet serve said {line:?}"));
        Host { child, url: v["listening"].as_str().unwrap().to_owned() }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn terminate(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }

    fn status(&self) -> Vec<Value> {
        let (ok, out, err) = germline(
            &["fleet", "status", "--url", &self.url],
            Path::new("/"),
            Path::new("/nonexistent"),
            Path::new("/nonexistent"),
        );
        assert!(ok, "{err}");
        json_lines(&out)
    }

    fn peer(&self, name: &str) -> Value {
        self.status().into_iter().find(|p| p["peer"] == name).unwrap_or(Value::Null)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {limit:?} waiting for {what}");
}

fn peer_toml(name: &str, url: &str, k: &Value, witness_key: &str) -> String {
    format!(
        "[[fleet.peers]]\nname = \"{name}\"\nurl = \"{url}\"\ncheckpoint_key = \"{}\"\nwitness_key = \"{witness_key}\"\n",
        k["checkpoint_key"].as_str().unwrap()
    )
}

fn peer_toml_quorum(name: &str, url: &str, k: &Value, witness_key: &str, cosigner: &Value) -> String {
    format!(
        "{}cosigners = [\"{}\"]\nquorum = 1\n",
        peer_toml(name, url, k, witness_key),
        cosigner["cosigner_key"].as_str().unwrap()
    )
}

fn write_config(path: &Path, interval_ms: u64, extra: &str, peers: &[String]) {
    std::fs::write(
        path,
        format!("[fleet]\nsync_interval_ms = {interval_ms}\nrequest_timeout_ms = 2000\n{extra}\n{}", peers.concat()),
    )
    .unwrap();
}

struct Scene {
    root: PathBuf,
    home: PathBuf,
    invoice: PathBuf,
    payslip: PathBuf,
}

impl Scene {
    fn new(root: &Path) -> Scene {
        let (invoice, payslip, _) = common::mixer_world(root, 200, "");
        Scene { root: root.to_owned(), home: root.join("home"), invoice, payslip }
    }

    fn call(&self, release: &str, data: &Path) -> Value {
        let args = common::mixer_call_args(release, &self.invoice, &self.payslip);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (_, out, err) = germline(&args, &self.root, data, &self.home);
        json_lines(&out).into_iter().next().unwrap_or_else(|| panic!("no outcome: {err}"))
    }
}

/// Witness entries of a ledger: (index, release, witness bytes).
fn witnesses(ledger: &Ledger) -> Vec<(u64, ReleaseHash, Vec<u8>)> {
    (0..ledger.size())
        .map(|i| (i, ledger.get(i).unwrap()))
        .filter(|(_, e)| e.kind == EntryKind::Witness)
        .map(|(i, e)| {
            let body: Value = serde_json::from_slice(&e.body).unwrap();
            let w = base64::engine::general_purpose::STANDARD.decode(body["witness"].as_str().unwrap()).unwrap();
            (i, e.release, w)
        })
        .collect()
}

fn open(dir: &Path) -> Ledger {
    Ledger::open(dir.join("ledger"), LedgerConfig::default()).expect("open ledger (is its host stopped?)")
}

fn status_of(data: &Path, release: &ReleaseHash) -> Value {
    let (ok, out, err) = germline(
        &["fleet", "status", "--data-dir", &data.to_string_lossy(), "--release", &release.to_hex()],
        Path::new("/"),
        data,
        data,
    );
    assert!(ok, "{err}");
    json_lines(&out).into_iter().find(|v| v.get("release").is_some()).unwrap()
}

#[test]
fn a_witness_on_one_host_suppresses_the_release_on_its_peers() {
    let tmp = tempfile::tempdir().unwrap();
    let scene = Scene::new(tmp.path());
    let data: Vec<PathBuf> = ["a", "b", "c", "d"].iter().map(|h| tmp.path().join(h).join("data")).collect();
    let (a, b, c, d) = (&data[0], &data[1], &data[2], &data[3]);

    // Host A witnesses two releases: one that declared determinism (its witness
    // suppresses) and one that did not (its witness weighs 250 and does not).
    common::mixer_release(&tmp.path().join("declared"), "declared", true);
    common::mixer_release(&tmp.path().join("undeclared"), "undeclared", false);
    for rel in ["declared", "undeclared"] {
        let o = scene.call(rel, a);
        assert_eq!(o["triggers"].as_array().map(Vec::len), Some(1), "{o}");
    }
    let (declared, undeclared, a_witnesses) = {
        let l = open(a);
        let w = witnesses(&l);
        assert_eq!(w.len(), 2, "two witnesses on A");
        (w[0].1, w[1].1, w)
    };
    assert_ne!(declared, undeclared);

    let k: Vec<Value> = data.iter().map(|d| keys(d)).collect();
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let url = |i: usize| format!("http://127.0.0.1:{}", ports[i]);
    let wk = |i: usize| k[i]["witness_key"].as_str().unwrap().to_owned();
    let interval = 500u64;
    let cfg = |i: usize| tmp.path().join(format!("fleet-{i}.toml"));
    // A asks C to cosign its checkpoints; B accepts A's only with C's cosignature.
    let a_asks_c = format!(
        "[[fleet.witnesses]]\nname = \"c\"\nurl = \"{}\"\ncosigner_key = \"{}\"\n",
        url(2),
        k[2]["cosigner_key"].as_str().unwrap()
    );
    write_config(
        &cfg(0),
        interval,
        &a_asks_c,
        &[peer_toml("b", &url(1), &k[1], &wk(1)), peer_toml("c", &url(2), &k[2], &wk(2))],
    );
    write_config(
        &cfg(1),
        interval,
        "",
        &[peer_toml_quorum("a", &url(0), &k[0], &wk(0), &k[2]), peer_toml("c", &url(2), &k[2], &wk(2))],
    );
    write_config(
        &cfg(2),
        interval,
        "",
        &[peer_toml("a", &url(0), &k[0], &wk(0)), peer_toml("b", &url(1), &k[1], &wk(1))],
    );
    // D trusts the wrong witness key for A (its own): the mechanism switched off.
    write_config(&cfg(3), interval, "", &[peer_toml("a", &url(0), &k[0], &wk(3))]);

    let mut hosts: Vec<Host> =
        (0..4).map(|i| Host::start(&data[i], &format!("127.0.0.1:{}", ports[i]), &cfg(i))).collect();
    let suppressed_on = |h: &Host| h.peer("a")["suppressions"] == 1;
    let took_b = wait_for("B to suppress", Duration::from_millis(interval * 2 + 5000), || suppressed_on(&hosts[1]));
    let took_c = wait_for("C to suppress", Duration::from_millis(interval * 2 + 5000), || suppressed_on(&hosts[2]));
    eprintln!("suppression seen on B after {took_b:?}, on C after {took_c:?} (sync interval {interval} ms)");
    // How fast suppression spreads is measured, not asserted here (a loaded host stretches
    // it): the bound above is the test's liveness limit.
    // A publishes its checkpoint with C's cosignature (what B's quorum required).
    let cp = ureq::get(&format!("{}/checkpoint", url(0))).call().unwrap().into_string().unwrap();
    let c_name = format!("\u{2014} {}/witness ", k[2]["origin"].as_str().unwrap());
    assert!(cp.contains(&c_name), "{cp}");
    // A's log may have grown past the checkpoint C cosigned when a peer last synced (its
    // status is "unwitnessed" until C cosigns the newer one): each reaches "ok" in time.
    for (i, h) in hosts[1..3].iter().enumerate() {
        wait_for(&format!("host {} to see A's log cosigned", i + 1), Duration::from_secs(10), || {
            h.peer("a")["status"] == "ok"
        });
        let p = h.peer("a");
        assert_eq!(p["rejected_witnesses"], 0, "{p}");
    }
    // D: both of A's witnesses rejected for their key, nothing suppressed.
    wait_for("D to read A's log", Duration::from_secs(10), || hosts[3].peer("a")["rejected_witnesses"] == 2);
    assert_eq!(hosts[3].peer("a")["suppressions"], 0);
    // The peers of B and C mirror each other too (their logs now hold suppressions).
    wait_for("A to see B", Duration::from_secs(10), || hosts[0].peer("b")["status"] == "ok");

    // /lookup on A: each entry with a proof, checked offline with A's checkpoint key.
    let answer = ureq::get(&format!("{}/lookup/{}", url(0), declared.to_hex())).call().unwrap().into_string().unwrap();
    let answer_path = tmp.path().join("lookup.json");
    std::fs::write(&answer_path, &answer).unwrap();
    let key = k[0]["checkpoint_key"].as_str().unwrap();
    let check = |p: &Path| {
        germline(
            &["fleet", "check-lookup", "--answer", &p.to_string_lossy(), "--key", key, "--release", &declared.to_hex()],
            tmp.path(),
            a,
            a,
        )
    };
    let (ok, out, err) = check(&answer_path);
    assert!(ok && out.contains("\"witness\""), "{out}{err}");
    let mut edited: Value = serde_json::from_str(&answer).unwrap();
    let e0 = edited["entries"][0]["entry"].as_str().unwrap().to_owned();
    let mut raw = base64::engine::general_purpose::STANDARD.decode(e0).unwrap();
    raw[40] ^= 1;
    edited["entries"][0]["entry"] = Value::from(base64::engine::general_purpose::STANDARD.encode(raw));
    std::fs::write(&answer_path, edited.to_string()).unwrap();
    let (ok, out, _) = check(&answer_path);
    assert!(!ok && out.contains("does not verify"), "{out}");
    let bad = ureq::get(&format!("{}/lookup/nothex", url(0))).call();
    assert!(matches!(bad, Err(ureq::Error::Status(400, _))), "bad lookup must be a 400");

    // Stop B and D: the suppression is in B's ledger and refuses calls there.
    hosts[1].terminate();
    hosts[3].terminate();
    hosts[2].terminate();
    assert_eq!(status_of(c, &declared)["suppressed"], true);
    let sb = status_of(b, &declared);
    assert_eq!(sb["suppressed"], true, "{sb}");
    assert_eq!(sb["fleet"].as_array().unwrap().len(), 1, "{sb}");
    assert_eq!(status_of(b, &undeclared)["suppressed"], false);
    assert_eq!(status_of(d, &declared)["suppressed"], false);
    let refused = scene.call("declared", b);
    let err = refused["error"].as_str().unwrap_or_default();
    assert!(err.contains("is suppressed") && err.contains("peer's verified witness"), "{refused}");
    let allowed = scene.call("declared", d);
    assert!(!allowed["error"].as_str().is_some_and(|e| e.contains("suppressed")), "{allowed}");

    // Kill B with SIGKILL while it mirrors a long log, restart it, and check that every
    // entry was processed exactly once. A's log grows by many validly signed witnesses
    // (A's key re-signing its real witness for other release hashes) among filler.
    hosts[0].terminate();
    let forged = {
        let l = open(a);
        let key = germline_verifier::WitnessKey::load_or_create(a, "germline-host").unwrap();
        let (_, _, bytes) = &a_witnesses[0];
        let w = germline_verifier::Witness::decode(bytes, None).unwrap();
        let mut releases = Vec::new();
        let mut batch = Vec::new();
        for i in 0..3000u32 {
            if i % 100 == 50 {
                let mut body = w.body.clone();
                body.evidence.release = ReleaseHash::of_bytes(&i.to_be_bytes());
                let signed = key.sign(&body).unwrap();
                let sha = {
                    use sha2::Digest;
                    hex::encode(sha2::Sha256::digest(&signed))
                };
                let json = serde_json::json!({"format": "germline-witness v2", "witness_sha256": sha,
                    "witness": base64::engine::general_purpose::STANDARD.encode(&signed)});
                batch.push(Entry::new(EntryKind::Witness, body.evidence.release, json.to_string().into_bytes()));
                releases.push(body.evidence.release);
            } else {
                batch.push(Entry::new(
                    EntryKind::Admission,
                    ReleaseHash::of_bytes(b"filler"),
                    format!("{{\"n\":{i}}}").into_bytes(),
                ));
            }
        }
        l.append_many(batch).unwrap();
        releases
    };
    let a_size = open(a).size();
    let fast = |i: usize| {
        let p = tmp.path().join(format!("fast-{i}.toml"));
        write_config(&p, 50, "max_entries_per_sync = 40", &[peer_toml("a", &url(0), &k[0], &wk(0))]);
        p
    };
    hosts[0] = Host::start(a, &format!("127.0.0.1:{}", ports[0]), &cfg(0));
    let before = open(b).peer_record("a").unwrap().unwrap().processed;
    let mut mid = 0;
    for round in 0..6u64 {
        let mut h = Host::start(b, &format!("127.0.0.1:{}", free_port()), &fast(1));
        std::thread::sleep(Duration::from_millis(300 + 170 * round));
        h.kill();
        let processed = open(b).peer_record("a").unwrap().unwrap().processed;
        eprintln!("SIGKILL round {round}: B had processed {processed} of {a_size}");
        if processed > before && processed < a_size {
            mid += 1;
        }
    }
    assert!(mid > 0, "no kill landed mid-sync");
    let h = Host::start(b, &format!("127.0.0.1:{}", free_port()), &fast(1));
    wait_for("B to finish", Duration::from_secs(60), || h.peer("a")["processed"] == a_size);
    drop(h);
    let l = open(b);
    let rec = l.peer_record("a").unwrap().unwrap();
    assert_eq!(rec.suppressions, 1 + forged.len() as u64, "{rec:?}");
    for r in forged.iter().chain([&declared]) {
        assert_eq!(l.fleet_suppressions(r).unwrap().len(), 1, "release {r}");
        let n = l.entries_for_release(r).unwrap().iter().filter(|(_, e)| e.kind == EntryKind::Suppression).count();
        assert_eq!(n, 1, "suppression entries for {r}");
        assert!(l.dampening_state(r).unwrap().suppressed);
    }
    assert!(l.verify().unwrap().is_ok());
}

/// Serves files under a swappable root directory (any static server would do).
fn static_server(root: Arc<Mutex<PathBuf>>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().take(100_000).flatten() {
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16384 {
                match c.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let req = String::from_utf8_lossy(&buf);
            let path = req.split(' ').nth(1).unwrap_or("/").trim_start_matches('/').to_owned();
            let file = root.lock().unwrap().join(&path);
            let resp = match std::fs::read(&file) {
                Ok(body) if !path.contains("..") => {
                    let mut r =
                        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len())
                            .into_bytes();
                    r.extend_from_slice(&body);
                    r
                }
                _ => b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec(),
            };
            let _ = c.write_all(&resp);
        }
    });
    port
}

#[test]
fn tampered_tiles_and_forked_checkpoints_are_detected_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, fork, b, c) = ["a", "fork", "b", "c"].map(|h| tmp.path().join(h).join("data")).into();
    let filler = |i: u64| Entry::new(EntryKind::Admission, ReleaseHash::of_bytes(&i.to_be_bytes()), b"{}".to_vec());
    {
        let l = open(&a);
        l.append_many((0..599).map(filler).collect()).unwrap();
    }
    // The fork shares A's key, origin and first 599 entries, then differs.
    let copy = Command::new("cp").arg("-a").arg(a.parent().unwrap()).arg(fork.parent().unwrap()).status().unwrap();
    assert!(copy.success());
    open(&a)
        .append(Entry::new(EntryKind::Admission, ReleaseHash::of_bytes(b"x"), b"{\"side\":\"a\"}".to_vec()))
        .unwrap();
    open(&fork)
        .append(Entry::new(EntryKind::Admission, ReleaseHash::of_bytes(b"x"), b"{\"side\":\"fork\"}".to_vec()))
        .unwrap();
    let ka = keys(&a);
    assert_eq!(keys(&fork)["checkpoint_key"], ka["checkpoint_key"]);
    let (wa, wf) = (tmp.path().join("www-a"), tmp.path().join("www-fork"));
    for (d, w) in [(&a, &wa), (&fork, &wf)] {
        let (ok, out, err) = germline(
            &["fleet", "export", "--data-dir", &d.to_string_lossy(), "--out", &w.to_string_lossy()],
            tmp.path(),
            d,
            d,
        );
        assert!(ok && out.contains("\"size\":600"), "{out}{err}");
    }
    let root = Arc::new(Mutex::new(wa.clone()));
    let url = format!("http://127.0.0.1:{}", static_server(Arc::clone(&root)));
    let interval = 300;
    let hosts: Vec<Host> = [&b, &c]
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let cfg = tmp.path().join(format!("fleet-{i}.toml"));
            write_config(&cfg, interval, "", &[peer_toml("a", &url, &ka, &"0".repeat(64))]);
            Host::start(d, "127.0.0.1:0", &cfg)
        })
        .collect();
    // E demands a witness cosignature that A's static checkpoint does not carry.
    let e = tmp.path().join("e").join("data");
    let cfg = tmp.path().join("fleet-e.toml");
    write_config(&cfg, interval, "", &[peer_toml_quorum("a", &url, &ka, &"0".repeat(64), &keys(&e))]);
    let host_e = Host::start(&e, "127.0.0.1:0", &cfg);
    for h in &hosts {
        wait_for("a verified mirror", Duration::from_secs(10), || {
            let p = h.peer("a");
            p["status"] == "ok" && p["processed"] == 600
        });
    }

    wait_for("unwitnessed", Duration::from_secs(10), || host_e.peer("a")["status"] == "unwitnessed");
    assert_eq!(host_e.peer("a")["processed"], 0);

    // A tampered tile (one bit of the right-edge level-0 tile) is reported by B and C.
    let tile = wa.join("tile/0/002.p/88");
    let good = std::fs::read(&tile).unwrap();
    let mut bad = good.clone();
    bad[5] ^= 1;
    std::fs::write(&tile, &bad).unwrap();
    for h in &hosts {
        wait_for("tampered-tile", Duration::from_secs(10), || h.peer("a")["status"] == "tampered-tile");
        let p = h.peer("a");
        assert!(p["evidence"][0].as_str().unwrap().contains("tile/0/002.p/88"), "{p}");
    }
    // Mechanism check: the untampered file is accepted again.
    std::fs::write(&tile, &good).unwrap();
    for h in &hosts {
        wait_for("ok again", Duration::from_secs(10), || h.peer("a")["status"] == "ok");
    }

    // The fork: a different tree at size 600 under A's key. Split view, with both notes.
    // Only the checkpoint is forked; the tiles stay A's: the two signed heads convict A.
    let mixed = tmp.path().join("www-mixed");
    assert!(Command::new("cp").arg("-a").arg(&wa).arg(&mixed).status().unwrap().success());
    std::fs::copy(wf.join("checkpoint"), mixed.join("checkpoint")).unwrap();
    *root.lock().unwrap() = mixed;
    for h in &hosts {
        wait_for("split-view", Duration::from_secs(10), || h.peer("a")["status"] == "split-view");
        let p = h.peer("a");
        let ev = p["evidence"].as_array().unwrap();
        assert_eq!(ev.len(), 2, "{p}");
        assert_ne!(ev[0], ev[1]);
        assert!(ev.iter().all(|n| n.as_str().unwrap().contains("\n600\n")), "{p}");
    }
    // A is ignored from then on, even when it serves its honest log again.
    *root.lock().unwrap() = wa.clone();
    std::thread::sleep(Duration::from_millis(interval * 4));
    for h in &hosts {
        assert_eq!(h.peer("a")["status"], "split-view");
    }
    // Until an operator resets the peer (with its host stopped).
    drop(hosts);
    let (ok, out, err) =
        germline(&["fleet", "reset-peer", "--data-dir", &b.to_string_lossy(), "--peer", "a"], tmp.path(), &b, &b);
    assert!(ok && out.contains("split-view"), "{out}{err}");
    let (ok, out, _) = germline(&["fleet", "status", "--data-dir", &b.to_string_lossy()], tmp.path(), &b, &b);
    assert!(ok && json_lines(&out)[0]["status"] == "new", "{out}");
}

#[test]
fn a_release_with_one_mib_replies_is_suppressed_on_a_peer() {
    let tmp = tempfile::tempdir().unwrap();
    let (invoice, payslip, _) = common::mixer_world_at(tmp.path(), common::large_reply_sink(200, 1 << 20), "");
    let scene = Scene { root: tmp.path().to_owned(), home: tmp.path().join("home"), invoice, payslip };
    let (a, b) = (tmp.path().join("a").join("data"), tmp.path().join("b").join("data"));
    common::mixer_release(&tmp.path().join("large"), "large", true);
    let o = scene.call("large", &a);
    assert_eq!(o["triggers"].as_array().map(Vec::len), Some(1), "{o}");
    let (release, witness) = {
        let l = open(&a);
        let w = witnesses(&l);
        assert_eq!(w.len(), 1, "the witness is in A's ledger entry itself");
        (w[0].1, w[0].2.clone())
    };
    assert!(witness.len() <= germline_verifier::MAX_WITNESS_BYTES, "{}", witness.len());

    // Mechanism off: the same trigger's evidence in the clear (what was published before
    // commitments) carries the 1 MiB reply and cannot be a ledger entry at all.
    let opening_file = walk_files(&a.join("witnesses")).into_iter().find(|p| p.to_string_lossy().ends_with(".opening"));
    let opening =
        germline_verifier::WitnessOpening::decode(&std::fs::read(opening_file.expect("opening")).unwrap()).unwrap();
    assert!(opening.evidence.replies.values().flatten().any(|r| r.len() > 1 << 20), "the reply is in the opening");
    let decoded = germline_verifier::Witness::decode(&witness, None).unwrap();
    opening.check(&decoded.body).unwrap();
    let (clear, _) =
        germline_verifier::WitnessBody::seal(&opening.evidence, true, opening.report.clone(), false).unwrap();
    let key = germline_verifier::WitnessKey::load_or_create(&a, "germline-host").unwrap();
    let clear = key.sign(&clear).unwrap();
    let body = serde_json::json!({"format": "germline-witness v2",
        "witness": base64::engine::general_purpose::STANDARD.encode(&clear)});
    let off = Entry::new(EntryKind::Witness, release, body.to_string().into_bytes()).validate();
    assert!(matches!(off, Err(germline_ledger::EntryError::TooLarge(_))), "{off:?}");

    // Mechanism on: B mirrors A's log and suppresses on the bounded witness.
    let k: Vec<Value> = [&a, &b].iter().map(|d| keys(d)).collect();
    let ports = [free_port(), free_port()];
    let url = |i: usize| format!("http://127.0.0.1:{}", ports[i]);
    let (cfg_a, cfg_b) = (tmp.path().join("fleet-a.toml"), tmp.path().join("fleet-b.toml"));
    write_config(&cfg_a, 300, "", &[peer_toml("b", &url(1), &k[1], k[1]["witness_key"].as_str().unwrap())]);
    write_config(&cfg_b, 300, "", &[peer_toml("a", &url(0), &k[0], k[0]["witness_key"].as_str().unwrap())]);
    let _host_a = Host::start(&a, &format!("127.0.0.1:{}", ports[0]), &cfg_a);
    let mut host_b = Host::start(&b, &format!("127.0.0.1:{}", ports[1]), &cfg_b);
    wait_for("B to suppress", Duration::from_secs(15), || host_b.peer("a")["suppressions"] == 1);
    assert_eq!(host_b.peer("a")["rejected_witnesses"], 0);
    host_b.terminate();
    assert_eq!(status_of(&b, &release)["suppressed"], true);
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk_files(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}
