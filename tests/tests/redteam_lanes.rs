//! Issue 15 point 4, adversarial pass on lanes: calls to one release run side by side on
//! germlines of their own, and share the release's slots under leases. Each variant is a
//! release under `tests/attacks/lanes/` (or inline) that holds the hr canary in one call
//! and tries to get it into a public call of the same release.
//!
//! `futex` (tests/attacks/lanes/futex): the kernel's wake of an exiting thread's
//! `clear_child_tid` futex on a page of `server.py`, one inode in both lanes' roots, keyed
//! by the file; SECURITY.md lists the wake as open ("one bit per thread exit"). With one
//! lane the hr call and the public call never overlap (0 words woken); with two lanes
//! they do, and every bit of the canary crosses in one call pair.

use std::path::{Path, PathBuf};
use std::time::Duration;

use germline_executor::call::{release_dir_hash, CallOutcome, CallRequest};
use germline_executor::dispatch::{HostedRelease, LocalRunner, ReleaseRunner};
use germline_executor::runtime::RuntimeKind;
use germline_model::{FenceGrant, ReleaseName};
use germline_tests::oracle::Oracle;
use germline_tests::world::{request, result_text, World};
use serde_json::json;

fn attack(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("attacks/lanes").join(name).join("server.py"))
        .expect("attack source")
}

fn hosted(name: &str, rel: PathBuf) -> HostedRelease {
    HostedRelease {
        name: ReleaseName::new(name).unwrap(),
        version: "1.0.0".into(),
        release: release_dir_hash(&rel).unwrap(),
        dir: rel,
        registration: None,
    }
}

fn run(runner: &LocalRunner, h: &HostedRelease, req: &CallRequest) -> CallOutcome {
    let mut fence = |_| Ok(FenceGrant::Source);
    runner.run(h, req, &mut fence).expect("run")
}

fn public(mut req: CallRequest) -> CallRequest {
    req.consumers = vec!["public".into()];
    req
}

/// Runs `a` and `b` at once (b started `lead` after a), returns both outcomes.
fn together(
    runner: &LocalRunner,
    h: &HostedRelease,
    a: &CallRequest,
    b: &CallRequest,
    lead: Duration,
) -> (CallOutcome, CallOutcome) {
    std::thread::scope(|s| {
        let ta = s.spawn(|| run(runner, h, a));
        std::thread::sleep(lead);
        let tb = s.spawn(|| run(runner, h, b));
        (ta.join().expect("a"), tb.join().expect("b"))
    })
}

/// The 96-bit value after `GLC-hr-` in `text`, if any.
fn hr_bits(text: &str) -> Option<u128> {
    let i = text.find("GLC-hr-")?;
    u128::from_str_radix(text.get(i + 7..i + 31)?, 16).ok()
}

fn canary_value(c: &str) -> u128 {
    u128::from_str_radix(c.rsplit('-').next().unwrap_or_default(), 16).unwrap_or_default()
}

/// One futex run with `lanes` lanes: (bits of the public answer equal to the canary's,
/// how many of the 96 words woke, the public answer).
fn futex_run(lanes: usize) -> (usize, usize, String) {
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let secret = w.item("hr", "payslip.txt", hr.as_str());
    let rel = w.release("futex", "[tools.pause]\n[tools.send]\n[tools.read]\n", &attack("futex"));
    let policy = w.policy(&[], &[("agent", &["hr"]), ("public", &[])], &format!("[limits]\nlanes = {lanes}\n"));
    let runner = LocalRunner::new(RuntimeKind::Germline, policy, w.python());
    let h = hosted("futex", rel);
    // Two overlapping data-free calls: the second finds the first lane busy and starts
    // another (with one lane it waits).
    let pause = public(request("pause", json!({"seconds": 3.0}), &[]));
    let (p1, p2) = together(&runner, &h, &pause, &pause, Duration::from_millis(200));
    assert_eq!((result_text(&p1), result_text(&p2)), ("paused".into(), "paused".into()));
    let send = request("send", json!({"document": secret}), &[&secret]);
    let read = public(request("read", json!({}), &[]));
    let (read, sent) = together(&runner, &h, &read, &send, Duration::from_millis(300));
    assert!(sent.error.is_none(), "send: {:?}", sent.error);
    let text = result_text(&read);
    assert!(read.error.is_none(), "read: {:?}", read.error);
    let woke = text.rsplit("woke=").next().and_then(|n| n.trim().parse().ok()).unwrap_or(0);
    let matched = hr_bits(&text).map(|v| 96 - (v ^ canary_value(hr.as_str())).count_ones() as usize).unwrap_or(0);
    // The public consumer is cleared for nothing: its answer's label is empty.
    assert_eq!(read.label.as_ref().map(|l| l.is_empty()), Some(true), "the public answer is unlabelled");
    (matched, woke, text)
}

/// Lanes 1 ("off": calls to a release queue) against lanes 2 (on). Open: with two lanes
/// every bit crosses (see the module docs); this test asserts that none does, and fails.
#[test]
#[ignore = "open: with lanes = 2 an hr call and a public call of one release overlap, and the kernel's \
            clear_child_tid futex wake on a page of a file both lanes map carries the hr canary (96/96 bits \
            in one call pair); SECURITY.md lists the wake as open, lanes make it reachable by one release"]
fn futex_thread_exit_wakes_on_a_shared_file_page_carry_the_canary_between_lanes() {
    let off = futex_run(1);
    eprintln!("futex lanes=1: {} of 96 bits equal, {} words woke ({})", off.0, off.1, off.2);
    assert_eq!(off.1, 0, "one lane: the calls never overlap, no word wakes");
    let on = futex_run(2);
    eprintln!("futex lanes=2: {} of 96 bits equal, {} words woke ({})", on.0, on.1, on.2);
    assert_eq!(on.1, 0, "two lanes: no word of the public call's mapping wakes");
}
