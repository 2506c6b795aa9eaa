//! C2SP signed notes and tlog checkpoints, Ed25519 only.
//!
//! A checkpoint is the log's signed tree head in the format every transparency-log
//! tool reads (C2SP `tlog-checkpoint` inside a C2SP `signed-note`): origin line, tree
//! size, base64 root hash, a blank line, then `— <name> <base64(key id ‖ signature)>`.
//! Keeping to that format lets a fleet member or any third party check our heads with
//! stock tooling.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::merkle::Hash;

/// Signature algorithm byte for Ed25519 in signed-note key ids and keys.
const ALG_ED25519: u8 = 0x01;
/// The em dash that starts a signature line.
const SIG_PREFIX: &str = "\u{2014} ";

/// Errors from parsing or verifying notes and keys.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NoteError {
    /// The text is not a well-formed note or checkpoint.
    #[error("malformed note: {0}")]
    Malformed(String),
    /// The key text is not a well-formed signer or verifier key.
    #[error("malformed key: {0}")]
    BadKey(String),
    /// No signature by the expected key verifies.
    #[error("no valid signature by {0}")]
    NotSigned(String),
}

/// Whether `name` is a valid signed-note key name (non-empty, no space, no `+`).
fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(|c| c.is_whitespace() || c == '+' || c.is_control())
}

/// Signed-note key id: first four bytes of `SHA-256(name ‖ "\n" ‖ 0x01 ‖ public key)`.
fn key_id(name: &str, public: &[u8; 32]) -> [u8; 4] {
    key_id_for(name, ALG_ED25519, public)
}

/// Parses `vkey` text `<name>+<hex id>+<base64(alg ‖ public key)>` for signature type
/// `alg`, checking the name, the type, the key and that the id matches them.
fn parse_vkey(text: &str, alg: u8, what: &str) -> Result<(String, VerifyingKey, [u8; 4]), NoteError> {
    let mut parts = text.trim().splitn(3, '+');
    let (Some(name), Some(id_hex), Some(key_b64)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(NoteError::BadKey("expected name+id+key".into()));
    };
    if !valid_name(name) {
        return Err(NoteError::BadKey(format!("bad key name {name:?}")));
    }
    let raw = B64.decode(key_b64).map_err(|e| NoteError::BadKey(format!("key is not base64: {e}")))?;
    if raw.len() != 33 || raw[0] != alg {
        return Err(NoteError::BadKey(format!("not an {what} key")));
    }
    let public: [u8; 32] = raw[1..].try_into().map_err(|_| NoteError::BadKey("bad key length".into()))?;
    let key =
        VerifyingKey::from_bytes(&public).map_err(|e| NoteError::BadKey(format!("bad Ed25519 public key: {e}")))?;
    let id = key_id_for(name, alg, &public);
    if hex::encode(id) != id_hex {
        return Err(NoteError::BadKey("key id does not match key".into()));
    }
    Ok((name.to_owned(), key, id))
}

/// The `vkey` text of `key` for signature type `alg`.
fn vkey_text(name: &str, alg: u8, key: &VerifyingKey, id: [u8; 4]) -> String {
    let mut raw = vec![alg];
    raw.extend_from_slice(key.as_bytes());
    format!("{name}+{}+{}", hex::encode(id), B64.encode(raw))
}

/// Key id for signature type `alg` (0x01 note signatures, 0x04 cosignature/v1).
fn key_id_for(name: &str, alg: u8, public: &[u8; 32]) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([alg]);
    h.update(public);
    let d = h.finalize();
    [d[0], d[1], d[2], d[3]]
}

/// A named Ed25519 note signer (the log's checkpoint key).
pub struct NoteSigner {
    name: String,
    key: SigningKey,
    id: [u8; 4],
}

impl std::fmt::Debug for NoteSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the private key.
        write!(f, "NoteSigner({}+{})", self.name, hex::encode(self.id))
    }
}

impl NoteSigner {
    /// Makes a signer from a 32-byte Ed25519 seed.
    pub fn from_seed(name: &str, seed: [u8; 32]) -> Result<Self, NoteError> {
        if !valid_name(name) {
            return Err(NoteError::BadKey(format!("bad key name {name:?}")));
        }
        let key = SigningKey::from_bytes(&seed);
        let id = key_id(name, key.verifying_key().as_bytes());
        Ok(NoteSigner { name: name.to_owned(), key, id })
    }

    /// Generates a fresh signer from the operating system's RNG.
    pub fn generate(name: &str) -> Result<Self, NoteError> {
        let mut seed = [0u8; 32];
        getrandom::getrandom(&mut seed).map_err(|e| NoteError::BadKey(format!("no randomness for a new key: {e}")))?;
        Self::from_seed(name, seed)
    }

