//! A germline call end to end: Plan from metadata, one copy per group in order, each
//! holding only its view, results labelled and delivered to the group's consumers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use germline_model::{
    plan_groups, CallRecords, Clearance, ConsumerName, Group, Horizon, HostName, Item, ItemName, Label, Member,
    OutputLabel, Plan, PlanInput, ReleaseHash, Slot, SlotKey, Trigger, TriggerKind, View,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::broker::{serve_copy, CallShared, Channel, CopyJob, CopyResult, EgressEvent, ReplayState};
use crate::cgroup::CgroupLimits;
use crate::confine::{ResourceLimits, SandboxSwitches};
pub use crate::evidence::TwinInputs;
use crate::evidence::{encode_replies, fresh_secret, ItemRecord, TriggerEvidence, EVIDENCE_VERSION};
use crate::germline::{Germline, GermlineSpec, PythonRuntime};
use crate::manifest::Manifest;
use crate::outside::{prepare_copy, CopyFile, FileMeta, ViewMount};
use crate::policy::Policy;
use crate::pool::{CopyPool, Readiness, ReadyCopy, Taken};
use crate::seccomp::SeccompPolicy;
use crate::slots::{SlotGiven, SlotSource, SlotTable};
use crate::ExecutorError;

/// The reverse-DNS key under which a result's `_meta` carries its output label.
pub const LABEL_META_KEY: &str = "dev.germline/label";

/// Where a result's `_meta` keeps a release's own `_meta` that was not an object.
pub const RELEASE_META_KEY: &str = "dev.germline/release_meta";

/// Where a result that was not a JSON object is kept, inside the object germline labels.
pub const RELEASE_RESULT_KEY: &str = "dev.germline/release_result";

/// Largest item file the broker reads into a copy's view.
const MAX_ITEM_BYTES: u64 = 64 << 20;

/// One tool call as the agent host forms it.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct CallRequest {
    /// Tool name.
    pub tool: String,
    /// Tool arguments (a JSON object).
    #[serde(default)]
    pub arguments: Map<String, Value>,
    /// Paths of file items.
    #[serde(default)]
    pub items: Vec<PathBuf>,
    /// Consumers of the result (default: `agent`).
    #[serde(default)]
    pub consumers: Vec<String>,
}

/// How a call ended, as the host decided it: never inferred from text a copy produced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallStatus {
    /// The first consumer received a tool result.
    Answered,
    /// The call ran (or tried to) and produced no result: a tool error, a deadline, bad
    /// call metadata. The default: an outcome nobody marked answered is not one.
    #[default]
    Failed,
    /// The host refused to run the call (the release's germline was refused, or a result
    /// was withheld from a consumer not cleared for its label).
    Refused,
    /// The release is suppressed (dampening, or a peer's verified witness): no copy ran.
    Suppressed,
}

/// What a call produced, as printed by `germline call`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CallOutcome {
    /// How the call ended (set by the host, never read from a copy's answer).
    #[serde(default)]
    pub status: CallStatus,
    /// The tool result for the first consumer (with the label in `_meta`).
    pub result: Option<Value>,
    /// Its output label.
    pub label: Option<Label>,
    /// How many copies ran.
    pub copies: usize,
    /// Triggers recorded in this call (see [`reduce_triggers`]).
    pub triggers: Vec<TriggerOut>,
    /// Why the call (or the first consumer's copy) failed.
    pub error: Option<String>,
    /// Per consumer: result, label and error.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumers: BTreeMap<String, ConsumerResult>,
    /// Every egress attempt and the broker's decision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressEventOut>,
    /// What a verifier needs to replay each trigger (also in the trigger log).
    #[serde(skip)]
    pub evidence: Vec<TriggerEvidence>,
    /// The join of every copy's output label: the label of everything about the call that
    /// depends on all its copies (its duration, its trigger count). Metrics and log lines
    /// carry such facts only when this is empty.
    #[serde(skip)]
    pub held: Label,
    /// Where each copy's time went, in group order (for benchmarks; never serialised:
    /// a copy's timing depends on what it was given).
    #[serde(skip)]
    pub timings: Vec<crate::timings::CopyTimings>,
}

/// Debug builds only: `GERMLINE_TEST_OUTPUT_REDUCTION_OFF=1` shows triggers in full and
/// lets log lines and metrics carry what labelled copies did (their timings, whether
/// their slot writes or tunnels failed), to show what the reduction stops.
pub fn output_reduction_off() -> bool {
    crate::test_switch("GERMLINE_TEST_OUTPUT_REDUCTION_OFF")
}

/// Debug builds only: `GERMLINE_TEST_REPLAY_LABELS_OFF=1` runs probe and control replays
/// with an empty label, as they once ran, so a test can show what the broker's log lines
/// then say about a probe that holds the trigger's items.
fn replay_labels_off() -> bool {
    crate::test_switch("GERMLINE_TEST_REPLAY_LABELS_OFF")
}

/// Whether a log line or metric may carry a fact that depends on a copy with `label`:
/// only when the label is empty (a log reader is cleared for nothing).
pub fn loggable(label: &Label) -> bool {
    label.is_empty() || output_reduction_off()
}

/// The part of a call one consumer receives.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ConsumerResult {
    /// The tool result.
    pub result: Option<Value>,
    /// Its output label.
    pub label: Option<Label>,
    /// Why there is no result.
    pub error: Option<String>,
}

/// Egress attempts as the call's consumers see them (see [`reduce_egress`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EgressEventOut {
    /// Plan group.
    pub group: usize,
    /// Host named by the copy; absent when withheld (an undeclared host named by a copy
    /// whose label a consumer's clearance does not cover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Broker decision.
    pub decision: String,
    /// The output label of the copy that made the attempt.
    #[serde(default)]
    pub label: Label,
    /// How many attempts this entry stands for.
    #[serde(default = "one")]
    pub count: usize,
}

fn one() -> usize {
    1
}

/// A trigger as the call's consumers see it. Which declared host and which pair of copies
/// diverged is what dampening acts on; how and where the requests diverged is chosen by
/// the diverging copy, which holds more items than the serving one, so it is shown only to
/// callers whose every consumer is cleared for that copy's label (the full record is in
/// the evidence opening).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TriggerOut {
    /// The declared host whose record was diverged from.
    pub host: HostName,
    /// The Plan group of the copy that diverged.
    pub group_index: usize,
    /// The Plan group that serves `host`.
    pub serving_group_index: usize,
    /// Output labels of the diverging and the serving copy, joined.
    #[serde(default)]
    pub label: Label,
    /// How the requests diverged; absent when withheld.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<TriggerKind>,
    /// 0-based request position of the divergence; absent when withheld.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
}

/// Triggers of one call for consumers with `clearances`: kind and position are withheld
/// unless every consumer is cleared for the labels of both copies the trigger compares.
/// The serving copy's label counts too: a position is where the diverging copy's requests
/// part from the serving copy's record, so a serving copy that holds hr (its view, or an
/// hr slot when its horizon is hr) sets it by the length of its record, whatever the
/// diverging copy holds (`redteam_outputs::a_serving_copys_hr_slot_spells_itself_in_a_trigger_position`).
pub fn reduce_triggers(triggers: &[Trigger], copy_labels: &[Label], consumers: &[Clearance]) -> Vec<TriggerOut> {
    let off = crate::test_switch("GERMLINE_TEST_EGRESS_REDUCTION_OFF") || output_reduction_off();
    triggers
        .iter()
        .map(|t| {
            // A group without a recorded label is treated as holding everything: withheld.
            let label = copy_labels
                .get(t.group_index)
                .zip(copy_labels.get(t.serving_group_index))
                .map(|(diverging, serving)| diverging.join(serving));
            let shown = off || label.as_ref().is_some_and(|l| consumers.iter().all(|c| l.flows_to(c)));
            TriggerOut {
                host: t.host.clone(),
                group_index: t.group_index,
                serving_group_index: t.serving_group_index,
                label: label.unwrap_or_default(),
                kind: shown.then_some(t.kind),
                position: shown.then_some(t.position),
            }
        })
        .collect()
}

impl EgressEventOut {
    fn of(e: EgressEvent, label: &Label) -> Self {
        EgressEventOut {
            group: e.group,
            host: Some(e.host),
            decision: e.decision.to_owned(),
            label: label.clone(),
            count: 1,
        }
    }
}

/// The egress log as the call's consumers may see it: the log is what the copies did, so
/// each entry carries its copy's label. Attempts of a copy whose label every consumer's
/// clearance covers are listed as made; of any other copy only what carries no item is
/// left: per group, declared host (or none) and decision, how many, in a fixed order. The
/// name of an undeclared host (which the copy chose) and the order of attempts are dropped.
///
/// Debug builds only: `GERMLINE_TEST_EGRESS_REDUCTION_OFF=1` lists everything, to show
/// what the reduction stops.
pub fn reduce_egress(
    events: Vec<EgressEventOut>,
    declared: &[HostName],
    consumers: &[Clearance],
) -> Vec<EgressEventOut> {
    if crate::test_switch("GERMLINE_TEST_EGRESS_REDUCTION_OFF") {
        return events;
    }
    let mut shown = Vec::new();
    let mut counted: BTreeMap<(usize, Option<String>, String), (Label, usize)> = BTreeMap::new();
    for e in events {
        if consumers.iter().all(|c| e.label.flows_to(c)) {
            shown.push(e);
            continue;
        }
        let host = e.host.filter(|h| declared.iter().any(|d| d.as_str() == h));
        let entry = counted.entry((e.group, host, e.decision)).or_insert((e.label, 0));
        entry.1 += e.count;
    }
    shown.extend(counted.into_iter().map(|((group, host, decision), (label, count))| EgressEventOut {
        group,
        host,
        decision,
        label,
        count,
    }));
    shown
}

