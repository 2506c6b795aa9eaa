//! The command shapes the TUF conformance suite drives (`tuf-client init|refresh|
//! download`), as library calls over the same verifying client hosts use.
//!
//! Trusted metadata lives in the metadata directory under its plain role names
//! (`root.json`, `timestamp.json`, ...), byte-for-byte as verified, because the
//! suite inspects exactly that directory; version-prefixed copies and cached
//! targets are not written there.

use std::fs;
use std::path::{Component, Path, PathBuf};

use sigstore_tuf::{MetadataStore, TargetFile, TrustedMetadataSet, Updater};

use crate::error::{AdmissionError, Result};
use crate::host::tuf_error;
use crate::transport::RepoSource;

/// Stores only the trusted top-level files of one client, atomically.
struct MetadataDir(PathBuf);

impl MetadataStore for MetadataDir {
    fn load(&self, name: &str) -> sigstore_tuf::Result<Option<Vec<u8>>> {
        if name.contains('/') {
            return Ok(None);
        }
        match fs::read(self.0.join(name)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(sigstore_tuf::Error::io(format!("reading {name}"), e)),
        }
    }

    fn store(&self, name: &str, bytes: &[u8]) -> sigstore_tuf::Result<()> {
        let versioned =
            name.split('.').next().is_some_and(|stem| !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_digit()));
        if name.contains('/') || versioned {
            return Ok(());
        }
        let tmp = self.0.join(format!(".{name}.tmp"));
        fs::write(&tmp, bytes).map_err(|e| sigstore_tuf::Error::io(format!("writing {name}"), e))?;
        fs::rename(&tmp, self.0.join(name)).map_err(|e| sigstore_tuf::Error::io(format!("renaming {name}"), e))
    }
}

/// `init ROOT`: trust `root` (it must be validly self-signed) on first use.
pub fn tuf_client_init(metadata_dir: &Path, root: &Path) -> Result<()> {
    let bytes = fs::read(root).map_err(|e| AdmissionError::io(format!("reading {}", root.display()), e))?;
    TrustedMetadataSet::from_root(&bytes).map_err(tuf_error)?;
    fs::create_dir_all(metadata_dir)
        .map_err(|e| AdmissionError::io(format!("creating {}", metadata_dir.display()), e))?;
    fs::write(metadata_dir.join("root.json"), bytes)
        .map_err(|e| AdmissionError::io(format!("writing {}", metadata_dir.display()), e))
}

fn updater(metadata_dir: &Path, metadata_url: &str, target_base_url: Option<&str>) -> Result<Updater> {
    let root_path = metadata_dir.join("root.json");
    let root = fs::read(&root_path).map_err(|e| AdmissionError::io(format!("reading {}", root_path.display()), e))?;
    let source = RepoSource::with_bases(metadata_url, target_base_url.unwrap_or(metadata_url));
    Ok(Updater::new(source, &root).map_err(tuf_error)?.with_store(MetadataDir(metadata_dir.to_path_buf())))
}

/// `refresh`: the TUF client workflow from the trusted root, at time `now`.
pub fn tuf_client_refresh(metadata_dir: &Path, metadata_url: &str, now: jiff::Timestamp) -> Result<()> {
    let mut u = updater(metadata_dir, metadata_url, None)?;
    pollster::block_on(u.refresh(now)).map_err(tuf_error)
}

/// Whether a file already present matches the signed length and every supported hash.
fn matches_signed(bytes: &[u8], info: &TargetFile) -> bool {
    use sha2::Digest;
    if bytes.len() as u64 != info.length {
        return false;
    }
    let mut checked = false;
    for (algo, want) in &info.hashes {
        let got = match algo.as_str() {
            "sha256" => hex::encode(sha2::Sha256::digest(bytes)),
            "sha512" => hex::encode(sha2::Sha512::digest(bytes)),
            _ => continue,
        };
        if !got.eq_ignore_ascii_case(want) {
            return false;
        }
        checked = true;
    }
    checked
}

/// `download`: refresh, then fetch and verify each target into `target_dir`
/// (skipping ones already present with the signed length and hashes).
pub fn tuf_client_download(
    metadata_dir: &Path,
    metadata_url: &str,
    target_names: &[String],
    target_base_url: &str,
    target_dir: &Path,
    now: jiff::Timestamp,
) -> Result<()> {
    let mut u = updater(metadata_dir, metadata_url, Some(target_base_url))?;
    pollster::block_on(u.refresh(now)).map_err(tuf_error)?;
    for name in target_names {
        let info = pollster::block_on(u.get_target_info(name, now))
            .map_err(tuf_error)?
            .ok_or_else(|| AdmissionError::TargetNotFound(name.clone()))?;
        let rel = Path::new(name.trim_start_matches('/'));
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(AdmissionError::ArchivePathEscape(format!("target name {name:?}")));
        }
        let out = target_dir.join(rel);
        if fs::read(&out).is_ok_and(|b| matches_signed(&b, &info)) {
            continue;
        }
        let bytes = pollster::block_on(u.download_target(&info, name)).map_err(|e| match e {
            sigstore_tuf::Error::IntegrityMismatch(why) => AdmissionError::TargetHashMismatch {
                target: name.clone(),
                expected: info.hashes.values().next().cloned().unwrap_or_default(),
                actual: why,
            },
            other => tuf_error(other),
        })?;
        if let Some(parent) = out.parent() {
            fs::create_dir_all(parent).map_err(|e| AdmissionError::io(format!("creating {}", parent.display()), e))?;
        }
        fs::write(&out, bytes).map_err(|e| AdmissionError::io(format!("writing {}", out.display()), e))?;
    }
    Ok(())
}
