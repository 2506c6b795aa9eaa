//! Host verification of germline-published TUF repositories: admission of a good
//! release and a distinct refusal for each attack in the acceptance list.

mod common;

use std::fs;
use std::path::Path;

use germline_admission::publish::{sign_metadata, TufKey};
use germline_admission::{
    AdmissionError, GermlineCheck, InitOptions, NoGermlineCheck, PublisherRepo, ReleaseStore, TufAdmission,
};

struct Fixture {
    _tmp: tempfile::TempDir,
    repo: PublisherRepo,
    store_dir: std::path::PathBuf,
    root: Vec<u8>,
    now: jiff::Timestamp,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().expect("tmp");
    let now = jiff::Timestamp::now();
    let repo = PublisherRepo::init(tmp.path().join("repo"), tmp.path().join("keys"), &InitOptions::default(), now)
        .expect("init");
    let (archive, _) = common::built_release(tmp.path(), "1.0.0");
    repo.add_target(&archive, None, now).expect("add");
    let root = fs::read(tmp.path().join("repo/metadata/1.root.json")).expect("root");
    Fixture { store_dir: tmp.path().join("store"), _tmp: tmp, repo, root, now }
}

impl Fixture {
    fn admit_at(&self, now: jiff::Timestamp) -> Result<germline_admission::AdmittedRelease, AdmissionError> {
        let store = ReleaseStore::open(&self.store_dir).expect("store");
        let req = TufAdmission::new(self.repo.repo_dir().display().to_string(), self.root.clone(), "notes").at(now);
        store.admit_tuf(&req, &NoGermlineCheck)
    }

    fn admit(&self) -> Result<germline_admission::AdmittedRelease, AdmissionError> {
        self.admit_at(self.now)
    }

    fn meta(&self, name: &str) -> std::path::PathBuf {
        self.repo.repo_dir().join("metadata").join(name)
    }

    fn target_file(&self) -> std::path::PathBuf {
        let dir = self.repo.repo_dir().join("targets");
        fs::read_dir(&dir).expect("ls").flatten().map(|e| e.path()).next().expect("one target")
    }
}

fn days(n: i64) -> jiff::SignedDuration {
    jiff::SignedDuration::from_hours(24 * n)
}

#[test]
fn published_release_is_admitted_from_dir_and_over_http() {
    let f = fixture();
    let admitted = f.admit().expect("admitted");
    assert_eq!(admitted.info.name, "notes");
    assert!(admitted.dir.join("germline.toml").is_file());
    let store = ReleaseStore::open(&f.store_dir).expect("store");
    assert!(store.is_admitted(&admitted.hash));
    assert_eq!(admitted.dir, store.release_dir(&admitted.hash));

    let url = common::serve_dir(f.repo.repo_dir().to_path_buf(), 64);
    let req = TufAdmission::new(url, f.root.clone(), "notes-1.0.0.tar.gz");
    let again = store.admit_tuf(&req, &NoGermlineCheck).expect("admitted over http");
    assert_eq!(again.hash, admitted.hash);
}

#[test]
fn flipped_byte_is_refused_by_hash() {
    let f = fixture();
    let target = f.target_file();
    let mut bytes = fs::read(&target).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    fs::write(&target, bytes).expect("write");
    let err = f.admit().expect_err("refused");
    assert!(matches!(err, AdmissionError::TargetHashMismatch { .. }), "{err}");
    assert!(fs::read_dir(f.store_dir.join("releases")).expect("ls").next().is_none(), "nothing extracted");
}

#[test]
fn wrong_signed_length_is_refused() {
    let f = fixture();
    f.repo
        .republish_targets(
            |t| {
                let entry = &mut t["targets"]["notes-1.0.0.tar.gz"]["length"];
                *entry = serde_json::json!(entry.as_u64().unwrap_or(0) + 10);
            },
            f.now,
        )
        .expect("republish");
    let err = f.admit().expect_err("refused");
    assert!(matches!(err, AdmissionError::TargetLengthMismatch { .. }), "{err}");
    // Served longer than signed: cut off at the signed length.
    f.repo
        .republish_targets(
            |t| {
                let entry = &mut t["targets"]["notes-1.0.0.tar.gz"]["length"];
                *entry = serde_json::json!(entry.as_u64().unwrap_or(0) - 20);
            },
            f.now,
        )
        .expect("republish");
    let err = f.admit().expect_err("refused");
    assert!(matches!(err, AdmissionError::TargetLengthMismatch { .. }), "{err}");
}

