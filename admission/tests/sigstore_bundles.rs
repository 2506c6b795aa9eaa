//! Sigstore/cosign verification offline, on real-shaped material made in the test:
//! a P-256 publisher key, and a Rekor-like log (its own key, a one-leaf Merkle tree,
//! a signed checkpoint and a signed entry timestamp) listed in a test trusted root.

mod common;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use germline_admission::sigstore::{verify_bundle, verify_cosign_signature, SignedArtifact, SignerPolicy};
use germline_admission::AdmissionError;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sigstore_verify::crypto::KeyPair;

const ARTIFACT: &[u8] = b"release archive bytes";

struct Log {
    key: KeyPair,
    der: Vec<u8>,
}

impl Log {
    fn new() -> Self {
        let key = KeyPair::generate_ecdsa_p256().expect("log key");
        let der = key.public_key_der().expect("der").as_bytes().to_vec();
        Self { key, der }
    }

    fn log_id(&self) -> [u8; 32] {
        Sha256::digest(&self.der).into()
    }

    fn trusted_root(&self) -> String {
        json!({
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [{
                "baseUrl": "https://rekor.germline.test",
                "hashAlgorithm": "SHA2_256",
                "publicKey": {
                    "rawBytes": B64.encode(&self.der),
                    "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                    "validFor": {"start": "2020-01-01T00:00:00Z"}
                },
                "logId": {"keyId": B64.encode(self.log_id())}
            }],
            "certificateAuthorities": [],
            "ctlogs": [],
            "timestampAuthorities": []
        })
        .to_string()
    }

    /// A hashedrekord v0.0.1 entry for `signature` by `signer`, as the only leaf
    /// of the log, with checkpoint and SET.
    fn entry(&self, digest: &[u8], signature: &[u8], signer_pem: &str) -> Value {
        let body = json!({
            "apiVersion": "0.0.1",
            "kind": "hashedrekord",
            "spec": {
                "data": {"hash": {"algorithm": "sha256", "value": hex::encode(digest)}},
                "signature": {"content": B64.encode(signature), "publicKey": {"content": B64.encode(signer_pem)}}
            }
        })
        .to_string();
        let mut leaf = Sha256::new();
        leaf.update([0u8]);
        leaf.update(body.as_bytes());
        let root: [u8; 32] = leaf.finalize().into();
        let note = format!("rekor.germline.test - 1\n1\n{}\n", B64.encode(root));
        let sig = self.key.sign(note.as_bytes()).expect("sign checkpoint");
        let mut hinted = self.log_id()[..4].to_vec();
        hinted.extend_from_slice(sig.as_bytes());
        let checkpoint = format!("{note}\n\u{2014} rekor.germline.test {}\n", B64.encode(hinted));
        let integrated = jiff::Timestamp::now().as_second() - 60;
        let set_payload = format!(
            "{{\"body\":\"{}\",\"integratedTime\":{integrated},\"logID\":\"{}\",\"logIndex\":0}}",
            B64.encode(&body),
            hex::encode(self.log_id())
        );
        let set = self.key.sign(set_payload.as_bytes()).expect("sign SET");
        json!({
            "logIndex": "0",
            "logId": {"keyId": B64.encode(self.log_id())},
            "kindVersion": {"kind": "hashedrekord", "version": "0.0.1"},
            "integratedTime": integrated.to_string(),
            "inclusionPromise": {"signedEntryTimestamp": B64.encode(set.as_bytes())},
            "inclusionProof": {
                "logIndex": "0",
                "rootHash": B64.encode(root),
                "treeSize": "1",
                "hashes": [],
                "checkpoint": {"envelope": checkpoint}
            },
            "canonicalizedBody": B64.encode(&body)
        })
    }
}

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

const IDENTITY: &str = "publisher@germline.test";
const ISSUER: &str = "https://issuer.germline.test";

struct Fulcio {
    ca_der: Vec<u8>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    ct: KeyPair,
    ct_der: Vec<u8>,
}

fn der_len(n: usize) -> Vec<u8> {
    if n < 0x80 {
        vec![n as u8]
    } else if n < 0x100 {
        vec![0x81, n as u8]
    } else {
        vec![0x82, (n >> 8) as u8, n as u8]
    }
}

fn der_tlv(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend(der_len(body.len()));
    v.extend_from_slice(body);
    v
}

