//! The mirror: follows each peer's log through its tiles and suppresses releases that a
//! peer has a verified witness for.
//!
//! Per peer and sync: fetch `/checkpoint`, open it with the peer's checkpoint key, check
//! that it extends the last checkpoint verified from that peer (from authenticated
//! tiles; see [`crate::tiles`]), store it, then read the new entries in bounded chunks,
//! judge every witness entry and advance the stored cursor. A suppression is appended
//! before the cursor moves and the ledger deduplicates by witness hash, so a crash at
//! any point replays at most a few entries and never loses or doubles one.
//!
//! Trust rule for a peer's witness (items are never shared between hosts, so the
//! probe/control replay cannot be re-run here): the witness is accepted when
//! (1) its bytes hash to the SHA-256 the entry names, (2) it is signed by the witness
//! key configured for that peer, (3) it is about the release the entry is filed under,
//! (4) its recorded probe/control tries classify, by the verifier's own rule, to the
//! verdict it records, and (5) that verdict weighs enough to suppress a release on its
//! own (a verified item witness from a release that declared determinism, or a broken
//! determinism declaration) — exactly the witnesses that would have suppressed the
//! release on the witnessing host. We thus trust the peer's signature for the replay
//! having happened, and re-check everything else; a host that signs false witnesses
//! is caught by anyone who holds the items (`germline verify`), and its key can be
//! dropped from the configuration. A re-check on another machine can fail for an honest
//! host too (a release can carry what the machine shows a copy into its request), and
//! `germline verify` then says so (exit 3, inconclusive; SECURITY.md, "What a third
//! party's re-check reproduces").

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use germline_ledger::{
    Checkpoint, DampeningParams, Entry, EntryKind, Event, Ledger, LedgerError, NoteVerifier, PeerRecord, PeerStatus,
};
use germline_model::ReleaseHash;
use germline_verifier::Witness;
use sha2::Digest;

use crate::tiles::{check_consistency, TileSource, TiledTree, TilesError};
use crate::{FleetConfig, PeerConfig};

/// Largest checkpoint note accepted.
const MAX_CHECKPOINT_BYTES: u64 = 64 * 1024;
/// Largest tile or entry bundle accepted (256 entries of at most 64 KiB each).
const MAX_TILE_BYTES: u64 = 256 * (2 + 65_535);

/// Fetches tiles from a peer's base URL with bounded time and size.
pub struct HttpSource {
    agent: ureq::Agent,
    base: String,
}

impl HttpSource {
    /// A source for `base` (e.g. `http://127.0.0.1:8080`) with a per-request timeout.
    pub fn new(base: &str, timeout: Duration) -> Self {
        let agent = ureq::AgentBuilder::new().timeout_connect(timeout).timeout(timeout).redirects(0).build();
        HttpSource { agent, base: base.trim_end_matches('/').to_owned() }
    }

    fn get(&self, path: &str, limit: u64) -> Result<Vec<u8>, String> {
        let url = format!("{}/{path}", self.base);
        let resp = self.agent.get(&url).call().map_err(|e| match e {
            ureq::Error::Status(code, _) => format!("HTTP {code}"),
            other => other.to_string(),
        })?;
        let mut buf = Vec::new();
        resp.into_reader().take(limit + 1).read_to_end(&mut buf).map_err(|e| e.to_string())?;
        if buf.len() as u64 > limit {
            return Err(format!("response larger than {limit} bytes"));
        }
        Ok(buf)
    }

    /// The peer's current signed checkpoint.
    pub fn checkpoint(&self) -> Result<String, String> {
        let bytes = self.get("checkpoint", MAX_CHECKPOINT_BYTES)?;
        String::from_utf8(bytes).map_err(|_| "checkpoint is not UTF-8".into())
    }
}

impl TileSource for HttpSource {
    fn fetch(&self, path: &str) -> Result<Vec<u8>, String> {
        self.get(path, MAX_TILE_BYTES)
    }
}

/// What to do with a peer's witness entry.
#[derive(Debug, PartialEq, Eq)]
pub enum WitnessDecision {
    /// A verified witness: suppress the release.
    Suppress {
        /// The release.
        release: ReleaseHash,
        /// SHA-256 of the witness bytes.
        witness_sha256: [u8; 32],
    },
    /// Authentic, but its verdict does not suppress (e.g. an unverified event).
    Ignore(String),
    /// Not acceptable evidence (wrong key, edited, mismatched…).
    Reject(String),
}

