//! The service's trust anchors (`[trust]` in its configuration file) and the follower
//! of TUF repositories.
//!
//! The operator pins what the service trusts: TUF roots per repository, Sigstore
//! identities with their issuer and trusted root, cosign public keys. An admission
//! request names one of them (`anchor`); a root, key, identity or trusted root sent by
//! the caller is refused (403) unless `allow_caller_roots = true`. A TUF anchor with
//! `follow = true` is polled in the background: its metadata is refreshed from the
//! pinned root, and the highest signed version of each release name (every target with
//! `versions = "all"`), when not admitted yet, goes through the admission of the API
//! (length and SHA-256, unpacking, G1–G3, germline start, the `admit` lifecycle event in
//! the ledger), at most `max_admissions_per_poll` per poll.
//!
//! ```toml
//! [trust]
//! allow_caller_roots = false          # the default
//!
//! [trust.tuf.registry]
//! root = "/etc/germline/registry-root.json"
//! repo = "https://registry.example/tuf"   # or metadata_url and targets_url
//! follow = true
//! poll_interval_ms = 60000
//! versions = "latest"                 # or "all"
//!
//! [trust.sigstore.ci]
//! identity = "https://github.com/org/repo/.github/workflows/release.yml@refs/heads/main"
//! issuer = "https://token.actions.githubusercontent.com"
//! trusted_root = "/etc/germline/trusted_root.json"   # default: Sigstore public good
//!
//! [trust.cosign.release-key]
//! public_key = "/etc/germline/cosign.pub"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use germline_admission::sigstore::{SignerPolicy, TrustedRootChoice};
use germline_admission::{AdmissionError, SignedTarget, TufAdmission};
use germline_model::ReleaseHash;
use serde::Deserialize;

use super::error::ApiError;
use super::metrics::FollowLabels;
use super::AppState;

/// Default poll interval of a followed repository.
const DEFAULT_POLL_MS: u64 = 60_000;
/// Bounds of the poll interval: no tighter than 100 ms, no looser than a day.
const POLL_MS: std::ops::RangeInclusive<u64> = 100..=86_400_000;
/// Default and largest number of admissions one poll runs.
const DEFAULT_PER_POLL: usize = 8;
const MAX_PER_POLL: usize = 256;
/// Refused targets remembered per followed repository (each is retried only when its
/// signed entry changes, or after a restart).
const MAX_REMEMBERED_REFUSALS: usize = 4096;

/// `[trust]` as written in the configuration file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustFile {
    #[serde(default)]
    allow_caller_roots: bool,
    #[serde(default)]
    tuf: BTreeMap<String, TufAnchorFile>,
    #[serde(default)]
    sigstore: BTreeMap<String, SigstoreAnchorFile>,
    #[serde(default)]
    cosign: BTreeMap<String, CosignAnchorFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TufAnchorFile {
    root: PathBuf,
    repo: Option<String>,
    metadata_url: Option<String>,
    targets_url: Option<String>,
    #[serde(default)]
    follow: bool,
    poll_interval_ms: Option<u64>,
    max_admissions_per_poll: Option<usize>,
    versions: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SigstoreAnchorFile {
    identity: String,
    issuer: String,
    trusted_root: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CosignAnchorFile {
    public_key: PathBuf,
    trusted_root: Option<PathBuf>,
}

/// The resolved trust anchors.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// Whether an admission request may bring its own root, key, identity or trusted
    /// root instead of naming an anchor (default: refused).
    pub allow_caller_roots: bool,
    /// TUF repositories by anchor name.
    pub tuf: BTreeMap<String, TufAnchor>,
    /// Sigstore identities and cosign keys by anchor name.
    pub signers: BTreeMap<String, SignerAnchor>,
}

/// A TUF repository and the root it is verified from.
#[derive(Debug, Clone)]
pub struct TufAnchor {
    /// Anchor name.
    pub name: String,
    /// The pinned root.json bytes (read once, at start).
    pub root: Vec<u8>,
    /// Metadata base (directory or URL).
    pub metadata: String,
    /// Targets base (directory or URL).
    pub targets: String,
    /// Whether and how often the service follows the repository.
    pub follow: Option<Follow>,
}

/// How a followed repository is polled.
#[derive(Debug, Clone, Copy)]
pub struct Follow {
    /// Time between polls.
    pub interval: Duration,
    /// Most admissions one poll runs.
    pub max_per_poll: usize,
    /// Admit every signed version (`versions = "all"`), not only the highest of each
    /// release name (`"latest"`, the default).
    pub all_versions: bool,
}

/// A Sigstore identity or a cosign key, and the trusted root bundles are checked with.
#[derive(Debug, Clone)]
pub struct SignerAnchor {
    /// Who must have signed.
    pub policy: SignerPolicy,
    /// Trusted root for certificate chains and transparency-log entries.
    pub trusted_root: TrustedRootChoice,
}

fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// A repository location: an `http(s)://` URL or an absolute directory.
fn location(what: &str, v: &str) -> anyhow::Result<String> {
    let url = v.starts_with("http://") || v.starts_with("https://");
    if !(url || v.starts_with('/')) || v.contains('\0') {
        bail!("{what} {v:?} is not an http(s) URL or an absolute directory");
    }
    Ok(v.trim_end_matches('/').to_owned())
}

fn read(what: &str, p: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("{what} {}", p.display()))
}

