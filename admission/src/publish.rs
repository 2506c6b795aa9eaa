//! The publisher's TUF repository: Ed25519 keys for root, targets, snapshot and
//! timestamp, consistent snapshots, targets that carry the release's name and
//! version as custom fields, expiry, and key rotation with thresholds.
//!
//! Written directly on `ed25519-dalek` and the OLPC canonical JSON that TUF signs
//! (from `sigstore-tuf`, the client we verify with), so that the exact bytes a host
//! checks are the bytes produced here; python-tuf's `ngclient` verifies the result
//! (see the interop test).
//!
//! Layout: `REPO/metadata/` (`N.root.json`, `root.json`, `N.targets.json`,
//! `N.snapshot.json`, `timestamp.json`, plus unversioned working copies) and
//! `REPO/targets/<sha256>.<path>`. Private keys live in a separate key directory,
//! one `ROLE.json` per role, never under `REPO`.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signer, SigningKey};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::archive::{hash_file, read_archive_manifest, ArchiveLimits};
use crate::error::{AdmissionError, Result};

/// TUF specification version written into metadata.
pub const SPEC_VERSION: &str = "1.0.31";

/// The four top-level roles.
pub const TOP_LEVEL_ROLES: [&str; 4] = ["root", "targets", "snapshot", "timestamp"];

/// An Ed25519 TUF signing key.
pub struct TufKey {
    signing: SigningKey,
}

impl std::fmt::Debug for TufKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TufKey({})", self.key_id())
    }
}

impl TufKey {
    /// A fresh key from the operating system's RNG.
    pub fn generate() -> Self {
        Self { signing: SigningKey::generate(&mut rand_core::OsRng) }
    }

    /// The public key in TUF's JSON form.
    pub fn public_json(&self) -> Value {
        json!({
            "keytype": "ed25519",
            "scheme": "ed25519",
            "keyval": {"public": hex::encode(self.signing.verifying_key().as_bytes())}
        })
    }

    /// SHA-256 of the canonical public key JSON, as python-tuf computes it.
    pub fn key_id(&self) -> String {
        let bytes = sigstore_tuf::canonical_json::to_canonical_bytes(&self.public_json()).unwrap_or_default();
        hex::encode(Sha256::digest(bytes))
    }

    /// Hex Ed25519 signature over `bytes`.
    pub fn sign_hex(&self, bytes: &[u8]) -> String {
        hex::encode(self.signing.sign(bytes).to_bytes())
    }

    fn to_private_json(&self) -> Value {
        let mut v = self.public_json();
        v["keyval"]["private"] = Value::String(hex::encode(self.signing.to_bytes()));
        v
    }

    fn from_private_json(v: &Value) -> Result<Self> {
        let private = v["keyval"]["private"]
            .as_str()
            .ok_or_else(|| AdmissionError::Publish("key file without keyval.private".into()))?;
        let mut seed = [0u8; 32];
        hex::decode_to_slice(private, &mut seed)
            .map_err(|_| AdmissionError::Publish("private key is not 32 hex bytes".into()))?;
        Ok(Self { signing: SigningKey::from_bytes(&seed) })
    }
}

/// Wraps `signed` in a TUF envelope signed by each of `keys` over its canonical JSON.
pub fn sign_metadata(signed: &Value, keys: &[&TufKey]) -> Result<Value> {
    let bytes = sigstore_tuf::canonical_json::to_canonical_bytes(signed)
        .map_err(|e| AdmissionError::Publish(format!("canonical JSON: {e}")))?;
    let signatures: Vec<Value> = keys.iter().map(|k| json!({"keyid": k.key_id(), "sig": k.sign_hex(&bytes)})).collect();
    Ok(json!({"signed": signed, "signatures": signatures}))
}

/// TUF's expiry format: RFC 3339, UTC, whole seconds.
pub fn expiry(now: jiff::Timestamp, days: i64) -> String {
    let t = now.checked_add(jiff::SignedDuration::from_hours(24 * days)).unwrap_or(now);
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// How long each role's metadata stays valid, in days.
#[derive(Debug, Clone, Copy)]
pub struct Expiries {
    /// Root validity.
    pub root: i64,
    /// Targets validity.
    pub targets: i64,
    /// Snapshot validity.
    pub snapshot: i64,
    /// Timestamp validity: short, so a frozen mirror is noticed quickly.
    pub timestamp: i64,
}

impl Default for Expiries {
    fn default() -> Self {
        Self { root: 365, targets: 90, snapshot: 7, timestamp: 1 }
    }
}

/// Options for [`PublisherRepo::init`].
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// Number of root keys to generate.
    pub root_keys: usize,
    /// Root signature threshold.
    pub root_threshold: usize,
    /// Validity periods.
    pub expiries: Expiries,
}

