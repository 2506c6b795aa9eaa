//! Fleet-wide suppression over C2SP tlog-tiles.
//!
//! Each host publishes its ledger as static tiles plus a signed checkpoint
//! ([`routes::public_routes`]); each host mirrors its configured peers
//! ([`mirror::spawn_mirror`]), verifying every checkpoint's signature and its consistency
//! with the last one seen from authenticated tiles ([`tiles`]), and suppresses a release
//! here once a peer's verified witness for it is accepted (trust rule in [`mirror`]).
//! A peer caught with two inconsistent checkpoints is flagged as a split view and
//! ignored; a tile that does not hash to the signed root is reported as tampered.
//!
//! Commands: `germline fleet serve|status|keys|export|reset-peer|check-lookup`. The HTTP
//! service embeds [`FleetConfig`] as `[fleet]` and calls [`start`] on its own ledger:
//! that mounts the routes and runs the mirror and the checkpoint signer.

pub mod lookup;
pub mod mirror;
pub mod routes;
pub mod tiles;
pub mod witness;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use germline_ledger::tiles::{entries_path, tile_path};
use germline_ledger::{Ledger, LedgerConfig, NoteVerifier, PeerRecord, TILE_WIDTH};
use germline_model::ReleaseHash;
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

/// `germline fleet …`.
#[derive(Args, Debug)]
pub struct FleetArgs {
    #[command(subcommand)]
    command: FleetCommand,
}

