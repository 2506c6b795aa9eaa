//! Issue 13, points 5 and 6: `germline doctor` reports what this host enforces, and a
//! newcomer's `.venv` (whose `python` is a symlink to a base interpreter without the MCP
//! SDK) is used as the venv it is, not as the interpreter it links to.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The repository's venv, made by `scripts/setup.sh` (its `bin/python` is a symlink).
fn repo_venv() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv").canonicalize().expect("scripts/setup.sh made .venv")
}

/// Runs `germline ARGS` in `cwd` with no GERMLINE_PYTHON, so the interpreter is found the
/// way a newcomer's shell finds it.
fn germline(cwd: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(args)
        .current_dir(cwd)
        .env_remove("GERMLINE_PYTHON")
        .env("GERMLINE_HOME", cwd.join("home"))
        .output()
        .expect("run germline");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn doctor_finds_the_venvs_sdk_through_its_symlinked_python() {
    let venv = repo_venv();
    let link = std::fs::read_link(venv.join("bin/python"));
    let base = venv.join("bin/python").canonicalize().unwrap();
    let base_has_sdk = Command::new(&base).args(["-I", "-c", "import mcp"]).status().unwrap().success();
    eprintln!("venv python -> {link:?} (resolved {}: SDK {base_has_sdk})", base.display());
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&venv, dir.path().join(".venv")).unwrap();
    let (ok, out, err) = germline(dir.path(), &["doctor", "--json"]);
    eprintln!("{out}{err}");
    let rows: Vec<Value> = serde_json::from_str(&out).expect("doctor --json prints JSON");
    let row = |name: &str| rows.iter().find(|r| r["check"] == name).cloned().unwrap_or_default();
    let interp = row("interpreter");
    assert_eq!(interp["status"], "ok", "{interp}");
    let detail = interp["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(".venv/bin/python)") && detail.contains("; MCP SDK "),
        "the venv's own path is run: {detail}"
    );
    if !base_has_sdk {
        // The case a resolved symlink broke: the base interpreter has no SDK.
        assert!(!detail.contains(&base.to_string_lossy().into_owned()), "{detail}");
    }
    for check in ["namespaces", "landlock", "seccomp", "cgroups", "copy ids"] {
        let r = row(check);
        assert!(["ok", "weaker", "MISSING"].contains(&r["status"].as_str().unwrap_or_default()), "{check}: {r}");
        assert!(r["status"] == "ok" || !r["fix"].as_str().unwrap_or_default().is_empty(), "{check} names its fix: {r}");
    }
    // This test host (root, Landlock ABI 7, seccomp, user namespaces) has all of them.
    assert_eq!(row("namespaces")["status"], "ok");
    assert_eq!(row("seccomp")["status"], "ok");
    assert!(ok, "doctor passes here: {err}");
}

#[test]
fn doctor_names_an_interpreter_without_the_sdk_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let venv = repo_venv();
    let base = venv.join("bin/python").canonicalize().unwrap();
    if Command::new(&base).args(["-I", "-c", "import mcp"]).status().unwrap().success() {
        eprintln!("the base interpreter has the SDK: nothing to show here");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(["doctor"])
        .current_dir(dir.path())
        .env("GERMLINE_PYTHON", &base)
        .env("GERMLINE_HOME", dir.path().join("home"))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(!out.status.success(), "doctor fails without the SDK");
    assert!(text.contains("cannot import the MCP SDK") && text.contains("fix: bash scripts/setup.sh"), "{text}");
}

#[test]
fn a_session_whose_runtime_does_not_start_prints_a_json_error() {
    let dir = tempfile::tempdir().unwrap();
    let rel = dir.path().join("rel");
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::write(
        rel.join("germline.toml"),
        "[release]\nname = \"broken\"\nversion = \"1\"\nruntime = \"python\"\nfactory = \"missing_module:create\"\n",
    )
    .unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "tags = []\n[consumers.agent]\nclearance = []\n").unwrap();
    let calls = dir.path().join("calls.jsonl");
    std::fs::write(&calls, "{\"tool\": \"x\", \"args\": {}}\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(["session", "--release"])
        .arg(&rel)
        .arg("--policy")
        .arg(&policy)
        .arg("--calls")
        .arg(&calls)
        .current_dir(dir.path())
        .env("GERMLINE_HOME", dir.path().join("home"))
        .env("GERMLINE_DATA_DIR", dir.path().join("data"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success());
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object on stdout");
    let err = v["error"].as_str().unwrap_or_default();
    assert!(err.contains("missing_module"), "the error names the cause: {err}");
}

/// README's first command on a machine where `python3` is not the venv's interpreter: a
/// fresh `.venv` whose `bin/python` links to a base interpreter without the MCP SDK (the
/// SDK reaches the venv through its own site-packages only). `germline demo` runs the
/// venv by its own path and passes; given the interpreter the link resolves to (what an
/// earlier version ran), it fails and says why.
#[test]
fn the_demo_passes_with_a_venv_whose_python_links_to_an_interpreter_without_the_sdk() {
    let base = repo_venv().join("bin/python").canonicalize().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join(".venv");
    let made = Command::new(&base).args(["-m", "venv", "--without-pip"]).arg(&venv).status().unwrap();
    assert!(made.success(), "python -m venv");
    assert!(std::fs::symlink_metadata(venv.join("bin/python")).unwrap().file_type().is_symlink());
    let site = |python: &Path| {
        let out = Command::new(python)
            .args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
            .output()
            .unwrap();
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    };
    let repo_site = site(&repo_venv().join("bin/python"));
    std::fs::write(site(&venv.join("bin/python")).join("sdk.pth"), format!("{}\n", repo_site.display())).unwrap();
    let base_has_sdk = Command::new(&base).args(["-I", "-c", "import mcp"]).status().unwrap().success();
    eprintln!(
        "{} -> {} (SDK in the base interpreter: {base_has_sdk})",
        venv.join("bin/python").display(),
        base.display()
    );

    let (ok, out, err) = germline(dir.path(), &["demo"]);
    eprintln!("{out}{err}");
    assert!(ok, "germline demo passes with the venv's own python: {err}");
    let row = out.lines().find(|l| l.starts_with("germline ")).unwrap_or_default().to_owned();
    assert!(row.contains(" no "), "under germline the payslip does not reach the OCR service: {row}");

    if base_has_sdk {
        eprintln!("the base interpreter has the SDK: the resolved-link failure cannot be shown here");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .arg("demo")
        .current_dir(dir.path())
        .env("GERMLINE_PYTHON", &base)
        .env("GERMLINE_HOME", dir.path().join("home"))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("resolved link: {text}");
    assert!(!out.status.success(), "the base interpreter cannot run the demo");
    assert!(
        text.contains("cannot import the MCP SDK") && text.contains("fix: bash scripts/setup.sh"),
        "the failure names the missing SDK and the fix: {text}"
    );
}
