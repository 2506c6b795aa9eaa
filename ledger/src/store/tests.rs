use super::*;
use crate::FleetSuppression;
use ct_merkle::mem_backed_tree::MemoryBackedTree;
use ct_merkle::{ConsistencyProof, InclusionProof, RootHash};
use sha2_ct::Sha256 as CtSha256;

fn release(n: u8) -> ReleaseHash {
    ReleaseHash::of_bytes(&[n])
}

fn entry(i: u64) -> Entry {
    Entry {
        kind: EntryKind::Witness,
        release: release((i % 3) as u8),
        time_ms: 1_000 + i,
        body: format!(r#"{{"n":{i}}}"#).into_bytes(),
    }
}

fn open(dir: &Path) -> Ledger {
    Ledger::open(dir, LedgerConfig { origin: Some("test.example/log".into()), ..Default::default() })
        .expect("open ledger")
}

fn fill(ledger: &Ledger, n: u64) {
    let start = ledger.size();
    let entries: Vec<Entry> = (start..start + n).map(entry).collect();
    ledger.append_many(entries).expect("append");
}

fn raw_put(ledger: &Ledger, cf: &str, key: &[u8], value: &[u8]) {
    let inner = &ledger.inner;
    let handle = inner.cf(cf).expect("cf");
    inner.db.put_cf(&handle, key, value).expect("raw put");
}

fn raw_get(ledger: &Ledger, cf: &str, key: &[u8]) -> Vec<u8> {
    let inner = &ledger.inner;
    let handle = inner.cf(cf).expect("cf");
    inner.db.get_cf(&handle, key).expect("raw get").expect("present")
}

#[test]
fn appends_are_readable_and_the_tree_matches_ct_merkle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(dir.path());
    let mut reference = MemoryBackedTree::<CtSha256, Vec<u8>>::new();
    let mut roots = Vec::new();
    for i in 0..40u64 {
        let r = ledger.append(entry(i)).expect("append");
        assert_eq!(r.index, i);
        assert_eq!(r.leaf_hash, merkle::leaf_hash(&entry(i).encode()));
        reference.push(entry(i).encode());
        let (size, root) = ledger.root().expect("root");
        assert_eq!(size, i + 1);
        assert_eq!(root.as_slice(), reference.root().as_bytes().as_slice());
        roots.push(root);
    }
    assert_eq!(ledger.get(7).expect("get"), entry(7));
    assert!(matches!(ledger.get(40), Err(LedgerError::NotFound(_))));
    for size in [1u64, 5, 16, 33, 40] {
        let root = RootHash::<CtSha256>::new(roots[size as usize - 1].into(), size);
        for i in 0..size {
            let proof = ledger.inclusion_proof(i, size).expect("proof");
            root.verify_inclusion(&entry(i).encode(), i, &InclusionProof::from_bytes(proof.concat()))
                .expect("ct-merkle accepts inclusion proof");
        }
        for old in 1..=size {
            let proof = ledger.consistency_proof(old, size).expect("proof");
            let old_root = RootHash::<CtSha256>::new(roots[old as usize - 1].into(), old);
            root.verify_consistency(&old_root, &ConsistencyProof::try_from_bytes(proof.concat()).expect("hashes"))
                .expect("ct-merkle accepts consistency proof");
        }
    }
    assert!(ledger.inclusion_proof(0, 41).is_err());
    let report = ledger.verify().expect("verify");
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.entries, 40);
}

#[test]
fn concurrent_appenders_get_distinct_contiguous_indexes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(dir.path());
    let mut all: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let ledger = &ledger;
                s.spawn(move || {
                    (0..100u64).map(|j| ledger.append(entry(t * 1000 + j)).expect("append").index).collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("thread")).collect()
    });
    all.sort_unstable();
    assert_eq!(all, (0..400).collect::<Vec<_>>());
    assert!(ledger.verify().expect("verify").is_ok());
}

#[test]
fn a_batch_with_an_invalid_entry_appends_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(dir.path());
    fill(&ledger, 3);
    let mut bad = entry(9);
    bad.body = b"{not json".to_vec();
    let err = ledger.append_many(vec![entry(3), bad]).expect_err("invalid");
    assert!(matches!(err, LedgerError::Entry(_)), "{err}");
    assert_eq!(ledger.size(), 3);
    assert_eq!(ledger.append(entry(3)).expect("append").index, 3);
}

