//! Issue 15, copy-on-write: on CPython 3.12 and 3.13 the germline makes every object it
//! holds immortal before its first fork (PEP 683), so a copy that uses those objects never
//! writes their reference counts and copies none of their pages. Performance only: no
//! guarantee rests on it. These tests show that it does so (and that the same copy copies
//! every page with it off), that copies serve calls from the immortal heap, and that it is
//! inert on an interpreter without immortal objects (3.11, the suite's default).
//!
//! Before its first fork the broker also backs the germline's heap with huge pages
//! (`MADV_COLLAPSE` from outside), on any interpreter: a fork shares each 2 MiB with one
//! page-table entry and a copy's exit drops one. The last test shows that it does so (and
//! not with it off), and that a copy's write into such a page stays the copy's.
//!
//! The 3.12/3.13 interpreter is `GERMLINE_PYTHON_IMMORTAL`, a venv `scripts/setup.sh` makes
//! where the machine has such a CPython; without one, the tests that need it say so and
//! return.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

use germline_executor::germline::{PythonRuntime, HUGE_HEAP_OFF, IMMORTAL_HEAP_OFF};
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_tests::world::{request, result_text, World};
use serde_json::json;

/// The CPython 3.12/3.13 venv `scripts/setup.sh` made, if this machine has one; else says
/// so, for a test that then has nothing to run.
fn immortal_python() -> Option<PathBuf> {
    let Some(p) = std::env::var_os("GERMLINE_PYTHON_IMMORTAL").map(PathBuf::from) else {
        eprintln!("no CPython 3.12 or 3.13 venv here (GERMLINE_PYTHON_IMMORTAL unset): nothing to run");
        return None;
    };
    assert!(p.is_file(), "GERMLINE_PYTHON_IMMORTAL={} is not a file", p.display());
    Some(p)
}

/// Forks a Python process holding 200,000 strings (about 3,000 pages); the child reads
/// every one and reports its own minor page faults. `immortal` calls the tool host's
/// `_immortalize_heap` before the fork, as `germline_main` does. Returns (objects made
/// immortal, the child's faults).
fn faults_of_a_reading_child(python: &Path, shim: &Path, immortal: bool) -> (u64, u64) {
    let script = r#"
import gc, os, resource, sys
sys.path.insert(0, sys.argv[1])
import germline_host
objs = [("item %d " % i) * 4 for i in range(200000)]
gc.collect()
made = germline_host._immortalize_heap() if sys.argv[2] == "on" else 0
gc.freeze()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    total = 0
    for o in objs:
        total += len(o)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    os.write(w, b"%d" % (after - before))
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
print(made, os.read(r, 64).decode())
"#;
    let out = Command::new(python)
        .args(["-I", "-c", script])
        .arg(shim)
        .arg(if immortal { "on" } else { "off" })
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = text.split_whitespace().map(|s| s.parse().expect("number")).collect();
    (v[0], v[1])
}

#[test]
fn a_child_reading_the_immortal_heap_copies_none_of_its_pages() {
    let Some(python) = immortal_python() else { return };
    let w = World::new();
    let rt = PythonRuntime::at(python.clone(), &w.dir.path().join("home")).expect("runtime");
    let (made_off, off) = faults_of_a_reading_child(&python, &rt.shim_dir, false);
    let (made_on, on) = faults_of_a_reading_child(&python, &rt.shim_dir, true);
    eprintln!("off: {off} faults; on: {on} faults ({made_on} objects made immortal)");
    assert_eq!(made_off, 0);
    assert!(made_on >= 200_000, "only {made_on} objects made immortal");
    // Off: a fault for (almost) every page the strings occupy; on: the loop's own few.
    assert!(off >= 2_000, "mechanism off: the child copied only {off} pages");
    assert!(on <= 100, "mechanism on: the child still copied {on} pages");
}