fn resign_timestamp(f: &Fixture, keys: &[&TufKey]) {
    let current: serde_json::Value =
        serde_json::from_slice(&fs::read(f.meta("timestamp.json")).expect("ts")).expect("json");
    let mut signed = current["signed"].clone();
    signed["version"] = serde_json::json!(signed["version"].as_u64().unwrap_or(0) + 1);
    let env = sign_metadata(&signed, keys).expect("sign");
    fs::write(f.meta("timestamp.json"), serde_json::to_vec(&env).expect("json")).expect("write");
}

#[test]
fn unknown_signing_key_is_refused() {
    let f = fixture();
    resign_timestamp(&f, &[&TufKey::generate()]);
    let err = f.admit().expect_err("refused");
    assert!(matches!(err, AdmissionError::UnknownSigningKey { ref role } if role == "timestamp"), "{err}");
}

#[test]
fn below_threshold_is_refused_and_rotation_is_followed() {
    let f = fixture();
    f.admit().expect("admitted at root v1");
    // Rotate timestamp to two keys with threshold two: the host follows root v2.
    f.repo.rotate("timestamp", 2, 2, f.now).expect("rotate");
    f.admit().expect("admitted after rotation");
    let keys = f.repo.role_keys("timestamp").expect("keys");
    resign_timestamp(&f, &[&keys[0]]);
    let err = f.admit().expect_err("refused");
    assert!(
        matches!(err, AdmissionError::BelowThreshold { ref role, found: 1, threshold: 2 } if role == "timestamp"),
        "{err}"
    );
}

#[test]
fn root_rotation_is_followed() {
    let f = fixture();
    f.repo.rotate("root", 2, 2, f.now).expect("rotate root");
    f.repo.rotate("targets", 1, 1, f.now).expect("rotate targets");
    f.admit().expect("host pinned to root v1 follows to v3");
}

#[test]
fn expired_metadata_is_refused_with_injected_clock() {
    let f = fixture();
    let err = f.admit_at(f.now + days(400)).expect_err("refused");
    assert!(matches!(err, AdmissionError::Expired { ref role, .. } if role == "root"), "{err}");
}

#[test]
fn frozen_timestamp_is_refused() {
    let f = fixture();
    let err = f.admit_at(f.now + days(2)).expect_err("refused");
    assert!(matches!(err, AdmissionError::Frozen { .. }), "{err}");
}

#[test]
fn rollback_is_refused_also_across_a_restart() {
    let f = fixture();
    let old = fs::read(f.meta("timestamp.json")).expect("ts");
    f.repo.sign("timestamp", f.now).expect("new timestamp");
    f.admit().expect("admitted at the newer timestamp");
    fs::write(f.meta("timestamp.json"), old).expect("replay older timestamp");
    // Each admit_tuf starts a fresh client: the floor comes from persisted metadata.
    let err = f.admit().expect_err("refused");
    assert!(matches!(err, AdmissionError::Rollback { ref role, .. } if role == "timestamp"), "{err}");
    // "Mechanism off" twin: without the persisted state the replay would pass.
    fs::remove_dir_all(f.store_dir.join("tuf")).expect("forget trusted metadata");
    f.admit().expect("a host without memory accepts the older, still valid, timestamp");
}

#[test]
fn mix_and_match_is_refused() {
    let f = fixture();
    let (archive, _) = common::built_release(f._tmp.path(), "1.1.0");
    f.repo.add_target(&archive, None, f.now).expect("add 1.1.0");
    // targets v3 is pinned by the newest snapshot; serve targets v2 under its name.
    let v2 = fs::read(f.meta("2.targets.json")).expect("v2");
    fs::write(f.meta("3.targets.json"), v2).expect("swap");
    let err = f.admit().expect_err("refused");
    assert!(matches!(err, AdmissionError::MixAndMatch(_)), "{err}");
}

#[test]
fn endless_metadata_is_refused() {
    let f = fixture();
    let mut ts = fs::read(f.meta("timestamp.json")).expect("ts");
    ts.extend(std::iter::repeat_n(b' ', 1 << 20));
    fs::write(f.meta("timestamp.json"), ts).expect("write");
    let err = f.admit().expect_err("refused");
    assert!(matches!(err, AdmissionError::EndlessData(_)), "{err}");
}