    /// Parses Go's `PRIVATE+KEY+<name>+<id>+<base64(0x01 ‖ seed)>` signer-key text.
    pub fn from_key_text(text: &str) -> Result<Self, NoteError> {
        let text = text.trim();
        let rest =
            text.strip_prefix("PRIVATE+KEY+").ok_or_else(|| NoteError::BadKey("missing PRIVATE+KEY+ prefix".into()))?;
        let mut parts = rest.splitn(3, '+');
        let (Some(name), Some(id_hex), Some(key_b64)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(NoteError::BadKey("expected name+id+key".into()));
        };
        let raw = B64.decode(key_b64).map_err(|e| NoteError::BadKey(format!("key is not base64: {e}")))?;
        if raw.len() != 33 || raw[0] != ALG_ED25519 {
            return Err(NoteError::BadKey("not an Ed25519 signer key".into()));
        }
        let mut seed = [0u8; 32];
        seed.copy_from_slice(&raw[1..]);
        let signer = Self::from_seed(name, seed)?;
        if hex::encode(signer.id) != id_hex {
            return Err(NoteError::BadKey("key id does not match key".into()));
        }
        Ok(signer)
    }

    /// The signer-key text (secret: store with mode 0600, never commit).
    pub fn to_key_text(&self) -> String {
        let mut raw = vec![ALG_ED25519];
        raw.extend_from_slice(&self.key.to_bytes());
        format!("PRIVATE+KEY+{}+{}+{}", self.name, hex::encode(self.id), B64.encode(raw))
    }

    /// The matching verifier.
    pub fn verifier(&self) -> NoteVerifier {
        NoteVerifier { name: self.name.clone(), key: self.key.verifying_key(), id: self.id }
    }

    /// Signs a note text (which must end in a newline) and returns the signed note.
    pub fn sign(&self, text: &str) -> Result<String, NoteError> {
        check_text(text)?;
        let sig = self.key.sign(text.as_bytes());
        let mut blob = self.id.to_vec();
        blob.extend_from_slice(&sig.to_bytes());
        Ok(format!("{text}\n{SIG_PREFIX}{} {}\n", self.name, B64.encode(blob)))
    }
}

/// A named Ed25519 note verifier, in the signed-note `vkey` text form
/// `<name>+<hex id>+<base64(0x01 ‖ public key)>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoteVerifier {
    name: String,
    key: VerifyingKey,
    id: [u8; 4],
}

impl NoteVerifier {
    /// Parses verifier-key text.
    pub fn from_vkey(text: &str) -> Result<Self, NoteError> {
        let (name, key, id) = parse_vkey(text, ALG_ED25519, "Ed25519 verifier")?;
        Ok(NoteVerifier { name, key, id })
    }

    /// The `vkey` text to hand to anyone who checks our checkpoints.
    pub fn to_vkey(&self) -> String {
        vkey_text(&self.name, ALG_ED25519, &self.key, self.id)
    }

    /// The key name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Verifies a signed note and returns its text if one signature line is ours and
    /// valid; signatures by other keys are ignored, as the spec requires.
    pub fn open<'a>(&self, note: &'a str) -> Result<&'a str, NoteError> {
        let split = note.rfind("\n\n").ok_or_else(|| NoteError::Malformed("no blank line before signatures".into()))?;
        let text = &note[..split + 1];
        check_text(text)?;
        let sigs = &note[split + 2..];
        if sigs.is_empty() || !sigs.ends_with('\n') {
            return Err(NoteError::Malformed("signature block must end in newline".into()));
        }
        for line in sigs.lines() {
            let body = line
                .strip_prefix(SIG_PREFIX)
                .ok_or_else(|| NoteError::Malformed(format!("bad signature line {line:?}")))?;
            let (name, b64) =
                body.rsplit_once(' ').ok_or_else(|| NoteError::Malformed(format!("bad signature line {line:?}")))?;
            if name != self.name {
                continue;
            }
            let Ok(blob) = B64.decode(b64) else { continue };
            if blob.len() != 68 || blob[..4] != self.id {
                continue;
            }
            let Ok(sig_bytes) = <[u8; 64]>::try_from(&blob[4..]) else {
                continue;
            };
            let sig = Signature::from_bytes(&sig_bytes);
            if self.key.verify_strict(text.as_bytes(), &sig).is_ok() {
                return Ok(text);
            }
        }
        Err(NoteError::NotSigned(self.name.clone()))
    }
}

