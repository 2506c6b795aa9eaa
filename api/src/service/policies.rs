//! The deployer's policies of the service: a default and one per release name
//! (`[policies] NAME = "FILE"`), reloaded without a restart (`POST /v1/policies/reload` or
//! SIGHUP). A reload reads every file first and changes nothing if any is wrong; then each
//! release whose policy changed has its germline stopped (after the call it is running, if
//! any), so its next call starts one under the new policy. Releases whose policy did not
//! change keep running.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use germline_executor::policy::Policy;
use serde::Serialize;
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

/// Without a configured policy: nothing labelled, the agent is the only consumer.
pub const DEFAULT_POLICY: &str = "tags = []\n[consumers.agent]\nclearance = []\n";

/// One loaded policy and where it came from.
#[derive(Clone)]
pub struct Loaded {
    /// The file (`None`: the built-in default).
    pub path: Option<PathBuf>,
    /// SHA-256 of the text it was parsed from, as hex: what a reload compares.
    pub digest: String,
    /// The policy, with the service's pool override applied.
    pub policy: Arc<Policy>,
}

/// The default policy and the per-release ones.
#[derive(Clone)]
pub struct PolicySet {
    default: Loaded,
    by_name: BTreeMap<String, Loaded>,
}

/// What `GET /v1/policies` and a reload show: each policy's file and digest.
#[derive(Serialize, ToSchema)]
pub struct PoliciesView {
    /// The default policy (for releases without one of their own).
    pub default: PolicyView,
    /// Per release name.
    pub releases: BTreeMap<String, PolicyView>,
}

/// One policy's origin.
#[derive(Serialize, ToSchema)]
pub struct PolicyView {
    /// Its file (null: the built-in default, nothing labelled).
    pub path: Option<String>,
    /// SHA-256 of its text.
    pub sha256: String,
}

fn load_one(path: Option<&Path>, pool: Option<usize>) -> anyhow::Result<Loaded> {
    let text = match path {
        Some(p) => std::fs::read_to_string(p).with_context(|| format!("policy {}", p.display()))?,
        None => DEFAULT_POLICY.to_owned(),
    };
    let mut policy = Policy::parse(&text).with_context(|| match path {
        Some(p) => format!("policy {}", p.display()),
        None => "the built-in policy".into(),
    })?;
    if let Some(n) = pool {
        policy.limits.pool = n;
    }
    Ok(Loaded {
        path: path.map(Path::to_path_buf),
        digest: hex::encode(Sha256::digest(text.as_bytes())),
        policy: Arc::new(policy),
    })
}

impl PolicySet {
    /// Reads every policy file; fails on the first that is missing or invalid.
    pub fn load(
        default: Option<&Path>,
        by_name: &BTreeMap<String, PathBuf>,
        pool: Option<usize>,
    ) -> anyhow::Result<PolicySet> {
        let default = load_one(default, pool)?;
        let mut map = BTreeMap::new();
        for (name, path) in by_name {
            map.insert(name.clone(), load_one(Some(path), pool).with_context(|| format!("release {name}"))?);
        }
        Ok(PolicySet { default, by_name: map })
    }

    /// The policy release `name` runs under.
    pub fn for_release(&self, name: &str) -> &Loaded {
        self.by_name.get(name).unwrap_or(&self.default)
    }

    /// Whether germlines bind a resident root (SECURITY.md, "Resident root"): `on` or `off`
    /// under the default policy, then each release whose own policy chose otherwise.
    pub fn resident_root(&self) -> String {
        let word = |l: &Loaded| if l.policy.sandbox.resident_root { "on" } else { "off" };
        let mut text = format!("{} by default", word(&self.default));
        if !self.default.policy.sandbox.resident_root {
            text.push_str(" (page-cache residency and negative dentries are channels between copies)");
        }
        let differ: Vec<String> = self
            .by_name
            .iter()
            .filter(|(_, l)| l.policy.sandbox.resident_root != self.default.policy.sandbox.resident_root)
            .map(|(name, l)| format!("{name} {}", word(l)))
            .collect();
        if !differ.is_empty() {
            text.push_str(&format!("; {}", differ.join(", ")));
        }
        text
    }

    /// Files and digests.
    pub fn view(&self) -> PoliciesView {
        let v = |l: &Loaded| PolicyView {
            path: l.path.as_ref().map(|p| p.display().to_string()),
            sha256: l.digest.clone(),
        };
        PoliciesView {
            default: v(&self.default),
            releases: self.by_name.iter().map(|(n, l)| (n.clone(), v(l))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_gets_its_own_policy_or_the_default_and_a_bad_file_fails_the_load() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("own.toml");
        std::fs::write(&own, "tags = [\"hr\"]\n[consumers.agent]\nclearance = [\"hr\"]\n").unwrap();
        let set = PolicySet::load(None, &BTreeMap::from([("mixer".to_string(), own.clone())]), Some(0)).unwrap();
        assert_eq!(set.for_release("mixer").path.as_deref(), Some(own.as_path()));
        assert!(set.for_release("other").path.is_none());
        assert_ne!(set.for_release("mixer").digest, set.for_release("other").digest);
        assert_eq!(set.for_release("mixer").policy.limits.pool, 0, "the service's pool override applies");
        let off = dir.path().join("off.toml");
        std::fs::write(&off, "tags = []\n[consumers.agent]\nclearance = []\n[sandbox]\nresident_root = false\n")
            .unwrap();
        let on = dir.path().join("on.toml");
        std::fs::write(&on, "tags = []\n[consumers.agent]\nclearance = []\n[sandbox]\nresident_root = true\n").unwrap();
        let set = PolicySet::load(
            Some(&on),
            &BTreeMap::from([("plain".to_string(), off.clone()), ("same".to_string(), on.clone())]),
            None,
        )
        .unwrap();
        assert_eq!(set.resident_root(), "on by default; plain off");
        let set = PolicySet::load(Some(&off), &BTreeMap::new(), None).unwrap();
        assert!(set.resident_root().starts_with("off by default (page-cache"), "{}", set.resident_root());
        std::fs::write(&own, "tags = [\"hr\"]\nnot toml at all").unwrap();
        let err = PolicySet::load(None, &BTreeMap::from([("mixer".to_string(), own.clone())]), None).err().unwrap();
        assert!(format!("{err:#}").contains("release mixer"), "{err:#}");
    }
}
