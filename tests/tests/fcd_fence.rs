//! Formation-consistent dispatch (DESIGN §8), the final-hop fence end to end: formed
//! `repohost` calls (an omitted `private`: private on 0.9 and 1.0, public on 1.1, the
//! same descriptor) dispatched under germline after a rollout, a rollback, a reconnect
//! with a stale session and a retirement. The repository host is a loopback sink; what
//! it received is the effect. Each case runs with the fence switched off too, where the
//! drifted request reaches the sink.

use std::sync::Arc;

use germline_executor::dispatch::FormationHost;
use germline_executor::policy::Policy;
use germline_executor::runtime::RuntimeKind;
use germline_model::{FormationLog, MemoryFormationLog, ReleaseHash, ReleaseName};
use germline_tests::fcd::{repohost_release, REPO_HOST};
use germline_tests::world::{python, request, World};
use germline_tests::{Sink, SinkBehaviour};
use serde_json::json;

/// One world: a sink for the repository host and a host with repohost 0.9 (private),
/// 1.0 (private) and 1.1 (public) admitted, 1.0 current.
struct Case {
    world: World,
    sink: Sink,
    host: FormationHost,
    v09: ReleaseHash,
    v10: ReleaseHash,
    v11: ReleaseHash,
}

fn name() -> ReleaseName {
    ReleaseName::new("repohost").expect("name")
}

/// A world, the repository host's sink and a policy that clears it.
fn sink_world() -> (World, Sink, Policy) {
    let world = World::new();
    let sink = Sink::start(SinkBehaviour::default());
    let policy = world.policy(&[(REPO_HOST, &[], Some(sink.addr()))], &[("agent", &[])], "");
    (world, sink, policy)
}

/// The ledger in `dir` (a restarted host opens it again).
fn ledger_at(dir: &std::path::Path) -> Arc<germline_ledger::Ledger> {
    let config = germline_ledger::LedgerConfig { origin: Some("test.example/fcd".into()), ..Default::default() };
    Arc::new(germline_ledger::Ledger::open(dir, config).expect("ledger"))
}

fn case(kind: RuntimeKind) -> Case {
    let (world, sink, policy) = sink_world();
    let log: Arc<dyn FormationLog> = Arc::new(MemoryFormationLog::default());
    let host = FormationHost::open(log, kind, policy, python(&world.dir.path().join("home"))).expect("host");
    let root = world.dir.path().join("releases");
    let v09 = host.admit(&repohost_release(&root, "0.9.0", true)).expect("admit 0.9");
    host.promote(&v09).expect("promote 0.9");
    let v10 = host.admit(&repohost_release(&root, "1.0.0", true)).expect("admit 1.0");
    host.promote(&v10).expect("promote 1.0");
    let v11 = host.admit(&repohost_release(&root, "1.1.0", false)).expect("admit 1.1");
    Case { world, sink, host, v09, v10, v11 }
}

/// The `private` values the repository host received, in order.
fn received(sink: &Sink) -> Vec<bool> {
    sink.requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .filter_map(|v| v["private"].as_bool())
        .collect()
}

fn omitted() -> germline_executor::call::CallRequest {
    request("create_repository", json!({"name": "payroll-notes"}), &[])
}

#[test]
fn dispatch_after_rollout_is_fenced_and_runs_unfenced_with_the_mechanism_off() {
    for fence in [false, true] {
        let c = case(RuntimeKind::Germline);
        if !fence {
            c.host.switch_fence_off();
        }
        let (_, session) = c.host.open_session(&name()).expect("list");
        let f = c.host.form(&session.snapshot, &omitted()).expect("form");
        assert!(f.record.successors.iter().all(|s| s.release != c.v11), "1.1 (public) must not be captured");
        c.host.promote(&c.v11).expect("rollout");
        let r = c.host.dispatch(&f.id, None);
        eprintln!("fence {fence}: {:?}", r.as_ref().map(|o| o.error.clone()).map_err(|e| e.to_string()));
        if fence {
            let e = r.expect_err("fenced").to_string();
            assert!(e.contains(&f.id.short()) && e.contains("repohost 1.1.0") && e.contains("not captured"), "{e}");
            assert_eq!(received(&c.sink), Vec::<bool>::new(), "nothing ran");
        } else {
            assert!(r.expect("ran").error.is_none());
            assert_eq!(received(&c.sink), vec![false], "off: the private call created a public repository");
        }
        drop(c.world);
    }
}

