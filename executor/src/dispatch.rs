//! Formation-consistent dispatch (DESIGN §8): a host of several admitted releases per
//! name, the ordered lifecycle that says which one new formations use, formations bound
//! to what the caller saw, and the final-hop fence in front of every formed call.
//!
//! Ordering: every lifecycle change takes the host's lifecycle lock for writing; a
//! dispatch holds it for reading from the fence check until its copies have run, so no
//! rollout, rollback or retirement slips between the check and the fork. The decisions
//! themselves are `germline_model::final_hop_fence` and the lifecycle rules; the records
//! go to a [`FormationLog`] (the ledger in `germline serve` and `germline eval fcd`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use germline_model::{
    canonical_json, effect_fits, final_hop_fence, CapturedSuccessor, DispatchPolicy, DispatchRecord, FcdAudit,
    FcdRecord, FenceGrant, FormationEntry, FormationLog, FormationRecord, FormationSnapshot, Label, Lifecycle,
    LifecycleAction, ReleaseHash, ReleaseName, Sha256Digest, SnapshotEntry,
};
use ring::hmac;
use serde_json::Value;

use crate::call::{release_dir_hash, CallOutcome, CallRequest};
use crate::germline::PythonRuntime;
use crate::lanes::{Lanes, Taken as LaneTaken};
use crate::manifest::Manifest;
use crate::policy::Policy;
use crate::profile::{summarize, Profile, Registration};
use crate::runtime::{Runtime, RuntimeKind};
use crate::ExecutorError;

/// One admitted release on the host.
pub struct HostedRelease {
    /// Release name.
    pub name: ReleaseName,
    /// Version.
    pub version: String,
    /// Release hash (of its directory, as admitted).
    pub release: ReleaseHash,
    /// Its directory.
    pub dir: PathBuf,
    /// Its family profile's verdict (`None`: no reviewed profile for the family).
    pub registration: Option<Registration>,
}

impl HostedRelease {
    fn effect(&self, tool: &str, arguments: &serde_json::Map<String, Value>) -> Option<(Vec<String>, Sha256Digest)> {
        match &self.registration {
            Some(Registration::Registered(s)) => s.effect(tool, arguments).map(|e| (e, s.digest())),
            _ => None,
        }
    }

    /// `name version (hash prefix)`, for messages.
    pub fn label(&self) -> String {
        format!("{} {} ({})", self.name, self.version, short(&self.release))
    }
}

fn short(r: &ReleaseHash) -> String {
    r.to_hex()[..12].to_owned()
}

/// The fence a [`ReleaseRunner`] checks right before a runtime forks a call's copies,
/// given that runtime's own release hash ([`Runtime::release`]; `None` for runtimes that
/// compute none, which are then taken to be the release they were started for).
pub type Fence<'a> = dyn FnMut(Option<ReleaseHash>) -> Result<FenceGrant, ExecutorError> + 'a;

/// What a [`ReleaseRunner`] answers for a call: its outcome, or why it did not run.
pub type RunResult = Result<CallOutcome, ExecutorError>;

/// Owns the releases' runtimes: lists tools and runs calls for the host. `run` must call
/// `fence` with the release of the runtime that will run the call, immediately before
/// `Runtime::call`, and run nothing when it fails.
pub trait ReleaseRunner: Send + Sync {
    /// `tools/list` of `release` and its label: empty from a data-free copy, the start-up
    /// data's from a copy holding it (see [`GermlineRuntime::list_tools_labelled`]).
    ///
    /// [`GermlineRuntime::list_tools_labelled`]: crate::call::GermlineRuntime::list_tools_labelled
    fn list_tools(&self, release: &HostedRelease) -> Result<(Value, Label), ExecutorError>;
    /// Runs `req` on `release` behind `fence`.
    fn run(&self, release: &HostedRelease, req: &CallRequest, fence: &mut Fence<'_>) -> RunResult;
    /// `release` was retired: stop its runtime.
    fn stop(&self, release: &HostedRelease);
}

/// A [`ReleaseRunner`] owning the runtimes of each release: a first one started on first
/// use, more beside it while calls to the release overlap (up to `limits.lanes`, see
/// [`crate::lanes`]).
pub struct LocalRunner {
    kind: RuntimeKind,
    policy: Policy,
    python: PythonRuntime,
    runtimes: Mutex<BTreeMap<ReleaseHash, Arc<Lanes<Runtime>>>>,
}

impl LocalRunner {
    /// Releases run under `kind` with `policy`.
    pub fn new(kind: RuntimeKind, policy: Policy, python: PythonRuntime) -> LocalRunner {
        LocalRunner { kind, policy, python, runtimes: Mutex::new(BTreeMap::new()) }
    }

    fn with_runtime<T>(
        &self,
        hosted: &HostedRelease,
        f: impl FnOnce(&mut Runtime) -> Result<T, ExecutorError>,
    ) -> Result<T, ExecutorError> {
        let lanes = lock(&self.runtimes).entry(hosted.release).or_default().clone();
        let mut lane = match lanes.take() {
            LaneTaken::Lane(lane) => lane,
            LaneTaken::First(first) => {
                let rt = Runtime::start(self.kind, &hosted.dir, self.policy.clone(), self.python.clone())?;
                let grow = rt.lane_maker();
                first.started(rt, self.policy.limits.lanes, grow)
            }
        };
        f(&mut lane)
    }
}

impl ReleaseRunner for LocalRunner {
    fn list_tools(&self, release: &HostedRelease) -> Result<(Value, Label), ExecutorError> {
        self.with_runtime(release, |rt| Ok((rt.list_tools()?, Label::empty())))
    }