fn trusted_root(anchor: &str, p: Option<PathBuf>) -> anyhow::Result<TrustedRootChoice> {
    let Some(p) = p else { return Ok(TrustedRootChoice::Default) };
    let bytes = read(&format!("[trust] {anchor}: trusted_root"), &p)?;
    if serde_json::from_slice::<serde_json::Value>(&bytes).map(|v| !v.is_object()).unwrap_or(true) {
        bail!("[trust] {anchor}: trusted_root {} is not a trusted-root JSON object", p.display());
    }
    Ok(TrustedRootChoice::File(p))
}

impl Trust {
    /// Checks and loads `[trust]`: every file an anchor names is read now, so a
    /// misconfigured anchor stops the service at start, not at the first admission.
    pub fn resolve(file: TrustFile) -> anyhow::Result<Trust> {
        let mut trust = Trust { allow_caller_roots: file.allow_caller_roots, ..Trust::default() };
        let mut seen = std::collections::BTreeSet::new();
        let names = file.tuf.keys().chain(file.sigstore.keys()).chain(file.cosign.keys());
        for n in names {
            if !valid_name(n) {
                bail!("[trust] anchor name {n:?} must be 1 to 64 characters of A-Z a-z 0-9 . _ -");
            }
            if !seen.insert(n.clone()) {
                bail!("[trust] anchor name {n:?} is used twice");
            }
        }
        for (name, a) in file.tuf {
            let root = read(&format!("[trust.tuf.{name}] root"), &a.root)?;
            let parsed: serde_json::Value = serde_json::from_slice(&root)
                .with_context(|| format!("[trust.tuf.{name}] root {} is not JSON", a.root.display()))?;
            if parsed["signed"]["_type"] != "root" {
                bail!("[trust.tuf.{name}] root {} is not a TUF root.json", a.root.display());
            }
            let (metadata, targets) = match (a.repo, a.metadata_url, a.targets_url) {
                (Some(r), None, None) => {
                    let r = location(&format!("[trust.tuf.{name}] repo"), &r)?;
                    (format!("{r}/metadata"), format!("{r}/targets"))
                }
                (None, Some(m), Some(t)) => (
                    location(&format!("[trust.tuf.{name}] metadata_url"), &m)?,
                    location(&format!("[trust.tuf.{name}] targets_url"), &t)?,
                ),
                _ => bail!("[trust.tuf.{name}] needs `repo`, or `metadata_url` with `targets_url`"),
            };
            let interval = a.poll_interval_ms.unwrap_or(DEFAULT_POLL_MS);
            if !POLL_MS.contains(&interval) {
                bail!("[trust.tuf.{name}] poll_interval_ms must be {} to {}", POLL_MS.start(), POLL_MS.end());
            }
            let per_poll = a.max_admissions_per_poll.unwrap_or(DEFAULT_PER_POLL);
            if !(1..=MAX_PER_POLL).contains(&per_poll) {
                bail!("[trust.tuf.{name}] max_admissions_per_poll must be 1 to {MAX_PER_POLL}");
            }
            let all_versions = match a.versions.as_deref() {
                None | Some("latest") => false,
                Some("all") => true,
                Some(v) => bail!("[trust.tuf.{name}] versions must be \"latest\" or \"all\", not {v:?}"),
            };
            let follow = a.follow.then_some(Follow {
                interval: Duration::from_millis(interval),
                max_per_poll: per_poll,
                all_versions,
            });
            trust.tuf.insert(name.clone(), TufAnchor { name, root, metadata, targets, follow });
        }
        for (name, a) in file.sigstore {
            if a.identity.trim().is_empty() || a.issuer.trim().is_empty() {
                bail!("[trust.sigstore.{name}] needs a non-empty identity and issuer");
            }
            let trusted_root = trusted_root(&format!("sigstore.{name}"), a.trusted_root)?;
            let policy = SignerPolicy::Identity { identity: a.identity, issuer: a.issuer };
            trust.signers.insert(name, SignerAnchor { policy, trusted_root });
        }
        for (name, a) in file.cosign {
            let pem = read(&format!("[trust.cosign.{name}] public_key"), &a.public_key)?;
            let pem = String::from_utf8(pem)
                .ok()
                .filter(|p| p.contains("-----BEGIN PUBLIC KEY-----"))
                .with_context(|| format!("[trust.cosign.{name}] {} is not a PEM public key", a.public_key.display()))?;
            let trusted_root = trusted_root(&format!("cosign.{name}"), a.trusted_root)?;
            trust.signers.insert(name, SignerAnchor { policy: SignerPolicy::Key(pem), trusted_root });
        }
        Ok(trust)
    }