#[test]
fn dispatch_after_rollback_is_fenced_while_the_source_lives() {
    let c = case(RuntimeKind::Germline);
    c.host.promote(&c.v11).expect("rollout to 1.1");
    let (_, session) = c.host.open_session(&name()).expect("list");
    // Formed on 1.1 (public): 1.0 and 0.9 make it private, another effect: not captured.
    let f = c.host.form(&session.snapshot, &omitted()).expect("form");
    assert!(f.record.successors.is_empty(), "{:?}", f.record.successors);
    c.host.roll_back(&c.v10).expect("rollback to 1.0");
    let e = c.host.dispatch(&f.id, None).expect_err("fenced").to_string();
    assert!(e.contains("repohost 1.0.0") && e.contains("formed on repohost 1.1.0"), "{e}");
    // An explicit private=true formed on 1.1 is private on 1.0 as well: captured, but the
    // source is not retired and keeps priority.
    let explicit = request("create_repository", json!({"name": "x", "private": true}), &[]);
    c.host.roll_back(&c.v11).expect("back to 1.1");
    let g = c.host.form(&session.snapshot, &explicit).expect("form");
    assert!(g.record.successors.iter().any(|s| s.release == c.v10));
    c.host.roll_back(&c.v10).expect("rollback to 1.0");
    let e = c.host.dispatch(&g.id, None).expect_err("fenced").to_string();
    assert!(e.contains("source is not retired"), "{e}");
    assert_eq!(received(&c.sink), Vec::<bool>::new());
}

#[test]
fn a_stale_session_after_reconnect_is_fenced_and_a_fresh_one_runs() {
    for fence in [false, true] {
        let c = case(RuntimeKind::Germline);
        if !fence {
            c.host.switch_fence_off();
        }
        let (_, stale) = c.host.open_session(&name()).expect("list on 1.0");
        c.host.promote(&c.v11).expect("rollout");
        // The client reconnects and resumes its old session: calls bind to what it saw.
        let r = c.host.session_call(&stale, &omitted());
        if fence {
            let e = r.expect_err("fenced").to_string();
            assert!(e.contains("formed on repohost 1.0.0") && e.contains("would run on repohost 1.1.0"), "{e}");
            assert!(received(&c.sink).is_empty());
            let (_, fresh) = c.host.open_session(&name()).expect("list on 1.1");
            let o = c.host.session_call(&fresh, &omitted()).expect("fresh session");
            assert!(o.error.is_none(), "{:?}", o.error);
            assert_eq!(received(&c.sink), vec![false], "a call formed on 1.1 has 1.1's effect");
        } else {
            assert!(r.expect("ran").error.is_none());
            assert_eq!(received(&c.sink), vec![false], "off: the stale session's call became public");
        }
    }
}

#[test]
fn after_retirement_the_captured_successor_runs_and_an_uncaptured_one_does_not() {
    let c = case(RuntimeKind::Germline);
    let (_, session) = c.host.open_session(&name()).expect("list on 1.0");
    let f = c.host.form(&session.snapshot, &omitted()).expect("form");
    let g = c.host.form(&session.snapshot, &omitted()).expect("form the same call again");
    assert_ne!(f.id, g.id, "two formations of one call are two records");
    let captured: Vec<ReleaseHash> = f.record.successors.iter().map(|s| s.release).collect();
    assert_eq!(captured, vec![c.v09], "0.9 (private) captured, 1.1 (public) not");
    c.host.roll_back(&c.v09).expect("rollback to 0.9");
    assert!(c.host.dispatch(&f.id, None).expect_err("source lives").to_string().contains("not retired"));
    c.host.retire(&c.v10).expect("retire 1.0");
    let o = c.host.dispatch(&f.id, None).expect("captured successor runs");
    assert!(o.error.is_none(), "{:?}", o.error);
    assert_eq!(received(&c.sink), vec![true]);
    let e = c.host.dispatch(&f.id, None).expect_err("a formed call runs once").to_string();
    assert!(e.contains("already ran"), "{e}");
    c.host.promote(&c.v11).expect("rollout to 1.1");
    let e = c.host.dispatch(&g.id, None).expect_err("uncaptured").to_string();
    assert!(e.contains("not captured"), "{e}");
    assert_eq!(received(&c.sink), vec![true], "the uncaptured successor ran nothing");
    // A release admitted after formation (private by default, like the source) governs
    // new formations only: the pending call's authority does not grow.
    let v12 = c.host.admit(&repohost_release(&c.world.dir.path().join("late"), "1.2.0", true)).expect("admit 1.2");
    c.host.promote(&v12).expect("promote 1.2");
    let e = c.host.dispatch(&g.id, None).expect_err("installed after formation").to_string();
    assert!(e.contains("repohost 1.2.0") && e.contains("not captured"), "{e}");
    assert_eq!(received(&c.sink), vec![true]);
    // A session that saw the retired source still forms on what it saw: successors are
    // captured at this formation (1.2, private by default like 1.0; 1.1 not), and the
    // captured one runs, the source being retired.
    let h = c.host.form(&session.snapshot, &omitted()).expect("formed on the retired source's snapshot");
    let captured: Vec<ReleaseHash> = h.record.successors.iter().map(|s| s.release).collect();
    assert!(captured.contains(&v12) && !captured.contains(&c.v11), "{captured:?}");
    let o = c.host.dispatch(&h.id, None).expect("captured successor runs");
    assert!(o.error.is_none(), "{:?}", o.error);
    assert_eq!(received(&c.sink), vec![true, true]);
}

