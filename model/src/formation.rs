//! Formation-consistent dispatch (DESIGN §8) as pure types: what a formed call is bound
//! to, the ordered lifecycle of a release name, and the final-hop fence decision.
//!
//! An agent forms a call from the `tools/list` it saw (a [`FormationSnapshot`]); the host
//! runs it later on whatever release is routed to. The [`FormationRecord`] binds the call
//! (tool, argument digest, policy) to the snapshot's release and to the successors
//! captured for it at formation; [`final_hop_fence`] decides, against the [`Lifecycle`]
//! of the release name, whether a candidate release may run it. Nothing here does I/O:
//! the executor holds the lifecycle under one lock with the fork, the ledger stores the
//! records and events.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::{Label, ModelError, ReleaseHash};

/// A SHA-256 digest of canonical JSON (descriptors, arguments, snapshots, records).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sha256Digest(pub [u8; 32]);

impl Sha256Digest {
    /// SHA-256 of `v`'s canonical JSON ([`canonical_json`]).
    pub fn of_json(v: &Value) -> Self {
        Sha256Digest(Sha256::digest(canonical_json(v).as_bytes()).into())
    }

    /// SHA-256 of a serialisable value's canonical JSON.
    pub fn of<T: Serialize>(v: &T) -> Self {
        Self::of_json(&serde_json::to_value(v).unwrap_or(Value::Null))
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first 12 hex digits, for messages.
    pub fn short(&self) -> String {
        self.to_hex()[..12].to_owned()
    }
}

impl fmt::Debug for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256Digest({})", self.to_hex())
    }
}

impl fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for Sha256Digest {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, ModelError> {
        let h: ReleaseHash = s.parse().map_err(|_| ModelError::BadDigest(s.to_owned()))?;
        Ok(Sha256Digest(h.0))
    }
}

impl Serialize for Sha256Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Sha256Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// Canonical JSON: object keys sorted by their UTF-8 bytes at every level, no
/// whitespace, serde_json's number and string encoding. Two equal values encode equally
/// whatever the key order they arrived in.
pub fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&m[k], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

/// A release name (`[a-z0-9._-]`, 1-128 characters): what a host admits several
/// releases of and routes calls by.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ReleaseName(String);

