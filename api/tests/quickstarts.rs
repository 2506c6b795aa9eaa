//! The README's quick starts, one test per user: the bash block under each
//! `<!-- quickstart: NAME -->` marker is run as written (`set -euo pipefail`, in a fresh
//! temporary directory, the built `germline` first on `PATH`, loopback only, at most
//! 300 s, its process group killed at the end), and what it prints is checked: the facts
//! the README says it shows, not only its exit status. The third-party verifier's test
//! also edits what the block checked (a proof of the `/lookup` answer, an item) and
//! expects the same commands to refuse it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::Value;

/// Longest a quick start may run.
const TIMEOUT: Duration = Duration::from_secs(300);

fn python() -> PathBuf {
    std::env::var_os("GERMLINE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

/// The fenced bash block right after `<!-- quickstart: NAME -->` in README.md.
fn block(name: &str) -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let marker = format!("<!-- quickstart: {name} -->");
    let mut lines = readme.lines().skip_while(|l| l.trim() != marker);
    assert!(lines.next().is_some(), "README.md has no {marker}");
    assert_eq!(lines.next(), Some("```bash"), "a ```bash fence must follow {marker}");
    let body: Vec<&str> = lines.take_while(|l| *l != "```").collect();
    assert!(!body.is_empty(), "empty quick start {name}");
    body.join("\n")
}

/// A finished quick start: what it printed, and its temporary directory (the block's
/// `mktemp -d` directory lies under `tmp/`).
struct Run {
    stdout: String,
    stderr: String,
    dir: tempfile::TempDir,
}

impl Run {
    /// The block's `$WORK`: the directory `mktemp -d` made under the run's `TMPDIR`.
    fn work(&self) -> PathBuf {
        let found: Vec<PathBuf> = std::fs::read_dir(self.dir.path().join("tmp"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("tmp.")))
            .collect();
        assert_eq!(found.len(), 1, "one $WORK directory: {found:?}");
        found[0].clone()
    }

    /// The first line of stdout starting with `prefix`.
    fn line(&self, prefix: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{}\n{}", self.stdout, self.stderr))
    }

    fn has_line(&self, line: &str) -> bool {
        self.stdout.lines().any(|l| l == line)
    }
}

/// A `germline` command with the environment the quick starts run in.
fn germline(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_germline"));
    isolate(&mut cmd, dir);
    cmd
}

/// Clears inherited `GERMLINE_*` settings but the host's sandbox ids (a data directory,
/// listen address or test switch from the caller's environment would change what the
/// blocks run) and sets the interpreter, a home and a `TMPDIR` under `dir`.
fn isolate(cmd: &mut Command, dir: &Path) {
    const HOST_SETTINGS: [&str; 2] = ["GERMLINE_SANDBOX_IDS", "GERMLINE_COPY_IDS"];
    for (k, _) in std::env::vars_os() {
        let name = k.to_string_lossy();
        if name.starts_with("GERMLINE_") && !HOST_SETTINGS.contains(&name.as_ref()) {
            cmd.env_remove(k);
        }
    }
    cmd.env("GERMLINE_PYTHON", python())
        .env("GERMLINE_HOME", dir.join("home"))
        .env("TMPDIR", dir.join("tmp"))
        .env("RUST_BACKTRACE", "0");
}

/// Runs the quick start `name` with bash; panics (with its output) unless it exits 0
/// within [`TIMEOUT`].
fn run(name: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tmp")).unwrap();
    let script = dir.path().join(format!("{name}.sh"));
    std::fs::write(&script, format!("set -euo pipefail\n{}\n", block(name))).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_germline")).parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin).chain(std::env::var_os("PATH").iter().flat_map(std::env::split_paths)),
    )
    .unwrap();
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut cmd = Command::new("bash");
    cmd.arg(&script).current_dir(dir.path()).env("PATH", path);
    isolate(&mut cmd, dir.path());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("bash");
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > TIMEOUT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Whatever the block left running (it stops its own jobs on exit): its process group.
    let group = format!("-{}", child.id());
    for signal in ["-TERM", "-KILL"] {
        let _ = Command::new("kill").args([signal, "--", &group]).stderr(Stdio::null()).status();
        std::thread::sleep(Duration::from_millis(300));
    }
    let _ = child.kill();
    let _ = child.wait();
    let run = Run {
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
        dir,
    };
    println!("quick start {name} ({} s):\n{}", started.elapsed().as_secs(), run.stdout);
    match status {
        Some(s) if s.success() => run,
        Some(s) => panic!("quick start {name} failed ({s}):\n{}\n--- stderr ---\n{}", run.stdout, run.stderr),
        None => {
            panic!("quick start {name} did not finish in {TIMEOUT:?}:\n{}\n--- stderr ---\n{}", run.stdout, run.stderr)
        }
    }
}

