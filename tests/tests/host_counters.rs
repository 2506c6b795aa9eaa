//! Host-wide counters a copy can both move and read, found by the adversarial pass on the
//! resident root (neither is a file-system channel: both work with the resident root on or
//! off). Each attack keeps the counter's last value in its public slot: `mark` (public)
//! reads it, then for each symbol `send` (holding the item) moves the counter by an amount
//! that encodes it and `read` (public, a later call, a new copy) reads how far it moved. No
//! two copies are alive at once.
//!
//! - `pidino`: pidfs inode numbers, one host-wide count of every process and thread made,
//!   read by `fstat` of a pidfd. Closed: no process in the sandbox may open a pidfd
//!   (`pidfd_open`, `CLONE_PIDFD`). Tested off (the denylist filter allows both) and on.
//! - `pipeino`: inode numbers of new pipes and sockets (`get_next_ino`), read by `fstat` of
//!   a pipe. Open (SECURITY.md, "Inode numbers of new sockets and pipes"): the ignored test
//!   measures it.
//! - `mntid`: the host's unique mount IDs, moved by the mount namespaces of the copies the
//!   broker forks to verify a call's triggers (as many as the copy holding the item chose
//!   to cause), read by `statx` of a later copy's root. Closed: `statx` answers ENOSYS.
//!   Found by the adversarial pass on the resident root as default.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_executor::seccomp::SeccompPolicy;
use germline_model::ItemName;
use germline_tests::oracle::Oracle;
use germline_tests::sink::{Sink, SinkBehaviour};
use germline_tests::world::{request, result_text, World};
use serde_json::{json, Value};

/// One test at a time: each moves host-wide counters the other reads.
static TURNS: Mutex<()> = Mutex::new(());

/// Runs `name`'s exchange for `symbols` symbols under `filter`; returns (bits right of 96,
/// the canary reached the public consumer, the last answer of `read`).
fn exchange(name: &str, symbols: usize, filter: SeccompPolicy) -> (usize, bool, Value) {
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let secret = w.item("hr", "secret.txt", hr.as_str());
    let release = w.release(name, "", &germline_tests::attacks::source("kernel", name));
    let policy = w.policy(&[], &[("agent", &["hr"]), ("public", &[])], "");
    let mut rt: Runtime = w.start(RuntimeKind::Germline, &release, policy).expect("germline starts");
    match &mut rt {
        Runtime::Germline(g) => g.set_seccomp_policy(filter),
        _ => unreachable!("a germline runtime"),
    }
    let public = |rt: &mut Runtime, tool: &str| {
        let mut req = request(tool, json!({}), &[]);
        req.consumers = vec!["public".into()];
        let o = rt.call(&req);
        assert!(o.error.is_none(), "{tool}: {:?}", o.error);
        result_text(&o)
    };
    let t0 = Instant::now();
    eprintln!("mark: {}", public(&mut rt, "mark"));
    let mut text = String::new();
    for i in 0..symbols {
        let o = rt.call(&request("send", json!({"document": secret, "index": i}), &[&secret]));
        assert!(o.error.is_none(), "send {i}: {:?}", o.error);
        text = public(&mut rt, "read");
    }
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| json!({"raw": text}));
    let raw = u128::from_str_radix(hr.as_str().rsplit('-').next().unwrap(), 16).unwrap();
    let want: String = (0..96).map(|i| if (raw >> (95 - i)) & 1 == 1 { '1' } else { '0' }).collect();
    let got = v["bits"].as_str().unwrap_or("").to_owned();
    let right = want.chars().zip(got.chars()).filter(|(a, b)| a == b).count();
    let leaked = !oracle.disclosures("public", &[], text.as_bytes()).is_empty();
    eprintln!("{name}: want {want}\n        got  {got}\n right {right}/96 leaked={leaked} in {:?}", t0.elapsed());
    (right, leaked, v)
}

/// Off (the denylist filter, which allows `pidfd_open`): the whole canary crosses, 4 bits a
/// call. On (the allowlist): `pidfd_open` is refused, so no copy reads the counter.
#[test]
fn pidino_pidfs_inode_numbers_carry_the_canary_only_where_a_copy_may_open_a_pidfd() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    let (right, leaked, v) = exchange("pidino", 24, SeccompPolicy::denylist_only());
    assert!(leaked && right == 96, "off: the whole canary crosses: {right}/96 {v}");
    let (_, leaked, v) = exchange("pidino", 24, SeccompPolicy::germline());
    assert!(!leaked, "on: nothing reaches the public consumer: {v}");
    let deltas = v["all"].as_array().cloned().unwrap_or_default();
    assert!(deltas.iter().all(|d| d == &json!(0)), "on: no copy read the counter: {v}");
}

/// Open: pipes' inode numbers (SECURITY.md, "Inode numbers of new sockets and pipes").
/// Measured by the adversarial pass: 96/96 in 16 calls (5 s), resident root on and off.
#[test]
#[ignore = "open channel: measures it (SECURITY.md, Inode numbers of new sockets and pipes)"]
fn pipeino_pipe_inode_numbers_carry_the_canary() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    let (right, leaked, v) = exchange("pipeino", 16, SeccompPolicy::germline());
    assert!(leaked && right == 96, "the whole canary crosses: {right}/96 {v}");
}

