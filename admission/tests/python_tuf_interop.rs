//! Interop both ways with python-tuf (PyPI `tuf`): a repository python-tuf wrote is
//! admitted by germline, and one germline wrote verifies with python-tuf's ngclient.
//! Needs `$GERMLINE_PYTHON` (or `python3`) with `tuf` installed: a failure without it,
//! unless `GERMLINE_ALLOW_SKIP` allows a skip outside CI.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use germline_admission::{InitOptions, NoGermlineCheck, PublisherRepo, ReleaseStore, TufAdmission};

/// Writes a consistent-snapshot repository with python-tuf's Metadata API.
const PY_PUBLISH: &str = r#"
import hashlib, os, shutil, sys
from datetime import datetime, timedelta, timezone
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, TargetFile, Targets, Timestamp
from tuf.api.serialization.json import JSONSerializer

out, archive, name, version = sys.argv[1:5]
path = f"{name}-{version}.tar.gz"
os.makedirs(f"{out}/metadata"); os.makedirs(f"{out}/targets")
signers = {r: CryptoSigner.generate_ed25519() for r in ("root", "targets", "snapshot", "timestamp")}
exp = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=7)
root = Root(expires=exp, consistent_snapshot=True)
for role, signer in signers.items():
    root.add_key(signer.public_key, role)
targets = Targets(expires=exp)
info = TargetFile.from_file(path, archive, ["sha256"])
info.unrecognized_fields["custom"] = {"name": name, "version": version}
targets.targets[path] = info
snapshot = Snapshot(expires=exp)
snapshot.meta["targets.json"] = MetaFile(version=1)
timestamp = Timestamp(expires=exp)
timestamp.snapshot_meta = MetaFile(version=1)
ser = JSONSerializer(compact=False)
for role, signed, fname in (("root", root, "1.root.json"), ("targets", targets, "1.targets.json"),
                            ("snapshot", snapshot, "1.snapshot.json"), ("timestamp", timestamp, "timestamp.json")):
    md = Metadata(signed)
    md.sign(signers[role])
    md.to_file(f"{out}/metadata/{fname}", ser)
shutil.copy(f"{out}/metadata/1.root.json", f"{out}/metadata/root.json")
digest = hashlib.sha256(open(archive, "rb").read()).hexdigest()
shutil.copy(archive, f"{out}/targets/{digest}.{path}")
"#;

/// Refreshes and downloads a target with python-tuf's ngclient.
const PY_NGCLIENT: &str = r#"
import json, os, sys
from tuf.ngclient import Updater

root, base, workdir, target = sys.argv[1:5]
os.makedirs(f"{workdir}/meta"); os.makedirs(f"{workdir}/dl")
with open(root, "rb") as f:
    bootstrap = f.read()
u = Updater(f"{workdir}/meta", f"{base}/metadata/", f"{workdir}/dl", f"{base}/targets/", bootstrap=bootstrap)
u.refresh()
info = u.get_targetinfo(target)
if info is None:
    sys.exit(f"{target} not found")
path = u.download_target(info)
print(json.dumps({"path": path, "custom": info.custom, "length": info.length}))
"#;

fn run_py(python: &Path, script: &str, args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("script.py");
    fs::write(&file, script).expect("write script");
    Command::new(python).arg(&file).args(args).output().expect("run python")
}

#[test]
fn python_tuf_repository_is_admitted_by_germline() {
    let Some(python) = common::python_with("tuf.api.metadata") else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let (archive, built) = common::built_release(tmp.path(), "2.0.0");
    let repo = tmp.path().join("pyrepo");
    let out =
        run_py(&python, PY_PUBLISH, &[repo.to_str().expect("utf8"), archive.to_str().expect("utf8"), "notes", "2.0.0"]);
    assert!(out.status.success(), "python-tuf publish failed: {}", String::from_utf8_lossy(&out.stderr));
    let root = fs::read(repo.join("metadata/1.root.json")).expect("root");
    let store = ReleaseStore::open(tmp.path().join("store")).expect("store");

    let from_dir = TufAdmission::new(repo.display().to_string(), root.clone(), "notes");
    let admitted = store.admit_tuf(&from_dir, &NoGermlineCheck).expect("admitted from dir");
    assert_eq!(admitted.hash, built.hash);
    assert_eq!(admitted.info.version, "2.0.0");

    let url = common::serve_dir(repo.clone(), 64);
    let over_http = TufAdmission::new(url, root, "notes-2.0.0.tar.gz");
    store.admit_tuf(&over_http, &NoGermlineCheck).expect("admitted over http");
}

#[test]
fn germline_repository_verifies_with_python_tuf_ngclient() {
    let Some(python) = common::python_with("tuf.ngclient") else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let now = germline_admission::Timestamp::now();
    let repo = PublisherRepo::init(tmp.path().join("repo"), tmp.path().join("keys"), &InitOptions::default(), now)
        .expect("init");
    let (archive, built) = common::built_release(tmp.path(), "1.0.0");
    repo.add_target(&archive, None, now).expect("add");
    // Exercise root and role rotation too: ngclient must walk 1 -> 3.
    repo.rotate("root", 2, 2, now).expect("rotate root");
    repo.rotate("snapshot", 1, 1, now).expect("rotate snapshot");
    let url = common::serve_dir(repo.repo_dir().to_path_buf(), 64);
    let work = tmp.path().join("ngclient");
    let root = tmp.path().join("repo/metadata/1.root.json");
    let out = run_py(
        &python,
        PY_NGCLIENT,
        &[root.to_str().expect("utf8"), &url, work.to_str().expect("utf8"), "notes-1.0.0.tar.gz"],
    );
    assert!(out.status.success(), "ngclient refused: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["custom"], serde_json::json!({"name": "notes", "version": "1.0.0"}));
    let downloaded = fs::read(report["path"].as_str().expect("path")).expect("downloaded");
    assert_eq!(germline_admission::archive::hash_file(&archive).expect("hash").0, built.hash);
    assert_eq!(downloaded, fs::read(&archive).expect("archive"));
}
