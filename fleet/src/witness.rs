//! Split-view protection: each host is a C2SP tlog-witness for its peers' logs and
//! gathers cosignatures on its own checkpoints from the witnesses it is configured with.
//!
//! Witness side: `POST /add-checkpoint` (C2SP tlog-witness, routed by the service)
//! cosigns a peer's checkpoint
//! (C2SP tlog-cosignature, `cosignature/v1`) only if it is signed by that peer's key and
//! provably extends the last checkpoint this host cosigned for the same origin; the
//! check and the update of that state happen under one lock, and the state is durable
//! before the answer. Log side: after each new checkpoint the host submits it to its
//! witnesses and publishes it with the cosignatures it got. A mirror configured with a
//! quorum accepts a peer's checkpoint only with that many valid cosignatures, so a log
//! can show two views only by getting witnesses to sign both, which they never do.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use germline_ledger::merkle;
use germline_ledger::{Checkpoint, CosignatureVerifier, Cosigner, Ledger, NoteVerifier};

use crate::FleetConfig;

/// Largest add-checkpoint request body accepted.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Why a checkpoint was not cosigned; each maps to the status the spec prescribes.
#[derive(Debug, PartialEq, Eq)]
pub enum AddCheckpointError {
    /// 400: malformed request, or old size above the checkpoint's size.
    BadRequest(String),
    /// 403: no valid signature by the log's key.
    Forbidden(String),
    /// 404: the origin is not a log this host witnesses.
    UnknownLog(String),
    /// 409: the old size is not the size last cosigned (which is returned).
    Conflict(u64),
    /// 422: the proof or the roots do not show consistency.
    Unprocessable(String),
    /// 500: this host's storage failed.
    Internal(String),
}

/// The witness: its cosigner key, the logs it witnesses and their state.
pub struct WitnessService {
    ledger: Arc<Ledger>,
    cosigner: Cosigner,
    logs: HashMap<String, NoteVerifier>,
    lock: Mutex<()>,
}

impl WitnessService {
    /// A witness for the logs of `config.peers`, cosigning with `cosigner`.
    pub fn new(ledger: Arc<Ledger>, cosigner: Cosigner, config: &FleetConfig) -> anyhow::Result<Self> {
        let mut logs = HashMap::new();
        for p in &config.peers {
            let v = NoteVerifier::from_vkey(&p.checkpoint_key).with_context(|| format!("peer {}", p.name))?;
            logs.insert(p.origin.clone().unwrap_or_else(|| v.name().to_owned()), v);
        }
        Ok(WitnessService { ledger, cosigner, logs, lock: Mutex::new(()) })
    }

