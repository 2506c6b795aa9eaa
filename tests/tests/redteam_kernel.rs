//! Kernel channels found by an adversarial pass over issue 11 (see SECURITY.md,
//! "Kernel channels (issue 11)" under "Adversarial passes"). Each test runs a release from
//! `tests/attacks/kernel/<name>/server.py` with the mechanism off and asserts the canary
//! reaches a party not cleared for it, then under the full germline runtime.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use germline_executor::call::GermlineRuntime;
use germline_executor::confine::SandboxSwitches;
use germline_executor::germline::PID_COUNTER_RESET_OFF_FOR_TESTS;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_executor::seccomp::SeccompPolicy;
use germline_tests::attacks::Hold;
use germline_tests::oracle::Oracle;
use germline_tests::world::{request, result_text, World};
use serde_json::{json, Value};

/// Process-wide switches: tests in this file take turns.
static SWITCH: Mutex<()> = Mutex::new(());

fn germline(rt: &mut Runtime) -> &mut GermlineRuntime {
    match rt {
        Runtime::Germline(g) => g,
        _ => panic!("not a germline runtime"),
    }
}

/// One attack world: an hr canary in `data/hr/secret.txt` and the release `name`.
struct Case {
    w: World,
    oracle: Oracle,
    canary: String,
    secret: PathBuf,
    release: PathBuf,
}

fn case(name: &str, code: &str) -> Case {
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let secret = w.item("hr", "secret.txt", hr.as_str());
    let release = w.release(name, "", code);
    Case { canary: hr.as_str().to_owned(), w, oracle, secret, release }
}

impl Case {
    fn start(&self) -> Runtime {
        let policy = self.w.policy(&[], &[("agent", &["hr"]), ("public", &[])], "");
        self.w.start(RuntimeKind::Germline, &self.release, policy).expect("germline starts")
    }

    /// [`Case::start`] with `pool` ready copies per germline.
    fn start_pooled(&self, pool: usize) -> Runtime {
        let limits = format!("[limits]\npool = {pool}\n");
        let policy = self.w.policy(&[], &[("agent", &["hr"]), ("public", &[])], &limits);
        self.w.start(RuntimeKind::Germline, &self.release, policy).expect("germline starts")
    }

    /// A call whose only consumer is the public one.
    fn public_call(&self, rt: &mut Runtime, tool: &str, args: Value) -> (String, Option<String>) {
        let mut req = request(tool, args, &[]);
        req.consumers = vec!["public".into()];
        let o = rt.call(&req);
        (result_text(&o), o.error.map(|e| e.to_string()))
    }

    fn secret_call(&self, rt: &mut Runtime, tool: &str, mut args: Value) -> (String, Option<String>) {
        args["document"] = json!(self.secret);
        let o = rt.call(&request(tool, args, &[&self.secret]));
        (result_text(&o), o.error.map(|e| e.to_string()))
    }

    fn leaked(&self, text: &str) -> bool {
        !self.oracle.disclosures("public", &[], text.as_bytes()).is_empty()
    }
}

/// Sets `GERMLINE_SANDBOX_IDS` while it lives (tests in this file take turns).
struct SandboxIdsFor;

impl SandboxIdsFor {
    fn set(id: Option<u32>) -> SandboxIdsFor {
        if let Some(id) = id {
            std::env::set_var(germline_executor::confine::SANDBOX_IDS_VAR, format!("{id}:{id}"));
        }
        SandboxIdsFor
    }
}

impl Drop for SandboxIdsFor {
    fn drop(&mut self) {
        std::env::remove_var(germline_executor::confine::SANDBOX_IDS_VAR);
    }
}

