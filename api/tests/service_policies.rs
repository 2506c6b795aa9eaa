//! Issue 13, point 3: per-release policies (and a default) on `germline serve`, reloaded
//! without a restart. A release runs under its own policy (`[policies] NAME = FILE`) or
//! the default; editing a policy file changes nothing until a reload (`POST
//! /v1/policies/reload` or SIGHUP); a reload restarts only the releases whose policy
//! changed; an invalid file is refused (422) and the policies in force stay.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::serve::*;
use serde_json::{json, Value};

const READER: &str = "from mcp.server.fastmcp import FastMCP\ndef create_server():\n    m = FastMCP('reader')\n    @m.tool()\n    def read(path: str) -> str:\n        return open(path).read()\n    return m\n";

fn release(dir: &Path, name: &str) -> PathBuf {
    let rel = dir.join(name);
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::write(
        rel.join("germline.toml"),
        format!("[release]\nname = \"{name}\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n[tools.read]\n"),
    )
    .unwrap();
    std::fs::write(rel.join("server.py"), READER).unwrap();
    rel
}

/// A policy labelling everything under `items` with `tag` (the agent cleared for all).
fn policy(items: &Path, tag: &str) -> String {
    format!(
        "tags = [\"finance\", \"hr\", \"projx\"]\n[[items]]\npath = \"{}/**\"\nlabel = [\"{tag}\"]\n[[items]]\nargument = \"path\"\nnames_path = true\n[consumers.agent]\nclearance = [\"finance\", \"hr\", \"projx\"]\n",
        items.display()
    )
}

#[test]
fn each_release_runs_under_its_policy_and_a_reload_restarts_only_what_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let items = dir.join("items");
    std::fs::create_dir_all(&items).unwrap();
    let note = items.join("note.txt");
    std::fs::write(&note, "quarterly figures").unwrap();
    let own = dir.join("reader-policy.toml");
    let default = dir.join("default-policy.toml");
    std::fs::write(&own, policy(&items, "finance")).unwrap();
    std::fs::write(&default, policy(&items, "projx")).unwrap();
    let (reader, other) = (release(dir, "reader"), release(dir, "other"));
    let (admit_reader, admit_other) = (publish(dir, &reader), publish(dir, &other));
    let svc = Service::start(
        dir,
        &format!("policy = \"{}\"\n[policies]\nreader = \"{}\"\n", default.display(), own.display()),
    );
    let token = svc.token();
    let admit = |body: &Value| {
        let r = svc.post("/v1/releases/tuf", Some(&token), body);
        assert_eq!(r.status, 201, "{r:?}\n{}", svc.log());
        r.json()["hash"].as_str().unwrap().to_owned()
    };
    let (h_reader, h_other) = (admit(&admit_reader), admit(&admit_other));
    let label = |hash: &str| -> Value {
        let call = json!({"tool": "read", "arguments": {"path": note}});
        let r = svc.post(&format!("/v1/releases/{hash}/calls"), Some(&token), &call);
        assert_eq!(r.status, 200, "{r:?}\n{}", svc.log());
        r.json()["label"].clone()
    };
    assert_eq!(label(&h_reader), json!(["finance"]), "its own policy");
    assert_eq!(label(&h_other), json!(["projx"]), "the default policy");
    let view = svc.get("/v1/policies").json();
    assert_eq!(view["releases"]["reader"]["path"], own.display().to_string(), "{view}");
    assert_eq!(view["default"]["path"], default.display().to_string(), "{view}");

    // Editing the file changes nothing by itself ("mechanism off" for the reload).
    std::fs::write(&own, policy(&items, "hr")).unwrap();
    assert_eq!(label(&h_reader), json!(["finance"]), "not reloaded yet");
    let reload = svc.post("/v1/policies/reload", Some(&token), &json!({}));
    assert_eq!(reload.status, 200, "{reload:?}");
    eprintln!("reload: {}", reload.body);
    assert_eq!(reload.json()["restarted"], json!([h_reader]), "only the release whose policy changed");
    assert_eq!(label(&h_reader), json!(["hr"]), "its new policy");
    assert_eq!(label(&h_other), json!(["projx"]), "the default, unchanged");
    let hr_digest = svc.get("/v1/policies").json()["releases"]["reader"]["sha256"].clone();

    // An invalid file: refused, and the policies in force stay.
    std::fs::write(&own, "tags = [\"hr\"\n").unwrap();
    let bad = svc.post("/v1/policies/reload", Some(&token), &json!({}));
    eprintln!("bad reload: {} {}", bad.status, bad.body);
    assert!(bad.client_error(422) && bad.error().contains("release reader"), "{bad:?}");
    assert_eq!(label(&h_reader), json!(["hr"]), "nothing changed");
    let unauthenticated = svc.post("/v1/policies/reload", None, &json!({}));
    assert_eq!(unauthenticated.status, 401);

    // SIGHUP reloads too.
    std::fs::write(&own, policy(&items, "finance")).unwrap();
    let hup = std::process::Command::new("kill").args(["-HUP", &svc.child.id().to_string()]).status().unwrap();
    assert!(hup.success());
    let end = Instant::now() + Duration::from_secs(30);
    while svc.get("/v1/policies").json()["releases"]["reader"]["sha256"] == hr_digest && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut seen = Value::Null;
    while Instant::now() < end {
        seen = label(&h_reader);
        if seen == json!(["finance"]) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(seen, json!(["finance"]), "after SIGHUP\n{}", svc.log());
}