#[test]
fn entries_are_indexed_by_release() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(dir.path());
    fill(&ledger, 10);
    let got = ledger.entries_for_release(&release(1)).expect("index");
    let idx: Vec<u64> = got.iter().map(|(i, _)| *i).collect();
    assert_eq!(idx, vec![1, 4, 7]);
    assert!(got.iter().all(|(i, e)| *e == entry(*i)));
    assert!(ledger.entries_for_release(&release(9)).expect("index").is_empty());
}

/// Drops the stored dampening states of the closed ledger in `dir` (the log keeps them).
fn drop_dampening_states(dir: &Path) {
    let mut opts = Options::default();
    opts.create_if_missing(false);
    let cfs = ALL_CFS.iter().map(|n| ColumnFamilyDescriptor::new(*n, Options::default()));
    let db = Db::open_cf_descriptors(&opts, dir.join(DB_DIR), cfs).expect("raw open");
    db.drop_cf(CF_DAMPENING).expect("drop cf");
}

#[test]
fn a_verified_witness_and_its_verdict_land_together_and_replay_from_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = release(5);
    let witness = |n: u8| Entry::new(EntryKind::Witness, r, format!("{{\"n\":{n}}}").into_bytes());
    let after = {
        let ledger = open(dir.path());
        // The triggering call counted as unverified in the lane, two calls ran since.
        ledger.record_call(&r, Event::Unverified).expect("call");
        ledger.record_call(&r, Event::None).expect("call");
        ledger.record_call(&r, Event::None).expect("call");
        let (_, state) = ledger.record_witness(witness(1), false).expect("witness");
        assert_eq!(state, None, "an unverified verdict adds nothing");
        assert!(!ledger.dampening_state(&r).expect("state").suppressed);
        let (receipt, state) = ledger.record_witness(witness(2), true).expect("witness");
        let state = state.expect("a verified verdict records an event");
        assert!(state.suppressed && state.calls == 3, "{state:?}");
        let kinds: Vec<EntryKind> =
            ledger.entries_for_release(&r).expect("index").into_iter().map(|(_, e)| e.kind).collect();
        assert_eq!(
            kinds[kinds.len() - 3..],
            [EntryKind::Witness, EntryKind::DampeningEvent, EntryKind::Suppression],
            "witness, verdict and suppression are contiguous"
        );
        assert_eq!(ledger.get(receipt.index).expect("entry").body, br#"{"n":2}"#);
        assert!(ledger.verify().expect("verify").is_ok());
        state
    };
    drop_dampening_states(dir.path());
    let ledger = open(dir.path());
    assert_eq!(ledger.dampening_state(&r).expect("state"), after, "rebuilt from the log");
    assert!(ledger.verify().expect("verify").is_ok());
}

#[test]
fn dampening_is_logged_persisted_and_rebuilt_identically() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = release(7);
    let quiet = release(8);
    {
        let ledger = open(dir.path());
        assert_eq!(ledger.dampening_state(&bad).expect("state"), DampeningState::default());
        let mut last = DampeningState::default();
        for n in 1..=9 {
            last = ledger.record_call(&bad, Event::Unverified).expect("call");
            assert_eq!(last.suppressed, n == 9, "call {n}");
        }
        ledger.record_call(&quiet, Event::None).expect("call");
        assert_eq!(ledger.dampening_state(&bad).expect("state"), last);
        let kinds: Vec<EntryKind> =
            ledger.entries_for_release(&bad).expect("index").into_iter().map(|(_, e)| e.kind).collect();
        assert_eq!(kinds.len(), 10, "9 events + 1 suppression");
        assert_eq!(kinds.last(), Some(&EntryKind::Suppression));
        let r = ledger.verify().expect("verify");
        assert!(r.is_ok(), "{:?}", r.problems);
    }
    let before = {
        let ledger = open(dir.path());
        let s = ledger.dampening_state(&bad).expect("state");
        assert!(s.suppressed);
        (s, ledger.dampening_state(&quiet).expect("state"))
    };
    // Lose the dampening column family; reopening rebuilds it from the log.
    drop_dampening_states(dir.path());
    let ledger = open(dir.path());
    assert_eq!(ledger.dampening_state(&bad).expect("state"), before.0);
    assert_eq!(ledger.dampening_state(&quiet).expect("state"), before.1);
    assert!(ledger.verify().expect("verify").is_ok());
    // A corrupted state is caught by verify and repaired by rebuild_index.
    raw_put(&ledger, CF_DAMPENING, &bad.0, &DampeningState::default().to_bytes());
    assert!(!ledger.verify().expect("verify").is_ok());
    assert!(!ledger.dampening_state(&bad).expect("state").suppressed);
    ledger.rebuild_index().expect("rebuild");
    assert_eq!(ledger.dampening_state(&bad).expect("state"), before.0);
    assert!(ledger.verify().expect("verify").is_ok());
}

