//! The witness record: evidence plus verdict, signed by the recording host.
//!
//! Encoding (version 2), chosen so that every byte counts:
//!
//! ```text
//! germline-witness v2\n
//! <canonical JSON of WitnessBody>\n
//! — <key name> <base64(32-byte Ed25519 public key || 64-byte signature)>\n
//! ```
//!
//! Canonical JSON is serde_json's compact output of the body with object keys sorted
//! (every map in the body is ordered). A reader parses the body, re-encodes it and
//! requires the same bytes, then checks the signature over exactly those bytes: an edit
//! anywhere — body, whitespace, signature, key — is rejected.
//!
//! The signed record is what is published (ledger entries, peers): the trigger's
//! [`PublicEvidence`] and a [`PublicReport`], a fixed shape of call metadata, the verdict
//! and keyed commitments, at most [`MAX_WITNESS_BYTES`] long so it always fits a ledger
//! entry and reaches every peer whatever the release's replies. The full record and the
//! per-try outcomes are the [`WitnessOpening`], written beside the witness readable by
//! its owner only; `germline verify` takes it with the items and checks it against the
//! commitments before replaying. Item contents are in neither.

use std::path::Path;

use base64::Engine;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use germline_executor::evidence::{check_keyed_commitment, keyed_commitment, PublicEvidence, TriggerEvidence};
use serde::{Deserialize, Serialize};

use crate::{classify, ReplayReport, Verdict, VerifierError, MAX_TRIES};

/// Version of the witness encoding (2: evidence published as commitments).
pub const WITNESS_VERSION: u32 = 2;

const MAGIC: &str = "germline-witness v2";

/// Format line of an opening file.
const OPENING_FORMAT: &str = "germline-opening v1";

/// Domain separation of the report commitment.
const REPORT_DOMAIN: &[u8] = b"germline-report v1\n";

/// Largest witness (with committed evidence) a host signs: far below a ledger entry's
/// 65535 bytes, so every witness is shared with peers in the entry itself.
pub const MAX_WITNESS_BYTES: usize = 4096;

/// What is published of a probe/control outcome: the verdict, the number of tries, and
/// a commitment (same secret as the evidence) to the per-try outcomes, which a copy
/// holding items could otherwise modulate try by try.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicReport {
    /// The verdict.
    pub verdict: Verdict,
    /// Tries of each side.
    pub tries: usize,
    /// HMAC-SHA256 (hex) of the full [`ReplayReport`].
    pub commitment: String,
    /// The full report in the clear: only with commitments switched off (tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disclosed: Option<ReplayReport>,
}

/// What the witness holder keeps and gives a verifier with the items: the full record of
/// the trigger (with its secret) and the per-try outcomes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WitnessOpening {
    /// `germline-opening v1`.
    pub format: String,
    /// The full evidence, secret included.
    pub evidence: TriggerEvidence,
    /// The recording host's probe/control outcomes.
    pub report: ReplayReport,
}

fn report_bytes(r: &ReplayReport) -> Result<Vec<u8>, VerifierError> {
    serde_json::to_vec(r).map_err(|e| VerifierError::Witness(e.to_string()))
}

impl WitnessBody {
    /// Seals a verified trigger into what is published and what is kept. With
    /// `commitments` off (tests only) the published body also carries both in the clear.
    pub fn seal(
        evidence: &TriggerEvidence,
        declared_deterministic: bool,
        report: ReplayReport,
        commitments: bool,
    ) -> Result<(WitnessBody, WitnessOpening), VerifierError> {
        let bad = |e: germline_executor::ExecutorError| VerifierError::Witness(e.to_string());
        let public = evidence.public(commitments).map_err(bad)?;
        let commitment = keyed_commitment(&evidence.secret, REPORT_DOMAIN, &report_bytes(&report)?).map_err(bad)?;
        let body = WitnessBody {
            version: WITNESS_VERSION,
            evidence: public,
            declared_deterministic,
            report: PublicReport {
                verdict: report.verdict,
                tries: report.tries,
                commitment,
                disclosed: (!commitments).then(|| report.clone()),
            },
        };
        let opening = WitnessOpening { format: OPENING_FORMAT.into(), evidence: evidence.clone(), report };
        Ok((body, opening))
    }
}

impl WitnessOpening {
    /// Checks that this opening is the one `body` commits to, and that its outcomes
    /// classify to the published verdict.
    pub fn check(&self, body: &WitnessBody) -> Result<(), VerifierError> {
        let bad = |e: germline_executor::ExecutorError| VerifierError::Witness(format!("opening: {e}"));
        if self.format != OPENING_FORMAT {
            return Err(VerifierError::Witness(format!("opening: not a {OPENING_FORMAT}")));
        }
        self.evidence.opens(&body.evidence).map_err(bad)?;
        check_keyed_commitment(
            &self.evidence.secret,
            REPORT_DOMAIN,
            &report_bytes(&self.report)?,
            &body.report.commitment,
        )
        .map_err(bad)?;
        let r = &self.report;
        if r.verdict != body.report.verdict
            || r.tries != body.report.tries
            || r.probe_differs.len() != r.tries
            || r.control_differs.len() != r.tries
            || classify(&r.probe_differs, &r.control_differs, body.declared_deterministic) != r.verdict
        {
            return Err(VerifierError::Witness("opening: outcomes do not classify to the published verdict".into()));
        }
        Ok(())
    }

    /// The opening file's bytes (JSON).
    pub fn encode(&self) -> Result<Vec<u8>, VerifierError> {
        serde_json::to_vec(self).map_err(|e| VerifierError::Witness(e.to_string()))
    }

    /// Parses an opening file.
    pub fn decode(bytes: &[u8]) -> Result<WitnessOpening, VerifierError> {
        serde_json::from_slice(bytes).map_err(|e| VerifierError::Witness(format!("opening: {e}")))
    }

    /// Writes the opening to `path`, readable and writable by its owner only.
    pub fn write(&self, path: &Path) -> Result<(), VerifierError> {
        use std::os::unix::fs::OpenOptionsExt;
        let io = |e: std::io::Error| VerifierError::Io(format!("{}: {e}", path.display()));
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(io)?;
        std::io::Write::write_all(&mut f, &self.encode()?).map_err(io)?;
        f.sync_all().map_err(io)
    }
}

/// What the record says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WitnessBody {
    /// Encoding version.
    pub version: u32,
    /// What is published of the trigger's evidence.
    pub evidence: PublicEvidence,
    /// Whether the release declared determinism for the tool.
    pub declared_deterministic: bool,
    /// Probe/control outcome at the recording host, as published.
    pub report: PublicReport,
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
    /// A body with committed evidence must encode to at most [`MAX_WITNESS_BYTES`].
    pub fn sign(&self, body: &WitnessBody) -> Result<Vec<u8>, VerifierError> {
        let json = serde_json::to_vec(body).map_err(|e| VerifierError::Witness(e.to_string()))?;
        if body.evidence.disclosed.is_none() && json.len() + self.name.len() + 256 > MAX_WITNESS_BYTES {
            return Err(VerifierError::Witness(format!(
                "witness body of {} bytes exceeds the {MAX_WITNESS_BYTES}-byte bound",
                json.len()
            )));
        }
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
            .ok_or_else(|| bad("not a germline witness v2"))?;
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
        if body.report.tries == 0 || body.report.tries > MAX_TRIES {
            return Err(bad("number of tries out of range"));
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
