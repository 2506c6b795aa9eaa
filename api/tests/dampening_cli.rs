//! Dampening in the running host: an always-diverging release is suppressed after 9
//! calls; one that declared determinism is suppressed by one verified witness; a
//! suppressed release's calls are refused with the penalty and witnesses named.

mod common;

use std::path::Path;
use std::process::Command;

fn session(dir: &Path, declared: bool, calls: usize) -> Vec<serde_json::Value> {
    common::mixer_release(&dir.join("rel"), "mixer", declared);
    let (invoice, payslip, _) = common::mixer_world(dir, 200, "");
    let line = serde_json::json!({"tool": "scan", "arguments": {"document": invoice, "extra": payslip}, "items": [invoice, payslip]});
    std::fs::write(dir.join("calls.jsonl"), format!("{line}\n").repeat(calls)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(["session", "--release", "rel", "--policy", "policy.toml", "--calls", "calls.jsonl"])
        .current_dir(dir)
        .env("GERMLINE_HOME", dir.join("home"))
        .env("GERMLINE_DATA_DIR", dir.join("data"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn refused(o: &serde_json::Value) -> bool {
    o["error"].as_str().is_some_and(|e| e.contains("is suppressed"))
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
    let err = outs[9]["error"].as_str().unwrap();
    assert!(err.contains("penalty") && err.contains("ledger entry"), "{err}");
}

#[test]
fn one_verified_witness_suppresses_a_release_that_declared_determinism() {
    let tmp = tempfile::tempdir().unwrap();
    let outs = session(tmp.path(), true, 3);
    assert!(!refused(&outs[0]), "{}", outs[0]);
    assert!(refused(&outs[1]) && refused(&outs[2]), "{} {}", outs[1], outs[2]);
}
