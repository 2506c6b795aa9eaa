//! Fleet-wide suppression over C2SP tlog-tiles.
//!
//! Each host publishes its ledger as static tiles plus a signed checkpoint (the
//! service's routes, or [`export`] for any static server); each host mirrors its configured peers
//! ([`mirror::spawn_mirror`]), verifying every checkpoint's signature and its consistency
//! with the last one seen from authenticated tiles ([`tiles`]), and suppresses a release
//! here once a peer's verified witness for it is accepted (trust rule in [`mirror`]).
//! A peer caught with two inconsistent checkpoints is flagged as a split view and
//! ignored; a tile that does not hash to the signed root is reported as tampered.
//!
//! The CLI (`germline fleet serve|status|keys|export|reset-peer|check-lookup`) and the
//! HTTP routes live in the service binary. The service embeds [`FleetConfig`] as
//! `[fleet]` and calls [`start`] on its own ledger: that runs the mirror and the
//! checkpoint signer and gives the witness the routes serve.

pub mod lookup;
pub mod mirror;
pub mod tiles;
pub mod witness;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use germline_ledger::tiles::{entries_path, tile_path};
use germline_ledger::{Ledger, LedgerConfig, NoteVerifier, PeerRecord, TILE_WIDTH};
use serde::{Deserialize, Serialize};

/// Fleet settings (`[fleet]` in the service's configuration, or a file of their own).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// Milliseconds between sync rounds (and between checkpoint signings).
    #[serde(default = "default_interval")]
    pub sync_interval_ms: u64,
    /// Timeout of each HTTP request to a peer.
    #[serde(default = "default_timeout")]
    pub request_timeout_ms: u64,
    /// Most peer entries processed per peer and round (the rest waits for the next).
    #[serde(default = "default_max_entries")]
    pub max_entries_per_sync: u64,
    /// Most tile fetches per peer and round.
    #[serde(default = "default_max_requests")]
    pub max_requests_per_sync: usize,
    /// This host's log origin (default: the one stored in the ledger, or a random one).
    #[serde(default)]
    pub origin: Option<String>,
    /// The peers to mirror (and whose checkpoints this host cosigns as a witness).
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    /// Witnesses this host submits its own checkpoints to (C2SP tlog-witness).
    #[serde(default)]
    pub witnesses: Vec<WitnessConfig>,
}

/// A witness this host asks to cosign its checkpoints.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WitnessConfig {
    /// A local name.
    pub name: String,
    /// Its submission prefix (`<url>/add-checkpoint`).
    pub url: String,
    /// Its cosigner key (vkey, type 0x04).
    pub cosigner_key: String,
}

fn default_interval() -> u64 {
    2000
}
fn default_timeout() -> u64 {
    5000
}
fn default_max_entries() -> u64 {
    4096
}
fn default_max_requests() -> usize {
    2048
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            sync_interval_ms: default_interval(),
            request_timeout_ms: default_timeout(),
            max_entries_per_sync: default_max_entries(),
            max_requests_per_sync: default_max_requests(),
            origin: None,
            peers: Vec::new(),
            witnesses: Vec::new(),
        }
    }
}

/// One peer: where its tiles are and which keys speak for it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// A local name for the peer (status, suppression reasons).
    pub name: String,
    /// Base URL of its tiles (`<url>/checkpoint`, `<url>/tile/…`).
    pub url: String,
    /// Its checkpoint verifier key (C2SP signed-note vkey).
    pub checkpoint_key: String,
    /// Its witness-signing public key (64 hex digits).
    pub witness_key: String,
    /// Its log origin, if not the checkpoint key's name.
    #[serde(default)]
    pub origin: Option<String>,
    /// Witness cosigner keys (vkeys, type 0x04) whose cosignatures count for this peer.
    #[serde(default)]
    pub cosigners: Vec<String>,
    /// How many of `cosigners` must have cosigned a checkpoint before it is accepted
    /// (0: the peer's own signature suffices).
    #[serde(default)]
    pub quorum: usize,
}

impl FleetConfig {
    /// Checks what can be checked without the network.
    pub fn validate(&self) -> anyhow::Result<()> {
        let mut names = std::collections::BTreeSet::new();
        for p in &self.peers {
            if p.name.is_empty() || !p.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
                bail!("peer name {:?}: use letters, digits, '-', '_' or '.'", p.name);
            }
            if !names.insert(&p.name) {
                bail!("peer {:?} is configured twice", p.name);
            }
            if !(p.url.starts_with("http://") || p.url.starts_with("https://")) {
                bail!("peer {}: url must be http:// or https://", p.name);
            }
            NoteVerifier::from_vkey(&p.checkpoint_key).with_context(|| format!("peer {}: checkpoint_key", p.name))?;
            mirror::parse_witness_key(&p.witness_key).map_err(|e| anyhow::anyhow!("peer {}: {e}", p.name))?;
            for c in &p.cosigners {
                germline_ledger::CosignatureVerifier::from_vkey(c)
                    .with_context(|| format!("peer {}: cosigner", p.name))?;
            }
            if p.quorum > p.cosigners.len() {
                bail!("peer {}: quorum {} exceeds its {} cosigners", p.name, p.quorum, p.cosigners.len());
            }
        }
        for w in &self.witnesses {
            germline_ledger::CosignatureVerifier::from_vkey(&w.cosigner_key)
                .with_context(|| format!("witness {}: cosigner_key", w.name))?;
        }
        if self.sync_interval_ms == 0 || self.request_timeout_ms == 0 || self.max_requests_per_sync == 0 {
            bail!("sync_interval_ms, request_timeout_ms and max_requests_per_sync must be positive");
        }
        Ok(())
    }

    /// Loads a file whose `[fleet]` table is the configuration.
    pub fn load(path: &Path) -> anyhow::Result<FleetConfig> {
        #[derive(Deserialize)]
        struct File {
            fleet: FleetConfig,
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let f: File = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        f.fleet.validate()?;
        Ok(f.fleet)
    }
}