    /// `Ok` when the operator allowed caller-supplied trust; the refusal otherwise.
    pub fn caller_trust(&self, what: &str) -> Result<(), ApiError> {
        if self.allow_caller_roots {
            return Ok(());
        }
        Err(ApiError::Forbidden(format!(
            "this service does not take {what} from the caller: name one of its configured trust anchors as \
             `anchor` ({}); an operator may allow caller-supplied roots with `[trust] allow_caller_roots = true`",
            self.names()
        )))
    }

    fn names(&self) -> String {
        let all: Vec<&str> = self.tuf.keys().chain(self.signers.keys()).map(String::as_str).collect();
        if all.is_empty() {
            "none is configured".into()
        } else {
            format!("configured: {}", all.join(", "))
        }
    }

    /// The TUF anchor `name`.
    pub fn tuf_anchor(&self, name: &str) -> Result<&TufAnchor, ApiError> {
        self.tuf
            .get(name)
            .ok_or_else(|| ApiError::Unprocessable(format!("no TUF trust anchor named {name:?} ({})", self.names())))
    }

    /// The Sigstore or cosign anchor `name`.
    pub fn signer_anchor(&self, name: &str) -> Result<&SignerAnchor, ApiError> {
        self.signers.get(name).ok_or_else(|| {
            ApiError::Unprocessable(format!("no Sigstore or cosign trust anchor named {name:?} ({})", self.names()))
        })
    }
}

impl TufAnchor {
    /// The admission of `target` from this repository, verified from the pinned root.
    pub fn admission(&self, target: impl Into<String>) -> TufAdmission {
        TufAdmission::new(self.metadata.clone(), self.root.clone(), target)
            .with_bases(self.metadata.clone(), self.targets.clone())
    }
}

/// Starts one follower per TUF anchor with `follow = true`.
pub fn start_following(state: &AppState) {
    for anchor in state.config.trust.tuf.values() {
        if let Some(f) = anchor.follow {
            eprintln!(
                "germline: following TUF repository {:?} ({}) every {} ms",
                anchor.name,
                anchor.metadata,
                f.interval.as_millis()
            );
            tokio::spawn(follow(state.clone(), anchor.clone(), f));
        }
    }
}

/// Polls `anchor` every `f.interval` until shutdown; each poll holds the admission lock
/// (admissions of the API and of followers run one at a time) and counts as in-flight
/// work, so shutdown waits for it.
async fn follow(st: AppState, anchor: TufAnchor, f: Follow) {
    let mut refused: BTreeMap<String, String> = BTreeMap::new();
    loop {
        let Ok(work) = st.work() else { return };
        let lock = st.admission.lock().await;
        let (st2, a2) = (st.clone(), anchor.clone());
        let mut r = std::mem::take(&mut refused);
        let polled = tokio::task::spawn_blocking(move || {
            let _work = work;
            poll(&st2, &a2, f, &mut r);
            r
        })
        .await;
        drop(lock);
        match polled {
            Ok(r) => refused = r,
            Err(e) => tracing::error!(anchor = %anchor.name, "follower poll: {e}"),
        }
        tokio::time::sleep(f.interval).await;
    }
}

