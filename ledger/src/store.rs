//! The RocksDB-backed ledger: durable appends with group commit, tree heads, signed
//! checkpoints, proofs, per-release index and dampening state, and a full audit.
//!
//! Layout (one column family each): `entries` (index → entry encoding), `hashes`
//! (stored-hash index → hash, see [`crate::merkle`]), `release_index` (release ‖ index →
//! ∅), `dampening` (release → state), `checkpoints` (size → signed note), `meta`.
//! Everything one append changes goes into one `WriteBatch`, written with the WAL and
//! `sync` before any caller is told its entry is in the log, so an acknowledged entry
//! survives a crash and a crash never leaves half an entry behind.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use germline_model::ReleaseHash;
use rocksdb::{
    BoundColumnFamily, ColumnFamilyDescriptor, DBWithThreadMode, Direction, IteratorMode, MultiThreaded, Options,
    WaitForCompactOptions, WriteBatch, WriteOptions,
};

use crate::dampening::{DampeningParams, DampeningState, Event};
use crate::entry::{DampeningEventBody, Entry, EntryKind, SuppressionBody};
use crate::fleet::{FleetSuppression, PeerRecord};
use crate::merkle::{self, CompactRange, Hash, HashReader, TreeError};
use crate::note::{Checkpoint, NoteSigner, NoteVerifier};
use crate::LedgerError;

type Db = DBWithThreadMode<MultiThreaded>;

const CF_ENTRIES: &str = "entries";
const CF_HASHES: &str = "hashes";
const CF_RELEASE_INDEX: &str = "release_index";
const CF_DAMPENING: &str = "dampening";
const CF_CHECKPOINTS: &str = "checkpoints";
const CF_META: &str = "meta";
/// release ‖ witness SHA-256 → index of the fleet suppression entry (derived).
const CF_FLEET_SUPPRESSED: &str = "fleet_suppressed";
/// peer name → JSON [`PeerRecord`] (the mirror's own state, not derived from entries).
const CF_FLEET_PEERS: &str = "fleet_peers";
/// Witness state per log origin (`cosigned/<origin>` → size ‖ root) and this log's
/// published cosigned checkpoint (`published` → note).
const CF_FLEET_META: &str = "fleet_meta";
const ALL_CFS: [&str; 9] = [
    CF_ENTRIES,
    CF_HASHES,
    CF_RELEASE_INDEX,
    CF_DAMPENING,
    CF_CHECKPOINTS,
    CF_META,
    CF_FLEET_SUPPRESSED,
    CF_FLEET_PEERS,
    CF_FLEET_META,
];
/// Column families derived from `entries` that [`Ledger::rebuild_index`] can restore.
const DERIVED_CFS: [&str; 3] = [CF_RELEASE_INDEX, CF_DAMPENING, CF_FLEET_SUPPRESSED];

const META_SIZE: &[u8] = b"size";
const META_ORIGIN: &[u8] = b"origin";
const KEY_FILE: &str = "checkpoint.key";
const VKEY_FILE: &str = "checkpoint.vkey";
/// The RocksDB directory inside a ledger directory.
pub(crate) const DB_DIR: &str = "db";

/// Entries per C2SP tile.
pub const TILE_WIDTH: u64 = 256;

/// How to open a ledger.
#[derive(Clone, Debug)]
pub struct LedgerConfig {
    /// Checkpoint origin line and signing-key name. `None`: use the one stored in the
    /// log, or make a fresh `germline.ledger/<random>` for a new log. A different origin
    /// than the stored one is refused, so one log never signs under two names.
    pub origin: Option<String>,
    /// Dampening parameters applied by [`Ledger::record_call`] and the rebuild.
    pub dampening: DampeningParams,
    /// Most appends merged into one durable write (group commit).
    pub max_batch: usize,
    /// `fsync` every write batch before acknowledging. Only benchmarks turn it off.
    pub sync: bool,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig { origin: None, dampening: DampeningParams::default(), max_batch: 1024, sync: true }
    }
}

/// Proof that an entry was appended: where it is and what the tree commits to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendReceipt {
    /// Position in the log.
    pub index: u64,
    /// RFC 6962 leaf hash of the entry's encoding.
    pub leaf_hash: Hash,
}

/// A signed checkpoint and its parsed body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedCheckpoint {
    /// The C2SP signed note text, ready to serve at `/checkpoint`.
    pub note: String,
    /// Parsed body.
    pub checkpoint: Checkpoint,
}

/// Result of [`Ledger::verify`]: what was checked and every problem found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Entries walked.
    pub entries: u64,
    /// Stored hashes compared.
    pub hashes: u64,
    /// Signed checkpoints whose signature and root were checked.
    pub checkpoints: u64,
    /// Releases with dampening state.
    pub releases: u64,
    /// Formation records checked against their ids and the lifecycle replay.
    pub formations: u64,
    /// Lifecycle events replayed.
    pub lifecycle_events: u64,
    /// Formation snapshots (what `tools/list` answers showed) checked against their ids.
    pub snapshots: u64,
    /// Dispatch records checked against their formations and the fence.
    pub dispatches: u64,
    /// Tree head recomputed from the entries alone.
    pub root: Option<Hash>,
    /// Problems, first ones first (capped so a ruined log still reports quickly).
    pub problems: Vec<String>,
}

impl VerifyReport {
    /// Whether the log is intact.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    fn problem(&mut self, p: String) {
        if self.problems.len() < 100 {
            self.problems.push(p);
        }
    }
}

enum Op {
    Append(Entry),
    Call(ReleaseHash, Event),
    FleetSuppress { release: ReleaseHash, witness: [u8; 32], reason: String, peer: Option<(String, PeerRecord)> },
}

enum OpResult {
    Appended(AppendReceipt),
    Called(DampeningState),
    /// The fleet suppression entry's index, and whether this op appended it (false: the
    /// witness had already suppressed the release).
    Suppressed(u64, bool, Option<PeerRecord>),
}

enum Job {
    Ops { ops: Vec<Op>, reply: mpsc::SyncSender<Result<Vec<OpResult>, LedgerError>> },
    Rebuild { reply: mpsc::SyncSender<Result<(), LedgerError>> },
}

type Reply = mpsc::Receiver<Result<Vec<OpResult>, LedgerError>>;

/// An append handed to the writer by [`Ledger::append_async`], not yet known durable.
#[must_use = "an append is only known to be in the log once wait() returns Ok"]
#[derive(Debug)]
pub struct PendingAppend {
    reply: Reply,
}

impl PendingAppend {
    /// Waits until the entry is durable (synced with the rest of its group) and returns
    /// its receipt, or the error that failed its group.
    pub fn wait(self) -> Result<AppendReceipt, LedgerError> {
        match self.reply.recv().map_err(|_| LedgerError::Closed)??.pop() {
            Some(OpResult::Appended(r)) => Ok(r),
            _ => Err(LedgerError::Write("no receipt for the appended entry".into())),
        }
    }
}

struct Inner {
    db: Db,
    signer: NoteSigner,
    origin: String,
    config: LedgerConfig,
    /// Entries durably committed; readers never look past it.
    size: AtomicU64,
    /// Serialises checkpoint signing so heads are stored in order.
    checkpoint_lock: Mutex<()>,
    /// Writes still to fail on purpose (tests of the failure path).
    #[cfg(test)]
    fail_writes: AtomicU64,
}

