//! Formation records and lifecycle events in the log (DESIGN §8): the ledger is the
//! durable, append-only store behind `germline_model::FormationLog`, so a pending call's
//! record cannot be rolled back or substituted unseen, and `Ledger::verify` replays the
//! lifecycle of every release name and re-checks every record against its id.

use germline_model::{FcdRecord, FormationEntry, FormationLog, LifecycleEvent, ReleaseHash};

use crate::{Entry, EntryKind, Ledger};

/// The formation record or lifecycle event an entry holds, if it holds one.
pub fn fcd_record_of(entry: &Entry) -> Option<Result<FcdRecord, String>> {
    match entry.kind {
        EntryKind::Formation => Some(
            serde_json::from_slice::<FormationEntry>(&entry.body).map(FcdRecord::Formation).map_err(|e| e.to_string()),
        ),
        EntryKind::Lifecycle => Some(
            serde_json::from_slice::<LifecycleEvent>(&entry.body).map(FcdRecord::Lifecycle).map_err(|e| e.to_string()),
        ),
        _ => None,
    }
}

fn append(ledger: &Ledger, kind: EntryKind, release: ReleaseHash, body: Vec<u8>) -> Result<u64, String> {
    ledger.append(Entry::new(kind, release, body)).map(|r| r.index).map_err(|e| e.to_string())
}

impl FormationLog for Ledger {
    fn append_lifecycle(&self, ev: &LifecycleEvent) -> Result<u64, String> {
        let body = serde_json::to_vec(ev).map_err(|e| e.to_string())?;
        append(self, EntryKind::Lifecycle, ev.action.release(), body)
    }

    fn append_formation(&self, entry: &FormationEntry) -> Result<u64, String> {
        let body = serde_json::to_vec(entry).map_err(|e| e.to_string())?;
        append(self, EntryKind::Formation, entry.record.snapshot.release, body)
    }

    fn formation_at(&self, index: u64) -> Result<FormationEntry, String> {
        let entry = self.get(index).map_err(|e| e.to_string())?;
        match fcd_record_of(&entry) {
            Some(Ok(FcdRecord::Formation(f))) => Ok(f),
            Some(Err(e)) => Err(format!("log entry {index}: {e}")),
            _ => Err(format!("log entry {index} is not a formation")),
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
mod tests {
    use super::*;
    use crate::LedgerConfig;
    use germline_model::{
        DispatchPolicy, FormationRecord, FormationSnapshot, Lifecycle, LifecycleAction, ReleaseName, Sha256Digest,
    };
    use serde_json::json;

    fn open(dir: &std::path::Path) -> Ledger {
        Ledger::open(dir, LedgerConfig { origin: Some("test.example/log".into()), ..Default::default() })
            .expect("open ledger")
    }

    fn name() -> ReleaseName {
        ReleaseName::new("mcp-server-git").expect("name")
    }

    /// Admits and promotes `n`, admits `o`; returns the lifecycle.
    fn set_up(ledger: &Ledger, n: ReleaseHash, o: ReleaseHash) -> Lifecycle {
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

    fn formation(n: ReleaseHash, epoch: u64) -> FormationEntry {
        let tools = json!({"tools": [{"name": "git_diff", "description": "d", "inputSchema": {}}]});
        FormationEntry::new(FormationRecord {
            snapshot: FormationSnapshot::of_tools_list(name(), "2025.12.18", n, &tools).expect("snapshot"),
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

    #[test]
    fn formations_and_lifecycle_events_are_durable_and_verified() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (n, o) = (ReleaseHash::of_bytes(b"n"), ReleaseHash::of_bytes(b"o"));
        let f = formation(n, 3);
        let index = {
            let ledger = open(dir.path());
            let l = set_up(&ledger, n, o);
            let index = ledger.append_formation(&f).expect("formation");
            let ev = l.next(LifecycleAction::Promote { release: o }).expect("rollout");
            ledger.append_lifecycle(&ev).expect("append");
            let report = ledger.verify().expect("verify");
            assert!(report.is_ok(), "{:?}", report.problems);
            assert_eq!((report.formations, report.lifecycle_events), (1, 4));
            index
        };
        let ledger = open(dir.path());
        assert_eq!(ledger.formation_at(index).expect("read back"), f);
        let replayed = ledger.replay().expect("replay");
        assert_eq!(replayed.len(), 5);
        assert_eq!(replayed[3], (index, FcdRecord::Formation(f)));
    }

    #[test]
    fn verify_reports_substituted_records_and_unordered_lifecycle_changes() {
        let (n, o) = (ReleaseHash::of_bytes(b"n"), ReleaseHash::of_bytes(b"o"));
        // A record altered after its id was computed (a captured successor slipped in).
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = open(dir.path());
        set_up(&ledger, n, o);
        let mut f = formation(n, 3);
        f.record.successors.push(germline_model::CapturedSuccessor {
            release: o,
            version: "2025.11.25".into(),
            summary: Sha256Digest([0; 32]),
            effect: "fs_write".into(),
        });
        ledger.append_formation(&f).expect("append");
        let report = ledger.verify().expect("verify");
        assert!(report.problems.iter().any(|p| p.contains("does not hash to its id")), "{:?}", report.problems);

        // A lifecycle event replayed out of order (a stale epoch), and a formation whose
        // source was never admitted.
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = open(dir.path());
        let l = set_up(&ledger, n, o);
        let mut ev = l.next(LifecycleAction::Promote { release: o }).expect("rollout");
        ev.epoch = 2;
        ledger.append_lifecycle(&ev).expect("append");
        ledger.append_formation(&formation(ReleaseHash::of_bytes(b"x"), 3)).expect("append");
        let report = ledger.verify().expect("verify");
        assert!(report.problems.iter().any(|p| p.contains("expected epoch 4")), "{:?}", report.problems);
        assert!(report.problems.iter().any(|p| p.contains("not a live release")), "{:?}", report.problems);
    }
}
