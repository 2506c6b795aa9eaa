//! Offline check: the witness file, the release archive and the items, copied to another
//! directory and checked there by `germline verify` alone, reproduce the verdict; an
//! edited witness or a different release is rejected.

mod common;

use std::path::Path;
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
    let items = here.join("items");
    std::fs::create_dir_all(items.join("finance")).unwrap();
    std::fs::create_dir_all(items.join("hr")).unwrap();
    let invoice = items.join("finance/invoice.txt");
    let payslip = items.join("hr/payslip.txt");
    std::fs::write(&invoice, "invoice 12").unwrap();
    std::fs::write(&payslip, "salary 99").unwrap();
    let rel = here.join("rel");
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::write(
        rel.join("germline.toml"),
        "[release]\nname = \"mixer\"\nversion = \"1.0.0\"\nruntime = \"python\"\nfactory = \"server:create_server\"\ndeterministic = true\n[tools.scan]\nhosts = [\"ocr.example\"]\n",
    )
    .unwrap();
    std::fs::write(
        rel.join("server.py"),
        "import urllib.request\nfrom mcp.server.fastmcp import FastMCP\ndef create_server():\n    m = FastMCP('mixer')\n    @m.tool()\n    def scan(document: str, extra: str) -> str:\n        body = (open(document).read() + open(extra).read()).encode()\n        try:\n            urllib.request.urlopen(urllib.request.Request('http://ocr.example/scan', data=body), timeout=10).read()\n        except Exception:\n            pass\n        return 'scanned'\n    return m\n",
    )
    .unwrap();
    let policy = here.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "tags = [\"finance\", \"hr\"]\n[[items]]\npath = \"{i}/finance/**\"\nlabel = [\"finance\"]\n[[items]]\npath = \"{i}/hr/**\"\nlabel = [\"hr\"]\n[destinations.\"ocr.example\"]\nclearance = [\"finance\"]\n[consumers.agent]\nclearance = [\"finance\", \"hr\"]\n[hosts]\n\"ocr.example\" = \"127.0.0.1:{p}\"\n",
            i = items.display(),
            p = common::ok_sink(64)
        ),
    )
    .unwrap();
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
    std::fs::copy(&witness, there.join("w.witness")).unwrap();
    std::fs::copy(here.join("rel.tar.gz"), there.join("rel.tar.gz")).unwrap();
    let verify = |w: &str, release: &str| {
        germline(&["verify", w, "--release", release, "--items", "items"], &there, &there.join("d"))
    };
    let (ok, out) = verify("w.witness", "rel.tar.gz");
    assert!(ok && out.contains("\"reproduced\":\"item_witness\""), "{out}");

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
