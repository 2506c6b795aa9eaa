//! Issue 15, points 1 and 2: pooled copies. A pooled copy is made, checked and past
//! `initialize` with no data; a call gives it twin inputs, then its view, then its slot;
//! it serves one group of one call and is killed. (Deadline and limits of pooled copies:
//! `executor_hostile`, which runs those tests with the pool at 0 and at 2.)

use std::time::Duration;

use germline_executor::call::GermlineRuntime;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_tests::world::{request, result_text, World};
use serde_json::{json, Value};

fn germline(rt: &mut Runtime) -> &mut GermlineRuntime {
    match rt {
        Runtime::Germline(g) => g,
        _ => panic!("not a germline runtime"),
    }
}

/// Starts `rel` under germline with `pool` ready copies and waits for them.
fn pooled(w: &World, rel: &std::path::Path, pool: usize, limits: &str) -> Runtime {
    let policy = w.policy(&[], &[("agent", &["hr"])], &format!("[limits]\npool = {pool}\n{limits}"));
    let mut rt = w.start(RuntimeKind::Germline, rel, policy).unwrap();
    let g = germline(&mut rt);
    assert_eq!(g.pooling(), pool > 0, "pooling as set");
    if pool > 0 {
        assert_eq!(g.wait_pool_ready(pool, Duration::from_secs(60)).unwrap(), pool, "the pool fills");
    }
    rt
}

const COUNTER: &str = r#"
SEEN = {"calls": 0}
def create_server():
    m = FastMCP("counter")
    @m.tool()
    def count() -> str:
        SEEN["calls"] += 1
        return str(SEEN["calls"])
    return m
"#;

/// Every call is served by a copy of its own, from the pool: what one call left in a
/// copy's memory is never seen by the next (a copy is never given back to the pool).
#[test]
fn each_pooled_copy_serves_one_call_and_is_never_reused() {
    let w = World::new();
    let rel = w.release("counter", "", COUNTER);
    let mut rt = pooled(&w, &rel, 2, "");
    for i in 0..6 {
        germline(&mut rt).wait_pool_ready(2, Duration::from_secs(60)).unwrap();
        let o = rt.call(&request("count", json!({}), &[]));
        assert_eq!(result_text(&o), "1", "call {i}: a fresh copy ({:?})", o.error);
    }
    // Unprotected, one long-lived process: the count carries over.
    let mut pin = w.start(RuntimeKind::SigPin, &rel, w.policy(&[], &[("agent", &[])], "")).unwrap();
    pin.call(&request("count", json!({}), &[]));
    assert_eq!(result_text(&pin.call(&request("count", json!({}), &[]))), "2", "mechanism off: the state carries");
}

const STARTUP: &str = r#"
import asyncio
from mcp.server.fastmcp import FastMCP as _F

ROOT = "{DATA}/hr"

async def main():
    root = ROOT
    at_start = sorted(os.listdir(root))
    m = _F("startup")
    @m.tool()
    def look() -> str:
        return json.dumps({"at_start": at_start, "at_call": sorted(os.listdir(root))})
    await m.run_stdio_async()
"#;

/// A pooled copy holds nothing until a call takes it: its server starts on empty data
/// roots and sees the call's item only once the call has given it its view. With the pool
/// off ("mechanism off" for when data arrives) the item is there from the server's start.
#[test]
fn a_pooled_copy_starts_with_nothing_and_gets_its_view_at_the_call() {
    let w = World::new();
    let secret = w.item("hr", "payslip.txt", "salary 9100");
    let rel = w.release("startup", "", STARTUP);
    let manifest = rel.join("germline.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let text = text.replace("factory = \"server:create_server\"", "main = \"server:main\"");
    assert!(text.contains("main = "), "manifest rewritten: {text}");
    std::fs::write(&manifest, text).unwrap();
    for pool in [0, 2] {
        let mut rt = pooled(&w, &rel, pool, "");
        let o = rt.call(&request("look", json!({}), &[&secret]));
        let seen: Value = serde_json::from_str(&result_text(&o)).unwrap_or(Value::Null);
        eprintln!("pool {pool}: {seen}");
        assert_eq!(seen["at_call"], json!(["payslip.txt"]), "pool {pool}: the call sees its item ({:?})", o.error);
        let at_start = if pool == 0 { json!(["payslip.txt"]) } else { json!([]) };
        assert_eq!(seen["at_start"], at_start, "pool {pool}: what the server saw when it started");
    }
}

