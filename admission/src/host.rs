//! Host-side admission: prove, from a pinned root, who published these exact bytes;
//! only then unpack them into the content-addressed release store and let the
//! executor's germline check (G1–G3) have the last word.
//!
//! TUF verification is `sigstore-tuf`'s `Updater` (the client that passes the whole
//! tuf-conformance suite) over our bounded [`RepoSource`]; the target itself is
//! fetched and checked here, length and SHA-256 against the signed targets entry,
//! before a single byte is extracted. Trusted metadata persists per pinned root under
//! the store, so rollback protection survives restarts.

use std::fs;
use std::path::{Path, PathBuf};

use germline_model::ReleaseHash;
use serde_json::json;
use sha2::{Digest, Sha256};
use sigstore_tuf::{FileStore, TargetFile, Updater, UpdaterConfig};

use crate::archive::{extract_release, hash_file, ArchiveLimits};
use crate::error::{AdmissionError, Result};
use crate::manifest::ReleaseInfo;
use crate::sigstore::{verify_bundle_file, SignedArtifact, SignerPolicy, TrustedRootChoice};
use crate::transport::{RepoSource, TooLong};

/// The executor's germline check (G1 one thread, G2 no stray descriptors, G3 no
/// shared writable mapping), run on the extracted release before it is recorded as
/// admitted. Defined here so admission does not depend on the executor crate.
pub trait GermlineCheck {
    /// Starts the release's germline from `release_dir` and checks it; `Err` names
    /// the failed check (e.g. "G1: 2 threads").
    fn check(&self, release_dir: &Path) -> std::result::Result<(), String>;
}

/// Admission without the germline check, for callers that run G1–G3 elsewhere or not at
/// all: the attack evaluation (its germline runtime checks at start; its baselines have
/// no germline) and tests of TUF and Sigstore verification alone. Hosts admit with the
/// executor's check (`germline admit` does).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoGermlineCheck;

impl GermlineCheck for NoGermlineCheck {
    fn check(&self, _release_dir: &Path) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// A release that passed every check and sits in the store.
#[derive(Debug, Clone)]
pub struct AdmittedRelease {
    /// SHA-256 of the archive: the release's identity.
    pub hash: ReleaseHash,
    /// `releases/<hash>/` in the store.
    pub dir: PathBuf,
    /// Name and version from the manifest (equal to the signed custom fields).
    pub info: ReleaseInfo,
    /// Archive length.
    pub length: u64,
}

/// A target as the repository's verified targets metadata signs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedTarget {
    /// Target path.
    pub path: String,
    /// Signed SHA-256 (lower-case hex), if the entry has one.
    pub sha256: Option<String>,
    /// Signed length.
    pub length: u64,
    /// Release name and version from the custom fields, if present.
    pub release: Option<ReleaseInfo>,
}

impl SignedTarget {
    /// Of `targets`, the highest signed version of each release name (numeric where
    /// numeric, as admission by name picks), plus every target without a name.
    pub fn latest_per_name(targets: Vec<SignedTarget>) -> Vec<SignedTarget> {
        let mut best: std::collections::BTreeMap<String, SignedTarget> = std::collections::BTreeMap::new();
        let mut unnamed = Vec::new();
        for t in targets {
            let Some(r) = t.release.clone() else {
                unnamed.push(t);
                continue;
            };
            match best.get(&r.name) {
                Some(b) if b.release.as_ref().map(|b| version_key(&b.version)) >= Some(version_key(&r.version)) => {}
                _ => {
                    best.insert(r.name, t);
                }
            }
        }
        best.into_values().chain(unnamed).collect()
    }
}

/// One admission through TUF.
#[derive(Debug, Clone)]
pub struct TufAdmission {
    /// Repository: a directory or `http(s)://` URL with `metadata/` and `targets/`; with
    /// [`TufAdmission::targets_base`] set, the metadata base itself.
    pub repo: String,
    /// Where targets are served when not under `repo/targets/` (a directory or URL).
    pub targets_base: Option<String>,
    /// The pinned trust root (root.json bytes) this host was provisioned with.
    pub pinned_root: Vec<u8>,
    /// Target path, or a release name (the highest signed version of that name).
    pub target: String,
    /// The verification clock: expiry is judged at this instant (injectable for tests).
    pub now: jiff::Timestamp,
    /// Extraction budgets.
    pub limits: ArchiveLimits,
    /// Largest archive the host will download.
    pub max_archive_bytes: u64,
}

