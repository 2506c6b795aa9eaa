//! Issue 14 acceptance in CI: `germline-eval fcd`'s table has the expected shape. After
//! the change (rollback of mcp-server-git to the release before the dash-target fix;
//! rollout of repohost to the release whose omitted `private` is public), exact pinning
//! and release-wide deny complete neither call; release-wide allow (no fence between a
//! pending call and a successor: the mechanism off) completes both and creates the
//! canary files / public repositories; call-specific FCD completes A, blocks B and
//! creates nothing. The ledgers verify.

use germline_model::DispatchPolicy;
use germline_tests::eval::{run_fcd, FcdOptions};
use germline_tests::world::python;

#[test]
fn eval_fcd_has_the_expected_shape() {
    let home = tempfile::tempdir().unwrap();
    let opts = FcdOptions::default();
    let t = opts.trials;
    let r = run_fcd(&opts, &python(home.path())).unwrap();
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("eval");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("fcd.json"), serde_json::to_vec_pretty(&r).unwrap()).unwrap();
    println!("{}", r.render_text());
    for name in ["git", "repohost"] {
        let c = r.case(name).unwrap();
        assert!(c.ledger_problems.is_empty(), "{name}: {:?}", c.ledger_problems);
        assert_eq!(c.ledger_records.0, 4 * 2 * t as u64, "{name}: every formation is in the ledger");
        let ran: usize = c.rows.iter().map(|r| r.a_completed + r.b_completed).sum();
        assert_eq!(c.ledger_snapshots_dispatches, (4, ran as u64), "{name}: one snapshot per host, a dispatch per run");
        let row = |p| {
            let x = c.row(p).unwrap();
            (x.a_completed, x.b_completed, x.new_formations, x.violations)
        };
        assert_eq!(row(DispatchPolicy::ExactPin), (0, 0, 2 * t, 0), "{name}: exact pinning");
        assert_eq!(row(DispatchPolicy::ReleaseWideDeny), (0, 0, 2 * t, 0), "{name}: release-wide deny");
        assert_eq!(row(DispatchPolicy::ReleaseWideAllow), (t, t, 0, t), "{name}: release-wide allow (control)");
        assert_eq!(row(DispatchPolicy::CallSpecific), (t, 0, t, 0), "{name}: call-specific FCD");
        let why = c.row(DispatchPolicy::CallSpecific).unwrap().example_refusal.clone().unwrap_or_default();
        assert!(why.contains("not captured") && why.contains("nothing ran"), "{name}: {why}");
    }
}
