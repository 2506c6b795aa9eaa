//! The composition root of a germline host: a runtime with its dampening ledger and the
//! witnessing of its triggers ([`Host`]), shared by the CLI commands, the HTTP service and
//! the MCP front, plus the places they keep their files ([`home`], [`data_dir`]) and a
//! release directory's identity ([`release_id`]).

pub mod verification;
pub mod witness;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use germline_executor::call::{CallOutcome, CallRequest, CallStatus};
use germline_executor::runtime::Runtime;
use germline_ledger::Ledger;

pub use verification::{Verified, Verifier};
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
    /// Verifies triggers off this runtime's lane (germline runtimes with a ledger).
    verifier: Option<Arc<Verifier>>,
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
        // Checked before the ledger is made there.
        check_private(&rt, &data_dir)?;
        let ledger = match &rt {
            Runtime::Germline(_) => Some(open_ledger(&data_dir)?),
            _ => None,
        };
        Ok(Host::checked(rt, ledger, data_dir))
    }

    /// A host around a started runtime; dampening and witnesses go to `ledger` (germline
    /// runtimes), witness files under `data_dir`. Its triggers are verified on a germline
    /// of their own ([`Verifier`]), made like this one (release id set first) but from a
    /// home of its own, as a third party's would be ([`GermlineRuntime::replay_maker`]).
    ///
    /// Refused when a copy of the release could read `data_dir` or the trigger log (see
    /// [`check_private`]).
    pub fn new(rt: Runtime, ledger: Option<Arc<Ledger>>, data_dir: PathBuf) -> anyhow::Result<Host> {
        check_private(&rt, &data_dir)?;
        Ok(Host::checked(rt, ledger, data_dir))
    }

    /// [`Host::new`] once `data_dir` passed [`check_private`].
    fn checked(rt: Runtime, ledger: Option<Arc<Ledger>>, data_dir: PathBuf) -> Host {
        let verifier = match (&rt, &ledger) {
            (Runtime::Germline(g), Some(l)) => {
                let make: verification::MakeGermline = Arc::new(g.replay_maker());
                Some(Verifier::new(g.release, make, l.clone(), data_dir))
            }
            _ => None,
        };
        Host { rt, ledger, verifier }
    }

    /// This host with `verifier` instead of its own: the lanes of one release share one.
    pub fn with_verifier(mut self, verifier: Option<Arc<Verifier>>) -> Host {
        if verifier.is_some() {
            self.verifier = verifier;
        }
        self
    }

    /// The verifier of this host's triggers.
    pub fn verifier(&self) -> Option<&Arc<Verifier>> {
        self.verifier.as_ref()
    }

    /// Waits until the triggers of calls run so far are verified and their witnesses
    /// recorded (`None`: however long the replays take). `false` on timeout.
    pub fn wait_verified(&self, timeout: Option<std::time::Duration>) -> bool {
        self.verifier.as_ref().is_none_or(|v| v.wait_idle(timeout))
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

    /// After the outcome is out: count the call's event (dampening: unverified when it
    /// recorded triggers) and queue the verification of its triggers, which runs off this
    /// lane ([`Verifier`]); returns without waiting for it. A verified verdict is recorded
    /// when it lands. [`Host::wait_verified`] waits for it, where nobody else's call could
    /// be waiting behind (the CLI commands).
    pub fn after_call(&mut self, req: &CallRequest, outcome: &CallOutcome) -> anyhow::Result<AfterCall> {
        let (Runtime::Germline(g), Some(ledger)) = (&mut self.rt, self.ledger.as_deref()) else {
            return Ok(AfterCall::default());
        };
        if refused_as_suppressed(outcome) {
            // Counted when it was refused; no copy ran, so nothing to witness.
            return Ok(AfterCall::default());
        }
        let release = g.release;
        let event =
            if outcome.triggers.is_empty() { germline_ledger::Event::None } else { germline_ledger::Event::Unverified };
        let before = ledger.dampening_state(&release)?;
        let state = ledger.record_call(&release, event)?;
        if state.suppressed && !before.suppressed {
            tracing::warn!(%release, penalty = state.penalty, "release suppressed by dampening");
        }
        if let Some(v) = &self.verifier {
            v.submit(req, outcome);
        }
        if verify_in_lane() {
            self.wait_verified(None);
        }
        Ok(AfterCall { newly_suppressed: state.suppressed && !before.suppressed, state: Some(state) })
    }
}

/// What [`Host::after_call`] recorded.
#[derive(Debug, Default)]
pub struct AfterCall {
    /// Whether this call's event suppressed the release.
    pub newly_suppressed: bool,
    /// Dampening state after the call's event (none for refused or non-germline calls).
    pub state: Option<germline_ledger::DampeningState>,
}

/// Refuses a data directory (the ledger, witnesses and their openings) or a trigger log
/// that a copy of the release could read: they hold items of every label, from every call.
/// A broker running as root keeps them from the copies' ids by their modes too; one
/// without root runs its copies as itself, so only their place keeps them out.
///
/// Debug builds only: `GERMLINE_TEST_PRIVATE_CHECK_OFF=1` skips it, so a test can show
/// what a copy then reads.
pub fn check_private(rt: &Runtime, data_dir: &Path) -> anyhow::Result<()> {
    let Runtime::Germline(g) = rt else { return Ok(()) };
    if germline_executor::test_switch("GERMLINE_TEST_PRIVATE_CHECK_OFF") {
        return Ok(());
    }
    g.check_private(data_dir, "the data directory")?;
    if let Some(log) = &g.trigger_log {
        g.check_private(log, "the trigger log")?;
    }
    Ok(())
}

/// Debug builds only: `GERMLINE_TEST_VERIFY_IN_LANE=1` makes [`Host::after_call`] wait for
/// the call's verification, holding the release's lane as the service once did, so a test
/// can show what the next caller of the release then reads.
fn verify_in_lane() -> bool {
    germline_executor::test_switch("GERMLINE_TEST_VERIFY_IN_LANE")
}

/// Whether the host refused the call because the release is suppressed: the status the
/// host set, never the error text (which may be whatever a copy answered).
///
/// Debug builds only: `GERMLINE_TEST_TYPED_OUTCOMES_OFF=1` decides by the text match this
/// replaced, so a test can show the release that dodges it.
pub fn refused_as_suppressed(outcome: &CallOutcome) -> bool {
    if germline_executor::test_switch("GERMLINE_TEST_TYPED_OUTCOMES_OFF") {
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