impl CallOutcome {
    /// A call that failed before any copy ran.
    pub fn failed(e: impl ToString) -> Self {
        CallOutcome { status: CallStatus::Failed, error: Some(e.to_string()), ..Default::default() }
    }

    /// A call the host refused to run (or whose result it withheld).
    pub fn refused(e: impl ToString) -> Self {
        CallOutcome { status: CallStatus::Refused, error: Some(e.to_string()), ..Default::default() }
    }

    /// A call refused because the release is suppressed; `why` names the penalty or the
    /// peer's witness.
    pub fn suppressed(why: impl ToString) -> Self {
        CallOutcome { status: CallStatus::Suppressed, error: Some(why.to_string()), ..Default::default() }
    }

    /// A call answered with `result` by one copy (baselines).
    pub fn answered(result: Value) -> Self {
        CallOutcome { status: CallStatus::Answered, result: Some(result), copies: 1, ..Default::default() }
    }
}

/// How the executor splits a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Splitting {
    /// Plan's groups (germline).
    Plan,
    /// One copy holding every item for every member ("mechanism off" baseline).
    None,
}

/// SHA-256 over a release directory's files (sorted relative paths and contents): the
/// release id of a directory that did not come through admission.
pub fn release_dir_hash(dir: &Path) -> Result<ReleaseHash, ExecutorError> {
    use sha2::{Digest, Sha256};
    fn walk(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let ft = e.file_type()?;
            let p = e.path();
            if ft.is_dir() {
                if e.file_name() != "__pycache__" {
                    walk(base, &p, out)?;
                }
            } else if ft.is_file() {
                out.push(p.strip_prefix(base).unwrap_or(&p).to_path_buf());
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(dir, dir, &mut files).map_err(ExecutorError::io(format!("reading release {}", dir.display())))?;
    files.sort();
    let mut h = Sha256::new();
    for f in files {
        let bytes = std::fs::read(dir.join(&f)).map_err(ExecutorError::io(format!("reading {}", f.display())))?;
        h.update(f.to_string_lossy().as_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(&bytes);
    }
    Ok(ReleaseHash(h.finalize().into()))
}

/// A release running under germline: its germline, its slots, its policy.
pub struct GermlineRuntime {
    /// The germline, inside the pool of copies made from it (started again after a
    /// refusal or a filter change, at the next call).
    pool: Option<CopyPool>,
    /// Ready copies kept per germline (0: fork per call; see [`crate::pool`]).
    pool_size: usize,
    spec: GermlineSpec,
    /// The release's manifest.
    pub manifest: Manifest,
    /// The deployer's policy.
    pub policy: Policy,
    /// The release id.
    pub release: ReleaseHash,
    /// The release's slots (shared with every other germline of the release in this
    /// process, see [`crate::slots`]).
    pub slots: Arc<SlotTable>,
    /// How calls are split.
    pub splitting: Splitting,
    /// Where triggers are appended (JSON lines), if anywhere.
    pub trigger_log: Option<PathBuf>,
    /// Evidence switches, on by default; tests turn them off to show what they do.
    pub evidence_switches: EvidenceSwitches,
    /// Why the release was refused while running, and by which germline check if by one;
    /// shared by every lane of the release (a refusal in one stops them all).
    refused: Arc<Mutex<Option<Refusal>>>,
    /// A germline that died is started again at the next copy a call takes (off only in
    /// tests, to show what the restart does).
    restart: bool,
    /// Set once the release's tools were listed by a copy holding start-up data (shared by
    /// every lane): a call's tool name may then be one that copy chose, and the evidence
    /// of its triggers publishes it only as a keyed commitment.
    tools_labelled: Arc<std::sync::atomic::AtomicBool>,
    /// The home of its own a replay germline was started from ([`GermlineRuntime::replay_maker`]),
    /// held only to be removed after the germline (fields drop in order).
    _home: Option<ReplayHome>,
}

/// A directory beside the runtime's home holding a replay germline's copy of the release,
/// its shim and its CA: held (an exclusive `flock` on the directory) while the germline
/// lives, and removed when dropped, before the lock goes.
struct ReplayHome {
    dir: PathBuf,
    _held: std::fs::File,
}

impl Drop for ReplayHome {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!("removing the replay home {}: {e}", self.dir.display());
        }
    }
}

/// Prefix of a replay home's name.
const REPLAY_HOME: &str = "replay-";
/// Prefix of a replay home made but not yet held and named (for microseconds).
const REPLAY_HOME_NEW: &str = ".replay-new-";
/// Age beyond which an unnamed replay home is a dead broker's.
const REPLAY_HOME_NEW_STALE: Duration = Duration::from_secs(60);

/// Removes what brokers that died left in `base`: replay homes no process holds (a lock
/// goes with its process, in whatever pid namespace it ran, so no live broker's home is
/// taken for a dead one's) and unnamed ones older than [`REPLAY_HOME_NEW_STALE`].
fn sweep_replay_homes(base: &Path) {
    for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let stale = if name.starts_with(REPLAY_HOME) {
            std::fs::File::open(e.path()).is_ok_and(|d| d.try_lock().is_ok())
        } else if name.starts_with(REPLAY_HOME_NEW) {
            e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|a| a > REPLAY_HOME_NEW_STALE))
        } else {
            false
        };
        if stale {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// `spec` and `policy` moved to a new home beside the runtime's: a copy of the release, a
/// shim and a CA of its own ([`GermlineRuntime::replay_maker`]).
fn replay_home(spec: &GermlineSpec, policy: &Policy) -> Result<(GermlineSpec, Policy, ReplayHome), ExecutorError> {
    use std::os::unix::fs::DirBuilderExt;
    let base = spec.runtime.shim_dir.parent().ok_or_else(|| ExecutorError::internal("the shim has no home"))?;
    sweep_replay_homes(base);
    let mut tag = [0u8; 8];
    getrandom::fill(&mut tag).map_err(|e| ExecutorError::Sandbox(format!("getrandom: {e}")))?;
    let tag = hex::encode(tag);
    // Made under a name no sweep takes while live, held, then named: a sweep never finds
    // it named and unheld.
    let new = base.join(format!("{REPLAY_HOME_NEW}{tag}"));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&new)
        .map_err(ExecutorError::io(format!("creating {}", new.display())))?;
    let held = std::fs::File::open(&new)
        .and_then(|d| d.lock().map(|()| d))
        .map_err(ExecutorError::io(format!("locking {}", new.display())));
    let dir = base.join(format!("{REPLAY_HOME}{tag}"));
    let held = held.and_then(|held| {
        std::fs::rename(&new, &dir).map_err(ExecutorError::io(format!("naming {}", dir.display())))?;
        Ok(held)
    });
    let held = match held {
        Ok(h) => h,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&new);
            return Err(e);
        }
    };
    let home = ReplayHome { dir, _held: held };
    let release_dir = home.dir.join("release");
    crate::germline::copy_release(&spec.release_dir, &release_dir)?;
    let mut policy = policy.clone();
    let tls = policy.open_tls(&home.dir.join("ca"))?;
    let is_ca = |p: &PathBuf| p.file_name().is_some_and(|n| n == crate::ca::CA_CERT_FILE);
    let extra_read =
        spec.extra_read.iter().filter(|p| !is_ca(p)).cloned().chain([tls.ca_cert_path().to_path_buf()]).collect();
    let runtime = spec.runtime.with_shim_in(&home.dir)?;
    Ok((GermlineSpec { release_dir, runtime, extra_read, own_tree: true, ..spec.clone() }, policy, home))
}

/// A running release's refusal.
#[derive(Clone)]
struct Refusal {
    why: String,
    check: Option<&'static str>,
}

/// Switches for the evidence mechanisms (prevention never depends on them).
#[derive(Clone, Copy, Debug)]
pub struct EvidenceSwitches {
    /// Freeze clocks and seed RNGs in copies.
    pub twin_inputs: bool,
    /// Compare request sequences and record triggers (the tripwire).
    pub sequence_comparison: bool,
    /// Tests only: the earlier twin monotonic clock, advancing 1 µs per read and ignoring
    /// sleeps, under which a polling loop never ends (the "mechanism off" twin of the
    /// sleep-aware clock).
    pub counted_twin_clock: bool,
    /// Publish evidence as keyed commitments (`evidence` module docs). Off only in
    /// tests, to show what publishing the full record discloses.
    pub commitments: bool,
}

impl Default for EvidenceSwitches {
    fn default() -> Self {
        EvidenceSwitches { twin_inputs: true, sequence_comparison: true, counted_twin_clock: false, commitments: true }
    }
}

impl GermlineRuntime {
    /// The deployment this runtime's copies run in, for trigger evidence (none with
    /// [`crate::confine::host_machine_for_tests`]).
    fn deployment(&self) -> Option<crate::evidence::Deployment> {
        if crate::confine::host_machine_for_tests() {
            return None;
        }
        let limits = &self.policy.limits;
        Some(crate::evidence::Deployment {
            environment: self.policy.environment.clone(),
            data_roots: self.policy.data_roots(),
            memory_bytes: limits.memory_bytes,
            processes: limits.processes,
            cpu_seconds: limits.cpu_seconds,
            deadline_ms: u64::try_from(limits.deadline.as_millis()).unwrap_or(u64::MAX),
            max_message_bytes: limits.max_message_bytes,
            pool: self.pool_size,
            copy_source: limits.copy_source,
            resident_root: self.spec.resident_root,
            immortal_heap: !crate::germline::immortal_heap_off(),
            startup_items: self.policy.startup_items.clone(),
            // The broker's shared tree, which every call's germline binds from (a replay's
            // own tree records no evidence).
            tree_device: if self.spec.resident_root && !self.spec.own_tree {
                crate::resident::Tree::current().and_then(|t| t.device().ok())
            } else {
                None
            },
            machine: crate::evidence::Machine::here(&self.spec.runtime.python),
        })
    }

