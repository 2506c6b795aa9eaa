//! Issue 13, point 6: long operations show progress on a terminal and nothing elsewhere.
//! `germline release build` under a pseudo-terminal (`script`) draws its spinner on stderr;
//! with stderr a pipe, its output is the result line alone.

use std::process::Command;

fn release(dir: &std::path::Path) -> std::path::PathBuf {
    let rel = dir.join("rel");
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::write(
        rel.join("germline.toml"),
        "[release]\nname = \"bulky\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\n",
    )
    .unwrap();
    std::fs::write(rel.join("server.py"), "def create_server():\n    return None\n").unwrap();
    // Incompressible bytes, so archiving takes a moment.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let blob: Vec<u8> = (0..(8usize << 20))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(rel.join("blob.bin"), blob).unwrap();
    rel
}

#[test]
fn release_build_draws_a_spinner_on_a_terminal_only() {
    let tmp = tempfile::tempdir().unwrap();
    let rel = release(tmp.path());
    let exe = env!("CARGO_BIN_EXE_germline");
    let on_tty = Command::new("script")
        .args(["-qec", &format!("{exe} release build {} --out tty.tar.gz", rel.display()), "/dev/null"])
        .current_dir(tmp.path())
        .output()
        .expect("script (util-linux) runs the command on a pseudo-terminal");
    let shown = String::from_utf8_lossy(&on_tty.stdout).replace('\r', "\n");
    assert!(on_tty.status.success(), "{shown}");
    assert!(shown.contains("building the release archive of"), "a spinner on the terminal: {shown:?}");
    let piped = Command::new(exe)
        .args(["release", "build"])
        .arg(&rel)
        .args(["--out", "pipe.tar.gz"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&piped.stdout), String::from_utf8_lossy(&piped.stderr));
    assert!(piped.status.success(), "{err}");
    assert!(out.contains("pipe.tar.gz") && out.lines().count() == 1, "the result line alone: {out:?}");
    assert!(!err.contains("building the release archive"), "no spinner in a pipe: {err:?}");
}
