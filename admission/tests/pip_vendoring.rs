//! `--pip` vendoring: dependencies installed into `vendor/` become part of the
//! signed bytes, and two builds of the same input are byte-identical. Uses a wheel
//! built in the test and `PIP_NO_INDEX`, so no network is touched.

mod common;

use std::fs;
use std::path::Path;

use germline_admission::{build_release_archive, extract_release, ArchiveLimits, BuildOptions};

/// Writes a minimal pure-Python wheel with Python's zipfile.
fn make_wheel(python: &Path, dir: &Path) -> std::path::PathBuf {
    let wheel = dir.join("germtest-1.0-py3-none-any.whl");
    let script = r#"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("germtest/__init__.py", "VALUE = 42\n")
    z.writestr("germtest-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: germtest\nVersion: 1.0\n")
    z.writestr("germtest-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("germtest-1.0.dist-info/RECORD", "")
"#;
    let out = std::process::Command::new(python).args(["-c", script]).arg(&wheel).output().expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wheel
}

#[test]
fn pip_vendored_release_is_reproducible_and_carries_the_dependency() {
    let Some(python) = common::python_with("pip") else {
        return;
    };
    // Only this test runs in this binary: no other test sees the variable.
    std::env::set_var("PIP_NO_INDEX", "1");
    let tmp = tempfile::tempdir().expect("tmp");
    let rel = tmp.path().join("rel");
    common::sample_release(&rel, "1.0.0");
    let wheel = make_wheel(&python, tmp.path());
    let opts = BuildOptions { pip: vec![wheel.display().to_string()], python: Some(python) };
    let a = tmp.path().join("a.tar.gz");
    let b = tmp.path().join("b.tar.gz");
    let first = build_release_archive(&rel, &a, &opts).expect("build with pip");
    let second = build_release_archive(&rel, &b, &opts).expect("build again");
    assert_eq!(first.hash, second.hash);
    assert_eq!(fs::read(&a).expect("a"), fs::read(&b).expect("b"));
    assert!(!rel.join("vendor").exists(), "the source tree is not modified");

    let out = tmp.path().join("out");
    extract_release(&a, &out, &ArchiveLimits::default()).expect("extract");
    assert_eq!(fs::read_to_string(out.join("vendor/germtest/__init__.py")).expect("dep"), "VALUE = 42\n");
    for f in ["RECORD", "INSTALLER", "REQUESTED", "direct_url.json"] {
        assert!(!out.join("vendor/germtest-1.0.dist-info").join(f).exists(), "{f} stripped");
    }
    assert!(out.join("vendor/germtest-1.0.dist-info/METADATA").is_file());
}
