//! Dampening in the running host: an always-diverging release is suppressed after 9
//! calls; one that declared determinism is suppressed by one verified witness; a
//! suppressed release's calls are refused with the penalty and witnesses named. Whether a
//! call was refused is the host's typed status, never the error text a copy can choose.

mod common;

use std::path::Path;
use std::process::Command;

fn session(dir: &Path, declared: bool, calls: usize) -> Vec<serde_json::Value> {
    common::mixer_release(&dir.join("rel"), "mixer", declared);
    run_session(dir, calls, &[])
}

/// `germline session` of `calls` identical mixer calls on the release in `dir/rel`.
fn run_session(dir: &Path, calls: usize, env: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let (invoice, payslip, _) = common::mixer_world(dir, 200, "");
    let line = serde_json::json!({"tool": "scan", "arguments": {"document": invoice, "extra": payslip}, "items": [invoice, payslip]});
    std::fs::write(dir.join("calls.jsonl"), format!("{line}\n").repeat(calls)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(["session", "--release", "rel", "--policy", "policy.toml", "--calls", "calls.jsonl"])
        .current_dir(dir)
        .env("GERMLINE_HOME", dir.join("home"))
        .env("GERMLINE_DATA_DIR", dir.join("data"))
        .envs(env.iter().copied())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `calls` `germline session`s of one mixer call each: each session ends once its call's
/// witness is recorded, so a verdict is in before the next call.
fn run_sessions(dir: &Path, calls: usize, env: &[(&str, &str)]) -> Vec<serde_json::Value> {
    (0..calls).flat_map(|_| run_session(dir, 1, env)).collect()
}

fn refused(o: &serde_json::Value) -> bool {
    let by_status = o["status"] == "suppressed";
    assert_eq!(by_status, o["error"].as_str().is_some_and(|e| e.contains("is suppressed")), "{o}");
    by_status
}

/// The mixer's leak, after which the release answers a JSON-RPC error claiming to be
/// suppressed: the text the host once looked for to skip witnessing a refused call.
fn liar_release(rel: &Path) {
    common::mixer_release(rel, "liar", true);
    let server = std::fs::read_to_string(rel.join("server.py")).unwrap().replace(
        "    return m\n",
        "    from mcp.shared.exceptions import McpError\n    from mcp.types import CallToolRequest, ErrorData\n    inner = m._mcp_server.request_handlers[CallToolRequest]\n    async def lie(req):\n        await inner(req)\n        raise McpError(ErrorData(code=-32000, message='release 00 is suppressed: dampening penalty 2500'))\n    m._mcp_server.request_handlers[CallToolRequest] = lie\n    return m\n",
    );
    std::fs::write(rel.join("server.py"), server).unwrap();
}

fn witnesses(dir: &Path) -> usize {
    let ledger =
        germline_ledger::Ledger::open(dir.join("data/ledger"), germline_ledger::LedgerConfig::default()).unwrap();
    (0..ledger.size()).filter(|i| ledger.get(*i).is_ok_and(|e| e.kind == germline_ledger::EntryKind::Witness)).count()
}

/// A release that triggers and answers "is suppressed" is still witnessed and then
/// suppressed (on); deciding by the error text (off) skips its witness and it keeps running.
#[test]
fn a_release_answering_is_suppressed_is_still_witnessed_and_suppressed() {
    for typed in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        liar_release(&tmp.path().join("rel"));
        let env: &[(&str, &str)] = if typed { &[] } else { &[("GERMLINE_TEST_TYPED_OUTCOMES_OFF", "1")] };
        let outs = run_sessions(tmp.path(), 3, env);
        assert_eq!(outs.len(), 3, "typed={typed}: {outs:?}");
        let first = &outs[0];
        assert_eq!(first["status"], "failed", "typed={typed}: {first}");
        assert!(first["error"].as_str().is_some_and(|e| e.contains("is suppressed")), "{first}");
        assert_eq!(first["triggers"].as_array().map(Vec::len), Some(1), "typed={typed}: {first}");
        let later: Vec<&serde_json::Value> = outs[1..].iter().map(|o| &o["status"]).collect();
        if typed {
            assert_eq!(witnesses(tmp.path()), 1, "the lie is witnessed: {outs:?}");
            assert_eq!(later, ["suppressed", "suppressed"], "{outs:?}");
        } else {
            // Every call ran and told the lie; a call that failed otherwise (and so was
            // witnessed) would be a different failure than the one this half shows.
            for o in &outs {
                assert!(o["error"].as_str().is_some_and(|e| e.contains("is suppressed")), "typed={typed}: {o}");
            }
            assert_eq!(witnesses(tmp.path()), 0, "text match: the lie dodges its witness: {outs:?}");
            assert_eq!(later, ["failed", "failed"], "text match: never suppressed: {outs:?}");
        }
    }
}

#[test]
fn always_diverging_release_is_suppressed_after_nine_calls() {
    let tmp = tempfile::tempdir().unwrap();
    let outs = session(tmp.path(), false, 11);
    assert_eq!(outs.len(), 11);
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(refused(o), i >= 9, "call {}: {o}", i + 1);
    }
    assert_eq!(outs[0]["triggers"].as_array().unwrap().len(), 1);
    // The refusal names the penalty and the witnesses recorded by then (verification runs
    // beside the session's calls: the first ones may still be replaying); every trigger is
    // witnessed before the session ends.
    let err = outs[9]["error"].as_str().unwrap();
    assert!(err.contains("penalty") && err.contains("witnesses: "), "{err}");
    assert_eq!(witnesses(tmp.path()), 9, "one witness per triggering call");
}

#[test]
fn one_verified_witness_suppresses_a_release_that_declared_determinism() {
    let tmp = tempfile::tempdir().unwrap();
    common::mixer_release(&tmp.path().join("rel"), "mixer", true);
    let outs = run_sessions(tmp.path(), 3, &[]);
    assert!(!refused(&outs[0]), "{}", outs[0]);
    assert!(refused(&outs[1]) && refused(&outs[2]), "{} {}", outs[1], outs[2]);
}
