//! Page-cache residency of the germline's root, an open channel (SECURITY.md, "Page-cache
//! residency"). Found by the adversarial pass on the per-copy cgroups: page-cache pages the
//! germline faults in during a fork window are charged to the copy's memory cgroup and stay
//! there after the germline leaves; the copy, once it holds the item, evicts them (or not)
//! by filling its own cgroup to its limit; the germline counts its major faults on them in
//! the next fork window and every later copy inherits the count
//! (`tests/attacks/kernel/memcgevict`).
//!
//! A second release loads pages instead (`tests/attacks/kernel/pageload`): the copy holding
//! the item reads a cold region iff a bit is 1, the germline counts its major faults on it
//! in the next fork window. It needs no cgroup.
//!
//! A resident root (`[sandbox] resident_root`, [`germline_executor::resident`]) closes both:
//! every page a copy can read is in memory and locked before the germline starts, so there
//! is no cold page to load and no evictable one. Each attack runs with it off (the canary's
//! bits come back) and on (no region to use). `MEMCG_BITS=96` carries the whole canary
//! (default 16 bits); the measurements with the departure off, pooled and without cgroups
//! stay ignored: `cargo test --workspace --locked --test redteam_residency -- --ignored`.
//!
//! Found by the adversarial pass on the resident root: slow symbolic links (closed by its
//! walk reading every link; tested off and on, dropping the host's caches first) and
//! negative dentries (closed by binding the root from the broker's in-memory tree, a tmpfs;
//! tested off and on; the ignored test at the end measures the default root).

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

/// Runs the whole exchange with `name` on a germline whose root is resident or not;
/// returns (read output, leaked?).
fn run_attack(name: &str, pool: usize, bits: usize, resident: bool) -> (Value, bool) {
    let w = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let secret = w.item("hr", "secret.txt", hr.as_str());
    // `rellink` and `negdentry2` are variants of `certlink` and `negdentry`.
    let (source, links, receiver) = match name {
        "rellink" => ("certlink", "release", ""),
        "certlink" => ("certlink", "host", ""),
        "negdentry2" => ("negdentry", "", "copy"),
        n => (n, "", "germline"),
    };
    let scaffold = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("attacks/kernel/window.py");
    let scaffold = std::fs::read_to_string(&scaffold).expect("the fork-window scaffolding");
    let code = format!("{scaffold}\n{}", attack(source))
        .replace("{NONCE}", &nonce().to_string())
        .replace("{LINKS}", links)
        .replace("{RECEIVER}", receiver);
    let release = w.release(name, "", &code);
    if name == "rellink" {
        // The release's own slow links (admission keeps links that stay inside it).
        let target = format!("{}server.py", "./".repeat(48));
        for k in 0..140 {
            std::os::unix::fs::symlink(&target, release.join(format!("L{k:03}"))).unwrap();
        }
    }
    if name == "rellink" || name == "certlink" {
        // Cold link blocks, as on a host rebooted since: the whole host's caches dropped.
        let _ = std::process::Command::new("sync").status();
        std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches (root)");
    }
    let limits = format!("[limits]\npool = {pool}\n[sandbox]\nresident_root = {resident}\n");
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
        "{name} resident={resident} pool={pool} bits={bits} calibration {:?} sends {:?} ({:?}/call)\nticks {ticks:?} flushes {flushes:?} sends {sends:?}\nread: {}",
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

fn run(pool: usize, bits: usize) -> (Value, bool) {
    run_attack("memcgevict", pool, bits, false)
}

/// Regions the germline used: those it found cold (`memcgevict`) or picked (`pageload`).
fn regions(v: &Value) -> usize {
    v["read"]["wins"].as_array().map_or(0, |w| w.iter().filter(|w| w[0].as_i64().unwrap_or(-1) >= 0).count())
}

fn bits() -> usize {
    std::env::var("MEMCG_BITS").ok().and_then(|s| s.parse().ok()).unwrap_or(16)
}

/// Off (the whole of `/usr` bound, as by default), fork per call: the germline's
/// fork-window page cache, charged to the copy's memory cgroup, is evicted by the copy
/// holding the item; the germline counts.
#[test]
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

/// On: in a resident root the germline finds no cold region to fault (every page it can
/// read is locked in memory), so no send carries a bit and nothing reaches the public
/// consumer.
#[test]
fn memcgevict_finds_no_cold_page_in_a_resident_root() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let (v, leaked) = run_attack("memcgevict", 0, bits(), true);
    assert!(!leaked, "on: nothing reaches the public consumer");
    assert!(v["read"]["files"].as_i64().unwrap_or(0) > 0, "on: the release still finds large files: {v}");
    assert_eq!(regions(&v), 0, "on: no region was cold: {v}");
    assert!(!v["read"]["bits"].as_str().unwrap_or("").contains(['0', '1']), "on: no bit read: {v}");
}