impl Default for InitOptions {
    fn default() -> Self {
        Self { root_keys: 1, root_threshold: 1, expiries: Expiries::default() }
    }
}

/// A publisher's repository on disk plus its key directory.
#[derive(Debug, Clone)]
pub struct PublisherRepo {
    repo: PathBuf,
    keys: PathBuf,
    /// Validity periods used when re-signing.
    pub expiries: Expiries,
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = fs::read(path).map_err(|e| AdmissionError::io(format!("reading {}", path.display()), e))?;
    serde_json::from_slice(&bytes).map_err(|e| AdmissionError::Publish(format!("{}: {e}", path.display())))
}

fn write_file(path: &Path, bytes: &[u8], private: bool) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|e| AdmissionError::io(format!("creating {}", dir.display()), e))?;
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(|e| AdmissionError::io(format!("writing {}", tmp.display()), e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| AdmissionError::io(format!("writing {}", tmp.display()), e))?;
    fs::rename(&tmp, path).map_err(|e| AdmissionError::io(format!("renaming {}", path.display()), e))
}

fn version_of(v: &Value) -> u64 {
    v["signed"]["version"].as_u64().unwrap_or(0)
}

impl PublisherRepo {
    /// Opens an existing repository (`repo`) whose private keys are in `keys`.
    pub fn open(repo: impl Into<PathBuf>, keys: impl Into<PathBuf>) -> Self {
        Self { repo: repo.into(), keys: keys.into(), expiries: Expiries::default() }
    }

    /// Directory served to hosts: `metadata/` and `targets/` below it.
    pub fn repo_dir(&self) -> &Path {
        &self.repo
    }

    fn meta(&self, name: &str) -> PathBuf {
        self.repo.join("metadata").join(name)
    }

    /// Role keys currently held for `role`.
    pub fn role_keys(&self, role: &str) -> Result<Vec<TufKey>> {
        let v = read_json(&self.keys.join(format!("{role}.json")))?;
        v["keys"]
            .as_array()
            .ok_or_else(|| AdmissionError::Publish(format!("{role}.json has no keys array")))?
            .iter()
            .map(TufKey::from_private_json)
            .collect()
    }

    fn save_role_keys(&self, role: &str, keys: &[TufKey]) -> Result<()> {
        let v = json!({"keys": keys.iter().map(TufKey::to_private_json).collect::<Vec<_>>()});
        let bytes = serde_json::to_vec_pretty(&v).map_err(|e| AdmissionError::Publish(e.to_string()))?;
        write_file(&self.keys.join(format!("{role}.json")), &bytes, true)
    }