#[derive(Subcommand, Debug)]
enum FleetCommand {
    /// Publish this host's ledger as C2SP tiles and mirror the configured peers.
    Serve {
        /// Data directory (the ledger lives in DIR/ledger, the witness key in DIR).
        #[arg(long)]
        data_dir: PathBuf,
        /// Address to listen on (loopback in tests; port 0 picks one).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// A TOML file with a `[fleet]` table.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print each peer's status (and, with --release, that release's suppression state).
    Status {
        /// Data directory of a host that is not running (the ledger is locked while it is).
        #[arg(long, conflicts_with = "url")]
        data_dir: Option<PathBuf>,
        /// Base URL of a running `fleet serve`.
        #[arg(long)]
        url: Option<String>,
        /// Also print this release's dampening state and fleet suppressions.
        #[arg(long, requires = "data_dir")]
        release: Option<ReleaseHash>,
    },
    /// Print this host's checkpoint key (vkey) and witness key, creating them if needed.
    Keys {
        /// Data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// Log origin for a new ledger.
        #[arg(long)]
        origin: Option<String>,
    },
    /// Write the ledger as static files (checkpoint, tiles, entry bundles) under DIR,
    /// for any web server, CDN or object store to serve.
    Export {
        /// Data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// Forget what the mirror knows about a peer (e.g. after a split view was resolved);
    /// its log is then read from the start again (suppressions are not repeated).
    ResetPeer {
        /// Data directory of a host that is not running.
        #[arg(long)]
        data_dir: PathBuf,
        /// The peer's name.
        #[arg(long)]
        peer: String,
    },
    /// Verify a saved `/lookup` answer offline against a checkpoint key.
    CheckLookup {
        /// The answer (JSON file).
        #[arg(long)]
        answer: PathBuf,
        /// The log's checkpoint vkey (text).
        #[arg(long)]
        key: String,
        /// The release the answer must be about.
        #[arg(long)]
        release: ReleaseHash,
    },
}

/// Runs a `germline fleet` command; returns the exit code.
pub fn run(args: FleetArgs) -> anyhow::Result<i32> {
    match args.command {
        FleetCommand::Serve { data_dir, listen, config } => serve(&data_dir, &listen, FleetConfig::load(&config)?),
        FleetCommand::Status { data_dir, url, release } => status(data_dir.as_deref(), url.as_deref(), release),
        FleetCommand::Keys { data_dir, origin } => {
            let ledger = open_ledger(&data_dir, origin)?;
            let wk = germline_verifier::WitnessKey::load_or_create(&data_dir, "germline-host")?;
            let cosigner = witness::load_cosigner(&data_dir, &cosigner_name(&ledger))?;
            println!(
                "{}",
                serde_json::json!({"origin": ledger.origin(), "checkpoint_key": ledger.verifier().to_vkey(),
                    "witness_key": hex::encode(wk.public_key()), "cosigner_key": cosigner.verifier().to_vkey()})
            );
            Ok(0)
        }
        FleetCommand::Export { data_dir, out } => {
            let ledger = open_ledger(&data_dir, None)?;
            let n = export(&ledger, &out)?;
            println!("{}", serde_json::json!({"size": ledger.size(), "files": n, "out": out}));
            Ok(0)
        }
        FleetCommand::ResetPeer { data_dir, peer } => {
            let ledger = open_ledger(&data_dir, None)?;
            let old = ledger.peer_record(&peer)?.ok_or_else(|| anyhow::anyhow!("no record of peer {peer:?}"))?;
            ledger.put_peer_record(&peer, &PeerRecord::default())?;
            println!("{}", serde_json::json!({"reset": peer, "was": status_json(&peer, &old)}));
            Ok(0)
        }
        FleetCommand::CheckLookup { answer, key, release } => {
            let text = std::fs::read_to_string(&answer).with_context(|| format!("reading {}", answer.display()))?;
            let parsed: lookup::LookupAnswer = serde_json::from_str(&text).context("parsing the lookup answer")?;
            let key = NoteVerifier::from_vkey(&key).context("--key")?;
            match lookup::check(&parsed, &key, &release) {
                Ok((cp, entries)) => {
                    let rows: Vec<_> =
                        entries.iter().map(|(i, e)| serde_json::json!({"index": i, "kind": e.kind.as_str()})).collect();
                    println!("{}", serde_json::json!({"ok": true, "size": cp.size, "entries": rows}));
                    Ok(0)
                }
                Err(e) => {
                    println!("{}", serde_json::json!({"ok": false, "error": e}));
                    Ok(1)
                }
            }
        }
    }
}

/// This host's cosigner name: its log origin with `/witness` appended.
pub fn cosigner_name(ledger: &Ledger) -> String {
    format!("{}/witness", ledger.origin())
}

fn open_ledger(data_dir: &Path, origin: Option<String>) -> anyhow::Result<Ledger> {
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

fn status(data_dir: Option<&Path>, url: Option<&str>, release: Option<ReleaseHash>) -> anyhow::Result<i32> {
    if let Some(url) = url {
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(5)).redirects(0).build();
        let body = agent
            .get(&format!("{}/fleet/status", url.trim_end_matches('/')))
            .call()
            .with_context(|| format!("asking {url}"))?
            .into_string()?;
        let rows: Vec<serde_json::Value> = serde_json::from_str(&body).context("status answer")?;
        for r in rows {
            println!("{r}");
        }
        return Ok(0);
    }
    let Some(dir) = data_dir else { bail!("give --data-dir or --url") };
    let ledger = open_ledger(dir, None)?;
    for (name, rec) in ledger.peer_records()? {
        println!("{}", status_json(&name, &rec));
    }
    if let Some(r) = release {
        let s = ledger.dampening_state(&r)?;
        let fleet: Vec<_> = ledger
            .fleet_suppressions(&r)?
            .into_iter()
            .map(|f| serde_json::json!({"witness_sha256": hex::encode(f.witness_sha256), "entry": f.index}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"release": r.to_hex(), "suppressed": s.suppressed, "penalty": s.penalty, "fleet": fleet})
        );
    }
    Ok(0)
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
/// peers, and returns the router to mount: the public tiles and `/lookup`, the witness
/// `POST /add-checkpoint`, and `/fleet/status`.
pub fn start(
    ledger: Arc<Ledger>,
    data_dir: &Path,
    config: &FleetConfig,
) -> anyhow::Result<(axum::Router, FleetHandle)> {
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
    let router = routes::public_routes(Arc::clone(&ledger))
        .merge(routes::status_routes(Arc::clone(&ledger)))
        .merge(witness::witness_routes(witness_service));
    Ok((router, FleetHandle { mirror: Some(mirror), stop, signer: Some(signer) }))
}

fn serve(data_dir: &Path, listen: &str, config: FleetConfig) -> anyhow::Result<i32> {
    let ledger = Arc::new(open_ledger(data_dir, config.origin.clone())?);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (app, handle) = start(Arc::clone(&ledger), data_dir, &config)?;
    let result = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
        let addr = listener.local_addr()?;
        println!(
            "{}",
            serde_json::json!({"listening": format!("http://{addr}"), "origin": ledger.origin(),
                "checkpoint_key": ledger.verifier().to_vkey()})
        );
        axum::serve(listener, app).with_graceful_shutdown(shutdown()).await.context("serving")
    });
    handle.stop();
    result.map(|()| 0)
}

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