    /// Starts the germline for `release_dir` under `policy`. Fails (refusing the release)
    /// if the germline does not start or fails G1–G3.
    pub fn start(
        release_dir: &Path,
        policy: Policy,
        runtime: PythonRuntime,
        splitting: Splitting,
    ) -> Result<GermlineRuntime, ExecutorError> {
        Self::start_with(release_dir, policy, runtime, splitting, SandboxSwitches::default())
    }

    /// [`GermlineRuntime::start`] with sandbox mechanisms switched as given; only tests
    /// switch one off, to show what it prevents.
    pub fn start_with(
        release_dir: &Path,
        mut policy: Policy,
        runtime: PythonRuntime,
        splitting: Splitting,
        switches: SandboxSwitches,
    ) -> Result<GermlineRuntime, ExecutorError> {
        let manifest = Manifest::load_for(release_dir, &policy)?;
        let release = release_dir_hash(release_dir)?;
        // The CA key stays in `home/ca`, outside the germline's allowlist; only the
        // certificate is readable by the germline (and trusted through its environment).
        let tls = policy.open_tls(&runtime.shim_dir.with_file_name("ca"))?;
        let spec = GermlineSpec {
            runtime,
            release_dir: release_dir.to_path_buf(),
            data_roots: policy.data_roots(),
            limits: ResourceLimits {
                memory_bytes: policy.limits.memory_bytes,
                processes: policy.limits.processes,
                cpu_seconds: policy.limits.cpu_seconds,
                ..ResourceLimits::default()
            },
            start_timeout: Duration::from_secs(60),
            extra_read: vec![tls.ca_cert_path().to_path_buf()],
            system_paths: manifest.system_paths_on_host(),
            cgroup_limits: Some(CgroupLimits {
                memory_bytes: policy.limits.memory_bytes,
                processes: policy.limits.processes,
            }),
            switches,
            require_limits: policy.limits.require_limits,
            seccomp: SeccompPolicy::germline(),
            env: crate::germline::startup_environment(&manifest, &policy)?,
            copy_source: manifest.copy_source.either(policy.limits.copy_source),
            scratch_paths: manifest.scratch.clone(),
            resident_root: policy.sandbox.resident_root,
            own_tree: false,
        };
        if policy.limits.pool > crate::policy::MAX_POOL {
            return Err(ExecutorError::Policy(format!(
                "limits: pool = {} is more than {} copies per germline",
                policy.limits.pool,
                crate::policy::MAX_POOL
            )));
        }
        let pool_size = policy.limits.pool;
        if let Some(why) = startup_data(&manifest, &policy).filter(|_| pool_size > 0) {
            tracing::info!(release = %release, "pooled copies start their server at the call, once its view is in: {why}");
        }
        let germline = Germline::start(&spec)?;
        tracing::info!(
            release = %release,
            "per-copy limits by {}: {} MiB, {} processes, {} CPU s per process; deadline {} ms",
            germline.limits_mechanism(),
            spec.limits.memory_bytes >> 20,
            spec.limits.processes,
            spec.limits.cpu_seconds,
            policy.limits.deadline.as_millis()
        );
        tracing::info!(release = %release, "germline ready in {:?}", germline.start_time);
        Ok(GermlineRuntime {
            pool: Some(copy_pool(germline, pool_size, &policy, &manifest)),
            pool_size,
            spec,
            manifest,
            policy,
            release,
            slots: Arc::new(SlotTable::default()),
            splitting,
            trigger_log: None,
            evidence_switches: EvidenceSwitches::default(),
            refused: Arc::default(),
            restart: true,
            tools_labelled: Arc::default(),
            _home: None,
        })
    }

    /// Why the release was refused while running, when a germline check (G1–G3,
    /// namespaces, children) refused it: the mechanism stopping a release, as opposed to
    /// a germline that failed to start.
    pub fn refusal(&self) -> Option<String> {
        self.refused_now().and_then(|r| r.check.map(|_| r.why))
    }

    fn refused_now(&self) -> Option<Refusal> {
        self.refused.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Host paths a copy of this release can read: those bound read-only into its root
    /// (the interpreter's, the shim, the release, the CA certificate; `/etc` without the
    /// minimal root) and the policy's data roots (a call may name any file under them as an
    /// item).
    pub fn copy_visible_paths(&self) -> Vec<PathBuf> {
        let spec = &self.spec;
        let mut v = spec.runtime.read_paths.clone();
        v.push(spec.runtime.shim_dir.clone());
        v.push(spec.release_dir.clone());
        v.extend(spec.extra_read.iter().cloned());
        v.extend(spec.data_roots.iter().cloned());
        if !spec.switches.minimal_root {
            v.push(PathBuf::from("/etc"));
        }
        v
    }

    /// Refuses `path` as a place for germline's own outputs (the ledger, the trigger log,
    /// witnesses and their openings, which hold items of every label) when a copy of this
    /// release could read it: inside a path bound into its root or under a data root.
    /// Paths are compared resolved (symbolic links, `..`), up to their deepest existing
    /// ancestor.
    pub fn check_private(&self, path: &Path, what: &str) -> Result<(), ExecutorError> {
        let mine = resolved(path);
        for v in self.copy_visible_paths() {
            let theirs = resolved(&v);
            if mine.starts_with(&theirs) {
                return Err(ExecutorError::Policy(format!(
                    "{what} {} is inside {}, which the release's copies can read; keep it outside every path a copy reads",
                    path.display(),
                    v.display()
                )));
            }
        }
        Ok(())
    }

    /// Starts another germline of this release (a lane, see [`crate::lanes`]) when called:
    /// same release, policy and switches, sharing this one's slots and refusal.
    pub fn lane_maker(&self) -> impl Fn() -> Result<GermlineRuntime, ExecutorError> + Send + Sync + 'static {
        self.maker(false)
    }