/// Applies the trust rule (module docs) to one entry of a peer's log.
pub fn judge_witness(entry: &Entry, witness_key: &[u8; 32], params: &DampeningParams) -> WitnessDecision {
    #[derive(serde::Deserialize)]
    struct Body {
        format: String,
        witness_sha256: String,
        witness: Option<String>,
    }
    let body: Body = match serde_json::from_slice(&entry.body) {
        Ok(b) => b,
        Err(e) => return WitnessDecision::Reject(format!("witness entry body: {e}")),
    };
    if body.format != "germline-witness v2" {
        return WitnessDecision::Reject(format!("unknown witness format {:?}", body.format));
    }
    let Some(b64) = body.witness else {
        return WitnessDecision::Ignore("witness logged by hash only (not shared)".into());
    };
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(b64) else {
        return WitnessDecision::Reject("witness is not base64".into());
    };
    let sha: [u8; 32] = sha2::Sha256::digest(&bytes).into();
    if hex::encode(sha) != body.witness_sha256 {
        return WitnessDecision::Reject("witness bytes do not match the logged SHA-256".into());
    }
    let w = match Witness::decode(&bytes, Some(witness_key)) {
        Ok(w) => w,
        Err(e) => return WitnessDecision::Reject(e.to_string()),
    };
    if w.body.evidence.release != entry.release {
        return WitnessDecision::Reject(format!(
            "witness is about {}, filed under {}",
            w.body.evidence.release, entry.release
        ));
    }
    // The per-try outcomes are committed, not published (they are item-derived); the
    // signature by the peer's witness key vouches for the verdict, and the opening,
    // with the items, lets anyone holding them re-derive it (`germline verify`).
    let r = &w.body.report;
    let declared = w.body.declared_deterministic;
    if params.weight(Event::of_trigger(r.verdict.is_verified(declared))) < params.suppress_at {
        return WitnessDecision::Ignore(format!(
            "verdict {:?} (declared deterministic: {declared}) does not suppress",
            r.verdict
        ));
    }
    WitnessDecision::Suppress { release: entry.release, witness_sha256: sha }
}

/// Outcome of one sync round with one peer.
#[derive(Debug)]
pub struct SyncReport {
    /// The stored record after the round.
    pub record: PeerRecord,
    /// Suppressions appended in this round.
    pub suppressed: Vec<ReleaseHash>,
}

fn fail(
    ledger: &Ledger,
    peer: &PeerConfig,
    mut rec: PeerRecord,
    status: PeerStatus,
    message: String,
    evidence: Vec<String>,
) -> Result<SyncReport, LedgerError> {
    match status {
        PeerStatus::SplitView | PeerStatus::TamperedTile | PeerStatus::BadCheckpoint => {
            tracing::error!(peer = %peer.name, status = status.as_str(), "{message}")
        }
        _ => tracing::warn!(peer = %peer.name, status = status.as_str(), "{message}"),
    }
    rec.status = status;
    rec.message = message;
    rec.evidence = evidence;
    rec.updated_ms = germline_ledger::entry::now_ms();
    ledger.put_peer_record(&peer.name, &rec)?;
    Ok(SyncReport { record: rec, suppressed: Vec::new() })
}

/// One sync round with one peer. Errors are only the local ledger's; everything a peer
/// can do wrong ends up in the returned (and stored) record.
pub fn sync_peer(ledger: &Ledger, peer: &PeerConfig, config: &FleetConfig) -> Result<SyncReport, LedgerError> {
    let src = HttpSource::new(&peer.url, Duration::from_millis(config.request_timeout_ms));
    sync_peer_from(ledger, peer, config, &src, || src.checkpoint())
}