/// Off: the copy holding the item loads a region iff its bit is 1; the germline reads the
/// canary's bits back from its own major faults, no cgroup needed.
#[test]
fn pageload_a_copy_loads_pages_that_the_germline_counts() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let (v, leaked) = run_attack("pageload", 0, bits(), false);
    // A region something else on the host reads during a send reads as a 1 (seen once in
    // CI: 15 of 16): off asks for all but two bits, far above chance (half).
    let (right, all) = (v["right"].as_u64().unwrap_or(0), v["bits"].as_u64().unwrap_or(u64::MAX));
    assert!(right + 2 >= all, "off: the bits read back: {v}");
    assert!(bits() < 96 || leaked, "off: the whole canary reaches the public consumer");
}

/// On: every region the germline picks is already resident, loaded or not by the copy, so
/// every window reads "loaded": the bits say nothing about the item.
#[test]
fn pageload_finds_every_page_loaded_in_a_resident_root() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let (v, leaked) = run_attack("pageload", 0, bits(), true);
    assert!(!leaked, "on: nothing reaches the public consumer");
    assert!(regions(&v) > 0, "on: the release still finds regions to use: {v}");
    let wins = v["read"]["read"].clone();
    let faults: Vec<i64> = v["read"]["wins"]
        .as_array()
        .map(|w| w.iter().filter_map(|w| w[1].as_i64()).filter(|a| *a >= 0).collect())
        .unwrap_or_default();
    assert!(
        !faults.is_empty() && faults.iter().all(|a| *a == 0),
        "on: no major fault in any window: {faults:?} {wins}"
    );
    assert_ne!(v["right"], v["bits"], "on: the bits are not the canary's: {v}");
}

/// Starts release `code` with the resident root off or on, calls its tool `name` (no
/// arguments) for the public consumer and returns its JSON answer, with what `during`
/// returns, run while the germline lives.
fn public_answer<T>(
    name: &str,
    code: &str,
    resident: bool,
    during: impl FnOnce(&World, &std::path::Path) -> T,
) -> (Value, T) {
    let w = World::new();
    let release = w.release(name, "", code);
    let policy = w.policy(&[], &[("public", &[])], &format!("[sandbox]\nresident_root = {resident}\n"));
    let mut rt: Runtime = w.start(RuntimeKind::Germline, &release, policy).expect("germline starts");
    let mut req = request(name, json!({}), &[]);
    req.consumers = vec!["public".into()];
    let o = rt.call(&req);
    assert!(o.error.is_none(), "{:?}", o.error);
    let v: Value = serde_json::from_str(&result_text(&o)).unwrap();
    eprintln!("resident={resident}: {v}");
    let t = during(&w, &release);
    drop(rt);
    (v, t)
}