impl ReleaseName {
    /// Parses a release name.
    pub fn new(s: &str) -> Result<Self, ModelError> {
        let ok = !s.is_empty()
            && s.len() <= 128
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if ok {
            Ok(ReleaseName(s.to_owned()))
        } else {
            Err(ModelError::BadReleaseName(s.to_owned()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ReleaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ReleaseName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ReleaseName::new(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// Digest of one tool descriptor: name, description and input schema, canonical JSON.
pub fn descriptor_digest(tool: &Value) -> Sha256Digest {
    let pick = |k: &str| tool.get(k).cloned().unwrap_or(Value::Null);
    Sha256Digest::of_json(&serde_json::json!({
        "name": pick("name"),
        "description": pick("description"),
        "inputSchema": pick("inputSchema"),
    }))
}

/// What an agent saw when germline answered `tools/list`: the release behind it and the
/// digest of every tool descriptor.
///
/// A list that only a copy holding start-up data could make (issue 16) carries that data's
/// label, and its names are the data's: the copy chose them. Such a snapshot is recorded
/// sealed ([`FormationSnapshot::as_recorded`]): the log holds its name, version, release
/// and label, and in place of the tools a keyed digest of them under a key that only the
/// process that listed them holds, so a reader of the log learns neither a name nor how
/// many there are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FormationSnapshot {
    /// Release name.
    pub name: ReleaseName,
    /// Release version (from its signed manifest).
    pub version: String,
    /// The exact release.
    pub release: ReleaseHash,
    /// Tool name → descriptor digest (empty once sealed).
    pub tools: BTreeMap<String, Sha256Digest>,
    /// The list's label: empty for a list a data-free copy made.
    #[serde(default, skip_serializing_if = "Label::is_empty")]
    pub label: Label,
    /// As recorded, for a labelled list: the keyed digest that stands for `tools`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<Sha256Digest>,
}

impl FormationSnapshot {
    /// The snapshot of a `tools/list` result (`{"tools": [...]}`) answered by `release`.
    pub fn of_tools_list(
        name: ReleaseName,
        version: &str,
        release: ReleaseHash,
        tools_list: &Value,
    ) -> Result<Self, ModelError> {
        let list = tools_list.get("tools").and_then(Value::as_array).ok_or(ModelError::BadToolsList)?;
        let mut tools = BTreeMap::new();
        for t in list {
            let n = t.get("name").and_then(Value::as_str).ok_or(ModelError::BadToolsList)?;
            if tools.insert(n.to_owned(), descriptor_digest(t)).is_some() {
                return Err(ModelError::BadToolsList);
            }
        }
        Ok(FormationSnapshot { name, version: version.to_owned(), release, tools, label: Label::empty(), sealed: None })
    }

    /// The snapshot of a list made by a copy holding data labelled `label`.
    pub fn labelled(mut self, label: Label) -> Self {
        self.label = label;
        self
    }

    /// The snapshot as the log records it: as it is when its list is data-free (or it is
    /// sealed already), else sealed: no tools, and `seal(tools)` in their place.
    pub fn as_recorded(&self, seal: impl FnOnce(&BTreeMap<String, Sha256Digest>) -> Sha256Digest) -> Self {
        if self.label.is_empty() || self.sealed.is_some() {
            return self.clone();
        }
        FormationSnapshot { tools: BTreeMap::new(), sealed: Some(seal(&self.tools)), ..self.clone() }
    }

    /// The snapshot's id (digest of its canonical JSON).
    pub fn id(&self) -> Sha256Digest {
        Sha256Digest::of(self)
    }
}

/// How a snapshot is stored (the ledger body): its id next to it, so a reader recomputes
/// the id and a substituted snapshot shows. A session names what it saw by this id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotEntry {
    /// [`FormationSnapshot::id`] of `snapshot`.
    pub id: Sha256Digest,
    /// The snapshot.
    pub snapshot: FormationSnapshot,
}

impl SnapshotEntry {
    /// Wraps `snapshot` with its id.
    pub fn new(snapshot: FormationSnapshot) -> Self {
        SnapshotEntry { id: snapshot.id(), snapshot }
    }

    /// Checks the stored id against the snapshot.
    pub fn check(&self) -> Result<(), ModelError> {
        id_matches(self.snapshot.id(), self.id)
    }

    /// Whether this is snapshot `id`, read back unaltered.
    pub fn is(&self, id: &Sha256Digest) -> bool {
        self.id == *id && self.check().is_ok()
    }
}

fn id_matches(computed: Sha256Digest, stored: Sha256Digest) -> Result<(), ModelError> {
    if computed == stored {
        Ok(())
    } else {
        Err(ModelError::FormationId(stored.to_hex()))
    }
}

/// Which releases a formed call may run on, chosen per deployment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DispatchPolicy {
    /// Only the formation's source release.
    ExactPin,
    /// Any admitted, unretired release of the same name (execution-time adoption).
    ReleaseWideAllow,
    /// The source only: every successor is denied for pending calls.
    ReleaseWideDeny,
    /// The source, or a successor captured for this call at formation once the source
    /// is retired (formation-consistent dispatch).
    #[default]
    CallSpecific,
}

impl DispatchPolicy {
    /// Every policy, in the order `germline eval fcd` prints them.
    pub const ALL: [DispatchPolicy; 4] = [
        DispatchPolicy::ExactPin,
        DispatchPolicy::ReleaseWideDeny,
        DispatchPolicy::ReleaseWideAllow,
        DispatchPolicy::CallSpecific,
    ];

    /// The name used in configuration and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            DispatchPolicy::ExactPin => "exact_pin",
            DispatchPolicy::ReleaseWideAllow => "release_wide_allow",
            DispatchPolicy::ReleaseWideDeny => "release_wide_deny",
            DispatchPolicy::CallSpecific => "call_specific",
        }
    }
}

impl FromStr for DispatchPolicy {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, ModelError> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s.replace('-', "_"))
            .ok_or_else(|| ModelError::BadPolicy(s.to_owned()))
    }
}

/// A successor captured at formation: its identity and the certificate that its modeled
/// effect for this call fits the call's contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapturedSuccessor {
    /// The successor release.
    pub release: ReleaseHash,
    /// Its version.
    pub version: String,
    /// Digest of the profile summary the decision was made from.
    pub summary: Sha256Digest,
    /// The modeled effect on the successor (e.g. `read`, `reject`).
    pub effect: String,
}

/// A formed call: what it was formed against and what may run it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FormationRecord {
    /// What the caller saw.
    pub snapshot: FormationSnapshot,
    /// The tool called.
    pub tool: String,
    /// Digest of the call's arguments (canonical JSON): another argument is another
    /// formation.
    pub arguments: Sha256Digest,
    /// The deployment's dispatch policy at formation.
    pub policy: DispatchPolicy,
    /// Formation time, Unix milliseconds.
    pub formed_at_ms: u64,
    /// A fresh random value (hex), so two formations of the same call are two records.
    pub nonce: String,
    /// Lifecycle epoch of the release name at formation.
    pub epoch: u64,
    /// The modeled effect of the call on its source, when a profile covers it (the
    /// call's security contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract: Option<String>,
    /// Successors captured at formation (call-specific policy only).
    #[serde(default)]
    pub successors: Vec<CapturedSuccessor>,
}

