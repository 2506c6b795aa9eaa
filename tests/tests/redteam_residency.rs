//! Page-cache residency of the germline's root, an open channel (SECURITY.md, "Page-cache
//! residency"). Found by the adversarial pass on the per-copy cgroups: page-cache pages the
//! germline faults in during a fork window are charged to the copy's memory cgroup and stay
//! there after the germline leaves; the copy, once it holds the item, evicts them (or not)
//! by filling its own cgroup to its limit; the germline counts its major faults on them in
//! the next fork window and every later copy inherits the count
//! (`tests/attacks/kernel/memcgevict`).
//!
//! The tests measure the channel; nothing closes it yet, so they are ignored in the suite:
//! `cargo test --workspace --locked --test redteam_residency -- --ignored --nocapture`
//! (`MEMCG_BITS=96` carries the whole canary; default 16 bits).

use std::sync::Mutex;
use std::time::Instant;

use germline_executor::cgroup::{DEPARTURE_OFF_FOR_TESTS, NO_CGROUPS_FOR_TESTS};
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_tests::attacks::Hold;
use germline_tests::oracle::Oracle;
use germline_tests::world::{request, result_text, World};
use serde_json::{json, Value};

static SWITCH: Mutex<()> = Mutex::new(());

fn attack(name: &str) -> String {
    germline_tests::attacks::source("kernel", name)
}

fn nonce() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000_007
}

fn window(text: &str) -> i64 {
    serde_json::from_str::<Value>(text).ok().and_then(|v| v["w"].as_i64()).unwrap_or(-1)
}

/// Runs the whole exchange; returns (read output, leaked?).
fn run(pool: usize, bits: usize) -> (Value, bool) {
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let secret = w.item("hr", "secret.txt", hr.as_str());
    let code = attack("memcgevict").replace("{NONCE}", &nonce().to_string());
    let release = w.release("memcgevict", "", &code);
    let limits = format!("[limits]\npool = {pool}\n");
    let policy = w.policy(&[], &[("agent", &["hr"]), ("public", &[])], &limits);
    let mut rt: Runtime = w.start(RuntimeKind::Germline, &release, policy).expect("germline starts");
    let public = |rt: &mut Runtime, tool: &str, args: Value| {
        let mut req = request(tool, args, &[]);
        req.consumers = vec!["public".into()];
        let o = rt.call(&req);
        (result_text(&o), o.error.map(|e| e.to_string()))
    };
    let (mut ticks, mut flushes, mut sends) = (vec![], vec![], vec![]);
    let t0 = Instant::now();
    for _ in 0..3 {
        let (t, e) = public(&mut rt, "tick", json!({}));
        assert!(e.is_none(), "{e:?}");
        ticks.push(window(&t));
        let (t, e) = public(&mut rt, "flush", json!({}));
        assert!(e.is_none(), "{e:?}");
        eprintln!("flush: {t}");
        flushes.push(window(&t));
    }
    let t_cal = t0.elapsed();
    for i in 0..bits {
        let o = rt.call(&request("send", json!({"document": secret, "index": i}), &[&secret]));
        assert!(o.error.is_none(), "{:?}", o.error);
        let t = result_text(&o);
        eprintln!("send {i}: {t}");
        sends.push(window(&t));
    }
    let t_send = t0.elapsed() - t_cal;
    let (text, e) = public(&mut rt, "read", json!({"ticks": ticks, "flushes": flushes, "sends": sends}));
    assert!(e.is_none(), "{e:?}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| json!({"raw": text}));
    let leaked = !oracle.disclosures("public", &[], text.as_bytes()).is_empty();
    eprintln!(
        "pool={pool} bits={bits} calibration {:?} sends {:?} ({:?}/call)\nticks {ticks:?} flushes {flushes:?} sends {sends:?}\nread: {}",
        t_cal,
        t_send,
        t_send / bits.max(1) as u32,
        serde_json::to_string(&v).unwrap()
    );
    let canary_hex = hr.as_str().rsplit('-').next().unwrap().to_owned();
    let want: String = {
        let raw = u128::from_str_radix(&canary_hex, 16).unwrap();
        (0..bits).map(|i| if (raw >> (95 - i)) & 1 == 1 { '1' } else { '0' }).collect()
    };
    let got = v["bits"].as_str().unwrap_or("").to_owned();
    let right = want.chars().zip(got.chars()).filter(|(a, b)| a == b).count();
    eprintln!("canary {} want {want}\n                got  {got}\n right {right}/{bits}", hr.as_str());
    (json!({"read": v, "right": right, "bits": bits}), leaked)
}

fn bits() -> usize {
    std::env::var("MEMCG_BITS").ok().and_then(|s| s.parse().ok()).unwrap_or(16)
}

/// The full germline, fork per call: the germline's fork-window page cache, charged to the
/// copy's memory cgroup, is evicted by the copy holding the item; the germline counts.
#[test]
#[ignore = "open channel: measures it (SECURITY.md, page-cache residency)"]
fn memcgevict_the_copy_evicts_what_the_germline_faulted_in_its_cgroup() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let (v, leaked) = run(0, bits());
    eprintln!("leaked to public (full canary): {leaked}");
    assert_eq!(v["right"], v["bits"], "on: every bit read back");
    assert!(bits() < 96 || leaked, "on: the whole canary reaches the public consumer");
}

/// The germline's departure does not matter (`DEPARTURE_OFF_FOR_TESTS`: it stays in the
/// copy's cgroups): charges stay where they were made.
#[test]
#[ignore = "open channel: measures it (SECURITY.md, page-cache residency)"]
fn memcgevict_with_the_departure_off_as_well() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let _h = Hold::set(&DEPARTURE_OFF_FOR_TESTS, true);
    let (v, leaked) = run(0, bits());
    eprintln!("leaked to public (full canary): {leaked}");
    assert_eq!(v["right"], v["bits"], "off: every bit read back");
}

/// Pooled (2 ready copies): the window of a pooled copy's fork is the same.
#[test]
#[ignore = "open channel: measures it (SECURITY.md, page-cache residency)"]
fn memcgevict_pooled() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let (v, leaked) = run(2, bits());
    eprintln!("leaked to public (full canary): {leaked}");
    assert_eq!(v["right"], v["bits"], "pooled: every bit read back");
}

/// Control: no cgroups (per-process rlimits only): a copy cannot push anything out (it can
/// still load pages, which this release does not try).
#[test]
#[ignore = "control of an open channel's measurement"]
fn memcgevict_without_cgroups_nothing_is_evicted() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let _h = Hold::set(&NO_CGROUPS_FOR_TESTS, true);
    let (v, leaked) = run(0, bits());
    eprintln!("leaked to public (full canary): {leaked}");
    assert!(!leaked);
    assert!(!v["read"]["bits"].as_str().unwrap_or("").contains('1'), "no cgroup: nothing evicted");
}
