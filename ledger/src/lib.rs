//! Ledger: the append-only, tamper-evident log of witnesses and events keyed by release
//! hash (RFC 6962 Merkle tree, signed checkpoints, proofs) and per-release dampening.
//!
//! In the DESIGN §4 picture the ledger sits between the verifier, which classifies
//! triggers into events and witnesses, and the api, which serves the log to the fleet
//! and asks it whether a release is suppressed. The pieces, from pure to I/O:
//!
//! - [`dampening`]: the penalty arithmetic and its Monte-Carlo evaluation;
//! - [`merkle`]: RFC 6962 hashing and proofs over stored-hash indexes;
//! - [`note`]: C2SP signed notes and checkpoints (Ed25519);
//! - [`entry`]: the canonical entry encoding that the tree commits to;
//! - [`tiles`]: C2SP tlog-tiles paths;
//! - [`fleet`]: what a fleet mirror persists about its peers;
//! - [`formation`]: formation snapshots, records, lifecycle events and dispatch records (DESIGN §8);
//! - [`Ledger`]: the RocksDB store tying them together (the only RocksDB user);
//! - [`cli`]: `germline ledger …` and `germline bench ledger`.

pub mod cli;
pub mod dampening;
pub mod entry;
pub mod fleet;
pub mod formation;
pub mod merkle;
pub mod note;
mod store;
pub mod tiles;

pub use dampening::{DampeningParams, DampeningState, Event};
pub use entry::{Entry, EntryError, EntryKind};
pub use fleet::{FleetSuppression, PeerRecord, PeerStatus};
pub use merkle::Hash;
pub use note::{Checkpoint, CosignatureVerifier, Cosigner, NoteError, NoteSigner, NoteVerifier};
pub use store::{AppendReceipt, Ledger, LedgerConfig, PendingAppend, SignedCheckpoint, VerifyReport, TILE_WIDTH};

/// Everything that can go wrong in the ledger, with enough context to act on.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// RocksDB failed.
    #[error("{context}: {source}")]
    Db {
        /// What the ledger was doing.
        context: String,
        /// The RocksDB error.
        source: rocksdb::Error,
    },
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What the ledger was doing.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// An entry to append is invalid.
    #[error("invalid entry: {0}")]
    Entry(#[from] EntryError),
    /// A stored entry does not decode.
    #[error("stored entry {index} is corrupt: {source}")]
    CorruptEntry {
        /// Its position.
        index: u64,
        /// Why it does not decode.
        source: EntryError,
    },
    /// Stored data is not what the ledger wrote.
    #[error("ledger corrupt: {0}")]
    Corrupt(String),
    /// Tree arithmetic or a stored hash read failed.
    #[error("merkle tree: {0}")]
    Tree(#[from] merkle::TreeError),
    /// A key or a checkpoint note is malformed or does not verify.
    #[error("signed note: {0}")]
    Note(#[from] NoteError),
    /// The requested entry, size or tile is not in the log (yet).
    #[error("not found: {0}")]
    NotFound(String),
    /// The request itself is malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The log does not extend its latest signed checkpoint; nothing will be signed.
    #[error("refusing to sign: {0}")]
    Inconsistent(String),
    /// A write batch failed; none of its entries were appended.
    #[error("append failed: {0}")]
    Write(String),
    /// Serialising an entry body failed.
    #[error("encoding entry body: {0}")]
    Encode(String),
    /// Bad configuration, key file or data directory.
    #[error("configuration: {0}")]
    Config(String),
    /// The ledger's writer thread is gone.
    #[error("ledger is closed")]
    Closed,
}
