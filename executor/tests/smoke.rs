//! Starts a real germline, forks a copy, sets it up from outside and talks to it.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use germline_executor::confine::{Confinement, ResourceLimits};
use germline_executor::germline::{CopyProcess, Germline, GermlineSpec, PythonRuntime};
use germline_executor::outside::{prepare_copy, CopyFile};

/// A release of one module, `server.py` (`code`, whose `create_server` is the factory),
/// and the spec of its germline with `data` (made here) as its data root.
fn release(tmp: &Path, code: &str, data: &Path) -> GermlineSpec {
    let rel = tmp.join("rel");
    std::fs::create_dir_all(&rel).unwrap();
    std::fs::write(
        rel.join("germline.toml"),
        "[release]\nname='smoke'\nversion='1'\nruntime='python'\nfactory='server:create_server'\n",
    )
    .unwrap();
    std::fs::write(rel.join("server.py"), code).unwrap();
    std::fs::create_dir_all(data).unwrap();
    GermlineSpec {
        runtime: PythonRuntime::discover(&tmp.join("shim")).unwrap(),
        release_dir: rel,
        data_roots: vec![data.to_path_buf()],
        limits: ResourceLimits::default(),
        start_timeout: Duration::from_secs(30),
        extra_read: vec![],
        system_paths: vec![],
        cgroup_limits: None,
        switches: Default::default(),
        require_limits: false,
        seccomp: germline_executor::seccomp::SeccompPolicy::germline(),
        env: Vec::new(),
        copy_source: Default::default(),
        scratch_paths: Vec::new(),
        resident_root: false,
        own_tree: false,
    }
}

/// Sets `copy` up with a view of one item (`a.txt` under `data`, contents `VIEW`), lets it
/// connect and opens its gate: the copy holds its view once this returns its channel.
fn connect_with_view(copy: &CopyProcess, data: &Path) -> TcpStream {
    let files = [CopyFile { path: data.join("a.txt"), contents: b"VIEW".to_vec(), meta: None }];
    let roots = [data.to_path_buf()];
    let l = prepare_copy(copy.pid, copy.ids(), &roots, &files, copy.scratch.as_ref(), copy.departure()).unwrap();
    copy.channel_ready().unwrap();
    let (chan, _) = l.channel.accept().unwrap();
    l.gate.open().unwrap();
    chan
}

/// The cgroups a process is in (`/proc/PID/cgroup`), in the hierarchies that hold copies
/// to their limits: v1 `memory` and `pids`, else the unified one.
fn limit_cgroups(pid: i32) -> Vec<String> {
    use germline_executor::cgroup::{host_support, HostSupport};
    let v1 = host_support() == HostSupport::V1;
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .filter(|l| if v1 { l.contains(":memory:") || l.contains(":pids:") } else { l.starts_with("0::") })
        .map(str::to_owned)
        .collect()
}

/// The germline forks a copy from inside the copy's fresh cgroups and leaves them in the
/// background while the copy is set up; the copy's view gate waits until it has left, so
/// a copy never holds data in a cgroup (memory, process count, OOM choice) it shares with
/// the germline. Off (the germline left inside, the gate not waiting): the copy gets its
/// view while the germline is in its cgroups.
#[test]
fn the_germline_has_left_the_copys_cgroups_before_the_copy_gets_its_view() {
    use germline_executor::cgroup::{host_support, HostSupport, DEPARTURE_OFF_FOR_TESTS};
    use std::sync::atomic::Ordering;
    if host_support() == HostSupport::None {
        eprintln!("skipped: this host has no cgroup hierarchy germline can write");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let code = "from mcp.server.fastmcp import FastMCP\ndef create_server():\n    return FastMCP('noop')\n";
    let spec = release(tmp.path(), code, &data);
    for off in [true, false] {
        DEPARTURE_OFF_FOR_TESTS.store(off, Ordering::SeqCst);
        let mut g = Germline::start(&spec).unwrap();
        let copy = g.fork_copy().unwrap();
        let _chan = connect_with_view(&copy, &data);
        // The copy has its view now.
        let (germline, copy_cgroups) = (limit_cgroups(g.pid()), limit_cgroups(copy.pid));
        let shared: Vec<&String> = germline.iter().filter(|c| copy_cgroups.contains(c)).collect();
        eprintln!("off={off}: germline {germline:?}, copy {copy_cgroups:?}");
        assert!(!copy_cgroups.is_empty(), "the copy is in no limiting cgroup: {copy_cgroups:?}");
        assert_eq!(shared.is_empty(), !off, "off={off}: cgroups the germline shares with the copy: {shared:?}");
        copy.kill().unwrap();
        DEPARTURE_OFF_FOR_TESTS.store(false, Ordering::SeqCst);
    }
}

#[test]
fn germline_forks_a_copy_that_reaches_the_channel() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let code = format!("from mcp.server.fastmcp import FastMCP\ndef create_server():\n    m = FastMCP('echo')\n    @m.tool()\n    def echo(text: str) -> str:\n        return open('{}/a.txt').read() + text\n    return m\n", data.display());
    let spec = release(tmp.path(), &code, &data);
    std::fs::write(data.join("a.txt"), "SECRET").unwrap();
    let mut g = Germline::start(&spec).unwrap();
    eprintln!("germline started in {:?}", g.start_time);
    let copy = g.fork_copy().unwrap();
    let chan = connect_with_view(&copy, &data);
    chan.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = chan.try_clone().unwrap();
    w.write_all(b"{\"twin\":{\"clock\":1000.0,\"seed\":\"00\"},\"slot\":{}}\n").unwrap();
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}\n").unwrap();
    let mut r = BufReader::new(chan);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    eprintln!("init: {line}");
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n").unwrap();
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"hi\"}}}\n").unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    eprintln!("call: {line}");
    assert!(line.contains("VIEWhi"), "{line}");
    copy.kill().unwrap();
}

