//! Issue 16, point 3: `resources/list`, `resources/templates/list` and `prompts/list`
//! through `germline wrap` for a server that builds them from its start-up data (a notes
//! file named on its command line): the front lists them like `tools/list`, from a copy
//! holding that data, labelled by it; the lists equal the bare server's, and a consumer
//! not cleared for the notes gets none. And `initialize` does not wait for the import.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

fn python() -> PathBuf {
    std::env::var_os("GERMLINE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

const NOTES_SERVER: &str = r#"
import sys
from mcp.server.fastmcp import FastMCP

def main():
    path = sys.argv[sys.argv.index("--notes") + 1]
    lines = open(path).read().splitlines()
    m = FastMCP("notes")
    def reader(text):
        return lambda: text
    for i, line in enumerate(lines):
        m.resource(f"note://{i}", name=f"note{i}", description=line)(reader(line))
    m.resource("note://by-word/{word}", name="by_word")(lambda word: word)
    @m.prompt(description="Summarise the notes on " + lines[0])
    def summarise(topic: str) -> str:
        return "Summarise " + topic
    @m.tool()
    def count() -> int:
        return len(lines)
    m.run()

if __name__ == "__main__":
    main()
"#;

/// Kills the process when the test ends, pass or fail.
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends `initialize` and then each of `methods` on stdio; returns each answer.
fn ask(mut cmd: Command, methods: &[&str]) -> Vec<Value> {
    let child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn");
    let mut p = Killed(child);
    let mut input = p.0.stdin.take().expect("stdin");
    let mut output = BufReader::new(p.0.stdout.take().expect("stdout"));
    let mut read = || -> Value {
        let mut s = String::new();
        output.read_line(&mut s).expect("read");
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("reply {s:?}: {e}"))
    };
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    writeln!(input, "{init}").expect("write");
    read();
    writeln!(input, "{}", json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).expect("write");
    methods
        .iter()
        .enumerate()
        .map(|(i, m)| {
            writeln!(input, "{}", json!({"jsonrpc": "2.0", "id": i + 1, "method": m, "params": {}})).expect("write");
            read()
        })
        .collect()
}

#[test]
fn resource_and_prompt_lists_come_from_the_start_up_data_with_its_label() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let notes = data.join("notes.txt");
    std::fs::write(&notes, "budget review\nhiring plan\n").expect("notes");
    let rel = dir.path().join("notes");
    std::fs::create_dir_all(&rel).expect("release");
    std::fs::write(rel.join("notes_server.py"), NOTES_SERVER).expect("server");
    std::fs::write(
        rel.join("germline.toml"),
        format!(
            "[release]\nname = \"notes\"\nversion = \"1\"\nruntime = \"python\"\ncli = \"notes_server:main\"\n\
             args = [\"--notes\", \"{n}\"]\npython_path = [\".\"]\n[tools.count]\nread_paths = [\"{n}\"]\n",
            n = notes.display()
        ),
    )
    .expect("manifest");
    let methods = ["resources/list", "resources/templates/list", "prompts/list"];
    let mut bare = Command::new(python());
    bare.arg(rel.join("notes_server.py")).arg("--notes").arg(&notes);
    let bare = ask(bare, &methods);
    assert!(bare[0].to_string().contains("note://1"), "the bare server lists its notes: {}", bare[0]);
    let wrapped = |clearance: &str| {
        let policy = dir.path().join(format!("policy-{clearance}.toml"));
        std::fs::write(
            &policy,
            format!(
                "tags = [\"projx\"]\n[[items]]\npath = \"{}/**\"\nlabel = [\"projx\"]\n[consumers.agent]\nclearance = [{clearance}]\n",
                data.display()
            ),
        )
        .expect("policy");
        let mut c = Command::new(env!("CARGO_BIN_EXE_germline"));
        c.arg("wrap")
            .arg("--policy")
            .arg(&policy)
            .arg("--")
            .arg(&rel)
            .env("GERMLINE_HOME", &home)
            .env("GERMLINE_DATA_DIR", dir.path().join(format!("ledger-{}", clearance.len())))
            .env("GERMLINE_PYTHON", python());
        ask(c, &methods)
    };
    let cleared = wrapped("\"projx\"");
    for (i, m) in methods.iter().enumerate() {
        let mut got = cleared[i]["result"].clone();
        let label = got["_meta"].as_object_mut().and_then(|o| o.remove("dev.germline/label"));
        if got["_meta"].as_object().is_some_and(|o| o.is_empty()) {
            got.as_object_mut().expect("object").remove("_meta");
        }
        eprintln!("{m}: {got} label {label:?}");
        assert_eq!(got, bare[i]["result"], "{m}: wrap differs from the bare server");
        assert!(label.is_some_and(|l| l.to_string().contains("projx")), "{m}: labelled by the notes");
    }
    let uncleared = wrapped("");
    for (i, m) in methods.iter().enumerate() {
        assert!(uncleared[i]["result"].is_null(), "{m}: withheld from a consumer not cleared: {}", uncleared[i]);
        assert!(!uncleared[i].to_string().contains("budget"), "{m}: nothing of the notes leaks");
    }
}

/// Issue 16, point 6: `germline wrap` answers `initialize` (and `ping`) at once, while the
/// germline still imports the release (here a release that takes four seconds to import);
/// `tools/list` waits for it and then answers as before.
#[test]
fn wrap_answers_initialize_before_the_release_is_imported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rel = dir.path().join("slow");
    std::fs::create_dir_all(&rel).expect("release");
    std::fs::write(
        rel.join("slow_server.py"),
        "import time\ntime.sleep(4)\nfrom mcp.server.fastmcp import FastMCP\n\
         def create_server():\n    m = FastMCP('slow')\n    @m.tool()\n    def hello() -> str:\n        return 'hi'\n    return m\n",
    )
    .expect("server");
    std::fs::write(
        rel.join("germline.toml"),
        "[release]\nname = \"slow\"\nversion = \"1\"\nruntime = \"python\"\nfactory = \"slow_server:create_server\"\n\
         python_path = [\".\"]\n[tools.hello]\n",
    )
    .expect("manifest");
    let home = dir.path().join("home");
    let child = Command::new(env!("CARGO_BIN_EXE_germline"))
        .arg("wrap")
        .arg("--")
        .arg(&rel)
        .env("GERMLINE_HOME", &home)
        .env("GERMLINE_DATA_DIR", dir.path().join("ledger"))
        .env("GERMLINE_PYTHON", python())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("germline wrap");
    let mut p = Killed(child);
    let mut input = p.0.stdin.take().expect("stdin");
    let mut output = BufReader::new(p.0.stdout.take().expect("stdout"));
    let mut read = || -> Value {
        let mut s = String::new();
        output.read_line(&mut s).expect("read");
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("reply {s:?}: {e}"))
    };
    let t0 = std::time::Instant::now();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    writeln!(input, "{init}").expect("write");
    let answer = read();
    let first = t0.elapsed();
    writeln!(input, "{}", json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).expect("write");
    read();
    writeln!(input, "{}", json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})).expect("write");
    let tools = read();
    let listed = t0.elapsed();
    eprintln!("initialize answered after {first:?}, tools/list after {listed:?}");
    assert_eq!(answer["result"]["serverInfo"]["name"], "slow", "{answer}");
    assert!(first < std::time::Duration::from_secs(3), "initialize waited for the import: {first:?}");
    assert!(listed >= std::time::Duration::from_secs(4), "tools/list came after the import: {listed:?}");
    assert_eq!(tools["result"]["tools"][0]["name"], "hello", "{tools}");
}