    /// Starts a germline of this release to replay its triggers on when called, as a third
    /// party's `germline verify` would start one: from a home of its own, with its own
    /// copy of the release, its own shim and its own CA, and (with a resident root) its own
    /// in-memory tree. What differs between two such germlines (the files' times and inode
    /// numbers, the tree's device, the CA) then differs for the host's replay as for a
    /// third party's, and both reach the same verdict on a request that carries it.
    /// Otherwise as [`GermlineRuntime::lane_maker`].
    pub fn replay_maker(&self) -> impl Fn() -> Result<GermlineRuntime, ExecutorError> + Send + Sync + 'static {
        self.maker(!crate::test_switch("GERMLINE_TEST_REPLAY_SAME_HOME"))
    }

    fn maker(&self, own_home: bool) -> impl Fn() -> Result<GermlineRuntime, ExecutorError> + Send + Sync + 'static {
        let (spec, manifest, policy) = (self.spec.clone(), self.manifest.clone(), self.policy.clone());
        let (release, slots, refused) = (self.release, self.slots.clone(), self.refused.clone());
        let tools_labelled = self.tools_labelled.clone();
        let (pool_size, splitting, trigger_log, evidence_switches) =
            (self.pool_size, self.splitting, self.trigger_log.clone(), self.evidence_switches);
        move || {
            if let Some(r) = refused.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                return Err(ExecutorError::Call(format!("release refused: {}", r.why)));
            }
            let (spec, policy, home) = match own_home {
                true => {
                    let (spec, policy, home) = replay_home(&spec, &policy)?;
                    (spec, policy, Some(home))
                }
                false => (spec.clone(), policy.clone(), None),
            };
            let germline = Germline::start(&spec)?;
            tracing::info!(release = %release, "another germline of the release started, in {:?}", germline.start_time);
            Ok(GermlineRuntime {
                pool: Some(copy_pool(germline, pool_size, &policy, &manifest)),
                pool_size,
                spec,
                manifest: manifest.clone(),
                policy,
                release,
                slots: slots.clone(),
                splitting,
                trigger_log: trigger_log.clone(),
                evidence_switches,
                refused: refused.clone(),
                restart: true,
                tools_labelled: tools_labelled.clone(),
                _home: home,
            })
        }
    }

    /// Runs one call. Never panics on hostile input; errors come back in the outcome.
    pub fn call(&mut self, req: &CallRequest) -> CallOutcome {
        if let Some(r) = self.refused_now() {
            self.pool = None;
            return CallOutcome::refused(format!("release refused: {}", r.why));
        }
        match self.call_inner(req) {
            Ok(o) => o,
            Err(e) => {
                if let ExecutorError::GermlineRefused { check, .. } = &e {
                    let check = e.is_refusal().then_some(*check);
                    *self.refused.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(Refusal { why: e.to_string(), check });
                    self.pool = None;
                    return CallOutcome::refused(e);
                }
                CallOutcome::failed(e)
            }
        }
    }

    fn call_inner(&mut self, req: &CallRequest) -> Result<CallOutcome, ExecutorError> {
        let prepared = PreparedCall::new(req, &self.manifest, &self.policy)?;
        let _call = self.pool()?.begin_call();
        let plan = match self.splitting {
            Splitting::Plan => plan_groups(&prepared.plan_input)?,
            Splitting::None => single_group_plan(&prepared.plan_input),
        };
        let host_clearances: BTreeMap<HostName, Clearance> = prepared.plan_input.hosts.iter().cloned().collect();
        let shared =
            Arc::new(Mutex::new(CallShared { records: CallRecords::new(&plan, &host_clearances)?, replay: None }));
        let twin = TwinInputs::fresh()?;
        let mut outcome = CallOutcome { copies: plan.groups.len(), ..Default::default() };
        let mut per_consumer: BTreeMap<String, ConsumerResult> = BTreeMap::new();
        let mut runs: Vec<GroupRun> = Vec::new();

        for (gi, group) in plan.groups.iter().enumerate() {
            let key = SlotKey::new(self.release, &self.policy.user, group.horizon.clone())?;
            let mut run = self.run_copy(gi, group, &prepared, key, &twin, &shared)?;
            outcome.timings.push(std::mem::take(&mut run.timings));
            // The slot as the copy was given it (under its lease), if it asked for it.
            let given = run.slot.take();
            let slot = given.as_ref().map(|g| g.slot().clone()).unwrap_or_default();
            let (result, label, writes) = (run.result, run.label, run.slot_writes);
            let copy_label = label.label();
            outcome.egress.extend(run.egress.into_iter().map(|e| EgressEventOut::of(e, &copy_label)));
            runs.push(GroupRun {
                view: group.view.items().cloned().collect(),
                slot: slot.iter().map(|(k, e)| (k.to_string(), e.value.clone())).collect(),
                slot_label: slot.label(),
                received: run.received,
                label: copy_label.clone(),
            });
            let final_label = label.label();
            if let (true, false, Some(SlotGiven::Leased(lease))) = (result.is_ok(), writes.is_empty(), &given) {
                let mut slot = slot;
                // Whether a write is refused is the copy's choice: a log line saying so is
                // written only for a copy whose label is empty (else its presence is a bit of
                // what the copy holds, for a log reader cleared for nothing).
                match slot.apply_writes(writes, &final_label) {
                    Ok(()) if slot.fits(&group.horizon) => lease.store(slot),
                    Ok(()) if loggable(&final_label) => {
                        tracing::warn!("slot write refused: label escapes horizon {}", group.horizon)
                    }
                    // The error may name a key the copy chose: not logged.
                    Err(_) if loggable(&final_label) => {
                        tracing::warn!(group = gi, "slot write refused: a slot bound was broken")
                    }
                    _ => {}
                }
            }
            // The next update of this slot, in this call or another, starts from here.
            drop(given);
            // A result and an error alike come from the copy: both carry its label.
            let mut cr = ConsumerResult::default();
            match result {
                Ok(mut v) => {
                    attach_label(&mut v, &final_label);
                    cr.result = Some(v);
                }
                Err(e) => cr.error = Some(e),
            }
            cr.label = Some(final_label);
            for c in &group.consumers {
                per_consumer.insert(c.to_string(), cr.clone());
            }
        }
        let mut all_triggers: Vec<Trigger> = Vec::new();
        if self.evidence_switches.sequence_comparison {
            let sh = shared.lock().unwrap_or_else(|p| p.into_inner());
            let triggers = sh.records.triggers().to_vec();
            all_triggers.clone_from(&triggers);
            let clearances: Vec<Clearance> = prepared.plan_input.consumers.iter().map(|(_, c)| c.clone()).collect();
            let labels: Vec<Label> = runs.iter().map(|r| r.label.clone()).collect();
            outcome.triggers = reduce_triggers(&triggers, &labels, &clearances);
            for t in &triggers {
                let (Some(serving), Some(trig)) = (runs.get(t.serving_group_index), runs.get(t.group_index)) else {
                    continue;
                };
                outcome.evidence.push(TriggerEvidence {
                    version: EVIDENCE_VERSION,
                    release: self.release,
                    tool: prepared.tool.clone(),
                    arguments: prepared.public_arguments(),
                    host: t.host.clone(),
                    kind: t.kind,
                    position: t.position,
                    serving_view: serving.view.clone(),
                    trigger_view: trig.view.clone(),
                    items: prepared.item_records(),
                    twin: twin.clone(),
                    slot: serving.slot.clone(),
                    slot_label: serving.slot_label.clone(),
                    replies: encode_replies(&transcript_of(&serving.received, &prepared.plan_input.hosts)),
                    serving_requests: sh.records.copy_requests(t.serving_group_index, &t.host).to_vec(),
                    trigger_requests: sh.records.copy_requests(t.group_index, &t.host).to_vec(),
                    copies: plan.groups.len(),
                    secret: fresh_secret()?,
                    tool_sealed: self.tools_labelled.load(std::sync::atomic::Ordering::SeqCst),
                    deployment: self.deployment(),
                });
            }
        }
        if let Some(first) = prepared.consumers.first() {
            if let Some(cr) = per_consumer.get(first.as_str()) {
                outcome.result = cr.result.clone();
                outcome.label = cr.label.clone();
                outcome.error = cr.error.clone();
                outcome.status = if cr.result.is_some() { CallStatus::Answered } else { CallStatus::Failed };
            }
        }
        if per_consumer.len() > 1 {
            outcome.consumers = per_consumer;
        }
        let declared: Vec<HostName> = prepared.plan_input.hosts.iter().map(|(h, _)| h.clone()).collect();
        let clearances: Vec<Clearance> = prepared.plan_input.consumers.iter().map(|(_, c)| c.clone()).collect();
        outcome.egress = reduce_egress(std::mem::take(&mut outcome.egress), &declared, &clearances);
        let labels: Vec<Label> = runs.iter().map(|r| r.label.clone()).collect();
        outcome.held = labels.iter().fold(Label::empty(), |a, l| a.join(l));
        // Host, kind, position and number of triggers are the copies' choices: the log
        // says only that the call recorded some (the bit its dampening event publishes),
        // unless no copy held a label.
        if !all_triggers.is_empty() {
            if loggable(&outcome.held) {
                for t in &all_triggers {
                    tracing::warn!(host = %t.host, kind = ?t.kind, group = t.group_index, "trigger recorded");
                }
            } else {
                tracing::warn!("the call recorded triggers");
            }
        }
        if let (Some(path), false) = (&self.trigger_log, outcome.evidence.is_empty()) {
            append_evidence(path, &outcome.evidence, self.evidence_switches.commitments)?;
        }
        Ok(outcome)
    }

    /// `tools/list` from a data-free copy: no items, no slot, every egress denied.
    pub fn list_tools(&mut self) -> Result<Value, ExecutorError> {
        self.list_with("tools/list", Vec::new(), Label::empty())
    }

    /// [`GermlineRuntime::list_labelled`] for `tools/list`.
    pub fn list_tools_labelled(&mut self) -> Result<(Value, Label), ExecutorError> {
        self.list_labelled("tools/list")
    }

    /// A list (`tools/list`, `resources/list`, `resources/templates/list`, `prompts/list`)
    /// and its label. From a data-free copy first; a server that opens its start-up data
    /// while it starts (a database named on its command line) cannot answer there, so on
    /// failure the list comes from a copy that holds the fixed paths every tool declares it
    /// reads (`read_paths`), labelled by the policy, and carries their joined label: the
    /// caller passes it on only to consumers cleared for it. Both copies have no slot and no
    /// declared host (every request is denied), and what they write to a slot is dropped.
    pub fn list_labelled(&mut self, method: &'static str) -> Result<(Value, Label), ExecutorError> {
        let data_free = match self.list_with(method, Vec::new(), Label::empty()) {
            Ok(v) => return Ok((v, Label::empty())),
            Err(e) => e,
        };
        let declared: Vec<PathBuf> = self
            .manifest
            .tools
            .values()
            .flat_map(|t| t.read_paths.iter())
            .filter(|p| p.starts_with('/') && !p.contains(['*', '?', '[', '{']))
            .map(PathBuf::from)
            .collect();
        let mut files = Vec::new();
        let mut label = Label::empty();
        for p in named_files(&declared, &self.policy)? {
            let (bytes, meta) = read_item(&p, self.policy.resolves_paths())?;
            label = label.join(&self.policy.label_path(&p)?);
            files.push(CopyFile { path: p, contents: bytes, meta: Some(meta) });
        }
        if files.is_empty() {
            return Err(data_free);
        }
        // Its error may carry the data it held: it is named, never quoted.
        let listed = self.list_with(method, files, label.clone()).map_err(|_| {
            ExecutorError::Call(format!(
                "{method}: the data-free copy could not answer ({data_free}), nor could the copy holding the \
                 start-up data (its error is withheld: it may carry that data)"
            ))
        })?;
        if method == "tools/list" {
            self.tools_labelled.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok((listed, label))
    }

    fn list_with(
        &mut self,
        method: &'static str,
        files: Vec<CopyFile>,
        view_label: Label,
    ) -> Result<Value, ExecutorError> {
        if let Some(r) = self.refused_now() {
            return Err(ExecutorError::Call(format!("release refused: {}", r.why)));
        }
        let input = PlanInput {
            items: vec![],
            hosts: vec![],
            consumers: vec![(ConsumerName::new("agent")?, Clearance::empty())],
        };
        let plan = single_group_plan(&input);
        let shared =
            Arc::new(Mutex::new(CallShared { records: CallRecords::new(&plan, &BTreeMap::new())?, replay: None }));
        let inputs = CopyInputs {
            files,
            twin: json!(TwinInputs::fresh()?),
            slot: SlotSource::Fixed(Slot::new()),
            counted_clock: false,
        };
        let label = OutputLabel::new(view_label, Label::empty());
        let r = self.serve_one(0, inputs, method, json!({}), label, &shared)?;
        r.result.map_err(ExecutorError::Copy)
    }

    /// Replays the serving copy of `ev` with the items of `view` (contents supplied,
    /// checked against the evidence's hashes) and everything else as recorded: same
    /// metadata, twin inputs, slot, and replies in order. Returns what the replayed copy
    /// sent to the evidence's host. Nothing is delivered anywhere.
    pub fn replay(
        &mut self,
        ev: &TriggerEvidence,
        view: &[ItemName],
        contents: &BTreeMap<ItemName, Vec<u8>>,
    ) -> Result<Vec<germline_model::RequestDigest>, ExecutorError> {
        ev.check_items(view, contents)?;
        let mut arguments = ev.arguments.clone();
        let mut files = Vec::new();
        for item in &ev.items {
            let visible = view.contains(&item.name);
            if let Some(arg) = item.name.as_str().strip_prefix("arg:") {
                if visible {
                    let bytes = contents.get(&item.name).map(Vec::as_slice).unwrap_or_default();
                    let v: Value = serde_json::from_slice(bytes)
                        .map_err(|e| ExecutorError::Call(format!("argument item {arg} is not JSON: {e}")))?;
                    arguments.insert(arg.to_owned(), v);
                }
            } else {
                let contents = if visible { contents.get(&item.name).cloned().unwrap_or_default() } else { Vec::new() };
                files.push(CopyFile { path: PathBuf::from(item.name.as_str()), contents, meta: None });
            }
        }
        let input = PlanInput {
            items: vec![],
            hosts: vec![],
            consumers: vec![(ConsumerName::new("agent")?, Clearance::empty())],
        };
        let plan = single_group_plan(&input);
        let replay = ReplayState { replies: ev.decoded_replies()?, sent: BTreeMap::new() };
        let shared = Arc::new(Mutex::new(CallShared {
            records: CallRecords::new(&plan, &BTreeMap::new())?,
            replay: Some(replay),
        }));
        // The recorded slot, given when the replayed copy asks for it; nothing is stored back.
        let mut slot = Slot::new();
        let recorded = ev.slot.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
        slot.apply_writes(recorded, &Label::empty())
            .map_err(|e| ExecutorError::Call(format!("the evidence's slot breaks a slot bound: {e}")))?;
        let inputs = CopyInputs { files, twin: json!(ev.twin), slot: SlotSource::Fixed(slot), counted_clock: false };
        let params = json!({"name": ev.tool, "arguments": arguments});
        // The replayed copy holds what its view, the recorded slot and the recorded replies
        // carry, so the broker's log lines and metrics about it are reduced as for the
        // call's own copies (`loggable`).
        let label = if replay_labels_off() {
            OutputLabel::new(Label::empty(), Label::empty())
        } else {
            let held = ev.items.iter().filter(|i| view.contains(&i.name)).fold(Label::empty(), |a, i| a.join(&i.label));
            let mut label = OutputLabel::new(held, ev.slot_label.clone());
            for (host, _) in ev.replies.iter().filter(|(_, r)| !r.is_empty()) {
                label.add_reply_from(&self.policy.destination_clearance(host));
            }
            label
        };
        // Whether the replayed copy answered is its choice (a probe holds the items the
        // trigger's copy saw): not logged, not even as a bare line.
        let r = self.serve_one(0, inputs, "tools/call", params, label, &shared)?;
        if r.result.is_err() && output_reduction_off() {
            tracing::debug!("replayed copy ended without a result");
        }
        let mut sh = shared.lock().unwrap_or_else(|p| p.into_inner());
        Ok(sh.replay.as_mut().and_then(|r| r.sent.remove(&ev.host)).unwrap_or_default())
    }

    /// Tests only ("mechanism off" with `false`): whether a germline that died is started
    /// again when a call needs a copy; without, the call fails, saying the germline is gone.
    pub fn set_restart(&mut self, on: bool) {
        self.restart = on;
    }

    /// Tests only ("mechanism off"): replaces the germline's syscall filter; the germline
    /// restarts under it at the next call.
    pub fn set_seccomp_policy(&mut self, seccomp: SeccompPolicy) {
        if !seccomp.is_allowlist() {
            tracing::warn!(release = %self.release, "the germline runs without the seccomp allowlist (tests only)");
        }
        self.spec.seccomp = seccomp;
        self.pool = None;
    }

    /// The pool of copies, starting the germline first if it is not running.
    fn pool(&mut self) -> Result<&CopyPool, ExecutorError> {
        if self.pool.is_none() {
            let germline = Germline::start(&self.spec)?;
            self.pool = Some(copy_pool(germline, self.pool_size, &self.policy, &self.manifest));
        }
        self.pool.as_ref().ok_or_else(|| ExecutorError::internal("pool"))
    }

    /// Copies ready for calls right now, after waiting (at most `timeout`) for `n`; for
    /// tests and the bench, which measure calls on a full pool.
    pub fn wait_pool_ready(&mut self, n: usize, timeout: Duration) -> Result<usize, ExecutorError> {
        Ok(self.pool()?.wait_ready(n, timeout))
    }

    /// The germline's pid, starting it first if it is not running (for tests).
    pub fn germline_pid(&mut self) -> Result<Option<i32>, ExecutorError> {
        Ok(self.pool()?.source_pid())
    }

    /// Whether calls take pooled copies (false: fork per call, by setting or because the
    /// release's copies could not be readied).
    pub fn pooling(&mut self) -> bool {
        self.pool().map(CopyPool::pooling).unwrap_or(false)
    }

    /// How far pooled copies are readied before a call takes one: past `initialize`, or
    /// short of starting their server (a server that opens its data at start-up, or whose
    /// data-free copy did not get past `initialize` or kept a process of its own).
    pub fn readiness(&mut self) -> Result<Readiness, ExecutorError> {
        Ok(self.pool()?.readiness())
    }

    /// Runs one copy for group `gi`: takes it from the pool (or has one made), gives it
    /// `inputs` — before its server starts for a fresh copy; twin inputs, then view, then
    /// slot for a pooled one — asks `method`, and gives it back to be killed.
    fn serve_one(
        &mut self,
        gi: usize,
        inputs: CopyInputs,
        method: &str,
        params: Value,
        label: OutputLabel,
        shared: &Arc<Mutex<CallShared>>,
    ) -> Result<CopyResult, ExecutorError> {
        let budget = self.policy.limits.deadline;
        let deadline = Instant::now() + budget;
        let roots = self.policy.data_roots();
        let trace = std::env::var_os("GERMLINE_DEBUG_GERMLINE").is_some();
        // No refill while this copy runs (also for a list or a replay, outside a call).
        let mut _quiet = self.pool()?.begin_call();
        let t_take = Instant::now();
        let taken = match self.pool()?.take() {
            // A germline that died held no data, nor did anything made from it that is not
            // dead now: it is started again, once, while the call has given no copy
            // anything (its first group; a later group's copy fails the call).
            Err(ExecutorError::GermlineGone(how)) if gi == 0 && self.restart => {
                tracing::warn!(release = %self.release, "the germline is gone ({how}): starting it again");
                self.pool = None;
                _quiet = self.pool()?.begin_call();
                self.pool()?.take()?
            }
            // Started again at the next call.
            Err(e @ ExecutorError::GermlineGone(_)) => {
                self.pool = None;
                return Err(e);
            }
            other => other?,
        };
        let t_setup = Instant::now();
        let take = t_setup - t_take;
        let CopyInputs { files, twin, slot, counted_clock } = inputs;
        let pooled = matches!(taken, Taken::Pooled(_));
        let (copy, job_parts) = match taken {
            Taken::Pooled(r) => {
                let ReadyCopy { copy, proxy, slot: slot_listener, channel, readiness } = *r;
                let mut twin_part = json!({"twin": twin});
                if counted_clock {
                    twin_part["twin_clock"] = json!("counted");
                }
                let view = ViewMount { pid: copy.pid, roots, files };
                let channel = Box::new(channel);
                let channel = match readiness {
                    Readiness::Initialized => Channel::Pooled { channel, twin: twin_part, view, data: json!({}) },
                    Readiness::Connected => {
                        twin_part["trace"] = json!(trace);
                        Channel::Staged { channel, start: twin_part, view }
                    }
                };
                let resumed = copy.resume();
                (copy, resumed.map(|()| (proxy, slot_listener, channel)))
            }
            Taken::Fresh(copy) => {
                let copy = *copy;
                let set_up =
                    prepare_copy(copy.pid, copy.ids(), &roots, &files, copy.scratch.as_ref(), copy.departure())
                        .and_then(|l| copy.channel_ready().map(|()| l));
                let mut preamble = json!({"twin": twin, "trace": trace});
                if counted_clock {
                    preamble["twin_clock"] = json!("counted");
                }
                let parts =
                    set_up.map(|l| (l.proxy, l.slot, Channel::Fresh { listener: l.channel, gate: l.gate, preamble }));
                (copy, parts)
            }
        };
        let pool = self.pool.as_ref().ok_or_else(|| ExecutorError::internal("pool"))?;
        match job_parts.and_then(|p| copy.killer().map(|k| (p, k))) {
            Ok((p, killer)) => {
                let (proxy, slot_listener, channel) = p;
                let job = CopyJob {
                    group_index: gi,
                    proxy,
                    slot: slot_listener,
                    slot_source: slot,
                    channel,
                    method,
                    params,
                    deadline,
                    budget,
                    policy: &self.policy,
                    label,
                    killer,
                };
                let outside = t_setup.elapsed();
                let mut r = serve_copy(job, shared);
                let t_kill = Instant::now();
                let mut copy = copy;
                // A pooled copy was made off this call's path: its fork phases are not the call's.
                // A fresh one was made in the take: the take's own phase is what is left.
                let fork = if pooled { Default::default() } else { std::mem::take(&mut copy.timings) };
                let take = take.saturating_sub(fork.total());
                pool.give_back(copy);
                r.timings.teardown += t_kill.elapsed();
                r.timings.reap = fork.reap;
                r.timings.checks_before = fork.checks_before;
                r.timings.cgroup = fork.cgroup;
                r.timings.fork = fork.fork;
                r.timings.checks_after = fork.checks_after;
                r.timings.leave_cgroup = fork.leave_cgroup;
                r.timings.outside = outside;
                r.timings.take = take;
                Ok(r)
            }
            Err(e) => {
                pool.give_back(copy);
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn run_copy(
        &mut self,
        gi: usize,
        group: &Group,
        prepared: &PreparedCall,
        slot_key: SlotKey,
        twin: &TwinInputs,
        shared: &Arc<Mutex<CallShared>>,
    ) -> Result<CopyResult, ExecutorError> {
        let files: Vec<CopyFile> = prepared
            .files
            .iter()
            .map(|(name, path, bytes, meta)| {
                let visible = group.view.contains(name);
                CopyFile {
                    path: path.clone(),
                    contents: if visible { bytes.clone() } else { Vec::new() },
                    meta: visible.then_some(*meta),
                }
            })
            .collect();
        let arguments = prepared.arguments_for(&group.view);
        let twin = if self.evidence_switches.twin_inputs { json!(twin) } else { Value::Null };
        let inputs = CopyInputs {
            files,
            twin,
            slot: SlotSource::Leased { table: self.slots.clone(), key: slot_key },
            counted_clock: self.evidence_switches.counted_twin_clock,
        };
        let label = OutputLabel::new(group.view.label_of(&prepared.plan_input.items), Label::empty());
        let params = json!({"name": prepared.tool, "arguments": arguments});
        let mut r = self.serve_one(gi, inputs, "tools/call", params, label, shared)?;
        let timings = std::mem::take(&mut r.timings);
        // How long a copy ran is its choice: a timing line is written only for a copy whose
        // label is empty (a log reader is cleared for nothing; a labelled copy sleeping in
        // proportion to an item would spell it here to the microsecond).
        if loggable(&r.label.label()) {
            let t_served =
                timings.connect + timings.preamble + timings.initialize + timings.first_byte + timings.answer;
            tracing::debug!(group = gi, ?t_served, ?timings, "copy timings");
        }
        r.timings = timings;
        {
            let mut sh = shared.lock().unwrap_or_else(|p| p.into_inner());
            sh.records.finish_copy(gi);
        }
        Ok(r)
    }
}

/// `p` made absolute with its deepest existing ancestor resolved (symbolic links and `..`
/// there), and the rest appended as written.
fn resolved(p: &Path) -> PathBuf {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf())
    };
    let mut rest = Vec::new();
    let mut cur = abs.as_path();
    loop {
        if let Ok(c) = cur.canonicalize() {
            return rest.iter().rev().fold(c, |acc: PathBuf, n| acc.join(n));
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            // `..` left over where nothing exists: compare as written.
            _ => return abs,
        }
    }
}

/// The pool of `size` copies of `germline` for a release under `policy`: past
/// `initialize`, or short of starting their server when it opens data at start-up.
fn copy_pool(germline: Germline, size: usize, policy: &Policy, manifest: &Manifest) -> CopyPool {
    let readiness = match startup_data(manifest, policy) {
        Some(_) => Readiness::Connected,
        None => Readiness::Initialized,
    };
    CopyPool::new(Box::new(germline), size, readiness, policy.limits.max_message_bytes, manifest.warm_up_calls())
}

/// What one copy is given besides its request.
struct CopyInputs {
    /// Its view's files (out-of-view items empty).
    files: Vec<CopyFile>,
    /// Twin inputs (`null`: switched off, tests only).
    twin: Value,
    /// Where its slot comes from when it asks for it.
    slot: SlotSource,
    /// Tests only: the counted twin clock ([`EvidenceSwitches::counted_twin_clock`]).
    counted_clock: bool,
}

/// Why a release's server opens data at start-up, if it does: a path under a data root on
/// its command line or among its `main` arguments, or fixed paths its tools declare they
/// read. Such a server would start without its data in a copy readied past `initialize`
/// (which holds nothing until a call takes it), so its pooled copies are readied short of
/// starting it ([`Readiness::Connected`]): the server starts once the call's view is in.
fn startup_data(manifest: &Manifest, policy: &Policy) -> Option<String> {
    use crate::manifest::Entry;
    let roots = policy.data_roots();
    let under_root = |s: &str| {
        let p = s.strip_prefix("file://").unwrap_or(s);
        p.starts_with('/') && roots.iter().any(|r| Path::new(p).starts_with(r))
    };
    let args: Vec<String> = match &manifest.entry {
        Entry::Cli { args, .. } => args.clone(),
        Entry::Main { args, .. } => args.iter().filter_map(|a| a.as_str().map(str::to_owned)).collect(),
        Entry::Factory { .. } | Entry::Module { .. } => Vec::new(),
    };
    if let Some(a) = args.iter().find(|a| under_root(a) || a.split_once('=').is_some_and(|(_, v)| under_root(v))) {
        return Some(format!("its start-up arguments name {a}, under a data root"));
    }
    let fixed = manifest.tools.iter().find(|(_, t)| t.read_paths.iter().any(|p| p.starts_with('/')));
    fixed.map(|(name, _)| format!("tool {name} declares fixed paths it reads (start-up data)"))
}

/// Appends the call's trigger evidence, and syncs, so a trigger once reported is not
/// lost: one line per call to the trigger log, holding only what may be published (the
/// first trigger's [`crate::evidence::PublicEvidence`]), and every trigger's full record
/// (its opening) to `<log>.openings`, readable by the owner only.
fn append_evidence(path: &Path, evidence: &[TriggerEvidence], commitments: bool) -> Result<(), ExecutorError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(first) = evidence.first() else { return Ok(()) };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(ExecutorError::io(format!("creating {}", dir.display())))?;
    }
    let mut openings_path = path.as_os_str().to_owned();
    openings_path.push(".openings");
    let openings_path = PathBuf::from(openings_path);
    // Calls of one release run side by side (lanes): one writer at a time, so each
    // call's lines stay whole and its openings precede its public line.
    static APPENDING: Mutex<()> = Mutex::new(());
    let _one_writer = APPENDING.lock().unwrap_or_else(|p| p.into_inner());
    let mut buf = Vec::new();
    for e in evidence {
        serde_json::to_writer(&mut buf, e).map_err(|e| ExecutorError::Call(e.to_string()))?;
        buf.push(b'\n');
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&openings_path)
        .map_err(ExecutorError::io(format!("opening {}", openings_path.display())))?;
    f.write_all(&buf).map_err(ExecutorError::io("writing trigger openings"))?;
    f.sync_data().map_err(ExecutorError::io("syncing trigger openings"))?;

    let mut line = serde_json::to_vec(&first.public(commitments)?).map_err(|e| ExecutorError::Call(e.to_string()))?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(ExecutorError::io(format!("opening trigger log {}", path.display())))?;
    f.write_all(&line).map_err(ExecutorError::io("writing the trigger log"))?;
    f.sync_data().map_err(ExecutorError::io("syncing the trigger log"))
}