/// A note text must be non-empty UTF-8 without control characters but newline, end in
/// a newline, and have no blank line (which would be read as the signature separator).
fn check_text(text: &str) -> Result<(), NoteError> {
    if text.is_empty() || !text.ends_with('\n') {
        return Err(NoteError::Malformed("note text must end in newline".into()));
    }
    if text.chars().any(|c| c.is_control() && c != '\n') {
        return Err(NoteError::Malformed("control character in note text".into()));
    }
    if text.contains("\n\n") || text.starts_with('\n') {
        return Err(NoteError::Malformed("blank line in note text".into()));
    }
    Ok(())
}

/// The body of a tlog checkpoint: which log, how big, and its tree head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The log's origin line (its unique name).
    pub origin: String,
    /// Number of entries.
    pub size: u64,
    /// RFC 6962 tree head of the first `size` entries.
    pub root: Hash,
}

impl Checkpoint {
    /// The note text: `origin\nsize\nbase64(root)\n`.
    pub fn to_text(&self) -> String {
        format!("{}\n{}\n{}\n", self.origin, self.size, B64.encode(self.root))
    }

    /// Parses a checkpoint note text (extension lines after the root are allowed and
    /// ignored).
    pub fn parse(text: &str) -> Result<Self, NoteError> {
        let mut lines = text.lines();
        let origin =
            lines.next().filter(|l| !l.is_empty()).ok_or_else(|| NoteError::Malformed("missing origin".into()))?;
        let size_line = lines.next().ok_or_else(|| NoteError::Malformed("missing tree size".into()))?;
        if size_line.is_empty()
            || !size_line.bytes().all(|b| b.is_ascii_digit())
            || (size_line.len() > 1 && size_line.starts_with('0'))
        {
            return Err(NoteError::Malformed(format!("bad tree size {size_line:?}")));
        }
        let size = size_line.parse().map_err(|_| NoteError::Malformed(format!("bad tree size {size_line:?}")))?;
        let root_line = lines.next().ok_or_else(|| NoteError::Malformed("missing root hash".into()))?;
        let root: Hash = B64
            .decode(root_line)
            .ok()
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| NoteError::Malformed(format!("bad root hash {root_line:?}")))?;
        Ok(Checkpoint { origin: origin.to_owned(), size, root })
    }

    /// Verifies a signed checkpoint with `verifier` and checks its origin.
    pub fn open_signed(note: &str, verifier: &NoteVerifier, origin: &str) -> Result<Self, NoteError> {
        let cp = Self::parse(verifier.open(note)?)?;
        if cp.origin != origin {
            return Err(NoteError::Malformed(format!("origin {:?} is not {origin:?}", cp.origin)));
        }
        Ok(cp)
    }
}

/// Signature type byte of Ed25519 `cosignature/v1` keys (C2SP tlog-cosignature).
const ALG_COSIGNATURE_V1: u8 = 0x04;

/// The message a `cosignature/v1` signs: header, timestamp line, the checkpoint text.
fn cosigned_message(text: &str, timestamp: u64) -> String {
    format!("cosignature/v1\ntime {timestamp}\n{text}")
}

/// An Ed25519 witness cosigner (C2SP tlog-cosignature v1): it signs checkpoints whose
/// consistency it has verified, with a timestamp.
pub struct Cosigner {
    name: String,
    key: SigningKey,
    id: [u8; 4],
}

impl std::fmt::Debug for Cosigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cosigner({}+{})", self.name, hex::encode(self.id))
    }
}

impl Cosigner {
    /// A cosigner from a 32-byte Ed25519 seed.
    pub fn from_seed(name: &str, seed: [u8; 32]) -> Result<Self, NoteError> {
        if !valid_name(name) {
            return Err(NoteError::BadKey(format!("bad key name {name:?}")));
        }
        let key = SigningKey::from_bytes(&seed);
        let id = key_id_for(name, ALG_COSIGNATURE_V1, key.verifying_key().as_bytes());
        Ok(Cosigner { name: name.to_owned(), key, id })
    }

    /// A fresh cosigner from the operating system's RNG.
    pub fn generate(name: &str) -> Result<Self, NoteError> {
        let mut seed = [0u8; 32];
        getrandom::getrandom(&mut seed).map_err(|e| NoteError::BadKey(format!("no randomness for a new key: {e}")))?;
        Self::from_seed(name, seed)
    }