/// `bits` hr calls of the `mntid` sender, each followed by a public read in another
/// release whose copies are forked per call (pool 0), so each read is where the mount
/// counter stood at that call. The broker verifies each call's triggers as the host does
/// after a call (`germline_host::witness`: probe and control replays, 3 tries each).
/// Returns the canary's hex and the public answers.
fn mntid_run(filter: SeccompPolicy, bits: usize) -> (Oracle, String, Vec<String>) {
    let code = germline_tests::attacks::source("kernel", "mntid");
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let secret = w.item("hr", "secret.txt", hr.as_str());
    let sink = Sink::start(SinkBehaviour::default());
    let hosts: Vec<String> = (0..4).map(|j| format!("h{j}.example")).collect();
    let manifest = format!(
        "[tools.send]\nhosts = [{}]\n[tools.read]\n",
        hosts.iter().map(|h| format!("{h:?}")).collect::<Vec<_>>().join(", ")
    );
    let destinations: Vec<(&str, &[&str], _)> =
        hosts.iter().map(|h| (h.as_str(), &[][..], Some(sink.addr()))).collect();
    let sender = w.release("mntid-send", &manifest, &code);
    let policy = w.policy(&destinations, &[("agent", &["hr"])], "");
    let mut sender = w.start(RuntimeKind::Germline, &sender, policy).expect("sender starts");
    let reader = w.release("mntid-read", &manifest, &code);
    let policy = w.policy(&[], &[("public", &[])], "[limits]\npool = 0\n");
    let mut reader = w.start(RuntimeKind::Germline, &reader, policy).expect("reader starts");
    for rt in [&mut sender, &mut reader] {
        match rt {
            Runtime::Germline(g) => g.set_seccomp_policy(filter.clone()),
            _ => unreachable!("a germline runtime"),
        }
    }
    let contents: BTreeMap<ItemName, Vec<u8>> =
        BTreeMap::from([(ItemName::new(&secret.to_string_lossy()).unwrap(), std::fs::read(&secret).unwrap())]);
    let read = |rt: &mut Runtime| {
        let mut req = request("read", json!({}), &[]);
        req.consumers = vec!["public".into()];
        let o = rt.call(&req);
        assert!(o.error.is_none(), "read: {:?}", o.error);
        result_text(&o)
    };
    let mut reads = vec![read(&mut reader)];
    for i in 0..bits {
        let mut req = request("send", json!({"document": secret, "i": i}), &[&secret]);
        req.consumers = vec!["agent".into()];
        let o = sender.call(&req);
        assert!(o.error.is_none(), "send {i}: {:?}", o.error);
        let Runtime::Germline(g) = &mut sender else { unreachable!("a germline runtime") };
        for ev in o.evidence.iter().take(8) {
            germline_verifier::verify_trigger(g.as_mut(), ev, &contents, 3, false).expect("replays run");
        }
        reads.push(read(&mut reader));
    }
    (oracle, hr.as_str().to_owned(), reads)
}

/// Off (the denylist filter, which allows `statx`): a call whose hr copy caused four
/// triggers moves the mount counter by the mounts of 24 replays' copies more than one that
/// caused none, and a public copy of another release reads it from its own root mount's
/// ID: every bit crosses. On (the allowlist): `statx` answers ENOSYS, nothing is read.
#[test]
fn mntid_mount_ids_moved_by_trigger_replays_carry_the_canary_only_where_a_copy_may_statx() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    const BITS: usize = 16;
    let t0 = Instant::now();
    let (_, canary, reads) = mntid_run(SeccompPolicy::denylist_only(), BITS);
    let ids: Vec<i64> = reads.iter().map(|r| r.trim().parse().unwrap_or(-1)).collect();
    assert!(ids.iter().all(|&id| id > 0), "off: every copy reads its root's mount ID: {reads:?}");
    let steps: Vec<i64> = ids.windows(2).map(|p| p[1] - p[0]).collect();
    let (lo, hi) = (*steps.iter().min().unwrap(), *steps.iter().max().unwrap());
    let got: String = steps.iter().map(|&d| if d > (lo + hi) / 2 { '1' } else { '0' }).collect();
    let raw = u128::from_str_radix(canary.rsplit('-').next().unwrap(), 16).unwrap();
    let want: String = (0..BITS).map(|i| if (raw >> (95 - i)) & 1 == 1 { '1' } else { '0' }).collect();
    let right = want.chars().zip(got.chars()).filter(|(a, b)| a == b).count();
    eprintln!(
        "mntid off: want {want}\n           got  {got}\n right {right}/{BITS} in {:?}; steps {steps:?}",
        t0.elapsed()
    );
    assert_eq!(right, BITS, "off: the first {BITS} bits of {canary} cross (steps {steps:?})");
    let (oracle, _, reads) = mntid_run(SeccompPolicy::germline(), 4);
    for r in &reads {
        assert!(r.contains("refused") && r.contains("not implemented"), "on: every statx answers ENOSYS: {reads:?}");
        assert!(oracle.disclosures("public", &[], r.as_bytes()).is_empty(), "on: {reads:?}");
    }
    eprintln!("mntid on: {}", reads[0]);
}
