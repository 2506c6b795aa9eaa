//! Sigstore/cosign verification offline, on real-shaped material made in the test:
//! a P-256 publisher key, a Rekor-like log and a Fulcio-like CA with its CT log
//! (`common/sigstore_ca.rs`), listed in a test trusted root.

mod common;
#[path = "common/sigstore_ca.rs"]
mod sigstore_ca;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use germline_admission::sigstore::{verify_bundle, verify_cosign_signature, SignedArtifact, SignerPolicy};
use germline_admission::AdmissionError;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sigstore_ca::{Fulcio, Log, IDENTITY, ISSUER};
use sigstore_verify::crypto::KeyPair;

const ARTIFACT: &[u8] = b"release archive bytes";

struct Publisher {
    key: KeyPair,
    pem: String,
}

impl Publisher {
    fn new() -> Self {
        let key = KeyPair::generate_ecdsa_p256().expect("key");
        let pem = key.public_key_der().expect("der").to_pem();
        Self { key, pem }
    }

    fn sign(&self, data: &[u8]) -> Vec<u8> {
        self.key.sign(data).expect("sign").as_bytes().to_vec()
    }

    /// A v0.3 key-based bundle with one log entry.
    fn bundle(&self, log: &Log) -> Value {
        let digest: [u8; 32] = Sha256::digest(ARTIFACT).into();
        let signature = self.sign(ARTIFACT);
        json!({
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {
                "publicKey": {"hint": "germline-test-key"},
                "tlogEntries": [log.entry(&digest, &signature, &self.pem)]
            },
            "messageSignature": {
                "messageDigest": {"algorithm": "SHA2_256", "digest": B64.encode(digest)},
                "signature": B64.encode(&signature)
            }
        })
    }
}

fn bytes(data: &[u8]) -> SignedArtifact {
    SignedArtifact::Bytes(data.to_vec())
}

#[test]
fn cosign_key_signature_verifies_and_refuses_wrong_key_and_tampering() {
    let publisher = Publisher::new();
    let sig = B64.encode(publisher.sign(ARTIFACT));
    verify_cosign_signature(&bytes(ARTIFACT), &sig, &publisher.pem).expect("verifies");
    let digest: [u8; 32] = Sha256::digest(ARTIFACT).into();
    verify_cosign_signature(&SignedArtifact::Sha256(digest), &sig, &publisher.pem).expect("verifies by digest");

    let other = Publisher::new();
    let err = verify_cosign_signature(&bytes(ARTIFACT), &sig, &other.pem).expect_err("wrong key");
    assert!(matches!(err, AdmissionError::BadSignature(_)), "{err}");
    let err = verify_cosign_signature(&bytes(b"release archive bytez"), &sig, &publisher.pem).expect_err("tampered");
    assert!(matches!(err, AdmissionError::BadSignature(_)), "{err}");
}

