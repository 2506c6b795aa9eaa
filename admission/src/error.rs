//! The one error type of admission. Every refusal the acceptance tests name has its
//! own variant, so callers (and operators reading logs) can tell a rollback from a
//! freeze from a tampered byte without parsing messages.

use std::path::PathBuf;

/// Why a release was not built, published, verified or admitted.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// Reading or writing a local file failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// `germline.toml` is missing, unparsable or names an invalid release.
    #[error("bad release manifest: {0}")]
    BadManifest(String),
    /// The release directory holds something a canonical archive cannot carry
    /// (device file, socket, a link pointing outside the release).
    #[error("cannot archive {path}: {reason}")]
    Unarchivable {
        /// The offending path inside the release.
        path: PathBuf,
        /// Why it was refused.
        reason: String,
    },
    /// Vendoring Python dependencies with pip failed.
    #[error("pip vendoring failed: {0}")]
    Pip(String),

    /// An archive entry would land outside the extraction root (`..`, absolute path,
    /// or a link whose target leaves the release).
    #[error("archive entry escapes the release: {0}")]
    ArchivePathEscape(String),
    /// An archive entry type germline refuses (hard link, device, fifo, sparse file).
    #[error("archive entry type refused: {0}")]
    ArchiveEntryRefused(String),
    /// The archive exceeds the size or file-count budget (archive bomb).
    #[error("archive exceeds limits: {0}")]
    ArchiveTooLarge(String),
    /// The archive is not a well-formed gzip'd tar.
    #[error("malformed archive: {0}")]
    ArchiveMalformed(String),

    /// A role's metadata carries no valid signature from any key the trusted root
    /// (or delegator) lists for it.
    #[error("{role} metadata is signed by no trusted key")]
    UnknownSigningKey {
        /// The role whose signatures failed.
        role: String,
    },
    /// Some, but fewer than threshold, valid signatures.
    #[error("{role} metadata has {found} of {threshold} required signatures")]
    BelowThreshold {
        /// The role whose threshold was not met.
        role: String,
        /// Valid signatures found.
        found: usize,
        /// Signatures required.
        threshold: usize,
    },
    /// Metadata older than what this host already trusts (also across restarts,
    /// because trusted metadata is persisted).
    #[error("rollback refused for {role}: trusted version {trusted}, offered {offered}")]
    Rollback {
        /// The role that went backwards.
        role: String,
        /// Version already trusted.
        trusted: u64,
        /// Older version offered.
        offered: u64,
    },
    /// The timestamp role has expired: a mirror is replaying stale metadata.
    #[error("freeze refused: timestamp expired at {expires}")]
    Frozen {
        /// Expiry of the stale timestamp.
        expires: String,
    },
    /// A role other than timestamp has expired.
    #[error("{role} metadata expired at {expires}")]
    Expired {
        /// The expired role.
        role: String,
        /// Its expiry.
        expires: String,
    },
    /// Metadata from different repository versions was combined (the version or
    /// hash a parent role pins does not match what was served).
    #[error("mix-and-match refused: {0}")]
    MixAndMatch(String),
    /// A new root did not follow the trusted one by exactly one version.
    #[error("root version must increase by one: trusted {trusted}, offered {offered}")]
    BadRootVersion {
        /// Trusted root version.
        trusted: u64,
        /// Offered root version.
        offered: u64,
    },
    /// A repository served more bytes than the metadata allows (endless data).
    #[error("endless data refused: {0}")]
    EndlessData(String),
    /// Metadata could not be parsed or is structurally invalid.
    #[error("malformed TUF metadata: {0}")]
    BadMetadata(String),
    /// Fetching from the repository failed.
    #[error("repository transport failed: {0}")]
    Transport(String),
    /// No trusted targets role lists the requested release.
    #[error("target {0:?} is not listed by the repository")]
    TargetNotFound(String),
    /// The downloaded target's length differs from the signed length.
    #[error("target {target} length {actual} differs from signed length {expected}")]
    TargetLengthMismatch {
        /// Target path.
        target: String,
        /// Signed length.
        expected: u64,
        /// Length served.
        actual: u64,
    },
    /// The downloaded target's SHA-256 differs from the signed hash.
    #[error("target {target} sha256 {actual} differs from signed {expected}")]
    TargetHashMismatch {
        /// Target path.
        target: String,
        /// Signed digest.
        expected: String,
        /// Digest of the bytes served.
        actual: String,
    },
    /// The signed target carries no SHA-256, which germline needs as release identity.
    #[error("target {0} has no sha256 hash in its signed metadata")]
    TargetWithoutSha256(String),
    /// The release manifest inside the archive disagrees with the signed custom fields.
    #[error("manifest names {manifest} but signed metadata names {signed}")]
    ManifestMismatch {
        /// name@version from germline.toml.
        manifest: String,
        /// name@version from the TUF custom fields.
        signed: String,
    },
    /// Other TUF verification failure.
    #[error("TUF verification failed: {0}")]
    Tuf(String),

    /// The publisher repository's own state is unusable (missing keys, bad layout).
    #[error("publisher repository: {0}")]
    Publish(String),

    /// A Sigstore bundle or cosign signature did not verify.
    #[error("sigstore verification failed: {0}")]
    Sigstore(String),
    /// The bundle's signing identity or issuer does not match the policy.
    #[error("sigstore identity refused: {0}")]
    SigstoreIdentity(String),
    /// The signature does not match the artifact or the pinned key.
    #[error("signature does not verify: {0}")]
    BadSignature(String),
    /// The transparency-log proof (inclusion proof, checkpoint, SET) is invalid.
    #[error("transparency log proof refused: {0}")]
    TransparencyLog(String),

    /// The germline check (G1–G3) refused the release; the string names the check.
    #[error("germline check refused the release: {0}")]
    GermlineRefused(String),
}

impl AdmissionError {
    /// An I/O error with the path or action that failed.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        AdmissionError::Io { context: context.into(), source }
    }
}

/// The crate's result type.
pub type Result<T, E = AdmissionError> = std::result::Result<T, E>;
