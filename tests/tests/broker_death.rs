//! Nothing outlives the broker: a broker killed by SIGKILL (no destructor runs) leaves no
//! germline, keeper or copy behind. Off (the first process does not watch the broker) the
//! germline stays, stopped, holding its release; on, every process of it is gone.
//!
//! The test runs this binary again as the broker (`broker_for_the_kill_test`, ignored
//! unless the test starts it), notes in `/proc` the tool host's processes beneath it
//! (keeper, germline, copies: their command line names `germline_host.py`), kills it, and
//! looks for any of them still there.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use germline_executor::germline::BROKER_WATCH_OFF_FOR_TESTS;
use germline_executor::runtime::RuntimeKind;
use germline_tests::world::{request, result_text, World};
use serde_json::json;

const CHILD_VAR: &str = "GERMLINE_TEST_KILLED_BROKER";

const ECHO: &str = r#"
def create_server():
    m = FastMCP("echo")

    @m.tool()
    def echo(text: str) -> str:
        return text

    return m
"#;

/// A process's parent and start time (`/proc/<pid>/stat` fields 4 and 22), if it exists.
fn parent_and_start(pid: i32) -> Option<(i32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: fields count from its end.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// The tool host's processes beneath `root` (each with its start time, so a pid used
/// again later is not taken for it).
fn tool_host_processes_under(root: i32) -> Vec<(i32, u64)> {
    let all: Vec<(i32, i32, u64)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter_map(|pid| parent_and_start(pid).map(|(ppid, start)| (pid, ppid, start)))
        .collect();
    let mut under = vec![root];
    let mut grew = true;
    while grew {
        grew = false;
        for (pid, ppid, _) in &all {
            if under.contains(ppid) && !under.contains(pid) {
                under.push(*pid);
                grew = true;
            }
        }
    }
    all.into_iter()
        .filter(|(pid, _, _)| *pid != root && under.contains(pid))
        .filter(|(pid, _, _)| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("germline_host.py"))
        })
        .map(|(pid, _, start)| (pid, start))
        .collect()
}

/// Those of `procs` still running (a zombie has been reaped by no one yet, but runs no code).
fn still_there(procs: &[(i32, u64)]) -> Vec<i32> {
    procs
        .iter()
        .filter(|(pid, start)| parent_and_start(*pid).is_some_and(|(_, s)| s == *start))
        .filter(|(pid, _)| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
                == Some(false)
        })
        .map(|(pid, _)| *pid)
        .collect()
}

