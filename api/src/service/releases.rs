//! The admitted releases of this host and their started germlines: calls to different
//! releases run side by side, and so do calls to one release, each on a germline of its
//! own (up to the policy's `limits.lanes`, see `germline_executor::lanes`); past that
//! they queue.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use germline_admission::{AdmittedRelease, ReleaseStore};
use germline_executor::germline::PythonRuntime;
use germline_executor::lanes::{Grow, Lanes, Taken as LaneTaken};
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_ledger::Ledger;
use germline_model::ReleaseHash;

use super::metrics::{self, Metrics};
use germline_host::Host;

/// Where a release's germline stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GermlineStatus {
    /// Not started yet (it starts at service start, on admission or on the first call).
    NotStarted,
    /// Started and passed G1–G3.
    Running,
    /// Failed to start or failed G1–G3; calls are refused with this reason.
    Refused(String),
}

/// One admitted release.
pub struct ReleaseSlot {
    /// Its identity.
    pub hash: ReleaseHash,
    /// Manifest name.
    pub name: String,
    /// Manifest version.
    pub version: String,
    /// When it was admitted (RFC 3339), if recorded.
    pub admitted_at: Option<String>,
    dir: PathBuf,
    status: Mutex<GermlineStatus>,
    lanes: Arc<Lanes<Host>>,
    /// Digest of the policy its germline was started (or refused) under.
    policy_digest: Mutex<Option<String>>,
    /// Verifies the triggers of its calls off their lanes (shared by its lanes).
    verifier: Mutex<Option<Arc<germline_host::Verifier>>>,
}

impl ReleaseSlot {
    /// Current germline status (never waits for a running call).
    pub fn status(&self) -> GermlineStatus {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The release's directory in the store.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn set_status(&self, s: GermlineStatus) {
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }
}

/// What a germline needs to start.
#[derive(Clone)]
pub struct StartParams {
    /// Runtime kind.
    pub runtime: RuntimeKind,
    /// The deployer's policies (a default and per release name), swapped by a reload.
    pub policies: Arc<RwLock<super::policies::PolicySet>>,
    /// The tool host's interpreter and shim.
    pub python: PythonRuntime,
    /// Shared ledger.
    pub ledger: Arc<Ledger>,
    /// Data directory (trigger log, witnesses).
    pub data_dir: PathBuf,
    /// Where germline refusals are counted.
    pub metrics: Arc<Metrics>,
}

/// All admitted releases.
pub struct Releases {
    store: ReleaseStore,
    map: RwLock<BTreeMap<ReleaseHash, Arc<ReleaseSlot>>>,
    params: StartParams,
}

#[derive(serde::Deserialize)]
struct AdmissionRecord {
    hash: String,
    name: String,
    version: String,
    admitted_at: Option<String>,
}

