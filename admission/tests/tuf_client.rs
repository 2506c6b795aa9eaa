//! The tuf-conformance command shapes (`init`, `refresh`, `download`) as library
//! calls against a loopback HTTP repository.

mod common;

use std::fs;

use germline_admission::conformance::{tuf_client_download, tuf_client_init, tuf_client_refresh};
use germline_admission::{AdmissionError, InitOptions, PublisherRepo, Timestamp};

#[test]
fn init_refresh_download_and_refuse_a_tampered_target() {
    let tmp = tempfile::tempdir().expect("tmp");
    let now = Timestamp::now();
    let repo = PublisherRepo::init(tmp.path().join("repo"), tmp.path().join("keys"), &InitOptions::default(), now)
        .expect("init");
    let (archive, _) = common::built_release(tmp.path(), "1.0.0");
    repo.add_target(&archive, None, now).expect("add");
    let url = common::serve_dir(repo.repo_dir().to_path_buf(), 256);
    let md = tmp.path().join("md");
    let dl = tmp.path().join("dl");
    fs::create_dir_all(&dl).expect("dl");

    tuf_client_init(&md, &tmp.path().join("repo/metadata/1.root.json")).expect("init");
    let meta_url = format!("{url}/metadata/");
    let targets_url = format!("{url}/targets/");
    tuf_client_refresh(&md, &meta_url, now).expect("refresh");
    let mut stored: Vec<String> =
        fs::read_dir(&md).expect("ls").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    stored.sort();
    assert_eq!(stored, ["root.json", "snapshot.json", "targets.json", "timestamp.json"]);
    // Trusted metadata is stored byte for byte as served.
    assert_eq!(
        fs::read(md.join("timestamp.json")).expect("ts"),
        fs::read(tmp.path().join("repo/metadata/timestamp.json")).expect("served ts")
    );

    let names = vec!["notes-1.0.0.tar.gz".to_owned()];
    tuf_client_download(&md, &meta_url, &names, &targets_url, &dl, now).expect("download");
    assert_eq!(fs::read(dl.join("notes-1.0.0.tar.gz")).expect("dl"), fs::read(&archive).expect("archive"));

    // Tamper with the served target; a fresh download must fail.
    fs::remove_file(dl.join("notes-1.0.0.tar.gz")).expect("rm");
    let served = fs::read_dir(tmp.path().join("repo/targets")).expect("ls").flatten().next().expect("t").path();
    let mut bytes = fs::read(&served).expect("read");
    bytes[10] ^= 0xff;
    fs::write(&served, bytes).expect("write");
    let err = tuf_client_download(&md, &meta_url, &names, &targets_url, &dl, now).expect_err("refused");
    assert!(matches!(err, AdmissionError::TargetHashMismatch { .. }), "{err}");
    assert!(!dl.join("notes-1.0.0.tar.gz").exists());

    let missing = vec!["nope.tar.gz".to_owned()];
    let err = tuf_client_download(&md, &meta_url, &missing, &targets_url, &dl, now).expect_err("absent");
    assert!(matches!(err, AdmissionError::TargetNotFound(_)), "{err}");
}
