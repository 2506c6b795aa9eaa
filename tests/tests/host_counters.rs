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
//! - `inooffset`: the same counter read exactly, not in whole batches: within its batch of
//!   1024 each CPU's counter moves by one per new inode, so a copy that makes pipes until
//!   every CPU's last number is a chosen value mod 1024 leaves ~10 bits per CPU that the
//!   next copy's first pipe on that CPU reads (less the few inodes the broker and the host
//!   take in between), and the batch index besides. Within one call (the hr copy, then the
//!   copy for projx.example) and from one call into the next call of another release.
//!   Open (SECURITY.md, same entry): found by the adversarial pass of 2026-12-07; the
//!   ignored tests measure it.
//! - `seqdelay`: not a counter but the same route within one call: the hr copy ends its
//!   answer at a host-clock phase it chooses, and the next copy of the call reads the host
//!   clock through libc when it starts. Open ("Call duration"): the ignored test measures it.
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

/// The hr canary's 96 bits.
fn canary_bits(hr: &str) -> u128 {
    u128::from_str_radix(hr.rsplit('-').next().unwrap(), 16).unwrap()
}

/// Bits of `want` (`n` bits) that `got` has right.
fn bits_right(want: u128, got: u128, n: usize) -> usize {
    n - ((want ^ got) & ((1u128 << n) - 1)).count_ones() as usize
}

/// `calls` calls of `name`'s `scan` over an hr item and a projx item, arguments
/// `args(i)` (with the items' paths added). Each call runs two copies, one after the other:
/// {hr item} first and {projx item} next (views of one size run in content order); the
/// projx copy posts what it read to projx.example, a destination cleared for projx only.
/// Returns the canary's bits and, per call, what projx.example received (`null` if none).
fn within_one_call(name: &str, calls: usize, args: impl Fn(usize) -> Value) -> (u128, Vec<Value>) {
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let px = oracle.plant(&["projx"]);
    let a = w.item("hr", "a.txt", hr.as_str());
    let b = w.item("projx", "b.txt", px.as_str());
    let code = germline_tests::attacks::source("kernel", name);
    let release = w.release(name, "[tools.scan]\nhosts = [\"hrsink.example\", \"projx.example\"]\n", &code);
    let hrsink = Sink::start(SinkBehaviour::default());
    let projx = Sink::start(SinkBehaviour::default());
    let policy = w.policy(
        &[("hrsink.example", &["hr"], Some(hrsink.addr())), ("projx.example", &["projx"], Some(projx.addr()))],
        &[("agent", &["hr", "projx"])],
        "",
    );
    let mut rt = w.start(RuntimeKind::Germline, &release, policy).expect("germline starts");
    let mut posted = Vec::new();
    for i in 0..calls {
        let mut arguments = args(i);
        arguments["a"] = json!(a);
        arguments["b"] = json!(b);
        let before = projx.requests().len();
        let o = rt.call(&request("scan", arguments, &[&a, &b]));
        assert!(o.error.is_none(), "call {i}: {:?}", o.error);
        let got = projx.requests().get(before).and_then(|r| serde_json::from_slice(&r.body).ok());
        posted.push(got.unwrap_or(Value::Null));
    }
    assert!(oracle.disclosures("projx", &["projx".into()], &projx.received()).is_empty(), "never the canary's text");
    (canary_bits(hr.as_str()), posted)
}

/// The inode numbers a reader posted, one per CPU (0 where it read none on that CPU).
fn inos(posted: &Value) -> Vec<i64> {
    posted["inos"].as_array().cloned().unwrap_or_default().iter().map(|x| x.as_i64().unwrap_or(0)).collect()
}

/// Their offsets in their batches, `(ino - 1) mod 1024` (`None` where there is none).
fn offsets(posted: &Value) -> Vec<Option<i64>> {
    inos(posted).iter().map(|&n| (n > 0).then(|| (n - 1).rem_euclid(1024))).collect()
}

fn cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
}

/// Calls that send symbol 0 first, so the reader learns where its readings fall.
const CALIBRATION: usize = 6;

/// The arguments of call `i`: a calibration call sends 0, then symbol `i - CALIBRATION`.
fn symbol_args(i: usize, extra: Value) -> Value {
    let mut v = extra;
    let (idx, force) = if i < CALIBRATION { (0, 0) } else { ((i - CALIBRATION) as i64, -1) };
    v["idx"] = json!(idx);
    v["force"] = json!(force);
    v
}

/// Per CPU, the middle of the calibration calls' offsets: where symbol 0 reads, the foreign
/// inodes taken between the park and the read included.
fn calibration_middles(posted: &[Value]) -> Vec<i64> {
    (0..cpus())
        .map(|c| {
            let mut v: Vec<i64> =
                posted[..CALIBRATION].iter().filter_map(|p| offsets(p).get(c).copied().flatten()).collect();
            v.sort();
            v.get(v.len() / 2).copied().unwrap_or(0)
        })
        .collect()
}