/// [`sync_peer`] with the checkpoint and tiles from anywhere.
pub fn sync_peer_from(
    ledger: &Ledger,
    peer: &PeerConfig,
    config: &FleetConfig,
    src: &dyn TileSource,
    checkpoint: impl FnOnce() -> Result<String, String>,
) -> Result<SyncReport, LedgerError> {
    let mut rec = ledger.peer_record(&peer.name)?.unwrap_or_default();
    if rec.status == PeerStatus::SplitView {
        // Sticky: a peer that equivocated is ignored until an operator resets it.
        return Ok(SyncReport { record: rec, suppressed: Vec::new() });
    }
    let verifier = match NoteVerifier::from_vkey(&peer.checkpoint_key) {
        Ok(v) => v,
        Err(e) => {
            return fail(
                ledger,
                peer,
                rec,
                PeerStatus::BadCheckpoint,
                format!("configured checkpoint key: {e}"),
                vec![],
            )
        }
    };
    let witness_key = match parse_witness_key(&peer.witness_key) {
        Ok(k) => k,
        Err(e) => return fail(ledger, peer, rec, PeerStatus::BadCheckpoint, e, vec![]),
    };
    let note = match checkpoint() {
        Ok(n) => n,
        Err(e) => return fail(ledger, peer, rec, PeerStatus::Unreachable, format!("checkpoint: {e}"), vec![]),
    };
    let origin = peer.origin.clone().unwrap_or_else(|| verifier.name().to_owned());
    let cp = match Checkpoint::open_signed(&note, &verifier, &origin) {
        Ok(cp) => cp,
        Err(e) => {
            return fail(
                ledger,
                peer,
                rec,
                PeerStatus::BadCheckpoint,
                format!("checkpoint does not verify: {e}"),
                vec![note],
            )
        }
    };
    if peer.quorum > 0 {
        let valid = peer
            .cosigners
            .iter()
            .filter_map(|k| germline_ledger::CosignatureVerifier::from_vkey(k).ok())
            .filter(|v| v.verify(&note).is_ok())
            .count();
        if valid < peer.quorum {
            return fail(
                ledger,
                peer,
                rec,
                PeerStatus::Unwitnessed,
                format!("checkpoint size {} has {valid} of the {} cosignatures required", cp.size, peer.quorum),
                vec![note],
            );
        }
    }
    // Two signed heads of one size with different roots need no tile to convict.
    if let Some(old_note) = rec.checkpoint.clone() {
        if rec.size == cp.size && rec.root != hex::encode(cp.root) {
            let why = TilesError::Inconsistent(format!("two different roots at size {}", cp.size));
            return tiles_failure_with_old(ledger, peer, rec, why, &old_note, &note);
        }
    }
    let tree = match TiledTree::open(src, cp.size, cp.root, config.max_requests_per_sync) {
        Ok(t) => t,
        Err(e) => return tiles_failure(ledger, peer, rec, e, &note),
    };
    if let Some(old_note) = rec.checkpoint.clone() {
        let old = match Checkpoint::open_signed(&old_note, &verifier, &origin) {
            Ok(c) => c,
            Err(e) => return Err(LedgerError::Corrupt(format!("stored checkpoint of peer {}: {e}", peer.name))),
        };
        if cp.size < old.size {
            return fail(
                ledger,
                peer,
                rec,
                PeerStatus::Unreachable,
                format!("peer serves checkpoint size {} older than the verified {} (stale cache?)", cp.size, old.size),
                vec![],
            );
        }
        if let Err(e) = check_consistency(old.size, &old.root, &tree) {
            return tiles_failure_with_old(ledger, peer, rec, e, &old_note, &note);
        }
    }
    if rec.checkpoint.as_deref() != Some(note.as_str()) {
        rec.checkpoint = Some(note.clone());
        rec.size = cp.size;
        rec.root = hex::encode(cp.root);
        ledger.put_peer_record(&peer.name, &rec)?;
    }

    let mut suppressed = Vec::new();
    let params = ledger.dampening_params();
    let end = cp.size.min(rec.processed.saturating_add(config.max_entries_per_sync));
    let deadline = Instant::now() + Duration::from_millis(config.request_timeout_ms.saturating_mul(4));
    while rec.processed < end && Instant::now() < deadline {
        let chunk_end = end.min((rec.processed / 256 + 1) * 256);
        let entries = match tree.entries(rec.processed, chunk_end) {
            Ok(e) => e,
            Err(e) => return tiles_failure(ledger, peer, rec, e, &note),
        };
        let base = rec.processed;
        for (offset, data) in entries.iter().enumerate() {
            let index = base + offset as u64;
            let entry = match Entry::decode(data) {
                Ok(e) => e,
                Err(e) => {
                    // Authenticated by the peer's signed tree, yet not an entry: the peer
                    // logged garbage. Skip it, say so.
                    tracing::warn!(peer = %peer.name, index, "undecodable entry: {e}");
                    continue;
                }
            };
            if entry.kind != EntryKind::Witness {
                continue;
            }
            match judge_witness(&entry, &witness_key, &params) {
                WitnessDecision::Suppress { release, witness_sha256 } => {
                    let reason =
                        format!("fleet: witness {} from {} entry {index}", hex::encode(witness_sha256), peer.name);
                    // The suppression and the cursor past its witness: one durable batch.
                    let mut next = rec.clone();
                    next.processed = index + 1;
                    let (at, new, stored) =
                        ledger.suppress_from_peer(&release, witness_sha256, &reason, &peer.name, next)?;
                    rec = stored;
                    if new {
                        tracing::warn!(peer = %peer.name, %release, entry = at, "{reason}");
                        suppressed.push(release);
                    }
                }
                WitnessDecision::Ignore(why) => {
                    tracing::info!(peer = %peer.name, index, "witness not suppressing: {why}");
                }
                WitnessDecision::Reject(why) => {
                    tracing::warn!(peer = %peer.name, index, "witness rejected: {why}");
                    rec.rejected_witnesses += 1;
                    rec.processed = index + 1;
                    ledger.put_peer_record(&peer.name, &rec)?;
                }
            }
        }
        rec.processed = chunk_end;
        ledger.put_peer_record(&peer.name, &rec)?;
    }
    rec.status = PeerStatus::Ok;
    rec.message = format!("verified size {}, processed {} entries", cp.size, rec.processed);
    rec.evidence = Vec::new();
    rec.updated_ms = germline_ledger::entry::now_ms();
    ledger.put_peer_record(&peer.name, &rec)?;
    Ok(SyncReport { record: rec, suppressed })
}

