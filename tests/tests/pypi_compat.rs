//! Issue 16: servers from PyPI run under germline as they are. Each test runs the same
//! release unprotected (`sig-pin`) and under germline and compares what a client sees.

use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_tests::world::{request, result_text, World};
use serde_json::json;

/// Runs `tool` with `args` under sig-pin and germline; returns (unprotected, germline)
/// result texts, or the error when a call failed.
fn both(w: &World, rel: &std::path::Path, tool: &str, args: serde_json::Value) -> (String, String) {
    let policy = || w.policy(&[], &[("agent", &[])], "");
    let mut pin = w.start(RuntimeKind::SigPin, rel, policy()).expect("sig-pin start");
    let mut gl = w.start(RuntimeKind::Germline, rel, policy()).expect("germline start");
    let run = |rt: &mut Runtime| {
        let o = rt.call(&request(tool, args.clone(), &[]));
        o.error.clone().unwrap_or_else(|| result_text(&o))
    };
    (run(&mut pin), run(&mut gl))
}

const SHELL_OUT: &str = r#"
import subprocess
def create_server():
    m = FastMCP("shell")
    @m.tool()
    def statuses() -> str:
        a = subprocess.run(["/bin/false"]).returncode
        b = subprocess.run(["/bin/sh", "-c", "exit 3"]).returncode
        try:
            subprocess.run(["/bin/sh", "-c", "exit 7"], check=True)
            c = "no error"
        except subprocess.CalledProcessError as e:
            c = "CalledProcessError %d" % e.returncode
        return "%d %d %s" % (a, b, c)
    return m
"#;

/// Point 9: a tool that shells out sees its children's exit statuses as unprotected (the
/// germline ignores SIGCHLD; before the fix every copy inherited that and every
/// subprocess "succeeded" with status 0).
#[test]
fn a_failing_subprocess_reports_its_exit_status_as_unprotected() {
    let w = World::new();
    let rel = w.release("shell", "[tools.statuses]\n", SHELL_OUT);
    let (pin, gl) = both(&w, &rel, "statuses", json!({}));
    eprintln!("unprotected: {pin:?}; germline: {gl:?}");
    assert_eq!(pin, "1 3 CalledProcessError 7", "the unprotected server");
    assert_eq!(gl, pin, "germline differs from the unprotected server");
}