/// The serving copy's transcript for replay: what it received, and an empty transcript
/// for every other declared host of the call. A replay answers and records requests only
/// to hosts in its transcript, so without the empty ones a probe's requests to a host the
/// serving copy never contacted would be denied unrecorded, and an item-dependent burst
/// to such a host would replay as "no requests", never as an item witness.
fn transcript_of(
    received: &BTreeMap<HostName, Vec<Vec<u8>>>,
    declared: &[(HostName, Clearance)],
) -> BTreeMap<HostName, Vec<Vec<u8>>> {
    let mut t = received.clone();
    for (h, _) in declared {
        t.entry(h.clone()).or_default();
    }
    t
}

/// What the broker keeps of each group's copy for evidence.
struct GroupRun {
    view: Vec<ItemName>,
    slot: Map<String, Value>,
    slot_label: Label,
    received: BTreeMap<HostName, Vec<Vec<u8>>>,
    /// The copy's output label.
    label: Label,
}

/// Puts `label` in a result's `_meta` under [`LABEL_META_KEY`], whatever the release put
/// there: a `_meta` that is not an object (null, a string, an array) becomes one, its value
/// kept under [`RELEASE_META_KEY`]; a result that is not an object is wrapped likewise
/// under [`RELEASE_RESULT_KEY`]. A label the release wrote itself is overwritten.
pub fn attach_label(v: &mut Value, label: &Label) {
    if !v.is_object() {
        let inner = std::mem::take(v);
        *v = json!({ RELEASE_RESULT_KEY: inner });
    }
    let Some(obj) = v.as_object_mut() else { return };
    let meta = obj.entry("_meta").or_insert_with(|| json!({}));
    if !meta.is_object() {
        let inner = std::mem::take(meta);
        *meta = json!({ RELEASE_META_KEY: inner });
    }
    if let Some(m) = meta.as_object_mut() {
        m.insert(LABEL_META_KEY.to_owned(), json!(label));
    }
}

