//! A tool list made by a copy holding start-up data is that data's (issue 16; adversarial
//! pass of 2026-12-06, `tests/attacks/outputs/toolnames`): the front withholds the list from
//! a consumer not cleared for its label, and must not let that consumer learn it name by
//! name either. The attack release's list holds tool `bI` iff bit I of an hr document's
//! secret is 1; a consumer cleared for nothing calls `b0`..`b95` and reads, from whether
//! each is an unknown tool, the secret.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

const SECRET: &str = "GLC-hr-5a17c0ffee0b5e55ed9a3c21";

fn python() -> PathBuf {
    std::env::var_os("GERMLINE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

/// The release (its one declared tool reads the hr document at start-up) and the policy.
fn world(dir: &Path) -> (PathBuf, PathBuf) {
    let items = dir.join("items/hr");
    std::fs::create_dir_all(&items).expect("items");
    let doc = items.join("secret.txt");
    std::fs::write(&doc, SECRET).expect("item");
    let rel = dir.join("toolnames");
    std::fs::create_dir_all(&rel).expect("release dir");
    std::fs::write(
        rel.join("germline.toml"),
        format!(
            "[release]\nname = \"toolnames\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n\
             [tools.lookup]\nhosts = []\nread_paths = [\"{}\"]\n",
            doc.display()
        ),
    )
    .expect("manifest");
    let code = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/attacks/outputs/toolnames/server.py"),
    )
    .expect("attack");
    std::fs::write(rel.join("server.py"), code.replace("{DOC}", &doc.to_string_lossy())).expect("server");
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "tags = [\"hr\"]\n[[items]]\npath = \"{}/**\"\nlabel = [\"hr\"]\n\
             [consumers.agent]\nclearance = [\"hr\"]\n[consumers.public]\nclearance = []\n",
            items.display()
        ),
    )
    .expect("policy");
    (rel, policy)
}

/// `germline wrap` for `consumer`: `tools/list`, then a `tools/call` of each of `names`;
/// the list and the answers.
fn session(consumer: &str, listed_label_off: bool, names: &[String]) -> (Value, Vec<Value>) {
    let dir = tempfile::tempdir().expect("tempdir");
    session_in(dir.path(), consumer, &[("GERMLINE_TEST_LISTED_LABEL_OFF", listed_label_off)], names)
}

