//! Trigger verification off the release's lane.
//!
//! A call that records a trigger is counted in the lane at once (its dampening event is
//! [`Event::Unverified`]), and its probe and control replays run here, on a germline of
//! the release of their own, started when a verification is queued and stopped when none
//! is left. No call of the release waits for a replay: the replays run a copy that holds
//! the trigger's items and chooses how long it takes, and a call queued behind them would
//! let its caller, whoever that is, read that time on its own clock (SECURITY.md,
//! "Replay time seen by the next caller").
//!
//! A verified verdict lands later as [`Event::Verdict`], in one ledger batch with its
//! witness: it adds the verified weight, so a verified witness still suppresses the
//! release, from the first call after it lands.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use germline_executor::call::{CallOutcome, CallRequest, GermlineRuntime};
use germline_executor::ExecutorError;
use germline_ledger::{Entry, EntryKind, Ledger};
use germline_model::{ItemName, ReleaseHash};

use crate::witness::{replay_items, witness_triggers, Witnessed};

/// Starts a germline of the release (another lane's maker).
pub type MakeGermline = Arc<dyn Fn() -> Result<GermlineRuntime, ExecutorError> + Send + Sync>;

/// Told of each verification that recorded something (the service counts it).
pub type OnVerified = Arc<dyn Fn(&Verified) + Send + Sync>;

/// Most verifications waiting per release. A release that triggers faster than its
/// replays run has its further triggers counted (unverified) but not replayed, until the
/// queue drains; each such trigger's evidence stays in the trigger log.
pub const MAX_QUEUED: usize = 16;

/// What one call's verification recorded in the ledger.
#[derive(Clone, Debug, Default)]
pub struct Verified {
    /// Ledger indexes of the witnesses appended.
    pub witnesses: Vec<u64>,
    /// Whether its verdict suppressed the release.
    pub newly_suppressed: bool,
}

struct Job {
    outcome: CallOutcome,
    items: BTreeMap<ItemName, Vec<u8>>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// A worker thread is running (it exits when the queue is empty).
    running: bool,
}