    fn run(&self, release: &HostedRelease, req: &CallRequest, fence: &mut Fence<'_>) -> RunResult {
        self.with_runtime(release, |rt| {
            fence(rt.release())?;
            Ok(rt.call(req))
        })
    }

    fn stop(&self, release: &HostedRelease) {
        let lanes = lock(&self.runtimes).remove(&release.release);
        if let Some(lanes) = lanes {
            lanes.clear();
        }
    }
}

/// A formed call ready to dispatch: its id and record.
pub type Formation = FormationEntry;

/// An MCP session: every call in it is formed against the snapshot it saw at `tools/list`.
#[derive(Clone, Debug)]
pub struct Session {
    /// What the session saw.
    pub snapshot: FormationSnapshot,
    /// The snapshot's id, by which a session names what it saw.
    pub id: Sha256Digest,
    /// The log index of the snapshot's entry.
    pub entry: u64,
}

/// Where a `tools/list` result's `_meta` names the snapshot it made (its id and log
/// entry), and where a `tools/call`'s `_meta` may name the snapshot its session saw (a
/// client resuming after a reconnect).
pub const SNAPSHOT_META_KEY: &str = "dev.germline/snapshot";

impl Session {
    /// Names the snapshot in a `tools/list` result's `_meta` (a `_meta` that is not an
    /// object is kept inside the one made, as for labels).
    pub fn attach_to(&self, result: &mut Value) {
        let Some(obj) = result.as_object_mut() else { return };
        let meta = obj.entry("_meta").or_insert_with(|| serde_json::json!({}));
        if !meta.is_object() {
            let inner = std::mem::take(meta);
            *meta = serde_json::json!({ crate::call::RELEASE_META_KEY: inner });
        }
        if let Some(m) = meta.as_object_mut() {
            m.insert(SNAPSHOT_META_KEY.to_owned(), serde_json::json!({"id": self.id, "entry": self.entry}));
        }
    }
}

/// The snapshot a `tools/call`'s params name in `_meta` (`{"id": HEX}` or `HEX`), if any.
pub fn named_snapshot(params: &Value) -> Result<Option<Sha256Digest>, String> {
    let Some(named) = params.get("_meta").and_then(|m| m.get(SNAPSHOT_META_KEY)) else { return Ok(None) };
    let id = named.get("id").unwrap_or(named);
    id.as_str()
        .and_then(|h| h.parse().ok())
        .map(Some)
        .ok_or_else(|| format!("_meta[{SNAPSHOT_META_KEY:?}] must name a snapshot id (64 hex digits)"))
}

/// The tool name and object arguments of a `tools/call`'s params.
pub fn call_params(params: &Value) -> Result<(String, serde_json::Map<String, Value>), &'static str> {
    let name = params.get("name").and_then(Value::as_str).ok_or("tools/call needs a tool name")?;
    match params.get("arguments") {
        None | Some(Value::Null) => Ok((name.to_owned(), serde_json::Map::new())),
        Some(Value::Object(m)) => Ok((name.to_owned(), m.clone())),
        Some(_) => Err("arguments must be an object"),
    }
}

struct HostState {
    lifecycles: BTreeMap<ReleaseName, Lifecycle>,
    releases: BTreeMap<ReleaseHash, Arc<HostedRelease>>,
}

/// The formation-consistent dispatch host.
pub struct FormationHost {
    log: Arc<dyn FormationLog>,
    runner: Arc<dyn ReleaseRunner>,
    python: PythonRuntime,
    dispatch_policy: Mutex<DispatchPolicy>,
    state: RwLock<HostState>,
    formations: Mutex<BTreeMap<Sha256Digest, u64>>,
    snapshots: Mutex<BTreeMap<Sha256Digest, u64>>,
    pending: Mutex<BTreeMap<Sha256Digest, CallRequest>>,
    continuations: Mutex<Option<PathBuf>>,
    /// Formation id → log index of its dispatch record: a formation runs at most once.
    dispatched: Mutex<BTreeMap<Sha256Digest, u64>>,
    fence_off: std::sync::atomic::AtomicBool,
    /// Seals what a labelled tool list named before it is logged (snapshots, formed tool
    /// names): fresh for each process and never written, so nothing on disk opens it.
    seal_key: hmac::Key,
    /// The labelled snapshots this process listed, unsealed, by recorded id.
    unsealed: Mutex<BTreeMap<Sha256Digest, FormationSnapshot>>,
}

impl FormationHost {
    /// A host over `log`: lifecycles, snapshots, formations and dispatch records already in
    /// the log are replayed (and checked), so a formation dispatched before a restart is
    /// refused after it; release directories are attached with [`FormationHost::attach`].
    pub fn open(
        log: Arc<dyn FormationLog>,
        kind: RuntimeKind,
        policy: Policy,
        python: PythonRuntime,
    ) -> Result<FormationHost, ExecutorError> {
        let runner = Arc::new(LocalRunner::new(kind, policy, python.clone()));
        Self::open_with(log, runner, python)
    }