impl FormationRecord {
    /// The record's id: digest of its canonical JSON.
    pub fn id(&self) -> Sha256Digest {
        Sha256Digest::of(self)
    }

    /// Whether `arguments` are the ones this record was formed with.
    pub fn binds(&self, arguments: &Value) -> bool {
        Sha256Digest::of_json(arguments) == self.arguments
    }
}

/// How a formation is stored (the ledger body): the id next to the record, so a reader
/// recomputes it and a substituted record shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FormationEntry {
    /// [`FormationRecord::id`] of `record`.
    pub id: Sha256Digest,
    /// The record.
    pub record: FormationRecord,
}

impl FormationEntry {
    /// Wraps `record` with its id.
    pub fn new(record: FormationRecord) -> Self {
        FormationEntry { id: record.id(), record }
    }

    /// Checks the stored id against the record.
    pub fn check(&self) -> Result<(), ModelError> {
        id_matches(self.record.id(), self.id)
    }

    /// Whether this is formation `id`, read back unaltered.
    pub fn is(&self, id: &Sha256Digest) -> bool {
        self.id == *id && self.check().is_ok()
    }
}

/// A formed call passed the final-hop fence and is about to run: recorded durably before
/// its copies are forked, so a formation runs at most once, across crashes and restarts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchRecord {
    /// The formation dispatched.
    pub formation: Sha256Digest,
    /// The release that runs it.
    pub release: ReleaseHash,
    /// That release's version.
    pub version: String,
    /// Why the fence let it through.
    pub grant: FenceGrant,
    /// Lifecycle epoch of the name at the fence (held fixed until the copies ran).
    pub epoch: u64,
    /// When, Unix milliseconds.
    pub at_ms: u64,
}

/// One change to which releases of a name exist and which one new formations use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum LifecycleAction {
    /// A release of the name was admitted (not yet used for new formations).
    Admit {
        /// The release.
        release: ReleaseHash,
        /// Its version.
        version: String,
    },
    /// New formations use this release.
    Promote {
        /// The release.
        release: ReleaseHash,
    },
    /// New formations go back to a release that was promoted before.
    RollBack {
        /// The release.
        release: ReleaseHash,
    },
    /// The release runs nothing any more; successors captured against it become eligible.
    Retire {
        /// The release.
        release: ReleaseHash,
    },
}

impl LifecycleAction {
    /// The release the action is about.
    pub fn release(&self) -> ReleaseHash {
        match self {
            LifecycleAction::Admit { release, .. }
            | LifecycleAction::Promote { release }
            | LifecycleAction::RollBack { release }
            | LifecycleAction::Retire { release } => *release,
        }
    }
}

/// A lifecycle change as recorded: the name, its epoch (1, 2, … per name) and the action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleEvent {
    /// The release name.
    pub name: ReleaseName,
    /// The epoch this event starts.
    pub epoch: u64,
    /// What changed.
    #[serde(flatten)]
    pub action: LifecycleAction,
}

/// One admitted release of a name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmittedRelease {
    /// Version.
    pub version: String,
    /// Whether it was retired.
    pub retired: bool,
    /// Whether it was ever promoted (a rollback may only go to such a release).
    pub was_promoted: bool,
}

/// The ordered lifecycle state of one release name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifecycle {
    /// The name.
    pub name: ReleaseName,
    /// Epoch of the last applied event (0: none).
    pub epoch: u64,
    /// Every admitted release.
    pub releases: BTreeMap<ReleaseHash, AdmittedRelease>,
    /// The release new formations use.
    pub current: Option<ReleaseHash>,
}

impl Lifecycle {
    /// The empty lifecycle of `name`.
    pub fn new(name: ReleaseName) -> Self {
        Lifecycle { name, epoch: 0, releases: BTreeMap::new(), current: None }
    }

    /// The event `action` would record next, if it is allowed now.
    pub fn next(&self, action: LifecycleAction) -> Result<LifecycleEvent, ModelError> {
        let ev = LifecycleEvent { name: self.name.clone(), epoch: self.epoch + 1, action };
        self.clone().apply(&ev)?;
        Ok(ev)
    }