/// The verifications of one release, run one at a time on a germline of their own.
pub struct Verifier {
    release: ReleaseHash,
    make: MakeGermline,
    ledger: Arc<Ledger>,
    data_dir: PathBuf,
    on_verified: Mutex<Option<OnVerified>>,
    queue: Mutex<Queue>,
    idle: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Verifier {
    /// A verifier of `release` whose germlines `make` starts; witnesses go to `ledger`,
    /// witness files under `data_dir`.
    pub fn new(release: ReleaseHash, make: MakeGermline, ledger: Arc<Ledger>, data_dir: PathBuf) -> Arc<Verifier> {
        Arc::new(Verifier {
            release,
            make,
            ledger,
            data_dir,
            on_verified: Mutex::new(None),
            queue: Mutex::new(Queue::default()),
            idle: Condvar::new(),
        })
    }

    /// Calls `f` after each verification that recorded a witness.
    pub fn on_verified(&self, f: OnVerified) {
        *lock(&self.on_verified) = Some(f);
    }

    /// Queues the verification of `outcome`'s triggers and returns at once. The items are
    /// read now, as the call saw them. `false` when nothing was queued: no evidence, or
    /// the queue is full (logged; the call's unverified event is already counted).
    pub fn submit(self: &Arc<Self>, req: &CallRequest, outcome: &CallOutcome) -> bool {
        if outcome.evidence.is_empty() {
            return false;
        }
        let job = Job { outcome: outcome.clone(), items: replay_items(req, outcome) };
        let mut q = lock(&self.queue);
        if q.jobs.len() >= MAX_QUEUED {
            tracing::warn!(
                release = %self.release,
                "{MAX_QUEUED} verifications are waiting: this trigger is counted, not replayed (its evidence is in the trigger log)"
            );
            return false;
        }
        q.jobs.push_back(job);
        if !q.running {
            q.running = true;
            let me = self.clone();
            let spawned = std::thread::Builder::new().name("germline-verify".into()).spawn(move || me.work());
            if let Err(e) = spawned {
                q.running = false;
                q.jobs.clear();
                tracing::error!(release = %self.release, "could not start the verification thread: {e}");
                return false;
            }
        }
        true
    }

    /// Waits until every queued verification has ended (`None`: however long that takes;
    /// the replays are bounded by the deadlines of their copies). `false` on timeout.
    pub fn wait_idle(&self, timeout: Option<Duration>) -> bool {
        let until = timeout.map(|t| Instant::now() + t);
        let mut q = lock(&self.queue);
        while q.running || !q.jobs.is_empty() {
            q = match until {
                None => self.idle.wait(q).unwrap_or_else(|p| p.into_inner()),
                Some(u) => {
                    let left = u.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    self.idle.wait_timeout(q, left).unwrap_or_else(|p| p.into_inner()).0
                }
            };
        }
        true
    }

    fn work(self: Arc<Self>) {
        // A panic in a replay still leaves the queue idle (its jobs dropped, logged).
        struct Unwound<'a>(&'a Verifier);
        impl Drop for Unwound<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    let mut q = lock(&self.0.queue);
                    tracing::error!(release = %self.0.release, dropped = q.jobs.len(), "the verification thread panicked");
                    q.jobs.clear();
                    q.running = false;
                    self.0.idle.notify_all();
                }
            }
        }
        let _unwound = Unwound(&self);
        let mut germline: Option<GermlineRuntime> = None;
        loop {
            let next = lock(&self.queue).jobs.pop_front();
            let Some(job) = next else {
                // Stop the germline before saying the queue is idle, then look again: a
                // job queued meanwhile found `running` still set.
                if germline.take().is_some() {
                    continue;
                }
                let mut q = lock(&self.queue);
                if q.jobs.is_empty() {
                    q.running = false;
                    self.idle.notify_all();
                    return;
                }
                continue;
            };
            if germline.is_none() {
                match (self.make)() {
                    Ok(g) => germline = Some(g),
                    Err(e) => {
                        tracing::error!(release = %self.release, "no germline to verify a trigger on: {e}");
                        continue;
                    }
                }
            }
            let Some(g) = germline.as_mut() else { continue };
            match self.verify(g, &job) {
                Ok(v) if !v.witnesses.is_empty() => {
                    let f = lock(&self.on_verified).clone();
                    if let Some(f) = f {
                        f(&v);
                    }
                    // Publish the witness now: peers see a log only up to its signed checkpoint.
                    if let Err(e) = self.ledger.checkpoint() {
                        tracing::error!("signing a checkpoint after a witness: {e}");
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::error!(release = %self.release, "recording a verification: {e:#}"),
            }
        }
    }

    fn verify(&self, g: &mut GermlineRuntime, job: &Job) -> anyhow::Result<Verified> {
        let witnessed = match witness_triggers(g, &job.outcome, &job.items, &self.data_dir) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(release = %self.release, "could not verify triggers: {e:#}");
                return Ok(Verified::default());
            }
        };
        let mut done = Verified::default();
        for w in &witnessed {
            let before = self.ledger.dampening_state(&self.release)?.suppressed;
            let (receipt, state) =
                self.ledger.record_witness(witness_entry(self.release, w)?, w.verdict.is_verified(w.declared))?;
            done.witnesses.push(receipt.index);
            if let Some(s) = state {
                if s.suppressed {
                    tracing::warn!(release = %self.release, penalty = s.penalty, "release suppressed by a verified witness");
                }
                done.newly_suppressed |= s.suppressed && !before;
            }
        }
        Ok(done)
    }
}

/// The ledger entry of a witness. Entries are JSON and bounded (C2SP bundles use 16-bit
/// lengths): the witness travels base64-encoded, or by hash and path when it is large (the
/// file itself is kept beside the ledger).
fn witness_entry(release: ReleaseHash, w: &Witnessed) -> anyhow::Result<Entry> {
    use base64::Engine;
    use sha2::Digest;
    let sha = hex::encode(sha2::Sha256::digest(&w.bytes));
    let body = if w.bytes.len() <= 45_000 {
        serde_json::to_vec(&serde_json::json!({
            "format": "germline-witness v2",
            "witness_sha256": sha,
            "witness": base64::engine::general_purpose::STANDARD.encode(&w.bytes),
        }))?
    } else {
        serde_json::to_vec(&serde_json::json!({
            "format": "germline-witness v2",
            "witness_sha256": sha,
            "path": w.path,
        }))?
    };
    Ok(Entry::new(EntryKind::Witness, release, body))
}