/// What a copy sees of the host with a resident root off and on; on, every page of every
/// file the root binds is in memory while the germline runs.
#[test]
fn a_resident_root_binds_only_what_the_release_reads_all_of_it_in_memory() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let code = r#"
def create_server():
    m = FastMCP("look")

    @m.tool()
    def look() -> str:
        def n(p):
            try:
                return len(os.listdir(p))
            except OSError:
                return -1
        stdlib = os.path.dirname(os.__file__)
        base_site = os.path.join(sys.base_prefix, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
        return json.dumps({"share": n("/usr/share"), "bin": n("/usr/bin"),
                           "libs": n("/usr/lib/" + sys.implementation._multiarch),
                           "test": n(os.path.join(stdlib, "test")), "base_site": n(base_site),
                           "same": sys.prefix == sys.base_prefix})
    return m
"#;
    let look = |resident: bool| {
        public_answer("look", code, resident, |w, release| {
            let mut pages = (0, 0);
            if !resident {
                return pages;
            }
            let paths = germline_executor::resident::resident_paths(&w.python(), &release.canonicalize().unwrap(), &[])
                .unwrap();
            // The root binds the broker's in-memory copy of these paths: its files are counted.
            let tree = germline_executor::resident::Tree::current().expect("the germline holds the tree");
            let paths = tree.broker_view(&paths, &[]);
            for (f, _) in germline_executor::resident::files(&paths, &[]).unwrap() {
                let (resident, all) = germline_executor::resident::resident_pages(&f).unwrap();
                assert_eq!(resident, all, "on: {} is wholly in memory", f.display());
                pages = (pages.0 + resident, pages.1 + all);
            }
            eprintln!("resident pages {} of {}", pages.0, pages.1);
            pages
        })
    };
    let (off, _) = look(false);
    assert!(off["share"].as_i64().unwrap() > 0 && off["bin"].as_i64().unwrap() > 100, "off: /usr is bound: {off}");
    assert!(off["libs"].as_i64().unwrap() > 100, "off: every system library is there: {off}");
    assert!(off["test"].as_i64().unwrap() > 0, "off: the standard library's tests are there: {off}");
    let (on, pages) = look(true);
    assert_eq!(on["bin"].as_i64(), Some(-1), "on: no /usr/bin: {on}");
    // At most `zoneinfo`, where `/etc/localtime` leads.
    assert!(on["share"].as_i64().unwrap() <= 1, "on: nothing else of /usr/share: {on}");
    let libs = on["libs"].as_i64().unwrap();
    assert!((1..300).contains(&libs), "on: only the libraries the interpreter loads: {on}");
    assert_eq!(on["test"].as_i64(), Some(0), "on: the standard library's tests are hidden: {on}");
    if on["same"] == json!(false) {
        assert_eq!(on["base_site"].as_i64(), Some(0), "on: a venv's base site-packages is hidden: {on}");
    }
    assert!(pages.1 > 1000, "on: the root holds the interpreter's files: {pages:?}");
}

/// Where a copy can look a name up. A lookup leaves state in the file system it walks: a
/// negative dentry for a name that is not there, a cached directory block or link. On a
/// host file system that state outlasts the copy and is shared with every later one
/// (`negdentry`, `certlink`, below). A copy walks its whole root (not following links) and
/// names the first entry on a block device's file system. Off: the bound host directories
/// are. On: the resident root binds everything from the broker's in-memory tree, so nothing
/// of the root is on a block device.
#[test]
fn a_resident_root_holds_no_directory_of_a_host_file_system() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let code = r#"
def create_server():
    m = FastMCP("walk")

    @m.tool()
    def walk() -> str:
        seen, first, stack = 0, None, ["/"]
        while stack and first is None and seen < 200000:
            d = stack.pop()
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in [None] + entries:
                p = d if e is None else e.path
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                seen += 1
                if os.major(st.st_dev) != 0:
                    first = p
                    break
                if e is not None and e.is_dir(follow_symlinks=False):
                    stack.append(p)
        return json.dumps({"seen": seen, "first": first})
    return m