/// One poll: refresh the metadata from the pinned root, then admit (at most
/// `max_per_poll`) signed targets, by default the highest version of each release name,
/// that this host has not admitted and has not refused in this signed form.
fn poll(st: &AppState, anchor: &TufAnchor, follow: Follow, refused: &mut BTreeMap<String, String>) {
    let m = &st.metrics;
    let labels = |outcome: &'static str| FollowLabels { anchor: anchor.name.clone(), outcome };
    let store = st.releases.store();
    let targets = match store.tuf_targets(&anchor.admission("")) {
        Ok(t) if follow.all_versions => t,
        Ok(t) => SignedTarget::latest_per_name(t),
        Err(e) => {
            tracing::warn!(anchor = %anchor.name, "following: the repository's metadata was refused: {e}");
            m.follow_polls.get_or_create(&labels("failed")).inc();
            return;
        }
    };
    m.follow_polls.get_or_create(&labels("ok")).inc();
    let mut left = follow.max_per_poll;
    for t in targets {
        let key = format!("{} {}", t.path, t.sha256.as_deref().unwrap_or("-"));
        if refused.contains_key(&key) {
            continue;
        }
        let hash = t.sha256.as_deref().and_then(|h| h.parse::<ReleaseHash>().ok());
        if hash.is_some_and(|h| st.releases.get(&h).is_some()) {
            continue;
        }
        if left == 0 {
            tracing::info!(anchor = %anchor.name, "following: admission budget of this poll spent; more next poll");
            return;
        }
        left -= 1;
        tracing::info!(anchor = %anchor.name, target = %t.path, "following: admitting a new signed target");
        let req = anchor.admission(t.path.clone());
        match super::routes::admit_blocking(st, move |store, check| store.admit_tuf(&req, check)) {
            Ok((slot, started)) => {
                m.follow_targets.get_or_create(&labels("admitted")).inc();
                match started {
                    Ok(()) => eprintln!(
                        "germline: followed {:?}: admitted {} {} ({})",
                        anchor.name, slot.name, slot.version, slot.hash
                    ),
                    Err(why) => tracing::warn!(anchor = %anchor.name, release = %slot.hash, "{why}"),
                }
            }
            Err(e) => {
                tracing::warn!(anchor = %anchor.name, target = %t.path, "following: {e}");
                if !transient(&e) {
                    let e = e.to_string();
                    m.follow_targets.get_or_create(&labels("refused")).inc();
                    eprintln!("germline: followed {:?}: refused target {}: {e}", anchor.name, t.path);
                    if refused.len() >= MAX_REMEMBERED_REFUSALS {
                        refused.pop_first();
                    }
                    refused.insert(key, e);
                }
            }
        }
    }
}

/// Whether an admission failure may go away by itself (the repository was unreachable),
/// so the target is tried again at the next poll.
pub fn transient(e: &AdmissionError) -> bool {
    matches!(e, AdmissionError::Transport(_) | AdmissionError::Io { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<Trust> {
        let file: TrustFile = toml::from_str(text)?;
        Trust::resolve(file)
    }

    #[test]
    fn anchors_are_checked_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root.json");
        std::fs::write(&root, r#"{"signed": {"_type": "root"}, "signatures": []}"#).unwrap();
        let ok =
            format!("[tuf.r]\nroot = \"{}\"\nrepo = \"http://127.0.0.1:1/repo/\"\nfollow = true\n", root.display());
        let t = parse(&ok).unwrap();
        assert!(!t.allow_caller_roots, "caller roots are refused by default");
        let a = &t.tuf["r"];
        assert_eq!(
            (a.metadata.as_str(), a.targets.as_str()),
            ("http://127.0.0.1:1/repo/metadata", "http://127.0.0.1:1/repo/targets")
        );
        assert_eq!(a.follow.unwrap().interval, Duration::from_millis(DEFAULT_POLL_MS));
        assert!(t.caller_trust("roots").is_err());

        let missing = "[tuf.r]\nroot = \"/nonexistent/root.json\"\nrepo = \"/x\"\n";
        assert!(parse(missing).is_err());
        let no_repo = format!("[tuf.r]\nroot = \"{}\"\n", root.display());
        assert!(parse(&no_repo).is_err());
        let bad_poll = format!("{ok}poll_interval_ms = 1\n");
        assert!(parse(&bad_poll).is_err());
        assert!(!a.follow.unwrap().all_versions, "the highest version of each name by default");
        assert!(parse(&format!("{ok}versions = \"all\"\n")).unwrap().tuf["r"].follow.unwrap().all_versions);
        assert!(parse(&format!("{ok}versions = \"some\"\n")).is_err());
        let twice = format!("{ok}[sigstore.r]\nidentity = \"a\"\nissuer = \"b\"\n");
        assert!(parse(&twice).is_err(), "one name, one anchor");
        let not_root = dir.path().join("other.json");
        std::fs::write(&not_root, r#"{"signed": {"_type": "targets"}}"#).unwrap();
        assert!(parse(&format!("[tuf.r]\nroot = \"{}\"\nrepo = \"/x\"\n", not_root.display())).is_err());
        let key = dir.path().join("k.pub");
        std::fs::write(&key, "not a key").unwrap();
        assert!(parse(&format!("[cosign.k]\npublic_key = \"{}\"\n", key.display())).is_err());
        assert!(parse("allow_caller_roots = true\n").unwrap().caller_trust("roots").is_ok());
    }
}
