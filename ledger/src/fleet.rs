//! What a fleet mirror persists about its peers and what a fleet suppression is.
//!
//! The mirror itself (HTTP, tiles, witness checks) lives in the api crate; the ledger
//! keeps its state so that it survives restarts in the same store as the suppressions it
//! leads to: per peer the last checkpoint it verified, how far the peer's entries were
//! processed, and what is wrong with the peer (with evidence for a split view).

use serde::{Deserialize, Serialize};

/// A fleet suppression of a release: the witness that proved it and the entry that
/// records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FleetSuppression {
    /// SHA-256 of the peer's witness bytes.
    pub witness_sha256: [u8; 32],
    /// Index of the Suppression entry in this ledger.
    pub index: u64,
}

/// How a peer looked at the last sync.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PeerStatus {
    /// Never synced.
    #[default]
    New,
    /// The last sync verified the peer's checkpoint, tiles and entries.
    Ok,
    /// The peer could not be reached or answered with an HTTP error.
    Unreachable,
    /// A checkpoint did not verify (bad signature, wrong origin, malformed).
    BadCheckpoint,
    /// Tiles or entry bundles did not match the peer's signed checkpoint.
    TamperedTile,
    /// The checkpoint lacks the configured quorum of witness cosignatures.
    Unwitnessed,
    /// The peer signed two checkpoints that cannot both be true; it is ignored from
    /// then on (sticky until an operator resets the record).
    SplitView,
}

impl PeerStatus {
    /// The status as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerStatus::New => "new",
            PeerStatus::Ok => "ok",
            PeerStatus::Unreachable => "unreachable",
            PeerStatus::BadCheckpoint => "bad-checkpoint",
            PeerStatus::TamperedTile => "tampered-tile",
            PeerStatus::Unwitnessed => "unwitnessed",
            PeerStatus::SplitView => "split-view",
        }
    }
}

/// The mirror's durable state for one peer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRecord {
    /// The peer's last verified signed checkpoint (C2SP signed note), if any.
    pub checkpoint: Option<String>,
    /// Its tree size.
    pub size: u64,
    /// Its root hash (hex).
    pub root: String,
    /// Entries `0..processed` of the peer's log have been processed.
    pub processed: u64,
    /// Status at the last sync.
    pub status: PeerStatus,
    /// What happened, for people.
    pub message: String,
    /// For a split view: both conflicting signed notes; for a tampered tile: its path.
    pub evidence: Vec<String>,
    /// Witnesses from this peer that suppressed a release here.
    pub suppressions: u64,
    /// Witness entries from this peer that were not accepted (with why in the log).
    pub rejected_witnesses: u64,
    /// Last sync attempt, Unix milliseconds.
    pub updated_ms: u64,
}