const STARTUP_DATA: &str = r#"
import signal
WOKE = []
# Set at import, in the germline: runs in a copy when the pool lets it run (SIGCONT).
signal.signal(signal.SIGCONT, lambda *_: WOKE.append([os.getpid(), time.time()]))

async def main(root):
    at_start = sorted(os.listdir(root))
    t_start = time.time()
    m = FastMCP("startup-data")
    @m.tool()
    def look() -> str:
        woke = [t for pid, t in WOKE if pid == os.getpid()]
        return json.dumps({"at_start": at_start, "t_start": t_start, "t_call": time.time(), "woke": woke})
    await m.run_stdio_async()
"#;

/// A server that opens its data at start-up (its data directory among its `main`
/// arguments) is pooled short of starting: the pool fills before any call with copies
/// made, checked and connected, and the server starts once the call's twin inputs are
/// taken and its view is in. It sees its item at start-up; its start-up code reads the
/// twin clock (the frozen wall clock equals the call's), as does a SIGCONT handler the
/// release set in the germline, which runs when the pool lets the copy run. The copy was
/// made off the call's path (no fork in the call's phases), where with the pool off it is
/// forked in the call. Off (the twin switch), start-up reads the real clock.
#[test]
fn a_server_that_opens_its_data_at_start_up_is_pooled_short_of_starting() {
    let w = World::new();
    let secret = w.item("hr", "payslip.txt", "salary 9100");
    let rel = w.release("startup-data", "", STARTUP_DATA);
    let manifest = rel.join("germline.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let root = secret.parent().unwrap().display().to_string();
    let text = text
        .replace("factory = \"server:create_server\"", &format!("main = \"server:main\"\nmain_args = '[\"{root}\"]'"));
    assert!(text.contains("main_args"), "manifest rewritten: {text}");
    std::fs::write(&manifest, text).unwrap();
    for (pool, twin) in [(0, true), (2, false), (2, true)] {
        let mut rt = pooled(&w, &rel, pool, "");
        germline(&mut rt).evidence_switches.twin_inputs = twin;
        let o = rt.call(&request("look", json!({}), &[&secret]));
        let seen: Value = serde_json::from_str(&result_text(&o)).unwrap_or(Value::Null);
        let fork = o.timings.first().map(|t| t.fork).unwrap_or_default();
        eprintln!("pool {pool}, twin {twin}: {seen}, fork {fork:?}");
        assert_eq!(
            seen["at_start"],
            json!(["payslip.txt"]),
            "pool {pool}: the server starts with its item ({:?})",
            o.error
        );
        assert_eq!(fork.is_zero(), pool > 0, "pool {pool}: the copy was forked in the call: {fork:?}");
        let (t_start, t_call) = (seen["t_start"].as_f64().unwrap(), seen["t_call"].as_f64().unwrap());
        assert_eq!(
            t_start == t_call,
            twin,
            "pool {pool}, twin {twin}: start-up read the twin clock ({t_start} {t_call})"
        );
        let woke = seen["woke"].as_array().unwrap();
        if pool > 0 && twin {
            assert!(!woke.is_empty(), "the copy was let run: {seen}");
            assert!(woke.iter().all(|t| t.as_f64() == Some(t_call)), "the handler read the twin clock: {seen}");
        }
    }
}

const CLOCK: &str = r#"
import datetime, random
def create_server():
    m = FastMCP("clock")
    @m.tool()
    def read() -> str:
        t1 = time.time()
        d1 = datetime.datetime.now().isoformat()
        r1 = random.random()
        time.sleep(0.05)
        t2 = time.time()
        d2 = datetime.datetime.now().isoformat()
        return json.dumps({"t": [t1, t2], "d": [d1, d2], "r": r1, "u": os.urandom(8).hex()})
    return m
"#;

/// Twin inputs reach a pooled copy before any release code of the call runs: the wall
/// clock and `datetime.now` read the call's frozen value (equal around a sleep), and
/// random and `os.urandom` come from the call's seed (equal in the two copies a call with
/// two groups would make: here two calls given the same twin inputs by a replay are not
/// available, so the seed shows as equal readings of the frozen clock only). Off (the twin
/// switch), the pooled copy reads the real clock.
#[test]
fn a_pooled_copy_reads_the_twin_clock_from_the_first_line_of_the_call() {
    let w = World::new();
    let rel = w.release("clock", "", CLOCK);
    for twin in [false, true] {
        let mut rt = pooled(&w, &rel, 2, "");
        germline(&mut rt).evidence_switches.twin_inputs = twin;
        let o = rt.call(&request("read", json!({}), &[]));
        let v: Value = serde_json::from_str(&result_text(&o)).unwrap_or(Value::Null);
        eprintln!("twin {twin}: {v}");
        let (t1, t2) = (v["t"][0].as_f64().unwrap(), v["t"][1].as_f64().unwrap());
        assert_eq!(
            t1 == t2,
            twin,
            "twin {twin}: the wall clock {} frozen ({t1} {t2})",
            if twin { "is" } else { "is not" }
        );
        assert_eq!(v["d"][0] == v["d"][1], twin, "twin {twin}: datetime.now ({})", v["d"]);
    }
}

const LOOK: &str = r#"
import json
SEEN = {"calls": 0, "first": None}
def create_server():
    m = FastMCP("look")
    @m.tool()
    def look(path: str) -> str:
        SEEN["calls"] += 1
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            text = "unreadable"
        if SEEN["first"] is None:
            SEEN["first"] = text
        return json.dumps({"calls": SEEN["calls"], "first": SEEN["first"], "now": text})
    return m
"#;

/// A tool's manifest `warm_up` call runs in every pooled copy while it is readied, before
/// it holds anything: the call that follows finds the server's first-call state made, and
/// that state was made without the item (the same read in the call sees it). Copies made
/// per call have no warm-up.
#[test]
fn a_declared_warm_up_call_runs_in_each_pooled_copy_before_it_holds_anything() {
    let w = World::new();
    let secret = w.item("hr", "secret.txt", "GLC-hr-warm-up");
    let tools = format!("[tools.look]\nwarm_up = {{ path = \"{}\" }}\n", secret.display());
    let with = w.release("look-warm", &tools, LOOK);
    let without = w.release("look", "", LOOK);
    let look = |rt: &mut Runtime| -> Value {
        let o = rt.call(&request("look", json!({"path": secret.to_string_lossy()}), &[&secret]));
        serde_json::from_str(&result_text(&o)).unwrap_or_else(|e| panic!("{e}: {o:?}"))
    };
    let mut rt = pooled(&w, &with, 2, "");
    for _ in 0..2 {
        germline(&mut rt).wait_pool_ready(2, Duration::from_secs(60)).unwrap();
        let v = look(&mut rt);
        assert_eq!(v["calls"], 2, "the warm-up call came first: {v}");
        assert_eq!(v["first"], "unreadable", "the warm-up ran with no view: {v}");
        assert_eq!(v["now"], "GLC-hr-warm-up", "the call reads its item: {v}");
    }
    let mut rt = pooled(&w, &without, 2, "");
    let v = look(&mut rt);
    assert_eq!(
        (v["calls"].clone(), v["first"].clone()),
        (json!(1), json!("GLC-hr-warm-up")),
        "no warm-up declared: {v}"
    );
    let mut rt = pooled(&w, &with, 0, "");
    let v = look(&mut rt);
    assert_eq!(v["calls"], 1, "a copy made per call has no warm-up: {v}");
}

const THREADS: &str = r#"
import threading
def create_server():
    m = FastMCP("threads")
    @m.tool()
    def threads(text: str) -> str:
        return json.dumps({"threads": threading.active_count(), "length": len(text)})
    return m
"#;

/// A copy's SDK serves the channel on its own event loop: no worker thread reads the
/// request or writes the answer (the SDK's stdio transport reads and writes in anyio
/// worker threads, two hand-offs per message), pooled and forked per call alike. A request
/// far larger than one read of the socket arrives whole. Unprotected (sig-pin, the SDK on
/// real stdio) the worker thread is there.
#[test]
fn a_copys_sdk_serves_its_channel_on_the_event_loop() {
    let w = World::new();
    let rel = w.release("threads", "", THREADS);
    let big = "x".repeat(300_000);
    let threads = |rt: &mut Runtime| -> Value {
        let o = rt.call(&request("threads", json!({"text": big}), &[]));
        serde_json::from_str(&result_text(&o)).unwrap_or_else(|e| panic!("{e}: {o:?}"))
    };
    for pool in [0, 2] {
        let mut rt = pooled(&w, &rel, pool, "");
        let v = threads(&mut rt);
        assert_eq!(v, json!({"threads": 1, "length": 300_000}), "pool {pool}: one thread, the whole request");
    }
    let mut pin = w.start(RuntimeKind::SigPin, &rel, w.policy(&[], &[("agent", &[])], "")).unwrap();
    let v = threads(&mut pin);
    assert!(v["threads"].as_u64().unwrap() > 1, "unprotected, a worker thread reads stdin: {v}");
    assert_eq!(v["length"], 300_000);
}

/// A germline that died (killed from outside between calls, as the OOM killer or an
/// operator might) is started again at the next call, which is answered by a copy of the
/// new germline; no copy of the dead one is handed out. With the restart switched off
/// (`GermlineRuntime::set_restart`), the call fails and says the germline is gone.
#[test]
fn a_germline_that_died_is_started_again_at_the_next_call() {
    let w = World::new();
    let rel = w.release("counter", "", COUNTER);
    for (pool, restart) in [(0, true), (2, true), (2, false)] {
        let mut rt = pooled(&w, &rel, pool, "");
        germline(&mut rt).set_restart(restart);
        let first = germline(&mut rt).germline_pid().unwrap().expect("a germline process");
        assert_eq!(result_text(&rt.call(&request("count", json!({}), &[]))), "1", "pool {pool}: before");
        // SAFETY: SIGKILL to the germline this test started.
        assert_eq!(unsafe { libc::kill(first, libc::SIGKILL) }, 0);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{first}/status")).exists() {
            assert!(std::time::Instant::now() < until, "the germline did not die");
            std::thread::sleep(Duration::from_millis(5));
        }
        let o = rt.call(&request("count", json!({}), &[]));
        if !restart {
            let e = o.error.unwrap_or_default();
            assert!(e.contains("the germline is gone") && e.contains("signal 9"), "mechanism off: {e}");
            continue;
        }
        assert_eq!(result_text(&o), "1", "pool {pool}: answered by a new germline ({:?})", o.error);
        let second = germline(&mut rt).germline_pid().unwrap().expect("a germline process");
        assert_ne!(first, second, "pool {pool}: a new germline");
        assert_eq!(result_text(&rt.call(&request("count", json!({}), &[]))), "1", "pool {pool}: after");
    }
}

