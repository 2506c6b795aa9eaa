//! Facts about a process that the kernel vouches for, read from `/proc` by the broker:
//! the germline checks G1–G3, namespace identities and children (DESIGN §2, A2).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::ExecutorError;

/// Identity of one namespace (device and inode of `/proc/PID/ns/KIND`).
pub type NsId = (u64, u64);

/// The namespace kinds every copy must have fresh.
pub const COPY_NAMESPACES: [&str; 5] = ["user", "pid", "net", "ipc", "mnt"];

/// Reads the identity of namespace `kind` of `pid`.
pub fn namespace(pid: i32, kind: &str) -> Result<NsId, ExecutorError> {
    let m = fs::metadata(format!("/proc/{pid}/ns/{kind}"))
        .map_err(ExecutorError::io(format!("reading namespace {kind} of {pid}")))?;
    Ok((m.dev(), m.ino()))
}

/// The process state letter from `/proc/PID/stat` (R, S, T, Z, ...).
pub fn state(pid: i32) -> Result<char, ExecutorError> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(ExecutorError::io(format!("reading /proc/{pid}/stat")))?;
    // The command name may contain spaces and parentheses: the state follows the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    rest.trim_start().chars().next().ok_or_else(|| ExecutorError::Copy(format!("bad stat for {pid}")))
}

/// The process's pid in its own (innermost) PID namespace: the last `NSpid` entry.
pub fn pid_in_own_namespace(pid: i32) -> Result<i32, ExecutorError> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(ExecutorError::io(format!("reading /proc/{pid}/status")))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| ExecutorError::Copy(format!("no NSpid for {pid}")))
}

/// The identity of the parent of a process's PID namespace.
pub fn parent_pid_namespace(pid: i32) -> Result<NsId, ExecutorError> {
    let f = fs::File::open(format!("/proc/{pid}/ns/pid"))
        .map_err(ExecutorError::io(format!("opening the PID namespace of {pid}")))?;
    // SAFETY: NS_GET_PARENT on a namespace descriptor we own returns a new descriptor.
    let parent = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&f), libc::NS_GET_PARENT) };
    if parent < 0 {
        return Err(ExecutorError::io(format!("the parent PID namespace of {pid}"))(std::io::Error::last_os_error()));
    }
    // SAFETY: `parent` is a fresh descriptor owned by nobody else.
    let p = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(parent) };
    let m = p.metadata().map_err(ExecutorError::io("PID namespace identity"))?;
    Ok((m.dev(), m.ino()))
}

/// The parent pid from `/proc/PID/stat`.
pub fn parent(pid: i32) -> Result<i32, ExecutorError> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(ExecutorError::io(format!("reading /proc/{pid}/stat")))?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    rest.split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| ExecutorError::Copy(format!("bad stat for {pid}")))
}

