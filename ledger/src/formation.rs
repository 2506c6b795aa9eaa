//! Formation-consistent dispatch in the log (DESIGN §8): the ledger is the durable,
//! append-only store behind `germline_model::FormationLog`. Snapshots (what a
//! `tools/list` answer showed), formation records, lifecycle events and dispatch records
//! are entries of their own, so a pending call's record cannot be rolled back or
//! substituted unseen, a formation runs at most once across restarts, and
//! `Ledger::verify` replays them all in log order.

use germline_model::{DispatchRecord, FcdRecord, FormationEntry, FormationLog, LifecycleEvent, SnapshotEntry};

use crate::{Entry, EntryKind, Ledger};

/// The formation-related record an entry holds, if it holds one.
pub fn fcd_record_of(entry: &Entry) -> Option<Result<FcdRecord, String>> {
    fn parse<T: serde::de::DeserializeOwned>(body: &[u8], f: fn(T) -> FcdRecord) -> Result<FcdRecord, String> {
        serde_json::from_slice::<T>(body).map(f).map_err(|e| e.to_string())
    }
    let b = &entry.body;
    Some(match entry.kind {
        EntryKind::Snapshot => parse::<SnapshotEntry>(b, FcdRecord::Snapshot),
        EntryKind::Formation => parse::<FormationEntry>(b, FcdRecord::Formation),
        EntryKind::Lifecycle => parse::<LifecycleEvent>(b, FcdRecord::Lifecycle),
        EntryKind::Dispatch => parse::<DispatchRecord>(b, FcdRecord::Dispatch),
        _ => return None,
    })
}

/// The entry a formation-related record is stored as.
pub fn fcd_entry(record: &FcdRecord) -> Result<Entry, String> {
    let (kind, body) = match record {
        FcdRecord::Snapshot(s) => (EntryKind::Snapshot, serde_json::to_vec(s)),
        FcdRecord::Formation(f) => (EntryKind::Formation, serde_json::to_vec(f)),
        FcdRecord::Lifecycle(ev) => (EntryKind::Lifecycle, serde_json::to_vec(ev)),
        FcdRecord::Dispatch(d) => (EntryKind::Dispatch, serde_json::to_vec(d)),
    };
    Ok(Entry::new(kind, record.release(), body.map_err(|e| e.to_string())?))
}

impl FormationLog for Ledger {
    fn append(&self, record: &FcdRecord) -> Result<u64, String> {
        self.append(fcd_entry(record)?).map(|r| r.index).map_err(|e| e.to_string())
    }

    fn record_at(&self, index: u64) -> Result<FcdRecord, String> {
        let entry = self.get(index).map_err(|e| e.to_string())?;
        match fcd_record_of(&entry) {
            Some(r) => r.map_err(|e| format!("log entry {index}: {e}")),
            None => Err(format!("log entry {index} is not a formation-related record")),
        }
    }