/// [`session`] with its data directory under `dir` and test switches `switches` set or
/// unset.
fn session_in(dir: &Path, consumer: &str, switches: &[(&str, bool)], names: &[String]) -> (Value, Vec<Value>) {
    let (rel, policy) = world(dir);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_germline"));
    cmd.arg("wrap")
        .args(["--consumer", consumer, "--policy"])
        .arg(&policy)
        .arg("--")
        .arg(&rel)
        .env("GERMLINE_HOME", dir.join("home"))
        .env("GERMLINE_DATA_DIR", dir.join("data"))
        .env("GERMLINE_PYTHON", python())
        .env_remove("GERMLINE_TEST_FRONT_LABELS_OFF")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (switch, off) in switches {
        if *off {
            cmd.env(switch, "1");
        } else {
            cmd.env_remove(switch);
        }
    }
    let mut child = cmd.spawn().expect("germline wrap");
    let mut input = child.stdin.take().expect("stdin");
    let mut output = BufReader::new(child.stdout.take().expect("stdout"));
    let mut ask = |m: Value| -> Value {
        writeln!(input, "{m}").expect("write");
        let mut line = String::new();
        output.read_line(&mut line).expect("read");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    ask(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
    );
    let list = ask(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let answers = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            ask(json!({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call", "params": {"name": n, "arguments": {"name": "x"}}}))
        })
        .collect();
    drop(input);
    let _ = child.kill();
    let _ = child.wait();
    (list, answers)
}

fn bits(answers: &[Value]) -> String {
    answers
        .iter()
        .map(|a| if a["error"]["message"].as_str().is_some_and(|m| m.starts_with("Unknown tool")) { '0' } else { '1' })
        .collect()
}

#[test]
fn a_consumer_not_cleared_for_the_tool_list_learns_no_tool_name_by_calling() {
    let names: Vec<String> = (0..96).map(|i| format!("b{i}")).collect();
    let raw = u128::from_str_radix(SECRET.rsplit('-').next().unwrap(), 16).unwrap();
    let want: String = (0..96).map(|i| if (raw >> (95 - i)) & 1 == 1 { '1' } else { '0' }).collect();

    // Off: the list is withheld, but each call answers from it.
    let (list, answers) = session("public", true, &names);
    assert!(!list.to_string().contains(SECRET), "the list itself is withheld: {list}");
    let got = bits(&answers);
    eprintln!("off: want {want}\n     got  {got}");
    assert_eq!(got, want, "off: every bit of the secret reaches the public consumer");

    // On: every name gets the same refusal, which names nothing.
    let (list, answers) = session("public", false, &names);
    assert!(!list.to_string().contains(SECRET), "the list itself is withheld: {list}");
    let texts: Vec<String> = answers.iter().map(|a| a["error"]["message"].to_string()).collect();
    assert!(texts.iter().all(|t| t == &texts[0]), "on: one answer for every name: {texts:?}");
    assert!(texts[0].contains("clearance does not cover"), "on: {}", texts[0]);
    assert!(answers.iter().all(|a| !a.to_string().contains(SECRET) && a.get("result").is_none()), "{answers:?}");

    // A consumer cleared for the list still lists and calls.
    let (list, answers) = session("agent", false, &["lookup".to_owned()]);
    assert!(list.to_string().contains(SECRET), "the cleared consumer gets the list: {list}");
    assert!(answers[0].get("result").is_some(), "the cleared consumer's call runs: {}", answers[0]);
}

/// What the broker's ledger holds of the list: `germline ledger list` over the data
/// directory a session left.
fn ledger_text(dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(["ledger", "--data-dir"])
        .arg(dir.join("data"))
        .arg("list")
        .output()
        .expect("germline ledger list");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The rest of the same channel (the 2026-12-06 note): the front recorded the labelled
/// list's formation snapshot, and each formed call's tool name, in the ledger in clear. A
/// cleared consumer lists and calls the tool named after the secret; a reader of the
/// broker's data directory then reads the ledger.
/// - Off (`GERMLINE_TEST_LIST_SEAL_OFF=1`): the secret is in the ledger, as a tool name.
/// - On: the snapshot is sealed (a keyed digest under a key the process never writes, no
///   name and no count) and so is the formed tool's name; the calls run as before.
#[test]
fn the_ledger_holds_no_name_of_a_labelled_tool_list() {
    let read = |seal_off: bool| {
        // The attack names one tool after the whole secret.
        let secret_tool = SECRET.to_owned();
        let dir = tempfile::tempdir().expect("tempdir");
        let (list, answers) = session_in(
            dir.path(),
            "agent",
            &[("GERMLINE_TEST_LIST_SEAL_OFF", seal_off)],
            &["lookup".to_owned(), secret_tool],
        );
        assert!(list.to_string().contains(SECRET), "the cleared consumer gets the list: {list}");
        assert!(answers[0].get("result").is_some(), "the cleared consumer's call runs: {}", answers[0]);
        let ledger = ledger_text(dir.path());
        assert!(ledger.contains("\"snapshot\"") || ledger.contains("Snapshot"), "the snapshot is recorded: {ledger}");
        ledger
    };
    let off = read(true);
    assert!(off.contains(SECRET), "off: the ledger holds the secret as a tool name");
    let on = read(false);
    assert!(!on.contains(SECRET) && !on.contains("lookup"), "on: no name of the list in the ledger: {on}");
    assert!(on.contains("sealed:"), "on: the formed calls are recorded, their tool sealed: {on}");
}