#[test]
fn checkpoints_are_signed_consistent_and_verifiable_with_the_vkey_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(dir.path());
    let empty = ledger.checkpoint().expect("checkpoint");
    assert_eq!(empty.checkpoint.size, 0);
    assert_eq!(empty.checkpoint.root, merkle::empty_root());
    fill(&ledger, 20);
    let c1 = ledger.checkpoint().expect("checkpoint");
    fill(&ledger, 13);
    let c2 = ledger.checkpoint().expect("checkpoint");
    assert_eq!(ledger.checkpoint().expect("again"), c2, "same size: same head");
    let vkey = fs::read_to_string(dir.path().join(VKEY_FILE)).expect("vkey");
    let verifier = NoteVerifier::from_vkey(&vkey).expect("parse vkey");
    let a = Checkpoint::open_signed(&c1.note, &verifier, "test.example/log").expect("c1");
    let b = Checkpoint::open_signed(&c2.note, &verifier, "test.example/log").expect("c2");
    assert_eq!((a.size, b.size), (20, 33));
    let proof = ledger.consistency_proof(a.size, b.size).expect("proof");
    assert!(merkle::verify_consistency(a.size, b.size, &a.root, &b.root, &proof));
    assert_eq!(ledger.checkpoints().expect("list").len(), 3);
    let key_mode = fs::metadata(dir.path().join(KEY_FILE)).expect("key file").permissions().mode();
    assert_eq!(key_mode & 0o777, 0o600);
}

#[test]
fn refuses_to_sign_a_head_inconsistent_with_an_earlier_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(dir.path());
    fill(&ledger, 8);
    ledger.checkpoint().expect("checkpoint");
    fill(&ledger, 4);
    // Rewrite history: replace entry 3 and every hash that depends on it.
    let mut forged: Vec<Hash> = Vec::new();
    for i in 0..12u64 {
        let data = if i == 3 { entry(99).encode() } else { entry(i).encode() };
        raw_put(&ledger, CF_ENTRIES, &be(i), &data);
        let hs = merkle::stored_hashes_for_record(i, merkle::leaf_hash(&data), &forged).expect("hashes");
        forged.extend(hs);
    }
    for (at, h) in forged.iter().enumerate() {
        raw_put(&ledger, CF_HASHES, &be(at as u64), h);
    }
    let err = ledger.checkpoint().expect_err("must refuse");
    assert!(matches!(err, LedgerError::Inconsistent(_)), "{err}");
    let report = ledger.verify().expect("verify");
    assert!(report.problems.iter().any(|p| p.contains("checkpoint at size 8")), "{:?}", report.problems);
}

#[test]
fn verify_detects_one_flipped_byte_in_any_entry_or_hash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(dir.path());
    fill(&ledger, 37);
    ledger.checkpoint().expect("checkpoint");
    assert!(ledger.verify().expect("verify").is_ok(), "untampered log verifies");
    let hash_count = merkle::stored_hash_count(37);
    for i in 0..37u64 {
        let orig = raw_get(&ledger, CF_ENTRIES, &be(i));
        let pos = (i as usize * 7) % orig.len();
        let mut bad = orig.clone();
        bad[pos] ^= 1 << (i % 8);
        raw_put(&ledger, CF_ENTRIES, &be(i), &bad);
        let report = ledger.verify().expect("verify");
        assert!(!report.is_ok(), "flip in entry {i} byte {pos} undetected");
        raw_put(&ledger, CF_ENTRIES, &be(i), &orig);
    }
    for at in 0..hash_count {
        let orig = raw_get(&ledger, CF_HASHES, &be(at));
        let mut bad = orig.clone();
        bad[(at % 32) as usize] ^= 0x10;
        raw_put(&ledger, CF_HASHES, &be(at), &bad);
        let report = ledger.verify().expect("verify");
        assert!(!report.is_ok(), "flip in stored hash {at} undetected");
        raw_put(&ledger, CF_HASHES, &be(at), &orig);
    }
    // A flipped byte in the signed checkpoint is caught too.
    let note = raw_get(&ledger, CF_CHECKPOINTS, &be(37));
    let mut bad = note.clone();
    bad[3] ^= 1;
    raw_put(&ledger, CF_CHECKPOINTS, &be(37), &bad);
    assert!(!ledger.verify().expect("verify").is_ok());
    raw_put(&ledger, CF_CHECKPOINTS, &be(37), &note);
    assert!(ledger.verify().expect("verify").is_ok(), "restored log verifies");
}

