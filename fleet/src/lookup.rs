//! `GET /lookup/<release-sha256>`: a release's entries, each with an inclusion proof
//! against the latest signed checkpoint, checkable offline with the checkpoint key.
//!
//! The answer proves that each listed entry is in the log; it does not prove that no
//! other entry about the release exists (a mirror that needs completeness reads the
//! whole log through tiles, as [`crate::mirror`] does).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use germline_ledger::merkle;
use germline_ledger::{Checkpoint, Entry, Ledger, LedgerError, NoteVerifier};
use germline_model::ReleaseHash;
use serde::{Deserialize, Serialize};

/// The `/lookup` answer.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LookupAnswer {
    /// The release asked about (hex).
    pub release: String,
    /// The signed checkpoint the proofs lead to (C2SP signed note).
    pub checkpoint: String,
    /// Entries about the release inside that checkpoint, in log order.
    pub entries: Vec<LookupEntry>,
}

/// One entry with its proof.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LookupEntry {
    /// Position in the log.
    pub index: u64,
    /// Entry kind (informational; the encoding is authoritative).
    pub kind: String,
    /// The entry's canonical encoding (the Merkle leaf data), base64.
    pub entry: String,
    /// RFC 6962 inclusion proof (base64 hashes) up to the checkpoint's size.
    pub proof: Vec<String>,
}

/// Builds the answer from the latest signed checkpoint.
pub fn answer(ledger: &Ledger, release: &ReleaseHash) -> Result<LookupAnswer, LedgerError> {
    let cp = ledger.latest_checkpoint()?.ok_or_else(|| LedgerError::NotFound("no checkpoint signed yet".into()))?;
    let size = cp.checkpoint.size;
    let mut entries = Vec::new();
    for (index, entry) in ledger.entries_for_release(release)? {
        if index >= size {
            continue;
        }
        let proof = ledger.inclusion_proof(index, size)?;
        entries.push(LookupEntry {
            index,
            kind: entry.kind.as_str().to_owned(),
            entry: B64.encode(ledger.get_raw(index)?),
            proof: proof.iter().map(|h| B64.encode(h)).collect(),
        });
    }
    Ok(LookupAnswer { release: release.to_hex(), checkpoint: cp.note, entries })
}

/// Offline check of an answer with the log's checkpoint key: the checkpoint's signature,
/// every entry's inclusion proof, and that every entry is about `release`. Returns the
/// checkpoint and the decoded entries.
pub fn check(
    answer: &LookupAnswer,
    key: &NoteVerifier,
    release: &ReleaseHash,
) -> Result<(Checkpoint, Vec<(u64, Entry)>), String> {
    if answer.release != release.to_hex() {
        return Err(format!("the answer is about {}, not {release}", answer.release));
    }
    let cp = Checkpoint::open_signed(&answer.checkpoint, key, key.name()).map_err(|e| format!("checkpoint: {e}"))?;
    let mut out = Vec::new();
    for e in &answer.entries {
        let data = B64.decode(&e.entry).map_err(|_| format!("entry {}: not base64", e.index))?;
        let proof: Vec<merkle::Hash> = e
            .proof
            .iter()
            .map(|h| B64.decode(h).ok().and_then(|v| <[u8; 32]>::try_from(v).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("entry {}: malformed proof", e.index))?;
        if e.index >= cp.size
            || !merkle::verify_inclusion(e.index, cp.size, &merkle::leaf_hash(&data), &proof, &cp.root)
        {
            return Err(format!("entry {}: inclusion proof does not verify against the checkpoint", e.index));
        }
        let entry = Entry::decode(&data).map_err(|err| format!("entry {}: {err}", e.index))?;
        if entry.release != *release {
            return Err(format!("entry {} is about {}, not {release}", e.index, entry.release));
        }
        out.push((e.index, entry));
    }
    Ok((cp, out))
}