/// One group for every member, holding every item: the "splitting off" baseline.
fn single_group_plan(input: &PlanInput) -> Plan {
    let view = View::new(input.items.iter().map(|i| i.name.clone()).collect());
    let mut clearances = BTreeMap::new();
    for (h, c) in &input.hosts {
        clearances.insert(Member::Host(h.clone()), c.clone());
    }
    for (n, c) in &input.consumers {
        clearances.insert(Member::Consumer(n.clone()), c.clone());
    }
    let horizon = Horizon::of(clearances.values()).unwrap_or(Horizon(Clearance::empty()));
    Plan {
        groups: vec![Group {
            view,
            hosts: input.hosts.iter().map(|(h, _)| h.clone()).collect(),
            consumers: input.consumers.iter().map(|(c, _)| c.clone()).collect(),
            horizon,
            clearances,
        }],
    }
}

/// A call's metadata and item contents, read once.
struct PreparedCall {
    tool: String,
    arguments: Map<String, Value>,
    /// (item name, path, contents, the host file's mode and times) of file items.
    files: Vec<(ItemName, PathBuf, Vec<u8>, FileMeta)>,
    /// Argument items: argument name → item name.
    arg_items: BTreeMap<String, ItemName>,
    consumers: Vec<ConsumerName>,
    plan_input: PlanInput,
}