#[test]
fn tiles_are_served_from_stored_hashes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(dir.path());
    fill(&ledger, 300);
    let t0 = ledger.tile(0, 0, 256).expect("tile");
    assert_eq!(t0.len(), 256 * 32);
    for i in [0usize, 17, 255] {
        let leaf = merkle::leaf_hash(&entry(i as u64).encode());
        assert_eq!(&t0[i * 32..(i + 1) * 32], leaf.as_slice());
    }
    let partial = ledger.tile(0, 1, 44).expect("partial tile");
    assert_eq!(&partial[..32], merkle::leaf_hash(&entry(256).encode()).as_slice());
    assert!(ledger.tile(0, 1, 45).is_err(), "beyond the tree");
    let t1 = ledger.tile(1, 0, 1).expect("level-1 tile");
    assert_eq!(t1, ledger.root_at(256).expect("root").to_vec());
    let bundle = ledger.entries_bundle(1, 44).expect("bundle");
    let mut rest = bundle.as_slice();
    for i in 256..300u64 {
        let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
        assert_eq!(&rest[2..2 + len], entry(i).encode().as_slice());
        rest = &rest[2 + len..];
    }
    assert!(rest.is_empty());
    assert!(ledger.entries_bundle(1, 45).is_err());
}

#[test]
fn origin_and_key_file_are_guarded() {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(open(dir.path()));
    let other =
        Ledger::open(dir.path(), LedgerConfig { origin: Some("other.example/log".into()), ..Default::default() });
    assert!(matches!(other, Err(LedgerError::Config(_))));
    // Origin defaults to the stored one.
    let again = Ledger::open(dir.path(), LedgerConfig::default()).expect("reopen");
    assert_eq!(again.origin(), "test.example/log");
    drop(again);
    fs::set_permissions(dir.path().join(KEY_FILE), fs::Permissions::from_mode(0o644)).expect("chmod");
    assert!(matches!(Ledger::open(dir.path(), LedgerConfig::default()), Err(LedgerError::Config(_))));
}

#[test]
fn a_fleet_suppression_is_sticky_deduplicated_and_rebuilt() {
    let tmp = tempfile::tempdir().expect("tmp");
    let r = release(7);
    let w = [9u8; 32];
    {
        let ledger = open(tmp.path());
        fill(&ledger, 3);
        assert!(!ledger.dampening_state(&r).expect("state").suppressed);
        let (i, new) = ledger.suppress(&r, w, "fleet: witness 09.. from a entry 4").expect("suppress");
        assert!(new);
        assert_eq!(i, 3);
        // The same witness again (a replay after a crash) appends nothing.
        assert_eq!(ledger.suppress(&r, w, "again").expect("again"), (3, false));
        assert_eq!(ledger.size(), 4);
        assert!(ledger.dampening_state(&r).expect("state").suppressed);
        // Calls with no events decay the penalty; a proof does not decay.
        for _ in 0..200 {
            ledger.record_call(&r, Event::None).expect("call");
        }
        assert!(ledger.dampening_state(&r).expect("state").suppressed);
        assert!(!ledger.dampening_state(&release(8)).expect("state").suppressed);
        assert_eq!(
            ledger.fleet_suppressions(&r).expect("list"),
            vec![FleetSuppression { witness_sha256: w, index: 3 }]
        );
        assert!(ledger.verify().expect("verify").is_ok());
    }
    // The index is derived from the entries: dropping and rebuilding it restores it.
    let ledger = open(tmp.path());
    raw_put(&ledger, CF_FLEET_SUPPRESSED, &fleet_key(&r, &[1u8; 32]), &be(0));
    assert!(!ledger.verify().expect("verify").is_ok());
    ledger.rebuild_index().expect("rebuild");
    assert!(ledger.verify().expect("verify").is_ok());
    assert_eq!(ledger.fleet_suppressions(&r).expect("list").len(), 1);
    assert!(ledger.dampening_state(&r).expect("state").suppressed);
}

