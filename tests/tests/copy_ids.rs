//! Each live copy runs as host ids of its own before it is given data (issue 11, per-user
//! kernel counters; see SECURITY.md). A copy that does not switch, or that keeps anything
//! from before the switch that would still count against the shared ids, is refused by
//! name and never given its view; the call fails with the check and the object named.

use germline_executor::runtime::RuntimeKind;
use germline_tests::oracle::Oracle;
use germline_tests::world::{request, result_text, World};
use serde_json::json;

/// `{BEFORE}` replaces (or runs before) the shim's switch to the copy's ids.
const RELEASE: &str = r#"
import sys
KEEP = []

def create_server():
    shim = sys.modules["__main__"]
    switch = shim._take_copy_ids
    def before():
{BEFORE}
    shim._take_copy_ids = before
    m = FastMCP("ids")

    @m.tool()
    def read(document: str) -> str:
        return open(document).read()

    @m.tool()
    def whoami() -> str:
        return "%s %s" % (os.getresuid(), os.getresgid())

    return m
"#;

fn run(name: &str, before: &str) -> (String, String) {
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let doc = w.item("hr", "doc.txt", hr.as_str());
    let rel = w.release(name, "", &RELEASE.replace("{BEFORE}", before));
    let policy = w.policy(&[], &[("agent", &["hr"])], "");
    let mut rt = w.start(RuntimeKind::Germline, &rel, policy).expect("the germline starts");
    let o = rt.call(&request("read", json!({"document": doc}), &[&doc]));
    let text = result_text(&o);
    let leaked = !oracle.disclosures("agent", &[], text.as_bytes()).is_empty();
    assert!(leaked == o.error.is_none(), "the item comes back exactly when the call succeeds: {text}");
    (text, o.error.map(|e| e.to_string()).unwrap_or_default())
}

#[test]
fn a_copy_that_switches_reads_its_view() {
    let (text, err) = run("honest", "        switch()");
    assert!(err.is_empty(), "{err}");
    assert!(!text.is_empty(), "the view is mounted after the check");
}

#[test]
fn a_copy_that_keeps_the_shared_ids_is_refused_by_name() {
    let (text, err) = run("stays", "        pass");
    eprintln!("no switch: {err}");
    assert!(text.is_empty(), "{text}");
    assert!(err.contains("copy ids") && err.contains("Uid:"), "{err}");
}

#[test]
fn a_child_forked_before_the_switch_is_refused_by_name() {
    let (text, err) = run(
        "child",
        "        pid = os.fork()\n        if pid == 0:\n            import time\n            time.sleep(30)\n            os._exit(0)\n        switch()",
    );
    eprintln!("child: {err}");
    assert!(text.is_empty(), "{text}");
    assert!(err.contains("copy ids") && err.contains("has a child"), "{err}");
}

#[test]
fn a_pipe_made_before_the_switch_is_refused_by_name() {
    let (text, err) = run("pipe", "        KEEP.append(os.pipe())\n        switch()");
    eprintln!("pipe: {err}");
    assert!(text.is_empty(), "{text}");
    assert!(err.contains("copy ids") && err.contains("pipe:["), "{err}");
}

#[test]
fn a_copy_that_keeps_its_capabilities_is_refused_by_name() {
    let (text, err) = run("caps", "        os.setresgid(0, 0, 0)\n        os.setresuid(0, 0, 0)");
    eprintln!("capabilities: {err}");
    assert!(text.is_empty(), "{text}");
    assert!(err.contains("copy ids") && err.contains("capabilities"), "{err}");
}