fn tiles_failure(
    ledger: &Ledger,
    peer: &PeerConfig,
    rec: PeerRecord,
    e: TilesError,
    note: &str,
) -> Result<SyncReport, LedgerError> {
    match e {
        TilesError::Tampered { ref path, .. } => {
            let path = path.clone();
            fail(ledger, peer, rec, PeerStatus::TamperedTile, e.to_string(), vec![path, note.to_owned()])
        }
        TilesError::Inconsistent(_) => {
            fail(ledger, peer, rec, PeerStatus::TamperedTile, e.to_string(), vec![note.to_owned()])
        }
        TilesError::Unreachable { .. } | TilesError::Budget(_) => {
            fail(ledger, peer, rec, PeerStatus::Unreachable, e.to_string(), vec![])
        }
    }
}

fn tiles_failure_with_old(
    ledger: &Ledger,
    peer: &PeerConfig,
    rec: PeerRecord,
    e: TilesError,
    old: &str,
    new: &str,
) -> Result<SyncReport, LedgerError> {
    match e {
        TilesError::Inconsistent(why) => fail(
            ledger,
            peer,
            rec,
            PeerStatus::SplitView,
            format!("split view: two signed checkpoints that cannot both hold ({why}); peer ignored from now on"),
            vec![old.to_owned(), new.to_owned()],
        ),
        other => tiles_failure(ledger, peer, rec, other, new),
    }
}

/// Parses a witness public key (64 hex digits).
pub fn parse_witness_key(text: &str) -> Result<[u8; 32], String> {
    let mut k = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut k).map_err(|_| "witness_key must be 64 hex digits".to_string())?;
    Ok(k)
}

/// A running mirror; dropping the handle does not stop it, [`MirrorHandle::stop`] does.
pub struct MirrorHandle {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MirrorHandle {
    /// Asks the mirror to stop after the current peer and waits for it.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the mirror thread: every `sync_interval_ms`, one round over all peers.
pub fn spawn_mirror(ledger: Arc<Ledger>, config: FleetConfig) -> std::io::Result<MirrorHandle> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let thread = std::thread::Builder::new().name("fleet-mirror".into()).spawn(move || {
        let interval = Duration::from_millis(config.sync_interval_ms.max(10));
        while !flag.load(Ordering::Acquire) {
            let started = Instant::now();
            for peer in &config.peers {
                if flag.load(Ordering::Acquire) {
                    break;
                }
                if let Err(e) = sync_peer(&ledger, peer, &config) {
                    tracing::error!(peer = %peer.name, "local ledger failed during sync: {e}");
                }
            }
            while !flag.load(Ordering::Acquire) && started.elapsed() < interval {
                std::thread::sleep(Duration::from_millis(10).min(interval));
            }
        }
    })?;
    Ok(MirrorHandle { stop, thread: Some(thread) })
}
