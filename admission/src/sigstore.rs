//! Sigstore bundles (v0.1–v0.3) and cosign key signatures, verified fully offline
//! with `sigstore-verify` (the sigstore-rust verifier, which passes the whole
//! sigstore-conformance verify set offline) against a trusted root and an identity
//! plus issuer policy, or against a pinned public key.

use std::path::Path;

use sigstore_verify::trust_root::{TrustedRoot, SIGSTORE_PRODUCTION_TRUSTED_ROOT, SIGSTORE_STAGING_TRUSTED_ROOT};
use sigstore_verify::types::{Bundle, DerPublicKey, Sha256Hash, SignatureBytes};
use sigstore_verify::{PublicKeyVerificationPolicy, VerificationPolicy, Verifier};

use crate::error::{AdmissionError, Result};

/// Who must have signed.
#[derive(Debug, Clone)]
pub enum SignerPolicy {
    /// A Fulcio-style certificate whose SAN is `identity`, issued after an OIDC
    /// login at `issuer`.
    Identity {
        /// Expected SAN (e-mail or URI).
        identity: String,
        /// Expected OIDC issuer URL.
        issuer: String,
    },
    /// A managed key, as PEM `PUBLIC KEY` (cosign `--key`).
    Key(String),
}

/// What was signed: the artifact bytes, or only their SHA-256.
#[derive(Debug, Clone)]
pub enum SignedArtifact {
    /// The artifact's bytes.
    Bytes(Vec<u8>),
    /// A SHA-256 digest (`sha256:HEX` on the command line).
    Sha256([u8; 32]),
}

impl SignedArtifact {
    /// Parses `sha256:HEX` (64 hex digits, and not an existing path), otherwise
    /// reads the named file, as the sigstore-conformance CLI protocol specifies.
    pub fn from_arg(arg: &str) -> Result<Self> {
        if let Some(hexd) = arg.strip_prefix("sha256:") {
            let mut d = [0u8; 32];
            if hexd.len() == 64 && hex::decode_to_slice(hexd, &mut d).is_ok() && !Path::new(arg).exists() {
                return Ok(Self::Sha256(d));
            }
        }
        std::fs::read(arg).map(Self::Bytes).map_err(|e| AdmissionError::io(format!("reading {arg}"), e))
    }
}

/// Which trusted root a bundle is checked against.
#[derive(Debug, Clone, Default)]
pub enum TrustedRootChoice {
    /// The Sigstore public-good root embedded in `sigstore-verify`.
    #[default]
    Default,
    /// The Sigstore staging root embedded in `sigstore-verify`.
    Staging,
    /// A trusted-root JSON file (offline, private or test deployments).
    File(std::path::PathBuf),
}

fn verify_error(e: sigstore_verify::Error) -> AdmissionError {
    use sigstore_verify::Error as E;
    let text = chain(&e);
    match e {
        E::IdentityMismatch { .. } | E::IssuerMismatch { .. } => AdmissionError::SigstoreIdentity(text),
        E::SignatureInvalid(_) | E::ArtifactMismatch(_) => AdmissionError::BadSignature(text),
        E::TransparencyLog(_) => AdmissionError::TransparencyLog(text),
        _ => AdmissionError::Sigstore(text),
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Verifies a Sigstore bundle for `artifact`.
///
/// With [`SignerPolicy::Identity`] the certificate chain, SCT, transparency-log
/// proofs and identity are all checked; with [`SignerPolicy::Key`] the signature is
/// checked with the pinned key and the log entries and timestamps are still
/// verified. Both against `trusted_root_json`, by default the Sigstore public-good
/// root embedded in `sigstore-verify` (no network). A key signature without any
/// log entry is a bare cosign signature: see [`verify_cosign_signature`].
pub fn verify_bundle(
    bundle_json: &str,
    artifact: &SignedArtifact,
    policy: &SignerPolicy,
    trusted_root_json: Option<&str>,
) -> Result<()> {
    let bundle =
        Bundle::from_json(bundle_json).map_err(|e| AdmissionError::Sigstore(format!("bad bundle: {}", chain(&e))))?;
    let root_json = trusted_root_json.unwrap_or(SIGSTORE_PRODUCTION_TRUSTED_ROOT);
    let root = TrustedRoot::from_json(root_json)
        .map_err(|e| AdmissionError::Sigstore(format!("bad trusted root: {}", chain(&e))))?;
    let verifier = Verifier::new(&root).map_err(verify_error)?;
    let result = match (policy, artifact) {
        (SignerPolicy::Identity { identity, issuer }, art) => {
            let p = VerificationPolicy::new(identity.as_str(), issuer.as_str());
            match art {
                SignedArtifact::Bytes(b) => verifier.verify(b.as_slice(), &bundle, &p),
                SignedArtifact::Sha256(d) => verifier.verify(Sha256Hash::new(*d), &bundle, &p),
            }
        }
        (SignerPolicy::Key(pem), art) => {
            let key =
                DerPublicKey::from_pem(pem).map_err(|e| AdmissionError::Sigstore(format!("bad public key: {e}")))?;
            let p = PublicKeyVerificationPolicy::new(key);
            match art {
                SignedArtifact::Bytes(b) => verifier.verify(b.as_slice(), &bundle, &p),
                SignedArtifact::Sha256(d) => verifier.verify(Sha256Hash::new(*d), &bundle, &p),
            }
        }
    };
    result.map(|_| ()).map_err(verify_error)
}

/// Verifies a cosign `sign-blob --key` signature (base64 DER ECDSA, or any scheme
/// the key's SPKI names) over `artifact` with the pinned PEM public key.
pub fn verify_cosign_signature(artifact: &SignedArtifact, signature_b64: &str, public_key_pem: &str) -> Result<()> {
    use base64::Engine;
    let key =
        DerPublicKey::from_pem(public_key_pem).map_err(|e| AdmissionError::Sigstore(format!("bad public key: {e}")))?;
    let vk = sigstore_verify::crypto::VerificationKey::from_spki(&key)
        .map_err(|e| AdmissionError::Sigstore(format!("unusable public key: {e}")))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(signature_b64.trim())
        .map_err(|e| AdmissionError::BadSignature(format!("signature is not base64: {e}")))?;
    let sig = SignatureBytes::from_bytes(&raw);
    let checked = match artifact {
        SignedArtifact::Bytes(b) => vk.verify(b, &sig),
        SignedArtifact::Sha256(d) => vk.verify_prehashed(d, &sig),
    };
    checked.map_err(|e| AdmissionError::BadSignature(e.to_string()))
}

/// The CLI's `verify-bundle`: a JSON bundle, or (with a key) a bare cosign
/// signature file.
pub fn verify_bundle_file(
    bundle: &Path,
    artifact: &SignedArtifact,
    policy: &SignerPolicy,
    trusted_root: &TrustedRootChoice,
) -> Result<()> {
    let text =
        std::fs::read_to_string(bundle).map_err(|e| AdmissionError::io(format!("reading {}", bundle.display()), e))?;
    let root = match trusted_root {
        TrustedRootChoice::Default => None,
        TrustedRootChoice::Staging => Some(SIGSTORE_STAGING_TRUSTED_ROOT.to_owned()),
        TrustedRootChoice::File(p) => {
            Some(std::fs::read_to_string(p).map_err(|e| AdmissionError::io(format!("reading {}", p.display()), e))?)
        }
    };
    match policy {
        SignerPolicy::Key(pem) if !text.trim_start().starts_with('{') => verify_cosign_signature(artifact, &text, pem),
        _ => verify_bundle(&text, artifact, policy, root.as_deref()),
    }
}