const SESSIONS: &str = r#"
RUNS = []
def create_server():
    m = FastMCP("sessions")
    real = m._mcp_server.run
    async def counted(*args, **kwargs):
        RUNS.append(os.getpid())
        return await real(*args, **kwargs)
    m._mcp_server.run = counted
    @m.tool()
    def runs() -> str:
        return json.dumps(RUNS)
    return m
"#;

const LIFESPAN: &str = r#"
import contextlib
RUNS = []
@contextlib.asynccontextmanager
async def lifespan(server):
    RUNS.append(os.getpid())
    yield {}
def create_server():
    m = FastMCP("lifespan", lifespan=lifespan)
    @m.tool()
    def runs() -> str:
        return json.dumps(RUNS)
    return m
"#;

/// Before its first fork the germline answers one data-free MCP session of the SDK's own
/// (`_warm_session`), so every copy starts with the request path's bytecode specialized
/// and the SDK's caches filled instead of doing it in pages it copies on write. It never
/// runs release code for that: a server with a lifespan of its own (which runs with every
/// session, and may open its data) is left alone, and its lifespan runs in the copy only.
#[test]
fn the_germline_warms_the_sdk_with_one_session_and_never_runs_a_releases_lifespan() {
    let w = World::new();
    for pool in [0, 2] {
        let rel = w.release("sessions", "", SESSIONS);
        let mut rt = pooled(&w, &rel, pool, "");
        let o = rt.call(&request("runs", json!({}), &[]));
        // The germline is pid 2 of its PID namespace; a copy is pid 1 of its own.
        assert_eq!(
            result_text(&o),
            "[2, 1]",
            "pool {pool}: one session in the germline, one in the copy ({:?})",
            o.error
        );
        let rel = w.release("lifespan", "", LIFESPAN);
        let mut rt = pooled(&w, &rel, pool, "");
        let o = rt.call(&request("runs", json!({}), &[]));
        assert_eq!(result_text(&o), "[1]", "pool {pool}: the release's lifespan runs in the copy only ({:?})", o.error);
    }
}