/// This host's cosigner name: its log origin with `/witness` appended.
pub fn cosigner_name(ledger: &Ledger) -> String {
    format!("{}/witness", ledger.origin())
}

/// Opens the ledger under `data_dir` for a fleet command (`origin` for a new one).
pub fn open_ledger(data_dir: &Path, origin: Option<String>) -> anyhow::Result<Ledger> {
    let dir = data_dir.join("ledger");
    Ledger::open(&dir, LedgerConfig { origin, ..Default::default() })
        .with_context(|| format!("opening the ledger in {} (is a host running on it?)", dir.display()))
}

/// One peer's status as JSON.
pub fn status_json(name: &str, r: &PeerRecord) -> serde_json::Value {
    serde_json::json!({
        "peer": name, "status": r.status.as_str(), "message": r.message, "size": r.size, "root": r.root,
        "processed": r.processed, "suppressions": r.suppressions, "rejected_witnesses": r.rejected_witnesses,
        "evidence": r.evidence, "updated_ms": r.updated_ms,
    })
}

/// Writes checkpoint, hash tiles and entry bundles of the current log under `out`.
pub fn export(ledger: &Ledger, out: &Path) -> anyhow::Result<usize> {
    let cp = ledger.checkpoint()?;
    let size = cp.checkpoint.size;
    let mut files = 0;
    let mut write = |path: &str, bytes: &[u8]| -> anyhow::Result<()> {
        let p = out.join(path);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
        files += 1;
        Ok(())
    };
    for level in 0u8..8 {
        let nodes = size >> (8 * u32::from(level));
        if nodes == 0 {
            break;
        }
        for n in 0..nodes.div_ceil(TILE_WIDTH) {
            let w = (nodes - n * TILE_WIDTH).min(TILE_WIDTH) as u16;
            write(&tile_path(level, n, w), &ledger.tile(level, n, w)?)?;
        }
    }
    for n in 0..size.div_ceil(TILE_WIDTH) {
        let w = (size - n * TILE_WIDTH).min(TILE_WIDTH) as u16;
        write(&entries_path(n, w), &ledger.entries_bundle(n, w)?)?;
    }
    write("checkpoint", cp.note.as_bytes())?;
    Ok(files)
}

/// The running fleet machinery of one host: the mirror and the checkpoint signer.
pub struct FleetHandle {
    mirror: Option<mirror::MirrorHandle>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    signer: Option<std::thread::JoinHandle<()>>,
}

impl FleetHandle {
    /// Stops the mirror and the signer and waits for them.
    pub fn stop(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(m) = self.mirror.take() {
            m.stop();
        }
        if let Some(t) = self.signer.take() {
            let _ = t.join();
        }
    }
}

/// Starts the fleet on a host's ledger (what the HTTP service calls): signs a checkpoint
/// now and then every `sync_interval_ms` (gathering witness cosignatures), mirrors the
/// peers, and returns the witness that answers `POST /add-checkpoint` (the service
/// mounts it with the public tiles, `/lookup` and `/fleet/status`) and the handle that
/// stops the rest.
pub fn start(
    ledger: Arc<Ledger>,
    data_dir: &Path,
    config: &FleetConfig,
) -> anyhow::Result<(Arc<witness::WitnessService>, FleetHandle)> {
    config.validate()?;
    germline_verifier::WitnessKey::load_or_create(data_dir, "germline-host")?;
    let cosigner = witness::load_cosigner(data_dir, &cosigner_name(&ledger))?;
    let witness_service = Arc::new(witness::WitnessService::new(Arc::clone(&ledger), cosigner, config)?);
    ledger.checkpoint().context("signing the first checkpoint")?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, signer, witness_config) = (Arc::clone(&stop), Arc::clone(&ledger), config.clone());
    let interval = Duration::from_millis(config.sync_interval_ms.max(10));
    let signer = std::thread::Builder::new().name("fleet-checkpoints".into()).spawn(move || {
        let mut known = std::collections::HashMap::new();
        while !flag.load(std::sync::atomic::Ordering::Acquire) {
            if let Err(e) = signer.checkpoint() {
                tracing::error!("signing a checkpoint: {e}");
            }
            witness::collect_cosignatures(&signer, &witness_config, &mut known);
            let t = std::time::Instant::now();
            while t.elapsed() < interval && !flag.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(10).min(interval));
            }
        }
    })?;
    let mirror = mirror::spawn_mirror(Arc::clone(&ledger), config.clone())?;
    Ok((witness_service, FleetHandle { mirror: Some(mirror), stop, signer: Some(signer) }))
}