    fn write_metadata(&self, name: &str, envelope: &Value, versioned: bool) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(envelope).map_err(|e| AdmissionError::Publish(e.to_string()))?;
        if versioned {
            write_file(&self.meta(&format!("{}.{name}.json", version_of(envelope))), &bytes, false)?;
        }
        write_file(&self.meta(&format!("{name}.json")), &bytes, false)
    }

    /// The current root metadata (signed envelope).
    pub fn root(&self) -> Result<Value> {
        read_json(&self.meta("root.json"))
    }

    /// Creates a repository: keys for every role, root v1, empty targets, snapshot
    /// and timestamp. Refuses to overwrite an existing repository or key directory.
    pub fn init(
        repo: impl Into<PathBuf>,
        keys: impl Into<PathBuf>,
        opts: &InitOptions,
        now: jiff::Timestamp,
    ) -> Result<Self> {
        let this = Self { repo: repo.into(), keys: keys.into(), expiries: opts.expiries };
        if this.meta("root.json").exists() || this.keys.join("root.json").exists() {
            return Err(AdmissionError::Publish(format!("{} already holds a repository", this.repo.display())));
        }
        if opts.root_threshold == 0 || opts.root_threshold > opts.root_keys {
            return Err(AdmissionError::Publish("root threshold must be 1..=root keys".into()));
        }
        let mut all: BTreeMap<&str, Vec<TufKey>> = BTreeMap::new();
        all.insert("root", (0..opts.root_keys).map(|_| TufKey::generate()).collect());
        for role in ["targets", "snapshot", "timestamp"] {
            all.insert(role, vec![TufKey::generate()]);
        }
        let mut keys_json = serde_json::Map::new();
        let mut roles_json = serde_json::Map::new();
        for (role, keys) in &all {
            for k in keys {
                keys_json.insert(k.key_id(), k.public_json());
            }
            let threshold = if *role == "root" { opts.root_threshold } else { 1 };
            roles_json.insert(
                role.to_string(),
                json!({"keyids": keys.iter().map(TufKey::key_id).collect::<Vec<_>>(), "threshold": threshold}),
            );
        }
        let root = json!({
            "_type": "root",
            "spec_version": SPEC_VERSION,
            "version": 1,
            "expires": expiry(now, opts.expiries.root),
            "consistent_snapshot": true,
            "keys": keys_json,
            "roles": roles_json,
        });
        for (role, keys) in &all {
            this.save_role_keys(role, keys)?;
        }
        let root_keys: Vec<&TufKey> = all["root"].iter().collect();
        this.write_metadata("root", &sign_metadata(&root, &root_keys)?, true)?;
        fs::create_dir_all(this.repo.join("targets")).map_err(|e| AdmissionError::io("creating targets dir", e))?;
        let targets = json!({
            "_type": "targets",
            "spec_version": SPEC_VERSION,
            "version": 0,
            "expires": expiry(now, opts.expiries.targets),
            "targets": {},
        });
        this.publish_targets(targets, now)?;
        Ok(this)
    }

    fn current_signed(&self, role: &str) -> Result<Value> {
        Ok(read_json(&self.meta(&format!("{role}.json")))?["signed"].clone())
    }

    /// Bumps and signs targets, then snapshot and timestamp over it.
    fn publish_targets(&self, mut targets: Value, now: jiff::Timestamp) -> Result<()> {
        let version = targets["version"].as_u64().unwrap_or(0) + 1;
        targets["version"] = json!(version);
        targets["expires"] = json!(expiry(now, self.expiries.targets));
        let keys = self.role_keys("targets")?;
        let refs: Vec<&TufKey> = keys.iter().collect();
        self.write_metadata("targets", &sign_metadata(&targets, &refs)?, true)?;
        self.publish_snapshot(now)
    }

    /// Signs a new snapshot pinning the current targets, then a new timestamp.
    fn publish_snapshot(&self, now: jiff::Timestamp) -> Result<()> {
        let targets_version = self.current_signed("targets")?["version"].as_u64().unwrap_or(0);
        let version = match read_json(&self.meta("snapshot.json")) {
            Ok(v) => version_of(&v) + 1,
            Err(_) => 1,
        };
        let snapshot = json!({
            "_type": "snapshot",
            "spec_version": SPEC_VERSION,
            "version": version,
            "expires": expiry(now, self.expiries.snapshot),
            "meta": {"targets.json": {"version": targets_version}},
        });
        let keys = self.role_keys("snapshot")?;
        let refs: Vec<&TufKey> = keys.iter().collect();
        self.write_metadata("snapshot", &sign_metadata(&snapshot, &refs)?, true)?;
        self.publish_timestamp(now)
    }

    /// Signs a new timestamp pinning the current snapshot: what a publisher runs
    /// regularly so hosts do not see the repository as frozen.
    pub fn publish_timestamp(&self, now: jiff::Timestamp) -> Result<()> {
        let snapshot_version = self.current_signed("snapshot")?["version"].as_u64().unwrap_or(0);
        let version = match read_json(&self.meta("timestamp.json")) {
            Ok(v) => version_of(&v) + 1,
            Err(_) => 1,
        };
        let timestamp = json!({
            "_type": "timestamp",
            "spec_version": SPEC_VERSION,
            "version": version,
            "expires": expiry(now, self.expiries.timestamp),
            "meta": {"snapshot.json": {"version": snapshot_version}},
        });
        let keys = self.role_keys("timestamp")?;
        let refs: Vec<&TufKey> = keys.iter().collect();
        self.write_metadata("timestamp", &sign_metadata(&timestamp, &refs)?, false)
    }

    /// Adds a release archive as a target named `target_path` (default
    /// `NAME-VERSION.tar.gz`) with custom fields `name` and `version` from its
    /// manifest, and publishes new targets, snapshot and timestamp.
    pub fn add_target(&self, archive: &Path, target_path: Option<&str>, now: jiff::Timestamp) -> Result<String> {
        let info = read_archive_manifest(archive, &ArchiveLimits::default())?;
        let (hash, length) = hash_file(archive)?;
        let path = target_path.map(str::to_owned).unwrap_or_else(|| info.target_path());
        if path.is_empty() || path.starts_with('/') || path.split('/').any(|c| c == ".." || c.is_empty()) {
            return Err(AdmissionError::Publish(format!("bad target path {path:?}")));
        }
        let stored = match path.rsplit_once('/') {
            Some((dir, name)) => self.repo.join("targets").join(dir).join(format!("{hash}.{name}")),
            None => self.repo.join("targets").join(format!("{hash}.{path}")),
        };
        if let Some(dir) = stored.parent() {
            fs::create_dir_all(dir).map_err(|e| AdmissionError::io(format!("creating {}", dir.display()), e))?;
        }
        fs::copy(archive, &stored).map_err(|e| AdmissionError::io(format!("copying to {}", stored.display()), e))?;
        let mut targets = self.current_signed("targets")?;
        targets["targets"][&path] = json!({
            "length": length,
            "hashes": {"sha256": hash.to_hex()},
            "custom": {"name": info.name, "version": info.version},
        });
        self.publish_targets(targets, now)?;
        Ok(path)
    }

    /// Applies `edit` to the current targets payload and publishes it (new targets,
    /// snapshot and timestamp versions): the hook for edits the CLI has no verb for.
    pub fn republish_targets(&self, edit: impl FnOnce(&mut Value), now: jiff::Timestamp) -> Result<()> {
        let mut targets = self.current_signed("targets")?;
        edit(&mut targets);
        self.publish_targets(targets, now)
    }

    /// Re-signs with fresh expiry: `role` "timestamp" re-issues only the timestamp,
    /// "snapshot" snapshot and timestamp, anything else targets, snapshot and
    /// timestamp.
    pub fn sign(&self, role: &str, now: jiff::Timestamp) -> Result<()> {
        match role {
            "timestamp" => self.publish_timestamp(now),
            "snapshot" => self.publish_snapshot(now),
            "targets" => self.publish_targets(self.current_signed("targets")?, now),
            other => Err(AdmissionError::Publish(format!("cannot re-sign role {other:?}"))),
        }
    }

    /// Replaces `role`'s keys with `count` fresh ones and threshold `threshold`,
    /// publishing root N+1 signed by both the old and the new root keys (so hosts
    /// pinned to the old root follow), then re-signs what the new keys now cover.
    pub fn rotate(&self, role: &str, count: usize, threshold: usize, now: jiff::Timestamp) -> Result<()> {
        if !TOP_LEVEL_ROLES.contains(&role) {
            return Err(AdmissionError::Publish(format!("unknown role {role:?}")));
        }
        if threshold == 0 || threshold > count {
            return Err(AdmissionError::Publish("threshold must be 1..=key count".into()));
        }
        let old_root_keys = self.role_keys("root")?;
        let mut root = self.current_signed("root")?;
        let old_version = root["version"].as_u64().unwrap_or(0);
        let new_keys: Vec<TufKey> = (0..count).map(|_| TufKey::generate()).collect();
        root["roles"][role] = json!({
            "keyids": new_keys.iter().map(TufKey::key_id).collect::<Vec<_>>(),
            "threshold": threshold,
        });
        for k in &new_keys {
            root["keys"][k.key_id()] = k.public_json();
        }
        // Drop keys no role references any more.
        let used: Vec<String> = TOP_LEVEL_ROLES
            .iter()
            .flat_map(|r| {
                root["roles"][*r]["keyids"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect::<Vec<_>>())
                    .unwrap_or_default()
            })
            .collect();
        if let Some(keys) = root["keys"].as_object_mut() {
            keys.retain(|id, _| used.contains(id));
        }
        root["version"] = json!(old_version + 1);
        root["expires"] = json!(expiry(now, self.expiries.root));
        let mut signers: Vec<&TufKey> = old_root_keys.iter().collect();
        if role == "root" {
            signers.extend(new_keys.iter());
        }
        let envelope = sign_metadata(&root, &signers)?;
        // Keep the retired keys beside the new ones, named by the root that retired them.
        let retired = self.keys.join(format!("{role}.json"));
        let backup = self.keys.join(format!("{role}.retired-v{old_version}.json"));
        fs::copy(&retired, &backup).map_err(|e| AdmissionError::io(format!("backing up {}", retired.display()), e))?;
        self.save_role_keys(role, &new_keys)?;
        self.write_metadata("root", &envelope, true)?;
        match role {
            "targets" => self.publish_targets(self.current_signed("targets")?, now),
            "snapshot" => self.publish_snapshot(now),
            "timestamp" => self.publish_timestamp(now),
            _ => Ok(()),
        }
    }
}