/// The ledger. Cheap to share between threads (`&Ledger` is enough to append);
/// appends from all threads are merged into few durable writes by one writer thread.
pub struct Ledger {
    inner: Arc<Inner>,
    dir: PathBuf,
    tx: Option<mpsc::Sender<Job>>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("dir", &self.dir)
            .field("origin", &self.inner.origin)
            .field("size", &self.size())
            .finish()
    }
}

fn be(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

fn release_key(release: &ReleaseHash, index: u64) -> [u8; 40] {
    let mut k = [0u8; 40];
    k[..32].copy_from_slice(&release.0);
    k[32..].copy_from_slice(&be(index));
    k
}

fn db_err(context: impl Into<String>) -> impl FnOnce(rocksdb::Error) -> LedgerError {
    let context = context.into();
    move |source| LedgerError::Db { context, source }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LedgerError {
    let context = context.into();
    move |source| LedgerError::Io { context, source }
}

fn read_u64(bytes: &[u8], what: &str) -> Result<u64, LedgerError> {
    <[u8; 8]>::try_from(bytes)
        .map(u64::from_be_bytes)
        .map_err(|_| LedgerError::Corrupt(format!("{what} is not an 8-byte integer")))
}

impl Inner {
    fn cf(&self, name: &str) -> Result<Arc<BoundColumnFamily<'_>>, LedgerError> {
        self.db.cf_handle(name).ok_or_else(|| LedgerError::Corrupt(format!("column family {name} is missing")))
    }

    fn read_hashes_db(&self, indexes: &[u64]) -> Result<Vec<Hash>, TreeError> {
        let cf = self.cf(CF_HASHES).map_err(|e| TreeError::Store(e.to_string()))?;
        let keys: Vec<[u8; 8]> = indexes.iter().map(|&i| be(i)).collect();
        let got = self.db.batched_multi_get_cf(&cf, keys.iter(), false);
        got.into_iter()
            .zip(indexes)
            .map(|(r, &i)| match r {
                Ok(Some(v)) => <[u8; 32]>::try_from(v.as_ref())
                    .map_err(|_| TreeError::Store(format!("stored hash {i} is not 32 bytes"))),
                Ok(None) => Err(TreeError::MissingHash(i)),
                Err(e) => Err(TreeError::Store(format!("reading stored hash {i}: {e}"))),
            })
            .collect()
    }

    fn stored_size(&self) -> Result<u64, LedgerError> {
        let meta = self.cf(CF_META)?;
        match self.db.get_cf(&meta, META_SIZE).map_err(db_err("reading log size"))? {
            Some(v) => read_u64(&v, "log size"),
            None => Ok(0),
        }
    }

    fn dampening_state(&self, release: &ReleaseHash) -> Result<DampeningState, LedgerError> {
        let cf = self.cf(CF_DAMPENING)?;
        match self.db.get_cf(&cf, release.0).map_err(db_err("reading dampening state"))? {
            Some(v) => DampeningState::from_bytes(&v)
                .ok_or_else(|| LedgerError::Corrupt(format!("dampening state of {release} is malformed"))),
            None => Ok(DampeningState::default()),
        }
    }

    fn write(&self, batch: WriteBatch) -> Result<(), LedgerError> {
        #[cfg(test)]
        if self.fail_writes.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok() {
            return Err(LedgerError::Write("write failed on purpose".into()));
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(self.config.sync);
        wo.disable_wal(false);
        self.db.write_opt(batch, &wo).map_err(db_err("writing batch"))
    }

    fn latest_checkpoint(&self) -> Result<Option<SignedCheckpoint>, LedgerError> {
        let cf = self.cf(CF_CHECKPOINTS)?;
        let mut it = self.db.iterator_cf(&cf, IteratorMode::End);
        match it.next() {
            None => Ok(None),
            Some(item) => {
                let (_, v) = item.map_err(db_err("reading latest checkpoint"))?;
                let note = String::from_utf8(v.to_vec())
                    .map_err(|_| LedgerError::Corrupt("stored checkpoint is not UTF-8".into()))?;
                let checkpoint = Checkpoint::open_signed(&note, &self.signer.verifier(), &self.origin)?;
                Ok(Some(SignedCheckpoint { note, checkpoint }))
            }
        }
    }
}

impl HashReader for Inner {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, TreeError> {
        self.read_hashes_db(indexes)
    }
}

/// Hashes written earlier in the batch being built, over the committed store.
struct Pending<'a> {
    inner: &'a Inner,
    batch: WriteBatch,
    size: u64,
    hashes: HashMap<u64, Hash>,
    states: HashMap<ReleaseHash, DampeningState>,
    fleet: HashMap<[u8; 64], u64>,
}

impl HashReader for Pending<'_> {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, TreeError> {
        let missing: Vec<u64> = indexes.iter().copied().filter(|i| !self.hashes.contains_key(i)).collect();
        let mut from_db =
            if missing.is_empty() { Vec::new() } else { self.inner.read_hashes_db(&missing)? }.into_iter();
        indexes
            .iter()
            .map(|i| match self.hashes.get(i) {
                Some(h) => Ok(*h),
                None => from_db.next().ok_or(TreeError::MissingHash(*i)),
            })
            .collect()
    }
}

impl Pending<'_> {
    fn append(&mut self, entry: &Entry) -> Result<AppendReceipt, LedgerError> {
        let data = entry.encode();
        let index = self.size;
        let leaf = merkle::leaf_hash(&data);
        let new_hashes = merkle::stored_hashes_for_record(index, leaf, &*self)?;
        let entries = self.inner.cf(CF_ENTRIES)?;
        let hashes = self.inner.cf(CF_HASHES)?;
        let by_release = self.inner.cf(CF_RELEASE_INDEX)?;
        self.batch.put_cf(&entries, be(index), &data);
        let first = merkle::stored_hash_index(0, index);
        for (k, h) in new_hashes.into_iter().enumerate() {
            let at = first + k as u64;
            self.batch.put_cf(&hashes, be(at), h);
            self.hashes.insert(at, h);
        }
        self.batch.put_cf(&by_release, release_key(&entry.release, index), b"");
        self.size += 1;
        Ok(AppendReceipt { index, leaf_hash: leaf })
    }

    fn call(&mut self, release: ReleaseHash, event: Event) -> Result<DampeningState, LedgerError> {
        let before = match self.states.get(&release) {
            Some(s) => *s,
            None => self.inner.dampening_state(&release)?,
        };
        let mut state = before;
        state.on_call(&self.inner.config.dampening, event);
        let body =
            serde_json::to_vec(&DampeningEventBody { event, state }).map_err(|e| LedgerError::Encode(e.to_string()))?;
        self.append(&Entry::new(EntryKind::DampeningEvent, release, body))?;
        if state.suppressed != before.suppressed {
            let body = serde_json::to_vec(&SuppressionBody {
                suppressed: state.suppressed,
                penalty: state.penalty,
                reason: "dampening".into(),
                witness_sha256: None,
            })
            .map_err(|e| LedgerError::Encode(e.to_string()))?;
            self.append(&Entry::new(EntryKind::Suppression, release, body))?;
        }
        let cf = self.inner.cf(CF_DAMPENING)?;
        self.batch.put_cf(&cf, release.0, state.to_bytes());
        self.states.insert(release, state);
        Ok(state)
    }

    /// Appends a sticky fleet suppression unless this witness already suppressed the
    /// release (in the store or earlier in this batch): replays after a crash between
    /// the append and the mirror's cursor update are harmless.
    fn fleet_suppress(
        &mut self,
        release: ReleaseHash,
        witness: [u8; 32],
        reason: &str,
    ) -> Result<(u64, bool), LedgerError> {
        let key = fleet_key(&release, &witness);
        if let Some(i) = self.fleet.get(&key) {
            return Ok((*i, false));
        }
        let cf = self.inner.cf(CF_FLEET_SUPPRESSED)?;
        if let Some(v) = self.inner.db.get_cf(&cf, key).map_err(db_err("reading fleet suppressions"))? {
            return Ok((read_u64(&v, "fleet suppression index")?, false));
        }
        let penalty = match self.states.get(&release) {
            Some(s) => s.penalty,
            None => self.inner.dampening_state(&release)?.penalty,
        };
        let body = serde_json::to_vec(&SuppressionBody {
            suppressed: true,
            penalty,
            reason: reason.to_owned(),
            witness_sha256: Some(hex::encode(witness)),
        })
        .map_err(|e| LedgerError::Encode(e.to_string()))?;
        let receipt = self.append(&Entry::new(EntryKind::Suppression, release, body))?;
        self.batch.put_cf(&cf, key, be(receipt.index));
        self.fleet.insert(key, receipt.index);
        Ok((receipt.index, true))
    }
}

