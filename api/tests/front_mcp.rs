//! Issue 4 part 4: the Python MCP SDK's stdio and Streamable HTTP clients see the same
//! thing from `germline wrap` as from the bare mcp-server-time (tools, results, tool
//! errors, protocol errors, ping), apart from the label germline adds; malformed and
//! oversized messages get JSON-RPC errors and the front keeps serving.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use common::Killed;

fn python() -> PathBuf {
    std::env::var_os("GERMLINE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

fn time_release(dir: &Path) -> PathBuf {
    let real = std::env::var_os("GERMLINE_REAL_SERVERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/germline/real-servers"));
    let vendor = real.join("time/vendor");
    assert!(real.join("time/.complete").is_file(), "{} is missing: run scripts/setup.sh", vendor.display());
    let rel = dir.join("time");
    std::fs::create_dir_all(&rel).expect("release dir");
    let ok = Command::new("cp").arg("-rl").arg(&vendor).arg(&rel).status().is_ok_and(|s| s.success())
        || Command::new("cp").arg("-r").arg(&vendor).arg(&rel).status().is_ok_and(|s| s.success());
    assert!(ok, "copying {}", vendor.display());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/real_servers/time.toml");
    std::fs::copy(manifest, rel.join("germline.toml")).expect("manifest");
    rel
}

fn check_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/front/mcp_client_check.py")
}

/// A data directory (ledger) of its own for each front: one ledger serves one process.
fn fresh_data_dir(home: &Path) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    home.join(format!("data-{}", N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)))
}

/// `germline wrap ARGS` with the test's home, its own data directory and the venv.
fn wrap(args: &[&std::ffi::OsStr], home: &Path, data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_germline"));
    c.arg("wrap").args(args).env("GERMLINE_HOME", home).env("GERMLINE_DATA_DIR", data).env("GERMLINE_PYTHON", python());
    c
}

fn client(args: &[&str], home: &Path) -> Value {
    let out = Command::new(python())
        .arg(check_script())
        .args(args)
        .env("GERMLINE_HOME", home)
        .env("GERMLINE_DATA_DIR", fresh_data_dir(home))
        .env("GERMLINE_PYTHON", python())
        .stderr(Stdio::inherit())
        .output()
        .expect("running the SDK client");
    assert!(out.status.success(), "client {args:?} failed");
    serde_json::from_slice(&out.stdout).expect("client summary")
}

#[test]
fn sdk_clients_see_wrap_as_the_bare_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let rel = time_release(dir.path());
    let vendor = rel.join("vendor");
    let bare_code = format!("import sys; sys.path.insert(0, {:?}); from mcp_server_time import main; main()", vendor);
    let py = python();
    let py = py.to_string_lossy();
    let mut bare = client(&["stdio", &py, "-c", &bare_code, "--local-timezone", "UTC"], &home);
    let germline = env!("CARGO_BIN_EXE_germline");
    let rel_s = rel.to_string_lossy();
    let mut stdio = client(&["stdio", germline, "wrap", "--", &rel_s], &home);

    let listen = ["--listen", "127.0.0.1:0", "--"].map(std::ffi::OsStr::new);
    let (_front, url) =
        common::http_front(&mut wrap(&[&listen[..], &[rel.as_os_str()]].concat(), &home, &fresh_data_dir(&home)));
    let mut http = client(&["http", &url], &home);

    for (name, seen) in [("stdio", &mut stdio), ("http", &mut http)] {
        let labels = seen.as_object_mut().and_then(|o| o.remove("labels")).expect("labels");
        assert!(
            labels.as_array().is_some_and(|a| a.iter().all(|l| l == &Value::Array(vec![]))),
            "{name}: every result labelled (empty label: no items): {labels}"
        );
    }
    bare.as_object_mut().map(|o| o.remove("labels"));
    assert_eq!(bare["current_time_ok"], Value::Bool(true));
    assert_eq!(bare, stdio, "stdio front differs from the bare server");
    assert_eq!(bare, http, "HTTP front differs from the bare server");
}

