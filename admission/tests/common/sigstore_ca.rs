//! Sigstore material made in a test, offline, with nothing kept: a Rekor-like
//! transparency log (its own key, a one-leaf Merkle tree, a signed checkpoint and a
//! signed entry timestamp), a Fulcio-like CA with a CT log whose SCTs its leaves embed,
//! and the trusted root that lists them. Shared by admission's bundle tests and the
//! service's API tests (included by path).
#![allow(dead_code)]

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sigstore_verify::crypto::KeyPair;

pub const IDENTITY: &str = "publisher@germline.test";
pub const ISSUER: &str = "https://issuer.germline.test";

pub struct Log {
    key: KeyPair,
    der: Vec<u8>,
}

impl Log {
    pub fn new() -> Self {
        let key = KeyPair::generate_ecdsa_p256().expect("log key");
        let der = key.public_key_der().expect("der").as_bytes().to_vec();
        Self { key, der }
    }

    pub fn log_id(&self) -> [u8; 32] {
        Sha256::digest(&self.der).into()
    }

    /// A trusted root listing only this log, as JSON text.
    pub fn trusted_root(&self) -> String {
        self.trusted_root_value().to_string()
    }

    /// A trusted root listing only this log.
    pub fn trusted_root_value(&self) -> Value {
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
    }

    /// A hashedrekord v0.0.1 entry for `signature` by `signer_pem`, as the only leaf
    /// of the log, with checkpoint and signed entry timestamp.
    pub fn entry(&self, digest: &[u8], signature: &[u8], signer_pem: &str) -> Value {
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

pub struct Fulcio {
    ca_der: Vec<u8>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    ct: KeyPair,
    ct_der: Vec<u8>,
}

fn der_tlv(tag: u8, body: &[u8]) -> Vec<u8> {
    let n = body.len();
    let mut v = vec![tag];
    if n < 0x80 {
        v.push(n as u8);
    } else if n < 0x100 {
        v.extend([0x81, n as u8]);
    } else {
        v.extend([0x82, (n >> 8) as u8, n as u8]);
    }
    v.extend_from_slice(body);
    v
}

impl Fulcio {
    pub fn new() -> Self {
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

    /// A leaf certificate for `identity`, with an SCT from the test CT log embedded
    /// when `with_sct`.
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

    /// The trusted root listing this CA, its CT log and `log`.
    pub fn trusted_root(&self, log: &Log) -> String {
        let mut root = log.trusted_root_value();
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

    /// A v0.3 keyless bundle over `artifact`: a fresh key certified for `identity`
    /// (with an embedded SCT when `with_sct`), the message signature, and its entry in
    /// `log`.
    pub fn bundle(&self, log: &Log, identity: &str, with_sct: bool, artifact: &[u8]) -> Value {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("leaf key");
        let leaf = self.leaf(identity, &key, with_sct);
        let signer = KeyPair::from_pkcs8_der(&key.serialize_der()).expect("signer");
        let digest: [u8; 32] = Sha256::digest(artifact).into();
        let signature = signer.sign(artifact).expect("sign").as_bytes().to_vec();
        let b64 = B64.encode(&leaf);
        let lines: Vec<&str> = b64.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap_or_default()).collect();
        let pem = format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", lines.join("\n"));
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