    /// The seed (to store in a private key file).
    pub fn seed(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// The matching verifier.
    pub fn verifier(&self) -> CosignatureVerifier {
        CosignatureVerifier { name: self.name.clone(), key: self.key.verifying_key(), id: self.id }
    }

    /// The cosignature line (`— <name> base64(id ‖ timestamp ‖ signature)\n`) on the
    /// checkpoint note text `text` (without signature lines) at `timestamp` (POSIX s).
    pub fn cosign(&self, text: &str, timestamp: u64) -> Result<String, NoteError> {
        check_text(text)?;
        if timestamp == 0 || timestamp > i64::MAX as u64 {
            return Err(NoteError::Malformed("cosignature timestamp out of range".into()));
        }
        let sig = self.key.sign(cosigned_message(text, timestamp).as_bytes());
        let mut blob = self.id.to_vec();
        blob.extend_from_slice(&timestamp.to_be_bytes());
        blob.extend_from_slice(&sig.to_bytes());
        Ok(format!("{SIG_PREFIX}{} {}\n", self.name, B64.encode(blob)))
    }
}

/// Verifies `cosignature/v1` lines by one cosigner; its `vkey` text uses type 0x04.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CosignatureVerifier {
    name: String,
    key: VerifyingKey,
    id: [u8; 4],
}

impl CosignatureVerifier {
    /// Parses `<name>+<hex id>+<base64(0x04 ‖ public key)>`.
    pub fn from_vkey(text: &str) -> Result<Self, NoteError> {
        let (name, key, id) = parse_vkey(text, ALG_COSIGNATURE_V1, "Ed25519 cosignature/v1")?;
        Ok(CosignatureVerifier { name, key, id })
    }

    /// The `vkey` text.
    pub fn to_vkey(&self) -> String {
        vkey_text(&self.name, ALG_COSIGNATURE_V1, &self.key, self.id)
    }