#[test]
fn peer_records_persist() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rec = PeerRecord { size: 5, processed: 3, status: crate::PeerStatus::SplitView, ..Default::default() };
    {
        let ledger = open(tmp.path());
        assert_eq!(ledger.peer_record("a").expect("get"), None);
        ledger.put_peer_record("a", &rec).expect("put");
    }
    let ledger = open(tmp.path());
    assert_eq!(ledger.peer_record("a").expect("get"), Some(rec.clone()));
    assert_eq!(ledger.peer_records().expect("all"), vec![("a".to_string(), rec.clone())]);
    // A suppression and the peer's cursor are written together; a replay counts nothing.
    let next = PeerRecord { processed: 4, ..rec.clone() };
    let (i, new, stored) = ledger.suppress_from_peer(&release(1), [2u8; 32], "fleet: x", "a", next.clone()).expect("s");
    assert!(new);
    assert_eq!(stored.suppressions, 1);
    assert_eq!(ledger.peer_record("a").expect("get"), Some(stored.clone()));
    let (j, again, replayed) = ledger.suppress_from_peer(&release(1), [2u8; 32], "fleet: x", "a", stored).expect("s");
    assert_eq!((j, again, replayed.suppressions), (i, false, 1));
}

/// Every open replays the previous process's WAL into new table files and starts a new
/// info log; a CLI that opens the ledger per command used to leave ~4 files per command
/// behind (1,200 after 300). The tables must be merged and the logs capped.
#[test]
fn reopening_after_each_write_keeps_files_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join(DB_DIR);
    let opens = 300u64;
    let (mut most_files, mut most_bytes, mut most_logs) = (0, 0, 0);
    let started = std::time::Instant::now();
    for i in 0..opens {
        let ledger = open(dir.path());
        ledger.append(entry(i)).expect("append");
        ledger.record_call(&release((i % 3) as u8), Event::None).expect("call");
        drop(ledger);
        let (files, bytes) = crate::cli::dir_usage(&db).expect("usage");
        let logs = fs::read_dir(&db)
            .expect("list")
            .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().starts_with("LOG")))
            .count();
        most_files = most_files.max(files);
        most_bytes = most_bytes.max(bytes);
        most_logs = most_logs.max(logs);
    }
    let ledger = open(dir.path());
    assert_eq!(ledger.size(), 2 * opens);
    let report = ledger.verify().expect("verify");
    assert!(report.is_ok(), "{:?}", report.problems);
    eprintln!(
        "{opens} open/append/close cycles in {:.1} s: at most {most_files} files, {most_bytes} bytes, {most_logs} info logs",
        started.elapsed().as_secs_f64()
    );
    assert!(most_logs <= INFO_LOGS_KEPT, "{most_logs} info logs kept");
    assert!(most_files <= 60, "{most_files} files in the database directory");
    assert!(most_bytes <= 2 << 20, "{most_bytes} bytes in the database directory");
}

#[test]
fn pipelined_appends_are_logged_in_submission_order_and_durable_on_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(dir.path());
    let pending: Vec<PendingAppend> = (0..500).map(|i| ledger.append_async(entry(i)).expect("submit")).collect();
    for (i, p) in pending.into_iter().enumerate() {
        assert_eq!(p.wait().expect("durable").index, i as u64);
    }
    assert!(ledger.verify().expect("verify").is_ok());
    drop(ledger);
    let ledger = open(dir.path());
    assert_eq!(ledger.size(), 500);
    assert_eq!(ledger.get(499).expect("get"), entry(499));
}