"#;
    let walk = |resident: bool| public_answer("walk", code, resident, |_, _| ()).0;
    let off = walk(false);
    assert!(off["first"].is_string(), "off: host directories are bound: {off}");
    let on = walk(true);
    assert!(on["first"].is_null(), "on: nothing of the root is on a block device: {on}");
    assert!(on["seen"].as_i64().unwrap() > 1000, "on: the walk covered the root: {on}");
}

// Found by the adversarial pass on the resident root (SECURITY.md, "Resident root"): locking
// the pages of regular files leaves file-system metadata, which a lookup caches.

/// A slow symbolic link (target of 60 bytes or more) keeps its target in a data block, read
/// through the block device's cache when the link is resolved: the host's `/etc/ssl/certs`
/// and `/etc/alternatives` hold 126 here. The copy holding the item resolves the window's
/// link iff bit i is 1; the germline counts its own block reads (`ru_inblock`, exact) resolving
/// it in the next window. Off (the default root; the host's caches dropped first, as after a
/// reboot): the canary's bits come back. On: the resident root's walk has read every link
/// before the germline starts, so no link is cold.
#[test]
fn certlink_host_slow_links_carry_the_canary_only_without_a_resident_root() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let (v, _) = run_attack("certlink", 0, bits(), false);
    assert_eq!(v["right"], v["bits"], "off: every bit read back: {v}");
    let (v, leaked) = run_attack("certlink", 0, bits(), true);
    assert!(!leaked, "on: nothing reaches the public consumer: {v}");
    assert!(!v["read"]["bits"].as_str().unwrap_or("").contains('0'), "on: every link reads as cached: {v}");
}

/// The release's own slow links (140 of them, inside the release), cold again after every
/// reboot: the same, off and on.
#[test]
fn rellink_the_releases_own_slow_links_carry_the_canary_only_without_a_resident_root() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let (v, _) = run_attack("rellink", 0, bits(), false);
    assert_eq!(v["right"], v["bits"], "off: every bit read back: {v}");
    let (v, leaked) = run_attack("rellink", 0, bits(), true);
    assert!(!leaked, "on: nothing reaches the public consumer: {v}");
    assert!(!v["read"]["bits"].as_str().unwrap_or("").contains('0'), "on: every link reads as cached: {v}");
}

/// Lookups of a window's names, per lookup, after a `tick` window (cold) and a `flush`
/// window (cached): the gap the channel reads.
fn calibration(v: &Value) -> (i64, i64) {
    (v["read"]["hi"].as_i64().unwrap_or(0), v["read"]["lo"].as_i64().unwrap_or(0))
}

/// Negative dentries (timing): the copy holding the item looks up 400 fresh names that do
/// not exist in the standard library's directory iff bit i is 1; the germline times lookups
/// of the same names in the next window (about 1.4 us a name cached, 2.7 us not). No live
/// receiver is needed: the dentries outlast the copy. Off (the default root, the host's
/// directories bound): the bits come back (a timing channel on a shared host: at least 12
/// of 16 here). On: the resident root binds the standard library from the broker's
/// in-memory tree, a tmpfs, which keeps no dentry of a failed lookup: every window costs
/// the same, cached or not, and the bits are noise.
#[test]
fn negdentry_negative_dentries_carry_the_canary_only_without_a_resident_root() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let (v, _) = run_attack("negdentry", 0, bits(), false);
    let (cold, cached) = calibration(&v);
    assert!(cold * 10 > cached * 14, "off: a cached name is looked up faster: {v}");
    assert!(v["right"].as_u64().unwrap() * 4 >= v["bits"].as_u64().unwrap() * 3, "off: the bits come back: {v}");
    let (v, leaked) = run_attack("negdentry", 0, bits(), true);
    assert!(!leaked, "on: nothing reaches the public consumer: {v}");
    assert_ne!(v["right"], v["bits"], "on: the bits are not the canary's: {v}");
}