#[test]
fn without_immortal_objects_in_the_interpreter_nothing_changes() {
    // The suite's default interpreter (3.11): the call does nothing, and reports it.
    let w = World::new();
    let rt = w.python();
    let version = Command::new(&rt.python)
        .args(["-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        .output()
        .expect("python");
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    if version == "3.12" || version == "3.13" {
        eprintln!("the default interpreter is {version}: covered by the test above");
        return;
    }
    let (made, faults) = faults_of_a_reading_child(&rt.python, &rt.shim_dir, true);
    assert_eq!(made, 0, "Python {version} has no immortal objects, yet {made} were made so");
    assert!(faults >= 2_000, "Python {version}: the child copied only {faults} pages");
}

const REFS: &str = r#"
def create_server():
    m = FastMCP("refs")
    @m.tool()
    def refs() -> str:
        # FastMCP was imported in the germline: its count as this copy sees it.
        return str(sys.getrefcount(FastMCP))
    return m
"#;

#[test]
fn copies_serve_calls_from_the_germlines_immortal_objects() {
    let Some(python) = immortal_python() else { return };
    let w = World::new();
    let rel = w.release("refs", "", REFS);
    let count = |off: bool| -> Vec<u64> {
        IMMORTAL_HEAP_OFF.store(off, Ordering::SeqCst);
        let policy = w.policy(&[], &[("agent", &[])], "");
        let runtime = PythonRuntime::at(python.clone(), &w.dir.path().join("home")).expect("runtime");
        let mut rt = Runtime::start(RuntimeKind::Germline, &rel, policy, runtime).expect("start");
        IMMORTAL_HEAP_OFF.store(false, Ordering::SeqCst);
        (0..3)
            .map(|_| {
                let o = rt.call(&request("refs", json!({}), &[]));
                assert!(o.error.is_none(), "{:?}", o.error);
                result_text(&o).parse().expect("a count")
            })
            .collect()
    };
    let off = count(true);
    let on = count(false);
    eprintln!("reference count of FastMCP in copies: off {off:?}, on {on:?}");
    assert!(off.iter().all(|&c| c < 1_000), "mechanism off: {off:?}");
    assert!(on.iter().all(|&c| c >= u32::MAX as u64), "mechanism on: {on:?}");
}

/// A module-level buffer of 8 MiB made at import, in the germline: each copy reads one byte
/// of each page it is asked about, then writes it.
const POKE: &str = r#"
BUF = bytearray(b"\x01" * (8 << 20))

def create_server():
    m = FastMCP("poke")
    @m.tool()
    def poke(pages: list[int]) -> str:
        seen = [BUF[p * 4096] for p in pages]
        for p in pages:
            BUF[p * 4096] = 2
        return json.dumps(seen)
    return m
"#;

/// The germline's heap in huge pages (`AnonHugePages` of the stopped germline, with the
/// switch off: none), and every copy, forked from it, reads what the germline made, never
/// what an earlier copy wrote into the same huge page.
#[test]
fn the_germlines_heap_is_in_huge_pages_and_a_copys_writes_stay_its_own() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.is_empty() || thp.contains("[never]") {
        eprintln!("transparent huge pages are off on this host ({}): nothing to run", thp.trim());
        return;
    }
    let w = World::new();
    let rel = w.release("poke", "", POKE);
    let huge_kib = |pid: i32| -> u64 {
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).expect("the germline's smaps");
        let line = rollup.lines().find(|l| l.starts_with("AnonHugePages:")).expect("AnonHugePages");
        line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a size")
    };
    for off in [true, false] {
        HUGE_HEAP_OFF.store(off, Ordering::SeqCst);
        let policy = w.policy(&[], &[("agent", &[])], "[limits]\npool = 0\n");
        let mut rt = w.start(RuntimeKind::Germline, &rel, policy).expect("start");
        HUGE_HEAP_OFF.store(false, Ordering::SeqCst);
        let Runtime::Germline(g) = &mut rt else { panic!("not a germline runtime") };
        let pid = g.germline_pid().unwrap().expect("a germline process");
        let kib = huge_kib(pid);
        let seen: Vec<String> = (0..4)
            .map(|k| {
                let pages: Vec<u64> = (0..2048).step_by(97).map(|p| (p + k) % 2048).collect();
                let o = rt.call(&request("poke", json!({"pages": pages}), &[]));
                assert!(o.error.is_none(), "{:?}", o.error);
                result_text(&o)
            })
            .collect();
        eprintln!("huge heap off={off}: the germline holds {kib} KiB in huge pages");
        for s in &seen {
            let v: Vec<u8> = serde_json::from_str(s).expect("a list");
            assert!(v.iter().all(|&b| b == 1), "a copy read an earlier copy's write (off={off}): {s}");
        }
        if off {
            assert_eq!(kib, 0, "off: the germline's heap stays in small pages");
        } else {
            assert!(kib >= 4096, "on: at least two huge pages of the 8 MiB buffer: {kib} KiB");
        }
    }
}