    /// Applies a recorded event: its epoch must be the next one and the action allowed.
    pub fn apply(&mut self, ev: &LifecycleEvent) -> Result<(), ModelError> {
        let bad = |why: &str| ModelError::Lifecycle(format!("{} epoch {}: {why}", ev.name, ev.epoch));
        if ev.name != self.name {
            return Err(bad("event for another release name"));
        }
        if ev.epoch != self.epoch + 1 {
            return Err(bad(&format!("expected epoch {}", self.epoch + 1)));
        }
        let r = ev.action.release();
        match &ev.action {
            LifecycleAction::Admit { version, .. } => {
                if self.releases.contains_key(&r) {
                    return Err(bad("release already admitted"));
                }
                self.releases
                    .insert(r, AdmittedRelease { version: version.clone(), retired: false, was_promoted: false });
            }
            LifecycleAction::Promote { .. } | LifecycleAction::RollBack { .. } => {
                let rollback = matches!(ev.action, LifecycleAction::RollBack { .. });
                let st = self.releases.get_mut(&r).ok_or_else(|| bad("release not admitted"))?;
                if st.retired {
                    return Err(bad("release retired"));
                }
                if self.current == Some(r) {
                    return Err(bad("release already current"));
                }
                if rollback && !st.was_promoted {
                    return Err(bad("a rollback goes to a release that was promoted before"));
                }
                st.was_promoted = true;
                self.current = Some(r);
            }
            LifecycleAction::Retire { .. } => {
                let st = self.releases.get_mut(&r).ok_or_else(|| bad("release not admitted"))?;
                if st.retired {
                    return Err(bad("release already retired"));
                }
                if self.current == Some(r) {
                    return Err(bad("the current release cannot be retired: promote or roll back first"));
                }
                st.retired = true;
            }
        }
        self.epoch = ev.epoch;
        Ok(())
    }

    /// Whether `r` is admitted and not retired.
    pub fn is_live(&self, r: &ReleaseHash) -> bool {
        self.releases.get(r).is_some_and(|s| !s.retired)
    }

    /// Version of an admitted release.
    pub fn version(&self, r: &ReleaseHash) -> Option<&str> {
        self.releases.get(r).map(|s| s.version.as_str())
    }
}

/// Why the fence let a call through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FenceGrant {
    /// The candidate is the formation's source.
    Source,
    /// A successor captured at formation, eligible because the source is retired.
    CapturedSuccessor,
    /// Release-wide allow: any live release of the name.
    ReleaseWide,
}

/// Why the fence stopped a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FenceRefusal {
    /// The candidate belongs to another release name.
    OtherName,
    /// The candidate is not (or no longer) admitted and live.
    NotLive,
    /// Exact pinning or release-wide deny: only the source may run it.
    SourceOnly(DispatchPolicy),
    /// The candidate was not captured for this call at formation.
    NotCaptured,
    /// The candidate was captured, but the source is not retired and keeps priority.
    SourceNotRetired,
}

impl fmt::Display for FenceRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceRefusal::OtherName => f.write_str("the release has another name than the formation's source"),
            FenceRefusal::NotLive => f.write_str("the release is not admitted or was retired"),
            FenceRefusal::SourceOnly(p) => {
                write!(f, "policy {} runs a formed call only on its source release", p.as_str())
            }
            FenceRefusal::NotCaptured => f.write_str(
                "it is not the formation's source and was not captured for this call at formation \
                 (its modeled effect does not fit the call, or no profile certifies it)",
            ),
            FenceRefusal::SourceNotRetired => {
                f.write_str("it was captured at formation, but the source is not retired and keeps priority")
            }
        }
    }
}

/// The final-hop fence: may `candidate` (the release whose germline is about to fork the
/// call's copies) run the call formed as `record`, under `lifecycle` as it is now?
///
/// The caller must hold `lifecycle` fixed (one lock or epoch) from this check to the fork.
pub fn final_hop_fence(
    record: &FormationRecord,
    lifecycle: &Lifecycle,
    candidate: &ReleaseHash,
) -> Result<FenceGrant, FenceRefusal> {
    if lifecycle.name != record.snapshot.name {
        return Err(FenceRefusal::OtherName);
    }
    if !lifecycle.is_live(candidate) {
        return Err(FenceRefusal::NotLive);
    }
    let source = record.snapshot.release;
    if *candidate == source {
        return Ok(FenceGrant::Source);
    }
    match record.policy {
        DispatchPolicy::ExactPin | DispatchPolicy::ReleaseWideDeny => Err(FenceRefusal::SourceOnly(record.policy)),
        DispatchPolicy::ReleaseWideAllow => Ok(FenceGrant::ReleaseWide),
        DispatchPolicy::CallSpecific => {
            if !record.successors.iter().any(|s| s.release == *candidate) {
                Err(FenceRefusal::NotCaptured)
            } else if lifecycle.is_live(&source) {
                Err(FenceRefusal::SourceNotRetired)
            } else {
                Ok(FenceGrant::CapturedSuccessor)
            }
        }
    }
}

/// Whether a successor's modeled effects fit a call's contract: every effect the
/// successor may have is one the source had for this call, or a rejection (nothing runs).
pub fn effect_fits(contract: &[String], successor: &[String]) -> bool {
    successor.iter().all(|e| e == "reject" || contract.contains(e))
}

