//! Where metadata and targets come from: a local directory or an HTTP(S) base URL.
//!
//! Every read is bounded by the length the caller allows (from the signed metadata
//! where it pins one), so a hostile mirror cannot feed endless data; exceeding the
//! bound is reported as [`TooLong`] so it maps to its own refusal.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sigstore_tuf::transport::FetchFuture;

/// The bound a read would have exceeded: endless data from a mirror.
#[derive(Debug, thiserror::Error)]
#[error("served more than {0} bytes")]
pub struct TooLong(pub u64);

#[derive(Debug, Clone)]
enum Base {
    Dir(PathBuf),
    Http(String),
}

impl Base {
    fn parse(location: &str) -> Base {
        if location.starts_with("http://") || location.starts_with("https://") {
            let mut s = location.to_owned();
            if !s.ends_with('/') {
                s.push('/');
            }
            Base::Http(s)
        } else {
            Base::Dir(PathBuf::from(location.strip_prefix("file://").unwrap_or(location)))
        }
    }

    fn join(&self, sub: &str) -> Base {
        match self {
            Base::Dir(d) => Base::Dir(d.join(sub)),
            Base::Http(u) => Base::Http(format!("{u}{sub}/")),
        }
    }
}

/// A TUF repository location: metadata and targets bases.
#[derive(Debug, Clone)]
pub struct RepoSource {
    metadata: Base,
    targets: Base,
}

/// Rejects names that could step out of a base directory or URL path.
fn safe_name(name: &str) -> sigstore_tuf::Result<()> {
    if name.is_empty()
        || name.starts_with('/')
        || name.split('/').any(|c| c == ".." || c == "." || c.is_empty())
        || name.contains('\\')
        || name.contains('\0')
    {
        return Err(sigstore_tuf::Error::transport(format!("refusing unsafe repository path {name:?}")));
    }
    Ok(())
}

impl RepoSource {
    /// A repository served as `LOCATION/metadata/` and `LOCATION/targets/`, where
    /// LOCATION is a directory or an `http(s)://` URL (the layout `germline repo`
    /// and python-tuf's examples write).
    pub fn parse(location: &str) -> Self {
        let base = Base::parse(location);
        Self { metadata: base.join("metadata"), targets: base.join("targets") }
    }

    /// Separate metadata and targets bases (as the conformance harness gives them).
    pub fn with_bases(metadata: &str, targets: &str) -> Self {
        Self { metadata: Base::parse(metadata), targets: Base::parse(targets) }
    }

    /// Reads at most `max_length` bytes of `name` under `base`; `Ok(None)` if absent.
    fn read(base: &Base, name: &str, max_length: u64) -> sigstore_tuf::Result<Option<Vec<u8>>> {
        safe_name(name)?;
        let reader: Box<dyn Read> = match base {
            Base::Dir(dir) => {
                let path: &Path = dir.as_path();
                match std::fs::File::open(path.join(name)) {
                    Ok(f) => Box::new(f),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(sigstore_tuf::Error::transport_with_source(format!("reading {name}"), e)),
                }
            }
            Base::Http(url) => {
                let agent = ureq::AgentBuilder::new()
                    .timeout_connect(Duration::from_secs(30))
                    .timeout_read(Duration::from_secs(60))
                    .build();
                match agent.get(&format!("{url}{name}")).call() {
                    Ok(resp) => Box::new(resp.into_reader()),
                    Err(ureq::Error::Status(404 | 403, _)) => return Ok(None),
                    Err(e) => {
                        return Err(sigstore_tuf::Error::transport_with_source(format!("GET {url}{name}"), Box::new(e)))
                    }
                }
            }
        };
        let mut buf = Vec::new();
        reader
            .take(max_length.saturating_add(1))
            .read_to_end(&mut buf)
            .map_err(|e| sigstore_tuf::Error::transport_with_source(format!("reading {name}"), e))?;
        if buf.len() as u64 > max_length {
            return Err(sigstore_tuf::Error::transport_with_source(name.to_owned(), TooLong(max_length)));
        }
        Ok(Some(buf))
    }

    /// Reads a target file (repository-relative path), bounded by `max_length`.
    pub fn read_target(&self, path: &str, max_length: u64) -> sigstore_tuf::Result<Option<Vec<u8>>> {
        Self::read(&self.targets, path, max_length)
    }
}

impl sigstore_tuf::Repository for RepoSource {
    fn fetch_metadata<'a>(&'a self, name: &'a str, max_length: u64) -> FetchFuture<'a> {
        let result = Self::read(&self.metadata, name, max_length);
        Box::pin(async move { result })
    }

    fn fetch_target<'a>(&'a self, path: &'a str, max_length: u64) -> FetchFuture<'a> {
        let result = Self::read(&self.targets, path, max_length);
        Box::pin(async move { result })
    }
}
