//! Crash safety: a child process appends from several threads and is SIGKILLed at
//! random points; after every restart each acknowledged entry must be present and
//! intact, nothing torn or duplicated, the tree must verify, and new checkpoints must
//! be consistent (checked with ct-merkle, not our verifier) with all earlier ones.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ct_merkle::{ConsistencyProof, RootHash};
use germline_ledger::{merkle::Hash, Checkpoint, Ledger, LedgerConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use sha2_ct::Sha256 as CtSha256;

const TOTAL: u64 = 10_000;
const THREADS: u64 = 8;

fn ct_root(size: u64, root: &Hash) -> RootHash<CtSha256> {
    RootHash::new((*root).into(), size)
}

fn open(dir: &std::path::Path) -> Ledger {
    Ledger::open(dir, LedgerConfig { origin: Some("crash.test/log".into()), ..Default::default() })
        .expect("open ledger")
}

#[test]
fn acknowledged_appends_survive_sigkill_and_heads_stay_consistent() {
    crash_rounds(1);
}

/// Each thread keeps 128 appends in flight, so the writer commits groups of hundreds
/// and most kills land while a group is being built or synced: only acknowledged
/// appends must survive, and no group may be half there.
#[test]
fn acknowledged_pipelined_appends_survive_sigkill_mid_group() {
    crash_rounds(128);
}

fn crash_rounds(window: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let helper = env!("CARGO_BIN_EXE_ledger-crash-helper");
    let mut rng = ChaCha20Rng::seed_from_u64(0x5eed);
    // body → index for every acknowledged append, and every head ever seen.
    let mut acked: HashMap<String, u64> = HashMap::new();
    let mut heads: Vec<(u64, Hash)> = Vec::new();
    let mut kills = 0;
    let started = Instant::now();
    for round in 0..10u64 {
        let size_before = {
            let ledger = open(dir.path());
            ledger.size()
        };
        if size_before >= TOTAL && kills >= 3 {
            break;
        }
        let remaining = TOTAL.saturating_sub(size_before).max(THREADS * 50);
        let mut child = Command::new(helper)
            .arg(dir.path())
            .arg(round.to_string())
            .arg(THREADS.to_string())
            .arg(remaining.to_string())
            .arg(window.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn helper");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
        // Six rounds die at a random point (during open or mid-append); then one completes.
        let kill_after =
            if kills < 6 { Duration::from_millis(rng.gen_range(20..600)) } else { Duration::from_secs(90) };
        let deadline = Instant::now() + kill_after;
        let mut exited = false;
        while Instant::now() < deadline {
            if child.try_wait().expect("try_wait").is_some() {
                exited = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if !exited {
            child.kill().expect("SIGKILL helper");
            kills += 1;
        }
        let status = child.wait().expect("wait");
        if exited {
            assert!(status.success(), "helper failed: {status}");
        }
        reader.join().expect("reader");
        let mut new_acks = 0;
        for line in rx.try_iter() {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["ack", index, r, t, s] => {
                    let body = format!(r#"{{"round":{r},"thread":{t},"seq":{s}}}"#);
                    let index: u64 = index.parse().expect("index");
                    assert!(acked.insert(body, index).is_none(), "acknowledged twice");
                    new_acks += 1;
                }
                ["cp", size, root] => {
                    let root: Hash = hex::decode(root).expect("hex").try_into().expect("32 bytes");
                    heads.push((size.parse().expect("size"), root));
                }
                _ => {} // a line cut by the kill is never complete, so never parsed
            }
        }

        // Restart and check.
        let ledger = open(dir.path());
        let size = ledger.size();
        assert!(size >= size_before, "log shrank from {size_before} to {size}");
        for (body, &index) in &acked {
            let e = ledger.get(index).expect("acknowledged entry present");
            assert_eq!(std::str::from_utf8(&e.body).expect("utf-8"), body, "entry {index}");
        }
        let mut seen = HashSet::new();
        for i in 0..size {
            let e = ledger.get(i).expect("every entry decodes (none torn)");
            if e.kind == germline_ledger::EntryKind::Witness {
                assert!(seen.insert(e.body.clone()), "entry {i} duplicated");
            }
        }
        let report = ledger.verify().expect("verify");
        assert!(report.is_ok(), "round {round}: {:?}", report.problems);
        let cp = ledger.checkpoint().expect("checkpoint after restart");
        let parsed = Checkpoint::open_signed(&cp.note, &ledger.verifier(), ledger.origin()).expect("signed");
        assert_eq!(parsed.size, size);
        for note in ledger.checkpoints().expect("stored checkpoints") {
            let c = Checkpoint::open_signed(&note, &ledger.verifier(), ledger.origin())
                .expect("stored checkpoint verifies");
            heads.push((c.size, c.root));
        }
        for &(old, old_root) in &heads {
            if old == 0 {
                continue;
            }
            let proof = ledger.consistency_proof(old, size).expect("proof");
            let proof = ConsistencyProof::<CtSha256>::try_from_bytes(proof.concat()).expect("whole hashes");
            ct_root(size, &parsed.root)
                .verify_consistency(&ct_root(old, &old_root), &proof)
                .unwrap_or_else(|e| panic!("head {old} inconsistent with {size}: {e:?}"));
        }
        heads.push((size, parsed.root));
        eprintln!("round {round}: +{new_acks} acks, size {size}, killed={}", !exited);
    }
    assert!(kills >= 3, "only {kills} kills happened mid-run");
    let ledger = open(dir.path());
    assert!(ledger.size() >= TOTAL, "only {} entries", ledger.size());
    assert!(acked.len() as u64 >= TOTAL / 2, "only {} acks", acked.len());
    assert!(started.elapsed() < Duration::from_secs(120));
}