/// A formation-related record as read back from the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FcdRecord {
    /// What a `tools/list` answer showed.
    Snapshot(SnapshotEntry),
    /// A formed call.
    Formation(FormationEntry),
    /// A lifecycle change.
    Lifecycle(LifecycleEvent),
    /// A formed call about to run.
    Dispatch(DispatchRecord),
}

impl FcdRecord {
    /// The release the record is filed under in the log.
    pub fn release(&self) -> ReleaseHash {
        match self {
            FcdRecord::Snapshot(s) => s.snapshot.release,
            FcdRecord::Formation(f) => f.record.snapshot.release,
            FcdRecord::Lifecycle(ev) => ev.action.release(),
            FcdRecord::Dispatch(d) => d.release,
        }
    }
}

/// Where snapshots, formation records, lifecycle events and dispatch records are kept:
/// durable and append-only (the ledger), so a stored record cannot be rolled back or
/// substituted unseen. Errors are messages: the implementations live in crates with their
/// own error types.
pub trait FormationLog: Send + Sync {
    /// Appends a record durably; returns its log index.
    fn append(&self, record: &FcdRecord) -> Result<u64, String>;
    /// The record stored at `index` (checked against its id by the caller).
    fn record_at(&self, index: u64) -> Result<FcdRecord, String>;
    /// Every formation-related record, in log order, with its index.
    fn replay(&self) -> Result<Vec<(u64, FcdRecord)>, String>;

    /// Appends a lifecycle event durably; returns its log index.
    fn append_lifecycle(&self, ev: &LifecycleEvent) -> Result<u64, String> {
        self.append(&FcdRecord::Lifecycle(ev.clone()))
    }

    /// Appends a formation durably; returns its log index.
    fn append_formation(&self, entry: &FormationEntry) -> Result<u64, String> {
        self.append(&FcdRecord::Formation(entry.clone()))
    }

    /// The formation stored at `index`.
    fn formation_at(&self, index: u64) -> Result<FormationEntry, String> {
        match self.record_at(index)? {
            FcdRecord::Formation(f) => Ok(f),
            _ => Err(format!("log entry {index} is not a formation")),
        }
    }

    /// The snapshot stored at `index`.
    fn snapshot_at(&self, index: u64) -> Result<SnapshotEntry, String> {
        match self.record_at(index)? {
            FcdRecord::Snapshot(s) => Ok(s),
            _ => Err(format!("log entry {index} is not a snapshot")),
        }
    }
}

/// An in-memory [`FormationLog`] (tests, and hosts run without a ledger).
#[derive(Debug, Default)]
pub struct MemoryFormationLog {
    records: std::sync::Mutex<Vec<FcdRecord>>,
}

impl MemoryFormationLog {
    fn records(&self) -> std::sync::MutexGuard<'_, Vec<FcdRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the record at `index` (tests: a substituted store).
    pub fn overwrite(&self, index: u64, r: FcdRecord) {
        if let Some(slot) = self.records().get_mut(index as usize) {
            *slot = r;
        }
    }
}

impl FormationLog for MemoryFormationLog {
    fn append(&self, record: &FcdRecord) -> Result<u64, String> {
        let mut v = self.records();
        v.push(record.clone());
        Ok(v.len() as u64 - 1)
    }

    fn record_at(&self, index: u64) -> Result<FcdRecord, String> {
        self.records().get(index as usize).cloned().ok_or_else(|| format!("no record at log index {index}"))
    }

    fn replay(&self) -> Result<Vec<(u64, FcdRecord)>, String> {
        Ok(self.records().iter().cloned().enumerate().map(|(i, r)| (i as u64, r)).collect())
    }
}

/// Replays snapshots, formation records, lifecycle events and dispatch records in log
/// order and reports what does not hold: an epoch out of order, a change the state does
/// not allow, a record whose id is not its digest, a snapshot or formation whose release
/// was not admitted and live under its name when it was recorded, a formation before its
/// snapshot, a dispatch before its formation, twice, or one the fence would not have let
/// through at that point of the log. Used by `germline ledger verify` and by hosts
/// opening a log.
#[derive(Debug, Default)]
pub struct FcdAudit {
    /// Lifecycle state per name after the records seen so far.
    pub lifecycles: BTreeMap<ReleaseName, Lifecycle>,
    /// Snapshot id → log index.
    pub snapshots: BTreeMap<Sha256Digest, u64>,
    /// Formation id → log index.
    pub formations: BTreeMap<Sha256Digest, u64>,
    /// Formation id → log index of its dispatch record.
    pub dispatches: BTreeMap<Sha256Digest, u64>,
    /// Lifecycle events seen.
    pub events: u64,
    records: BTreeMap<Sha256Digest, FormationRecord>,
}

