//! Issue 16: servers from PyPI run under germline as they are. Each test runs the same
//! release unprotected (`sig-pin`) and under germline and compares what a client sees.

use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_tests::world::{request, result_text, World};
use serde_json::json;

/// Runs `tool` with `args` under sig-pin and germline; returns (unprotected, germline)
/// result texts, or the error when a call failed.
fn both(w: &World, rel: &std::path::Path, tool: &str, args: serde_json::Value) -> (String, String) {
    let policy = || w.policy(&[], &[("agent", &[])], "");
    let mut pin = w.start(RuntimeKind::SigPin, rel, policy()).expect("sig-pin start");
    let mut gl = w.start(RuntimeKind::Germline, rel, policy()).expect("germline start");
    let run = |rt: &mut Runtime| {
        let o = rt.call(&request(tool, args.clone(), &[]));
        o.error.clone().unwrap_or_else(|| result_text(&o))
    };
    (run(&mut pin), run(&mut gl))
}

const SHELL_OUT: &str = r#"
import subprocess
def create_server():
    m = FastMCP("shell")
    @m.tool()
    def statuses() -> str:
        a = subprocess.run(["/bin/false"]).returncode
        b = subprocess.run(["/bin/sh", "-c", "exit 3"]).returncode
        try:
            subprocess.run(["/bin/sh", "-c", "exit 7"], check=True)
            c = "no error"
        except subprocess.CalledProcessError as e:
            c = "CalledProcessError %d" % e.returncode
        return "%d %d %s" % (a, b, c)
    return m
"#;

/// Point 9: a tool that shells out sees its children's exit statuses as unprotected (the
/// germline ignores SIGCHLD; before the fix every copy inherited that and every
/// subprocess "succeeded" with status 0).
#[test]
fn a_failing_subprocess_reports_its_exit_status_as_unprotected() {
    let w = World::new();
    // The programs it runs, declared: a resident root binds nothing else.
    let rel = w.release("shell", "system_paths = [\"/bin/false\", \"/bin/sh\"]\n[tools.statuses]\n", SHELL_OUT);
    let (pin, gl) = both(&w, &rel, "statuses", json!({}));
    eprintln!("unprotected: {pin:?}; germline: {gl:?}");
    assert_eq!(pin, "1 3 CalledProcessError 7", "the unprotected server");
    assert_eq!(gl, pin, "germline differs from the unprotected server");
}

/// A manifest's system paths may only name what the default root already reaches (the
/// system directories, the interpreter's paths): a host path elsewhere, here the deployment's
/// own data directory, is refused at start and named, with the resident root off and on.
#[test]
fn a_system_path_outside_the_system_directories_is_refused() {
    let w = World::new();
    let secret = w.item("hr", "secret.txt", "GLC-hr-000000000000000000000000");
    for resident in [false, true] {
        let rel = w.release(
            &format!("reach-{resident}"),
            &format!("system_paths = [{:?}]\n[tools.statuses]\n", secret.display().to_string()),
            SHELL_OUT,
        );
        let policy = w.policy(&[], &[("agent", &["hr"])], &format!("[sandbox]\nresident_root = {resident}\n"));
        let e = w.start(RuntimeKind::Germline, &rel, policy).err().expect("refused").to_string();
        assert!(e.contains("outside the interpreter's paths") && e.contains("secret.txt"), "resident={resident}: {e}");
    }
}

