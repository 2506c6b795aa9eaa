//! Admission of a release proven by a cosign key signature instead of TUF.

mod common;

use base64::Engine;
use germline_admission::sigstore::{SignerPolicy, TrustedRootChoice};
use germline_admission::{AdmissionError, ArchiveLimits, NoGermlineCheck, ReleaseStore};
use sigstore_verify::crypto::KeyPair;

#[test]
fn cosign_signed_release_is_admitted_and_a_tampered_one_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (archive, built) = common::built_release(tmp.path(), "1.0.0");
    let key = KeyPair::generate_ecdsa_p256().expect("key");
    let sig = key.sign(&std::fs::read(&archive).expect("archive")).expect("sign");
    let sig_path = tmp.path().join("release.sig");
    std::fs::write(&sig_path, base64::engine::general_purpose::STANDARD.encode(sig.as_bytes())).expect("sig");
    let policy = SignerPolicy::Key(key.public_key_der().expect("der").to_pem());
    let store = ReleaseStore::open(tmp.path().join("store")).expect("store");
    let limits = ArchiveLimits::default();

    let admitted = store
        .admit_sigstore(&archive, &sig_path, &policy, &TrustedRootChoice::Default, &limits, &NoGermlineCheck)
        .expect("admitted");
    assert_eq!(admitted.hash, built.hash);
    assert!(store.is_admitted(&built.hash));

    let mut bytes = std::fs::read(&archive).expect("read");
    bytes[20] ^= 1;
    let tampered = tmp.path().join("tampered.tar.gz");
    std::fs::write(&tampered, bytes).expect("write");
    let err = store
        .admit_sigstore(&tampered, &sig_path, &policy, &TrustedRootChoice::Default, &limits, &NoGermlineCheck)
        .expect_err("refused");
    assert!(matches!(err, AdmissionError::BadSignature(_)), "{err}");
}