    fn replay(&self) -> Result<Vec<(u64, FcdRecord)>, String> {
        let mut out = Vec::new();
        for i in 0..self.size() {
            let entry = self.get(i).map_err(|e| e.to_string())?;
            if let Some(r) = fcd_record_of(&entry) {
                out.push((i, r.map_err(|e| format!("log entry {i}: {e}"))?));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::LedgerConfig;
    use germline_model::{
        CapturedSuccessor, DispatchPolicy, FenceGrant, FormationRecord, FormationSnapshot, Lifecycle, LifecycleAction,
        ReleaseHash, ReleaseName, Sha256Digest,
    };
    use serde_json::json;

    fn open(dir: &std::path::Path) -> Ledger {
        Ledger::open(dir, LedgerConfig { origin: Some("test.example/log".into()), ..Default::default() })
            .expect("open ledger")
    }

    fn name() -> ReleaseName {
        ReleaseName::new("mcp-server-git").expect("name")
    }

    /// The fixed release (2025.12.18) and the one before the fix (2025.11.25).
    pub(crate) fn releases() -> (ReleaseHash, ReleaseHash) {
        (ReleaseHash::of_bytes(b"n"), ReleaseHash::of_bytes(b"o"))
    }

    /// Admits and promotes `n`, admits `o`; returns the lifecycle.
    pub(crate) fn set_up(ledger: &Ledger, n: ReleaseHash, o: ReleaseHash) -> Lifecycle {
        let mut l = Lifecycle::new(name());
        for a in [
            LifecycleAction::Admit { release: n, version: "2025.12.18".into() },
            LifecycleAction::Promote { release: n },
            LifecycleAction::Admit { release: o, version: "2025.11.25".into() },
        ] {
            let ev = l.next(a).expect("allowed");
            ledger.append_lifecycle(&ev).expect("append");
            l.apply(&ev).expect("apply");
        }
        l
    }

    pub(crate) fn snapshot(n: ReleaseHash) -> SnapshotEntry {
        let tools = json!({"tools": [{"name": "git_diff", "description": "d", "inputSchema": {}}]});
        SnapshotEntry::new(FormationSnapshot::of_tools_list(name(), "2025.12.18", n, &tools).expect("snapshot"))
    }

    pub(crate) fn formation(n: ReleaseHash, epoch: u64) -> FormationEntry {
        FormationEntry::new(FormationRecord {
            snapshot: snapshot(n).snapshot,
            tool: "git_diff".into(),
            arguments: Sha256Digest::of_json(&json!({"target": "main"})),
            policy: DispatchPolicy::CallSpecific,
            formed_at_ms: 5,
            nonce: "01".into(),
            epoch,
            contract: Some("read".into()),
            successors: vec![],
        })
    }

    pub(crate) fn dispatch(f: &FormationEntry, release: ReleaseHash, version: &str, epoch: u64) -> DispatchRecord {
        DispatchRecord { formation: f.id, release, version: version.into(), grant: FenceGrant::Source, epoch, at_ms: 6 }
    }

    fn append(ledger: &Ledger, r: FcdRecord) -> u64 {
        FormationLog::append(ledger, &r).expect("append")
    }

    fn problems(ledger: &Ledger) -> Vec<String> {
        ledger.verify().expect("verify").problems
    }

    fn has(problems: &[String], what: &str) -> bool {
        problems.iter().any(|p| p.contains(what))
    }

    #[test]
    fn formations_and_lifecycle_events_are_durable_and_verified() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (n, o) = releases();
        let f = formation(n, 3);
        let index = {
            let ledger = open(dir.path());
            let l = set_up(&ledger, n, o);
            append(&ledger, FcdRecord::Snapshot(snapshot(n)));
            let index = ledger.append_formation(&f).expect("formation");
            let ev = l.next(LifecycleAction::Promote { release: o }).expect("rollout");
            ledger.append_lifecycle(&ev).expect("append");
            let report = ledger.verify().expect("verify");
            assert!(report.is_ok(), "{:?}", report.problems);
            assert_eq!((report.formations, report.lifecycle_events, report.snapshots), (1, 4, 1));
            index
        };
        let ledger = open(dir.path());
        assert_eq!(ledger.formation_at(index).expect("read back"), f);
        let replayed = ledger.replay().expect("replay");
        assert_eq!(replayed.len(), 6);
        assert_eq!(replayed[4], (index, FcdRecord::Formation(f)));
    }

    #[test]
    fn verify_reports_substituted_records_and_unordered_lifecycle_changes() {
        let (n, o) = releases();
        // A record altered after its id was computed (a captured successor slipped in).
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = open(dir.path());
        set_up(&ledger, n, o);
        append(&ledger, FcdRecord::Snapshot(snapshot(n)));
        let mut f = formation(n, 3);
        f.record.successors.push(CapturedSuccessor {
            release: o,
            version: "2025.11.25".into(),
            summary: Sha256Digest([0; 32]),
            effect: "fs_write".into(),
        });
        ledger.append_formation(&f).expect("append");
        assert!(has(&problems(&ledger), "does not hash to its id"), "{:?}", problems(&ledger));

        // A lifecycle event replayed out of order (a stale epoch), and a formation whose
        // source was never admitted.
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = open(dir.path());
        let l = set_up(&ledger, n, o);
        let mut ev = l.next(LifecycleAction::Promote { release: o }).expect("rollout");
        ev.epoch = 2;
        ledger.append_lifecycle(&ev).expect("append");
        ledger.append_formation(&formation(ReleaseHash::of_bytes(b"x"), 3)).expect("append");
        let p = problems(&ledger);
        assert!(has(&p, "expected epoch 4") && has(&p, "not an admitted release"), "{p:?}");
    }

    /// Snapshots and dispatch records are verified in log order: a log in order verifies;
    /// a substituted snapshot, a formation before its snapshot, a dispatch before its
    /// formation, a second dispatch, a dispatch filed at another epoch and one the fence
    /// would refuse are each reported.
    #[test]
    fn verify_covers_snapshots_and_dispatch_records_in_order() {
        let (n, o) = releases();
        let f = formation(n, 3);
        let fresh = || {
            let dir = tempfile::tempdir().expect("tempdir");
            let ledger = open(dir.path());
            let l = set_up(&ledger, n, o);
            (dir, ledger, l)
        };

        let (_d, ledger, _) = fresh();
        append(&ledger, FcdRecord::Snapshot(snapshot(n)));
        append(&ledger, FcdRecord::Formation(f.clone()));
        append(&ledger, FcdRecord::Dispatch(dispatch(&f, n, "2025.12.18", 3)));
        let report = ledger.verify().expect("verify");
        assert!(report.is_ok(), "{:?}", report.problems);
        assert_eq!((report.snapshots, report.formations, report.dispatches), (1, 1, 1));

        // Substituted: a tool's descriptor digest changed after the id was computed.
        let (_d, ledger, _) = fresh();
        let mut s = snapshot(n);
        s.snapshot.tools.insert("git_diff".into(), Sha256Digest([7; 32]));
        append(&ledger, FcdRecord::Snapshot(s));
        assert!(has(&problems(&ledger), "snapshot entry 3: record stored as"), "{:?}", problems(&ledger));

        // Reordered: the formation before its snapshot, the dispatch before its formation.
        let (_d, ledger, _) = fresh();
        append(&ledger, FcdRecord::Dispatch(dispatch(&f, n, "2025.12.18", 3)));
        append(&ledger, FcdRecord::Formation(f.clone()));
        append(&ledger, FcdRecord::Snapshot(snapshot(n)));
        let p = problems(&ledger);
        assert!(has(&p, "dispatch entry 3: formation") && has(&p, "not recorded before its dispatch"), "{p:?}");
        assert!(has(&p, "formation entry 4: its snapshot"), "{p:?}");

        // Twice, at another epoch, or where the fence refuses (a rollout to the release
        // before the fix, not captured for this call).
        let (_d, ledger, l) = fresh();
        append(&ledger, FcdRecord::Snapshot(snapshot(n)));
        append(&ledger, FcdRecord::Formation(f.clone()));
        append(&ledger, FcdRecord::Dispatch(dispatch(&f, n, "2025.12.18", 3)));
        append(&ledger, FcdRecord::Dispatch(dispatch(&f, n, "2025.12.18", 3)));
        let ev = l.next(LifecycleAction::Promote { release: o }).expect("rollout");
        ledger.append_lifecycle(&ev).expect("append");
        let g = FormationEntry::new(FormationRecord { nonce: "02".into(), epoch: 4, ..f.record.clone() });
        append(&ledger, FcdRecord::Formation(g.clone()));
        append(&ledger, FcdRecord::Formation(FormationEntry::new(FormationRecord { epoch: 3, ..g.record.clone() })));
        append(&ledger, FcdRecord::Dispatch(dispatch(&g, o, "2025.11.25", 4)));
        let p = problems(&ledger);
        assert!(has(&p, "dispatch entry 6: formation") && has(&p, "dispatched twice (first at entry 5)"), "{p:?}");
        assert!(has(&p, "formation entry 9: formed at epoch 3 but the log is at epoch 4"), "{p:?}");
        assert!(has(&p, "dispatch entry 10: the fence refuses formation"), "{p:?}");
    }
}
