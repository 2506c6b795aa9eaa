//! `germline fleet …` and the fleet's HTTP routes over the logic of [`germline_fleet`]
//! (tile client, mirror and trust rule, tlog-witness, lookups, configuration).

pub mod routes;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use germline_fleet::{cosigner_name, export, lookup, open_ledger, status_json, witness, FleetConfig, FleetHandle};
use germline_ledger::{Ledger, NoteVerifier, PeerRecord};
use germline_model::ReleaseHash;

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

/// Starts the fleet on a host's ledger (what the HTTP service calls,
/// [`germline_fleet::start`]) and returns the router to mount: the public tiles and
/// `/lookup`, the witness `POST /add-checkpoint`, and `/fleet/status`.
pub fn start(
    ledger: Arc<Ledger>,
    data_dir: &Path,
    config: &FleetConfig,
) -> anyhow::Result<(axum::Router, FleetHandle)> {
    let (witness_service, handle) = germline_fleet::start(Arc::clone(&ledger), data_dir, config)?;
    let router = routes::public_routes(Arc::clone(&ledger))
        .merge(routes::status_routes(ledger))
        .merge(routes::witness_routes(witness_service));
    Ok((router, handle))
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