/// Starts a broker in a child process, waits until its germline has served a call, kills
/// the broker with SIGKILL and returns the processes naming the release that are still
/// there after up to `grace`.
fn kill_broker(watch_off: bool, grace: Duration) -> (String, Vec<i32>) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "broker_for_the_kill_test", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, if watch_off { "off" } else { "on" })
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let release = loop {
        let line = lines.next().expect("the broker printed READY").unwrap();
        // The harness may print the test's name on the same line first.
        if let Some((_, r)) = line.split_once("READY ") {
            break r.trim().to_owned();
        }
    };
    let watched = tool_host_processes_under(child.id() as i32);
    assert!(!watched.is_empty(), "the germline runs before the kill");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let until = Instant::now() + grace;
    loop {
        let left = still_there(&watched);
        if left.is_empty() || Instant::now() > until {
            // The killed broker's world (its temporary directory) is ours to remove.
            if let Some(world) = std::path::Path::new(&release).parent() {
                let _ = std::fs::remove_dir_all(world);
            }
            return (release, left);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_broker_killed_without_dropping_leaves_no_germline_behind() {
    let (release, left) = kill_broker(true, Duration::from_secs(2));
    eprintln!("off: {} processes of {release} left 2 s after the broker died: {left:?}", left.len());
    assert!(!left.is_empty(), "off: the germline outlives its broker");
    for p in &left {
        // SAFETY: killing the leftovers of the "off" run.
        unsafe { libc::kill(*p, libc::SIGKILL) };
        unsafe { libc::kill(*p, libc::SIGCONT) };
    }
    let (release, left) = kill_broker(false, Duration::from_secs(5));
    eprintln!("on: {} processes of {release} left after the broker died: {left:?}", left.len());
    assert!(left.is_empty(), "on: processes {left:?} outlived the broker");
}

/// The broker of the test above (run only by it, in a child process).
#[test]
#[ignore = "the broker process of a_broker_killed_without_dropping_leaves_no_germline_behind"]
fn broker_for_the_kill_test() {
    let Ok(mode) = std::env::var(CHILD_VAR) else {
        return;
    };
    BROKER_WATCH_OFF_FOR_TESTS.store(mode == "off", std::sync::atomic::Ordering::SeqCst);
    let w = World::new();
    let rel = w.release("outlive", "", ECHO);
    let policy = w.policy(&[], &[("agent", &[])], "");
    let mut rt = w.start(RuntimeKind::Germline, &rel, policy).expect("the germline starts");
    let o = rt.call(&request("echo", json!({"text": "hi"}), &[]));
    assert_eq!(result_text(&o), "hi", "{:?}", o.error);
    println!("READY {}", rel.display());
    std::thread::sleep(Duration::from_secs(60));
}

/// What a first process does when its broker died before it looked (the broker killed while
/// the germline starts). `passed`: the broker opens a pidfd of itself and passes it, as the
/// broker does (`GERMLINE_BROKER_PIDFD`); else the first process opens one of its parent at
/// the time, as it did before (a process in the sandbox may no longer open pidfds at all).
/// Returns the script's output and whether its two stand-in children (keeper and germline)
/// are still running.
fn first_process_after_its_broker_died(passed: bool) -> (String, bool) {
    let w = World::new();
    let python = w.python();
    let out = w.dir.path().join("out.txt");
    let script = r#"
import os, select, sys, time
sys.path.insert(0, sys.argv[1])
import germline_host
time.sleep(0.3)  # the broker has exited by now
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    kids.append(pid)
print("KIDS", *kids, flush=True)
passed = os.environ.get("GERMLINE_BROKER_PIDFD")
fd = germline_host._broker_pidfd(*kids, int(passed)) if passed else os.pidfd_open(os.getppid())
p = select.poll()
p.register(fd, select.POLLIN)
if p.poll(0):
    print("BROKER GONE", flush=True)
    for k in kids:
        os.kill(k, 9)
else:
    watched = [l.split()[1] for l in open("/proc/self/fdinfo/%d" % fd) if l.startswith("Pid:")][0]
    print("WATCHING", watched, flush=True)
"#;
    // The broker: opens a pidfd of itself (or not), starts the first process in the
    // background with it and exits.
    let broker = r#"
import os, subprocess, sys
env = dict(os.environ)
fds = ()
if sys.argv[5] == "1":
    fd = os.pidfd_open(os.getpid())
    os.set_inheritable(fd, True)
    env["GERMLINE_BROKER_PIDFD"] = str(fd)
    fds = (fd,)
out = open(sys.argv[4], "w")
subprocess.Popen([sys.argv[1], "-I", "-c", sys.argv[2], sys.argv[3]], stdout=out, stderr=out, env=env,
                 pass_fds=fds, start_new_session=True)
"#;
    let status = Command::new(&python.python)
        .args(["-I", "-c", broker])
        .arg(&python.python)
        .arg(script)
        .arg(&python.shim_dir)
        .arg(&out)
        .arg(if passed { "1" } else { "0" })
        .status()
        .expect("the broker");
    assert!(status.success());
    let until = Instant::now() + Duration::from_secs(10);
    let (mut text, mut kids) = (String::new(), Vec::new());
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
        text = std::fs::read_to_string(&out).unwrap_or_default();
        kids = text
            .lines()
            .find_map(|l| l.strip_prefix("KIDS "))
            .map(|l| l.split_whitespace().filter_map(|p| p.parse::<i32>().ok()).collect())
            .unwrap_or_default();
        if text.contains("WATCHING") || text.contains("GONE") || text.contains("Error") {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let alive =
        kids.iter().any(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| !s.contains(") Z")));
    for p in &kids {
        // SAFETY: the script's own children, killed in case they are left.
        unsafe { libc::kill(*p, libc::SIGKILL) };
    }
    (text, alive)
}

#[test]
fn a_broker_gone_before_the_first_process_looks_leaves_nothing_behind() {
    // Off (a pidfd of the parent at the time): the first process watches whoever adopted
    // it, so its germline would outlive the broker for good.
    let (text, _) = first_process_after_its_broker_died(false);
    eprintln!("opened late: {text}");
    let watched = text.lines().find_map(|l| l.strip_prefix("WATCHING ")).expect("the watch started");
    assert_ne!(watched.trim(), "", "{text}");
    // On: the broker's own pidfd, passed, is readable at once: the first process kills both
    // children.
    let (text, alive) = first_process_after_its_broker_died(true);
    eprintln!("passed: {text}");
    assert!(text.contains("KIDS"), "{text}");
    assert!(text.contains("BROKER GONE"), "the first process watched someone else: {text}");
    assert!(!alive, "its children outlived the broker: {text}");
}
