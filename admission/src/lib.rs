//! Admission: verifies signed releases (TUF metadata, Sigstore/cosign) against pinned
//! trust, checks hash and length before unpacking into the content-addressed release
//! store, and hands the result to the executor to start and check its germline.
//!
//! The publisher side lives here too (canonical archive builder, TUF repository
//! writer), so a release signed with germline's own tooling and one signed with the
//! field's tools (python-tuf, cosign) go through the same host verification.

#![deny(missing_docs)]

pub mod archive;
mod error;
pub mod manifest;

pub use archive::{build_release_archive, directory_state, extract_release, ArchiveLimits, BuildOptions, BuiltRelease};
pub use error::{AdmissionError, Result};
pub use manifest::ReleaseInfo;
pub mod host;
pub mod publish;
pub mod transport;

pub use host::{AdmittedRelease, GermlineCheck, NoGermlineCheck, ReleaseStore, SignedTarget, TufAdmission};
pub use publish::{InitOptions, PublisherRepo, TufKey};
pub mod conformance;
pub mod sigstore;

/// The clock type admission judges expiry with, re-exported so callers need not
/// depend on `jiff` themselves.
pub use jiff::Timestamp;