impl Pending<'_> {
    fn put_peer(&mut self, name: &str, record: &PeerRecord) -> Result<(), LedgerError> {
        let cf = self.inner.cf(CF_FLEET_PEERS)?;
        let bytes = serde_json::to_vec(record).map_err(|e| LedgerError::Encode(e.to_string()))?;
        self.batch.put_cf(&cf, name.as_bytes(), bytes);
        Ok(())
    }
}

fn fleet_key(release: &ReleaseHash, witness: &[u8; 32]) -> [u8; 64] {
    let mut k = [0u8; 64];
    k[..32].copy_from_slice(&release.0);
    k[32..].copy_from_slice(witness);
    k
}

/// The fleet-suppression key of a Suppression entry that carries a witness hash.
fn fleet_key_of(entry: &Entry) -> Option<[u8; 64]> {
    if entry.kind != EntryKind::Suppression {
        return None;
    }
    let body: SuppressionBody = serde_json::from_slice(&entry.body).ok()?;
    let mut w = [0u8; 32];
    hex::decode_to_slice(body.witness_sha256?, &mut w).ok()?;
    body.suppressed.then(|| fleet_key(&entry.release, &w))
}

fn writer_loop(inner: Arc<Inner>, rx: mpsc::Receiver<Job>) {
    let max_batch = inner.config.max_batch.max(1);
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        let mut count = 0usize;
        loop {
            count += match jobs.last() {
                Some(Job::Ops { ops, .. }) => ops.len(),
                _ => 1,
            };
            if count >= max_batch {
                break;
            }
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let mut group = Vec::new();
        for job in jobs {
            match job {
                Job::Ops { ops, reply } => group.push((ops, reply)),
                Job::Rebuild { reply } => {
                    commit_group(&inner, std::mem::take(&mut group));
                    let _ = reply.send(rebuild(&inner));
                }
            }
        }
        commit_group(&inner, group);
    }
}

type Group = Vec<(Vec<Op>, mpsc::SyncSender<Result<Vec<OpResult>, LedgerError>>)>;

/// Builds one write batch from all pending jobs, writes it durably, then answers them.
fn commit_group(inner: &Inner, group: Group) {
    if group.is_empty() {
        return;
    }
    let start = inner.size.load(Ordering::Acquire);
    let mut pending = Pending {
        inner,
        batch: WriteBatch::default(),
        size: start,
        hashes: HashMap::new(),
        states: HashMap::new(),
        fleet: HashMap::new(),
    };
    let mut answers: Vec<Result<Vec<OpResult>, LedgerError>> = Vec::with_capacity(group.len());
    let mut failure: Option<String> = None;
    for (ops, _) in &group {
        let invalid = ops.iter().find_map(|op| match op {
            Op::Append(e) => e.validate().err(),
            Op::Call(..) | Op::FleetSuppress { .. } => None,
        });
        if let Some(e) = invalid {
            answers.push(Err(LedgerError::Entry(e)));
            continue;
        }
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            let r = match op {
                Op::Append(e) => pending.append(e).map(OpResult::Appended),
                Op::Call(release, event) => pending.call(*release, *event).map(OpResult::Called),
                Op::FleetSuppress { release, witness, reason, peer } => {
                    pending.fleet_suppress(*release, *witness, reason).and_then(|(i, new)| {
                        let peer = match peer {
                            Some((name, rec)) => {
                                let mut rec = rec.clone();
                                rec.suppressions += u64::from(new);
                                pending.put_peer(name, &rec)?;
                                Some(rec)
                            }
                            None => None,
                        };
                        Ok(OpResult::Suppressed(i, new, peer))
                    })
                }
            };
            match r {
                Ok(r) => results.push(r),
                Err(e) => {
                    failure = Some(e.to_string());
                    break;
                }
            }
        }
        if failure.is_some() {
            break;
        }
        answers.push(Ok(results));
    }
    let outcome = match failure {
        Some(f) => Err(f),
        None => {
            let end = pending.size;
            match inner.cf(CF_META) {
                Ok(meta) => {
                    pending.batch.put_cf(&meta, META_SIZE, be(end));
                    inner.write(pending.batch).map(|()| end).map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            }
        }
    };
    match outcome {
        Ok(end) => {
            inner.size.store(end, Ordering::Release);
            for ((_, reply), answer) in group.into_iter().zip(answers) {
                let _ = reply.send(answer);
            }
        }
        Err(msg) => {
            for (_, reply) in group {
                let _ = reply.send(Err(LedgerError::Write(msg.clone())));
            }
        }
    }
}

/// Recomputes the per-release index and dampening state from the entries.
fn rebuild(inner: &Inner) -> Result<(), LedgerError> {
    let size = inner.size.load(Ordering::Acquire);
    let by_release = inner.cf(CF_RELEASE_INDEX)?;
    let damp = inner.cf(CF_DAMPENING)?;
    let fleet = inner.cf(CF_FLEET_SUPPRESSED)?;
    let mut batch = WriteBatch::default();
    batch.delete_range_cf(&by_release, [0u8; 0].as_slice(), [0xffu8; 41].as_slice());
    batch.delete_range_cf(&damp, [0u8; 0].as_slice(), [0xffu8; 33].as_slice());
    batch.delete_range_cf(&fleet, [0u8; 0].as_slice(), [0xffu8; 65].as_slice());
    let (index, states, suppressions) = derive_index(inner, size)?;
    for key in index {
        batch.put_cf(&by_release, key, b"");
    }
    for (release, state) in states {
        batch.put_cf(&damp, release.0, state.to_bytes());
    }
    for (key, i) in suppressions {
        batch.put_cf(&fleet, key, be(i));
    }
    inner.write(batch)
}

type Derived = (BTreeSet<[u8; 40]>, BTreeMap<ReleaseHash, DampeningState>, BTreeMap<[u8; 64], u64>);