    /// The cosigner's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The timestamp of a valid cosignature by this key on `note` (a checkpoint with
    /// signature lines); lines by other keys are ignored.
    pub fn verify(&self, note: &str) -> Result<u64, NoteError> {
        let split = note.rfind("\n\n").ok_or_else(|| NoteError::Malformed("no blank line before signatures".into()))?;
        let text = &note[..split + 1];
        for line in note[split + 2..].lines() {
            let Some(body) = line.strip_prefix(SIG_PREFIX) else { continue };
            let Some((name, b64)) = body.rsplit_once(' ') else { continue };
            if name != self.name {
                continue;
            }
            let Ok(blob) = B64.decode(b64) else { continue };
            if blob.len() != 4 + 8 + 64 || blob[..4] != self.id {
                continue;
            }
            let mut ts = [0u8; 8];
            ts.copy_from_slice(&blob[4..12]);
            let timestamp = u64::from_be_bytes(ts);
            let Ok(sig_bytes) = <[u8; 64]>::try_from(&blob[12..]) else { continue };
            let sig = Signature::from_bytes(&sig_bytes);
            if self.key.verify_strict(cosigned_message(text, timestamp).as_bytes(), &sig).is_ok() {
                return Ok(timestamp);
            }
        }
        Err(NoteError::NotSigned(self.name.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint() -> Checkpoint {
        Checkpoint { origin: "example.com/log".into(), size: 42, root: [7u8; 32] }
    }

    #[test]
    fn signed_checkpoint_has_c2sp_shape_and_verifies() {
        let signer = NoteSigner::generate("example.com/log").expect("key");
        let note = signer.sign(&checkpoint().to_text()).expect("sign");
        let lines: Vec<&str> = note.lines().collect();
        assert_eq!(lines[0], "example.com/log");
        assert_eq!(lines[1], "42");
        assert_eq!(lines[2], B64.encode([7u8; 32]));
        assert_eq!(lines[3], "");
        assert!(lines[4].starts_with("\u{2014} example.com/log "));
        let blob = B64.decode(lines[4].rsplit(' ').next().expect("sig")).expect("b64");
        assert_eq!(blob.len(), 68);
        let verifier = signer.verifier();
        assert_eq!(Checkpoint::open_signed(&note, &verifier, "example.com/log"), Ok(checkpoint()));
        // The wrong origin, a tampered size, or another key all fail.
        assert!(Checkpoint::open_signed(&note, &verifier, "other").is_err());
        let tampered = note.replacen("\n42\n", "\n43\n", 1);
        assert!(verifier.open(&tampered).is_err());
        let other = NoteSigner::generate("example.com/log").expect("key").verifier();
        assert!(other.open(&note).is_err());
    }

    #[test]
    fn key_texts_round_trip_and_key_id_follows_the_spec() {
        let signer = NoteSigner::from_seed("PeterNeumann", [3u8; 32]).expect("key");
        let again = NoteSigner::from_key_text(&signer.to_key_text()).expect("parse");
        assert_eq!(again.verifier(), signer.verifier());
        let vkey = signer.verifier().to_vkey();
        assert_eq!(NoteVerifier::from_vkey(&vkey), Ok(signer.verifier()));
        // Key id = SHA-256(name ‖ '\n' ‖ 0x01 ‖ pub)[..4], shown as 8 hex digits.
        let public = signer.key.verifying_key().to_bytes();
        let mut h = Sha256::new();
        h.update(b"PeterNeumann\n\x01");
        h.update(public);
        let want = hex::encode(&h.finalize()[..4]);
        assert_eq!(vkey.split('+').nth(1), Some(want.as_str()));
        // A vkey with a flipped id is refused.
        let mut bad = vkey.clone().into_bytes();
        bad[13] = if bad[13] == b'0' { b'1' } else { b'0' };
        assert!(NoteVerifier::from_vkey(&String::from_utf8(bad).expect("ascii")).is_err());
    }

    #[test]
    fn verifies_a_go_signed_note_from_the_spec() {
        // Example from golang.org/x/mod/sumdb/note's documentation.
        let vkey = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
        let note = "If you think cryptography is the answer to your problem,\n\
then you don't know what your problem is.\n\
\n\
\u{2014} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";
        let verifier = NoteVerifier::from_vkey(vkey).expect("vkey");
        let text = verifier.open(note).expect("verifies");
        assert!(text.starts_with("If you think"));
        // Ed25519 is deterministic, so the documented signer key reproduces the note.
        let signer =
            NoteSigner::from_key_text("PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz")
                .expect("skey");
        assert_eq!(signer.sign(text).expect("sign"), note);
        assert_eq!(signer.verifier().to_vkey(), vkey);
        assert!(verifier.open(&note.replace("cryptography", "cryptographY")).is_err());
    }

    #[test]
    fn cosignatures_follow_tlog_cosignature_v1() {
        let log = NoteSigner::generate("example.com/log").expect("key");
        let text = checkpoint().to_text();
        let note = log.sign(&text).expect("sign");
        let w = Cosigner::from_seed("witness.example/w1", [5u8; 32]).expect("cosigner");
        let line = w.cosign(&text, 1_679_315_147).expect("cosign");
        let cosigned = format!("{note}{line}");
        let v = CosignatureVerifier::from_vkey(&w.verifier().to_vkey()).expect("vkey");
        assert_eq!(v.verify(&cosigned), Ok(1_679_315_147));
        // The log's own signature still verifies with the line added.
        assert!(log.verifier().open(&cosigned).is_ok());
        // Blob = key id (type 0x04) ‖ big-endian timestamp ‖ Ed25519 signature over
        // "cosignature/v1\ntime <t>\n" ‖ checkpoint text.
        let blob = B64.decode(line.trim_end().rsplit(' ').next().expect("b64")).expect("b64");
        assert_eq!(blob.len(), 76);
        assert_eq!(blob[..4], key_id_for("witness.example/w1", 0x04, &w.key.verifying_key().to_bytes()));
        assert_eq!(u64::from_be_bytes(blob[4..12].try_into().expect("8")), 1_679_315_147);
        let msg = format!("cosignature/v1\ntime 1679315147\n{text}");
        let sig = Signature::from_bytes(&blob[12..].try_into().expect("64"));
        assert!(w.key.verifying_key().verify_strict(msg.as_bytes(), &sig).is_ok());
        // Another checkpoint, another key or a note-signature key type: no.
        let other = format!("{}{line}", log.sign(&Checkpoint { size: 43, ..checkpoint() }.to_text()).expect("s"));
        assert!(v.verify(&other).is_err());
        let stranger = Cosigner::from_seed("witness.example/w1", [6u8; 32]).expect("c").verifier();
        assert!(stranger.verify(&cosigned).is_err());
        assert!(CosignatureVerifier::from_vkey(&log.verifier().to_vkey()).is_err());
        assert!(w.cosign(&text, 0).is_err());
    }

    #[test]
    fn malformed_checkpoints_are_rejected() {
        assert!(Checkpoint::parse("origin\n").is_err());
        assert!(Checkpoint::parse("origin\n012\nAAAA\n").is_err());
        assert!(Checkpoint::parse("origin\n12\nnot base64!\n").is_err());
        assert!(Checkpoint::parse("origin\n-1\nAAAA\n").is_err());
        let signer = NoteSigner::generate("log").expect("key");
        assert!(signer.sign("no newline").is_err());
        assert!(signer.sign("two\n\nparagraphs\n").is_err());
    }
}