    /// [`FormationHost::open`] with the runtimes owned by `runner`; `python` runs the
    /// profile analyses.
    pub fn open_with(
        log: Arc<dyn FormationLog>,
        runner: Arc<dyn ReleaseRunner>,
        python: PythonRuntime,
    ) -> Result<FormationHost, ExecutorError> {
        let mut audit = FcdAudit::default();
        for (i, r) in log.replay().map_err(ExecutorError::Formation)? {
            audit.check(i, &r.release(), &r).map_err(ExecutorError::Formation)?;
        }
        Ok(FormationHost {
            log,
            runner,
            python,
            dispatch_policy: Mutex::new(DispatchPolicy::default()),
            state: RwLock::new(HostState { lifecycles: audit.lifecycles, releases: BTreeMap::new() }),
            formations: Mutex::new(audit.formations),
            snapshots: Mutex::new(audit.snapshots),
            pending: Mutex::new(BTreeMap::new()),
            continuations: Mutex::new(None),
            dispatched: Mutex::new(audit.dispatches),
            fence_off: std::sync::atomic::AtomicBool::new(false),
            seal_key: hmac::Key::new(hmac::HMAC_SHA256, &fresh_key()?),
            unsealed: Mutex::new(BTreeMap::new()),
        })
    }

    /// Keeps pending calls (their arguments and items) in `dir` too, one owner-only file
    /// per formation, so they can be dispatched after a restart. The files are not
    /// trusted: a call read back must bind to its record's argument digest in the log.
    pub fn keep_pending_in(&self, dir: &Path) -> Result<(), ExecutorError> {
        std::fs::create_dir_all(dir).map_err(ExecutorError::io(format!("creating {}", dir.display())))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(ExecutorError::io(format!("restricting {}", dir.display())))?;
        *lock(&self.continuations) = Some(dir.to_path_buf());
        Ok(())
    }

    /// A call formed from a labelled tool list (`durable` false) is kept in memory only: its
    /// tool name is that list's, and only this process can check it against its record.
    fn store_pending(&self, id: &Sha256Digest, req: &CallRequest, durable: bool) -> Result<(), ExecutorError> {
        lock(&self.pending).insert(*id, req.clone());
        let Some(dir) = lock(&self.continuations).clone().filter(|_| durable) else { return Ok(()) };
        let path = dir.join(format!("{}.json", id.to_hex()));
        let tmp = dir.join(format!(".{}.tmp", id.to_hex()));
        let bytes = serde_json::to_vec(req).map_err(|e| ExecutorError::Formation(e.to_string()))?;
        {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(ExecutorError::io(format!("writing {}", tmp.display())))?;
            f.write_all(&bytes).and_then(|()| f.sync_all()).map_err(ExecutorError::io("writing a pending call"))?;
        }
        std::fs::rename(&tmp, &path).map_err(ExecutorError::io(format!("storing {}", path.display())))
    }

    /// Drops the kept call of a formation that was dispatched (or of a session's call,
    /// formed and dispatched at once): its id is refused from then on by its dispatch
    /// record.
    fn drop_pending(&self, id: &Sha256Digest) {
        lock(&self.pending).remove(id);
        if let Some(dir) = lock(&self.continuations).clone() {
            let _ = std::fs::remove_file(dir.join(format!("{}.json", id.to_hex())));
        }
    }