/// Replays entries `0..size` into the release index and dampening states they imply.
fn derive_index(inner: &Inner, size: u64) -> Result<Derived, LedgerError> {
    let entries = inner.cf(CF_ENTRIES)?;
    let mut index = BTreeSet::new();
    let mut states: BTreeMap<ReleaseHash, DampeningState> = BTreeMap::new();
    let mut suppressions = BTreeMap::new();
    for item in inner.db.iterator_cf(&entries, IteratorMode::Start) {
        let (k, v) = item.map_err(db_err("reading entries"))?;
        let i = read_u64(&k, "entry key")?;
        if i >= size {
            break;
        }
        let entry = Entry::decode(&v).map_err(|e| LedgerError::CorruptEntry { index: i, source: e })?;
        index.insert(release_key(&entry.release, i));
        if entry.kind == EntryKind::DampeningEvent {
            let body: DampeningEventBody = serde_json::from_slice(&entry.body)
                .map_err(|e| LedgerError::Corrupt(format!("dampening entry {i} has a bad body: {e}")))?;
            states.entry(entry.release).or_default().on_call(&inner.config.dampening, body.event);
        }
        if let Some(key) = fleet_key_of(&entry) {
            suppressions.entry(key).or_insert(i);
        }
    }
    Ok((index, states, suppressions))
}

/// Loads or creates the checkpoint signing key; refuses a key file others can read.
fn load_or_create_key(dir: &Path, origin: &str) -> Result<NoteSigner, LedgerError> {
    let path = dir.join(KEY_FILE);
    let signer = match fs::read_to_string(&path) {
        Ok(text) => {
            let mode = fs::metadata(&path).map_err(io_err(format!("stat {}", path.display())))?.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(LedgerError::Config(format!(
                    "{} is readable by others (mode {:o}); chmod 600 it",
                    path.display(),
                    mode & 0o777
                )));
            }
            let signer = NoteSigner::from_key_text(&text)?;
            if signer.verifier().name() != origin {
                return Err(LedgerError::Config(format!(
                    "{} signs as {:?}, but the log's origin is {origin:?}",
                    path.display(),
                    signer.verifier().name()
                )));
            }
            signer
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let signer = NoteSigner::generate(origin)?;
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(io_err(format!("creating {}", path.display())))?;
            f.write_all(signer.to_key_text().as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(io_err(format!("writing {}", path.display())))?;
            signer
        }
        Err(e) => return Err(io_err(format!("reading {}", path.display()))(e)),
    };
    let vkey = dir.join(VKEY_FILE);
    fs::write(&vkey, format!("{}\n", signer.verifier().to_vkey()))
        .map_err(io_err(format!("writing {}", vkey.display())))?;
    Ok(signer)
}

/// Info-log files RocksDB keeps (the current one included). Every open starts a new
/// one, so the default (1,000) let a CLI that opens the ledger per command pile up
/// hundreds of megabytes of logs.
const INFO_LOGS_KEPT: usize = 2;
/// Largest info-log file before RocksDB starts a new one.
const INFO_LOG_MAX_BYTES: usize = 1 << 20;
/// Sorted runs per column family that start a merge (universal compaction). Each open
/// adds one run per family it wrote to, and a process waits for its merges before it
/// ends. At 4, nearly every CLI command merged five families, and the merges got
/// larger as the ledger grew (`ledger call` 12-15% slower at entry 10,000 than at entry
/// 1); at 8 most commands merge nothing, and each merge takes in more runs, so fewer
/// bytes are rewritten per entry. Opening reads about this many files per family.
const RUNS_BEFORE_MERGE: i32 = 8;
/// The one table compression RocksDB is built with (ledger/Cargo.toml turns the
/// others off). Snappy is RocksDB's default whenever it is linked, so every ledger
/// written before the others were cut uses it and stays readable. Naming it here makes
/// a build without Snappy refuse to open a ledger (RocksDB checks that a configured
/// compression is linked) instead of silently writing uncompressed tables.
const TABLE_COMPRESSION: rocksdb::DBCompressionType = rocksdb::DBCompressionType::Snappy;
/// How long closing waits for merges already under way.
const CLOSE_COMPACTION_WAIT_US: u64 = 10_000_000;
/// Table files in one column family above which opening merges it whole. Universal
/// compaction keeps a handful; logs written before it (one sorted run of hundreds of
/// tiny files per open) are merged once.
const TABLE_FILES_MERGE_ABOVE: usize = 64;

/// Merges every column family that has more than [`TABLE_FILES_MERGE_ABOVE`] files.
fn merge_scattered_tables(db: &Db) -> Result<(), LedgerError> {
    let mut per_cf: HashMap<String, usize> = HashMap::new();
    for f in db.live_files().map_err(db_err("listing table files"))? {
        *per_cf.entry(f.column_family_name).or_default() += 1;
    }
    for (name, files) in per_cf {
        if files > TABLE_FILES_MERGE_ABOVE {
            if let Some(cf) = db.cf_handle(&name) {
                db.compact_range_cf(&cf, None::<&[u8]>, None::<&[u8]>);
            }
        }
    }
    Ok(())
}

fn db_options() -> Options {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_keep_log_file_num(INFO_LOGS_KEPT);
    opts.set_max_log_file_size(INFO_LOG_MAX_BYTES);
    // Opening loads every table file's reader. With more than one opening thread,
    // RocksDB starts that many threads per column family whatever its file count (150
    // thread starts per open for ten families), a quarter of a CLI command's time;
    // universal compaction keeps a few files per family, which one thread opens faster.
    opts.set_max_file_opening_threads(1);
    opts.set_compression_type(TABLE_COMPRESSION);
    opts
}

/// Every open replays the previous process's WAL into one new table file per column
/// family it touched. Universal compaction merges those small sorted runs into few
/// (each merge rewrites only runs of similar size, so a large log is not rewritten per
/// open), and [`Ledger`]'s drop waits for merges under way, so short-lived processes
/// do not leave their files behind.
fn cf_options() -> Options {
    let mut opts = Options::default();
    opts.set_compaction_style(rocksdb::DBCompactionStyle::Universal);
    opts.set_level_zero_file_num_compaction_trigger(RUNS_BEFORE_MERGE);
    opts.set_compression_type(TABLE_COMPRESSION);
    opts
}

fn random_origin() -> Result<String, LedgerError> {
    let mut b = [0u8; 4];
    getrandom::getrandom(&mut b).map_err(|e| LedgerError::Config(format!("no randomness for an origin: {e}")))?;
    Ok(format!("germline.ledger/{}", hex::encode(b)))
}

