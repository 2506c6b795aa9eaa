//! The unprivileged path: a user without any capability (here `nobody`) runs a germline
//! call; confinement then rests on user namespaces and rlimits alone. Runs where the test
//! runs as root (to switch to `nobody`) and `scripts/setup.sh` made the world-readable
//! venv; fails otherwise, unless `GERMLINE_ALLOW_SKIP` names it outside CI.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const VENV_PYTHON: &str = "/var/cache/germline/venv-unprivileged/bin/python";

fn open_up(p: &Path) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
}

#[test]
fn nobody_runs_a_germline_call() {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc_geteuid() } == 0;
    let present = root && Path::new(VENV_PYTHON).exists();
    if !germline_tests::prerequisite(
        "nobody_runs_a_germline_call",
        &format!("root (to become nobody) and {VENV_PYTHON} (scripts/setup.sh)"),
        present,
    ) {
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
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