/// Where `scripts/setup.sh` vendors PyPI packages.
fn real_servers() -> std::path::PathBuf {
    std::env::var_os("GERMLINE_REAL_SERVERS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("/var/cache/germline/real-servers"))
}

/// A release written like [`World::release`], with the packages `scripts/setup.sh`
/// vendored as `vendored` on its path (hard-linked where the file system allows).
fn release_with_vendor(w: &World, name: &str, vendored: &str, tools: &str, body: &str) -> std::path::PathBuf {
    let rel = w.release(name, tools, body);
    let vendor = real_servers().join(vendored);
    assert!(vendor.join(".complete").is_file(), "{} is missing: run scripts/setup.sh", vendor.display());
    let cp = |flag: &str| {
        std::process::Command::new("cp")
            .arg(flag)
            .arg(vendor.join("vendor"))
            .arg(&rel)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !cp("-rl") {
        let _ = std::fs::remove_dir_all(rel.join("vendor"));
        assert!(cp("-r"), "copying {}", vendor.display());
    }
    let manifest = std::fs::read_to_string(rel.join("germline.toml")).expect("manifest");
    let manifest = manifest.replace("[release]\n", "[release]\npython_path = [\".\", \"vendor\"]\n");
    std::fs::write(rel.join("germline.toml"), manifest).expect("manifest");
    rel
}

const DATASCI: &str = r#"
import numpy as np
import pandas as pd
from sklearn.linear_model import LinearRegression
from sklearn.cluster import KMeans

def create_server():
    m = FastMCP("datasci")
    @m.tool()
    def analyse(n: int) -> str:
        x = np.arange(n, dtype=float)
        y = 3.0 * x + 2.0 + np.sin(x)
        df = pd.DataFrame({"x": x, "y": y, "g": [i % 3 for i in range(n)]})
        means = df.groupby("g")["y"].mean().round(6).to_dict()
        fit = LinearRegression().fit(df[["x"]].values, df["y"].values)
        km = KMeans(n_clusters=2, n_init=3, random_state=0).fit(np.c_[x, y])
        inv = np.linalg.inv(np.array([[2.0, 1.0], [1.0, 3.0]])).round(6).tolist()
        stamp = pd.Timestamp("2026-01-02T03:04:05") + pd.Timedelta(days=n)
        return json.dumps({
            "means": means, "coef": round(float(fit.coef_[0]), 6), "intercept": round(float(fit.intercept_), 6),
            "clusters": sorted(int(c) for c in np.bincount(km.labels_)), "inv": inv, "stamp": stamp.isoformat(),
            "numpy": np.__version__, "pandas": pd.__version__,
        }, sort_keys=True)
    @m.tool()
    def clock() -> str:
        from datetime import datetime, timezone
        return json.dumps([time.time(), datetime.now(timezone.utc).timestamp(),
                           datetime.utcnow().replace(tzinfo=timezone.utc).timestamp(),
                           datetime.now().timestamp(), pd.Timestamp.now(tz="UTC").timestamp()])
    return m
"#;

/// Points 1 and 2: numpy, pandas and scikit-learn import in the germline (native thread
/// pools kept single-threaded until fork; the twin clock no longer replaces
/// `datetime.datetime`) and answer as unprotected.
#[test]
fn numpy_pandas_and_scikit_learn_import_and_run_under_germline() {
    let w = World::new();
    let rel = release_with_vendor(&w, "datasci", "datasci", "[tools.analyse]\n[tools.clock]\n", DATASCI);
    let (pin, gl) = both(&w, &rel, "analyse", json!({"n": 40}));
    eprintln!("unprotected: {pin}\ngermline:    {gl}");
    assert!(pin.contains("\"coef\""), "the unprotected server: {pin}");
    assert_eq!(gl, pin, "germline differs from the unprotected server");
}

/// Point 4: a release that fails to import is refused with its traceback's last lines
/// (before, only "the germline exited").
#[test]
fn a_release_that_fails_to_import_names_its_traceback() {
    let w = World::new();
    let body = "def helper():\n    raise RuntimeError('no configuration at /etc/app.conf')\nhelper()\n";
    let rel = w.release("broken", "[tools.nothing]\n", body);
    let err = match w.start(RuntimeKind::Germline, &rel, w.policy(&[], &[("agent", &[])], "")) {
        Ok(_) => panic!("a release that raises at import started"),
        Err(e) => e.to_string(),
    };
    eprintln!("{err}");
    assert!(err.contains("did not finish importing"), "phase named: {err}");
    assert!(err.contains("RuntimeError: no configuration at /etc/app.conf"), "cause named: {err}");
    assert!(err.contains("in helper"), "traceback lines: {err}");
}

/// Point 2: the twin clock reaches `datetime.now`, `utcnow` and pandas' `Timestamp.now`
/// without replacing the `datetime.datetime` type: in a copy every reading is the frozen
/// twin value, `time.time()`'s.
#[test]
fn the_twin_clock_reaches_datetime_and_pandas_without_replacing_the_type() {
    let w = World::new();
    let rel = release_with_vendor(&w, "datasci", "datasci", "[tools.analyse]\n[tools.clock]\n", DATASCI);
    let (pin, gl) = both(&w, &rel, "clock", json!({}));
    eprintln!("unprotected: {pin}\ngermline:    {gl}");
    let read = |s: &str| -> Vec<f64> { serde_json::from_str(s).unwrap_or_else(|e| panic!("{s}: {e}")) };
    let (pin, gl) = (read(&pin), read(&gl));
    assert_eq!(pin.len(), 5, "the unprotected server: {pin:?}");
    // datetime keeps microseconds; a reading of the real clock comes milliseconds after
    // the twin clock was frozen, at the start of the call.
    assert!(gl.iter().all(|&t| (t - gl[0]).abs() < 2e-6), "every germline reading is the twin clock: {gl:?}");
}

const THREAD_AT_IMPORT: &str = r#"
import ctypes, threading
def _worker():
    ctypes.CDLL(None).prctl(15, b"pool-worker", 0, 0, 0)
    time.sleep(30)
threading.Thread(target=_worker, daemon=True).start()
time.sleep(0.2)
def create_server():
    return FastMCP("threads")
"#;

/// Point 1: a release that still starts a thread at import is refused with the thread's
/// name and the advice.
#[test]
fn a_thread_started_at_import_is_refused_by_name() {
    let w = World::new();
    let rel = w.release("threads", "[tools.nothing]\n", THREAD_AT_IMPORT);
    let err = match w.start(RuntimeKind::Germline, &rel, w.policy(&[], &[("agent", &[])], "")) {
        Ok(_) => panic!("a germline with two threads started"),
        Err(e) => e.to_string(),
    };
    eprintln!("{err}");
    assert!(err.contains("(G1)") && err.contains("\"pool-worker\""), "thread named: {err}");
    assert!(err.contains("SINGLE_THREADED_POOLS"), "advice given: {err}");
}

const SCRATCH: &str = r#"
import tempfile
def create_server():
    m = FastMCP("scratch")
    @m.tool()
    def scratch(text: str) -> str:
        seen = sorted(os.listdir(tempfile.gettempdir()))
        with tempfile.NamedTemporaryFile("w+", suffix=".txt", delete=False) as f:
            f.write(text)
        with open(f.name) as g:
            back = g.read()
        os.makedirs(os.path.join(tempfile.gettempdir(), "sub"), exist_ok=True)
        os.rename(f.name, os.path.join(tempfile.gettempdir(), "sub", "kept.txt"))
        return json.dumps({"back": back, "leftover": [n for n in seen if n.endswith(".txt") or n == "sub"]})
    return m
"#;

/// Point 8: each copy writes temporary files (`tempfile`, `TMPDIR`) into a scratch tmpfs of
/// its own, as an unprotected server writes to /tmp; nothing a copy wrote is there for the
/// next copy. (Unprotected, the previous call's file is still there: the bare server shares
/// /tmp across calls, which the comparison masks by listing only under germline.)
#[test]
fn each_copy_writes_temporary_files_into_a_scratch_of_its_own() {
    let w = World::new();
    let rel = w.release("scratch", "[tools.scratch]\n", SCRATCH);
    let policy = w.policy(&[], &[("agent", &[])], "");
    let mut gl = w.start(RuntimeKind::Germline, &rel, policy).expect("germline start");
    for i in 0..3 {
        let o = gl.call(&request("scratch", json!({"text": format!("call {i}")}), &[]));
        let text = o.error.clone().unwrap_or_else(|| result_text(&o));
        eprintln!("call {i}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(v["back"], json!(format!("call {i}")), "the copy reads back what it wrote");
        assert_eq!(v["leftover"], json!([]), "nothing of an earlier copy is in this copy's scratch");
    }
}

const STAT: &str = r#"
def create_server():
    m = FastMCP("stat")
    @m.tool()
    def describe(path: str) -> str:
        st = os.stat(path)
        return json.dumps({"size": st.st_size, "mode": oct(st.st_mode & 0o777), "mtime_ns": st.st_mtime_ns,
                           "atime_ns": st.st_atime_ns, "text": open(path).read()})
    return m
"#;

/// Point 5: a file item in a copy's view has the host file's size, mode and times, as
/// the unprotected server sees them (before, its times were when the view was written).
#[test]
fn a_file_item_keeps_its_size_mode_and_times() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::new();
    let item = w.item("projx", "notes.txt", "four score and seven years\n");
    std::fs::set_permissions(&item, std::fs::Permissions::from_mode(0o640)).expect("mode");
    let now = std::time::SystemTime::now();
    // Set again before each call: reading the file (the server does, and so does the
    // broker) moves its access time under `relatime`, as its ctime is recent.
    let set_times = || {
        let times = std::fs::FileTimes::new()
            .set_modified(now - std::time::Duration::from_secs(3 * 3600 + 7))
            .set_accessed(now - std::time::Duration::from_secs(3600 + 11));
        std::fs::File::options().write(true).open(&item).expect("item").set_times(times).expect("times");
    };
    let rel = w.release("stat", "[tools.describe]\n", STAT);
    let policy = || w.policy(&[], &[("agent", &["projx"])], "");
    let mut pin = w.start(RuntimeKind::SigPin, &rel, policy()).expect("sig-pin start");
    let mut gl = w.start(RuntimeKind::Germline, &rel, policy()).expect("germline start");
    let req = request("describe", json!({"path": item.to_string_lossy()}), &[&item]);
    set_times();
    let a = pin.call(&req);
    set_times();
    let b = gl.call(&req);
    let (a, b) =
        (a.error.clone().unwrap_or_else(|| result_text(&a)), b.error.clone().unwrap_or_else(|| result_text(&b)));
    eprintln!("unprotected: {a}\ngermline:    {b}");
    assert!(a.contains("\"mode\": \"0o640\""), "the unprotected server: {a}");
    assert_eq!(b, a, "germline differs from the unprotected server");
}

const URI_STAT: &str = r#"
from urllib.parse import unquote, urlparse
def create_server():
    m = FastMCP("uri")
    @m.tool()
    def read(uri: str) -> str:
        path = unquote(urlparse(uri).path) if uri.startswith("file:") else uri
        return open(path).read()
    return m
"#;

/// Point 7: a `file:` URI in a path argument names its file as the plain path does: the
/// item is labelled, planned and in the copy's view (before, it named no item and the
/// copy found an empty data root).
#[test]
fn a_file_uri_in_a_path_argument_names_its_item() {
    let w = World::new();
    let item = w.item("projx", "a b.txt", "spaced name\n");
    let rel = w.release("uri", "[tools.read]\n", URI_STAT);
    let policy = || w.policy(&[], &[("agent", &["projx"])], "[[items]]\nargument = \"uri\"\nnames_path = true\n");
    let mut pin = w.start(RuntimeKind::SigPin, &rel, policy()).expect("sig-pin start");
    let mut gl = w.start(RuntimeKind::Germline, &rel, policy()).expect("germline start");
    let uri = format!("file://{}", item.to_string_lossy().replace(' ', "%20"));
    let req = request("read", json!({"uri": uri}), &[]);
    let (a, b) = (pin.call(&req), gl.call(&req));
    eprintln!("unprotected: {:?} {:?}\ngermline: {:?} {:?}", a.error, result_text(&a), b.error, result_text(&b));
    assert_eq!(result_text(&a), "spaced name\n");
    assert_eq!(result_text(&b), result_text(&a), "germline differs from the unprotected server");
    let tags = germline_tests::world::label_tags(&b).unwrap_or_default();
    assert_eq!(tags, vec!["projx".to_owned()], "the answer carries the item's label");
}

/// Point 7: a server configured by its command line (`cli` and `args` in the manifest):
/// mcp-server-sqlite's own `main`, which parses `--db-path` and runs its event loop.
#[test]
fn a_server_configured_by_its_command_line_runs_unmodified() {
    let w = World::new();
    let db = w.data.join("projx").join("shop.db");
    let made = std::process::Command::new(germline_tests::world::python(&w.dir.path().join("home")).python)
        .arg("-c")
        .arg("import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\nc.execute('create table t(id integer, name text)')\nc.executemany('insert into t values (?,?)', [(i, 'n%d' % i) for i in range(9)])\nc.commit()")
        .arg(&db)
        .status()
        .is_ok_and(|s| s.success());
    assert!(made, "creating the database");
    let rel = release_with_vendor(&w, "sqlite-cli", "sqlite", "", "");
    let manifest = format!(
        "[release]\nname = \"sqlite-cli\"\nversion = \"1\"\nruntime = \"python\"\ncli = \"mcp_server_sqlite:main\"\n\
         args = [\"--db-path\", \"{db}\"]\npython_path = [\"vendor\"]\n\n\
         [tools.read_query]\nread_paths = [\"{db}\"]\n[tools.list_tables]\nread_paths = [\"{db}\"]\n",
        db = db.display()
    );
    std::fs::write(rel.join("germline.toml"), manifest).expect("manifest");
    let policy = || w.policy(&[], &[("agent", &["projx"])], "");
    let mut pin = w.start(RuntimeKind::SigPin, &rel, policy()).expect("sig-pin start");
    let mut gl = w.start(RuntimeKind::Germline, &rel, policy()).expect("germline start");
    for (tool, args) in [
        ("list_tables", json!({})),
        ("read_query", json!({"query": "SELECT name FROM t WHERE id > 5"})),
        ("read_query", json!({"query": "SELECT * FROM nowhere"})),
    ] {
        let req = request(tool, args, &[]);
        let (a, b) = (pin.call(&req), gl.call(&req));
        let (a, b) =
            (a.error.clone().unwrap_or_else(|| result_text(&a)), b.error.clone().unwrap_or_else(|| result_text(&b)));
        eprintln!("{tool}: unprotected {a:?}, germline {b:?}");
        assert!(!a.is_empty(), "the unprotected server answers {tool}");
        assert_eq!(b, a, "{tool}: germline differs from the unprotected server");
    }
}

const ENV_AT_IMPORT: &str = r#"
AT_IMPORT = (os.environ.get("REPORT_STYLE"), os.environ.get("CACHE_SIZE"), os.environ.get("OPENBLAS_NUM_THREADS"))
def create_server():
    m = FastMCP("env")
    @m.tool()
    def settings() -> str:
        return json.dumps(AT_IMPORT)
    return m
"#;

/// Point 1: the manifest's `[release] env` and the policy's `[environment]` reach the
/// germline before the release is imported (the policy wins); variables that would undo
/// the sandbox's own settings are refused.
#[test]
fn the_manifest_and_policy_pass_environment_to_the_germline() {
    let w = World::new();
    let rel = w.release("env", "[tools.settings]\n", ENV_AT_IMPORT);
    let manifest = std::fs::read_to_string(rel.join("germline.toml")).expect("manifest");
    let manifest =
        manifest.replace("[release]\n", "[release]\nenv = { REPORT_STYLE = \"compact\", CACHE_SIZE = \"10\" }\n");
    std::fs::write(rel.join("germline.toml"), manifest).expect("manifest");
    let policy = w.policy(&[], &[("agent", &[])], "[environment]\nCACHE_SIZE = \"64\"\n");
    let mut gl = w.start(RuntimeKind::Germline, &rel, policy).expect("germline start");
    let o = gl.call(&request("settings", json!({}), &[]));
    assert_eq!(result_text(&o), r#"["compact", "64", "1"]"#, "{:?}", o.error);
    for bad in ["LD_PRELOAD", "PYTHONPATH", "HTTPS_PROXY", "GERMLINE_SCRATCH", "TMPDIR"] {
        let policy = w.policy(&[], &[("agent", &[])], &format!("[environment]\n{bad} = \"/x\"\n"));
        let err = w.start(RuntimeKind::Germline, &rel, policy).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(bad) && err.contains("may not be set"), "{bad}: {err}");
    }
}

/// Point 4: a copy that dies names the phase it died in.
#[test]
fn a_copy_that_dies_names_the_phase() {
    let w = World::new();
    let body = "def create_server():\n    m = FastMCP('dies')\n    @m.tool()\n    def crash() -> str:\n        os._exit(3)\n    return m\n";
    let rel = w.release("dies", "[tools.crash]\n", body);
    let mut gl = w.start(RuntimeKind::Germline, &rel, w.policy(&[], &[("agent", &[])], "")).expect("start");
    let o = gl.call(&request("crash", json!({}), &[]));
    let err = o.error.unwrap_or_default();
    eprintln!("{err}");
    assert!(err.contains("closed its channel") && err.contains("while the server answered"), "{err}");
}

/// Point 4: a copy whose server fails to start (a database that is not there, as a
/// server's own start-up code reports it) returns the end of its stderr, labelled like
/// the copy.
#[test]
fn a_copy_whose_server_fails_returns_its_stderr_tail() {
    let w = World::new();
    let body = "import sys\nasync def main():\n    print('opening the catalogue', file=sys.stderr)\n    raise RuntimeError('catalogue.db is not a database')\n";
    let rel = w.release("fails", "[tools.nothing]\n", body);
    let manifest = std::fs::read_to_string(rel.join("germline.toml")).expect("manifest");
    std::fs::write(
        rel.join("germline.toml"),
        manifest.replace("factory = \"server:create_server\"", "main = \"server:main\""),
    )
    .expect("manifest");
    let mut gl = w.start(RuntimeKind::Germline, &rel, w.policy(&[], &[("agent", &[])], "")).expect("start");
    let o = gl.call(&request("nothing", json!({}), &[]));
    let err = o.error.unwrap_or_default();
    eprintln!("{err}");
    assert!(err.contains("while the server initialized"), "phase: {err}");
    assert!(
        err.contains("opening the catalogue") && err.contains("RuntimeError: catalogue.db is not a database"),
        "{err}"
    );
}

const IMPORT_SCRATCH: &str = r#"
import tempfile
_D = tempfile.mkdtemp(prefix="index-")
with open(os.path.join(_D, "index.txt"), "w") as f:
    f.write("built at import")
os.symlink("index.txt", os.path.join(_D, "latest"))
def create_server():
    m = FastMCP("indexer")
    @m.tool()
    def read_index() -> str:
        with open(os.path.join(_D, "latest")) as f:
            text = f.read()
        with open(os.path.join(_D, "index.txt"), "a") as f:
            f.write(" +call")
        return json.dumps({"text": text, "in_tmp": _D.startswith(tempfile.gettempdir())})
    return m
"#;

/// Point 9, the germline's side: a release that writes temporary files while it is
/// imported (an index built at start, a cache) has a scratch for it, and every copy starts
/// with what the import left there, as its own: a call's write is gone for the next call.
/// Unprotected, the first call reads the same. Off (no import scratch), the release fails
/// to start.
#[test]
fn an_import_that_writes_temporary_files_runs_and_every_copy_starts_with_them() {
    let w = World::new();
    let rel = w.release("indexer", "[tools.read_index]\n", IMPORT_SCRATCH);
    let policy = || w.policy(&[], &[("agent", &[])], "");
    let mut pin = w.start(RuntimeKind::SigPin, &rel, policy()).expect("sig-pin start");
    let first = result_text(&pin.call(&request("read_index", json!({}), &[])));
    assert_eq!(first, r#"{"text": "built at import", "in_tmp": true}"#);
    let off = germline_executor::confine::SandboxSwitches { import_scratch: false, ..Default::default() };
    let err = w.start_with(RuntimeKind::Germline, &rel, policy(), off).err().map(|e| e.to_string());
    eprintln!("import scratch off: {err:?}");
    assert!(err.is_some_and(|e| e.contains("tempfile") || e.contains("No usable temporary directory")));
    for pool in [0, 2] {
        let policy = w.policy(&[], &[("agent", &[])], &format!("[limits]\npool = {pool}\n"));
        let mut gl = w.start(RuntimeKind::Germline, &rel, policy).expect("germline start");
        for i in 0..3 {
            let o = gl.call(&request("read_index", json!({}), &[]));
            let text = o.error.clone().unwrap_or_else(|| result_text(&o));
            eprintln!("pool {pool}, call {i}: {text}");
            assert_eq!(
                text, first,
                "pool {pool}, call {i}: the import's files, as the first unprotected call saw them"
            );
        }
    }
}

const SCRATCH_MAPPING: &str = r#"
import ctypes, mmap, tempfile
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_path = os.path.join(tempfile.gettempdir(), "page")
with open(_path, "wb") as f:
    f.write(b"\0" * 4096)
_fd = os.open(_path, os.O_RDWR)
# Shared but read-only, from a descriptor opened for writing, which is then closed.
_ADDR = _libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, _fd, 0)
os.close(_fd)
def create_server():
    m = FastMCP("pager")
    @m.tool()
    def send(path: str) -> str:
        data = open(path, "rb").read()[:4000]
        rc = _libc.mprotect(ctypes.c_void_p(_ADDR), 4096, mmap.PROT_READ | mmap.PROT_WRITE)
        if rc == 0:
            ctypes.memmove(_ADDR, data + b"\0", len(data) + 1)
        return "sent %d" % rc
    @m.tool()
    def recv() -> str:
        return ctypes.string_at(_ADDR).decode(errors="replace")
    return m
"#;

/// Point 9's channel: a page of a file in the import scratch, mapped shared and read-only
/// from a descriptor opened for writing, is the same page in every copy, and `mprotect`
/// makes it writable in any of them, even after the scratch is unmounted. Off (G3 allows
/// such a mapping): the hr item's canary sent by one copy is read by a later public call.
/// On: G3 refuses the germline, named.
#[test]
fn a_shared_mapping_of_the_import_scratch_is_refused_by_g3() {
    use germline_executor::inspect::SCRATCH_MAPPING_CHECK_OFF_FOR_TESTS;
    use std::sync::atomic::Ordering;
    let w = World::new();
    let secret = w.item("hr", "payslip.txt", "GLC-hr-scratch-page-7c1d");
    let rel = w.release("pager", "[tools.send]\n[tools.recv]\n", SCRATCH_MAPPING);
    for off in [true, false] {
        SCRATCH_MAPPING_CHECK_OFF_FOR_TESTS.store(off, Ordering::SeqCst);
        let policy = w.policy(&[], &[("agent", &["hr"])], "[limits]\npool = 0\n");
        let started = w.start(RuntimeKind::Germline, &rel, policy);
        match (off, started) {
            (true, Ok(mut gl)) => {
                let sent = gl.call(&request("send", json!({"path": secret.to_string_lossy()}), &[&secret]));
                let got = gl.call(&request("recv", json!({}), &[]));
                eprintln!("off: {:?} / {:?} label {:?}", result_text(&sent), result_text(&got), got.label);
                assert!(
                    result_text(&got).contains("GLC-hr-scratch-page-7c1d"),
                    "mechanism off: the canary crosses to an unlabelled call ({:?})",
                    got.error
                );
                SCRATCH_MAPPING_CHECK_OFF_FOR_TESTS.store(false, Ordering::SeqCst);
            }
            (false, Err(e)) => {
                let e = e.to_string();
                eprintln!("on: {e}");
                assert!(e.contains("(G3)") && e.contains("import scratch"), "{e}");
            }
            (off, r) => {
                SCRATCH_MAPPING_CHECK_OFF_FOR_TESTS.store(false, Ordering::SeqCst);
                panic!("off {off}: unexpected start outcome {:?}", r.err())
            }
        }
    }
}

const DECLARED_SCRATCH: &str = r#"
CACHE = "/var/cache/germline-test-indexer"
os.makedirs(os.path.join(CACHE, "built"), exist_ok=True)
with open(os.path.join(CACHE, "built", "index"), "w") as f:
    f.write("at import")
def create_server():
    m = FastMCP("cacher")
    @m.tool()
    def cache(text: str) -> str:
        with open(os.path.join(CACHE, "call.txt"), "w") as f:
            f.write(text)
        return json.dumps({"listing": sorted(os.listdir(CACHE)), "index": open(os.path.join(CACHE, "built", "index")).read(),
                           "back": open(os.path.join(CACHE, "call.txt")).read()})
    return m
"#;

/// Point 9, paths the manifest declares as scratch (`[release] scratch`, a cache
/// directory outside `TMPDIR`): the germline writes there while it imports and each copy
/// starts with that and writes its own, gone with it. Undeclared, the path lies on the
/// read-only root and the release does not start. (No unprotected run: it would write the
/// host's /var/cache.)
#[test]
fn a_declared_scratch_path_is_private_scratch_for_the_import_and_each_copy() {
    let w = World::new();
    let rel = w.release("cacher", "[tools.cache]\n", DECLARED_SCRATCH);
    let policy = |pool: usize| w.policy(&[], &[("agent", &[])], &format!("[limits]\npool = {pool}\n"));
    let err = w.start(RuntimeKind::Germline, &rel, policy(0)).err().map(|e| e.to_string()).unwrap_or_default();
    eprintln!("undeclared: {}", err.lines().last().unwrap_or_default());
    assert!(err.contains("Read-only file system"), "undeclared, the import cannot write there: {err}");
    let manifest = rel.join("germline.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let text = text.replace("[release]\n", "[release]\nscratch = [\"/var/cache/germline-test-indexer\"]\n");
    std::fs::write(&manifest, text).expect("manifest");
    for pool in [0, 2] {
        let mut gl = w.start(RuntimeKind::Germline, &rel, policy(pool)).expect("germline start");
        for i in 0..3 {
            let o = gl.call(&request("cache", json!({"text": format!("call {i}")}), &[]));
            let text = o.error.clone().unwrap_or_else(|| result_text(&o));
            eprintln!("pool {pool}, call {i}: {text}");
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(v["listing"], json!(["built", "call.txt"]), "the import's entry and this call's own only");
            assert_eq!(v["index"], "at import");
            assert_eq!(v["back"], json!(format!("call {i}")));
        }
    }
    assert!(!std::path::Path::new("/var/cache/germline-test-indexer").exists(), "nothing reached the host");
}