/// Dropping a runtime right after its calls returns at once: a copy being readied that the
/// last call stopped (it runs on only once no copy holds data) is killed with the pool, so
/// the refill thread's read of it ends then, not at the readying deadline (30 s). Calls
/// back to back leave such a copy most times; five rounds make it all but certain.
#[test]
fn a_runtime_dropped_right_after_calls_goes_at_once() {
    let w = World::new();
    let rel = w.release("counter", "", COUNTER);
    for round in 0..5 {
        let mut rt = pooled(&w, &rel, 2, "");
        for i in 0..3 {
            let o = rt.call(&request("count", json!({}), &[]));
            assert_eq!(result_text(&o), "1", "round {round}, call {i} ({:?})", o.error);
        }
        let t = std::time::Instant::now();
        drop(rt);
        let took = t.elapsed();
        assert!(took < Duration::from_secs(10), "round {round}: the drop took {took:?}");
    }
}

const SLOW_WARM_UP: &str = r#"
def create_server():
    m = FastMCP("slow")
    @m.tool()
    def slow() -> str:
        time.sleep(3)
        return "warm"
    @m.tool()
    def count() -> str:
        return "1"
    return m
"#;

/// The germline's children now (a copy is one while it lives), on every thread.
fn children(germline: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{germline}/task")).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    out
}

