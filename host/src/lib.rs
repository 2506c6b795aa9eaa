//! The composition root of a germline host: a runtime with its dampening ledger and the
//! witnessing of its triggers ([`Host`]), shared by the CLI commands, the HTTP service and
//! the MCP front, plus the places they keep their files ([`home`], [`data_dir`]) and a
//! release directory's identity ([`release_id`]).

pub mod witness;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use germline_executor::call::{CallOutcome, CallRequest, CallStatus};
use germline_executor::runtime::Runtime;
use germline_ledger::Ledger;

pub use witness::{opening_path, witness_triggers, Witnessed};

/// Where germline keeps its shim and other run-time files.
pub fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("GERMLINE_HOME") {
        return PathBuf::from(h);
    }
    if let Some(c) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(c).join("germline");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/germline"),
        None => PathBuf::from("/var/cache/germline/home"),
    }
}

/// A runtime with its dampening ledger. The ledger is shared: only one process may open
/// the RocksDB, so the CLI opens it once per command and the service once per process.
pub struct Host {
    /// The runtime.
    pub rt: Runtime,
    ledger: Option<Arc<Ledger>>,
    data_dir: PathBuf,
}

/// Opens the embedded ledger under `data_dir` (the RocksDB default).
pub fn open_ledger(data_dir: &Path) -> anyhow::Result<Arc<Ledger>> {
    open_ledger_as(data_dir, None)
}

/// Opens the ledger under `data_dir`, with `origin` as its log origin when it is new
/// (`None`: the stored one, or a fresh random one).
pub fn open_ledger_as(data_dir: &Path, origin: Option<String>) -> anyhow::Result<Arc<Ledger>> {
    let dir = data_dir.join("ledger");
    Ok(Arc::new(
        Ledger::open(&dir, germline_ledger::LedgerConfig { origin, ..Default::default() }).with_context(|| {
            format!("opening the ledger in {} (is another germline process using it?)", dir.display())
        })?,
    ))
}

impl Host {
    /// A host around a started runtime with the ledger under `data_dir` (opened for
    /// germline runtimes only; baselines have no dampening), witness files under it too.
    /// The CLI commands open the ledger this way, once per command.
    pub fn open(rt: Runtime, data_dir: PathBuf) -> anyhow::Result<Host> {
        let ledger = match &rt {
            Runtime::Germline(_) => Some(open_ledger(&data_dir)?),
            _ => None,
        };
        Ok(Host::new(rt, ledger, data_dir))
    }

    /// A host around a started runtime; dampening and witnesses go to `ledger` (germline
    /// runtimes), witness files under `data_dir`.
    pub fn new(rt: Runtime, ledger: Option<Arc<Ledger>>, data_dir: PathBuf) -> Host {
        Host { rt, ledger, data_dir }
    }

    /// One call under dampening: a suppressed release is refused (and the refusal still
    /// counts as a call); otherwise the call runs, its triggers are verified into
    /// witnesses after its result is out, and the call's event updates the penalty.
    pub fn call(&mut self, req: &CallRequest) -> anyhow::Result<CallOutcome> {
        let (Runtime::Germline(g), Some(ledger)) = (&mut self.rt, self.ledger.as_deref()) else {
            return Ok(self.rt.call(req));
        };
        let release = g.release;
        let state = ledger.dampening_state(&release)?;
        if state.suppressed {
            let after = ledger.record_call(&release, germline_ledger::Event::None)?;
            let witnesses: Vec<String> = ledger
                .entries_for_release(&release)?
                .into_iter()
                .filter(|(_, e)| e.kind == germline_ledger::EntryKind::Witness)
                .map(|(i, _)| format!("ledger entry {i}"))
                .collect();
            let fleet: Vec<String> = ledger
                .fleet_suppressions(&release)?
                .into_iter()
                .map(|f| {
                    format!("fleet suppression entry {} (peer witness {})", f.index, hex::encode(f.witness_sha256))
                })
                .collect();
            if !fleet.is_empty() {
                return Ok(CallOutcome::suppressed(format!(
                    "release {release} is suppressed: a peer's verified witness ({})",
                    fleet.join(", ")
                )));
            }
            let params = ledger.dampening_params();
            return Ok(CallOutcome::suppressed(format!(
                "release {release} is suppressed: dampening penalty {:.0} (suppressed at {}, usable again below {}); witnesses: {}",
                after.penalty,
                params.suppress_at,
                params.reuse_below,
                if witnesses.is_empty() { "none".to_string() } else { witnesses.join(", ") }
            )));
        }
        Ok(g.call(req))
    }

    /// A formed call (DESIGN §8): `fence` is checked on this runtime's release right
    /// before [`Host::call`] forks its copies; nothing runs when it refuses.
    pub fn fenced_call(
        &mut self,
        req: &CallRequest,
        fence: &mut germline_executor::dispatch::Fence<'_>,
    ) -> germline_executor::dispatch::RunResult {
        fence(self.rt.release())?;
        self.call(req).map_err(|e| germline_executor::ExecutorError::Call(format!("{e:#}")))
    }