/// Bad input: a sandbox whose set-up fails in the child is refused with the failed step
/// named (here the working directory does not exist inside the root).
#[test]
fn a_sandbox_that_fails_to_build_names_the_step() {
    use std::os::fd::AsRawFd;
    let tmp = tempfile::tempdir().unwrap();
    let confinement = Confinement {
        read_only: vec!["/usr".into(), "/bin".into(), "/lib".into()],
        data_roots: vec![tmp.path().join("data")],
        ..Confinement::default()
    };
    let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let sandbox = confinement
        .prepare(&tmp.path().join("stage"), std::path::Path::new("/no-such-workdir"), Some(theirs.as_raw_fd()))
        .unwrap();
    std::fs::create_dir_all(tmp.path().join("stage")).unwrap();
    let mut cmd = std::process::Command::new("/bin/true");
    let report = sandbox.install(&mut cmd);
    let e = cmd.spawn().map(|mut c| c.wait()).unwrap_err();
    let why = report.explain(&e);
    assert!(why.contains("entering the release directory failed"), "{why}");
}

/// Bad input: an interpreter that cannot be executed in the germline's root is refused
/// with the exec's own error and the interpreter named, not an abort in the child. (With
/// the child's descriptors closed before exec, the standard library's exec-error pipe was
/// gone too, and the germline died of SIGABRT with "fatal runtime error: assertion
/// failed: output.write(&bytes).is_ok()".)
#[test]
fn an_interpreter_the_root_cannot_run_is_refused_with_the_exec_error() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = release(tmp.path(), "def create_server():\n    pass\n", &tmp.path().join("data"));
    spec.runtime.python = tmp.path().join("no-such-python");
    let e = match Germline::start(&spec) {
        Ok(_) => panic!("a germline started with no interpreter"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("could not start the germline: No such file or directory"), "{e}");
    assert!(e.contains("no-such-python"), "the interpreter is not named: {e}");
    assert!(!e.contains("SIGABRT") && !e.contains("fatal runtime error"), "{e}");
}

/// A launcher script (the way pyenv and asdf put `python3` on PATH: a shell script that
/// picks and runs an interpreter) is resolved to the interpreter it runs, which is what
/// the germline's root holds; the germline starts and its copy answers.
#[test]
fn a_launcher_script_is_resolved_to_the_interpreter_it_runs() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut spec = release(
        tmp.path(),
        "from mcp.server.fastmcp import FastMCP\ndef create_server():\n    return FastMCP('s')\n",
        &data,
    );
    let real = spec.runtime.python.clone();
    let bin = tmp.path().join("shims");
    std::fs::create_dir_all(&bin).unwrap();
    let launcher = bin.join("python3");
    std::fs::write(&launcher, format!("#!/bin/sh\nexec '{}' \"$@\"\n", real.display())).unwrap();
    std::fs::set_permissions(&launcher, std::fs::Permissions::from_mode(0o755)).unwrap();
    spec.runtime = PythonRuntime::at(launcher.clone(), &tmp.path().join("shim")).unwrap();
    assert_eq!(spec.runtime.python, real, "the launcher was not resolved");
    let mut g = Germline::start(&spec).unwrap();
    let copy = g.fork_copy().unwrap();
    copy.kill().unwrap();
}

/// A germline whose next `fail` copies cannot be made (as when a host limit refuses a fork
/// for a moment), then made as usual.
struct Flaky {
    germline: Germline,
    fail: u32,
}

impl germline_executor::pool::CopySource for Flaky {
    fn make(&mut self) -> Result<CopyProcess, germline_executor::ExecutorError> {
        if self.fail > 0 {
            self.fail -= 1;
            return Err(germline_executor::ExecutorError::Copy("no copy this time".into()));
        }
        germline_executor::pool::CopySource::make(&mut self.germline)
    }

    fn retire(&mut self, copy: CopyProcess) {
        germline_executor::pool::CopySource::retire(&mut self.germline, copy)
    }

    fn settle(&mut self) -> Result<(), germline_executor::ExecutorError> {
        germline_executor::pool::CopySource::settle(&mut self.germline)
    }
}

/// One copy that cannot be made leaves the pool on: the next one is made and readied. Two
/// in a row turn it off for the germline (its calls then fork their copies as they come).
/// (Before, the first failure turned the pool off for good.)
#[test]
fn a_copy_that_cannot_be_made_once_leaves_the_pool_on() {
    use germline_executor::pool::{CopyPool, Readiness};
    let tmp = tempfile::tempdir().unwrap();
    let spec = release(
        tmp.path(),
        "from mcp.server.fastmcp import FastMCP\ndef create_server():\n    return FastMCP('s')\n",
        &tmp.path().join("data"),
    );
    for (fail, pooling) in [(1, true), (2, false)] {
        let source = Flaky { germline: Germline::start(&spec).unwrap(), fail };
        let pool = CopyPool::new(Box::new(source), 1, Readiness::Initialized, 1 << 20, Vec::new());
        let ready = pool.wait_ready(1, Duration::from_secs(60));
        assert_eq!(pool.pooling(), pooling, "{fail} failures in a row");
        assert_eq!(ready, usize::from(pooling), "{fail} failures in a row: ready copies");
    }
}