/// The `nb`-bit symbol a CPU's offset spells (in steps of `1024 >> nb` past `mid`).
fn symbol(offset: Option<i64>, mid: i64, nb: usize) -> u128 {
    let step = 1024 >> nb;
    let d = offset.map_or(0, |x| (x - mid).rem_euclid(1024));
    (((d + step / 2) / step) as u128) % (1 << nb)
}

/// Open (SECURITY.md, "Inode numbers of new sockets and pipes"): within one call, the copy
/// holding hr parks each CPU's inode counter at a 4-bit symbol (its offset in the batch, in
/// steps of 64) and the next copy of the call, for projx.example, reads each CPU's offset
/// from one new pipe on it: 4 bits per CPU per call. Measured by the adversarial pass:
/// 96/96 in 18 and 20 calls on 2 CPUs (about 2 s).
#[test]
#[ignore = "open channel: measures it (SECURITY.md, Inode numbers of new sockets and pipes)"]
fn inooffset_the_next_copy_of_a_call_reads_each_cpus_inode_offset_the_hr_copy_parked() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    const NB: usize = 4;
    let n = cpus();
    let calls = (96 / NB).div_ceil(n);
    let t0 = Instant::now();
    let (canary, posted) =
        within_one_call("inooffset", CALIBRATION + calls, |i| symbol_args(i, json!({"nb": NB, "percpu": 1})));
    let mids = calibration_middles(&posted);
    let mids = &mids;
    let symbols = posted[CALIBRATION..].iter().flat_map(|p| {
        let o = offsets(p);
        (0..n).map(move |c| symbol(o.get(c).copied().flatten(), mids[c], NB))
    });
    let got = symbols.take(96 / NB).fold(0u128, |acc, s| (acc << NB) | s);
    report("inooffset within one call", canary, got, &format!("{NB} bits x {n} CPUs per call"), posted.len(), t0);
}

/// Bits of the canary `got` has right, printed; most of them, asserted.
fn report(what: &str, canary: u128, got: u128, per_call: &str, calls: usize, t0: Instant) {
    let right = bits_right(canary, got, 96);
    eprintln!("{what}, {per_call}: {right}/96 bits in {calls} calls ({CALIBRATION} calibration), {:?}", t0.elapsed());
    assert!(right >= 88, "most of the canary crosses: {right}/96");
}

/// Open, the same entry: the batch index and the offsets together, 8 + 4 x CPUs bits per
/// call (16 on 2 CPUs). The hr copy first makes pipes until the host's batch index (the
/// largest `(ino - 1) >> 10` it saw) is 4 k mod 1024 for an 8-bit symbol k, then parks the
/// offsets. Measured by the adversarial pass: 96/96 in 12 calls (6 of them calibration),
/// about 30 s, the decoded canary exact.
#[test]
#[ignore = "open channel: measures it (SECURITY.md, Inode numbers of new sockets and pipes)"]
fn inooffset_batch_index_and_offsets_carry_sixteen_bits_per_call_on_two_cpus() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    const NB: usize = 4;
    const KB: usize = 8;
    let n = cpus();
    let per = KB + NB * n;
    let calls = 96usize.div_ceil(per);
    let t0 = Instant::now();
    let (canary, posted) =
        within_one_call("inooffset", CALIBRATION + calls, |i| symbol_args(i, json!({"nb": NB, "kb": KB, "percpu": 2})));
    let mids = calibration_middles(&posted);
    let got = posted[CALIBRATION..].iter().fold(0u128, |acc, p| {
        let batch = inos(p).iter().map(|x| (x - 1) >> 10).max().unwrap_or(0).rem_euclid(4 << KB);
        let o = offsets(p);
        let word =
            (0..n).fold((batch / 4) as u128, |w, c| (w << NB) | symbol(o.get(c).copied().flatten(), mids[c], NB));
        (acc << per) | word
    });
    let got = got >> (calls * per - 96);
    report(
        "inooffset batch index and offsets",
        canary,
        got,
        &format!("{per} bits per call ({KB} + {NB} x {n} CPUs)"),
        posted.len(),
        t0,
    );
}