#[test]
fn openssl_made_cosign_style_signature_verifies() {
    // cosign sign-blob --key produces base64(DER ECDSA-P256 over SHA-256): the same
    // bytes `openssl dgst -sha256 -sign` writes.
    let tmp = tempfile::tempdir().expect("tmp");
    let run = |args: &[&str]| {
        std::process::Command::new("openssl")
            .args(args)
            .current_dir(tmp.path())
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if !run(&["version"]) {
        common::skip_or_fail("no openssl CLI");
        return;
    }
    std::fs::write(tmp.path().join("blob"), ARTIFACT).expect("blob");
    assert!(run(&["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "k.pem"]));
    assert!(run(&["ec", "-in", "k.pem", "-pubout", "-out", "k.pub"]));
    assert!(run(&["dgst", "-sha256", "-sign", "k.pem", "-out", "sig.der", "blob"]));
    let sig = B64.encode(std::fs::read(tmp.path().join("sig.der")).expect("sig"));
    let pem = std::fs::read_to_string(tmp.path().join("k.pub")).expect("pub");
    verify_cosign_signature(&bytes(ARTIFACT), &sig, &pem).expect("verifies");
}

#[test]
fn key_based_bundle_with_log_entry_verifies() {
    let log = Log::new();
    let publisher = Publisher::new();
    let bundle = publisher.bundle(&log).to_string();
    let policy = SignerPolicy::Key(publisher.pem.clone());
    verify_bundle(&bundle, &bytes(ARTIFACT), &policy, Some(&log.trusted_root())).expect("verifies with log");
    let digest: [u8; 32] = Sha256::digest(ARTIFACT).into();
    verify_bundle(&bundle, &SignedArtifact::Sha256(digest), &policy, Some(&log.trusted_root())).expect("by digest");
    // Without a trusted root the public-good root applies, which does not know
    // the test log: the log entry is still checked, so this is refused.
    let err = verify_bundle(&bundle, &bytes(ARTIFACT), &policy, None).expect_err("unknown log");
    assert!(matches!(err, AdmissionError::TransparencyLog(_)), "{err}");
}

#[test]
fn key_based_bundle_refusals() {
    let log = Log::new();
    let publisher = Publisher::new();
    let bundle = publisher.bundle(&log);
    let root = log.trusted_root();
    let policy = SignerPolicy::Key(publisher.pem.clone());

    let wrong = SignerPolicy::Key(Publisher::new().pem);
    let err = verify_bundle(&bundle.to_string(), &bytes(ARTIFACT), &wrong, Some(&root)).expect_err("wrong key");
    assert!(matches!(err, AdmissionError::BadSignature(_)), "{err}");

    let err = verify_bundle(&bundle.to_string(), &bytes(b"tampered"), &policy, Some(&root)).expect_err("tampered");
    assert!(matches!(err, AdmissionError::BadSignature(_)), "{err}");

    let mut bad_proof = bundle.clone();
    bad_proof["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]["hashes"] = json!([B64.encode([7u8; 32])]);
    let err = verify_bundle(&bad_proof.to_string(), &bytes(ARTIFACT), &policy, Some(&root)).expect_err("proof");
    assert!(matches!(err, AdmissionError::TransparencyLog(_)), "{err}");

    let mut bad_set = bundle.clone();
    bad_set["verificationMaterial"]["tlogEntries"][0]["integratedTime"] = json!("1700000000");
    let err = verify_bundle(&bad_set.to_string(), &bytes(ARTIFACT), &policy, Some(&root)).expect_err("SET");
    assert!(matches!(err, AdmissionError::TransparencyLog(_)), "{err}");

    // A log this host does not trust.
    let err = verify_bundle(&bundle.to_string(), &bytes(ARTIFACT), &policy, Some(&Log::new().trusted_root()))
        .expect_err("unknown log");
    assert!(matches!(err, AdmissionError::TransparencyLog(_)), "{err}");
}

// ---- identity (keyless) bundles: a test Fulcio-like CA and CT log ----

fn identity_policy(identity: &str, issuer: &str) -> SignerPolicy {
    SignerPolicy::Identity { identity: identity.into(), issuer: issuer.into() }
}

#[test]
fn identity_bundle_verifies_against_test_trusted_root() {
    let log = Log::new();
    let fulcio = Fulcio::new();
    let root = fulcio.trusted_root(&log);
    let bundle = fulcio.bundle(&log, IDENTITY, true, ARTIFACT).to_string();
    verify_bundle(&bundle, &bytes(ARTIFACT), &identity_policy(IDENTITY, ISSUER), Some(&root)).expect("verifies");
}

#[test]
fn identity_bundle_refusals() {
    let log = Log::new();
    let fulcio = Fulcio::new();
    let root = fulcio.trusted_root(&log);
    let bundle = fulcio.bundle(&log, IDENTITY, true, ARTIFACT);
    let good = identity_policy(IDENTITY, ISSUER);

    let err = verify_bundle(
        &bundle.to_string(),
        &bytes(ARTIFACT),
        &identity_policy("mallory@germline.test", ISSUER),
        Some(&root),
    )
    .expect_err("wrong identity");
    assert!(matches!(err, AdmissionError::SigstoreIdentity(_)), "{err}");
    let err = verify_bundle(
        &bundle.to_string(),
        &bytes(ARTIFACT),
        &identity_policy(IDENTITY, "https://other.test"),
        Some(&root),
    )
    .expect_err("wrong issuer");
    assert!(matches!(err, AdmissionError::SigstoreIdentity(_)), "{err}");

    let err = verify_bundle(&bundle.to_string(), &bytes(b"tampered"), &good, Some(&root)).expect_err("tampered");
    assert!(matches!(err, AdmissionError::BadSignature(_)), "{err}");

    let mut bad_proof = bundle.clone();
    bad_proof["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]["hashes"] = json!([B64.encode([9u8; 32])]);
    let err = verify_bundle(&bad_proof.to_string(), &bytes(ARTIFACT), &good, Some(&root)).expect_err("proof");
    assert!(matches!(err, AdmissionError::TransparencyLog(_)), "{err}");

    // The same bundle shape without an SCT: the CT check is really applied.
    let no_sct = fulcio.bundle(&log, IDENTITY, false, ARTIFACT);
    let err = verify_bundle(&no_sct.to_string(), &bytes(ARTIFACT), &good, Some(&root)).expect_err("no SCT");
    assert!(matches!(err, AdmissionError::Sigstore(_)), "{err}");

    // A certificate from a CA the trusted root does not list.
    let other_root = Fulcio::new().trusted_root(&log);
    let err = verify_bundle(&bundle.to_string(), &bytes(ARTIFACT), &good, Some(&other_root)).expect_err("foreign CA");
    assert!(matches!(err, AdmissionError::Sigstore(_)), "{err}");
}