impl PreparedCall {
    fn new(req: &CallRequest, manifest: &Manifest, policy: &Policy) -> Result<PreparedCall, ExecutorError> {
        let decl = manifest.tool(&req.tool);
        let mut items = Vec::new();
        let mut files = Vec::new();
        // Every file is named by its canonical path before it is labelled, planned or
        // handed to a copy: the label is that of the file that will be read.
        let mut seen: std::collections::BTreeSet<PathBuf> = std::collections::BTreeSet::new();
        for given in &req.items {
            let p = policy.canonical_path(given)?;
            if !seen.insert(p.clone()) {
                continue;
            }
            let label = policy.label_path(&p)?;
            let (bytes, meta) = read_item(&p, policy.resolves_paths())?;
            let name = ItemName::new(&p.to_string_lossy())?;
            items.push(Item { name: name.clone(), label });
            files.push((name, p, bytes, meta));
        }
        // Paths named by arguments (per the policy) and fixed paths the tool declares it
        // reads: every labelled regular file there is an item, whether or not the agent
        // host listed it (public metadata decides, never contents).
        let mut named: Vec<PathBuf> = Vec::new();
        for (arg, v) in &req.arguments {
            if policy.is_path_argument(&req.tool, arg) {
                if let Some(s) = v.as_str().filter(|s| !s.is_empty()) {
                    let given = path_of_argument(s)?;
                    if !given.is_absolute() {
                        return Err(ExecutorError::Call(format!("argument {arg} names a relative path {s:?}")));
                    }
                    named.push(given);
                }
            }
        }
        named.extend(
            decl.read_paths
                .iter()
                .filter(|p| p.starts_with('/') && !p.contains(['*', '?', '[', '{']))
                .map(PathBuf::from),
        );
        for p in named_files(&named, policy)? {
            if !seen.insert(p.clone()) {
                continue;
            }
            let label = policy.label_path(&p)?;
            let (bytes, meta) = read_item(&p, policy.resolves_paths())?;
            let name = ItemName::new(&p.to_string_lossy())?;
            items.push(Item { name: name.clone(), label });
            files.push((name, p, bytes, meta));
        }
        let mut arg_items = BTreeMap::new();
        for arg in req.arguments.keys() {
            if let Some(label) = policy.label_argument(&req.tool, arg) {
                let name = ItemName::new(&format!("arg:{arg}"))?;
                items.push(Item { name: name.clone(), label });
                arg_items.insert(arg.clone(), name);
            }
        }
        let mut hosts: Vec<(HostName, Clearance)> =
            decl.hosts.iter().map(|h| (h.clone(), policy.destination_clearance(h))).collect();
        if let Some(arg) = &decl.host_argument {
            if let Some(v) = req.arguments.get(arg).and_then(Value::as_str) {
                let host =
                    host_of(v).ok_or_else(|| ExecutorError::Call(format!("argument {arg} names no host: {v:?}")))?;
                if !hosts.iter().any(|(h, _)| *h == host) {
                    let c = policy.destination_clearance(&host);
                    hosts.push((host, c));
                }
            }
        }
        let names: Vec<String> = if req.consumers.is_empty() { vec!["agent".into()] } else { req.consumers.clone() };
        let mut consumers = Vec::new();
        let mut plan_consumers = Vec::new();
        for n in names {
            let c = ConsumerName::new(&n)?;
            plan_consumers.push((c.clone(), policy.consumer_clearance(&c)?));
            consumers.push(c);
        }
        Ok(PreparedCall {
            tool: req.tool.clone(),
            arguments: req.arguments.clone(),
            files,
            arg_items,
            consumers,
            plan_input: PlanInput { items, hosts, consumers: plan_consumers },
        })
    }

    /// The call's public metadata: arguments with every labelled argument blanked.
    fn public_arguments(&self) -> Map<String, Value> {
        match self.arguments_for(&View::new(Default::default())) {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    /// Name, label and SHA-256 of every item (argument items hash their JSON value).
    fn item_records(&self) -> Vec<ItemRecord> {
        use sha2::{Digest, Sha256};
        let label_of = |n: &ItemName| {
            self.plan_input.items.iter().find(|i| &i.name == n).map(|i| i.label.clone()).unwrap_or_default()
        };
        let mut out: Vec<ItemRecord> = self
            .files
            .iter()
            .map(|(name, _, bytes, _)| ItemRecord {
                name: name.clone(),
                label: label_of(name),
                sha256: hex::encode(Sha256::digest(bytes)),
            })
            .collect();
        for (arg, name) in &self.arg_items {
            let bytes = self.arguments.get(arg).map(|v| serde_json::to_vec(v).unwrap_or_default()).unwrap_or_default();
            out.push(ItemRecord {
                name: name.clone(),
                label: label_of(name),
                sha256: hex::encode(Sha256::digest(&bytes)),
            });
        }
        out
    }

    /// The arguments a copy with `view` receives: out-of-view item arguments blanked
    /// (present by name, empty content).
    fn arguments_for(&self, view: &View) -> Value {
        let mut args = self.arguments.clone();
        for (arg, item) in &self.arg_items {
            if !view.contains(item) {
                if let Some(v) = args.get_mut(arg) {
                    *v = match v {
                        Value::String(_) => Value::String(String::new()),
                        Value::Array(_) => Value::Array(Vec::new()),
                        Value::Object(_) => Value::Object(Map::new()),
                        Value::Number(_) => json!(0),
                        Value::Bool(_) => Value::Bool(false),
                        Value::Null => Value::Null,
                    };
                }
            }
        }
        Value::Object(args)
    }
}

/// Most files one named path (a repository) may contribute to a call.
const MAX_NAMED_FILES: usize = 20_000;

/// The labelled regular files at or under `paths`, by canonical name. A symlink is
/// followed to its target, which is an item under the target's own label (a link from one
/// labelled tree into another does not carry the first tree's label); each directory is
/// walked once. Unlabelled files stay out: they are not user data by the policy's word.
fn named_files(paths: &[PathBuf], policy: &Policy) -> Result<Vec<PathBuf>, ExecutorError> {
    let mut out = std::collections::BTreeSet::new();
    let mut visited = std::collections::BTreeSet::new();
    let mut stack: Vec<PathBuf> = Vec::new();
    for p in paths {
        // A named path that does not exist names no files.
        if let Ok(c) = policy.canonical_path(p) {
            stack.push(c);
        }
    }
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::metadata(&p) else { continue };
        if meta.is_dir() {
            if !visited.insert(p.clone()) {
                continue;
            }
            let rd = std::fs::read_dir(&p).map_err(|e| ExecutorError::Call(format!("item {}: {e}", p.display())))?;
            for e in rd.flatten() {
                let entry = e.path();
                let next = if policy.resolves_paths() {
                    match std::fs::canonicalize(&entry) {
                        Ok(c) => c,
                        Err(_) => continue,
                    }
                } else if std::fs::symlink_metadata(&entry).map(|m| m.file_type().is_symlink()).unwrap_or(true) {
                    continue;
                } else {
                    entry
                };
                stack.push(next);
            }
            if visited.len() > MAX_NAMED_FILES {
                return Err(ExecutorError::Call(format!("more than {MAX_NAMED_FILES} directories named")));
            }
        } else if meta.is_file() && policy.labels_path(&p) {
            out.insert(p);
            if out.len() > MAX_NAMED_FILES {
                return Err(ExecutorError::Call(format!("more than {MAX_NAMED_FILES} item files named")));
            }
        }
    }
    Ok(out.into_iter().collect())
}

/// Reads item `path` (canonical) through a descriptor that is checked to name that very
/// file, so a symlink swapped in after the path was resolved cannot substitute another.
/// Returns the contents and the file's mode and times (what a copy with the item in view
/// sees of them).
fn read_item(path: &Path, check_name: bool) -> Result<(Vec<u8>, FileMeta), ExecutorError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |e: std::io::Error| ExecutorError::Call(format!("item {}: {e}", path.display()));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(if check_name { libc::O_NOFOLLOW } else { 0 })
        .open(path)
        .map_err(err)?;
    let meta = f.metadata().map_err(err)?;
    if !meta.is_file() || meta.len() > MAX_ITEM_BYTES {
        return Err(ExecutorError::Call(format!(
            "item {} must be a regular file of at most {MAX_ITEM_BYTES} bytes",
            path.display()
        )));
    }
    if check_name {
        use std::os::fd::AsRawFd;
        let opened = std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).map_err(err)?;
        if opened != path {
            return Err(ExecutorError::Call(format!(
                "item {} changed while it was read (now {})",
                path.display(),
                opened.display()
            )));
        }
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.by_ref().take(MAX_ITEM_BYTES + 1).read_to_end(&mut bytes).map_err(err)?;
    if bytes.len() as u64 > MAX_ITEM_BYTES {
        return Err(ExecutorError::Call(format!("item {} is over {MAX_ITEM_BYTES} bytes", path.display())));
    }
    Ok((bytes, FileMeta::of(&meta)))
}