/// Live (non-zombie) children of every thread of `pid`, as pids in our namespace.
pub fn live_children(pid: i32) -> Result<Vec<i32>, ExecutorError> {
    let mut out = Vec::new();
    let tasks =
        fs::read_dir(format!("/proc/{pid}/task")).map_err(ExecutorError::io(format!("listing threads of {pid}")))?;
    for t in tasks.flatten() {
        let path = t.path().join("children");
        let Ok(s) = fs::read_to_string(&path) else {
            continue;
        };
        for c in s.split_whitespace().filter_map(|c| c.parse::<i32>().ok()) {
            if state(c).map(|s| s != 'Z' && s != 'X').unwrap_or(false) {
                out.push(c);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Test-only switch ("mechanism off"): G2 admits, besides the control socket, `/dev/null`
/// and read-only regular files, as it did before issue 11. Never set outside tests.
pub static RELAX_G2_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// The G2 rule, quoted in every refusal.
pub const G2_RULE: &str = "a germline may hold no descriptor (its control channel is signals): any open file \
     description, regular files, /dev/null and sockets included, would be shared with each copy, whose offset, \
     status flags or options a copy could change and the germline or a later copy read";

/// What a germline may hold open (G2).
pub struct AllowedFds {
    /// Only in the "mechanism off" test of a shared control socket: its inode.
    pub control_socket_inode: Option<u64>,
    /// Debugging only (`GERMLINE_DEBUG_GERMLINE`): stderr left open to the terminal.
    pub debug_stderr: bool,
    /// The device (major, minor) of the germline's import scratch, writable while the
    /// release was imported: no shared mapping of a file there is allowed (G3).
    pub scratch_dev: Option<(u32, u32)>,
}

/// Test-only switch ("mechanism off"): G3 allows shared read-only and private mappings of
/// files of the germline's import scratch. Never set outside tests.
pub static SCRATCH_MAPPING_CHECK_OFF_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// G1: exactly one thread.
pub fn check_g1(pid: i32) -> Result<(), ExecutorError> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(ExecutorError::io(format!("reading /proc/{pid}/status")))?;
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .ok_or_else(|| ExecutorError::refused("G1", "no thread count in /proc status"))?;
    if threads != 1 {
        return Err(ExecutorError::refused(
            "G1",
            format!("{threads} threads, expected 1 (besides the main thread: {}); {G1_ADVICE}", thread_names(pid)),
        ));
    }
    Ok(())
}

/// What a deployer can do about a G1 refusal.
pub const G1_ADVICE: &str = "a thread started at import would be lost in every copy, so the germline must be \
     single-threaded when it is ready; germline starts it with the variables that keep known native pools \
     single-threaded (germline::SINGLE_THREADED_POOLS); a library that still starts threads needs its own \
     variable or must start them lazily, at the first call";

/// The names (`comm`) of a process's threads other than its main thread, at most eight.
fn thread_names(pid: i32) -> String {
    let mut names: Vec<(i32, String)> = fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str().and_then(|t| t.parse::<i32>().ok()))
                .filter(|&tid| tid != pid)
                .map(|tid| {
                    let comm = fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
                    (tid, comm.trim().chars().filter(|c| !c.is_control()).collect())
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let more = names.len().saturating_sub(8);
    let mut out: Vec<String> = names.into_iter().take(8).map(|(_, n)| format!("{n:?}")).collect();
    if more > 0 {
        out.push(format!("and {more} more"));
    }
    out.join(", ")
}

/// G2, an allowlist: no descriptor at all (stderr only when debugging).
///
/// After `fork` the germline and every copy share each open file description the germline
/// holds, and with it the description's state: a regular file's offset, any file's status
/// flags (`F_SETFL`), a socket's options. A copy that has seen an item could write that
/// state and the germline or a later copy read it, so a germline holding anything else —
/// read-only files and `/dev/null` included — is refused.
pub fn check_g2(pid: i32, allowed: &AllowedFds) -> Result<(), ExecutorError> {
    let relaxed = RELAX_G2_FOR_TESTS.load(Ordering::Relaxed);
    let dir = format!("/proc/{pid}/fd");
    let entries = fs::read_dir(&dir).map_err(ExecutorError::io(format!("listing {dir}")))?;
    for e in entries {
        let e = e.map_err(ExecutorError::io(format!("listing {dir}")))?;
        let fd = e.file_name().to_string_lossy().into_owned();
        let target = fs::read_link(e.path()).map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|_| "?".into());
        let control = allowed.control_socket_inode.is_some_and(|i| target == format!("socket:[{i}]"));
        if control || (allowed.debug_stderr && fd == "2") {
            continue;
        }
        if relaxed && relaxed_allowance(pid, &fd, &target, &e.path()) {
            continue;
        }
        return Err(ExecutorError::refused("G2", format!("descriptor {fd} -> {target}: {G2_RULE}")));
    }
    Ok(())
}

/// What G2 admitted before issue 11 (the "mechanism off" twin only): `/dev/null` and
/// read-only regular files that are not anonymous.
fn relaxed_allowance(pid: i32, fd: &str, target: &str, path: &std::path::Path) -> bool {
    if target == "/dev/null" {
        return true;
    }
    let flags = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok().and_then(|s| {
        s.lines().find_map(|l| l.strip_prefix("flags:")).and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
    });
    let read_only = flags.is_some_and(|f| f & libc::O_ACCMODE as u32 == libc::O_RDONLY as u32);
    let regular = fs::metadata(path).map(|m| m.file_type().is_file()).unwrap_or(false);
    let anonymous = target.ends_with(" (deleted)") || target.starts_with("/memfd:");
    read_only && regular && !anonymous
}

/// G3: no shared writable mapping, no shared mapping of anything that could be made
/// writable later (shared anonymous memory, memfd, SysV segments, deleted files), and no
/// mapping at all, private ones included, of a file of the import scratch on
/// `scratch_dev`. A read-only shared mapping of a file opened for writing there can be made
/// writable with `mprotect` in every copy, even once the scratch is unmounted, and its
/// pages are the same in all of them. A private mapping keeps the detached tmpfs alive
/// too, shared by every copy: a read fault on a hole of its file allocates a page in the
/// file's page cache and a block of the tmpfs, so one copy can fill holes (and the tmpfs)
/// and a later one learn which, or how many, by whether its own faults still succeed.
pub fn check_g3(pid: i32, scratch_dev: Option<(u32, u32)>) -> Result<(), ExecutorError> {
    let scratch_dev = scratch_dev.filter(|_| !SCRATCH_MAPPING_CHECK_OFF_FOR_TESTS.load(Ordering::SeqCst));
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(ExecutorError::io(format!("reading /proc/{pid}/maps")))?;
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let (range, perms) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let path = parts.nth(3).unwrap_or("");
        let shared = perms.as_bytes().get(3) == Some(&b's');
        let dev = line
            .split_whitespace()
            .nth(3)
            .and_then(|d| d.split_once(':'))
            .and_then(|(a, b)| Some((u32::from_str_radix(a, 16).ok()?, u32::from_str_radix(b, 16).ok()?)));
        if scratch_dev.is_some() && dev == scratch_dev {
            let kind = if shared { "shared" } else { "private" };
            return Err(ExecutorError::refused(
                "G3",
                format!("{kind} mapping {range} {perms} of a file of the germline's import scratch"),
            ));
        }
        if !shared {
            continue;
        }
        let writable = perms.as_bytes().get(1) == Some(&b'w');
        let anonymous = path.is_empty()
            || path.starts_with("/dev/zero")
            || path.starts_with("/memfd:")
            || path.starts_with("/SYSV")
            || line.ends_with("(deleted)");
        if writable || anonymous {
            return Err(ExecutorError::refused("G3", format!("shared mapping {range} {perms} {path}")));
        }
    }
    Ok(())
}

/// Test-only switch ("mechanism off"): skip [`check_children_end_unseen`] and
/// [`check_exit_signal`]. Never set outside tests.
pub static CHILD_EXIT_CHECK_OFF_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// The rule quoted when a germline could learn how its copies ended.
pub const CHILD_EXIT_RULE: &str = "a germline must ignore SIGCHLD (SIG_IGN) whenever it is stopped, so the kernel \
     reaps every copy at once: a germline that could wait for its copies would read each copy's exit status and \
     resource usage (wait4), which the copy chooses after seeing items, and hand them to every later copy";

/// The germline's SIGCHLD disposition is SIG_IGN (`SigIgn` in `/proc/PID/status`). With it,
/// a dead copy (exit signal SIGCHLD, see [`check_exit_signal`]) is reaped by the kernel at
/// once and no SIGCHLD is queued, so nothing of its end (status, rusage, the siginfo of a
/// SIGCHLD) reaches the germline. Checked while the germline is stopped, before and after
/// every fork: it runs only in fork windows, so the disposition a copy dies under is the
/// one checked last.
pub fn check_children_end_unseen(pid: i32) -> Result<(), ExecutorError> {
    if CHILD_EXIT_CHECK_OFF_FOR_TESTS.load(Ordering::SeqCst) {
        return Ok(());
    }
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(ExecutorError::io(format!("reading /proc/{pid}/status")))?;
    let ignored = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or_else(|| ExecutorError::refused("children", "no SigIgn in /proc status"))?;
    if ignored & (1 << (libc::SIGCHLD - 1)) == 0 {
        return Err(ExecutorError::refused("children", format!("SIGCHLD is not ignored: {CHILD_EXIT_RULE}")));
    }
    Ok(())
}

/// The copy's exit signal (field 38 of `/proc/PID/stat`) is SIGCHLD: a copy cloned with
/// any other exit signal (or none) is never reaped automatically and its end is queued to
/// the germline as that signal, with status and CPU times in the siginfo.
pub fn check_exit_signal(copy: i32) -> Result<(), ExecutorError> {
    if CHILD_EXIT_CHECK_OFF_FOR_TESTS.load(Ordering::SeqCst) {
        return Ok(());
    }
    let stat = fs::read_to_string(format!("/proc/{copy}/stat"))
        .map_err(ExecutorError::io(format!("reading /proc/{copy}/stat")))?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    // Fields after the command name start at field 3 (state); exit_signal is field 38.
    let sig = rest.split_whitespace().nth(35).and_then(|s| s.parse::<i32>().ok());
    if sig != Some(libc::SIGCHLD) {
        return Err(ExecutorError::refused(
            "children",
            format!("the copy's exit signal is {sig:?}, not SIGCHLD: {CHILD_EXIT_RULE}"),
        ));
    }
    Ok(())
}

/// The rule a copy must meet before it is given its view, quoted in every refusal.
pub const COPY_IDS_RULE: &str =
    "before a copy is given data, it has one thread, which runs as the copy's own host ids \
     with no capability and no-new-privileges set, it has no child, and it holds only files and sockets: \
     a process, capability or object left from before the switch would count against the ids the germline and \
     other copies share";

/// Checks, from `/proc`, that copy `pid` switched to `ids` and can never act as any other
/// ids again ([`COPY_IDS_RULE`]):
/// - it has one thread (so nothing it starts later escapes the check);
/// - every thread's real, effective, saved and file-system uid and gid are the copy's,
///   with no supplementary group;
/// - no capability in any set (the copy's namespace maps only its root, and with
///   no-new-privileges an `execve` gains nothing back);
/// - no thread has a child: the copy is PID 1 of its namespace, so every process in it is
///   a descendant, and one made before the switch would still run as the shared ids;
/// - open descriptors are only files (of the read-only root: a file carries no counter
///   of its opener) and sockets: a pipe, an epoll or event instance or a memfd made before
///   the switch stays charged to the ids it was made under.
pub fn check_copy_ids(pid: i32, ids: crate::outside::CopyIds) -> Result<(), ExecutorError> {
    let refuse = |what: String| ExecutorError::refused("copy ids", format!("{what}: {COPY_IDS_RULE}"));
    // One thread: then every thread the copy starts later inherits the ids checked below
    // (which it can never leave). With more, one created while the list below is read
    // could escape it.
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(ExecutorError::io(format!("reading /proc/{pid}/status")))?;
    let threads = status.lines().find_map(|l| l.strip_prefix("Threads:")).map(str::trim).unwrap_or("?");
    if threads != "1" {
        return Err(refuse(format!(
            "the copy has {threads} threads at its check; a copy switches before it starts any"
        )));
    }
    let tasks =
        fs::read_dir(format!("/proc/{pid}/task")).map_err(ExecutorError::io(format!("listing threads of {pid}")))?;
    let mut seen = 0;
    for t in tasks.flatten() {
        seen += 1;
        let tid = t.file_name().to_string_lossy().into_owned();
        let status = fs::read_to_string(t.path().join("status"))
            .map_err(ExecutorError::io(format!("reading the status of copy thread {tid}")))?;
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or("?");
        for (name, want) in [("Uid:", ids.uid), ("Gid:", ids.gid)] {
            let got: Vec<&str> = field(name).split_whitespace().collect();
            if got.len() != 4 || got.iter().any(|v| v.parse::<u32>().ok() != Some(want)) {
                return Err(refuse(format!(
                    "copy thread {tid} has {name} {}, expected {want} four times",
                    got.join(" ")
                )));
            }
        }
        if !field("Groups:").is_empty() {
            return Err(refuse(format!("copy thread {tid} has supplementary groups {}", field("Groups:"))));
        }
        for name in ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:"] {
            if u64::from_str_radix(field(name), 16).ok() != Some(0) {
                return Err(refuse(format!("copy thread {tid} holds capabilities ({name} {})", field(name))));
            }
        }
        if field("NoNewPrivs:") != "1" {
            return Err(refuse(format!("copy thread {tid} lacks no-new-privileges")));
        }
        let children = fs::read_to_string(t.path().join("children")).unwrap_or_default();
        if let Some(c) = children.split_whitespace().next() {
            return Err(refuse(format!("copy thread {tid} has a child ({c}, {})", comm(c.parse().unwrap_or(0)))));
        }
        let fds = fs::read_dir(t.path().join("fd"))
            .map_err(ExecutorError::io(format!("listing the descriptors of copy thread {tid}")))?;
        for fd in fds.flatten() {
            let target = fs::read_link(fd.path()).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            let file = target.starts_with('/') && !target.starts_with("/memfd:") && !target.ends_with(" (deleted)");
            if !file && !target.starts_with("socket:[") {
                return Err(refuse(format!(
                    "copy descriptor {} ({target}) was open before the copy took its own ids",
                    fd.file_name().to_string_lossy()
                )));
            }
        }
    }
    if seen == 0 {
        return Err(ExecutorError::Copy(format!("copy {pid} is gone")));
    }
    Ok(())
}

/// G1–G3 together, and that the germline cannot learn how its copies end.
pub fn check_germline(pid: i32, allowed: &AllowedFds) -> Result<(), ExecutorError> {
    check_g1(pid)?;
    check_g2(pid, allowed)?;
    check_g3(pid, allowed.scratch_dev)?;
    check_children_end_unseen(pid)
}

/// The command name of `pid` (for naming a stray process), or `?`.
pub fn comm(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim().to_owned()).unwrap_or_else(|_| "?".into())
}