#[test]
fn malformed_and_oversized_messages_get_json_rpc_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let rel = time_release(dir.path());
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "tags = []\n[consumers.agent]\nclearance = []\n[limits]\nmax_message_bytes = 4096\n")
        .expect("policy");
    let args = ["--policy".as_ref(), policy.as_os_str(), "--".as_ref(), rel.as_os_str()];
    let child = wrap(&args, &home, &fresh_data_dir(&home))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("germline wrap");
    let mut front = Killed(child);
    let mut input = front.0.stdin.take().expect("stdin");
    let mut output = BufReader::new(front.0.stdout.take().expect("stdout"));
    let big =
        format!("{{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"ping\",\"params\":{{\"x\":\"{}\"}}}}", "a".repeat(8000));
    let lines = [
        "not json".to_owned(),
        "[1,2]".to_owned(),
        big,
        r#"{"jsonrpc":"2.0","id":1,"method":"no/such"}"#.to_owned(),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"missing_tool"}}"#.to_owned(),
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"arguments":{}}}"#.to_owned(),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned(),
        r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#.to_owned(),
    ];
    for l in &lines {
        writeln!(input, "{l}").expect("write");
    }
    let mut read = || -> Value {
        let mut s = String::new();
        output.read_line(&mut s).expect("read");
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("reply {s:?}: {e}"))
    };
    let codes: Vec<Value> = (0..7).map(|_| read()).map(|v| v["error"]["code"].clone()).collect();
    assert_eq!(
        codes,
        vec![
            Value::from(-32700),
            Value::from(-32600),
            Value::from(-32600),
            Value::from(-32601),
            Value::from(-32602),
            Value::from(-32602),
            Value::Null
        ]
    );
}

/// The front runs calls the way `germline call` does: triggers become witnesses after the
/// answer is out (off the release's lane: no message waits for them, and the front waits
/// for them when its agent host closes stdin), and a release whose witness suppresses it
/// (it declared determinism) is refused from then on; the undeclared twin's witness weighs
/// too little, so it keeps serving.
#[test]
fn wrap_records_witnesses_and_refuses_a_suppressed_release() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let names =
        "[[items]]\nargument = \"document\"\nnames_path = true\n[[items]]\nargument = \"extra\"\nnames_path = true\n";
    let (invoice, payslip, policy) = common::mixer_world(dir.path(), 200, names);
    for (declared, refused) in [(false, false), (true, true)] {
        let rel = dir.path().join(format!("mixer-{declared}"));
        common::mixer_release(&rel, "mixer", declared);
        let data = fresh_data_dir(&home);
        let call = serde_json::json!({"name": "scan", "arguments": {"document": invoice, "extra": payslip}});
        // One agent host session: initialize, one call; its answer once stdin is closed
        // and the front has exited.
        let session = || -> Value {
            let mut child = Killed(
                wrap(&["--policy".as_ref(), policy.as_os_str(), "--".as_ref(), rel.as_os_str()], &home, &data)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("germline wrap"),
            );
            let mut input = child.0.stdin.take().expect("stdin");
            let mut output = BufReader::new(child.0.stdout.take().expect("stdout"));
            let mut ask = |id: u64, method: &str, params: Value| -> Value {
                let msg = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
                writeln!(input, "{msg}").expect("write");
                let mut line = String::new();
                output.read_line(&mut line).expect("read");
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
            };
            ask(
                1,
                "initialize",
                serde_json::json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
            );
            let answer = ask(2, "tools/call", call.clone());
            drop(input);
            let _ = child.0.wait();
            answer
        };
        let first = session();
        assert!(first.get("result").is_some(), "declared={declared}: {first}");
        {
            let ledger = germline_ledger::Ledger::open(data.join("ledger"), germline_ledger::LedgerConfig::default())
                .expect("the front's ledger");
            let count = |kind: germline_ledger::EntryKind| {
                (0..ledger.size()).filter(|i| ledger.get(*i).is_ok_and(|e| e.kind == kind)).count()
            };
            assert!(
                count(germline_ledger::EntryKind::DampeningEvent) >= 1,
                "declared={declared}: the call was counted"
            );
            assert_eq!(
                count(germline_ledger::EntryKind::Witness),
                1,
                "declared={declared}: the trigger became a witness before the front exited"
            );
        }
        let second = session();
        let message = second["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(message.contains("suppressed"), refused, "declared={declared}: {second}");
        assert_eq!(second.get("result").is_some(), !refused, "declared={declared}: {second}");
    }
}