impl FcdAudit {
    /// The lifecycle of `name` with `release` admitted at `version` (and not retired, if
    /// `live`), or why not.
    fn admitted(
        &self,
        name: &ReleaseName,
        release: &ReleaseHash,
        version: &str,
        live: bool,
    ) -> Result<&Lifecycle, String> {
        let l = self.lifecycles.get(name).ok_or_else(|| format!("{name} was never admitted"))?;
        if live && !l.is_live(release) {
            return Err(format!("{} is not a live release of {name}", short_hash(release)));
        }
        if l.version(release) != Some(version) {
            return Err(format!("{} is not an admitted release of {name} at version {version}", short_hash(release)));
        }
        Ok(l)
    }

    /// Checks one record, stored at `index` under header release `header`.
    pub fn check(&mut self, index: u64, header: &ReleaseHash, record: &FcdRecord) -> Result<(), String> {
        let what = match record {
            FcdRecord::Snapshot(_) => "snapshot",
            FcdRecord::Formation(_) => "formation",
            FcdRecord::Lifecycle(_) => "lifecycle",
            FcdRecord::Dispatch(_) => "dispatch",
        };
        if record.release() != *header {
            return Err(format!("{what} entry {index} is filed under another release"));
        }
        self.check_record(index, record).map_err(|e| format!("{what} entry {index}: {e}"))
    }

    fn check_record(&mut self, index: u64, record: &FcdRecord) -> Result<(), String> {
        match record {
            FcdRecord::Lifecycle(ev) => {
                self.events += 1;
                let l = self.lifecycles.entry(ev.name.clone()).or_insert_with(|| Lifecycle::new(ev.name.clone()));
                l.apply(ev).map_err(|e| e.to_string())
            }
            FcdRecord::Snapshot(s) => {
                s.check().map_err(|e| e.to_string())?;
                let snap = &s.snapshot;
                self.admitted(&snap.name, &snap.release, &snap.version, true)?;
                if let Some(first) = self.snapshots.insert(s.id, index) {
                    return Err(format!("snapshot {} recorded twice (first at entry {first})", s.id.short()));
                }
                Ok(())
            }
            FcdRecord::Formation(f) => {
                f.check().map_err(|e| e.to_string())?;
                let r = &f.record;
                // A session that saw a release retired since may still form calls on its
                // snapshot: the fence decides where they may run.
                let l = self.admitted(&r.snapshot.name, &r.snapshot.release, &r.snapshot.version, false)?;
                if r.epoch != l.epoch {
                    return Err(format!("formed at epoch {} but the log is at epoch {}", r.epoch, l.epoch));
                }
                if let Some(s) = r.successors.iter().find(|s| !l.is_live(&s.release)) {
                    return Err(format!("captured successor {} is not live", s.release));
                }
                if let Some(s) = r.successors.iter().find(|s| l.version(&s.release) != Some(s.version.as_str())) {
                    return Err(format!("captured successor {} has another version", s.release));
                }
                if r.successors.iter().any(|s| s.release == r.snapshot.release) {
                    return Err("the source is listed as its own successor".into());
                }
                if r.policy != DispatchPolicy::CallSpecific && !r.successors.is_empty() {
                    return Err("only call-specific formations capture successors".into());
                }
                if !self.snapshots.contains_key(&r.snapshot.id()) {
                    return Err(format!("its snapshot {} was not recorded before it", r.snapshot.id().short()));
                }
                if self.formations.insert(f.id, index).is_some() {
                    return Err(format!("formation {} recorded twice", f.id.short()));
                }
                self.records.insert(f.id, r.clone());
                Ok(())
            }
            FcdRecord::Dispatch(d) => {
                let id = d.formation.short();
                let r = self
                    .records
                    .get(&d.formation)
                    .ok_or_else(|| format!("formation {id} was not recorded before its dispatch"))?;
                if let Some(first) = self.dispatches.get(&d.formation) {
                    return Err(format!("formation {id} dispatched twice (first at entry {first})"));
                }
                let l = self.admitted(&r.snapshot.name, &d.release, &d.version, true)?;
                if d.epoch != l.epoch {
                    return Err(format!("dispatched at epoch {} but the log is at epoch {}", d.epoch, l.epoch));
                }
                match final_hop_fence(r, l, &d.release) {
                    Ok(g) if g == d.grant => {}
                    Ok(g) => return Err(format!("the fence grants {g:?} here, not the recorded {:?}", d.grant)),
                    Err(why) => return Err(format!("the fence refuses formation {id} here: {why}")),
                }
                self.dispatches.insert(d.formation, index);
                Ok(())
            }
        }
    }
}