/// A group's write fails with many appends in flight: its callers get the error, the
/// groups after it are built from what is durable, and the log holds exactly the
/// acknowledged entries, contiguous and verifiable.
#[test]
fn a_failed_group_write_fails_only_its_callers_and_the_log_stays_contiguous() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(dir.path());
    fill(&ledger, 10);
    let mut failures = 0;
    for round in 0..5u64 {
        ledger.inner.fail_writes.store(1, Ordering::Release);
        let first = 1_000 * (round + 1);
        let pending: Vec<(u64, PendingAppend)> =
            (first..first + 600).map(|i| (i, ledger.append_async(entry(i)).expect("submit"))).collect();
        for (i, p) in pending {
            match p.wait() {
                Ok(r) => {
                    assert_eq!(ledger.get(r.index).expect("acknowledged entry"), entry(i));
                    assert_eq!(r.leaf_hash, merkle::leaf_hash(&entry(i).encode()));
                }
                Err(LedgerError::Write(_)) => failures += 1,
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        let report = ledger.verify().expect("verify");
        assert!(report.is_ok(), "{:?}", report.problems);
        let r = ledger.append(entry(first + 999)).expect("appends go on after a failed write");
        assert_eq!(r.index + 1, ledger.size());
    }
    assert!(failures >= 5, "only {failures} appends failed");
    let size = ledger.size();
    drop(ledger);
    let ledger = open(dir.path());
    assert_eq!(ledger.size(), size);
    assert!(ledger.verify().expect("verify").is_ok());
}

/// A log written before universal compaction can hold hundreds of tiny table files per
/// column family; the first open merges them.
#[test]
fn opening_merges_a_column_family_scattered_over_many_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_path = dir.path().join(DB_DIR);
    {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let mut cf_opts = Options::default();
        cf_opts.set_disable_auto_compactions(true);
        let cfs = ALL_CFS.iter().map(|n| ColumnFamilyDescriptor::new(*n, cf_opts.clone()));
        let db = Db::open_cf_descriptors(&opts, &db_path, cfs).expect("open legacy layout");
        let peers = db.cf_handle(CF_FLEET_PEERS).expect("cf");
        for i in 0..100 {
            db.put_cf(&peers, format!("peer-{i:03}"), b"{}").expect("put");
            db.flush_cf(&peers).expect("flush");
        }
    }
    let (before, _) = crate::cli::dir_usage(&db_path).expect("usage");
    assert!(before > 100, "{before} files before");
    let ledger = open(dir.path());
    let (after, _) = crate::cli::dir_usage(&db_path).expect("usage");
    eprintln!("{before} files before the first open, {after} after");
    assert!(after <= 30, "{after} files after opening");
    let peers = ledger.inner.cf(CF_FLEET_PEERS).expect("cf");
    assert!(ledger.inner.db.get_cf(&peers, b"peer-042").expect("get").is_some());
}

/// A formation-related entry altered or moved in the store after it was appended: the
/// tree no longer matches, and the replay reports the order the records now stand in (a
/// formation before its snapshot, a snapshot that does not hash to its id).
#[test]
fn verify_detects_formation_records_tampered_or_reordered_in_the_store() {
    use crate::formation::tests::{dispatch, formation, releases, set_up, snapshot};
    use germline_model::{FcdRecord, FormationLog};
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(dir.path());
    let (n, o) = releases();
    set_up(&ledger, n, o);
    let f = formation(n, 3);
    for r in [
        FcdRecord::Snapshot(snapshot(n)),
        FcdRecord::Formation(f.clone()),
        FcdRecord::Dispatch(dispatch(&f, n, "2025.12.18", 3)),
    ] {
        FormationLog::append(&ledger, &r).expect("append");
    }
    let report = ledger.verify().expect("verify");
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!((report.snapshots, report.formations, report.dispatches), (1, 1, 1));

    // Reordered: the snapshot (entry 3) and the formation (entry 4) swap places.
    let (s3, f4) = (raw_get(&ledger, CF_ENTRIES, &be(3)), raw_get(&ledger, CF_ENTRIES, &be(4)));
    raw_put(&ledger, CF_ENTRIES, &be(3), &f4);
    raw_put(&ledger, CF_ENTRIES, &be(4), &s3);
    let p = ledger.verify().expect("verify").problems;
    assert!(p.iter().any(|x| x.contains("does not match entry")), "{p:?}");
    assert!(p.iter().any(|x| x.contains("formation entry 3: its snapshot")), "{p:?}");
    raw_put(&ledger, CF_ENTRIES, &be(3), &s3);
    raw_put(&ledger, CF_ENTRIES, &be(4), &f4);
    assert!(ledger.verify().expect("verify").is_ok());

    // Tampered: the snapshot's descriptor digest rewritten in place (same length).
    let mut e = Entry::decode(&s3).expect("decode");
    let body = String::from_utf8(e.body.clone()).expect("utf-8");
    let digest = &snapshot(n).snapshot.tools["git_diff"].to_hex();
    e.body = body.replace(digest.as_str(), &"0".repeat(64)).into_bytes();
    assert_ne!(e.encode(), s3);
    raw_put(&ledger, CF_ENTRIES, &be(3), &e.encode());
    let p = ledger.verify().expect("verify").problems;
    assert!(p.iter().any(|x| x.contains("does not match entry 3")), "{p:?}");
    assert!(p.iter().any(|x| x.contains("snapshot entry 3: record stored as")), "{p:?}");
}
