//! Log entries: typed, versioned records with one canonical byte encoding.
//!
//! The encoding *is* the Merkle leaf data, so it must be unambiguous and stable: a fixed
//! header (version, kind, release hash, producer time, body length) followed by the
//! producer's canonical JSON body. Decoding is strict — trailing bytes, unknown
//! versions or kinds are errors — so a torn or altered entry never parses as another.

use germline_model::ReleaseHash;
use serde::{Deserialize, Serialize};

use crate::dampening::{DampeningState, Event};

/// Current entry encoding version.
pub const ENTRY_VERSION: u8 = 1;
/// Header bytes before the body: version, kind, release, time, body length.
const HEADER_LEN: usize = 1 + 1 + 32 + 8 + 4;
/// Largest encoded entry: C2SP tlog-tiles entry bundles prefix each entry with a
/// big-endian `u16` length, so larger entries could not be served as tiles. Producers
/// with bigger evidence store it content-addressed and log its hash.
pub const MAX_ENTRY_BYTES: usize = u16::MAX as usize;

/// What an entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A witness record from the verifier.
    Witness,
    /// One call's contribution to the release's dampening penalty.
    DampeningEvent,
    /// A release was admitted.
    Admission,
    /// A release became suppressed or usable again.
    Suppression,
    /// A formed call (DESIGN §8): body is a `germline_model::FormationEntry`.
    Formation,
    /// A release lifecycle change (admit, promote, roll back, retire): body is a
    /// `germline_model::LifecycleEvent`.
    Lifecycle,
    /// What a `tools/list` answer showed (DESIGN §8): body is a
    /// `germline_model::SnapshotEntry`.
    Snapshot,
    /// A formed call passed the fence and is about to run: body is a
    /// `germline_model::DispatchRecord`.
    Dispatch,
}

impl EntryKind {
    fn to_byte(self) -> u8 {
        match self {
            EntryKind::Witness => 1,
            EntryKind::DampeningEvent => 2,
            EntryKind::Admission => 3,
            EntryKind::Suppression => 4,
            EntryKind::Formation => 5,
            EntryKind::Lifecycle => 6,
            EntryKind::Snapshot => 7,
            EntryKind::Dispatch => 8,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => EntryKind::Witness,
            2 => EntryKind::DampeningEvent,
            3 => EntryKind::Admission,
            4 => EntryKind::Suppression,
            5 => EntryKind::Formation,
            6 => EntryKind::Lifecycle,
            7 => EntryKind::Snapshot,
            8 => EntryKind::Dispatch,
            _ => return None,
        })
    }

    /// The snake-case name used on the command line and in listings.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Witness => "witness",
            EntryKind::DampeningEvent => "dampening_event",
            EntryKind::Admission => "admission",
            EntryKind::Suppression => "suppression",
            EntryKind::Formation => "formation",
            EntryKind::Lifecycle => "lifecycle",
            EntryKind::Snapshot => "snapshot",
            EntryKind::Dispatch => "dispatch",
        }
    }
}

impl std::str::FromStr for EntryKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.replace('-', "_").as_str() {
            "witness" => Ok(EntryKind::Witness),
            "dampening_event" => Ok(EntryKind::DampeningEvent),
            "admission" => Ok(EntryKind::Admission),
            "suppression" => Ok(EntryKind::Suppression),
            "formation" => Ok(EntryKind::Formation),
            "lifecycle" => Ok(EntryKind::Lifecycle),
            "snapshot" => Ok(EntryKind::Snapshot),
            "dispatch" => Ok(EntryKind::Dispatch),
            other => Err(format!(
                "unknown entry kind {other:?}: expected witness, dampening_event, admission, suppression, \
                 formation, lifecycle, snapshot or dispatch"
            )),
        }
    }
}

/// One log entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// What the entry records.
    pub kind: EntryKind,
    /// The release it is about; the per-release index is keyed by this.
    pub release: ReleaseHash,
    /// Producer's wall-clock time in Unix milliseconds (informational, not trusted).
    pub time_ms: u64,
    /// Canonical JSON from the producer (the witness record, the event…).
    pub body: Vec<u8>,
}

/// Why bytes are not an entry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EntryError {
    /// Shorter than the header or than its declared body.
    #[error("entry truncated")]
    Truncated,
    /// Bytes after the declared body.
    #[error("entry has {0} trailing bytes")]
    Trailing(usize),
    /// Unknown encoding version.
    #[error("unknown entry version {0}")]
    Version(u8),
    /// Unknown kind byte.
    #[error("unknown entry kind {0}")]
    Kind(u8),
    /// The body is not JSON.
    #[error("entry body is not JSON: {0}")]
    Body(String),
    /// Encoding exceeds [`MAX_ENTRY_BYTES`].
    #[error("entry of {0} bytes exceeds the {MAX_ENTRY_BYTES}-byte limit")]
    TooLarge(usize),
}

impl Entry {
    /// Makes an entry stamped with the current time.
    pub fn new(kind: EntryKind, release: ReleaseHash, body: Vec<u8>) -> Self {
        Entry { kind, release, time_ms: now_ms(), body }
    }

