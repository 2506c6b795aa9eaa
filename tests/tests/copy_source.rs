//! Issue 16, point 1 (issue 15, point 6): the copy source for releases that start threads
//! at import. A fork keeps only the forking thread, so G1 refuses such a germline; with
//! `copy_source = "spawn"` the germline never imports the release and every copy imports
//! it itself, after its ids check and before it is given any item.

use std::time::Duration;

use germline_executor::call::GermlineRuntime;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_tests::world::{label_tags, request, result_text, World};
use serde_json::{json, Value};

fn germline(rt: &mut Runtime) -> &mut GermlineRuntime {
    match rt {
        Runtime::Germline(g) => g,
        _ => panic!("not a germline runtime"),
    }
}

/// Starts a thread at import (as OpenBLAS, onnxruntime or duckdb do natively) and tells
/// where it was imported: the pid of the importing process in its own PID namespace (a
/// copy is PID 1 of its namespace, the germline PID 2 of its own).
const THREADED: &str = r#"
import threading
_stop = threading.Event()
threading.Thread(target=_stop.wait, name="importpool", daemon=True).start()
IMPORTED_IN = os.getpid()

def create_server():
    m = FastMCP("threaded")
    @m.tool()
    def look(path: str) -> str:
        return json.dumps({
            "threads_alive": sorted(t.name for t in threading.enumerate() if t.name == "importpool"),
            "imported_in": IMPORTED_IN,
            "served_by": os.getpid(),
            "text": open(path).read(),
        })
    return m
"#;

/// The same without the thread: it can be forked from an imported germline, which shows
/// what `spawn` changes (the mechanism off: the release is imported in the germline).
const PLAIN: &str = r#"
IMPORTED_IN = os.getpid()

def create_server():
    m = FastMCP("plain")
    @m.tool()
    def look(path: str) -> str:
        return json.dumps({"imported_in": IMPORTED_IN, "served_by": os.getpid(), "text": open(path).read()})
    return m
"#;

const TOOLS: &str = "[tools.look]\n";

fn start(w: &World, rel: &std::path::Path, pool: usize, source: &str) -> Result<Runtime, String> {
    let extra = format!("[limits]\npool = {pool}\n{source}");
    let policy = w.policy(&[], &[("agent", &["hr"])], &extra);
    let mut rt = w.start(RuntimeKind::Germline, rel, policy).map_err(|e| e.to_string())?;
    if pool > 0 {
        let g = germline(&mut rt);
        assert_eq!(g.wait_pool_ready(pool, Duration::from_secs(90)).unwrap(), pool, "the pool fills");
    }
    Ok(rt)
}

fn look(rt: &mut Runtime, item: &std::path::Path) -> (Value, Option<Vec<String>>) {
    let o = rt.call(&request("look", json!({"path": item.to_string_lossy()}), &[item]));
    let v = serde_json::from_str(&result_text(&o)).unwrap_or_else(|_| json!({"error": format!("{:?}", o.error)}));
    (v, label_tags(&o))
}

/// Forked (the default), the threaded release is refused by G1, and the refusal offers
/// `spawn` with what it costs (the import time every copy would pay).
#[test]
fn a_release_that_starts_a_thread_at_import_is_refused_with_the_spawn_offer_and_its_cost() {
    let w = World::new();
    let rel = w.release("threaded", TOOLS, THREADED);
    let err = start(&w, &rel, 0, "").err().expect("G1 refuses a germline with a thread");
    eprintln!("{err}");
    assert!(err.contains("G1") && err.contains("2 threads"), "{err}");
    assert!(err.contains("copy_source = \"spawn\""), "the refusal offers spawn: {err}");
    let ms =
        err.split("the import took ").nth(1).and_then(|r| r.split(" ms").next()).and_then(|n| n.parse::<u64>().ok());
    assert!(ms.is_some(), "the refusal prints the import's cost: {err}");
}

/// With `copy_source = "spawn"` (policy or manifest), pooled or not, every copy imports
/// the release itself: the import thread is alive in the copy that serves the call, the
/// import ran in the copy (PID 1 of its namespace), and the result carries the item's
/// label. Forked, the plain release was imported in the germline (PID 2).
#[test]
fn with_spawn_every_copy_imports_the_release_itself_and_keeps_its_threads() {
    let w = World::new();
    let secret = w.item("hr", "payslip.txt", "salary 9100");
    let threaded = w.release("threaded", TOOLS, THREADED);
    let plain = w.release("plain", TOOLS, PLAIN);
    for pool in [0, 2] {
        let mut rt = start(&w, &plain, pool, "").unwrap();
        let (v, label) = look(&mut rt, &secret);
        eprintln!("fork, pool {pool}: {v}");
        assert_eq!(v["imported_in"], 2, "forked: imported once, in the germline ({v})");
        assert_eq!(v["served_by"], 1, "served by a copy ({v})");
        assert_eq!(label, Some(vec!["hr".to_string()]));
        for (rel, name) in [(&plain, "plain"), (&threaded, "threaded")] {
            let mut rt = start(&w, rel, pool, "copy_source = \"spawn\"\n").unwrap();
            for call in 0..2 {
                let (v, label) = look(&mut rt, &secret);
                eprintln!("spawn, {name}, pool {pool}, call {call}: {v}");
                assert_eq!(v["text"], "salary 9100", "{name} pool {pool}: the item reaches the copy ({v})");
                assert_eq!(v["imported_in"], 1, "{name} pool {pool}: imported in the copy itself ({v})");
                assert_eq!(v["served_by"], 1, "{name} pool {pool}: ({v})");
                if name == "threaded" {
                    assert_eq!(v["threads_alive"], json!(["importpool"]), "the import's thread runs in the copy");
                }
                assert_eq!(label, Some(vec!["hr".to_string()]), "{name} pool {pool}: labelled by its item");
            }
        }
    }
    // The release may ask for it too, in its manifest.
    let manifest = threaded.join("germline.toml");
    let text =
        std::fs::read_to_string(&manifest).unwrap().replace("[release]\n", "[release]\ncopy_source = \"spawn\"\n");
    std::fs::write(&manifest, text).unwrap();
    let mut rt = start(&w, &threaded, 0, "").unwrap();
    let (v, _) = look(&mut rt, &secret);
    assert_eq!(v["threads_alive"], json!(["importpool"]), "manifest copy_source = \"spawn\": {v}");
}

/// A spawned copy that cannot import the release answers the call with the cause (the
/// traceback's last lines), not only "the copy closed its channel"; the germline itself
/// started, as it never imports the release.
#[test]
fn a_spawned_copy_that_fails_to_import_names_the_cause() {
    let w = World::new();
    let secret = w.item("hr", "payslip.txt", "salary 9100");
    let rel = w.release("broken", TOOLS, "import module_that_is_not_installed\n");
    for pool in [0, 2] {
        let policy =
            w.policy(&[], &[("agent", &["hr"])], &format!("[limits]\npool = {pool}\ncopy_source = \"spawn\"\n"));
        let mut rt = w.start(RuntimeKind::Germline, &rel, policy).expect("the germline starts without the release");
        let o = rt.call(&request("look", json!({"path": secret.to_string_lossy()}), &[&secret]));
        let err = format!("{:?}", o.error);
        eprintln!("pool {pool}: {err}");
        assert!(err.contains("module_that_is_not_installed"), "pool {pool}: the cause is named: {err}");
    }
}
