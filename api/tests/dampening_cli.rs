//! Dampening in the running host: an always-diverging release is suppressed after 9
//! calls; one that declared determinism is suppressed by one verified witness; a
//! suppressed release's calls are refused with the penalty and witnesses named.

mod common;

use std::path::Path;
use std::process::Command;

fn session(dir: &Path, declared: bool, calls: usize) -> Vec<serde_json::Value> {
    let items = dir.join("items");
    std::fs::create_dir_all(items.join("finance")).unwrap();
    std::fs::create_dir_all(items.join("hr")).unwrap();
    let (invoice, payslip) = (items.join("finance/invoice.txt"), items.join("hr/payslip.txt"));
    std::fs::write(&invoice, "invoice 12").unwrap();
    std::fs::write(&payslip, "salary 99").unwrap();
    let rel = dir.join("rel");
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::write(
        rel.join("germline.toml"),
        format!("[release]\nname = \"mixer\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\ndeterministic = {declared}\n[tools.scan]\nhosts = [\"ocr.example\"]\n"),
    )
    .unwrap();
    std::fs::write(
        rel.join("server.py"),
        "import urllib.request\nfrom mcp.server.fastmcp import FastMCP\ndef create_server():\n    m = FastMCP('mixer')\n    @m.tool()\n    def scan(document: str, extra: str) -> str:\n        body = (open(document).read() + open(extra).read()).encode()\n        try:\n            urllib.request.urlopen(urllib.request.Request('http://ocr.example/scan', data=body), timeout=10).read()\n        except Exception:\n            pass\n        return 'scanned'\n    return m\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("policy.toml"),
        format!(
            "tags = [\"finance\", \"hr\"]\n[[items]]\npath = \"{i}/finance/**\"\nlabel = [\"finance\"]\n[[items]]\npath = \"{i}/hr/**\"\nlabel = [\"hr\"]\n[destinations.\"ocr.example\"]\nclearance = [\"finance\"]\n[consumers.agent]\nclearance = [\"finance\", \"hr\"]\n[hosts]\n\"ocr.example\" = \"127.0.0.1:{p}\"\n",
            i = items.display(),
            p = common::ok_sink(200)
        ),
    )
    .unwrap();
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