impl Ledger {
    /// Opens (or creates) the ledger in `dir`: RocksDB under `dir/db`, the checkpoint
    /// signing key in `dir/checkpoint.key` (mode 0600) and its verifier key in
    /// `dir/checkpoint.vkey`. If a derived column family (release index, dampening) was
    /// lost, it is rebuilt from the entries before the ledger is returned.
    pub fn open(dir: impl AsRef<Path>, config: LedgerConfig) -> Result<Ledger, LedgerError> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(0o700));
        let db_path = dir.join(DB_DIR);
        let opts = db_options();
        let existing = Db::list_cf(&opts, &db_path).ok();
        let lost_derived = existing.as_ref().is_some_and(|cfs| {
            cfs.iter().any(|c| c == CF_ENTRIES) && DERIVED_CFS.iter().any(|d| !cfs.iter().any(|c| c == d))
        });
        let cfs = ALL_CFS.iter().map(|n| ColumnFamilyDescriptor::new(*n, cf_options()));
        let db =
            Db::open_cf_descriptors(&opts, &db_path, cfs).map_err(db_err(format!("opening {}", db_path.display())))?;
        merge_scattered_tables(&db)?;

        let meta = db.cf_handle(CF_META).ok_or_else(|| LedgerError::Corrupt("meta column family missing".into()))?;
        let stored_origin = db
            .get_cf(&meta, META_ORIGIN)
            .map_err(db_err("reading origin"))?
            .map(|v| String::from_utf8(v).map_err(|_| LedgerError::Corrupt("origin is not UTF-8".into())))
            .transpose()?;
        let origin = match (&stored_origin, &config.origin) {
            (Some(s), Some(c)) if s != c => {
                return Err(LedgerError::Config(format!("log origin is {s:?}, refusing to open it as {c:?}")))
            }
            (Some(s), _) => s.clone(),
            (None, Some(c)) => c.clone(),
            (None, None) => random_origin()?,
        };
        let signer = load_or_create_key(&dir, &origin)?;
        if stored_origin.is_none() {
            let mut wo = WriteOptions::default();
            wo.set_sync(true);
            db.put_cf_opt(&meta, META_ORIGIN, origin.as_bytes(), &wo).map_err(db_err("storing origin"))?;
        }
        drop(meta);

        let inner = Inner {
            db,
            signer,
            origin,
            config,
            size: AtomicU64::new(0),
            checkpoint_lock: Mutex::new(()),
            #[cfg(test)]
            fail_writes: AtomicU64::new(0),
        };
        let size = inner.stored_size()?;
        inner.size.store(size, Ordering::Release);
        if lost_derived {
            rebuild(&inner)?;
        }
        let inner = Arc::new(inner);
        let (tx, rx) = mpsc::channel();
        let writer_inner = Arc::clone(&inner);
        let writer = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || writer_loop(writer_inner, rx))
            .map_err(io_err("starting the ledger writer thread"))?;
        Ok(Ledger { inner, dir, tx: Some(tx), writer: Some(writer) })
    }

    fn submit_async(&self, ops: Vec<Op>) -> Result<Reply, LedgerError> {
        let (reply, rx) = mpsc::sync_channel(1);
        self.tx.as_ref().ok_or(LedgerError::Closed)?.send(Job::Ops { ops, reply }).map_err(|_| LedgerError::Closed)?;
        Ok(rx)
    }

    fn submit(&self, ops: Vec<Op>) -> Result<Vec<OpResult>, LedgerError> {
        self.submit_async(ops)?.recv().map_err(|_| LedgerError::Closed)?
    }

    /// Appends one entry and returns once it is durable.
    pub fn append(&self, entry: Entry) -> Result<AppendReceipt, LedgerError> {
        self.append_async(entry)?.wait()
    }

    /// Hands one entry to the writer and returns at once; [`PendingAppend::wait`] says
    /// when it is durable. One thread can keep many appends in flight this way, and the
    /// writer commits all that are waiting with one synced write (group commit), as it
    /// does for appends from many threads. Entries are logged in submission order.
    pub fn append_async(&self, entry: Entry) -> Result<PendingAppend, LedgerError> {
        Ok(PendingAppend { reply: self.submit_async(vec![Op::Append(entry)])? })
    }

    /// Appends entries contiguously and atomically (all or none), durable on return.
    pub fn append_many(&self, entries: Vec<Entry>) -> Result<Vec<AppendReceipt>, LedgerError> {
        let results = self.submit(entries.into_iter().map(Op::Append).collect())?;
        Ok(results
            .into_iter()
            .filter_map(|r| match r {
                OpResult::Appended(a) => Some(a),
                OpResult::Called(_) | OpResult::Suppressed(..) => None,
            })
            .collect())
    }

    /// Appends a witness entry of `entry.release` and, when its verdict is a verified one,
    /// the [`Event::Verdict`] it adds to that release's penalty, in one durable batch so
    /// that neither is in the log without the other. Returns the witness's receipt and
    /// the release's dampening state after it.
    pub fn record_witness(
        &self,
        entry: Entry,
        verified: bool,
    ) -> Result<(AppendReceipt, Option<DampeningState>), LedgerError> {
        let release = entry.release;
        let mut ops = vec![Op::Append(entry)];
        if verified {
            ops.push(Op::Call(release, Event::Verdict));
        }
        let mut results = self.submit(ops)?.into_iter();
        let receipt = match results.next() {
            Some(OpResult::Appended(r)) => r,
            _ => return Err(LedgerError::Write("no receipt for the witness".into())),
        };
        let state = match results.next() {
            Some(OpResult::Called(s)) => Some(s),
            _ => None,
        };
        Ok((receipt, state))
    }

    /// Counts one call attempt to `release` (refused calls included): decays and adds
    /// the event's weight, logs a dampening-event entry (plus a suppression entry if
    /// the release flips) and stores the new state, all in one durable batch.
    pub fn record_call(&self, release: &ReleaseHash, event: Event) -> Result<DampeningState, LedgerError> {
        match self.submit(vec![Op::Call(*release, event)])?.pop() {
            Some(OpResult::Called(s)) => Ok(s),
            _ => Err(LedgerError::Write("no state for the recorded call".into())),
        }
    }

    /// Current dampening state of a release; a hash never seen is at penalty 0. A
    /// release with a fleet suppression is suppressed whatever its penalty.
    pub fn dampening_state(&self, release: &ReleaseHash) -> Result<DampeningState, LedgerError> {
        let mut state = self.inner.dampening_state(release)?;
        if !state.suppressed && !self.fleet_suppressions(release)?.is_empty() {
            state.suppressed = true;
        }
        Ok(state)
    }

    /// Suppresses `release` fleet-wide on the verified witness whose SHA-256 is
    /// `witness`: appends a Suppression entry (reason as given, e.g. `"fleet: witness
    /// <sha256> from <peer> entry <n>"`) unless that witness already suppressed it, in
    /// one durable batch with the index that makes the suppression sticky.
    ///
    /// Sticky, because a verified witness is a proof that this exact release moved data
    /// where it may not go; unlike a penalty, a proof does not decay. Returns the
    /// entry's index and whether this call appended it.
    pub fn suppress(&self, release: &ReleaseHash, witness: [u8; 32], reason: &str) -> Result<(u64, bool), LedgerError> {
        let op = Op::FleetSuppress { release: *release, witness, reason: reason.to_owned(), peer: None };
        match self.submit(vec![op])?.pop() {
            Some(OpResult::Suppressed(i, new, _)) => Ok((i, new)),
            _ => Err(LedgerError::Write("no result for the suppression".into())),
        }
    }

    /// [`Ledger::suppress`] and the mirror's record of `peer` (its cursor moved past the
    /// witness; `suppressions` is incremented here if the entry is new) in one durable
    /// write batch, so a crash never separates the two. Returns the stored record.
    pub fn suppress_from_peer(
        &self,
        release: &ReleaseHash,
        witness: [u8; 32],
        reason: &str,
        peer: &str,
        record: PeerRecord,
    ) -> Result<(u64, bool, PeerRecord), LedgerError> {
        let op = Op::FleetSuppress {
            release: *release,
            witness,
            reason: reason.to_owned(),
            peer: Some((peer.to_owned(), record)),
        };
        match self.submit(vec![op])?.pop() {
            Some(OpResult::Suppressed(i, new, Some(rec))) => Ok((i, new, rec)),
            _ => Err(LedgerError::Write("no result for the suppression".into())),
        }
    }

    /// The fleet suppressions of a release: (witness SHA-256, entry index), by witness.
    pub fn fleet_suppressions(&self, release: &ReleaseHash) -> Result<Vec<FleetSuppression>, LedgerError> {
        let cf = self.inner.cf(CF_FLEET_SUPPRESSED)?;
        let size = self.size();
        let mut out = Vec::new();
        let it = self.inner.db.iterator_cf(&cf, IteratorMode::From(release.0.as_slice(), Direction::Forward));
        for item in it {
            let (k, v) = item.map_err(db_err("reading fleet suppressions"))?;
            if k.len() != 64 || k[..32] != release.0 {
                break;
            }
            let index = read_u64(&v, "fleet suppression index")?;
            if index < size {
                let mut witness = [0u8; 32];
                witness.copy_from_slice(&k[32..]);
                out.push(FleetSuppression { witness_sha256: witness, index });
            }
        }
        Ok(out)
    }

    /// The mirror's stored state for peer `name`, if any.
    pub fn peer_record(&self, name: &str) -> Result<Option<PeerRecord>, LedgerError> {
        let cf = self.inner.cf(CF_FLEET_PEERS)?;
        match self.inner.db.get_cf(&cf, name.as_bytes()).map_err(db_err(format!("reading peer {name}")))? {
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| LedgerError::Corrupt(format!("peer record {name}: {e}"))),
            None => Ok(None),
        }
    }

    /// Stores the mirror's state for peer `name` durably (synced before returning).
    pub fn put_peer_record(&self, name: &str, record: &PeerRecord) -> Result<(), LedgerError> {
        let cf = self.inner.cf(CF_FLEET_PEERS)?;
        let bytes = serde_json::to_vec(record).map_err(|e| LedgerError::Encode(e.to_string()))?;
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.inner.db.put_cf_opt(&cf, name.as_bytes(), bytes, &wo).map_err(db_err(format!("storing peer {name}")))
    }

    /// The latest checkpoint this host cosigned for the log `origin` (as a witness).
    pub fn cosigned_head(&self, origin: &str) -> Result<Option<(u64, Hash)>, LedgerError> {
        let cf = self.inner.cf(CF_FLEET_META)?;
        let key = format!("cosigned/{origin}");
        match self.inner.db.get_cf(&cf, key.as_bytes()).map_err(db_err("reading witness state"))? {
            Some(v) if v.len() == 40 => {
                let mut root = [0u8; 32];
                root.copy_from_slice(&v[8..]);
                Ok(Some((read_u64(&v[..8], "cosigned size")?, root)))
            }
            Some(_) => Err(LedgerError::Corrupt(format!("witness state of {origin} is malformed"))),
            None => Ok(None),
        }
    }

    /// Records (durably) that this host cosigned `origin` at `size` with `root`.
    pub fn put_cosigned_head(&self, origin: &str, size: u64, root: &Hash) -> Result<(), LedgerError> {
        let cf = self.inner.cf(CF_FLEET_META)?;
        let mut v = be(size).to_vec();
        v.extend_from_slice(root);
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.inner
            .db
            .put_cf_opt(&cf, format!("cosigned/{origin}").as_bytes(), v, &wo)
            .map_err(db_err("storing witness state"))
    }

    /// This log's latest checkpoint with witness cosignatures, if one was collected.
    pub fn published_checkpoint(&self) -> Result<Option<String>, LedgerError> {
        let cf = self.inner.cf(CF_FLEET_META)?;
        self.inner
            .db
            .get_cf(&cf, b"published")
            .map_err(db_err("reading the published checkpoint"))?
            .map(|v| String::from_utf8(v).map_err(|_| LedgerError::Corrupt("published checkpoint is not UTF-8".into())))
            .transpose()
    }

    /// Stores the cosigned checkpoint to publish (durably).
    pub fn put_published_checkpoint(&self, note: &str) -> Result<(), LedgerError> {
        let cf = self.inner.cf(CF_FLEET_META)?;
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.inner
            .db
            .put_cf_opt(&cf, b"published", note.as_bytes(), &wo)
            .map_err(db_err("storing the published checkpoint"))
    }

    /// All stored peer records, by name.
    pub fn peer_records(&self) -> Result<Vec<(String, PeerRecord)>, LedgerError> {
        let cf = self.inner.cf(CF_FLEET_PEERS)?;
        self.inner
            .db
            .iterator_cf(&cf, IteratorMode::Start)
            .map(|item| {
                let (k, v) = item.map_err(db_err("reading peer records"))?;
                let name = String::from_utf8_lossy(&k).into_owned();
                let rec =
                    serde_json::from_slice(&v).map_err(|e| LedgerError::Corrupt(format!("peer record {name}: {e}")))?;
                Ok((name, rec))
            })
            .collect()
    }

    /// Recomputes the release index and dampening state from the entries (serialised
    /// with appends), e.g. after restoring a backup without those column families.
    pub fn rebuild_index(&self) -> Result<(), LedgerError> {
        let (reply, rx) = mpsc::sync_channel(1);
        self.tx.as_ref().ok_or(LedgerError::Closed)?.send(Job::Rebuild { reply }).map_err(|_| LedgerError::Closed)?;
        rx.recv().map_err(|_| LedgerError::Closed)?
    }

    /// Number of durably committed entries.
    pub fn size(&self) -> u64 {
        self.inner.size.load(Ordering::Acquire)
    }

    /// The dampening parameters this ledger applies (its [`LedgerConfig`]).
    pub fn dampening_params(&self) -> DampeningParams {
        self.inner.config.dampening
    }

    /// The log's origin line (also the checkpoint key name).
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// The verifier key (`vkey` text) for this log's checkpoints.
    pub fn verifier(&self) -> NoteVerifier {
        self.inner.signer.verifier()
    }

    /// The entry at `index`.
    pub fn get(&self, index: u64) -> Result<Entry, LedgerError> {
        Entry::decode(&self.get_raw(index)?).map_err(|e| LedgerError::CorruptEntry { index, source: e })
    }

    /// The stored encoding (leaf data) of the entry at `index`.
    pub fn get_raw(&self, index: u64) -> Result<Vec<u8>, LedgerError> {
        if index >= self.size() {
            return Err(LedgerError::NotFound(format!("entry {index} (log size {})", self.size())));
        }
        let cf = self.inner.cf(CF_ENTRIES)?;
        self.inner
            .db
            .get_cf(&cf, be(index))
            .map_err(db_err(format!("reading entry {index}")))?
            .ok_or_else(|| LedgerError::Corrupt(format!("entry {index} is missing")))
    }

    /// Tree head of the whole committed log.
    pub fn root(&self) -> Result<(u64, Hash), LedgerError> {
        let size = self.size();
        Ok((size, self.root_at(size)?))
    }

    /// Tree head of the first `size` entries.
    pub fn root_at(&self, size: u64) -> Result<Hash, LedgerError> {
        self.check_size(size)?;
        Ok(merkle::tree_hash(size, &*self.inner)?)
    }

    fn check_size(&self, size: u64) -> Result<(), LedgerError> {
        if size > self.size() {
            return Err(LedgerError::NotFound(format!("tree size {size} (log size {})", self.size())));
        }
        Ok(())
    }

    /// Inclusion proof of entry `index` in the tree of size `size`.
    pub fn inclusion_proof(&self, index: u64, size: u64) -> Result<Vec<Hash>, LedgerError> {
        self.check_size(size)?;
        Ok(merkle::inclusion_proof(index, size, &*self.inner)?)
    }

    /// Consistency proof from the tree of size `old` to the tree of size `new`.
    pub fn consistency_proof(&self, old: u64, new: u64) -> Result<Vec<Hash>, LedgerError> {
        self.check_size(new)?;
        Ok(merkle::consistency_proof(old, new, &*self.inner)?)
    }

    /// Signs (and stores) a checkpoint of the committed log. Refuses if the log is not
    /// an extension of the latest checkpoint already signed: a log that lost or changed
    /// entries must not get a second, conflicting head.
    pub fn checkpoint(&self) -> Result<SignedCheckpoint, LedgerError> {
        let _guard =
            self.inner.checkpoint_lock.lock().map_err(|_| LedgerError::Write("checkpoint lock poisoned".into()))?;
        let size = self.size();
        let root = self.root_at(size)?;
        if let Some(prev) = self.inner.latest_checkpoint()? {
            let p = &prev.checkpoint;
            if p.size > size {
                return Err(LedgerError::Inconsistent(format!(
                    "latest checkpoint has size {} but the log has {size} entries",
                    p.size
                )));
            }
            let proof = self.consistency_proof(p.size, size)?;
            if !merkle::verify_consistency(p.size, size, &p.root, &root, &proof) {
                return Err(LedgerError::Inconsistent(format!(
                    "log of size {size} is not an extension of the checkpoint at size {}",
                    p.size
                )));
            }
            if p.size == size {
                return Ok(prev);
            }
        }
        let checkpoint = Checkpoint { origin: self.inner.origin.clone(), size, root };
        let note = self.inner.signer.sign(&checkpoint.to_text())?;
        let cf = self.inner.cf(CF_CHECKPOINTS)?;
        let mut batch = WriteBatch::default();
        batch.put_cf(&cf, be(size), note.as_bytes());
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.inner.db.write_opt(batch, &wo).map_err(db_err("storing checkpoint"))?;
        Ok(SignedCheckpoint { note, checkpoint })
    }

    /// The latest signed checkpoint, if any was made.
    pub fn latest_checkpoint(&self) -> Result<Option<SignedCheckpoint>, LedgerError> {
        self.inner.latest_checkpoint()
    }

    /// All stored signed checkpoints, oldest first.
    pub fn checkpoints(&self) -> Result<Vec<String>, LedgerError> {
        let cf = self.inner.cf(CF_CHECKPOINTS)?;
        self.inner
            .db
            .iterator_cf(&cf, IteratorMode::Start)
            .map(|item| {
                let (_, v) = item.map_err(db_err("reading checkpoints"))?;
                String::from_utf8(v.to_vec()).map_err(|_| LedgerError::Corrupt("stored checkpoint is not UTF-8".into()))
            })
            .collect()
    }

    /// Indexes and entries about one release, in log order.
    pub fn entries_for_release(&self, release: &ReleaseHash) -> Result<Vec<(u64, Entry)>, LedgerError> {
        let cf = self.inner.cf(CF_RELEASE_INDEX)?;
        let size = self.size();
        let mut out = Vec::new();
        let it = self.inner.db.iterator_cf(&cf, IteratorMode::From(release.0.as_slice(), Direction::Forward));
        for item in it {
            let (k, _) = item.map_err(db_err("reading release index"))?;
            if k.len() != 40 || k[..32] != release.0 {
                break;
            }
            let index = read_u64(&k[32..], "release index key")?;
            if index < size {
                out.push((index, self.get(index)?));
            }
        }
        Ok(out)
    }

    /// A C2SP tlog-tiles hash tile: `width` (1–256) hashes of Merkle level `8·level`,
    /// starting at node `256·n`. Only tiles inside the committed tree are served.
    pub fn tile(&self, level: u8, n: u64, width: u16) -> Result<Vec<u8>, LedgerError> {
        let width = u64::from(width);
        if width == 0 || width > TILE_WIDTH || u32::from(level) * 8 >= 64 {
            return Err(LedgerError::BadRequest(format!("tile level {level} width {width}")));
        }
        let merkle_level = level * 8;
        let nodes = self.size() >> merkle_level;
        let first = n.checked_mul(TILE_WIDTH).ok_or_else(|| LedgerError::BadRequest(format!("tile index {n}")))?;
        if first + width > nodes {
            return Err(LedgerError::NotFound(format!(
                "tile {level}/{n} width {width} (tree has {nodes} nodes at that level)"
            )));
        }
        let indexes: Vec<u64> = (first..first + width).map(|i| merkle::stored_hash_index(merkle_level, i)).collect();
        Ok(self.inner.read_hashes(&indexes)?.concat())
    }

    /// A C2SP tlog-tiles entry bundle: entries `256·n ..` (`width` of them), each
    /// prefixed by its big-endian `u16` length.
    pub fn entries_bundle(&self, n: u64, width: u16) -> Result<Vec<u8>, LedgerError> {
        let width = u64::from(width);
        if width == 0 || width > TILE_WIDTH {
            return Err(LedgerError::BadRequest(format!("bundle width {width}")));
        }
        let first = n.checked_mul(TILE_WIDTH).ok_or_else(|| LedgerError::BadRequest(format!("bundle index {n}")))?;
        if first + width > self.size() {
            return Err(LedgerError::NotFound(format!("entry bundle {n} width {width}")));
        }
        let cf = self.inner.cf(CF_ENTRIES)?;
        let keys: Vec<[u8; 8]> = (first..first + width).map(be).collect();
        let mut out = Vec::new();
        for (r, i) in self.inner.db.batched_multi_get_cf(&cf, keys.iter(), true).into_iter().zip(first..) {
            let v = r
                .map_err(db_err(format!("reading entry {i}")))?
                .ok_or_else(|| LedgerError::Corrupt(format!("entry {i} is missing")))?;
            let len = u16::try_from(v.len())
                .map_err(|_| LedgerError::Corrupt(format!("entry {i} is larger than a tile allows")))?;
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&v);
        }
        Ok(out)
    }

    /// Audits the whole log without trusting any stored hash: re-hashes every entry,
    /// recomputes every stored hash, every signed checkpoint's root and signature, the
    /// release index and the dampening states, and reports every mismatch.
    pub fn verify(&self) -> Result<VerifyReport, LedgerError> {
        let inner = &*self.inner;
        let mut report = VerifyReport::default();
        let size = inner.stored_size()?;
        if size != self.size() {
            report.problem(format!("stored size {size} differs from committed size {}", self.size()));
        }
        let verifier = inner.signer.verifier();
        let mut checkpoints: BTreeMap<u64, Checkpoint> = BTreeMap::new();
        let cps = inner.cf(CF_CHECKPOINTS)?;
        for item in inner.db.iterator_cf(&cps, IteratorMode::Start) {
            let (k, v) = item.map_err(db_err("reading checkpoints"))?;
            let key = read_u64(&k, "checkpoint key").unwrap_or(u64::MAX);
            let parsed = std::str::from_utf8(&v)
                .map_err(|_| "not UTF-8".to_string())
                .and_then(|note| Checkpoint::open_signed(note, &verifier, &inner.origin).map_err(|e| e.to_string()));
            match parsed {
                Ok(cp) if cp.size == key && cp.size <= size => {
                    checkpoints.insert(cp.size, cp);
                }
                Ok(cp) => {
                    report.problem(format!("checkpoint stored under {key} has size {} (log size {size})", cp.size))
                }
                Err(e) => report.problem(format!("checkpoint stored under {key}: {e}")),
            }
        }

        let entries = inner.cf(CF_ENTRIES)?;
        let hashes_cf = inner.cf(CF_HASHES)?;
        let mut hash_iter = inner.db.iterator_cf(&hashes_cf, IteratorMode::Start);
        let mut next_hash_index = 0u64;
        let mut tree = CompactRange::default();
        let mut index_keys: BTreeSet<[u8; 40]> = BTreeSet::new();
        let mut fleet_keys: BTreeMap<[u8; 64], u64> = BTreeMap::new();
        let mut states: BTreeMap<ReleaseHash, DampeningState> = BTreeMap::new();
        let mut cp_iter = checkpoints.iter().peekable();
        while let Some(&(&cs, cp)) = cp_iter.peek() {
            if cs != 0 {
                break;
            }
            if cp.root != merkle::empty_root() {
                report.problem("checkpoint at size 0 has a non-empty root".into());
            }
            report.checkpoints += 1;
            cp_iter.next();
        }
        let mut expected = 0u64;
        let mut fcd = germline_model::FcdAudit::default();
        for item in inner.db.iterator_cf(&entries, IteratorMode::Start) {
            let (k, v) = item.map_err(db_err("reading entries"))?;
            let i = match read_u64(&k, "entry key") {
                Ok(i) => i,
                Err(e) => {
                    report.problem(e.to_string());
                    continue;
                }
            };
            if i >= size {
                report.problem(format!("entry {i} lies beyond the log size {size}"));
                continue;
            }
            if i != expected {
                report.problem(format!("entries {expected}..{i} are missing"));
                break;
            }
            expected += 1;
            report.entries += 1;
            match Entry::decode(&v) {
                Ok(entry) => {
                    index_keys.insert(release_key(&entry.release, i));
                    if let Some(key) = fleet_key_of(&entry) {
                        fleet_keys.entry(key).or_insert(i);
                    }
                    match crate::formation::fcd_record_of(&entry) {
                        Some(Ok(r)) => {
                            if let Err(p) = fcd.check(i, &entry.release, &r) {
                                report.problem(p);
                            }
                        }
                        Some(Err(e)) => report.problem(format!("entry {i}: {e}")),
                        None => {}
                    }
                    if entry.kind == EntryKind::DampeningEvent {
                        match serde_json::from_slice::<DampeningEventBody>(&entry.body) {
                            Ok(body) => {
                                let s = states.entry(entry.release).or_default();
                                s.on_call(&inner.config.dampening, body.event);
                                if *s != body.state {
                                    report.problem(format!(
                                        "dampening entry {i} records {:?}, replay gives {s:?}",
                                        body.state
                                    ));
                                }
                            }
                            Err(e) => report.problem(format!("dampening entry {i}: {e}")),
                        }
                    }
                }
                Err(e) => report.problem(format!("entry {i} does not decode: {e}")),
            }
            for want in tree.push(merkle::leaf_hash(&v)) {
                let at = next_hash_index;
                next_hash_index += 1;
                report.hashes += 1;
                match hash_iter.next() {
                    Some(Ok((hk, hv))) => {
                        if hk.as_ref() != be(at).as_slice() {
                            report.problem(format!("stored hash {at} missing (found key {})", hex::encode(&hk)));
                        } else if hv.as_ref() != want.as_slice() {
                            let (l, n) = merkle::split_stored_hash_index(at);
                            report.problem(format!("stored hash {at} (level {l}, node {n}) does not match entry {i}"));
                        }
                    }
                    Some(Err(e)) => return Err(db_err("reading hashes")(e)),
                    None => report.problem(format!("stored hash {at} missing")),
                }
            }
            while let Some(&(&cs, cp)) = cp_iter.peek() {
                if cs != tree.size() {
                    break;
                }
                if cp.root != tree.root() {
                    report.problem(format!("signed checkpoint at size {cs} does not match the entries"));
                }
                report.checkpoints += 1;
                cp_iter.next();
            }
        }
        if expected < size {
            report.problem(format!("entries {expected}..{size} are missing"));
        }
        if hash_iter.next().is_some() {
            report.problem(format!("stored hashes beyond the {next_hash_index} a log of {size} entries has"));
        }
        if let Some((cs, _)) = cp_iter.next() {
            report.problem(format!("checkpoint at size {cs} was not reached"));
        }
        report.root = Some(tree.root());
        report.formations = fcd.formations.len() as u64;
        report.lifecycle_events = fcd.events;
        report.snapshots = fcd.snapshots.len() as u64;
        report.dispatches = fcd.dispatches.len() as u64;

        let by_release = inner.cf(CF_RELEASE_INDEX)?;
        let mut stored_keys = BTreeSet::new();
        for item in inner.db.iterator_cf(&by_release, IteratorMode::Start) {
            let (k, _) = item.map_err(db_err("reading release index"))?;
            match <[u8; 40]>::try_from(k.as_ref()) {
                Ok(key) => {
                    stored_keys.insert(key);
                }
                Err(_) => report.problem(format!("malformed release index key {}", hex::encode(&k))),
            }
        }
        if stored_keys != index_keys {
            let extra = stored_keys.difference(&index_keys).count();
            let missing = index_keys.difference(&stored_keys).count();
            report.problem(format!("release index differs from the entries ({extra} extra, {missing} missing)"));
        }
        let fleet = inner.cf(CF_FLEET_SUPPRESSED)?;
        let mut stored_fleet = BTreeMap::new();
        for item in inner.db.iterator_cf(&fleet, IteratorMode::Start) {
            let (k, v) = item.map_err(db_err("reading fleet suppressions"))?;
            match (<[u8; 64]>::try_from(k.as_ref()), read_u64(&v, "fleet suppression index")) {
                (Ok(key), Ok(i)) => {
                    stored_fleet.insert(key, i);
                }
                _ => report.problem(format!("malformed fleet suppression {}", hex::encode(&k))),
            }
        }
        if stored_fleet != fleet_keys {
            report.problem("fleet suppressions differ from the suppression entries".into());
        }
        let damp = inner.cf(CF_DAMPENING)?;
        let mut stored_states = BTreeMap::new();
        for item in inner.db.iterator_cf(&damp, IteratorMode::Start) {
            let (k, v) = item.map_err(db_err("reading dampening states"))?;
            match (<[u8; 32]>::try_from(k.as_ref()), DampeningState::from_bytes(&v)) {
                (Ok(r), Some(s)) => {
                    stored_states.insert(ReleaseHash(r), s);
                }
                _ => report.problem(format!("malformed dampening state {}", hex::encode(&k))),
            }
        }
        report.releases = stored_states.len() as u64;
        for (release, s) in &states {
            if stored_states.get(release) != Some(s) {
                report.problem(format!("dampening state of {release} differs from the log"));
            }
        }
        for release in stored_states.keys() {
            if !states.contains_key(release) {
                report.problem(format!("dampening state of {release} has no log entries"));
            }
        }
        Ok(report)
    }

    /// Where the ledger lives.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        // Closing the channel lets the writer finish queued jobs and exit.
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        // Let merges started by this process finish; closing would abort them, and a
        // process that never lives long enough to finish one accumulates table files.
        let mut wait = WaitForCompactOptions::default();
        wait.set_timeout(CLOSE_COMPACTION_WAIT_US);
        let _ = self.inner.db.wait_for_compact(&wait);
    }
}

#[cfg(test)]
mod tests;