#[test]
fn newest_version_is_chosen_by_name() {
    let f = fixture();
    let (archive, built) = common::built_release(f._tmp.path(), "1.10.0");
    f.repo.add_target(&archive, None, f.now).expect("add");
    let (archive, _) = common::built_release(f._tmp.path(), "1.9.0");
    f.repo.add_target(&archive, None, f.now).expect("add");
    let admitted = f.admit().expect("admitted");
    assert_eq!(admitted.info.version, "1.10.0");
    assert_eq!(admitted.hash, built.hash);
}

struct FailingCheck;
impl GermlineCheck for FailingCheck {
    fn check(&self, release_dir: &Path) -> Result<(), String> {
        assert!(release_dir.join("germline.toml").is_file(), "check runs on the extracted release");
        Err("G1: germline has 2 threads".into())
    }
}

#[test]
fn germline_check_refusal_removes_the_release() {
    let f = fixture();
    let store = ReleaseStore::open(&f.store_dir).expect("store");
    let req = TufAdmission::new(f.repo.repo_dir().display().to_string(), f.root.clone(), "notes").at(f.now);
    let err = store.admit_tuf(&req, &FailingCheck).expect_err("refused");
    assert!(matches!(err, AdmissionError::GermlineRefused(ref s) if s.contains("G1")), "{err}");
    let hash = common::built_release(f._tmp.path(), "1.0.0").1.hash;
    assert!(!store.is_admitted(&hash));
    assert!(!store.release_dir(&hash).exists());
}

#[test]
fn manifest_disagreeing_with_signed_custom_fields_is_refused() {
    let f = fixture();
    f.repo
        .republish_targets(
            |t| t["targets"]["notes-1.0.0.tar.gz"]["custom"]["version"] = serde_json::json!("9.9.9"),
            f.now,
        )
        .expect("republish");
    let err = f.admit().expect_err("refused");
    assert!(matches!(err, AdmissionError::ManifestMismatch { .. }), "{err}");
    assert!(fs::read_dir(f.store_dir.join("releases")).expect("ls").next().is_none(), "nothing left behind");
}

#[test]
fn signed_targets_are_listed_and_admitted_from_separate_metadata_and_targets_bases() {
    let f = fixture();
    let store = ReleaseStore::open(&f.store_dir).expect("store");
    let dir = f.repo.repo_dir();
    let (metadata, targets) = (dir.join("metadata").display().to_string(), dir.join("targets").display().to_string());
    let req = TufAdmission::new("", f.root.clone(), "notes").with_bases(metadata, targets).at(f.now);
    let listed = store.tuf_targets(&req).expect("listed");
    assert_eq!(listed.len(), 1, "{listed:?}");
    let t = &listed[0];
    assert_eq!(t.path, "notes-1.0.0.tar.gz");
    assert_eq!(t.release.as_ref().map(|r| r.label()), Some("notes@1.0.0".to_owned()), "{t:?}");
    let admitted = store.admit_tuf(&req, &NoGermlineCheck).expect("admitted");
    assert_eq!(t.sha256.as_deref(), Some(admitted.hash.to_hex().as_str()));
    assert_eq!(t.length, admitted.length);

    // A target whose stored bytes no longer match the signed entry is listed (the
    // metadata is intact) but refused at admission.
    let mut bytes = fs::read(f.target_file()).expect("target");
    bytes[10] ^= 1;
    fs::write(f.target_file(), bytes).expect("tamper");
    let fresh = ReleaseStore::open(f.store_dir.with_extension("fresh")).expect("store");
    assert_eq!(fresh.tuf_targets(&req).expect("listed").len(), 1);
    let err = fresh.admit_tuf(&req, &NoGermlineCheck).expect_err("tampered");
    assert!(matches!(err, AdmissionError::TargetHashMismatch { .. }), "{err}");
}

#[test]
fn following_takes_the_highest_version_of_each_name() {
    use germline_admission::{ReleaseInfo, SignedTarget};
    let t = |path: &str, name_version: Option<(&str, &str)>| SignedTarget {
        path: path.into(),
        sha256: None,
        length: 1,
        release: name_version.map(|(n, v)| ReleaseInfo { name: n.into(), version: v.into() }),
    };
    let all = vec![
        t("a-1.10.0", Some(("a", "1.10.0"))),
        t("a-1.9.0", Some(("a", "1.9.0"))),
        t("b-2", Some(("b", "2"))),
        t("b-10", Some(("b", "10"))),
        t("loose", None),
    ];
    let paths: Vec<String> = SignedTarget::latest_per_name(all).into_iter().map(|t| t.path).collect();
    assert_eq!(paths, ["a-1.10.0", "b-10", "loose"]);
}