fn short_hash(r: &ReleaseHash) -> String {
    r.to_hex()[..12].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn h(b: &[u8]) -> ReleaseHash {
        ReleaseHash::of_bytes(b)
    }

    fn name() -> ReleaseName {
        ReleaseName::new("mcp-server-git").unwrap_or_else(|e| panic!("{e}"))
    }

    fn lifecycle(events: &[LifecycleAction]) -> Lifecycle {
        let mut l = Lifecycle::new(name());
        for a in events {
            let ev = l.next(a.clone()).unwrap_or_else(|e| panic!("{e}"));
            l.apply(&ev).unwrap_or_else(|e| panic!("{e}"));
        }
        l
    }

    fn record(source: ReleaseHash, policy: DispatchPolicy, captured: &[ReleaseHash]) -> FormationRecord {
        let tools = json!({"tools": [{"name": "git_diff", "description": "d", "inputSchema": {"type": "object"}}]});
        FormationRecord {
            snapshot: FormationSnapshot::of_tools_list(name(), "2", source, &tools).unwrap_or_else(|e| panic!("{e}")),
            tool: "git_diff".into(),
            arguments: Sha256Digest::of_json(&json!({"target": "main"})),
            policy,
            formed_at_ms: 1,
            nonce: "00".into(),
            epoch: 3,
            contract: Some("read".into()),
            successors: captured
                .iter()
                .map(|r| CapturedSuccessor {
                    release: *r,
                    version: "1".into(),
                    summary: Sha256Digest([0; 32]),
                    effect: "read".into(),
                })
                .collect(),
        }
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"d":[1,{"z":0,"y":"x"}],"c":null}}"#).unwrap_or_default();
        assert_eq!(canonical_json(&a), r#"{"a":{"c":null,"d":[1,{"y":"x","z":0}]},"b":1}"#);
        let b: Value = serde_json::from_str(r#"{"a":{"c":null,"d":[1,{"y":"x","z":0}]},"b":1}"#).unwrap_or_default();
        assert_eq!(Sha256Digest::of_json(&a), Sha256Digest::of_json(&b));
    }

    #[test]
    fn records_are_argument_bound_and_ids_detect_substitution() {
        let r = record(h(b"n"), DispatchPolicy::CallSpecific, &[]);
        assert!(r.binds(&json!({"target": "main"})));
        assert!(!r.binds(&json!({"target": "--output=/tmp/x"})));
        let mut other = r.clone();
        other.arguments = Sha256Digest::of_json(&json!({"target": "dev"}));
        assert_ne!(r.id(), other.id());
        let mut e = FormationEntry::new(r);
        assert!(e.check().is_ok());
        e.record.successors.push(CapturedSuccessor {
            release: h(b"o"),
            version: "1".into(),
            summary: Sha256Digest([0; 32]),
            effect: "read".into(),
        });
        assert!(e.check().is_err(), "an added successor changes the id");
    }

    #[test]
    fn a_labelled_list_is_recorded_without_its_names_and_a_data_free_one_as_it_is() {
        let tools = json!({"tools": [{"name": "GLC-hr-5a17c0ffee", "description": "d"}, {"name": "lookup"}]});
        let free = FormationSnapshot::of_tools_list(name(), "2", h(b"n"), &tools).unwrap_or_else(|e| panic!("{e}"));
        let seal = |t: &BTreeMap<String, Sha256Digest>| Sha256Digest::of(&(7, t));
        // Data-free: recorded as it is, with the id it always had (no new fields).
        let stored = free.as_recorded(seal);
        assert_eq!(stored, free);
        assert!(!serde_json::to_string(&stored).unwrap_or_default().contains("label"));
        // Labelled: the log's copy names no tool and does not say how many there are.
        let hr = free.clone().labelled(Label::parse(["hr"]).unwrap_or_else(|e| panic!("{e}")));
        let stored = hr.as_recorded(seal);
        let text = serde_json::to_string(&SnapshotEntry::new(stored.clone())).unwrap_or_default();
        assert!(!text.contains("GLC-hr") && !text.contains("lookup"), "{text}");
        assert!(stored.tools.is_empty() && stored.sealed == Some(seal(&hr.tools)), "{text}");
        assert_eq!((stored.name, stored.release, stored.label), (hr.name.clone(), hr.release, hr.label.clone()));
        assert_ne!(hr.as_recorded(seal).id(), free.id());
        // Sealing twice changes nothing; another list seals to another digest.
        assert_eq!(hr.as_recorded(seal).as_recorded(|_| Sha256Digest([0; 32])), hr.as_recorded(seal));
        let mut other = hr.clone();
        other.tools.remove("lookup");
        assert_ne!(other.as_recorded(seal).id(), hr.as_recorded(seal).id());
    }

    #[test]
    fn descriptor_digests_cover_name_description_and_schema() {
        let t = json!({"name": "x", "description": "d", "inputSchema": {"type": "object"}, "title": "ignored"});
        let mut u = t.clone();
        u["description"] = json!("e");
        assert_ne!(descriptor_digest(&t), descriptor_digest(&u));
        let mut v = t.clone();
        v["title"] = json!("other");
        assert_eq!(descriptor_digest(&t), descriptor_digest(&v));
    }

    #[test]
    fn lifecycle_orders_and_checks_changes() {
        let (o, n) = (h(b"o"), h(b"n"));
        let admit = |r, v: &str| LifecycleAction::Admit { release: r, version: v.into() };
        let l = lifecycle(&[admit(o, "1"), LifecycleAction::Promote { release: o }, admit(n, "2")]);
        assert_eq!(l.epoch, 3);
        assert!(l.next(LifecycleAction::RollBack { release: n }).is_err(), "never promoted");
        assert!(l.next(LifecycleAction::Retire { release: o }).is_err(), "current");
        let l2 = lifecycle(&[
            admit(o, "1"),
            LifecycleAction::Promote { release: o },
            admit(n, "2"),
            LifecycleAction::Promote { release: n },
            LifecycleAction::RollBack { release: o },
            LifecycleAction::Retire { release: n },
        ]);
        assert_eq!(l2.current, Some(o));
        assert!(!l2.is_live(&n));
        assert!(l2.next(LifecycleAction::Promote { release: n }).is_err(), "retired");
        let mut l3 = l2.clone();
        let stale = LifecycleEvent { name: name(), epoch: 3, action: LifecycleAction::Retire { release: o } };
        assert!(l3.apply(&stale).is_err(), "an out-of-order epoch is refused");
    }

    #[test]
    fn the_fence_keeps_the_source_first_and_successors_captured() {
        let (o, n, m) = (h(b"o"), h(b"n"), h(b"m"));
        let admit = |r, v: &str| LifecycleAction::Admit { release: r, version: v.into() };
        let both = lifecycle(&[
            admit(n, "2"),
            LifecycleAction::Promote { release: n },
            admit(o, "1"),
            admit(m, "3"),
            LifecycleAction::Promote { release: o },
        ]);
        let mut retired = both.clone();
        let ev = retired.next(LifecycleAction::Retire { release: n }).unwrap_or_else(|e| panic!("{e}"));
        retired.apply(&ev).unwrap_or_else(|e| panic!("{e}"));

        let fcd = record(n, DispatchPolicy::CallSpecific, &[o]);
        assert_eq!(final_hop_fence(&fcd, &both, &n), Ok(FenceGrant::Source));
        assert_eq!(final_hop_fence(&fcd, &both, &o), Err(FenceRefusal::SourceNotRetired));
        assert_eq!(final_hop_fence(&fcd, &retired, &o), Ok(FenceGrant::CapturedSuccessor));
        assert_eq!(final_hop_fence(&fcd, &retired, &m), Err(FenceRefusal::NotCaptured));
        assert_eq!(final_hop_fence(&fcd, &retired, &n), Err(FenceRefusal::NotLive));

        for p in [DispatchPolicy::ExactPin, DispatchPolicy::ReleaseWideDeny] {
            let r = record(n, p, &[]);
            assert_eq!(final_hop_fence(&r, &retired, &o), Err(FenceRefusal::SourceOnly(p)));
            assert_eq!(final_hop_fence(&r, &both, &n), Ok(FenceGrant::Source));
        }
        let allow = record(n, DispatchPolicy::ReleaseWideAllow, &[]);
        assert_eq!(final_hop_fence(&allow, &retired, &m), Ok(FenceGrant::ReleaseWide));
        let mut other = Lifecycle::new(ReleaseName::new("other").unwrap_or_else(|e| panic!("{e}")));
        other.releases = retired.releases.clone();
        assert_eq!(final_hop_fence(&allow, &other, &o), Err(FenceRefusal::OtherName));
    }

    #[test]
    fn effects_fit_only_inside_the_contract() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(effect_fits(&s(&["read"]), &s(&["read"])));
        assert!(effect_fits(&s(&["reject"]), &s(&["reject"])));
        assert!(effect_fits(&s(&["read"]), &s(&["reject"])));
        assert!(!effect_fits(&s(&["reject"]), &s(&["fs_write"])));
        assert!(!effect_fits(&s(&["egress:private"]), &s(&["egress:public"])));
    }

    #[test]
    fn policies_parse_from_their_names() {
        for p in DispatchPolicy::ALL {
            assert_eq!(p.as_str().parse::<DispatchPolicy>(), Ok(p));
        }
        assert_eq!("call-specific".parse::<DispatchPolicy>(), Ok(DispatchPolicy::CallSpecific));
        assert!("bogus".parse::<DispatchPolicy>().is_err());
    }
}