    /// Handles an add-checkpoint body; returns the cosignature line(s).
    pub fn add_checkpoint(&self, body: &str, now: u64) -> Result<String, AddCheckpointError> {
        let bad = |m: &str| AddCheckpointError::BadRequest(m.to_owned());
        let (head, note) = body.split_once("\n\n").ok_or_else(|| bad("missing blank line before the checkpoint"))?;
        let mut lines = head.split('\n');
        let old_line = lines.next().ok_or_else(|| bad("missing old size line"))?;
        let old_text = old_line.strip_prefix("old ").ok_or_else(|| bad("first line must be `old <size>`"))?;
        if old_text.is_empty()
            || !old_text.bytes().all(|b| b.is_ascii_digit())
            || (old_text.len() > 1 && old_text.starts_with('0'))
        {
            return Err(bad("old size must be a decimal without leading zeroes"));
        }
        let old: u64 = old_text.parse().map_err(|_| bad("old size out of range"))?;
        let proof: Vec<merkle::Hash> = lines
            .map(|l| B64.decode(l).ok().and_then(|v| <[u8; 32]>::try_from(v).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("a proof line is not a base64 hash"))?;
        if proof.len() > 63 {
            return Err(bad("more than 63 proof lines"));
        }
        let origin = note.split('\n').next().unwrap_or_default();
        let verifier = self.logs.get(origin).ok_or_else(|| AddCheckpointError::UnknownLog(origin.to_owned()))?;
        let text = verifier.open(note).map_err(|e| AddCheckpointError::Forbidden(e.to_string()))?;
        let cp = Checkpoint::parse(text).map_err(|e| bad(&e.to_string()))?;
        if old > cp.size {
            return Err(bad("old size exceeds the checkpoint size"));
        }
        let _guard = self.lock.lock().map_err(|_| AddCheckpointError::Internal("witness lock poisoned".into()))?;
        let (have, have_root) = self
            .ledger
            .cosigned_head(origin)
            .map_err(|e| AddCheckpointError::Internal(e.to_string()))?
            .unwrap_or((0, merkle::empty_root()));
        if old != have {
            return Err(AddCheckpointError::Conflict(have));
        }
        let un = |m: &str| AddCheckpointError::Unprocessable(m.to_owned());
        if cp.size == 0 && cp.root != merkle::empty_root() {
            return Err(un("a tree of size 0 must have the empty root"));
        }
        if old == 0 && !proof.is_empty() {
            return Err(un("no proof is needed (or allowed) from size 0"));
        }
        if old == cp.size && cp.root != have_root {
            return Err(un("same size, different root"));
        }
        if old > 0 && old < cp.size && !merkle::verify_consistency(old, cp.size, &have_root, &cp.root, &proof) {
            return Err(un("the consistency proof does not verify"));
        }
        self.ledger
            .put_cosigned_head(origin, cp.size, &cp.root)
            .map_err(|e| AddCheckpointError::Internal(e.to_string()))?;
        self.cosigner.cosign(text, now).map_err(|e| AddCheckpointError::Internal(e.to_string()))
    }
}

/// Loads `DIR/cosigner.key` (hex seed, mode 0600), creating it on first use.
pub fn load_cosigner(dir: &Path, name: &str) -> anyhow::Result<Cosigner> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = dir.join("cosigner.key");
    let seed = match std::fs::read_to_string(&path) {
        Ok(t) => {
            if std::fs::metadata(&path)?.permissions().mode() & 0o077 != 0 {
                anyhow::bail!("{} is readable by others; chmod 600 it", path.display());
            }
            let mut seed = [0u8; 32];
            hex::decode_to_slice(t.trim(), &mut seed)
                .with_context(|| format!("{} is not a hex seed", path.display()))?;
            seed
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let seed = Cosigner::generate(name)?.seed();
            std::fs::create_dir_all(dir)?;
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
            std::io::Write::write_all(&mut f, hex::encode(seed).as_bytes())?;
            f.sync_all()?;
            seed
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    Ok(Cosigner::from_seed(name, seed)?)
}

/// Submits this log's latest checkpoint to every configured witness and publishes it
/// with the valid cosignatures received. `known` remembers each witness's last size.
pub fn collect_cosignatures(ledger: &Ledger, config: &FleetConfig, known: &mut HashMap<String, u64>) {
    if config.witnesses.is_empty() {
        return;
    }
    let cp = match ledger.latest_checkpoint() {
        Ok(Some(cp)) => cp,
        Ok(None) => return,
        Err(e) => return tracing::error!("reading the latest checkpoint: {e}"),
    };
    if ledger.published_checkpoint().ok().flatten().is_some_and(|p| p.starts_with(&cp.note)) {
        return;
    }
    let size = cp.checkpoint.size;
    let agent =
        ureq::AgentBuilder::new().timeout(Duration::from_millis(config.request_timeout_ms)).redirects(0).build();
    let mut published = cp.note.clone();
    for w in &config.witnesses {
        let Ok(verifier) = CosignatureVerifier::from_vkey(&w.cosigner_key) else {
            tracing::error!(witness = %w.name, "bad cosigner_key");
            continue;
        };
        // At most two tries: a 409 tells the size the witness last cosigned.
        for _ in 0..2 {
            let old = known.get(&w.name).copied().unwrap_or(0).min(size);
            let proof = if old > 0 && old < size { ledger.consistency_proof(old, size) } else { Ok(Vec::new()) };
            let Ok(proof) = proof else { break };
            let mut body = format!("old {old}\n");
            for h in &proof {
                body.push_str(&B64.encode(h));
                body.push('\n');
            }
            body.push('\n');
            body.push_str(&cp.note);
            let url = format!("{}/add-checkpoint", w.url.trim_end_matches('/'));
            match agent.post(&url).send_string(&body) {
                Ok(resp) => {
                    let mut text = String::new();
                    let _ = resp.into_reader().take(MAX_REQUEST_BYTES as u64).read_to_string(&mut text);
                    let candidate = format!("{published}{text}");
                    if verifier.verify(&candidate).is_ok() {
                        published = candidate;
                        known.insert(w.name.clone(), size);
                    } else {
                        tracing::warn!(witness = %w.name, "answer has no valid cosignature");
                    }
                    break;
                }
                Err(ureq::Error::Status(409, resp)) => {
                    let t = resp.into_string().unwrap_or_default();
                    match t.trim().parse::<u64>() {
                        Ok(n) if n <= size => {
                            known.insert(w.name.clone(), n);
                        }
                        _ => {
                            tracing::error!(witness = %w.name, "witness cosigned size {t:?} that this log cannot extend");
                            break;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(witness = %w.name, "add-checkpoint: {e}");
                    break;
                }
            }
        }
    }
    if published != cp.note {
        if let Err(e) = ledger.put_published_checkpoint(&published) {
            tracing::error!("storing the cosigned checkpoint: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use germline_ledger::{Entry, EntryKind, LedgerConfig};
    use germline_model::ReleaseHash;

    fn log(dir: &Path, n: u64) -> Ledger {
        let l = Ledger::open(dir, LedgerConfig { origin: Some("log.example/a".into()), ..Default::default() })
            .expect("open");
        let e =
            (0..n).map(|i| Entry::new(EntryKind::Admission, ReleaseHash::of_bytes(&i.to_be_bytes()), b"{}".to_vec()));
        l.append_many(e.collect()).expect("append");
        l
    }

    fn request(l: &Ledger, old: u64) -> String {
        let cp = l.checkpoint().expect("cp");
        let mut body = format!("old {old}\n");
        if old > 0 && old < cp.checkpoint.size {
            for h in l.consistency_proof(old, cp.checkpoint.size).expect("proof") {
                body.push_str(&format!("{}\n", B64.encode(h)));
            }
        }
        format!("{body}\n{}", cp.note)
    }

    #[test]
    fn add_checkpoint_cosigns_only_consistent_extensions() {
        let tmp = tempfile::tempdir().expect("tmp");
        let a = log(&tmp.path().join("a"), 10);
        let config = FleetConfig {
            peers: vec![crate::PeerConfig {
                name: "a".into(),
                url: "http://127.0.0.1:1".into(),
                checkpoint_key: a.verifier().to_vkey(),
                witness_key: "00".repeat(32),
                origin: None,
                cosigners: Vec::new(),
                quorum: 0,
            }],
            ..Default::default()
        };
        let mine = Arc::new(Ledger::open(tmp.path().join("w"), LedgerConfig::default()).expect("open"));
        let cosigner = Cosigner::from_seed("w.example/w", [1u8; 32]).expect("c");
        let v = cosigner.verifier();
        let w = WitnessService::new(Arc::clone(&mine), cosigner, &config).expect("witness");

        let first = request(&a, 0);
        let line = w.add_checkpoint(&first, 100).expect("cosigned");
        let note = first.split_once("\n\n").expect("split").1;
        assert_eq!(v.verify(&format!("{note}{line}")), Ok(100));
        // A stale old size: 409 with the cosigned size.
        assert_eq!(w.add_checkpoint(&first, 101), Err(AddCheckpointError::Conflict(10)));
        // Growth with a proof: cosigned; the same checkpoint again: cosigned.
        a.append(Entry::new(EntryKind::Admission, ReleaseHash::of_bytes(b"x"), b"{}".to_vec())).expect("append");
        assert!(w.add_checkpoint(&request(&a, 10), 102).is_ok());
        assert!(w.add_checkpoint(&request(&a, 11), 103).is_ok());
        // A fork under the same key (its key file copied) with different entries: 422.
        let fork_dir = tmp.path().join("fork");
        std::fs::create_dir_all(&fork_dir).expect("mkdir");
        std::fs::copy(a.dir().join("checkpoint.key"), fork_dir.join("checkpoint.key")).expect("copy key");
        let fork = log(&fork_dir, 0);
        let e = (0..12)
            .map(|i: u64| Entry::new(EntryKind::Admission, ReleaseHash::of_bytes(&[7, i as u8]), b"{}".to_vec()));
        fork.append_many(e.collect()).expect("append");
        assert_eq!(fork.verifier(), a.verifier());
        let r = w.add_checkpoint(&request(&fork, 11), 104);
        assert!(matches!(r, Err(AddCheckpointError::Unprocessable(_))), "{r:?}");
        // Mechanism off: the honest extension is still cosigned.
        a.append(Entry::new(EntryKind::Admission, ReleaseHash::of_bytes(b"a"), b"{}".to_vec())).expect("append");
        assert!(w.add_checkpoint(&request(&a, 11), 105).is_ok());
        // Unknown log, bad signature, malformed requests.
        let other = log(&tmp.path().join("o"), 1);
        let mut foreign = request(&other, 0);
        foreign = foreign.replace("log.example/a", "log.example/zz");
        assert!(matches!(w.add_checkpoint(&foreign, 1), Err(AddCheckpointError::UnknownLog(_))));
        let forged = request(&other, 12);
        assert!(matches!(w.add_checkpoint(&forged, 1), Err(AddCheckpointError::Forbidden(_))));
        assert!(matches!(w.add_checkpoint("old 01\n\nx", 1), Err(AddCheckpointError::BadRequest(_))));
        assert!(matches!(w.add_checkpoint("nonsense", 1), Err(AddCheckpointError::BadRequest(_))));
        assert!(matches!(w.add_checkpoint(&request(&a, 100), 1), Err(AddCheckpointError::BadRequest(_))));
    }
}