#[test]
fn a_formation_is_bound_to_its_arguments_and_its_stored_record() {
    let (world, sink, policy) = sink_world();
    let log = Arc::new(MemoryFormationLog::default());
    let host = FormationHost::open(log.clone(), RuntimeKind::Germline, policy, python(&world.dir.path().join("home")))
        .expect("host");
    let v10 = host.admit(&repohost_release(&world.dir.path().join("r"), "1.0.0", true)).expect("admit");
    host.promote(&v10).expect("promote");
    let (_, s) = host.open_session(&name()).expect("list");
    let f = host.form(&s.snapshot, &omitted()).expect("form");
    let other = request("create_repository", json!({"name": "payroll-notes", "private": false}), &[]);
    let e = host.dispatch(&f.id, Some(&other)).expect_err("other arguments").to_string();
    assert!(e.contains("arguments differ"), "{e}");
    // The stored record is replaced by one formed with other arguments.
    let g = host.form(&s.snapshot, &other).expect("form");
    let (index, _) = log
        .replay()
        .expect("replay")
        .into_iter()
        .find(|(_, r)| matches!(r, germline_model::FcdRecord::Formation(e) if e.id == f.id))
        .expect("stored");
    log.overwrite(index, germline_model::FcdRecord::Formation(g));
    let e = host.dispatch(&f.id, None).expect_err("substituted").to_string();
    assert!(e.contains("does not hash to its id"), "{e}");
    assert!(sink.requests().is_empty());
}

#[test]
fn pending_formations_survive_a_restart_and_their_stored_calls_are_checked() {
    let (world, sink, policy) = sink_world();
    let py = python(&world.dir.path().join("home"));
    let (ledger_dir, pending) = (world.dir.path().join("ledger"), world.dir.path().join("pending"));
    let open = || ledger_at(&ledger_dir);
    let dir = repohost_release(&world.dir.path().join("r"), "1.0.0", true);
    let (f, g) = {
        let host = FormationHost::open(open(), RuntimeKind::Germline, policy.clone(), py.clone()).expect("host");
        host.keep_pending_in(&pending).expect("pending dir");
        let v10 = host.admit(&dir).expect("admit");
        host.promote(&v10).expect("promote");
        let (_, s) = host.open_session(&name()).expect("list");
        let f = host.form(&s.snapshot, &omitted()).expect("form");
        let g = host.form(&s.snapshot, &request("create_repository", json!({"name": "other"}), &[])).expect("form");
        (f, g)
    };
    // A stored call rewritten while the host was down no longer binds to its record.
    let stored = pending.join(format!("{}.json", g.id.to_hex()));
    let text = std::fs::read_to_string(&stored).expect("stored call");
    std::fs::write(&stored, text.replace("\"other\"", "\"other\",\"private\":false")).expect("tamper");
    let host = FormationHost::open(open(), RuntimeKind::Germline, policy, py).expect("reopened host");
    host.keep_pending_in(&pending).expect("pending dir");
    host.attach(&dir, None).expect("attach");
    let o = host.dispatch(&f.id, None).expect("runs after the restart");
    assert!(o.error.is_none(), "{:?}", o.error);
    let e = host.dispatch(&g.id, None).expect_err("tampered").to_string();
    assert!(e.contains("arguments differ"), "{e}");
    assert_eq!(received(&sink), vec![true]);
}

/// A formation runs at most once, across restarts: its dispatch record is in the ledger
/// before its copies fork, so the host reopened on the same ledger refuses it (even with
/// the call supplied again), naming the earlier dispatch. The ledger verifies.
#[test]
fn a_formation_that_ran_is_refused_after_a_restart_naming_its_dispatch() {
    let (world, sink, policy) = sink_world();
    let py = python(&world.dir.path().join("home"));
    let ledger_dir = world.dir.path().join("ledger");
    let open = || ledger_at(&ledger_dir);
    let dir = repohost_release(&world.dir.path().join("r"), "1.0.0", true);
    let (f, at) = {
        let host = FormationHost::open(open(), RuntimeKind::Germline, policy.clone(), py.clone()).expect("host");
        let v10 = host.admit(&dir).expect("admit");
        host.promote(&v10).expect("promote");
        let (_, s) = host.open_session(&name()).expect("list");
        let f = host.form(&s.snapshot, &omitted()).expect("form");
        let o = host.dispatch(&f.id, None).expect("runs");
        assert!(o.error.is_none(), "{:?}", o.error);
        (f.clone(), host.dispatch_entry(&f.id).expect("dispatch recorded"))
    };
    let ledger = open();
    let host = FormationHost::open(ledger.clone(), RuntimeKind::Germline, policy, py).expect("reopened host");
    host.attach(&dir, None).expect("attach");
    let e = host.dispatch(&f.id, Some(&omitted())).expect_err("ran before the restart").to_string();
    eprintln!("after the restart: {e}");
    assert!(
        e.contains(&f.id.short()) && e.contains(&format!("already ran (dispatch recorded at log entry {at})")),
        "{e}"
    );
    assert_eq!(received(&sink), vec![true], "the call ran once");
    drop(host);
    let report = ledger.verify().expect("verify");
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!((report.snapshots, report.formations, report.dispatches), (1, 1, 1));
}
