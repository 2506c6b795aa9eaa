//! Issue 15, point 4: calls to one release run side by side, each on a germline of its
//! own (a lane, `germline_executor::lanes`), and every update of one slot starts from the
//! slot as the previous update left it (`germline_executor::slots`).
//!
//! Two calls meet at a loopback rendezvous: each copy asks `rendezvous.example` (through
//! the broker) and the rendezvous answers `met` only when both requests are there at once,
//! `alone` after 3 s otherwise. Copies never see each other; only the rendezvous does.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use germline_executor::call::release_dir_hash;
use germline_executor::dispatch::{HostedRelease, LocalRunner, ReleaseRunner};
use germline_executor::runtime::RuntimeKind;
use germline_executor::slots::SLOT_LEASES_OFF_FOR_TESTS;
use germline_model::{FenceGrant, ReleaseName};
use germline_tests::sink::rendezvous;
use germline_tests::world::{request, result_text, World};
use serde_json::json;

const MEET: &str = r#"
import germline_slot

def create_server():
    m = FastMCP("meet")
    @m.tool()
    def meet() -> str:
        return get("http://rendezvous.example/")[1]
    @m.tool()
    def bump() -> str:
        n = germline_slot.get("n", 0)
        get("http://rendezvous.example/")
        germline_slot.set("n", n + 1)
        return str(n + 1)
    @m.tool()
    def tally() -> str:
        return str(germline_slot.get("n", 0))
    return m
"#;

/// How long the rendezvous waits for a second request.
const ALONE_AFTER: Duration = Duration::from_secs(3);

fn runner(w: &World, lanes: usize, at: SocketAddr) -> (LocalRunner, HostedRelease) {
    let rel = w.release(
        "meet",
        "[tools.meet]\nhosts = [\"rendezvous.example\"]\n[tools.bump]\nhosts = [\"rendezvous.example\"]\n",
        MEET,
    );
    let policy =
        w.policy(&[("rendezvous.example", &[], Some(at))], &[("agent", &[])], &format!("[limits]\nlanes = {lanes}\n"));
    let hosted = HostedRelease {
        name: ReleaseName::new("meet").unwrap(),
        version: "1.0.0".into(),
        release: release_dir_hash(&rel).unwrap(),
        dir: rel,
        registration: None,
    };
    (LocalRunner::new(RuntimeKind::Germline, policy, w.python()), hosted)
}

/// Runs `tool` twice at once; returns both answers.
fn twice(runner: &LocalRunner, hosted: &HostedRelease, tool: &str) -> Vec<String> {
    std::thread::scope(|s| {
        let calls: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut fence = |_| Ok(FenceGrant::Source);
                    let o = runner.run(hosted, &request(tool, json!({}), &[]), &mut fence).expect("run");
                    assert!(o.error.is_none(), "{:?}", o.error);
                    result_text(&o)
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().expect("call thread")).collect()
    })
}

/// With two lanes the two calls are in their copies at the same time (both met at the
/// rendezvous); with one ("mechanism off": calls to a release queue) each is alone.
#[test]
fn calls_to_one_release_run_side_by_side_each_on_a_germline_of_its_own() {
    let w = World::new();
    let at = rendezvous(ALONE_AFTER);
    let (one, hosted) = runner(&w, 1, at);
    assert_eq!(twice(&one, &hosted, "meet"), ["alone", "alone"], "one lane: the calls queue");
    drop(one);
    let (two, hosted) = runner(&w, 2, at);
    assert_eq!(twice(&two, &hosted, "meet"), ["met", "met"], "two lanes: the calls overlap");
}

/// Two calls that read the slot, meet (or wait), and write it back: with the slot's lease
/// the second is given the slot only once the first stored its update (2 at the end);
/// without it ("mechanism off") both start from 0 and one update is lost (1).
#[test]
fn overlapping_updates_of_one_slot_are_never_lost() {
    let w = World::new();
    let at = rendezvous(ALONE_AFTER);
    let tally = |leases: bool| {
        SLOT_LEASES_OFF_FOR_TESTS.store(!leases, Ordering::SeqCst);
        let (r, hosted) = runner(&w, 2, at);
        let mut bumped = twice(&r, &hosted, "bump");
        bumped.sort();
        let mut fence = |_| Ok(FenceGrant::Source);
        let n = result_text(&r.run(&hosted, &request("tally", json!({}), &[]), &mut fence).expect("tally"));
        SLOT_LEASES_OFF_FOR_TESTS.store(false, Ordering::SeqCst);
        (bumped, n)
    };
    let (bumped, n) = tally(false);
    assert_eq!((bumped, n.as_str()), (vec!["1".to_owned(), "1".to_owned()], "1"), "off: one update is lost");
    let (bumped, n) = tally(true);
    assert_eq!((bumped, n.as_str()), (vec!["1".to_owned(), "2".to_owned()], "2"), "on: the updates are ordered");
}
