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

use std::time::Instant;

use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_executor::seccomp::SeccompPolicy;
use germline_tests::oracle::Oracle;
use germline_tests::world::{request, result_text, World};
use serde_json::{json, Value};

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
    let (right, leaked, v) = exchange("pipeino", 16, SeccompPolicy::germline());
    assert!(leaked && right == 96, "the whole canary crosses: {right}/96 {v}");
}