/// Open, the same entry, from one call into the next: an hr call (one copy, its only
/// consumer cleared for hr) parks the offsets at a 3-bit symbol; the next call, of another
/// release, for a consumer cleared for nothing, reads them and sends them to stats.example
/// (cleared for nothing). Measured by the adversarial pass: 96/96 in 38 call pairs (2.3 s).
#[test]
#[ignore = "open channel: measures it (SECURITY.md, Inode numbers of new sockets and pipes)"]
fn inooffset_the_next_call_of_another_release_reads_the_inode_offset_an_hr_call_parked() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    const NB: usize = 3;
    const STEP: i64 = 1024 >> NB;
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let a = w.item("hr", "a.txt", hr.as_str());
    let none = w.data.join("public").join("none.txt");
    let code = germline_tests::attacks::source("kernel", "inooffset");
    let sender = w.release("inosend", "[tools.scan]\nhosts = []\n", &code);
    let reader = w.release("inoread", "[tools.scan]\nhosts = [\"stats.example\"]\n", &code);
    let stats = Sink::start(SinkBehaviour::default());
    let mut sender = w.start(RuntimeKind::Germline, &sender, w.policy(&[], &[("agent", &["hr"])], "")).unwrap();
    let policy = w.policy(&[("stats.example", &[], Some(stats.addr()))], &[("public", &[])], "");
    let mut reader = w.start(RuntimeKind::Germline, &reader, policy).unwrap();
    let t0 = Instant::now();
    let mut offs = Vec::new();
    for i in 0..CALIBRATION + 96 / NB {
        let send = symbol_args(i, json!({"a": a, "b": none, "nb": NB, "role": "send"}));
        let o = sender.call(&request("scan", send, &[&a]));
        assert!(o.error.is_none(), "send {i}: {:?}", o.error);
        let read = json!({"a": a, "b": none, "idx": 0, "nb": NB, "force": -1, "role": "read", "dest": "stats.example"});
        let mut req = request("scan", read, &[]);
        req.consumers = vec!["public".into()];
        let before = stats.requests().len();
        let o = reader.call(&req);
        assert!(o.error.is_none(), "read {i}: {:?}", o.error);
        let posted = stats.requests().get(before).and_then(|r| serde_json::from_slice(&r.body).ok());
        offs.push(offsets(&posted.unwrap_or(Value::Null)));
    }
    // Foreign inodes taken between the park and the read only add: the reading on the CPU
    // that took the fewest, past the calibration's floor, is the symbol.
    let floor = offs[..CALIBRATION].iter().flatten().flatten().copied().min().unwrap_or(0);
    let least = |o: &Vec<Option<i64>>| o.iter().flatten().map(|x| (x - floor).rem_euclid(1024)).min().unwrap_or(0);
    let mut cal: Vec<i64> = offs[..CALIBRATION].iter().map(least).collect();
    cal.sort();
    let mid = cal[cal.len() / 2];
    let got = offs[CALIBRATION..].iter().fold(0u128, |acc, o| {
        (acc << NB) | ((((least(o) - mid) as f64 / STEP as f64).round() as i64).rem_euclid(1 << NB)) as u128
    });
    assert!(oracle.disclosures("stats", &[], &stats.received()).is_empty(), "never the canary's text");
    report(
        "inooffset from an hr call into the next call of another release",
        canary_bits(hr.as_str()),
        got,
        &format!("{NB} bits per call pair"),
        offs.len(),
        t0,
    );
}

/// Open (SECURITY.md, "Call duration"): within one call, the hr copy ends its answer at an
/// 8-bit symbol's phase (2 ms steps) of the host's monotonic clock, and the next copy of
/// the call, for projx.example, reads that clock through libc as it starts. Measured by
/// the adversarial pass: 76/96 in 18 calls (22 s); the hand-over took 25-38 ms.
#[test]
#[ignore = "open channel: measures it (SECURITY.md, Call duration)"]
fn seqdelay_the_next_copy_of_a_call_reads_when_the_hr_copy_ended() {
    let _t = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    const NB: usize = 8;
    const STEP_US: i64 = 2000;
    const GUARD_US: i64 = 100_000;
    let period = ((1i64 << NB) * STEP_US + GUARD_US) * 1000;
    let t0 = Instant::now();
    let (canary, posted) = within_one_call("seqdelay", CALIBRATION + 96 / NB, |i| {
        symbol_args(i, json!({"nb": NB, "step_us": STEP_US, "guard_us": GUARD_US}))
    });
    let phases: Vec<i64> = posted.iter().map(|p| p["mono"].as_i64().unwrap_or(0).rem_euclid(period)).collect();
    let mut cal = phases[..CALIBRATION].to_vec();
    cal.sort();
    let zero = cal[cal.len() / 2];
    let got = phases[CALIBRATION..].iter().fold(0u128, |acc, p| {
        let d = (p - zero).rem_euclid(period) as f64 / (STEP_US * 1000) as f64;
        (acc << NB) | (d.round() as i64).clamp(0, (1 << NB) - 1) as u128
    });
    let right = bits_right(canary, got, 96);
    eprintln!("seqdelay within one call: {right}/96 bits in {} calls, {:?}", posted.len(), t0.elapsed());
    assert!(right >= 64, "well above chance (48): {right}/96");
}
