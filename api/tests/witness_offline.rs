//! Offline check: the witness file, its opening, the release archive and the items,
//! copied to another directory and checked there by `germline verify` alone, reproduce
//! the verdict; an edited witness, a missing or edited opening, or a different release is
//! rejected.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn germline(args: &[&str], cwd: &Path, data: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(args)
        .current_dir(cwd)
        .env("RUST_BACKTRACE", "0")
        .env("GERMLINE_HOME", data.join("home"))
        .env("GERMLINE_DATA_DIR", data)
        .output()
        .expect("run germline");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn a_witness_reproduces_offline_and_edits_are_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let here = tmp.path().join("host");
    let data = here.join("data");
    common::mixer_release(&here.join("rel"), "mixer", true);
    let (invoice, payslip, _) = common::mixer_world(&here, 64, "");
    let items = here.join("items");
    let args = format!("{{\"document\": \"{}\", \"extra\": \"{}\"}}", invoice.display(), payslip.display());
    let (ok, out) = germline(
        &[
            "call",
            "--release",
            "rel",
            "--policy",
            "policy.toml",
            "--tool",
            "scan",
            "--args",
            &args,
            "--item",
            &invoice.to_string_lossy(),
            "--item",
            &payslip.to_string_lossy(),
        ],
        &here,
        &data,
    );
    assert!(ok, "{out}");
    let witness =
        walk(&data.join("witnesses")).into_iter().find(|p| p.extension().is_some_and(|e| e == "witness")).expect(&out);
    assert!(germline(&["release", "build", "rel", "--out", "rel.tar.gz"], &here, &data).0);

    // Another directory holds only the witness, the archive and the items.
    let there = tmp.path().join("third-party");
    let their_items = there.join("items");
    for (src, name) in [(&invoice, "finance/invoice.txt"), (&payslip, "hr/payslip.txt")] {
        let dst = their_items.join(items.strip_prefix("/").unwrap()).join(name);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(src, dst).unwrap();
    }
    // The opening (full evidence) is kept beside the witness, readable by its owner only.
    let opening = PathBuf::from(format!("{}.opening", witness.display()));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&opening).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", opening.display());
    std::fs::copy(&witness, there.join("w.witness")).unwrap();
    std::fs::copy(here.join("rel.tar.gz"), there.join("rel.tar.gz")).unwrap();
    let verify = |w: &str, release: &str| {
        germline(&["verify", w, "--release", release, "--items", "items"], &there, &there.join("d"))
    };
    // Without the opening the witness shows only its signature and commitments.
    let (ok, out) = verify("w.witness", "rel.tar.gz");
    assert!(!ok && out.contains("opening"), "{out}");
    std::fs::copy(&opening, there.join("w.witness.opening")).unwrap();
    let (ok, out) = verify("w.witness", "rel.tar.gz");
    assert!(ok && out.contains("\"reproduced\":\"item_witness\""), "{out}");
    // An opening with one replayed input changed does not open the witness's commitment.
    let text = std::fs::read_to_string(there.join("w.witness.opening")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["evidence"]["twin"]["clock"] = serde_json::json!(1.0);
    std::fs::write(there.join("forged.opening"), v.to_string()).unwrap();
    let (ok, out) = germline(
        &["verify", "w.witness", "--opening", "forged.opening", "--release", "rel.tar.gz", "--items", "items"],
        &there,
        &there.join("d"),
    );
    assert!(!ok && out.contains("does not match the commitment"), "{out}");

    let mut edited = std::fs::read(there.join("w.witness")).unwrap();
    let mid = edited.len() / 2;
    edited[mid] ^= 1;
    std::fs::write(there.join("edited.witness"), edited).unwrap();
    let (ok, out) = verify("edited.witness", "rel.tar.gz");
    assert!(!ok && out.contains("witness rejected"), "{out}");

    std::fs::write(there.join("other.tar.gz"), b"not the release").unwrap();
    let (ok, out) = verify("w.witness", "other.tar.gz");
    assert!(!ok && out.contains("release mismatch"), "{out}");

    std::fs::write(their_items.join(items.strip_prefix("/").unwrap()).join("hr/payslip.txt"), "salary 98").unwrap();
    let (ok, out) = verify("w.witness", "rel.tar.gz");
    assert!(!ok && out.contains("does not match its recorded hash"), "{out}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}