/// How many nibbles of the canary the receiver decoded in order: the longest common
/// subsequence of what it decoded and the canary's 24 hex digits. A run on a loaded host
/// can miss or misread a symbol and lose the rest of its frame; 18 or more (72 bits in
/// order) is a disclosure all the same, and two unrelated 24-digit strings share about 8 (at most 12 in 20,000 draws).
fn crossed(c: &Case, got: &Value) -> usize {
    let hex: Vec<u8> = c.canary.rsplit('-').next().unwrap_or("").bytes().collect();
    let partial: Vec<u8> = got["partial"].as_str().unwrap_or("").bytes().collect();
    let mut row = vec![0usize; hex.len() + 1];
    for &p in &partial {
        let mut diag = 0;
        for (j, &h) in hex.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = if p == h { diag + 1 } else { up.max(row[j]) };
            diag = up;
        }
    }
    row[hex.len()]
}

fn attack(name: &str) -> String {
    germline_tests::attacks::source("kernel", name)
}

// --- reap: a copy's exit status reaches the germline -------------------------------------

/// Twelve calls that hold the item each end their copy with one byte of it as exit
/// status; a later call's copy, public consumer, returns what the germline reaped. Off: the germline may reap its copies (SIGCHLD not ignored) and the
/// canary arrives whole (96 of 96 bits). On: the germline is refused before any copy.
///
/// The off run forks per call (pool 0), so every fork window reaps exactly the copy
/// before it and the reading copy is forked after the twelfth: with ready copies, a
/// refill that a call overtakes reaps two copies in one window (their bytes come back
/// swapped), and the reading copy may be one readied before the planting calls (it
/// returns nothing). Both happened in CI and by hand (2 runs of 12 each); the on run
/// keeps the configured pool.
fn reap_run(check_off: bool, exit_signal: bool) -> (Case, String, Option<String>) {
    let code = attack("reap");
    let c = if exit_signal {
        case("reap-exitsig", &code.replace("\nEXIT_SIGNAL = None\n", "\nEXIT_SIGNAL = signal.SIGUSR2\n"))
    } else {
        case("reap", &code)
    };
    let _hold = Hold::set(&germline_executor::germline::CHILD_EXIT_CHECK_OFF_FOR_TESTS, check_off);
    let mut rt = if check_off { c.start_pooled(0) } else { c.start() };
    for i in 0..12 {
        // The planting copy ends without an answer (that is how it sends); only a refusal
        // of the germline ends the run.
        let (text, err) = c.secret_call(&mut rt, "plant", json!({"index": i}));
        if err.as_deref().is_some_and(|e| e.contains("germline refused")) {
            return (c, text, err);
        }
    }
    let (text, err) = c.public_call(&mut rt, "read", json!({}));
    (c, text, err)
}

fn check_reap(exit_signal: bool, refusal: &str) {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    // The positive control gets two tries (see `reap_run` for what made it miss before it
    // forked per call).
    for attempt in 1..=2 {
        let (c, text, err) = reap_run(true, exit_signal);
        assert!(err.is_none(), "off: {err:?} {text}");
        let got: Value = serde_json::from_str(&text).unwrap();
        if attempt == 1 && got["got"] != json!(c.canary) {
            eprintln!("reap (exit signal {exit_signal}) off, try 1: expected {}, got {text}", c.canary);
            continue;
        }
        assert!(c.leaked(&text), "off: the canary {} reaches the public consumer: {text}", c.canary);
        assert_eq!(got["got"], json!(c.canary), "off: 96 of 96 bits");
        eprintln!("reap (exit signal {exit_signal}) off: 96/96 bits in 12 calls ({text})");
        break;
    }

    let (c, text, err) = reap_run(false, exit_signal);
    assert!(!c.leaked(&text), "on: {text}");
    let err = err.unwrap_or_default();
    assert!(err.contains(refusal), "on: the germline is refused at the first fork: {err} {text}");
    eprintln!("reap (exit signal {exit_signal}) on: 0 bits ({err})");
}

#[test]
fn reap_a_copys_exit_status_reaches_a_later_copy_only_with_the_check_off() {
    check_reap(false, "SIGCHLD is not ignored");
}