impl Fulcio {
    fn new() -> Self {
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("ca key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, "germline test fulcio");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2099, 1, 1);
        let ca = params.self_signed(&ca_key).expect("ca");
        let ca_der = ca.der().to_vec();
        let ct = KeyPair::generate_ecdsa_p256().expect("ct key");
        let ct_der = ct.public_key_der().expect("der").as_bytes().to_vec();
        Self { ca_der, issuer: rcgen::Issuer::new(params, ca_key), ct, ct_der }
    }

    fn leaf_params(&self, identity: &str, sct: Option<Vec<u8>>) -> rcgen::CertificateParams {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = vec![rcgen::SanType::Rfc822Name(identity.try_into().expect("ia5"))];
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::CodeSigning];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2099, 1, 1);
        params.serial_number = Some(rcgen::SerialNumber::from(vec![1, 2, 3, 4]));
        params.use_authority_key_identifier_extension = true;
        params.custom_extensions = vec![
            rcgen::CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 57264, 1, 1], ISSUER.as_bytes().to_vec()),
            rcgen::CustomExtension::from_oid_content(
                &[1, 3, 6, 1, 4, 1, 57264, 1, 8],
                der_tlv(0x0c, ISSUER.as_bytes()),
            ),
        ];
        if let Some(sct) = sct {
            params
                .custom_extensions
                .push(rcgen::CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 11129, 2, 4, 2], sct));
        }
        params
    }

    /// A leaf for `identity` with an embedded SCT from the test CT log.
    fn leaf(&self, identity: &str, key: &rcgen::KeyPair, with_sct: bool) -> Vec<u8> {
        use x509_cert::der::{Decode, Encode};
        let pre = self.leaf_params(identity, None).signed_by(key, &self.issuer).expect("precert");
        if !with_sct {
            return pre.der().to_vec();
        }
        let tbs = x509_cert::Certificate::from_der(pre.der()).expect("parse").tbs_certificate.to_der().expect("tbs");
        let ca = x509_cert::Certificate::from_der(&self.ca_der).expect("parse ca");
        let issuer_key_hash: [u8; 32] =
            Sha256::digest(ca.tbs_certificate.subject_public_key_info.to_der().expect("spki")).into();
        let timestamp = (jiff::Timestamp::now().as_second() as u64 - 3600) * 1000;
        let mut signed = vec![0u8, 0u8];
        signed.extend(timestamp.to_be_bytes());
        signed.extend([0u8, 1u8]);
        signed.extend(issuer_key_hash);
        signed.extend(&(tbs.len() as u32).to_be_bytes()[1..]);
        signed.extend(&tbs);
        signed.extend([0u8, 0u8]);
        let sig = self.ct.sign(&signed).expect("sct sig");
        let log_id: [u8; 32] = Sha256::digest(&self.ct_der).into();
        let mut sct = vec![0u8];
        sct.extend(log_id);
        sct.extend(timestamp.to_be_bytes());
        sct.extend([0u8, 0u8, 4u8, 3u8]);
        sct.extend((sig.as_bytes().len() as u16).to_be_bytes());
        sct.extend(sig.as_bytes());
        let mut list = ((sct.len() + 2) as u16).to_be_bytes().to_vec();
        list.extend((sct.len() as u16).to_be_bytes());
        list.extend(&sct);
        let cert = self.leaf_params(identity, Some(der_tlv(0x04, &list))).signed_by(key, &self.issuer).expect("leaf");
        cert.der().to_vec()
    }

    fn trusted_root(&self, log: &Log) -> String {
        let mut root: Value = serde_json::from_str(&log.trusted_root()).expect("json");
        root["certificateAuthorities"] = json!([{
            "subject": {"organization": "germline", "commonName": "germline test fulcio"},
            "uri": "https://fulcio.germline.test",
            "certChain": {"certificates": [{"rawBytes": B64.encode(&self.ca_der)}]},
            "validFor": {"start": "2020-01-01T00:00:00Z"}
        }]);
        root["ctlogs"] = json!([{
            "baseUrl": "https://ct.germline.test",
            "hashAlgorithm": "SHA2_256",
            "publicKey": {
                "rawBytes": B64.encode(&self.ct_der),
                "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                "validFor": {"start": "2020-01-01T00:00:00Z"}
            },
            "logId": {"keyId": B64.encode(Sha256::digest(&self.ct_der))}
        }]);
        root.to_string()
    }

    /// A v0.3 keyless bundle: leaf certificate for `identity`, message signature,
    /// log entry.
    fn bundle(&self, log: &Log, identity: &str, with_sct: bool) -> Value {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("leaf key");
        let leaf = self.leaf(identity, &key, with_sct);
        let signer = KeyPair::from_pkcs8_der(&key.serialize_der()).expect("signer");
        let digest: [u8; 32] = Sha256::digest(ARTIFACT).into();
        let signature = signer.sign(ARTIFACT).expect("sign").as_bytes().to_vec();
        let pem = format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            B64.encode(&leaf)
                .as_bytes()
                .chunks(64)
                .map(|c| std::str::from_utf8(c).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n")
        );
        json!({
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {
                "certificate": {"rawBytes": B64.encode(&leaf)},
                "tlogEntries": [log.entry(&digest, &signature, &pem)]
            },
            "messageSignature": {
                "messageDigest": {"algorithm": "SHA2_256", "digest": B64.encode(digest)},
                "signature": B64.encode(&signature)
            }
        })
    }
}

fn identity_policy(identity: &str, issuer: &str) -> SignerPolicy {
    SignerPolicy::Identity { identity: identity.into(), issuer: issuer.into() }
}

#[test]
fn identity_bundle_verifies_against_test_trusted_root() {
    let log = Log::new();
    let fulcio = Fulcio::new();
    let root = fulcio.trusted_root(&log);
    let bundle = fulcio.bundle(&log, IDENTITY, true).to_string();
    verify_bundle(&bundle, &bytes(ARTIFACT), &identity_policy(IDENTITY, ISSUER), Some(&root)).expect("verifies");
}

#[test]
fn identity_bundle_refusals() {
    let log = Log::new();
    let fulcio = Fulcio::new();
    let root = fulcio.trusted_root(&log);
    let bundle = fulcio.bundle(&log, IDENTITY, true);
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
    let no_sct = fulcio.bundle(&log, IDENTITY, false);
    let err = verify_bundle(&no_sct.to_string(), &bytes(ARTIFACT), &good, Some(&root)).expect_err("no SCT");
    assert!(matches!(err, AdmissionError::Sigstore(_)), "{err}");

    // A certificate from a CA the trusted root does not list.
    let other_root = Fulcio::new().trusted_root(&log);
    let err = verify_bundle(&bundle.to_string(), &bytes(ARTIFACT), &good, Some(&other_root)).expect_err("foreign CA");
    assert!(matches!(err, AdmissionError::Sigstore(_)), "{err}");
}