impl TufAdmission {
    /// Admission of `target` from `repo`, verified from `pinned_root`, at the current time.
    pub fn new(repo: impl Into<String>, pinned_root: Vec<u8>, target: impl Into<String>) -> Self {
        Self {
            repo: repo.into(),
            targets_base: None,
            pinned_root,
            target: target.into(),
            now: jiff::Timestamp::now(),
            limits: ArchiveLimits::default(),
            max_archive_bytes: 512 << 20,
        }
    }

    /// The same admission with metadata under `metadata` and targets under `targets`
    /// (each a directory or `http(s)://` URL), as a repository configured with two bases.
    pub fn with_bases(mut self, metadata: impl Into<String>, targets: impl Into<String>) -> Self {
        self.repo = metadata.into();
        self.targets_base = Some(targets.into());
        self
    }

    fn source(&self) -> RepoSource {
        match &self.targets_base {
            Some(t) => RepoSource::with_bases(&self.repo, t),
            None => RepoSource::parse(&self.repo),
        }
    }

    /// The same admission judged at `now` instead of the wall clock.
    pub fn at(mut self, now: jiff::Timestamp) -> Self {
        self.now = now;
        self
    }
}

/// Maps the TUF client's errors onto admission's distinct refusals.
pub(crate) fn tuf_error(e: sigstore_tuf::Error) -> AdmissionError {
    use sigstore_tuf::Error as E;
    match e {
        E::ThresholdNotMet { role, found: 0, .. } => AdmissionError::UnknownSigningKey { role },
        E::ThresholdNotMet { role, found, threshold } => AdmissionError::BelowThreshold { role, found, threshold },
        E::Rollback { role, trusted, new } => AdmissionError::Rollback { role, trusted, offered: new },
        E::Expired { role, expires } if role == "timestamp" => AdmissionError::Frozen { expires: expires.to_string() },
        E::Expired { role, expires } => AdmissionError::Expired { role, expires: expires.to_string() },
        E::IntegrityMismatch(msg) => AdmissionError::MixAndMatch(msg),
        E::BadRootVersion { trusted, new } => AdmissionError::BadRootVersion { trusted, offered: new },
        E::TargetNotFound(t) => AdmissionError::TargetNotFound(t),
        E::Transport { message, source } => match source {
            Some(s) if s.downcast_ref::<TooLong>().is_some() => AdmissionError::EndlessData(format!("{message}: {s}")),
            Some(s) => AdmissionError::Transport(format!("{message}: {s}")),
            None => AdmissionError::Transport(message),
        },
        other @ (E::Json(_)
        | E::Malformed(_)
        | E::NonIntegerNumber
        | E::UnusableKey { .. }
        | E::UnsupportedScheme { .. }
        | E::UnknownRole(_)
        | E::DuplicateSignature { .. }) => AdmissionError::BadMetadata(chain(&other)),
        other => AdmissionError::Tuf(chain(&other)),
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

/// Orders versions numerically where they are numeric (`1.10.0` after `1.9.0`).
fn version_key(v: &str) -> Vec<(u64, String)> {
    v.split(['.', '-', '+']).map(|p| (p.parse::<u64>().unwrap_or(0), p.to_owned())).collect()
}

/// Where a consistent-snapshot target lives: the hash prefixes the file name only.
fn consistent_path(path: &str, sha256: &str) -> String {
    match path.rsplit_once('/') {
        Some((dir, name)) => format!("{dir}/{sha256}.{name}"),
        None => format!("{sha256}.{path}"),
    }
}

/// The content-addressed release store: `releases/<sha256>/` (extracted releases),
/// `admitted/<sha256>.json` (admission records), `tuf/<root-id>/` (trusted metadata
/// per pinned root), `incoming/` (downloads being checked).
#[derive(Debug, Clone)]
pub struct ReleaseStore {
    root: PathBuf,
}

impl ReleaseStore {
    /// Opens (creating if needed) a store at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        for sub in ["releases", "admitted", "tuf", "incoming"] {
            let d = root.join(sub);
            fs::create_dir_all(&d).map_err(|e| AdmissionError::io(format!("creating {}", d.display()), e))?;
        }
        Ok(Self { root })
    }

    /// Where release `hash` is (or would be) extracted.
    pub fn release_dir(&self, hash: &ReleaseHash) -> PathBuf {
        self.root.join("releases").join(hash.to_hex())
    }

    /// Whether `hash` passed admission on this host.
    pub fn is_admitted(&self, hash: &ReleaseHash) -> bool {
        self.root.join("admitted").join(format!("{hash}.json")).is_file() && self.release_dir(hash).is_dir()
    }

    /// Trusted-metadata directory for one pinned root.
    fn tuf_state(&self, pinned_root: &[u8]) -> PathBuf {
        let id = hex::encode(Sha256::digest(pinned_root));
        self.root.join("tuf").join(&id[..32])
    }

    /// A TUF client for `req`'s repository whose metadata was just refreshed from the
    /// pinned root (trusted metadata persisted per root under `tuf/`).
    fn refreshed(&self, req: &TufAdmission) -> Result<(RepoSource, Updater)> {
        let source = req.source();
        let state = self.tuf_state(&req.pinned_root);
        fs::create_dir_all(&state).map_err(|e| AdmissionError::io(format!("creating {}", state.display()), e))?;
        let mut updater = Updater::new(source.clone(), &req.pinned_root)
            .map_err(tuf_error)?
            .with_config(UpdaterConfig::default())
            .with_store(FileStore::new(&state));
        pollster::block_on(updater.refresh(req.now)).map_err(tuf_error)?;
        Ok((source, updater))
    }

    /// Refreshes `req`'s repository from the pinned root and lists the targets its
    /// top-level targets role signs (path order; delegated roles are not walked), for a
    /// host that follows the repository. `req.target` is not used.
    pub fn tuf_targets(&self, req: &TufAdmission) -> Result<Vec<SignedTarget>> {
        let (_, updater) = self.refreshed(req)?;
        let Some(targets) = updater.trusted().targets_role("targets") else { return Ok(Vec::new()) };
        Ok(targets
            .targets
            .iter()
            .map(|(path, t)| SignedTarget {
                path: path.clone(),
                sha256: t.hashes.get("sha256").map(|h| h.to_ascii_lowercase()),
                length: t.length,
                release: signed_release(t),
            })
            .collect())
    }

    /// Verifies `req.target` through TUF from the pinned root, downloads it bounded
    /// by its signed length, checks length and SHA-256, then extracts and runs
    /// `check` (see [`ReleaseStore::admit_verified_archive`]).
    pub fn admit_tuf(&self, req: &TufAdmission, check: &dyn GermlineCheck) -> Result<AdmittedRelease> {
        let (source, mut updater) = self.refreshed(req)?;

        let (path, info) = self.resolve_target(&mut updater, &req.target, req.now)?;
        let expected = info
            .hashes
            .get("sha256")
            .ok_or_else(|| AdmissionError::TargetWithoutSha256(path.clone()))?
            .to_ascii_lowercase();
        if info.length > req.max_archive_bytes {
            return Err(AdmissionError::ArchiveTooLarge(format!(
                "{path} is signed as {} bytes, over the {} byte limit",
                info.length, req.max_archive_bytes
            )));
        }
        let fetch_path =
            if updater.trusted().root().consistent_snapshot { consistent_path(&path, &expected) } else { path.clone() };
        let bytes = match source.read_target(&fetch_path, info.length) {
            Ok(Some(b)) => b,
            Ok(None) => return Err(AdmissionError::Transport(format!("target file {fetch_path} not found"))),
            Err(sigstore_tuf::Error::Transport { source: Some(s), .. }) if s.downcast_ref::<TooLong>().is_some() => {
                return Err(AdmissionError::TargetLengthMismatch {
                    target: path,
                    expected: info.length,
                    actual: info.length + 1,
                })
            }
            Err(e) => return Err(tuf_error(e)),
        };
        if bytes.len() as u64 != info.length {
            return Err(AdmissionError::TargetLengthMismatch {
                target: path,
                expected: info.length,
                actual: bytes.len() as u64,
            });
        }
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != expected {
            return Err(AdmissionError::TargetHashMismatch { target: path, expected, actual });
        }
        let signed = signed_release(&info);
        let hash = ReleaseHash::of_bytes(&bytes);
        let incoming = self.root.join("incoming").join(format!("{hash}.{}.tar.gz", std::process::id()));
        fs::write(&incoming, &bytes).map_err(|e| AdmissionError::io(format!("writing {}", incoming.display()), e))?;
        let result = self.admit_verified_archive(&incoming, &hash, signed.as_ref(), &req.limits, check);
        let _ = fs::remove_file(&incoming);
        result
    }

    /// Admits a local archive whose publisher is proven by a Sigstore bundle or a
    /// cosign key signature (`bundle`), under `policy`. The archive is copied into
    /// the store first and every check runs on that copy, so the file cannot change
    /// between verification and extraction.
    pub fn admit_sigstore(
        &self,
        archive: &Path,
        bundle: &Path,
        policy: &SignerPolicy,
        trusted_root: &TrustedRootChoice,
        limits: &ArchiveLimits,
        check: &dyn GermlineCheck,
    ) -> Result<AdmittedRelease> {
        let incoming = self.root.join("incoming").join(format!("sigstore.{}.tar.gz", std::process::id()));
        fs::copy(archive, &incoming).map_err(|e| AdmissionError::io(format!("copying {}", archive.display()), e))?;
        let result = (|| {
            let (hash, _) = hash_file(&incoming)?;
            verify_bundle_file(bundle, &SignedArtifact::Sha256(hash.0), policy, trusted_root)?;
            self.admit_verified_archive(&incoming, &hash, None, limits, check)
        })();
        let _ = fs::remove_file(&incoming);
        result
    }

    fn resolve_target(
        &self,
        updater: &mut Updater,
        target: &str,
        now: jiff::Timestamp,
    ) -> Result<(String, TargetFile)> {
        if let Some(info) = pollster::block_on(updater.get_target_info(target, now)).map_err(tuf_error)? {
            return Ok((target.to_owned(), info));
        }
        // Not a path: the highest signed version whose custom name is `target`.
        let targets = updater
            .trusted()
            .targets_role("targets")
            .ok_or_else(|| AdmissionError::TargetNotFound(target.to_owned()))?;
        let best = targets
            .targets
            .iter()
            .filter_map(|(path, t)| {
                let custom = t.custom.as_ref()?;
                (custom.get("name")?.as_str()? == target).then(|| {
                    let v = custom.get("version").and_then(|v| v.as_str()).unwrap_or("");
                    (version_key(v), path.clone(), t.clone())
                })
            })
            .max_by(|a, b| a.0.cmp(&b.0));
        best.map(|(_, p, t)| (p, t)).ok_or_else(|| AdmissionError::TargetNotFound(target.to_owned()))
    }

    /// Admits an archive whose bytes were already proven (by TUF or a Sigstore
    /// bundle) to hash to `hash`: re-hashes the file, extracts it safely into
    /// `releases/<hash>/`, checks the manifest against the signed name/version (if
    /// any), runs the germline check, and only then records the admission. On any
    /// failure after extraction the release directory is removed.
    pub fn admit_verified_archive(
        &self,
        archive: &Path,
        hash: &ReleaseHash,
        signed: Option<&ReleaseInfo>,
        limits: &ArchiveLimits,
        check: &dyn GermlineCheck,
    ) -> Result<AdmittedRelease> {
        let (actual, length) = hash_file(archive)?;
        if &actual != hash {
            return Err(AdmissionError::TargetHashMismatch {
                target: archive.display().to_string(),
                expected: hash.to_hex(),
                actual: actual.to_hex(),
            });
        }
        let dir = self.release_dir(hash);
        let partial = self.root.join("releases").join(format!(".{hash}.partial-{}", std::process::id()));
        if partial.exists() {
            fs::remove_dir_all(&partial)
                .map_err(|e| AdmissionError::io(format!("clearing {}", partial.display()), e))?;
        }
        let info = extract_release(archive, &partial, limits)?;
        if let Some(signed) = signed {
            if signed != &info {
                let _ = fs::remove_dir_all(&partial);
                return Err(AdmissionError::ManifestMismatch { manifest: info.label(), signed: signed.label() });
            }
        }
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(|e| AdmissionError::io(format!("replacing {}", dir.display()), e))?;
        }
        fs::rename(&partial, &dir).map_err(|e| AdmissionError::io(format!("moving into {}", dir.display()), e))?;
        if let Err(reason) = check.check(&dir) {
            let _ = fs::remove_dir_all(&dir);
            let _ = fs::remove_file(self.root.join("admitted").join(format!("{hash}.json")));
            return Err(AdmissionError::GermlineRefused(reason));
        }
        let record = json!({
            "hash": hash.to_hex(),
            "name": info.name,
            "version": info.version,
            "length": length,
            "admitted_at": jiff::Timestamp::now().to_string(),
        });
        let record_path = self.root.join("admitted").join(format!("{hash}.json"));
        fs::write(&record_path, record.to_string())
            .map_err(|e| AdmissionError::io(format!("writing {}", record_path.display()), e))?;
        Ok(AdmittedRelease { hash: *hash, dir, info, length })
    }
}

/// The release name/version the publisher signed into the target's custom fields.
fn signed_release(info: &TargetFile) -> Option<ReleaseInfo> {
    let custom = info.custom.as_ref()?;
    Some(ReleaseInfo {
        name: custom.get("name")?.as_str()?.to_owned(),
        version: custom.get("version")?.as_str()?.to_owned(),
    })
}
