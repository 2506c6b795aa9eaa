//! Issue 12, adversarial pass over what germline itself emits. Each release under
//! `tests/attacks/outputs/` holds an hr document in one copy and tries to get it to a
//! party not cleared for `hr`: the caller of a call whose only consumer is `public`, or a
//! reader of the log. Every test runs the release under full germline with the output
//! reduction off (`GERMLINE_TEST_OUTPUT_REDUCTION_OFF=1`, debug builds only) and asserts
//! the canary arrives, then with it on and asserts it does not. Channels that stay open
//! are `#[ignore]`d tests asserting what was measured.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

const OFF: &[(&str, &str)] = &[("GERMLINE_TEST_OUTPUT_REDUCTION_OFF", "1")];

/// Tests that read digits from timing, and the replay-floor test (which keeps both cores
/// busy for a minute), take turns: on 2 shared cores one such test beside another moved a
/// 0.45 s digit step by a third of a step (CI, 2026-12-06).
static QUIET: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn python() -> PathBuf {
    std::env::var_os("GERMLINE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

/// Copies the attack release `name` to `dir/rel`.
fn release(name: &str, dir: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/attacks/outputs").join(name);
    let dst = dir.join("rel");
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["germline.toml", "server.py"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap_or_else(|e| panic!("{name}/{f}: {e}"));
    }
}

/// The hr document holding `content` under `dir/items/hr`, and a policy clearing
/// `hr.example` and the `hrc` consumer for hr, `stats.example` and the `public` consumer
/// for nothing, both hosts at one loopback sink. Returns the document's path.
fn world(dir: &Path, content: &str, sink_connections: usize) -> PathBuf {
    let items = dir.join("items/hr");
    std::fs::create_dir_all(&items).unwrap();
    let doc = items.join("payslip.txt");
    std::fs::write(&doc, content).unwrap();
    let port = common::ok_sink(sink_connections);
    std::fs::write(
        dir.join("policy.toml"),
        format!(
            "tags = [\"hr\"]\n[[items]]\npath = \"{}/**\"\nlabel = [\"hr\"]\n[destinations.\"hr.example\"]\nclearance = [\"hr\"]\n[destinations.\"stats.example\"]\nclearance = []\n[consumers.public]\nclearance = []\n[consumers.hrc]\nclearance = [\"hr\"]\n[hosts]\n\"hr.example\" = \"127.0.0.1:{port}\"\n\"stats.example\" = \"127.0.0.1:{port}\"\n",
            items.display()
        ),
    )
    .unwrap();
    doc
}

/// One call per index, each with the document as its item and `public` as its consumer.
/// A service (with `env`) serving the attack release `name` in a fresh world whose hr
/// document holds `content`: its directory (dropped last), the service, the release hash,
/// the API token and the document.
fn served(
    name: &str,
    content: &str,
    sink_connections: usize,
    env: &[(&str, &str)],
) -> (tempfile::TempDir, Service, String, String, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    release(name, dir);
    let doc = world(dir, content, sink_connections);
    let (svc, hash) = Service::start(dir, env);
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    (tmp, svc, hash, token, doc)
}

fn calls(doc: &Path, indexes: impl IntoIterator<Item = usize>) -> Vec<Value> {
    indexes
        .into_iter()
        .map(|i| json!({"tool": "scan", "arguments": {"document": doc, "index": i}, "items": [doc], "consumers": ["public"]}))
        .collect()
}

fn germline(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_germline"));
    cmd.args(args)
        .args(["--release", "rel", "--policy", "policy.toml"])
        .current_dir(dir)
        .env("GERMLINE_HOME", dir.join("home"))
        .env("GERMLINE_DATA_DIR", dir.join("data"))
        .env("GERMLINE_PYTHON", python())
        .env_remove("GERMLINE_TEST_OUTPUT_REDUCTION_OFF")
        .envs(env.iter().copied());
    cmd
}

/// Runs `germline session` over `calls` with stdout and stderr in one file, so every log
/// line sits before the outcome of the call during which it was written. Returns, per
/// call, its outcome and the log lines written since the previous outcome.
fn session(dir: &Path, calls: &[Value], env: &[(&str, &str)]) -> Vec<(Value, Vec<String>)> {
    session_with_tail(dir, calls, env).0
}

/// [`session`], and the log lines written after the last outcome. A call's triggers are
/// verified beside the session's later calls; with `GERMLINE_TEST_VERIFY_IN_LANE=1` in
/// `env`, after its outcome is printed and before the next call, so their lines sit before
/// the next outcome.
fn session_with_tail(dir: &Path, calls: &[Value], env: &[(&str, &str)]) -> (Vec<(Value, Vec<String>)>, Vec<String>) {
    let lines: String = calls.iter().map(|c| format!("{c}\n")).collect();
    std::fs::write(dir.join("calls.jsonl"), lines).unwrap();
    let log = dir.join("session.out");
    let f = std::fs::File::create(&log).unwrap();
    let status = germline(dir, &["session", "--calls", "calls.jsonl"], env)
        .stdout(Stdio::from(f.try_clone().unwrap()))
        .stderr(Stdio::from(f))
        .status()
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let mut out = Vec::new();
    let mut pending = Vec::new();
    for line in text.lines() {
        match serde_json::from_str::<Value>(line) {
            Ok(v) if v.is_object() => out.push((v, std::mem::take(&mut pending))),
            _ => pending.push(line.to_owned()),
        }
    }
    assert_eq!(out.len(), calls.len(), "session exited {status}; output:\n{text}");
    (out, pending)
}

/// Seconds in a `Debug`-printed `Duration` (`1.2s`, `850.1ms`, `12µs`, `7ns`).
fn seconds(d: &str) -> Option<f64> {
    for (suffix, scale) in [("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9), ("s", 1.0)] {
        if let Some(n) = d.strip_suffix(suffix) {
            return n.parse::<f64>().ok().map(|n| n * scale);
        }
    }
    None
}

/// The value of field `name` in a `tracing` line (`name=value`).
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
}

/// The copy that holds nothing sends 128 identical requests to stats.example; the copy
/// holding the hr document sends as many as byte `index` says, then a different one. The
/// trigger's position spells the byte in the outcome every caller gets: off, four calls
/// give the public caller the document's first four bytes; on, triggers of copies the
/// consumer is not cleared for say only that they exist.
#[test]
fn trigger_positions_spell_an_hr_document_to_a_public_caller() {
    const CANARY: &str = "K7Q2";
    let run = |env: &[(&str, &str)]| {
        let tmp = tempfile::tempdir().unwrap();
        release("trigger-position", tmp.path());
        let doc = world(tmp.path(), CANARY, 4000);
        let outs = session(tmp.path(), &calls(&doc, 0..CANARY.len()), env);
        let mut spelled = String::new();
        for (o, _) in &outs {
            assert_eq!(o["status"], "answered", "{o}");
            assert_eq!(o["label"], json!([]), "the public consumer's own copy held nothing: {o}");
            let triggers = o["triggers"].as_array().unwrap_or_else(|| panic!("no triggers: {o}"));
            assert!(!triggers.is_empty(), "the hr copy diverged: {o}");
            for t in triggers {
                if let Some(p) = t["position"].as_u64() {
                    spelled.push(char::from(p as u8));
                }
            }
        }
        (spelled, outs)
    };

    let (off, _) = run(OFF);
    eprintln!("reduction off: trigger positions spell {off:?}");
    assert_eq!(off, CANARY, "off: the trigger positions spell the hr document to the public caller");

    let (on, outs) = run(&[]);
    eprintln!("reduction on: trigger positions spell {on:?}");
    assert_eq!(on, "", "on: no position of an uncleared copy's trigger is printed");
    for (o, _) in &outs {
        let t = &o["triggers"][0];
        assert!(t.get("kind").is_none() && t.get("position").is_none(), "{o}");
        assert_eq!(t["label"], json!(["hr"]), "the trigger carries the copies' labels: {o}");
    }
}

/// The same channel with the hr byte on the serving side: an hr copy keeps a byte in the
/// hr slot; in a later call for a consumer cleared for finance only, hr.example's copy
/// (no item, the hr slot) sends that many requests, and the finance copy, running after
/// it, sends more. The trigger's position is where the finance copy parts from the hr
/// record: the hr byte, although the diverging copy's own label is finance (so a rule that
/// looks at the diverging copy's label alone shows it). Off, four byte-pairs of calls
/// give the finance consumer the document's first four bytes; on, the trigger carries
/// both copies' labels and no position.
#[test]
fn a_serving_copys_hr_slot_spells_itself_in_a_trigger_position() {
    const CANARY: &str = "W9dE";
    let run = |env: &[(&str, &str)]| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        release("trigger-serving-slot", dir);
        for d in ["items/hr", "items/finance"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let (doc, invoice) = (dir.join("items/hr/payslip.txt"), dir.join("items/finance/invoice.txt"));
        std::fs::write(&doc, CANARY).unwrap();
        std::fs::write(&invoice, "invoice 12").unwrap();
        let port = common::ok_sink(2000);
        std::fs::write(
            dir.join("policy.toml"),
            format!(
                "tags = [\"hr\", \"finance\"]\n[[items]]\npath = \"{i}/hr/**\"\nlabel = [\"hr\"]\n[[items]]\npath = \"{i}/finance/**\"\nlabel = [\"finance\"]\n[destinations.\"hr.example\"]\nclearance = [\"hr\"]\n[destinations.\"ocr.example\"]\nclearance = [\"finance\"]\n[consumers.agent]\nclearance = [\"hr\", \"finance\"]\n[consumers.fin]\nclearance = [\"finance\"]\n[hosts]\n\"hr.example\" = \"127.0.0.1:{port}\"\n\"ocr.example\" = \"127.0.0.1:{port}\"\n",
                i = dir.join("items").display()
            ),
        )
        .unwrap();
        let mut calls = Vec::new();
        for i in 0..CANARY.len() {
            calls.push(json!({"tool": "scan", "arguments": {"document": doc, "mode": "store", "index": i}, "items": [doc], "consumers": ["agent"]}));
            calls.push(json!({"tool": "scan", "arguments": {"document": invoice, "mode": "probe"}, "items": [invoice], "consumers": ["fin"]}));
        }
        let outs = session(dir, &calls, env);
        let mut spelled = String::new();
        for (o, _) in outs.iter().skip(1).step_by(2) {
            assert_eq!(o["status"], "answered", "{o}");
            assert_eq!(o["label"], json!(["finance"]), "the fin consumer's own copy: {o}");
            let t = &o["triggers"][0];
            assert_eq!(t["group_index"], 1, "the finance copy diverged: {o}");
            // The diverging copy's own label is finance only (its egress entries say so).
            let egress = o["egress"].as_array().unwrap_or_else(|| panic!("{o}"));
            assert!(egress.iter().filter(|e| e["group"] == 1).all(|e| e["label"] == json!(["finance"])), "{o}");
            if let Some(p) = t["position"].as_u64() {
                spelled.push(char::from(p as u8));
            }
        }
        (spelled, outs)
    };

    let (off, _) = run(OFF);
    eprintln!("reduction off: trigger positions spell {off:?}");
    assert_eq!(off, CANARY, "off: the serving hr record's length reaches the finance consumer");

    let (on, outs) = run(&[]);
    eprintln!("reduction on: trigger positions spell {on:?}");
    assert_eq!(on, "", "on: the position is withheld");
    for (o, _) in outs.iter().skip(1).step_by(2) {
        assert_eq!(o["triggers"][0]["label"], json!(["finance", "hr"]), "{o}");
        assert!(o["triggers"][0].get("kind").is_none(), "{o}");
    }
}

/// The copy holding the hr document sleeps 0.3 s per unit of digit `index`. At debug level
/// the broker logged every copy's timings, so the log reader reads the digit off the hr
/// copy's `t_served`; on, only copies with an empty label have timing lines.
#[test]
fn copy_timings_in_the_log_spell_an_hr_digit() {
    let _quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
    const DIGIT: u32 = 7;
    let run = |env: &[(&str, &str)]| {
        let tmp = tempfile::tempdir().unwrap();
        release("copy-timing", tmp.path());
        let doc = world(tmp.path(), &DIGIT.to_string(), 100);
        let env: Vec<(&str, &str)> = env.iter().copied().chain([("GERMLINE_LOG", "debug")]).collect();
        let outs = session(tmp.path(), &calls(&doc, [0]), &env);
        let (o, log) = &outs[0];
        assert_eq!(o["status"], "answered", "{o}");
        let served = |group: &str| {
            log.iter()
                .filter(|l| l.contains("copy timings") && field(l, "group") == Some(group))
                .find_map(|l| field(l, "t_served").and_then(seconds))
        };
        (served("0"), served("1"), log.join("\n"))
    };

    // Timing on a loaded host is noisy: the digit must be read in one of three tries.
    let mut reads = Vec::new();
    for _ in 0..3 {
        let (public, hr, log) = run(OFF);
        let (public, hr) = (public.expect("the public copy's timing line"), hr.unwrap_or_else(|| panic!("{log}")));
        let read = ((hr - public) / 0.3).round();
        eprintln!("reduction off: t_served public {public:.3} s, hr {hr:.3} s: digit {read}");
        reads.push(read);
        if read == f64::from(DIGIT) {
            break;
        }
    }
    assert!(reads.contains(&f64::from(DIGIT)), "off: the hr copy's timing line spells the digit: {reads:?}");

    let (public, hr, log) = run(&[]);
    eprintln!("reduction on: t_served public {public:?}, hr {hr:?}");
    assert!(public.is_some(), "on: the unlabelled copy's timing is still logged:\n{log}");
    assert!(hr.is_none(), "on: no timing line for the hr copy:\n{log}");
    assert!(!log.contains("copy MCP timings"), "{log}");
}

/// The copy holding the hr document breaks a slot bound when bit `index` of its first
/// byte is 1; the host logged "a slot bound was broken" for it, so eight calls give a log
/// reader the byte. On, the line is written only for copies with an empty label.
#[test]
fn slot_refusal_lines_spell_an_hr_byte() {
    const CANARY: u8 = b'Z';
    let run = |env: &[(&str, &str)]| {
        let tmp = tempfile::tempdir().unwrap();
        release("slot-bound-bit", tmp.path());
        let doc = world(tmp.path(), &char::from(CANARY).to_string(), 100);
        let outs = session(tmp.path(), &calls(&doc, 0..8), env);
        let mut byte = 0u8;
        for (i, (o, log)) in outs.iter().enumerate() {
            assert_eq!(o["status"], "answered", "{o}");
            if log.iter().any(|l| l.contains("slot bound was broken")) {
                byte |= 1 << i;
            }
        }
        byte
    };
    let off = run(OFF);
    eprintln!("reduction off: log lines spell {off:#04x}");
    assert_eq!(off, CANARY, "off: the slot refusal lines spell the hr byte to a log reader");
    let on = run(&[]);
    eprintln!("reduction on: log lines spell {on:#04x}");
    assert_eq!(on, 0, "on: no refusal line for a labelled copy");
}

/// Attempts that failed: the copy holding the hr document misbehaves on its channel in
/// eight ways (dies, sends non-UTF-8, an oversized line, a JSON-RPC error, other request
/// ids and notifications, an `isError` result with resource links, embedded resources and
/// images, runs past its deadline), each carrying the document. Under `nosplit` (one copy
/// holding everything: splitting off) the public consumer's outcome changes with the
/// misbehaviour and carries the canary; under germline every outcome is the public copy's
/// same answer, and no log line (debug level) carries the canary.
#[test]
fn hr_copy_misbehaviour_leaves_the_public_outcome_unchanged() {
    const CANARY: &str = "CANARY-misbehave-5e1";
    let run = |runtime: &str| {
        let tmp = tempfile::tempdir().unwrap();
        release("misbehave", tmp.path());
        let doc = world(tmp.path(), CANARY, 100);
        let mut policy = std::fs::read_to_string(tmp.path().join("policy.toml")).unwrap();
        policy.push_str("[limits]\ndeadline_ms = 4000\n");
        std::fs::write(tmp.path().join("policy.toml"), policy).unwrap();
        let env = [("GERMLINE_LOG", "debug")];
        let (outs, tail) = if runtime == "germline" {
            session_with_tail(tmp.path(), &calls(&doc, 0..8), &env)
        } else {
            // The runtime flag goes after the subcommand's own arguments.
            let lines: String = calls(&doc, 0..8).iter().map(|c| format!("{c}\n")).collect();
            std::fs::write(tmp.path().join("calls.jsonl"), lines).unwrap();
            let out = germline(tmp.path(), &["session", "--calls", "calls.jsonl", "--runtime", runtime], &[])
                .output()
                .unwrap();
            let outs = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| (serde_json::from_str::<Value>(l).unwrap(), Vec::new()))
                .collect();
            (outs, Vec::new())
        };
        (outs, tail)
    };

    let (off, _) = run("nosplit");
    let texts: Vec<String> = off.iter().map(|(o, _)| o.to_string()).collect();
    let leaked = texts.iter().filter(|t| t.contains(CANARY)).count();
    let distinct: std::collections::BTreeSet<&String> = texts.iter().collect();
    eprintln!("nosplit: {leaked} of 8 public outcomes carry the canary, {} distinct outcomes", distinct.len());
    assert!(leaked > 0 && distinct.len() > 1, "off: the misbehaviour reaches the public consumer: {texts:#?}");

    let (on, tail) = run("germline");
    let first = on[0].0.to_string();
    for (i, (o, log)) in on.iter().enumerate() {
        assert_eq!(o.to_string(), first, "mode {i}: the public outcome differs");
        assert!(!log.join("\n").contains(CANARY), "mode {i}: a log line carries the canary");
    }
    assert!(!tail.join("\n").contains(CANARY));
    assert_eq!(on[0].0["result"]["content"][0]["text"], "scanned", "{first}");
    eprintln!("germline: 8 identical public outcomes: {first}");
}

/// The probe replay of a trigger holds the hr document and kills itself when bit `index`
/// of its first byte is 1; the host logged "replayed copy ended without a result" at debug
/// level for each such replay, after the call's outcome. Eight calls give a log reader
/// the byte; on, no line says how a replay ended.
#[test]
fn replay_outcome_lines_spell_an_hr_byte() {
    const CANARY: u8 = b'R';
    let run = |env: &[(&str, &str)]| {
        let tmp = tempfile::tempdir().unwrap();
        release("replay-bit", tmp.path());
        let doc = world(tmp.path(), &char::from(CANARY).to_string(), 100);
        // Verification in the session's order (both runs), so each call's replay lines come
        // before the next outcome: the reduction is the only switch that differs.
        let env: Vec<(&str, &str)> =
            env.iter().copied().chain([("GERMLINE_LOG", "debug"), ("GERMLINE_TEST_VERIFY_IN_LANE", "1")]).collect();
        let (outs, tail) = session_with_tail(tmp.path(), &calls(&doc, 0..8), &env);
        // Lines written while call i's triggers were verified precede outcome i + 1.
        let mut after: Vec<&Vec<String>> = outs.iter().skip(1).map(|(_, log)| log).collect();
        after.push(&tail);
        let mut byte = 0u8;
        for (i, ((o, _), log)) in outs.iter().zip(after).enumerate() {
            assert_eq!(o["status"], "answered", "{o}");
            assert!(!o["triggers"].as_array().is_none_or(Vec::is_empty), "call {i} triggers: {o}");
            if log.iter().any(|l| l.contains("replayed copy ended without a result")) {
                byte |= 1 << i;
            }
        }
        byte
    };
    let off = run(OFF);
    eprintln!("reduction off: replay lines spell {off:#04x}");
    assert_eq!(off, CANARY, "off: the replay lines spell the hr byte to a log reader");
    let on = run(&[]);
    eprintln!("reduction on: replay lines spell {on:#04x}");
    assert_eq!(on, 0, "on: no line says how a replay ended");
}

/// Open: how long a call takes is the sum of its copies' runs, and the hr copy chooses its
/// own. The public caller of a session sees each outcome arrive (as the front's client
/// sees each answer, and the API's caller `latency_ms`); a fleet peer sees the call's
/// dampening entry appended to the ledger, in milliseconds. Measured under full germline:
/// both read the hr digit. Bound: log2(deadline / resolution) per copy and call, about
/// 15 bits at the default 30 s deadline and a 1 ms clock.
#[test]
#[ignore = "open channel: see SECURITY.md"]
fn call_durations_spell_an_hr_digit_to_the_caller_and_the_ledger() {
    let _quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
    const DIGIT: u32 = 7;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    release("copy-timing", dir);
    let doc = world(dir, &format!("00{DIGIT}"), 100);
    let lines: String = calls(&doc, 0..3).iter().map(|c| format!("{c}\n")).collect();
    std::fs::write(dir.join("calls.jsonl"), lines).unwrap();
    let mut child = germline(dir, &["session", "--calls", "calls.jsonl"], &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut arrivals = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        assert!(!line.contains(&format!("00{DIGIT}")), "{line}");
        arrivals.push(Instant::now());
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(arrivals.len(), 3);
    let base = (arrivals[1] - arrivals[0]).as_secs_f64();
    let slow = (arrivals[2] - arrivals[1]).as_secs_f64();
    let by_caller = ((slow - base) / 0.3).round();
    eprintln!("caller: call 2 took {base:.3} s, call 3 {slow:.3} s: digit {by_caller}");
    assert_eq!(by_caller, f64::from(DIGIT), "the public caller reads the digit from when outcomes arrive");

    let ledger =
        germline_ledger::Ledger::open(dir.join("data/ledger"), germline_ledger::LedgerConfig::default()).unwrap();
    let times: Vec<u64> = (0..ledger.size())
        .filter_map(|i| ledger.get(i).ok())
        .filter(|e| e.kind == germline_ledger::EntryKind::DampeningEvent)
        .map(|e| e.time_ms)
        .collect();
    assert_eq!(times.len(), 3, "one dampening entry per call");
    let base = (times[1] - times[0]) as f64 / 1000.0;
    let slow = (times[2] - times[1]) as f64 / 1000.0;
    let by_peer = ((slow - base) / 0.3).round();
    eprintln!("ledger: entries {base:.3} s and {slow:.3} s apart: digit {by_peer}");
    assert_eq!(by_peer, f64::from(DIGIT), "a ledger reader (fleet peer) reads the digit from entry times");
}

/// `germline serve` on an ephemeral loopback port, killed when dropped.
struct Service {
    child: std::process::Child,
    port: u16,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    /// Publishes `dir/rel` in a fresh TUF repository, starts the service with the policy
    /// of [`world`] and `env`, and admits the release; returns the service and the hash.
    fn start(dir: &Path, env: &[(&str, &str)]) -> (Service, String) {
        let run = |args: &[&str]| {
            let out = Command::new(env!("CARGO_BIN_EXE_germline"))
                .args(args)
                .current_dir(dir)
                .env("GERMLINE_HOME", dir.join("home"))
                .env("GERMLINE_PYTHON", python())
                .output()
                .unwrap();
            assert!(out.status.success(), "germline {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        run(&["release", "build", "rel", "--out", "rel.tar.gz"]);
        run(&["repo", "init", "repo", "--keys", "keys"]);
        run(&["repo", "add", "repo", "rel.tar.gz", "--keys", "keys"]);
        let data = dir.join("data");
        std::fs::write(
            dir.join("serve.toml"),
            format!(
                "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\npolicy = \"{}\"\ntrust.allow_caller_roots = true\n",
                data.display(),
                dir.join("policy.toml").display()
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_germline"))
            .args(["serve", "--config", "serve.toml"])
            .current_dir(dir)
            .env("GERMLINE_HOME", dir.join("home"))
            .env("GERMLINE_PYTHON", python())
            .env_remove("GERMLINE_DATA_DIR")
            .env_remove("GERMLINE_LISTEN")
            .env_remove("GERMLINE_TEST_OUTPUT_REDUCTION_OFF")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut line = String::new();
        let port = loop {
            line.clear();
            let n = err.read_line(&mut line).unwrap();
            log.lock().unwrap().push_str(&line);
            assert!(n > 0, "the service exited: {}", log.lock().unwrap());
            if let Some(rest) = line.trim().strip_prefix("germline: serving the API on http://127.0.0.1:") {
                break rest.parse::<u16>().unwrap();
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
        let svc = Service { child, port, log };
        let end = Instant::now() + std::time::Duration::from_secs(120);
        while svc.http("GET", "/readyz", None).0 != 200 {
            assert!(Instant::now() < end, "not ready: {}", svc.log.lock().unwrap());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let token = std::fs::read_to_string(data.join("api-token")).unwrap().trim().to_owned();
        let root = std::fs::read_to_string(dir.join("repo/metadata/1.root.json")).unwrap();
        // The repository lists the release by its manifest name.
        let manifest = std::fs::read_to_string(dir.join("rel/germline.toml")).unwrap();
        let name = manifest.lines().find_map(|l| l.strip_prefix("name = ")).unwrap().trim_matches('"');
        let admit = json!({"repo": dir.join("repo"), "root": root, "target": name});
        let (status, body) = svc.http("POST", "/v1/releases/tuf", Some((&token, &admit)));
        assert_eq!(status, 201, "{body}");
        let hash = serde_json::from_str::<Value>(&body).unwrap()["hash"].as_str().unwrap().to_owned();
        std::fs::write(dir.join("token"), token).unwrap();
        (svc, hash)
    }

    /// One request on a fresh connection: (status, body).
    fn http(&self, method: &str, path: &str, post: Option<(&str, &Value)>) -> (u16, String) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(120))).unwrap();
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n", self.port);
        let body = post.map(|(token, b)| {
            head.push_str(&format!("Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"));
            b.to_string()
        });
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.as_ref().map_or(0, String::len)));
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body.unwrap_or_default().as_bytes()).unwrap();
        let mut raw = String::new();
        s.take(8 << 20).read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        (head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0), body.to_owned())
    }

    /// The value of `name{...release="hash"...}` in /metrics.
    fn metric(&self, name: &str, hash: &str, extra: &str) -> Option<f64> {
        let (_, text) = self.http("GET", "/metrics", None);
        text.lines()
            .find(|l| {
                l.starts_with(&format!("{name}{{")) && l.contains(&format!("release=\"{hash}\"")) && l.contains(extra)
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }
}

/// `/metrics` (read without a token) and the service's log had every call's latency: the
/// histogram's sum, the span's `latency_ms`. The copy holding the hr document sleeps 0.3 s
/// per unit of a digit, so two calls give a metrics reader the digit. On, a call with a
/// labelled copy adds no latency sample, counts as `ran`, and its span has no latency.
#[test]
fn metrics_latency_spells_an_hr_digit_to_a_metrics_reader() {
    let _quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
    const DIGIT: u32 = 7;
    let run = |env: &[(&str, &str)]| {
        let (_tmp, svc, hash, token, doc) = served("copy-timing", &format!("00{DIGIT}"), 100, env);
        let mut sums = vec![0.0];
        for call in calls(&doc, 0..3) {
            let (status, body) = svc.http("POST", &format!("/v1/releases/{hash}/calls"), Some((&token, &call)));
            assert_eq!(status, 200, "{body}");
            // The document must not be in the answer (its own latency figure may contain
            // the digits by chance: checked without it).
            let mut answer: serde_json::Value = serde_json::from_str(&body).unwrap();
            answer.as_object_mut().map(|o| o.remove("latency_ms"));
            assert!(!answer.to_string().contains(&format!("00{DIGIT}")), "{body}");
            sums.push(svc.metric("germline_call_duration_seconds_sum", &hash, "").unwrap_or(0.0));
        }
        let ran = svc.metric("germline_calls_total", &hash, "outcome=\"ran\"");
        let log = svc.log.lock().unwrap().clone();
        (sums, ran, log)
    };

    // Timing on a loaded host is noisy: the digit must be read in one of three tries.
    let mut reads = Vec::new();
    for _ in 0..3 {
        let (sums, ran, log) = run(OFF);
        // The first call is a warm-up; the second is the base.
        let (base, slow) = (sums[2] - sums[1], sums[3] - sums[2]);
        let read = ((slow - base) / 0.3).round();
        eprintln!("reduction off: /metrics latency {base:.3} s then {slow:.3} s: digit {read}");
        assert_eq!(ran, None);
        assert!(log.contains("latency_ms="), "off: the call span carries the latency: {log}");
        reads.push(read);
        if read == f64::from(DIGIT) {
            break;
        }
    }
    assert!(reads.contains(&f64::from(DIGIT)), "off: the latency histogram spells the digit: {reads:?}");

    let (sums, ran, log) = run(&[]);
    eprintln!("reduction on: /metrics latency sums {sums:?}, calls counted as ran: {ran:?}");
    assert_eq!(sums, [0.0; 4], "on: no latency sample of a call with a labelled copy");
    assert_eq!(ran, Some(3.0), "on: every call counted, as `ran`");
    assert!(!log.contains("latency_ms="), "on: no latency in the call span: {log}");
}

/// Hex digits read from how much longer than after a digit-0 trigger each wait took (the
/// `replay-lock` probe sleeps 0.15 s per unit, 3 tries), how many match the first digits
/// of `canary`, and how far, in units, the waits lie from their digits of `canary` once
/// one offset common to all is taken out: the largest distance from the offset that fits
/// best. On 2 shared cores a wait lands up to about 0.9 units off (CI, 2026-12-06), and the
/// digit-0 reference the waits are measured from is one sample, so a slow reference shifts
/// every wait alike (1.6 units in a CI run); exact digits are luck. A channel shows as every
/// wait within 1.5 units of its digit after that shift: by chance, 7 waits fall within one
/// window of 3 units with probability about 7 x (3/16)^6 = 3e-4, 5 waits 6e-3. Waits that
/// carry nothing (all about 0) spread as widely as the digits do.
fn spell_digits(extra: &[f64], canary: &str, what: &str) -> (String, usize, f64) {
    let unit = 3.0 * 0.15;
    let spelled: String = extra
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let digit = (w / unit).round().clamp(0.0, 15.0) as u32;
            eprintln!("hr call {i}: {what} {w:.3} s more than after digit 0: {digit:x}");
            char::from_digit(digit, 16).unwrap_or('?')
        })
        .collect();
    let right = spelled.chars().zip(canary.chars()).filter(|(a, b)| a == b).count();
    let gaps: Vec<f64> =
        extra.iter().zip(canary.chars()).map(|(w, c)| w / unit - f64::from(c.to_digit(16).unwrap_or(0))).collect();
    let (low, high) = gaps.iter().fold((f64::MAX, f64::MIN), |(l, h), g| (l.min(*g), h.max(*g)));
    let (shift, off_by) = ((high + low) / 2.0, (high - low) / 2.0);
    eprintln!(
        "read {spelled}, the hr document begins {}: {right}/{} hex digits; shifted by {shift:.2} units, every wait \
         within {off_by:.2} units of its digit",
        &canary[..extra.len()],
        extra.len()
    );
    (spelled, right, off_by)
}

/// Found by the adversarial pass of 2026-12-04 (`tests/attacks/outputs/replay-lock`). An hr
/// call whose only consumer (`hrc`) is cleared for hr records a trigger; its probe sleeps
/// 0.15 s x a hex digit per try (3 tries); a `public` caller calls right after and times
/// its own round trip, against one trigger whose probe sleeps for digit 0.
/// - Off (`GERMLINE_TEST_VERIFY_IN_LANE=1`): the service verifies the trigger while it
///   holds the release's lane, as it once did, so the public call waits for the replays and
///   reads the digits.
/// - On: the replays run on a germline of their own (`germline_host::Verifier`), and no
///   call waits for them.
#[test]
fn replay_time_holding_the_lane_spells_hr_digits_to_the_next_public_caller() {
    let _quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
    const CANARY: &str = "c0ffee5a";
    let read = |env: &[(&str, &str)]| {
        let (_tmp, svc, hash, token, doc) = served("replay-lock", CANARY, 1000, env);
        let url = format!("/v1/releases/{hash}/calls");
        let hr_call = |i: i64| json!({"tool": "scan", "arguments": {"document": doc, "index": i}, "items": [doc], "consumers": ["hrc"]});
        let public_call = json!({"tool": "scan", "arguments": {"document": ""}, "consumers": ["public"]});
        // An hr call, then at once a public call, timed by its caller.
        let round = |i: i64| {
            let (s, b) = svc.http("POST", &url, Some((&token, &hr_call(i))));
            assert_eq!(s, 200, "{b}");
            let t0 = Instant::now();
            let (s, b) = svc.http("POST", &url, Some((&token, &public_call)));
            assert_eq!(s, 200, "{b}");
            assert!(!b.contains(CANARY), "{b}");
            t0.elapsed().as_secs_f64()
        };
        // Calibration: a trigger whose probe sleeps for digit 0 (index -1), i.e. the
        // replays' own cost. The unit is public too: the host's probe tries (3 by default)
        // times the release's step.
        let zero = round(-1);
        // Dampening suppresses the release at 9 triggered calls in a row: 1 + 7 here.
        let extra: Vec<f64> = (0..7).map(|i| round(i) - zero).collect();
        spell_digits(&extra, CANARY, "the next public call waited")
    };
    let (off, _, off_by) = read(&[("GERMLINE_TEST_VERIFY_IN_LANE", "1")]);
    assert!(off_by <= 1.5, "off: the replay time spells the canary: {off} against {CANARY}, off by {off_by:.2}");
    let (on, right, off_by) = read(&[]);
    assert!(right <= 2 && off_by > 1.5, "on: no call waits for a replay: {on} against {CANARY}");
}

/// Found by the adversarial pass of 2026-12-05 (`tests/attacks/outputs/replay-tunnel`).
/// The broker writes the debug line `a tunnel ended early` for each CONNECT tunnel a copy
/// cuts while the copy's label is empty. Each call (whose only consumer is `public`) records
/// a trigger; the copy of the call that holds the hr document cuts as many tunnels as byte
/// `index` of the document says and writes nothing (it is labelled hr), and so do its probe
/// replays (3 tries), which hold the same document. A reader of the service's log counts
/// the lines once the call's witness has landed.
/// - Off (`GERMLINE_TEST_REPLAY_LABELS_OFF=1`, debug builds): replays run with an empty
///   label, as they did at 5dae75c, so every tunnel a probe cuts is a line: 3 x the byte.
/// - On: a replay is labelled by what its view, recorded slot and replies carry, so the
///   probe's tunnels write nothing.
#[test]
fn replay_tunnel_lines_spell_an_hr_document_to_a_log_reader() {
    const CANARY: &str = "hR7!q";
    let read = |env: &[(&str, &str)]| {
        let env: Vec<(&str, &str)> = env.iter().copied().chain([("GERMLINE_LOG", "debug")]).collect();
        let (_tmp, svc, hash, token, doc) = served("replay-tunnel", CANARY, 1000, &env);
        let url = format!("/v1/releases/{hash}/calls");
        let lines = || svc.log.lock().unwrap().lines().filter(|l| l.contains("a tunnel ended early")).count();
        let mut spelled = Vec::new();
        let mut seen = 0;
        for (i, call) in calls(&doc, 0..CANARY.len()).into_iter().enumerate() {
            let (status, body) = svc.http("POST", &url, Some((&token, &call)));
            assert_eq!(status, 200, "{body}");
            assert!(!body.contains(CANARY), "{body}");
            // The call's replays are over once its witness is in the ledger.
            let end = Instant::now() + std::time::Duration::from_secs(180);
            loop {
                let (_, w) = svc.http("GET", &format!("/v1/releases/{hash}/witnesses"), None);
                let n = serde_json::from_str::<Value>(&w).ok().and_then(|v| v.as_array().map(Vec::len)).unwrap_or(0);
                if n > i {
                    break;
                }
                assert!(Instant::now() < end, "no witness for call {i}: {}", svc.log.lock().unwrap());
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
            let total = lines();
            let n = total - seen;
            seen = total;
            eprintln!(
                "call {i}: {n} `a tunnel ended early` lines in the log: byte {} ({:?})",
                n / 3,
                char::from((n / 3) as u8)
            );
            // The call's own hr copy cut as many tunnels and wrote no line: 3 probes, not 4.
            assert_eq!(n % 3, 0, "call {i}: {n} lines");
            spelled.push((n / 3) as u8);
        }
        spelled
    };
    let off = read(&[("GERMLINE_TEST_REPLAY_LABELS_OFF", "1")]);
    eprintln!(
        "replay labels off: the log reader read {:?}; the hr document is {CANARY:?}",
        String::from_utf8_lossy(&off)
    );
    assert_eq!(off, CANARY.as_bytes(), "off: the probe replays' tunnel lines spell the hr document to a log reader");
    let on = read(&[]);
    eprintln!("replay labels on: the log reader read {on:?}");
    assert!(on.iter().all(|b| *b == 0), "on: no line for a tunnel a probe cut: {on:?}");
}

/// Found by the adversarial pass of 2026-12-05 (`tests/attacks/outputs/replay-lock`, run
/// with the CLI). Every call's only consumer is `public`: the hr document goes to no
/// consumer (only `hr.example` may see it), so the session's stdout holds nothing of it,
/// yet the probe replays hold it and choose how long they take (0.15 s x a hex digit, 3
/// tries).
/// - Off (`GERMLINE_TEST_VERIFY_IN_LANE=1`): `germline session` waits for each call's
///   verification before its next call, as it did at 5dae75c, so the reader of stdout sees
///   the next outcome arrive that much later and reads the digits.
/// - On: the session's calls do not wait for replays (it waits once, before it exits).
#[test]
fn session_stdout_timing_spells_hr_digits_a_public_session_reader_never_got() {
    let _quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
    const CANARY: &str = "c0ffee5a";
    let read = |env: &[(&str, &str)]| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        release("replay-lock", dir);
        let doc = world(dir, CANARY, 1000);
        let hr_call = |i: i64| json!({"tool": "scan", "arguments": {"document": doc, "index": i}, "items": [doc], "consumers": ["public"]});
        let public_call = json!({"tool": "scan", "arguments": {"document": ""}, "consumers": ["public"]});
        let indexes: Vec<i64> = vec![-1, 0, 1, 2, 3, 4];
        let mut lines = String::new();
        for i in &indexes {
            lines.push_str(&format!("{}\n{}\n", hr_call(*i), public_call));
        }
        std::fs::write(dir.join("calls.jsonl"), lines).unwrap();
        let mut child = germline(dir, &["session", "--calls", "calls.jsonl"], env)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut arrivals = Vec::new();
        for line in out.lines() {
            let line = line.unwrap();
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                assert!(!line.contains(CANARY), "{line}");
                arrivals.push((Instant::now(), v));
            }
        }
        let _ = child.wait();
        assert_eq!(arrivals.len(), 2 * indexes.len());
        for (_, v) in &arrivals {
            assert_eq!(v["status"], "answered", "{v}");
            let text = v.to_string();
            assert!(!text.contains("scanned") || v["label"] == json!([]), "public results only: {v}");
        }
        // The gap between an hr call's outcome and the next (public) outcome.
        let gaps: Vec<f64> = arrivals.chunks(2).map(|p| p[1].0.duration_since(p[0].0).as_secs_f64()).collect();
        let extra: Vec<f64> = gaps[1..].iter().map(|g| g - gaps[0]).collect();
        spell_digits(&extra, CANARY, "the next outcome came")
    };
    let (off, _, off_by) = read(&[("GERMLINE_TEST_VERIFY_IN_LANE", "1")]);
    assert!(off_by <= 1.5, "off: the session's output timing spells the hr digits: {off}, off by {off_by:.2}");
    let (on, right, off_by) = read(&[]);
    assert!(right <= 2 && off_by > 1.5, "on: no outcome waits for a replay: {on}");
}

/// `tests/attacks/outputs/replay-floor` (adversarial pass of 2026-12-06): the host's
/// multigrain timestamp floor (`tests/attacks/kernel/mgfloor`) between a probe replay and
/// the next call, with no concurrent caller. An hr call records a trigger and returns; its
/// probe replay, run off the lane after the outcome and holding the document, moves the
/// floor in frames that spell it; the very next call of the release, whose only consumer is
/// `public`, runs on the lane meanwhile, reads the floor and returns the bits. Off
/// (`GERMLINE_TEST_TMPFS_SCRATCH=1`: a copy's scratch is a tmpfs, as before): the public
/// caller reads the canary; on (a ramfs scratch, no memfd): the replay cannot move the
/// floor.
#[test]
fn replay_floor_a_probe_replay_spells_the_document_to_the_next_public_call_only_from_a_tmpfs() {
    let _quiet = QUIET.lock().unwrap_or_else(|p| p.into_inner());
    const CANARY: &str = "GLC-hr-5a17c0ffee0b5e55ed9a3c21";
    let raw = u128::from_str_radix(CANARY.rsplit('-').next().unwrap(), 16).unwrap();
    let want: String = (0..96).map(|i| if (raw >> (95 - i)) & 1 == 1 { '1' } else { '0' }).collect();
    let run = |env: &[(&str, &str)]| {
        let (_tmp, svc, hash, token, doc) = served("replay-floor", CANARY, 1000, env);
        let url = format!("/v1/releases/{hash}/calls");
        let t0 = Instant::now();
        let hr_call = json!({"tool": "scan", "arguments": {"document": doc}, "items": [doc], "consumers": ["hrc"]});
        let (s, b) = svc.http("POST", &url, Some((&token, &hr_call)));
        assert_eq!(s, 200, "{b}");
        let public_call = json!({"tool": "scan", "arguments": {"listen": 27.0}, "consumers": ["public"]});
        let (s, b) = svc.http("POST", &url, Some((&token, &public_call)));
        assert_eq!(s, 200, "{b}");
        let text = serde_json::from_str::<Value>(&b).unwrap().to_string();
        let got =
            text.split("\\\"bits\\\": \\\"").nth(1).map(|r| r.chars().take(96).collect::<String>()).unwrap_or_default();
        let right = want.chars().zip(got.chars()).filter(|(a, b)| a == b).count();
        eprintln!("replay-floor {env:?}: want {want}\n got  {got}\n right {right}/96, 2 calls, {:?}", t0.elapsed());
        (text.contains(CANARY), right)
    };
    let (leaked, right) = run(&[("GERMLINE_TEST_TMPFS_SCRATCH", "1")]);
    // Frames on a loaded host can slip; chance is 48 ± 5 of 96.
    assert!(leaked || right >= 80, "off: the public caller reads the canary ({right}/96)");
    let (leaked, right) = run(&[]);
    assert!(!leaked && right < 80, "on: {right}/96 bits reach the public caller");
}