/// Negative dentries, read by the later public copy itself (no hook in the germline), with
/// the resident root on: noise, as above.
#[test]
fn negdentry2_a_later_public_copy_times_nothing_in_a_resident_root() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let (v, leaked) = run_attack("negdentry2", 0, bits(), true);
    assert!(!leaked, "on: nothing reaches the public consumer: {v}");
    assert_ne!(v["right"], v["bits"], "on: the bits are not the canary's: {v}");
}

/// The whole canary through the default root (timing; SECURITY.md, "Timing"): `MEMCG_BITS=96`.
#[test]
#[ignore = "open channel in the default root: measures it (SECURITY.md, Resident root and Timing)"]
fn negdentry2_through_the_default_root() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let (v, leaked) = run_attack("negdentry2", 0, bits(), false);
    assert_eq!(v["right"], v["bits"], "off: every bit read back: {v}");
    assert!(bits() < 96 || leaked, "off: the whole canary reaches the public consumer");
}

/// Children of this process that hold locked memory: the lockers of resident roots.
fn lockers() -> Vec<i32> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.trim().to_owned());
        let locked = field("VmLck:").and_then(|v| v.trim_end_matches(" kB").trim().parse::<u64>().ok());
        if field("PPid:").as_deref() == Some(me.as_str()) && locked.is_some_and(|k| k > 0) {
            out.push(pid);
        }
    }
    out
}

/// A resident root's files are locked by a process of their own, not in the broker's
/// address space (which every set-up helper of a copy shares, and which the kernel walks at
/// each helper's exit). A germline whose locker is gone is treated as gone: no copy is taken
/// or forked from it, and the next call starts it again with a new lock. Off
/// (`LOCKER_CHECK_OFF_FOR_TESTS`): the call is served by the same germline, from a root
/// nothing holds.
#[test]
fn a_germline_whose_resident_locks_are_gone_is_started_again() {
    let _g = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let code = "def create_server():\n    m = FastMCP('echo')\n\n    @m.tool()\n    def echo() -> str:\n        return 'ok'\n    return m\n";
    for check in [false, true] {
        let _off = Hold::set(&germline_executor::resident::LOCKER_CHECK_OFF_FOR_TESTS, !check);
        let w = World::new();
        let release = w.release("echo", "", code);
        let policy = w.policy(&[], &[("public", &[])], "[limits]\npool = 0\n[sandbox]\nresident_root = true\n");
        let before = lockers();
        let mut rt: Runtime = w.start(RuntimeKind::Germline, &release, policy).expect("germline starts");
        let mine: Vec<i32> = lockers().into_iter().filter(|p| !before.contains(p)).collect();
        assert_eq!(mine.len(), 1, "one locker holds the germline's root: {mine:?}");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap().lines().count();
        assert!(maps < 2000, "the broker maps none of the root's files itself: {maps} mappings");
        let call = |rt: &mut Runtime| {
            let mut req = request("echo", json!({}), &[]);
            req.consumers = vec!["public".into()];
            rt.call(&req)
        };
        let o = call(&mut rt);
        assert!(o.error.is_none(), "served while the root is locked: {:?}", o.error);
        // SAFETY: kills the locker found above, a child of this process.
        unsafe { libc::kill(mine[0], libc::SIGKILL) };
        let t0 = Instant::now();
        // Dead once it is a zombie (its parent, the broker, reaps it only when the lock goes).
        let dead = || {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", mine[0])).unwrap_or_default();
            stat.rsplit_once(") ").is_none_or(|(_, rest)| rest.starts_with('Z'))
        };
        while !dead() && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = call(&mut rt);
        eprintln!("locker check {check}: after the locker's death: {:?}", o.error);
        assert!(o.error.is_none(), "served: {:?}", o.error);
        let now: Vec<i32> = lockers().into_iter().filter(|p| !before.contains(p) && *p != mine[0]).collect();
        if check {
            // The germline was started again with a new lock, and served the call.
            assert_eq!(now.len(), 1, "on: a new locker holds the new germline's root: {now:?}");
        } else {
            assert!(now.is_empty(), "off: the same germline served it, its root held by nothing: {now:?}");
        }
    }
}
