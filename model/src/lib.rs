//! The model germline enforces, as pure types and functions with no I/O.
//!
//! Every other crate imports its vocabulary from here: labels, clearances, release ids,
//! items, Plan groups and horizons, the positional replay rule, slot labelling, output
//! labels. Keeping the rules here, away from processes and sockets, lets unit tests drive
//! them exhaustively (DESIGN §2).

mod vocab;

pub use vocab::{Clearance, ConsumerName, HostName, ItemName, Label, ReleaseHash, Tag};

/// Errors from parsing untrusted input into model types.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    /// A tag outside `[a-z0-9._-]`, empty, or too long.
    #[error("bad tag {0:?}: tags are 1-64 characters of [a-z0-9._-]")]
    BadTag(String),
    /// Not 64 lower-case hex digits.
    #[error("bad release hash {0:?}: expected 64 lower-case hex digits")]
    BadReleaseHash(String),
    /// Not a lower-case DNS name.
    #[error("bad host name {0:?}: expected a lower-case DNS name without port")]
    BadHostName(String),
    /// Empty, too long or with control characters.
    #[error("bad consumer name {0:?}")]
    BadConsumerName(String),
    /// Empty, too long or with a NUL byte.
    #[error("bad item name {0:?}")]
    BadItemName(String),
}