    fn load_pending(&self, id: &Sha256Digest) -> Option<CallRequest> {
        if let Some(r) = lock(&self.pending).get(id).cloned() {
            return Some(r);
        }
        let dir = lock(&self.continuations).clone()?;
        let bytes = std::fs::read(dir.join(format!("{}.json", id.to_hex()))).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Sets the deployment's dispatch policy for new formations.
    pub fn set_dispatch_policy(&self, p: DispatchPolicy) {
        *lock(&self.dispatch_policy) = p;
    }

    /// Debug builds only, for tests: dispatch without the final-hop fence (the
    /// mechanism-off twin that shows what the fence stops). Release builds ignore it.
    pub fn switch_fence_off(&self) {
        #[cfg(debug_assertions)]
        self.fence_off.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HostState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HostState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    fn hosted_of(
        dir: &Path,
        python: &PythonRuntime,
        hash: Option<ReleaseHash>,
    ) -> Result<HostedRelease, ExecutorError> {
        let manifest = Manifest::load(dir)?;
        let name = ReleaseName::new(&manifest.name)?;
        let release = match hash {
            Some(h) => h,
            None => release_dir_hash(dir)?,
        };
        let registration = match Profile::builtin(name.as_str()) {
            Some(p) => Some(summarize(&p, dir, python)?),
            None => None,
        };
        Ok(HostedRelease { name, version: manifest.version, release, dir: dir.to_path_buf(), registration })
    }

    /// Admits the release in `dir` (recorded in the log; not yet used for new
    /// formations) and returns its hash.
    pub fn admit(&self, dir: &Path) -> Result<ReleaseHash, ExecutorError> {
        self.admit_as(dir, None)
    }

    /// [`FormationHost::admit`] under the hash admission gave the release (the archive's),
    /// or the directory's hash when `None`.
    pub fn admit_as(&self, dir: &Path, hash: Option<ReleaseHash>) -> Result<ReleaseHash, ExecutorError> {
        let hosted = Self::hosted_of(dir, &self.python, hash)?;
        let release = hosted.release;
        let mut st = self.write();
        let l = st.lifecycles.entry(hosted.name.clone()).or_insert_with(|| Lifecycle::new(hosted.name.clone()));
        let ev = l.next(LifecycleAction::Admit { release, version: hosted.version.clone() })?;
        self.log.append_lifecycle(&ev).map_err(ExecutorError::Formation)?;
        l.apply(&ev)?;
        st.releases.insert(release, Arc::new(hosted));
        Ok(release)
    }

    /// Attaches the directory of a release the log already admitted (a reopened host).
    pub fn attach(&self, dir: &Path, hash: Option<ReleaseHash>) -> Result<ReleaseHash, ExecutorError> {
        let hosted = Self::hosted_of(dir, &self.python, hash)?;
        let mut st = self.write();
        let known = st.lifecycles.get(&hosted.name).is_some_and(|l| l.releases.contains_key(&hosted.release));
        if !known {
            return Err(ExecutorError::Lifecycle(format!("{} was never admitted on this host", hosted.label())));
        }
        let release = hosted.release;
        st.releases.insert(release, Arc::new(hosted));
        Ok(release)
    }

    /// The release in `dir` (under `hash`, or its directory's hash), attached when the log
    /// admitted it before, admitted (and recorded) otherwise.
    pub fn register(&self, dir: &Path, hash: Option<ReleaseHash>) -> Result<Arc<HostedRelease>, ExecutorError> {
        let release = match self.attach(dir, hash) {
            Ok(r) => r,
            Err(ExecutorError::Lifecycle(_)) => self.admit_as(dir, hash)?,
            Err(e) => return Err(e),
        };
        self.release(&release).ok_or_else(|| ExecutorError::internal("a registered release is not attached"))
    }

    /// New formations of its name use `release`.
    pub fn promote(&self, release: &ReleaseHash) -> Result<(), ExecutorError> {
        self.change(LifecycleAction::Promote { release: *release })
    }

    /// New formations go back to `release`, promoted before.
    pub fn roll_back(&self, release: &ReleaseHash) -> Result<(), ExecutorError> {
        self.change(LifecycleAction::RollBack { release: *release })
    }

    /// `release` runs nothing any more; its germline is stopped.
    pub fn retire(&self, release: &ReleaseHash) -> Result<(), ExecutorError> {
        self.change(LifecycleAction::Retire { release: *release })
    }

    fn change(&self, action: LifecycleAction) -> Result<(), ExecutorError> {
        let r = action.release();
        let retire = matches!(action, LifecycleAction::Retire { .. });
        let mut st = self.write();
        let hosted = st
            .releases
            .get(&r)
            .cloned()
            .ok_or_else(|| ExecutorError::Lifecycle(format!("release {} is not on this host", short(&r))))?;
        let l = st
            .lifecycles
            .get_mut(&hosted.name)
            .ok_or_else(|| ExecutorError::Lifecycle(format!("{} has no lifecycle", hosted.name)))?;
        let ev = l.next(action)?;
        self.log.append_lifecycle(&ev).map_err(ExecutorError::Formation)?;
        l.apply(&ev)?;
        if retire {
            self.runner.stop(&hosted);
        }
        Ok(())
    }

    /// The lifecycle of `name` as it is now.
    pub fn lifecycle(&self, name: &ReleaseName) -> Option<Lifecycle> {
        self.read().lifecycles.get(name).cloned()
    }

    /// Whether `r` was admitted here and retired since (it runs nothing any more).
    pub fn is_retired(&self, r: &ReleaseHash) -> bool {
        let st = self.read();
        st.releases
            .get(r)
            .and_then(|h| st.lifecycles.get(&h.name))
            .is_some_and(|l| l.releases.get(r).is_some_and(|s| s.retired))
    }

    /// An admitted release by hash.
    pub fn release(&self, r: &ReleaseHash) -> Option<Arc<HostedRelease>> {
        self.read().releases.get(r).cloned()
    }

    /// Answers `tools/list` for `name` from its current release and returns the result
    /// with the formation snapshot it makes, recorded in the log.
    pub fn list_tools(&self, name: &ReleaseName) -> Result<(Value, Session), ExecutorError> {
        let st = self.read();
        let hosted = Self::current(&st, name)?;
        let (tools, label) = self.runner.list_tools(&hosted)?;
        let snapshot =
            FormationSnapshot::of_tools_list(name.clone(), &hosted.version, hosted.release, &tools)?.labelled(label);
        Ok((tools, self.recorded(snapshot)?))
    }

    /// Records what a `tools/list` answer showed as its own log entry (sealed, for a
    /// labelled list), once per distinct snapshot (the same snapshot again names the entry
    /// already there).
    fn recorded(&self, snapshot: FormationSnapshot) -> Result<Session, ExecutorError> {
        let stored = self.as_recorded(&snapshot);
        let id = stored.id();
        let mut snapshots = lock(&self.snapshots);
        let entry = match snapshots.get(&id) {
            Some(i) => *i,
            None => {
                let i = self
                    .log
                    .append(&FcdRecord::Snapshot(SnapshotEntry::new(stored)))
                    .map_err(ExecutorError::Formation)?;
                snapshots.insert(id, i);
                i
            }
        };
        if !snapshot.label.is_empty() {
            lock(&self.unsealed).insert(id, snapshot.clone());
        }
        Ok(Session { snapshot, id, entry })
    }

    /// `snapshot` as the log holds it: a labelled list's tools sealed
    /// ([`FormationSnapshot::as_recorded`]).
    fn as_recorded(&self, snapshot: &FormationSnapshot) -> FormationSnapshot {
        if sealing_switched_off() {
            return snapshot.clone();
        }
        snapshot.as_recorded(|tools| {
            let tools = serde_json::to_value(tools).unwrap_or(Value::Null);
            self.seal(b"germline formation tools\n", canonical_json(&tools).as_bytes())
        })
    }

    /// The tool name a formation records: a name from a labelled list, sealed.
    fn recorded_tool(&self, snapshot: &FormationSnapshot, tool: &str) -> String {
        if snapshot.label.is_empty() || sealing_switched_off() {
            tool.to_owned()
        } else {
            format!("sealed:{}", self.seal(b"germline formation tool\n", tool.as_bytes()))
        }
    }

    fn seal(&self, domain: &[u8], bytes: &[u8]) -> Sha256Digest {
        let mut ctx = hmac::Context::with_key(&self.seal_key);
        ctx.update(domain);
        ctx.update(bytes);
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        Sha256Digest(out)
    }

    /// Opens an MCP session on `name`: its calls bind to the snapshot it sees now.
    pub fn open_session(&self, name: &ReleaseName) -> Result<(Value, Session), ExecutorError> {
        self.list_tools(name)
    }

    /// Resumes a session that names the snapshot it saw (a client reconnecting): the
    /// snapshot is read back from the log and checked against its id. A sealed one (a
    /// labelled list) resumes only in the process that listed it, which holds its names.
    pub fn resume_session(&self, id: &Sha256Digest) -> Result<Session, ExecutorError> {
        let entry = logged(&self.snapshots, "snapshot", id)?;
        let stored = self.log.snapshot_at(entry).map_err(ExecutorError::Formation)?;
        if !stored.is(id) {
            return Err(substituted("snapshot", id));
        }
        let snapshot = match stored.snapshot.sealed {
            None => stored.snapshot,
            Some(_) => lock(&self.unsealed).get(id).cloned().ok_or_else(|| {
                ExecutorError::Formation(format!(
                    "snapshot {} is of a tool list labelled {}, whose names only the process that listed them \
                     holds: list the tools again",
                    id.short(),
                    stored.snapshot.label
                ))
            })?,
        };
        Ok(Session { snapshot, id: *id, entry })
    }

    fn current(st: &HostState, name: &ReleaseName) -> Result<Arc<HostedRelease>, ExecutorError> {
        let l = st.lifecycles.get(name).ok_or_else(|| ExecutorError::Lifecycle(format!("no release named {name}")))?;
        let cur = l.current.ok_or_else(|| ExecutorError::Lifecycle(format!("{name} has no promoted release")))?;
        st.releases.get(&cur).cloned().ok_or_else(|| {
            ExecutorError::Lifecycle(format!("{name}'s current release {} is not attached", short(&cur)))
        })
    }

    /// Forms `req` against `snapshot` under the deployment's dispatch policy: records the
    /// formation (argument-bound, with the successors captured for it) in the log and
    /// keeps the call pending until [`FormationHost::dispatch`].
    pub fn form(&self, snapshot: &FormationSnapshot, req: &CallRequest) -> Result<Formation, ExecutorError> {
        let policy = *lock(&self.dispatch_policy);
        let st = self.read();
        let l = st
            .lifecycles
            .get(&snapshot.name)
            .ok_or_else(|| ExecutorError::Formation(format!("no release named {}", snapshot.name)))?;
        // A session may have seen a release retired since: its calls are still formed on
        // what it saw, and the fence decides where they may run.
        let recorded = self.as_recorded(snapshot);
        let seen = lock(&self.snapshots).contains_key(&recorded.id());
        if l.version(&snapshot.release) != Some(snapshot.version.as_str()) || !(seen || l.is_live(&snapshot.release)) {
            return Err(ExecutorError::Formation(format!(
                "snapshot of {} {} ({}): no tools/list of that release was answered here; list the tools again",
                snapshot.name,
                snapshot.version,
                short(&snapshot.release)
            )));
        }
        if snapshot.sealed.is_some() {
            return Err(ExecutorError::Formation(format!(
                "snapshot of {} {}: a sealed tool list (labelled {}) names no tool; list the tools again",
                snapshot.name, snapshot.version, snapshot.label
            )));
        }
        if !snapshot.tools.contains_key(&req.tool) {
            return Err(ExecutorError::Formation(format!("tool {:?} is not in the snapshot", req.tool)));
        }
        // A source whose directory is not attached here (a session resumed on another
        // host process) has no modeled contract: nothing is captured for the call.
        let contract =
            st.releases.get(&snapshot.release).and_then(|s| s.effect(&req.tool, &req.arguments)).map(|(e, _)| e);
        let mut successors = Vec::new();
        if let (DispatchPolicy::CallSpecific, Some(contract)) = (policy, &contract) {
            for (r, _) in l.releases.iter().filter(|(r, s)| !s.retired && **r != snapshot.release) {
                let Some(h) = st.releases.get(r) else { continue };
                if let Some((effect, summary)) = h.effect(&req.tool, &req.arguments) {
                    if effect_fits(contract, &effect) {
                        successors.push(CapturedSuccessor {
                            release: *r,
                            version: h.version.clone(),
                            summary,
                            effect: effect.join("+"),
                        });
                    }
                }
            }
        }
        let record = FormationRecord {
            tool: self.recorded_tool(snapshot, &req.tool),
            snapshot: recorded,
            arguments: Sha256Digest::of_json(&Value::Object(req.arguments.clone())),
            policy,
            formed_at_ms: now_ms(),
            nonce: fresh_nonce()?,
            epoch: l.epoch,
            contract: contract.map(|c| c.join("+")),
            successors,
        };
        let entry = FormationEntry::new(record);
        self.recorded(snapshot.clone())?;
        self.store_pending(&entry.id, req, snapshot.label.is_empty())?;
        let index = self.log.append_formation(&entry).map_err(ExecutorError::Formation)?;
        lock(&self.formations).insert(entry.id, index);
        Ok(entry)
    }

    /// Runs the formation `id` now, on the release its name is routed to (the current
    /// one), behind the final-hop fence. `req` re-supplies the call (it must bind to the
    /// record's argument digest); `None` takes the pending call kept at formation.
    pub fn dispatch(&self, id: &Sha256Digest, req: Option<&CallRequest>) -> Result<CallOutcome, ExecutorError> {
        let st = self.read();
        self.not_dispatched(id, &lock(&self.dispatched))?;
        let index = logged(&self.formations, "formation", id)?;
        let entry = self.log.formation_at(index).map_err(ExecutorError::Formation)?;
        if !entry.is(id) {
            return Err(substituted("record of formation", id));
        }
        let pending = self.load_pending(id);
        let req = req
            .cloned()
            .or(pending)
            .ok_or_else(|| ExecutorError::Formation(format!("formation {}: the call is not kept here", id.short())))?;
        let record = &entry.record;
        if self.recorded_tool(&record.snapshot, &req.tool) != record.tool
            || !record.binds(&Value::Object(req.arguments.clone()))
        {
            if record.snapshot.sealed.is_some() {
                return Err(ExecutorError::Formation(format!(
                    "formation {}: formed from a tool list labelled {}, whose names only the process that listed \
                     them can check (form it again), or the call's tool or arguments differ",
                    id.short(),
                    record.snapshot.label
                )));
            }
            return Err(ExecutorError::Formation(format!(
                "formation {}: the call's tool or arguments differ from the formed ones (form it again)",
                id.short()
            )));
        }
        let l = st
            .lifecycles
            .get(&record.snapshot.name)
            .ok_or_else(|| ExecutorError::Formation(format!("no release named {}", record.snapshot.name)))?;
        let target = Self::current(&st, &record.snapshot.name)?;
        let fence_off = self.fence_off.load(std::sync::atomic::Ordering::SeqCst);
        let mut fence = |running: Option<ReleaseHash>| {
            let running = running.unwrap_or(target.release);
            let grant =
                if fence_off { FenceGrant::Source } else { final_hop_fence_check(running, &target, id, record, l)? };
            // Durable before the copies are forked: a crash from here on cannot run the
            // formation a second time.
            let mut dispatched = lock(&self.dispatched);
            self.not_dispatched(id, &dispatched)?;
            let d = DispatchRecord {
                formation: *id,
                release: running,
                version: target.version.clone(),
                grant,
                epoch: l.epoch,
                at_ms: now_ms(),
            };
            let at = self.log.append(&FcdRecord::Dispatch(d)).map_err(ExecutorError::Formation)?;
            dispatched.insert(*id, at);
            Ok(grant)
        };
        let outcome = self.runner.run(&target, &req, &mut fence);
        if lock(&self.dispatched).contains_key(id) {
            self.drop_pending(id);
        }
        drop(st);
        outcome
    }

    /// Refuses a formation that was dispatched before (in this process or, by its dispatch
    /// record, before a restart).
    fn not_dispatched(&self, id: &Sha256Digest, dispatched: &BTreeMap<Sha256Digest, u64>) -> Result<(), ExecutorError> {
        match dispatched.get(id) {
            Some(at) => Err(ExecutorError::Formation(format!(
                "formation {} already ran (dispatch recorded at log entry {at}): form the call again",
                id.short()
            ))),
            None => Ok(()),
        }
    }

    /// The log index of formation `id`'s dispatch record, if it was dispatched.
    pub fn dispatch_entry(&self, id: &Sha256Digest) -> Option<u64> {
        lock(&self.dispatched).get(id).copied()
    }

    /// One call of an MCP session: formed against the session's snapshot, dispatched now.
    pub fn session_call(&self, session: &Session, req: &CallRequest) -> Result<CallOutcome, ExecutorError> {
        let f = self.form(&session.snapshot, req)?;
        let outcome = self.dispatch(&f.id, Some(req));
        self.drop_pending(&f.id);
        outcome
    }
}

/// The final-hop fence, checked with the lifecycle held fixed, right before the call's
/// copies are forked from a runtime of release `running` (`hosted` is what the host routed
/// to): that release must be the formation's source, or a successor captured at
/// formation and eligible now. The error names the formation, the release the call would
/// have run on, and why.
pub fn final_hop_fence_check(
    running: ReleaseHash,
    hosted: &HostedRelease,
    id: &Sha256Digest,
    record: &FormationRecord,
    lifecycle: &Lifecycle,
) -> Result<FenceGrant, ExecutorError> {
    let s = &record.snapshot;
    final_hop_fence(record, lifecycle, &running).map_err(|why| {
        ExecutorError::Fence(format!(
            "formation {} (formed on {} {} ({})) would run on {} {} ({}): {why}; nothing ran",
            id.short(),
            s.name,
            s.version,
            short(&s.release),
            hosted.name,
            hosted.version,
            short(&running),
        ))
    })
}

/// The log index of record `id` (a snapshot or formation recorded here).
fn logged(index: &Mutex<BTreeMap<Sha256Digest, u64>>, what: &str, id: &Sha256Digest) -> Result<u64, ExecutorError> {
    lock(index).get(id).copied().ok_or_else(|| ExecutorError::Formation(format!("no {what} {}", id.short())))
}

fn substituted(what: &str, id: &Sha256Digest) -> ExecutorError {
    ExecutorError::Formation(format!(
        "the stored {what} {} does not hash to its id (substituted or altered)",
        id.short()
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Debug builds (tests) may log labelled tool lists unsealed, as before 2026-12-06, with
/// `GERMLINE_TEST_LIST_SEAL_OFF=1`, to show what sealing stops; release builds ignore it.
fn sealing_switched_off() -> bool {
    crate::test_switch("GERMLINE_TEST_LIST_SEAL_OFF")
}

fn fresh_key() -> Result<[u8; 32], ExecutorError> {
    let mut k = [0u8; 32];
    getrandom::fill(&mut k).map_err(|e| ExecutorError::Sandbox(format!("getrandom: {e}")))?;
    Ok(k)
}

fn fresh_nonce() -> Result<String, ExecutorError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| ExecutorError::Sandbox(format!("getrandom: {e}")))?;
    Ok(hex::encode(b))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use germline_model::MemoryFormationLog;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    /// A runner without processes: `run` checks the fence, reports it passed, then holds
    /// the call for `hold` (standing in for forking and running the copies).
    struct SlowRunner {
        entered: Mutex<Option<mpsc::Sender<()>>>,
        hold: Duration,
        finished: Mutex<Option<Instant>>,
    }

    impl ReleaseRunner for SlowRunner {
        fn list_tools(&self, _: &HostedRelease) -> Result<(Value, Label), ExecutorError> {
            Ok((serde_json::json!({"tools": [{"name": "t", "description": "d", "inputSchema": {}}]}), Label::empty()))
        }

        fn run(&self, r: &HostedRelease, _: &CallRequest, fence: &mut Fence<'_>) -> Result<CallOutcome, ExecutorError> {
            fence(Some(r.release))?;
            if let Some(tx) = lock(&self.entered).take() {
                let _ = tx.send(());
            }
            std::thread::sleep(self.hold);
            *lock(&self.finished) = Some(Instant::now());
            Ok(CallOutcome::default())
        }

        fn stop(&self, _: &HostedRelease) {}
    }

    /// A release whose tools only a copy holding hr data could list: one tool, named
    /// after that data.
    struct LabelledRunner;

    const HR_NAME: &str = "GLC-hr-5a17c0ffee";

    impl ReleaseRunner for LabelledRunner {
        fn list_tools(&self, _: &HostedRelease) -> Result<(Value, Label), ExecutorError> {
            let label = Label::parse(["hr"])?;
            Ok((serde_json::json!({"tools": [{"name": HR_NAME, "description": "d", "inputSchema": {}}]}), label))
        }

        fn run(&self, r: &HostedRelease, _: &CallRequest, fence: &mut Fence<'_>) -> Result<CallOutcome, ExecutorError> {
            fence(Some(r.release))?;
            Ok(CallOutcome::default())
        }

        fn stop(&self, _: &HostedRelease) {}
    }

    #[test]
    fn a_labelled_tool_list_is_logged_sealed_and_resumes_only_in_the_process_that_listed_it() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let python = no_python(dir.path());
        let log = Arc::new(MemoryFormationLog::default());
        let rel = release(dir.path(), "1");
        let name = ReleaseName::new("fake").unwrap_or_else(|e| panic!("{e}"));
        let req = CallRequest { tool: HR_NAME.into(), ..Default::default() };
        let logged = |log: &MemoryFormationLog| format!("{:?}", log.replay().unwrap_or_default());
        let (session, pending) = {
            let host = FormationHost::open_with(log.clone(), Arc::new(LabelledRunner), python.clone())
                .unwrap_or_else(|e| panic!("{e}"));
            let a = host.admit(&rel).unwrap_or_else(|e| panic!("{e}"));
            host.promote(&a).unwrap_or_else(|e| panic!("{e}"));
            let (tools, session) = host.open_session(&name).unwrap_or_else(|e| panic!("{e}"));
            // The caller (cleared for the label: the front checks) gets the names.
            assert!(tools.to_string().contains(HR_NAME) && session.snapshot.tools.contains_key(HR_NAME));
            assert_eq!(session.snapshot.label, Label::parse(["hr"]).unwrap_or_else(|e| panic!("{e}")));
            // In this process, the session resumes with its names and its calls run.
            let resumed = host.resume_session(&session.id).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(resumed.snapshot, session.snapshot);
            host.session_call(&resumed, &req).unwrap_or_else(|e| panic!("{e}"));
            let pending = host.form(&session.snapshot, &req).unwrap_or_else(|e| panic!("{e}"));
            // The log holds no name of the list: not in the snapshot, not as a formed tool.
            let text = logged(&log);
            assert!(!text.contains(HR_NAME), "{text}");
            assert!(text.contains("sealed: Some(") && text.contains("\"sealed:"), "{text}");
            // Mechanism off (sealing skipped): the log holds the name.
            let off = MemoryFormationLog::default();
            let unsealed = session.snapshot.clone().labelled(Label::empty());
            off.append(&FcdRecord::Snapshot(SnapshotEntry::new(unsealed))).unwrap_or_else(|e| panic!("{e}"));
            assert!(logged(&off).contains(HR_NAME));
            (session, pending)
        };
        // Another process over the same log: the audit passes, but neither the snapshot nor
        // the pending formation can be opened there.
        let host = FormationHost::open_with(log, Arc::new(LabelledRunner), python).unwrap_or_else(|e| panic!("{e}"));
        host.attach(&rel, None).unwrap_or_else(|e| panic!("{e}"));
        let e = host.resume_session(&session.id).expect_err("sealed elsewhere").to_string();
        assert!(e.contains("list the tools again") && e.contains("{hr}") && !e.contains(HR_NAME), "{e}");
        let e = host.dispatch(&pending.id, Some(&req)).expect_err("sealed elsewhere").to_string();
        assert!(e.contains("form it again") && !e.contains(HR_NAME), "{e}");
        // Listed again, the calls run.
        let (_, again) = host.open_session(&name).unwrap_or_else(|e| panic!("{e}"));
        host.session_call(&again, &req).unwrap_or_else(|e| panic!("{e}"));
    }

    /// These hosts list and run through test runners: no interpreter runs.
    fn no_python(dir: &Path) -> PythonRuntime {
        PythonRuntime {
            python: "/nonexistent".into(),
            shim_dir: dir.into(),
            read_paths: vec![],
            layout: Default::default(),
        }
    }

    fn release(root: &Path, version: &str) -> PathBuf {
        let dir = root.join(version);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let manifest =
            format!("[release]\nname = \"fake\"\nversion = \"{version}\"\nruntime = \"python\"\nmodule = \"m\"\n");
        std::fs::write(dir.join("germline.toml"), manifest).unwrap_or_else(|e| panic!("{e}"));
        dir
    }

    /// Stands in for a host that crashes right after the fence: the copies are never
    /// forked and the call never answers.
    struct CrashingRunner;

    impl ReleaseRunner for CrashingRunner {
        fn list_tools(&self, _: &HostedRelease) -> Result<(Value, Label), ExecutorError> {
            Ok((serde_json::json!({"tools": [{"name": "t", "description": "d", "inputSchema": {}}]}), Label::empty()))
        }

        fn run(&self, r: &HostedRelease, _: &CallRequest, fence: &mut Fence<'_>) -> Result<CallOutcome, ExecutorError> {
            fence(Some(r.release))?;
            Err(ExecutorError::internal("the host stopped before the copies were forked"))
        }

        fn stop(&self, _: &HostedRelease) {}
    }

    #[test]
    fn a_formation_dispatched_before_a_crash_is_refused_after_the_restart() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let python = no_python(dir.path());
        let log = Arc::new(MemoryFormationLog::default());
        let rel = release(dir.path(), "1");
        let req = CallRequest { tool: "t".into(), ..Default::default() };
        let (f, at) = {
            let host = FormationHost::open_with(log.clone(), Arc::new(CrashingRunner), python.clone())
                .unwrap_or_else(|e| panic!("{e}"));
            let a = host.admit(&rel).unwrap_or_else(|e| panic!("{e}"));
            host.promote(&a).unwrap_or_else(|e| panic!("{e}"));
            let name = ReleaseName::new("fake").unwrap_or_else(|e| panic!("{e}"));
            let (_, session) = host.open_session(&name).unwrap_or_else(|e| panic!("{e}"));
            let f = host.form(&session.snapshot, &req).unwrap_or_else(|e| panic!("{e}"));
            assert!(host.dispatch(&f.id, Some(&req)).is_err(), "the host crashed");
            let at = host.dispatch_entry(&f.id).unwrap_or_else(|| panic!("no dispatch record"));
            (f, at)
        };
        let kinds: Vec<&str> = log
            .replay()
            .unwrap_or_default()
            .iter()
            .map(|(_, r)| match r {
                FcdRecord::Snapshot(_) => "snapshot",
                FcdRecord::Formation(_) => "formation",
                FcdRecord::Lifecycle(_) => "lifecycle",
                FcdRecord::Dispatch(_) => "dispatch",
            })
            .collect();
        assert_eq!(kinds, ["lifecycle", "lifecycle", "snapshot", "formation", "dispatch"]);
        let host = FormationHost::open_with(log, Arc::new(CrashingRunner), python).unwrap_or_else(|e| panic!("{e}"));
        host.attach(&rel, None).unwrap_or_else(|e| panic!("{e}"));
        let e = host.dispatch(&f.id, Some(&req)).expect_err("runs at most once").to_string();
        assert!(e.contains("already ran") && e.contains(&format!("log entry {at}")), "{e}");
    }

    #[test]
    fn a_lifecycle_change_waits_for_a_dispatch_between_its_fence_and_its_copies() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (tx, rx) = mpsc::channel();
        let runner = Arc::new(SlowRunner {
            entered: Mutex::new(Some(tx)),
            hold: Duration::from_millis(300),
            finished: Mutex::new(None),
        });
        let python = no_python(dir.path());
        let host = Arc::new(
            FormationHost::open_with(Arc::new(MemoryFormationLog::default()), runner.clone(), python)
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let a = host.admit(&release(dir.path(), "1")).unwrap_or_else(|e| panic!("{e}"));
        host.promote(&a).unwrap_or_else(|e| panic!("{e}"));
        let b = host.admit(&release(dir.path(), "2")).unwrap_or_else(|e| panic!("{e}"));
        let name = ReleaseName::new("fake").unwrap_or_else(|e| panic!("{e}"));
        let (_, session) = host.open_session(&name).unwrap_or_else(|e| panic!("{e}"));
        let req = CallRequest { tool: "t".into(), ..Default::default() };
        let f = host.form(&session.snapshot, &req).unwrap_or_else(|e| panic!("{e}"));
        let h = host.clone();
        let call = std::thread::spawn(move || h.dispatch(&f.id, None).map(|_| ()).map_err(|e| e.to_string()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|e| panic!("the fence passed: {e}"));
        host.promote(&b).unwrap_or_else(|e| panic!("{e}"));
        let promoted = Instant::now();
        let finished = lock(&runner.finished).unwrap_or_else(|| panic!("the call finished before the rollout"));
        assert!(promoted >= finished, "the rollout slipped between the fence and the call");
        assert_eq!(call.join().unwrap_or_else(|_| panic!("dispatch thread")), Ok(()));
        assert_eq!(host.lifecycle(&name).and_then(|l| l.current), Some(b));
    }
}