    /// After the outcome is printed: verify triggers into witnesses, log them, and count
    /// the call's event.
    pub fn after_call(&mut self, req: &CallRequest, outcome: &CallOutcome) -> anyhow::Result<AfterCall> {
        let (Runtime::Germline(g), Some(ledger)) = (&mut self.rt, self.ledger.as_deref()) else {
            return Ok(AfterCall::default());
        };
        if refused_as_suppressed(outcome) {
            // Counted when it was refused; no copy ran, so nothing to witness.
            return Ok(AfterCall::default());
        }
        let release = g.release;
        let witnessed = witness::witness_call(g, req, outcome, &self.data_dir);
        let mut after = AfterCall::default();
        let mut event =
            if outcome.triggers.is_empty() { germline_ledger::Event::None } else { germline_ledger::Event::Unverified };
        for w in &witnessed {
            // Ledger entries are JSON and bounded (C2SP bundles use 16-bit lengths): the
            // witness travels base64-encoded, or by hash and path when it is large (the
            // file itself is kept beside the ledger).
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
            let receipt =
                ledger.append(germline_ledger::Entry::new(germline_ledger::EntryKind::Witness, release, body))?;
            after.witnesses.push(receipt.index);
            if w.verdict.is_verified(w.declared) {
                event = germline_ledger::Event::Verified;
            }
        }
        let before = ledger.dampening_state(&release)?;
        let state = ledger.record_call(&release, event)?;
        if state.suppressed {
            tracing::warn!(%release, penalty = state.penalty, "release suppressed by dampening");
        }
        after.newly_suppressed = state.suppressed && !before.suppressed;
        after.state = Some(state);
        if !after.witnesses.is_empty() {
            // Publish the witness now: peers see a log only up to its signed checkpoint.
            if let Err(e) = ledger.checkpoint() {
                tracing::error!("signing a checkpoint after a witness: {e}");
            }
        }
        Ok(after)
    }
}

/// What [`Host::after_call`] recorded.
#[derive(Debug, Default)]
pub struct AfterCall {
    /// Ledger indexes of the witnesses appended.
    pub witnesses: Vec<u64>,
    /// Whether this call's event suppressed the release.
    pub newly_suppressed: bool,
    /// Dampening state after the call's event (none for refused or non-germline calls).
    pub state: Option<germline_ledger::DampeningState>,
}

/// Whether the host refused the call because the release is suppressed: the status the
/// host set, never the error text (which may be whatever a copy answered).
///
/// Debug builds only: `GERMLINE_TEST_TYPED_OUTCOMES_OFF=1` decides by the text match this
/// replaced, so a test can show the release that dodges it.
pub fn refused_as_suppressed(outcome: &CallOutcome) -> bool {
    #[cfg(debug_assertions)]
    if std::env::var_os("GERMLINE_TEST_TYPED_OUTCOMES_OFF").is_some_and(|v| v == "1") {
        return outcome.error.as_deref().is_some_and(|e| e.contains("is suppressed"));
    }
    outcome.status == CallStatus::Suppressed
}

/// The data directory of the CLI commands and the front: `$GERMLINE_DATA_DIR`, else
/// `./germline-data`.
pub fn data_dir() -> PathBuf {
    std::env::var_os("GERMLINE_DATA_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("germline-data"))
}

/// A release directory's identity: the SHA-256 of the canonical archive `germline
/// release build` makes of it, the same bytes a publisher signs and a host admits.
/// Archiving a large release takes seconds, so the hash is kept in the germline home under
/// the directory's state ([`germline_admission::directory_state`]: every file's size,
/// inode and change time), and a start with the directory unchanged reads it back.
pub fn release_id(dir: &Path) -> anyhow::Result<germline_model::ReleaseHash> {
    let state = germline_admission::directory_state(dir).with_context(|| format!("state of {}", dir.display()))?;
    let cached = home().join("release-ids").join(hex::encode(state));
    if let Some(id) = std::fs::read_to_string(&cached).ok().and_then(|s| s.trim().parse().ok()) {
        return Ok(id);
    }
    let id = archive_id(dir)?;
    // A cache that cannot be written only costs the next start its time.
    if let Some(parent) = cached.parent() {
        if std::fs::create_dir_all(parent).is_ok() {
            let tmp = parent.join(format!(".{}.{}", hex::encode(state), std::process::id()));
            if std::fs::write(&tmp, id.to_string()).is_ok() {
                let _ = std::fs::rename(&tmp, &cached);
            }
        }
    }
    Ok(id)
}

fn archive_id(dir: &Path) -> anyhow::Result<germline_model::ReleaseHash> {
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("release.tar.gz");
    let built = germline_admission::build_release_archive(dir, &out, &germline_admission::BuildOptions::default())
        .with_context(|| format!("canonical archive of {}", dir.display()))?;
    Ok(built.hash)
}