    /// Checks what the store relies on: the body is JSON and the encoding fits a tile.
    pub fn validate(&self) -> Result<(), EntryError> {
        serde_json::from_slice::<serde::de::IgnoredAny>(&self.body).map_err(|e| EntryError::Body(e.to_string()))?;
        let len = HEADER_LEN + self.body.len();
        if len > MAX_ENTRY_BYTES {
            return Err(EntryError::TooLarge(len));
        }
        Ok(())
    }

    /// The canonical encoding (the Merkle leaf data).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.body.len());
        out.push(ENTRY_VERSION);
        out.push(self.kind.to_byte());
        out.extend_from_slice(&self.release.0);
        out.extend_from_slice(&self.time_ms.to_be_bytes());
        out.extend_from_slice(&(self.body.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.body);
        out
    }

    /// Strict inverse of [`Entry::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, EntryError> {
        if bytes.len() < HEADER_LEN {
            return Err(EntryError::Truncated);
        }
        if bytes[0] != ENTRY_VERSION {
            return Err(EntryError::Version(bytes[0]));
        }
        let kind = EntryKind::from_byte(bytes[1]).ok_or(EntryError::Kind(bytes[1]))?;
        let mut release = [0u8; 32];
        release.copy_from_slice(&bytes[2..34]);
        let mut time = [0u8; 8];
        time.copy_from_slice(&bytes[34..42]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&bytes[42..46]);
        let body_len = u32::from_be_bytes(len) as usize;
        let body = &bytes[HEADER_LEN..];
        if body.len() < body_len {
            return Err(EntryError::Truncated);
        }
        if body.len() > body_len {
            return Err(EntryError::Trailing(body.len() - body_len));
        }
        Ok(Entry { kind, release: ReleaseHash(release), time_ms: u64::from_be_bytes(time), body: body.to_vec() })
    }
}

/// Body of a [`EntryKind::DampeningEvent`] entry: the event and the state it led to, so
/// the state can be rebuilt from the log and checked against what was recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DampeningEventBody {
    /// The call's event.
    pub event: Event,
    /// The release's state after the call.
    pub state: DampeningState,
}

/// Body of a [`EntryKind::Suppression`] entry written when dampening flips a release.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SuppressionBody {
    /// Whether the release is now suppressed (false: usable again).
    pub suppressed: bool,
    /// Penalty at the flip.
    pub penalty: f64,
    /// Why: `"dampening"` for automatic flips, `"fleet: witness <sha256> from <peer>
    /// entry <n>"` for a suppression on a peer's verified witness.
    pub reason: String,
    /// For a fleet suppression: the SHA-256 (hex) of the peer's witness that proves the
    /// flow violation. Such a suppression is sticky (dampening recovery does not lift
    /// it) and is recorded once per witness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub witness_sha256: Option<String>,
}

/// Current time in Unix milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Entry {
        Entry {
            kind: EntryKind::Witness,
            release: ReleaseHash::of_bytes(b"release"),
            time_ms: 1_700_000_000_000,
            body: br#"{"outcome":"item_witness"}"#.to_vec(),
        }
    }

    #[test]
    fn encoding_round_trips_and_is_fixed() {
        let e = sample();
        let bytes = e.encode();
        assert_eq!(bytes[0], ENTRY_VERSION);
        assert_eq!(bytes[1], 1);
        assert_eq!(&bytes[2..34], &e.release.0);
        assert_eq!(bytes.len(), HEADER_LEN + e.body.len());
        assert_eq!(Entry::decode(&bytes), Ok(e));
    }

    #[test]
    fn torn_or_altered_encodings_do_not_decode() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(Entry::decode(&bytes[..cut]).is_err(), "prefix {cut} decoded");
        }
        let mut longer = bytes.clone();
        longer.push(b' ');
        assert_eq!(Entry::decode(&longer), Err(EntryError::Trailing(1)));
        let mut v = bytes.clone();
        v[0] = 9;
        assert_eq!(Entry::decode(&v), Err(EntryError::Version(9)));
        let mut k = bytes;
        k[1] = 0;
        assert_eq!(Entry::decode(&k), Err(EntryError::Kind(0)));
    }

    #[test]
    fn validation_rejects_non_json_and_oversized_bodies() {
        let mut e = sample();
        assert!(e.validate().is_ok());
        e.body = b"not json".to_vec();
        assert!(matches!(e.validate(), Err(EntryError::Body(_))));
        e.body = format!("\"{}\"", "a".repeat(MAX_ENTRY_BYTES)).into_bytes();
        assert!(matches!(e.validate(), Err(EntryError::TooLarge(_))));
    }

    #[test]
    fn kinds_parse_from_their_names() {
        for k in [
            EntryKind::Witness,
            EntryKind::DampeningEvent,
            EntryKind::Admission,
            EntryKind::Suppression,
            EntryKind::Formation,
            EntryKind::Lifecycle,
            EntryKind::Snapshot,
            EntryKind::Dispatch,
        ] {
            assert_eq!(k.as_str().parse::<EntryKind>(), Ok(k));
            assert_eq!(EntryKind::from_byte(k.to_byte()), Some(k));
        }
        assert!("bogus".parse::<EntryKind>().is_err());
    }
}
