//! The witness record: evidence plus verdict, signed by the recording host.
//!
//! Encoding (version 1), chosen so that every byte counts:
//!
//! ```text
//! germline-witness v1\n
//! <canonical JSON of WitnessBody>\n
//! — <key name> <base64(32-byte Ed25519 public key || 64-byte signature)>\n
//! ```
//!
//! Canonical JSON is serde_json's compact output of the body with object keys sorted
//! (every map in the body is ordered). A reader parses the body, re-encodes it and
//! requires the same bytes, then checks the signature over exactly those bytes: an edit
//! anywhere — body, whitespace, signature, key — is rejected. Item contents are never in
//! the record, only their names, labels and hashes.

use std::path::Path;

use base64::Engine;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use germline_executor::evidence::TriggerEvidence;
use serde::{Deserialize, Serialize};

use crate::{ReplayReport, VerifierError};

/// Version of the witness encoding.
pub const WITNESS_VERSION: u32 = 1;

const MAGIC: &str = "germline-witness v1";

/// What the record says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WitnessBody {
    /// Encoding version.
    pub version: u32,
    /// The trigger's evidence.
    pub evidence: TriggerEvidence,
    /// Whether the release declared determinism for the tool.
    pub declared_deterministic: bool,
    /// Probe/control outcome at the recording host.
    pub report: ReplayReport,
}

/// What the signature covers: everything in the record but the signature itself.
fn signed_bytes(json: &[u8], key_name: &str) -> Vec<u8> {
    let mut out = format!("{MAGIC}\n").into_bytes();
    out.extend_from_slice(json);
    out.push(b'\n');
    out.extend_from_slice(key_name.as_bytes());
    out
}

/// A signed witness.
#[derive(Clone, Debug, PartialEq)]
pub struct Witness {
    /// The record.
    pub body: WitnessBody,
    /// Name of the signing key (the recording host).
    pub key_name: String,
    /// The signing host's public key.
    pub public_key: [u8; 32],
}

/// A host's witness-signing key.
pub struct WitnessKey {
    name: String,
    key: SigningKey,
}

impl WitnessKey {
    /// Loads `DIR/witness.key` (32 raw bytes, mode 0600), creating it on first use.
    pub fn load_or_create(dir: &Path, name: &str) -> Result<WitnessKey, VerifierError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join("witness.key");
        let io = |e: std::io::Error| VerifierError::Io(format!("{}: {e}", path.display()));
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(io)?;
                let mut seed = [0u8; 32];
                getrandom::fill(&mut seed).map_err(|e| VerifierError::Io(format!("getrandom: {e}")))?;
                let mut f =
                    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).map_err(io)?;
                std::io::Write::write_all(&mut f, &seed).map_err(io)?;
                f.sync_all().map_err(io)?;
                seed.to_vec()
            }
            Err(e) => return Err(io(e)),
        };
        let seed: [u8; 32] =
            bytes.try_into().map_err(|_| VerifierError::Io(format!("{} is not a 32-byte key", path.display())))?;
        Ok(WitnessKey { name: clean_name(name), key: SigningKey::from_bytes(&seed) })
    }

    /// A key from a seed (tests).
    pub fn from_seed(name: &str, seed: [u8; 32]) -> WitnessKey {
        WitnessKey { name: clean_name(name), key: SigningKey::from_bytes(&seed) }
    }

    /// The public key.
    pub fn public_key(&self) -> [u8; 32] {
        self.key.verifying_key().to_bytes()
    }

    /// Signs a body into the encoded witness file.
    pub fn sign(&self, body: &WitnessBody) -> Result<Vec<u8>, VerifierError> {
        let json = serde_json::to_vec(body).map_err(|e| VerifierError::Witness(e.to_string()))?;
        let sig = self.key.sign(&signed_bytes(&json, &self.name));
        let mut blob = self.public_key().to_vec();
        blob.extend_from_slice(&sig.to_bytes());
        let mut out = format!("{MAGIC}\n").into_bytes();
        out.extend_from_slice(&json);
        out.extend_from_slice(
            format!("\n\u{2014} {} {}\n", self.name, base64::engine::general_purpose::STANDARD.encode(blob)).as_bytes(),
        );
        Ok(out)
    }
}

/// Key names are one token of printable ASCII (they sit in a space-separated line).
fn clean_name(name: &str) -> String {
    let n: String = name.chars().map(|c| if c.is_ascii_graphic() { c } else { '_' }).collect();
    if n.is_empty() {
        "germline".into()
    } else {
        n
    }
}

impl Witness {
    /// Parses and checks an encoded witness: exact canonical bytes and a valid signature.
    /// With `trusted`, the signing key must be that one.
    pub fn decode(bytes: &[u8], trusted: Option<&[u8; 32]>) -> Result<Witness, VerifierError> {
        let bad = |why: &str| VerifierError::Witness(why.to_owned());
        let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
        let rest = text
            .strip_prefix(MAGIC)
            .and_then(|r| r.strip_prefix('\n'))
            .ok_or_else(|| bad("not a germline witness v1"))?;
        let (json, sig_line) = rest.split_once('\n').ok_or_else(|| bad("missing signature line"))?;
        let sig_line = sig_line.strip_suffix('\n').ok_or_else(|| bad("missing final newline"))?;
        if sig_line.contains('\n') {
            return Err(bad("trailing data after the signature"));
        }
        let body: WitnessBody = serde_json::from_str(json).map_err(|e| VerifierError::Witness(format!("body: {e}")))?;
        let canonical = serde_json::to_vec(&body).map_err(|e| VerifierError::Witness(e.to_string()))?;
        if canonical != json.as_bytes() {
            return Err(bad("body is not in canonical form (edited?)"));
        }
        if body.version != WITNESS_VERSION {
            return Err(bad("unsupported witness version"));
        }
        let mut parts = sig_line.strip_prefix("\u{2014} ").ok_or_else(|| bad("malformed signature line"))?.split(' ');
        let (Some(name), Some(b64), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("malformed signature line"));
        };
        let blob = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| bad("signature is not base64"))?;
        if blob.len() != 96 {
            return Err(bad("signature blob has the wrong length"));
        }
        let mut pk = [0u8; 32];
        pk.copy_from_slice(&blob[..32]);
        if trusted.is_some_and(|t| t != &pk) {
            return Err(bad("signed by an untrusted key"));
        }
        let vk = VerifyingKey::from_bytes(&pk).map_err(|_| bad("bad public key"))?;
        let sig = ed25519_dalek::Signature::from_slice(&blob[32..]).map_err(|_| bad("bad signature"))?;
        vk.verify_strict(&signed_bytes(json.as_bytes(), name), &sig).map_err(|_| bad("signature does not verify"))?;
        Ok(Witness { body, key_name: name.to_owned(), public_key: pk })
    }
}
