//! The unprivileged path: a user without any capability (here `nobody`) runs a germline
//! call; confinement then rests on user namespaces and rlimits alone. Runs where the test
//! runs as root (to switch to `nobody`) and `scripts/setup.sh` made the world-readable
//! venv; fails otherwise, unless `GERMLINE_ALLOW_SKIP` names it outside CI.

use germline_executor::confine::RELEASE_IN_ROOT;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const VENV_PYTHON: &str = "/var/cache/germline/venv-unprivileged/bin/python";

fn open_up(p: &Path) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
}

/// Whether the test can run as `nobody` (root, and the world-readable venv); a test that
/// cannot fails, unless skipping is allowed (`germline_tests::prerequisite`).
fn can_become_nobody(test: &str) -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc_geteuid() } == 0;
    let present = root && Path::new(VENV_PYTHON).exists();
    germline_tests::prerequisite(
        test,
        &format!("root (to become nobody) and {VENV_PYTHON} (scripts/setup.sh)"),
        present,
    )
}

#[test]
fn nobody_runs_a_germline_call() {
    if !can_become_nobody("nobody_runs_a_germline_call") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    open_up(dir);
    let rel = dir.join("rel");
    let data = dir.join("data/finance");
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        rel.join("germline.toml"),
        "[release]\nname = \"who\"\nversion = \"1\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n",
    )
    .unwrap();
    std::fs::write(
        rel.join("server.py"),
        "import os\nfrom mcp.server.fastmcp import FastMCP\ndef create_server():\n    m = FastMCP('who')\n    @m.tool()\n    def read(path: str) -> str:\n        return '%d %s' % (os.getuid(), open(path).read())\n    return m\n",
    )
    .unwrap();
    let item = data.join("invoice.txt");
    std::fs::write(&item, "INVOICE-7").unwrap();
    std::fs::write(
        dir.join("policy.toml"),
        format!("tags = [\"finance\"]\n[[items]]\npath = \"{}/**\"\nlabel = [\"finance\"]\n[consumers.agent]\nclearance = [\"finance\"]\n", data.display()),
    )
    .unwrap();
    Command::new("chmod").args(["-R", "a+rwX"]).arg(dir).status().unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "env"])
        .arg(format!("HOME={}", dir.display()))
        .arg(format!("GERMLINE_PYTHON={VENV_PYTHON}"))
        .arg(env!("CARGO_BIN_EXE_germline"))
        .args(["call", "--release", "rel", "--policy", "policy.toml", "--tool", "read"])
        .arg("--args")
        .arg(format!("{{\"path\": \"{}\"}}", item.display()))
        .arg("--item")
        .arg(&item)
        .current_dir(dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["copies"], 1);
    assert_eq!(v["result"]["content"][0]["text"], "0 INVOICE-7", "root inside the copy's user namespace, item in view");
    assert_eq!(v["label"], serde_json::json!(["finance"]));
    // Without root there is no resident root (the tree needs CAP_SYS_ADMIN), and the policy
    // left the choice to the broker: it says which channels that leaves open.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("germlines get the default root") && stderr.contains("negative dentries"),
        "no warning about the default root: {stderr}"
    );
}

/// Germline's own files (the ledger and its checkpoint key, the trigger log, witnesses and
/// their openings) must stay out of every path a copy reads. A broker without root runs
/// its copies as itself, so file modes do not keep them out: here the data directory is
/// inside the release directory, and a copy of a call reads the ledger's signing key
/// where its root holds the release ([`RELEASE_IN_ROOT`]).
/// - Off (`GERMLINE_TEST_PRIVATE_CHECK_OFF=1`): the key comes back in the call's answer.
/// - On: the call is refused before anything runs, naming both paths.
#[test]
fn a_data_directory_that_copies_can_read_is_refused() {
    if !can_become_nobody("a_data_directory_that_copies_can_read_is_refused") {
        return;
    }
    let run = |off: bool| -> (bool, String) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        open_up(dir);
        let rel = dir.join("rel");
        std::fs::create_dir_all(&rel).unwrap();
        std::fs::write(
            rel.join("germline.toml"),
            "[release]\nname = \"spy\"\nversion = \"1\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n",
        )
        .unwrap();
        std::fs::write(
            rel.join("server.py"),
            "from mcp.server.fastmcp import FastMCP\ndef create_server():\n    m = FastMCP('spy')\n    @m.tool()\n    def read(path: str) -> str:\n        try:\n            return open(path).read()\n        except OSError as e:\n            return 'unread: %s' % e\n    return m\n",
        )
        .unwrap();
        std::fs::write(dir.join("policy.toml"), "tags = []\n[consumers.agent]\nclearance = []\n").unwrap();
        Command::new("chmod").args(["-R", "a+rwX"]).arg(dir).status().unwrap();
        let data = rel.join("germline-data");
        let key = data.join("ledger/checkpoint.key");
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "env"])
            .arg(format!("HOME={}", dir.display()))
            .arg(format!("GERMLINE_PYTHON={VENV_PYTHON}"))
            .arg(format!("GERMLINE_DATA_DIR={}", data.display()))
            .arg(format!("GERMLINE_TEST_PRIVATE_CHECK_OFF={}", u8::from(off)))
            .arg(env!("CARGO_BIN_EXE_germline"))
            .args(["call", "--release", "rel", "--policy", "policy.toml", "--tool", "read"])
            .arg("--args")
            // Where the key is in a copy's root: beneath the release, at its fixed place.
            .arg(format!("{{\"path\": \"{}/germline-data/ledger/checkpoint.key\"}}", RELEASE_IN_ROOT))
            .current_dir(dir)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        let stored = std::fs::read_to_string(&key).unwrap_or_default();
        let answer = v["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
        let leaked = !stored.trim().is_empty() && answer.contains(stored.trim());
        eprintln!(
            "check {}: exit {:?}, key {} bytes, answer {answer:?}, error {}",
            if off { "off" } else { "on" },
            out.status.code(),
            stored.len(),
            v["error"]
        );
        (leaked, v["error"].as_str().unwrap_or_default().to_owned())
    };
    let (leaked, _) = run(true);
    assert!(leaked, "off: the copy reads the ledger's signing key");
    let (leaked, error) = run(false);
    assert!(!leaked, "on: nothing read");
    assert!(
        error.contains("the data directory") && error.contains("which the release's copies can read"),
        "on: refused, naming why: {error}"
    );
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