#[test]
fn reap_a_copy_cloned_with_another_exit_signal_is_refused() {
    check_reap(true, "not SIGCHLD");
}

// --- live pairs: a sender copy and a receiver copy of two germlines at once --------------

/// Runs `receive` (public consumer) on one germline and, once it polls, `send` (holding the
/// item) on another germline of the same release, both under `seccomp`; returns the
/// receiver's JSON and the sender's text.
fn live_pair_with(c: &Case, seccomp: SeccompPolicy, rounds: u32, switches: SandboxSwitches) -> (Value, String) {
    let start = || {
        let policy = c.w.policy(&[], &[("agent", &["hr"]), ("public", &[])], "");
        c.w.start_with(RuntimeKind::Germline, &c.release, policy, switches).expect("germline starts")
    };
    let mut sender = start();
    let mut receiver = start();
    for rt in [&mut sender, &mut receiver] {
        germline(rt).set_seccomp_policy(seccomp.clone());
        let (_, err) = c.public_call(rt, "receive", json!({"rounds": 0}));
        assert!(err.is_none(), "warm-up: {err:?}");
    }
    let (sent, got) = std::thread::scope(|s| {
        let b = s.spawn(|| {
            let mut req = request("receive", json!({"rounds": rounds}), &[]);
            req.consumers = vec!["public".into()];
            receiver.call(&req)
        });
        std::thread::sleep(Duration::from_millis(1500));
        let a = s.spawn(|| {
            let req = request("send", json!({"document": c.secret}), &[&c.secret]);
            sender.call(&req)
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(sent.error.is_none() && got.error.is_none(), "{:?} {:?}", sent.error, got.error);
    let text = result_text(&got);
    (serde_json::from_str(&text).unwrap_or_else(|_| panic!("receiver: {text}")), result_text(&sent))
}

/// Off (the earlier denylist filter, the broker's RLIMIT_SIGPENDING) the canary crosses
/// whole between two live copies of two germlines; on (the allowlist) not one nibble does.
fn check_live_pair(name: &str, rounds: u32, refused_note: &str) {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    for (seccomp, off) in [(SeccompPolicy::denylist_only(), true), (SeccompPolicy::germline(), false)] {
        // Off also leaves the broker's RLIMIT_SIGPENDING in place, as before this pass.
        let _limits = Hold::set(&germline_executor::confine::SIGNAL_QUEUE_LIMITS_OFF_FOR_TESTS, off);
        // The protocol runs on shared 40 ms frames; on a loaded host a run can lose a
        // symbol, so the positive control gets three tries.
        let tries = if off { 3 } else { 1 };
        for attempt in 1..=tries {
            let c = case(name, &attack(name));
            // Off also runs copies as the one sandbox uid (per-copy ids keep descriptors in
            // flight, a per-user count, apart as well).
            let switches = SandboxSwitches { copy_ids: !off, ..Default::default() };
            let (got, sent) = live_pair_with(&c, seccomp.clone(), rounds, switches);
            let text = got.to_string();
            let leaked = c.leaked(&text);
            if off {
                let bits = 4 * crossed(&c, &got);
                if !leaked && bits < 72 && attempt < tries {
                    eprintln!("{name} off, try {attempt}: {bits} bits ({text}; sender {sent})");
                    continue;
                }
                assert!(leaked || bits >= 72, "{name} off: the canary crosses ({text}; sender {sent})");
                eprintln!("{name} off: {bits}/96 bits on try {attempt} (sender {sent})");
                break;
            }
            assert!(!leaked, "{name} on: {text}");
            assert_eq!(got["nibbles"], json!(0), "{name} on: not one nibble crossed ({text}; sender {sent})");
            let notes = format!("{text} {sent}");
            assert!(notes.contains(refused_note), "{name} on: the release is refused ({notes})");
            eprintln!("{name} on: 0 bits ({notes})");
        }
    }
}

#[test]
fn inflight_descriptors_counted_per_host_user_carry_nothing_between_germlines() {
    check_live_pair("inflight", 550, "EPERM");
}

#[test]
fn pending_signals_counted_per_host_user_carry_nothing_between_germlines() {
    check_live_pair("sigpending", 550, "EPERM");
}

// --- pidgap: the pid counter between two fork windows ------------------------------------

/// Three calibration calls, 48 calls that each start 5000 × (two bits of the item)
/// threads in a copy holding the item, then a public call whose copy reads the gaps
/// between the pids the germline saw in its fork windows. With the germline's pid counter
/// reset before every fork the gaps no longer depend on the item; with the reset off the
/// canary reaches the public consumer. The attack decodes one fork per call, so the off
/// and on runs fork per call (pool 0); a third run with the pool on (its refills fork
/// between calls) must carry nothing either.
#[test]
fn pidgap_threads_a_copy_starts_move_the_pid_the_germline_sees_next() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    for (reset, pool) in [(false, 0), (true, 0), (true, 2)] {
        PID_COUNTER_RESET_OFF_FOR_TESTS.store(!reset, Ordering::SeqCst);
        let c = case("pidgap", &attack("pidgap"));
        let started = c.start_pooled(pool);
        PID_COUNTER_RESET_OFF_FOR_TESTS.store(false, Ordering::SeqCst);
        let mut rt = started;
        for _ in 0..3 {
            let (_, err) = c.public_call(&mut rt, "tick", json!({}));
            assert!(err.is_none(), "{err:?}");
        }
        for i in 0..48 {
            let (_, err) = c.secret_call(&mut rt, "send", json!({"index": i}));
            assert!(err.is_none(), "{err:?}");
        }
        let (text, err) = c.public_call(&mut rt, "read", json!({"first": 3}));
        assert!(err.is_none(), "{err:?}");
        eprintln!("pidgap reset={reset} pool={pool}: canary {} read {text}", c.canary);
        if reset {
            assert!(!c.leaked(&text), "on: the pids the germline sees carry nothing: {text}");
        } else {
            assert!(c.leaked(&text), "off: the canary reaches the public consumer: {text}");
        }
    }
}

// --- probe: sibling mechanisms the sandbox already refuses -------------------------------

/// Every mechanism in `probe/server.py` that could reach a kernel object shared with
/// another copy is refused under the full germline (what each returned goes into
/// SECURITY.md's table); the per-user pipe quota and epoll instances remain (out of scope).
#[test]
fn sibling_mechanisms_are_refused_under_the_full_germline() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let c = case("probe", &attack("probe"));
    let mut rt = c.start();
    let (text, err) = c.public_call(&mut rt, "probe", json!({}));
    assert!(err.is_none(), "{err:?}");
    eprintln!("probe on: {text}");
    let got: Value = serde_json::from_str(&text).unwrap();
    let refused = [
        "unix socket",
        "udp socket",
        "netlink socket",
        "packet socket",
        "vsock socket",
        "scm_rights",
        "unshare user",
        "setresuid other",
        "setns",
        "keyctl",
        "add_key",
        "timer_create",
        "timerfd_create",
        "inotify_init1",
        "fanotify_init",
        "mq_open",
        "shmget",
        "semget",
        "msgget",
        "io_uring_setup",
        "userfaultfd",
        "perf_event_open",
        "bpf",
        "ptrace",
        "process_vm_readv",
        "kcmp",
        "setpriority",
        "sched_setaffinity",
        "sched_setscheduler",
        "ioprio_set",
        "sysinfo",
        "sethostname",
        "splice",
        "vmsplice",
        "tee",
        "mincore",
        "sendmsg",
        "rt_sigqueueinfo",
        "kill SIGRTMIN",
        "madvise MERGEABLE",
        "prctl PR_SET_TIMERSLACK",
        "prctl PR_SET_VMA",
        "fcntl F_SETPIPE_SZ",
        "MAP_HUGETLB",
    ];
    for k in refused {
        assert_eq!(got[k], json!("EPERM"), "{k}: {text}");
    }
    for k in ["proc", "sys"] {
        assert_eq!(got[k], json!("ENOENT"), "{k}: {text}");
    }
    // The call germline forks copies with is allowed, but a copy's user namespace allows
    // no namespace below it (its `user.max_*_namespaces` are 0): ENOSPC.
    for k in ["clone user namespace", "clone user+net namespaces"] {
        assert_eq!(got[k], json!("ENOSPC"), "{k}: {text}");
    }
    // Root of its own user namespace, mapped to host ids of its own; a full-size pipe.
    assert_eq!(got["ids"], json!("(0, 0, 0) (0, 0, 0)"), "{text}");
    assert_eq!(got["pipe"], json!("ok 65536"), "{text}");
    assert_eq!(got["dev"], json!("null,random,urandom,zero"), "{text}");
    assert_ne!(got["connect other port"], json!("ok"), "{text}");
    assert_ne!(got["write /dev/urandom"], json!("ok"), "{text}");
    assert_ne!(got["raise RLIMIT_NOFILE"], json!("ok"), "{text}");
    assert_eq!(got["write /dev/null"], json!("ok"), "{text}");
}

// --- pipequota: the per-user pipe buffer quota -------------------------------------------

/// A live pair on two germlines: the sender keeps 944 + level default pipes open (a child
/// of its copy holds most of them), the receiver counts the full-size pipes it still gets.
/// Off (copies run as the germline's sandbox uid, as before per-copy ids) the canary
/// crosses whole; on (each copy switches to host ids of its own before it is given data)
/// the receiver's quota never moves: not one nibble.
#[test]
fn pipequota_pipe_buffers_counted_per_host_user_carry_nothing_between_copies() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    for off in [true, false] {
        let tries = if off { 4 } else { 1 };
        for attempt in 1..=tries {
            let c = case("pipequota", &attack("pipequota"));
            let switches = SandboxSwitches { copy_ids: !off, ..Default::default() };
            // Off: the two germlines share sandbox ids no other process on the host uses, so
            // pipes held by unrelated germlines (other test runs) do not shift the levels.
            let _ids = SandboxIdsFor::set(off.then(|| 1_800_000_000 + std::process::id() % 100_000));
            let (got, sent) = live_pair_with(&c, SeccompPolicy::germline(), 550, switches);
            let text = got.to_string();
            let leaked = c.leaked(&text);
            if off {
                // The levels the receiver read: each is 16 * phase + nibble of the item (plus
                // one) while the sender holds it. On a quiet host the off run decodes the
                // canary whole (96/96 bits in one call); on a loaded one frames slip and a
                // run may lose symbols, but the receiver still reads the sender's levels.
                let mut levels: Vec<i64> =
                    got["samples"].as_array().map_or(vec![], |a| a.iter().filter_map(Value::as_i64).collect());
                levels.sort_unstable();
                levels.dedup();
                let bits = 4 * crossed(&c, &got);
                if !leaked && bits < 72 && levels.len() < 8 && attempt < tries {
                    eprintln!(
                        "pipequota off, try {attempt}: {bits} bits in order, {} levels ({text}; sender {sent})",
                        levels.len()
                    );
                    continue;
                }
                assert!(
                    leaked || bits >= 72 || levels.len() >= 8,
                    "pipequota off: the receiver reads the sender's pipe count ({text}; sender {sent})"
                );
                eprintln!(
                    "pipequota off: {bits}/96 bits decoded in order on try {attempt}; {} distinct levels read (sender {sent})",
                    levels.len()
                );
                break;
            }
            assert!(!leaked, "pipequota on: {text}");
            assert_eq!(got["nibbles"], json!(0), "pipequota on: not one nibble crossed ({text}; sender {sent})");
            assert_eq!(got["samples"], json!([]), "pipequota on: the receiver never reads a level ({text})");
            eprintln!("pipequota on: 0 bits ({text}; sender {sent})");
        }
    }
}