/// Kills the next copy `germline` makes (a child not in `seen`), half a second into its
/// readying.
fn kill_next(germline: i32, seen: &mut Vec<i32>, what: &str) {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let copy = loop {
        if let Some(c) = children(germline).into_iter().find(|c| !seen.contains(c)) {
            break c;
        }
        assert!(std::time::Instant::now() < until, "{what}: no copy made");
        std::thread::sleep(Duration::from_millis(5));
    };
    seen.push(copy);
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: SIGKILL to a copy of a germline the test started.
    assert_eq!(unsafe { libc::kill(copy, libc::SIGKILL) }, 0, "{what}: the copy is there to kill");
    eprintln!("{what}: killed copy {copy}");
}

/// One copy that fails its readying (here killed from outside during its 3-second warm-up
/// call) says little about the release: the pool readies the next copy past `initialize`
/// as before. Two failures in a row do: copies are then readied short of starting their
/// server. (Before, the first failure alone made every later copy of the release start its
/// server inside the call, for the rest of the germline's life.)
#[test]
fn one_copy_that_fails_readying_does_not_make_the_pool_ready_less() {
    use germline_executor::pool::Readiness;
    let w = World::new();
    let rel = w.release("slow", "[tools.slow]\nwarm_up = {}\n", SLOW_WARM_UP);
    let policy = w.policy(&[], &[("agent", &[])], "[limits]\npool = 1\n");
    let mut rt = w.start(RuntimeKind::Germline, &rel, policy).unwrap();
    let g = germline(&mut rt);
    let germ = g.germline_pid().unwrap().expect("a germline process");
    let mut seen: Vec<i32> = Vec::new();
    kill_next(germ, &mut seen, "the first copy");
    assert_eq!(g.wait_pool_ready(1, Duration::from_secs(60)).unwrap(), 1, "the pool fills");
    assert_eq!(g.readiness().unwrap(), Readiness::Initialized, "one failure: the next copy is readied as before");
    // The ready copy: taken by the call (and dead after it), never a copy to kill.
    seen.extend(children(germ));
    let o = g.call(&request("count", json!({}), &[]));
    assert_eq!(result_text(&o), "1", "a pooled call ({:?})", o.error);
    // The copies readied after that call: two failures in a row.
    kill_next(germ, &mut seen, "the first copy after the call");
    kill_next(germ, &mut seen, "the second copy after the call");
    assert_eq!(g.wait_pool_ready(1, Duration::from_secs(60)).unwrap(), 1, "the pool fills");
    assert_eq!(g.readiness().unwrap(), Readiness::Connected, "two failures in a row: readied short of starting");
    let o = g.call(&request("count", json!({}), &[]));
    assert_eq!(result_text(&o), "1", "a call on a copy readied short of starting ({:?})", o.error);
}
