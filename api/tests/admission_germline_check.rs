//! Admission runs the executor's germline check: a signed, hash-correct release whose
//! initialisation opens a pipe, maps shared memory or starts a thread is refused with the
//! check named, and a clean one is admitted.

use std::path::Path;
use std::process::Command;

fn germline(args: &[&str], cwd: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(args)
        .current_dir(cwd)
        .env("RUST_BACKTRACE", "0")
        .env("GERMLINE_HOME", cwd.join("home"))
        .output()
        .expect("run germline");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn admission_refuses_releases_that_fail_g1_g3() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert!(germline(&["repo", "init", "repo", "--keys", "keys"], dir).0);
    let cases = [
        ("clean", "pass", None),
        ("pipe", "KEEP.append(os.pipe())", Some("(G2)")),
        ("shm", "KEEP.append(mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED))", Some("(G3)")),
        ("thread", "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()", Some("(G1)")),
    ];
    for (name, init, refused) in cases {
        let rel = dir.join(name);
        std::fs::create_dir_all(&rel).unwrap();
        std::fs::write(
            rel.join("germline.toml"),
            format!("[release]\nname = \"{name}\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n"),
        )
        .unwrap();
        std::fs::write(
            rel.join("server.py"),
            format!("import os, mmap, threading, time\nfrom mcp.server.fastmcp import FastMCP\nKEEP = []\ndef create_server():\n    {init}\n    return FastMCP('x')\n"),
        )
        .unwrap();
        let archive = format!("{name}.tar.gz");
        assert!(germline(&["release", "build", name, "--out", &archive], dir).0);
        assert!(germline(&["repo", "add", "repo", &archive, "--keys", "keys"], dir).0);
        let (ok, out) = germline(
            &["admit", "--repo", "repo", "--root", "repo/metadata/1.root.json", "--target", name, "--store", "store"],
            dir,
        );
        match refused {
            None => assert!(ok, "{name} is admitted: {out}"),
            Some(check) => {
                assert!(!ok && out.contains(check), "{name} refused with {check}: {out}");
            }
        }
    }
    let admitted = std::fs::read_dir(dir.join("store/releases")).unwrap().count();
    assert_eq!(admitted, 1, "only the clean release is in the store");
}