/// Publish with `germline repo`, admit from the configured anchor, serve, gate calls: the
/// OCR service gets the invoice but never the payslip, and the trigger's witness
/// suppresses the release (the next call is refused).
#[test]
fn registry_operator() {
    let r = run("registry-operator");
    let admitted = r.line("admitted: ");
    let hash = admitted
        .strip_prefix("admitted: mixer 1.0.0 ")
        .and_then(|rest| rest.strip_suffix(", germline running"))
        .unwrap_or_else(|| panic!("{admitted}"));
    assert!(hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()), "{admitted}");
    assert!(r.has_line(r#"{"label":["finance"],"copies":1,"triggers":0}"#), "{}", r.stdout);
    assert!(r.has_line(r#"{"label":["finance","hr"],"copies":2,"triggers":1}"#), "{}", r.stdout);
    assert!(r.has_line("the OCR service received the invoice: yes, the payslip: no"), "{}", r.stdout);
    let received = std::fs::read_to_string(r.work().join("ocr-received.txt")).unwrap();
    assert!(received.contains("invoice 12") && !received.contains("salary"), "{received}");
    assert!(r.has_line("witness: item_witness"), "{}", r.stdout);
    let refusal = r.line(&format!("release {hash} is suppressed"));
    assert!(refusal.contains("dampening penalty"), "{refusal}");
    assert_eq!(r.stdout.lines().last(), Some("suppressed: true"), "{}", r.stdout);
}

/// An MCP client configuration whose server is `germline wrap`, launched by the Python
/// SDK's stdio client: tools are listed, a call's result carries its label, and the agent
/// (cleared for finance) never receives the hr payslip.
#[test]
fn agent_host() {
    let r = run("agent-host");
    assert!(r.has_line("tools: ['read']"), "{}", r.stdout);
    assert!(r.has_line("invoice.txt -> ok 'invoice 12' label: ['finance']"), "{}", r.stdout);
    assert!(r.has_line("payslip.txt -> ok '' label: []"), "{}", r.stdout);
    assert!(!r.stdout.contains("salary"), "{}", r.stdout);
    let config: Value = serde_json::from_str(&std::fs::read_to_string(r.work().join("mcp.json")).unwrap()).unwrap();
    assert_eq!(config["mcpServers"]["notes"]["command"], "germline", "{config}");
    assert_eq!(config["mcpServers"]["notes"]["args"][0], "wrap", "{config}");
}

/// A peer's `/lookup` answer checked against its checkpoint key, the witness taken out of
/// its entry and its verdict re-derived with the items; then the same commands refuse an
/// answer with one proof hash changed and an item with one byte changed.
#[test]
fn third_party_verifier() {
    let r = run("third-party-verifier");
    let checked: Value = serde_json::from_str(r.line(r#"{"entries""#)).unwrap();
    assert_eq!(checked["ok"], true, "{checked}");
    let kinds: Vec<&str> = checked["entries"].as_array().unwrap().iter().filter_map(|e| e["kind"].as_str()).collect();
    assert!(kinds.contains(&"witness"), "{checked}");
    assert!(
        r.has_line(
            "verdict re-derived: item_witness (recorded item_witness; probe [true,true,true], control [false,false,false])"
        ),
        "{}",
        r.stdout
    );

    let work = r.work();
    let verifier = work.join("verifier");
    let keys: Value = serde_json::from_str(&std::fs::read_to_string(work.join("peer/keys.json")).unwrap()).unwrap();
    let release = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read(verifier.join("mixer.tar.gz")).unwrap()))
    };
    let check_lookup = |answer: &Path| {
        germline(r.dir.path())
            .args(["fleet", "check-lookup", "--release", &release, "--key"])
            .arg(keys["checkpoint_key"].as_str().unwrap())
            .arg("--answer")
            .arg(answer)
            .output()
            .unwrap()
    };
    // The saved answer checks again; with one byte of one proof hash changed it does not.
    let answer_path = verifier.join("answer.json");
    let ok = check_lookup(&answer_path);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stdout));
    let mut answer: Value = serde_json::from_str(&std::fs::read_to_string(&answer_path).unwrap()).unwrap();
    let proof = answer["entries"][0]["proof"][0].as_str().expect("the witness entry has a proof").to_owned();
    let mut hash = B64.decode(proof).unwrap();
    hash[0] ^= 1;
    answer["entries"][0]["proof"][0] = Value::from(B64.encode(hash));
    let edited = verifier.join("answer-edited.json");
    std::fs::write(&edited, answer.to_string()).unwrap();
    let out = check_lookup(&edited);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && text.contains("\"ok\":false") && text.contains("inclusion proof"), "{text}");

    // `germline verify` on an item with one byte changed: refused, naming the item.
    let payslip = verifier.join("items").join(work.join("peer/items/hr/payslip.txt").strip_prefix("/").unwrap());
    std::fs::write(&payslip, "salary 98\n").unwrap();
    let out = germline(r.dir.path())
        .current_dir(&verifier)
        .args(["verify", "w.witness", "--release", "mixer.tar.gz", "--items", "items", "--trusted-key"])
        .arg(keys["witness_key"].as_str().unwrap())
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && text.contains("does not match its recorded hash"), "{text}");
}

/// Three `germline serve` hosts: b serves the release before a holds a witness; after a's
/// call triggers, b and c refuse it, naming the same peer witness, and report peer a
/// healthy with one suppression.
#[test]
fn fleet() {
    let r = run("fleet");
    assert!(r.has_line(r#"b before: {"label":["finance"],"triggers":0,"error":null}"#), "{}", r.stdout);
    assert!(r.has_line(r#"a: {"label":["finance","hr"],"triggers":1}"#), "{}", r.stdout);
    let mut witnesses = Vec::new();
    for h in ["b", "c"] {
        let refusal = r.line(&format!("{h}: release "));
        assert!(refusal.contains("is suppressed: a peer's verified witness"), "{refusal}");
        let witness = refusal.split("(peer witness ").nth(1).map(|w| w.trim_end_matches(')').to_owned());
        witnesses.push(witness.unwrap_or_else(|| panic!("{refusal}")));
        assert!(r.has_line(&format!(r#"{h}: {{"peer":"a","status":"ok","suppressions":1}}"#)), "{}", r.stdout);
    }
    assert_eq!(witnesses[0], witnesses[1], "b and c name the same witness of a");
    assert_eq!(witnesses[0].len(), 64, "{witnesses:?}");
}