impl Releases {
    /// Opens the store and lists what it admitted earlier.
    pub fn open(store_dir: &Path, params: StartParams) -> anyhow::Result<Releases> {
        let store = ReleaseStore::open(store_dir)?;
        let releases = Releases { store, map: RwLock::new(BTreeMap::new()), params };
        let admitted = store_dir.join("admitted");
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&admitted)?.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let record = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<AdmissionRecord>(&b).ok())
                .and_then(|r| Some((r.hash.parse::<ReleaseHash>().ok()?, r)));
            match record {
                Some((hash, r)) if releases.store.is_admitted(&hash) => found.push((hash, r)),
                _ => tracing::warn!(record = %path.display(), "skipping an unreadable admission record"),
            }
        }
        for (hash, r) in found {
            releases.insert(hash, r.name, r.version, r.admitted_at);
        }
        Ok(releases)
    }

    /// The store admissions go to.
    pub fn store(&self) -> &ReleaseStore {
        &self.store
    }

    fn insert(
        &self,
        hash: ReleaseHash,
        name: String,
        version: String,
        admitted_at: Option<String>,
    ) -> Arc<ReleaseSlot> {
        let slot = Arc::new(ReleaseSlot {
            hash,
            name,
            version,
            admitted_at,
            dir: self.store.release_dir(&hash),
            status: Mutex::new(GermlineStatus::NotStarted),
            lanes: Arc::default(),
            policy_digest: Mutex::new(None),
            verifier: Mutex::new(None),
        });
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        // A re-admission of the same bytes keeps the running germline.
        map.entry(hash).or_insert(slot).clone()
    }

    /// Records a fresh admission.
    pub fn admitted(&self, a: &AdmittedRelease) -> Arc<ReleaseSlot> {
        let now = germline_admission::Timestamp::now().to_string();
        self.insert(a.hash, a.info.name.clone(), a.info.version.clone(), Some(now))
    }

    /// One release.
    pub fn get(&self, hash: &ReleaseHash) -> Option<Arc<ReleaseSlot>> {
        self.map.read().unwrap_or_else(|p| p.into_inner()).get(hash).cloned()
    }

    /// Every release, by hash.
    pub fn all(&self) -> Vec<Arc<ReleaseSlot>> {
        self.map.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// Runs `f` on a started germline of the release (a free lane; the first one started
    /// here if none runs; waits while every lane is busy). Blocks: call from a blocking
    /// thread. `Err` is the refusal reason.
    pub fn with_host<T>(&self, slot: &ReleaseSlot, f: impl FnOnce(&mut Host) -> T) -> Result<T, String> {
        if let GermlineStatus::Refused(why) = slot.status() {
            return Err(why);
        }
        let mut lane = match slot.lanes.take() {
            LaneTaken::Lane(lane) => lane,
            LaneTaken::First(first) => {
                // Refused while this call waited for the start before it.
                if let GermlineStatus::Refused(why) = slot.status() {
                    return Err(why);
                }
                let (host, max, grow) = self.start(slot)?;
                first.started(host, max, grow)
            }
        };
        Ok(f(&mut lane))
    }

    /// Starts the germline of `slot` if it is not running (blocking). `Err` is the refusal.
    pub fn ensure_started(&self, slot: &ReleaseSlot) -> Result<(), String> {
        self.with_host(slot, |_| ())
    }

    /// Starts the release's first germline; with it, how many it may run on and how to
    /// start the others.
    fn start(&self, slot: &ReleaseSlot) -> Result<(Host, usize, Option<Grow<Host>>), String> {
        let p = &self.params;
        let loaded = p.policies.read().unwrap_or_else(|e| e.into_inner()).for_release(&slot.name).clone();
        *slot.policy_digest.lock().unwrap_or_else(|e| e.into_inner()) = Some(loaded.digest.clone());
        let started = Runtime::start(p.runtime, &slot.dir, (*loaded.policy).clone(), p.python.clone());
        match started {
            Ok(mut rt) => {
                if let Runtime::Germline(g) = &mut rt {
                    g.release = slot.hash;
                }
                rt.set_trigger_log(p.data_dir.join("triggers.jsonl"));
                slot.set_status(GermlineStatus::Running);
                tracing::info!(release = %slot.hash, name = %slot.name, "germline started");
                let host = match Host::new(rt, Some(p.ledger.clone()), p.data_dir.clone()) {
                    Ok(h) => h,
                    Err(e) => {
                        let why = format!("release {} refused at germline start: {e:#}", slot.hash);
                        tracing::warn!(release = %slot.hash, "{why}");
                        slot.set_status(GermlineStatus::Refused(why.clone()));
                        return Err(why);
                    }
                };
                // Witnesses land off the lane, after the call is answered: counted then.
                let verifier = host.verifier().cloned();
                if let Some(v) = &verifier {
                    let (m, labels) = (p.metrics.clone(), metrics::release(&slot.hash));
                    v.on_verified(Arc::new(move |done: &germline_host::Verified| {
                        m.witnesses.get_or_create(&labels).inc_by(done.witnesses.len() as u64);
                        if done.newly_suppressed {
                            m.suppressions.get_or_create(&labels).inc();
                        }
                    }));
                }
                *slot.verifier.lock().unwrap_or_else(|e| e.into_inner()) = verifier.clone();
                // The others are made like this one (release id and trigger log set above)
                // and share its verifier.
                let grow: Option<Grow<Host>> = host.rt.lane_maker().map(|make| {
                    let (ledger, data_dir) = (p.ledger.clone(), p.data_dir.clone());
                    Arc::new(move || {
                        Ok(Host::new(make()?, Some(ledger.clone()), data_dir.clone())
                            .map_err(|e| format!("{e:#}"))?
                            .with_verifier(verifier.clone()))
                    }) as Grow<Host>
                });
                Ok((host, loaded.policy.limits.lanes, grow))
            }
            Err(e) => {
                let why = format!("release {} refused at germline start: {e}", slot.hash);
                tracing::warn!(release = %slot.hash, "{why}");
                slot.set_status(GermlineStatus::Refused(why.clone()));
                p.metrics.germline_refusals.get_or_create(&metrics::release(&slot.hash)).inc();
                Err(why)
            }
        }
    }

    /// Swaps in `set` and stops the germlines of every release whose policy changed (a
    /// germline running a call stops when the call ends): its next call starts one under
    /// the new policy. A release
    /// refused at start under its old policy gets another start. Returns those releases.
    pub fn reload(&self, set: super::policies::PolicySet) -> Vec<ReleaseHash> {
        *self.params.policies.write().unwrap_or_else(|e| e.into_inner()) = set.clone();
        let mut restarted = Vec::new();
        for slot in self.all() {
            let want = set.for_release(&slot.name).digest.clone();
            let mut digest = slot.policy_digest.lock().unwrap_or_else(|e| e.into_inner());
            if digest.as_ref().is_none_or(|d| *d == want) {
                continue;
            }
            slot.lanes.clear();
            *digest = None;
            slot.set_status(GermlineStatus::NotStarted);
            tracing::info!(release = %slot.hash, name = %slot.name, "policy changed: the germline restarts at the next call");
            restarted.push(slot.hash);
        }
        restarted
    }

    /// Whether germlines bind a resident root, by policy ([`super::policies::PolicySet::resident_root`]).
    pub fn resident_root(&self) -> String {
        self.params.policies.read().unwrap_or_else(|e| e.into_inner()).resident_root()
    }

    /// The policies in force.
    pub fn policies_view(&self) -> super::policies::PoliciesView {
        self.params.policies.read().unwrap_or_else(|e| e.into_inner()).view()
    }

    /// Stops every germline (kills its processes) so nothing outlives the service, after
    /// giving trigger verifications still running up to `grace` to record their witnesses
    /// (a verification cut short leaves its trigger in the trigger log, unwitnessed).
    pub fn stop_all(&self, grace: std::time::Duration) {
        let until = std::time::Instant::now() + grace;
        for slot in self.all() {
            let verifier = slot.verifier.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(v) = verifier {
                if !v.wait_idle(Some(until.saturating_duration_since(std::time::Instant::now()))) {
                    tracing::warn!(release = %slot.hash, "stopping with a trigger verification unfinished (its trigger stays in the trigger log)");
                }
            }
            // A call past the grace period keeps its germline; the process exit ends it.
            slot.lanes.clear();
        }
    }
}