/// Whether `pid` lives in one of `namespaces` (PID namespaces of live copies) or in a PID
/// namespace nested below one of them. False for a process that is gone.
pub fn in_live_copy(pid: i32, namespaces: &std::collections::BTreeSet<NsId>) -> bool {
    let Ok(mut f) = fs::File::open(format!("/proc/{pid}/ns/pid")) else {
        return false;
    };
    for _ in 0..33 {
        let Ok(m) = f.metadata() else {
            return false;
        };
        if namespaces.contains(&(m.dev(), m.ino())) {
            return true;
        }
        // SAFETY: NS_GET_PARENT on a namespace descriptor we own returns a new descriptor.
        let parent = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&f), libc::NS_GET_PARENT) };
        if parent < 0 {
            return false;
        }
        // SAFETY: `parent` is a fresh descriptor owned by nobody else.
        f = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(parent) };
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_process_fails_g1_and_reads_state() {
        // The test harness is multi-threaded: G1 must say so.
        let me = std::process::id() as i32;
        let t = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        let err = check_g1(me).unwrap_err().to_string();
        assert!(err.contains("G1"), "{err}");
        t.join().unwrap();
        assert!(matches!(state(me).unwrap(), 'R' | 'S'));
        assert_eq!(parent(me).unwrap(), std::os::unix::process::parent_id() as i32);
    }

    #[test]
    fn g2_flags_a_pipe() {
        let me = std::process::id() as i32;
        let mut fds = [0; 2];
        // SAFETY: pipe2 into a local array.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let err = check_g2(me, &AllowedFds { control_socket_inode: None, debug_stderr: false, scratch_dev: None })
            .unwrap_err()
            .to_string();
        assert!(err.contains("G2"), "{err}");
        // SAFETY: closing the descriptors just made.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }

    #[test]
    fn g3_flags_shared_writable_memory() {
        let me = std::process::id() as i32;
        // SAFETY: anonymous shared mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let err = check_g3(me, None).unwrap_err().to_string();
        // SAFETY: unmapping what was mapped above.
        unsafe { libc::munmap(p, 4096) };
        assert!(err.contains("G3"), "{err}");
    }
}