/// The path a path-valued argument names: the argument itself, or the path of a local
/// `file:` URI (`file:///srv/a%20b.txt`, `file://localhost/srv/x`), percent-decoded. A
/// `file:` URI naming another host is refused.
fn path_of_argument(s: &str) -> Result<PathBuf, ExecutorError> {
    use std::os::unix::ffi::OsStringExt;
    let Some(rest) = s.strip_prefix("file://") else {
        return Ok(PathBuf::from(s));
    };
    let path = match rest.strip_prefix("localhost") {
        Some(p) if p.starts_with('/') => p,
        _ if rest.starts_with('/') => rest,
        _ => return Err(ExecutorError::Call(format!("{s:?} names a file on another host"))),
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    if out.contains(&0) {
        return Err(ExecutorError::Call(format!("{s:?} names a path with a NUL byte")));
    }
    Ok(PathBuf::from(std::ffi::OsString::from_vec(out)))
}

/// The host named by a URL or bare host argument.
fn host_of(v: &str) -> Option<HostName> {
    let rest = v.split_once("://").map(|(_, r)| r).unwrap_or(v);
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map(|(_, a)| a).unwrap_or(authority);
    let host = authority.rsplit_once(':').map(|(h, _)| h).unwrap_or(authority);
    HostName::new(&host.to_ascii_lowercase()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_removes_only_the_replay_homes_no_live_process_holds() {
        let base = tempfile::tempdir().unwrap();
        let at = |n: &str| base.path().join(n);
        for n in ["replay-dead", "replay-live", ".replay-new-fresh", ".replay-new-old", "shim"] {
            std::fs::create_dir(at(n)).unwrap();
            std::fs::write(at(n).join("f"), n).unwrap();
        }
        // Another open file description: its lock is held as another broker's would be.
        let live = std::fs::File::open(at("replay-live")).unwrap();
        live.lock().unwrap();
        let old = std::time::SystemTime::now() - 2 * REPLAY_HOME_NEW_STALE;
        std::fs::File::open(at(".replay-new-old")).unwrap().set_modified(old).unwrap();
        sweep_replay_homes(base.path());
        let left: Vec<bool> = ["replay-dead", "replay-live", ".replay-new-fresh", ".replay-new-old", "shim"]
            .map(|n| at(n).exists())
            .into();
        assert_eq!(left, [false, true, true, false, true]);
        drop(live);
        sweep_replay_homes(base.path());
        assert!(!at("replay-live").exists(), "its holder gone, the home goes at the next sweep");
    }

    #[test]
    fn file_uris_name_their_local_paths() {
        assert_eq!(path_of_argument("/srv/a.txt").unwrap(), PathBuf::from("/srv/a.txt"));
        assert_eq!(path_of_argument("file:///srv/a%20b.txt").unwrap(), PathBuf::from("/srv/a b.txt"));
        assert_eq!(path_of_argument("file://localhost/srv/x#frag").unwrap(), PathBuf::from("/srv/x"));
        assert!(path_of_argument("file://elsewhere/srv/x").is_err());
        assert!(path_of_argument("file:///srv/%00x").is_err());
        // Decoded `..` is resolved like any other alias when the path is canonicalised.
        assert_eq!(path_of_argument("file:///srv/%2e%2e/etc").unwrap(), PathBuf::from("/srv/../etc"));
    }

    #[test]
    fn every_result_shape_is_labelled() {
        let label: Label = serde_json::from_value(json!(["hr"])).unwrap();
        for (release, kept_meta) in [
            (json!({"content": [], "_meta": null}), Some(Value::Null)),
            (json!({"content": [], "_meta": "x"}), Some(json!("x"))),
            (json!({"content": [], "_meta": [1]}), Some(json!([1]))),
            (json!({"content": [], "_meta": {"dev.germline/label": [], "k": 1}}), None),
            (json!({"content": []}), None),
        ] {
            let mut v = release.clone();
            attach_label(&mut v, &label);
            assert_eq!(v["_meta"][LABEL_META_KEY], json!(["hr"]), "{release} -> {v}");
            if let Some(kept) = kept_meta {
                assert_eq!(v["_meta"][RELEASE_META_KEY], kept, "{release} -> {v}");
            }
        }
        let mut v = json!("bare");
        attach_label(&mut v, &label);
        assert_eq!(v, json!({RELEASE_RESULT_KEY: "bare", "_meta": {LABEL_META_KEY: ["hr"]}}));
    }

    #[test]
    fn egress_of_uncleared_copies_is_reduced() {
        let hr: Label = serde_json::from_value(json!(["hr"])).unwrap();
        let public = Clearance::empty();
        let ev = |group, host: &str, decision: &str, label: &Label| EgressEventOut {
            group,
            host: Some(host.to_owned()),
            decision: decision.to_owned(),
            label: label.clone(),
            count: 1,
        };
        let events = vec![
            ev(0, "7361.example", "denied", &Label::empty()),
            ev(1, "7361.example", "denied", &hr),
            ev(1, "hr.example", "delivered", &hr),
            ev(1, "6c61.example", "denied", &hr),
        ];
        let declared = [HostName::new("hr.example").unwrap()];
        let out = reduce_egress(events, &declared, std::slice::from_ref(&public));
        let text = serde_json::to_string(&out).unwrap();
        assert!(!text.contains("6c61") && text.matches("7361").count() == 1, "{text}");
        let shown: Vec<(usize, Option<&str>, &str, usize)> =
            out.iter().map(|e| (e.group, e.host.as_deref(), e.decision.as_str(), e.count)).collect();
        assert_eq!(
            shown,
            [(0, Some("7361.example"), "denied", 1), (1, None, "denied", 2), (1, Some("hr.example"), "delivered", 1)]
        );
    }

    #[test]
    fn how_an_uncleared_copy_diverged_is_withheld() {
        let hr: Label = serde_json::from_value(json!(["hr"])).unwrap();
        let cleared = Clearance::parse(["hr"]).unwrap();
        let host = HostName::new("ocr.example").unwrap();
        let t = |group_index, position| Trigger {
            host: host.clone(),
            group_index,
            serving_group_index: 0,
            kind: TriggerKind::Mismatch,
            position,
        };
        let triggers = [t(0, 3), t(1, 41)];
        let labels = [Label::empty(), hr.clone()];
        let public = reduce_triggers(&triggers, &labels, &[Clearance::empty()]);
        let text = serde_json::to_string(&public).unwrap();
        assert!(!text.contains("41") && !text.contains("mismatch\",\"position\":41"), "{text}");
        assert_eq!((public[0].kind, public[0].position), (Some(TriggerKind::Mismatch), Some(3)));
        assert_eq!((public[1].kind, public[1].position), (None, None));
        assert_eq!((public[1].host.as_str(), public[1].group_index), ("ocr.example", 1));
        // A caller whose consumers are all cleared for hr sees how; a missing label hides it.
        let all = reduce_triggers(&triggers, &labels, &[cleared.clone(), cleared.clone()]);
        assert_eq!(all[1].position, Some(41));
        let unknown = reduce_triggers(&triggers, &labels[..1], &[cleared]);
        assert_eq!(unknown[1].position, None);
    }

    #[test]
    fn a_trigger_carries_the_serving_copys_label_too() {
        // The serving copy (group 0) held an hr slot; the diverging copy (group 1) held
        // finance only. Where it parted from the record is the record's length: hr's.
        let hr: Label = serde_json::from_value(json!(["hr"])).unwrap();
        let finance: Label = serde_json::from_value(json!(["finance"])).unwrap();
        let t = Trigger {
            host: HostName::new("hr.example").unwrap(),
            group_index: 1,
            serving_group_index: 0,
            kind: TriggerKind::Extra,
            position: 66,
        };
        let out = reduce_triggers(std::slice::from_ref(&t), &[hr, finance], &[Clearance::parse(["finance"]).unwrap()]);
        assert_eq!((out[0].kind, out[0].position), (None, None), "{out:?}");
        assert_eq!(out[0].label, Label::parse(["finance", "hr"]).unwrap());
    }

    #[test]
    fn host_of_urls() {
        assert_eq!(host_of("https://API.example:8443/x?y").unwrap().as_str(), "api.example");
        assert_eq!(host_of("api.example").unwrap().as_str(), "api.example");
        assert!(host_of("http://").is_none());
    }

    #[test]
    fn blanking_keeps_names() {
        let policy =
            Policy::parse("tags=['hr']\n[[items]]\nargument='note'\nlabel=['hr']\n[consumers.agent]\nclearance=['hr']")
                .unwrap();
        let manifest = Manifest::parse("[release]\nname='x'\nversion='1'\nruntime='python'\nmodule='m'").unwrap();
        let mut args = Map::new();
        args.insert("note".into(), json!("SECRET"));
        args.insert("other".into(), json!("public"));
        let p = PreparedCall::new(
            &CallRequest { tool: "t".into(), arguments: args, ..Default::default() },
            &manifest,
            &policy,
        )
        .unwrap();
        let blank = p.arguments_for(&View::new(Default::default()));
        assert_eq!(blank, json!({"note": "", "other": "public"}));
        let full = p.arguments_for(&View::new(p.plan_input.items.iter().map(|i| i.name.clone()).collect()));
        assert_eq!(full["note"], "SECRET");
    }
}
