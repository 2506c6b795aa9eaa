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
    // No thread at all: the process has exited and is being reaped (a live one always has
    // its main thread). Not a refusal of the release: the caller learns the process is
    // gone (a germline killed while the pool forked from it is started again).
    if threads == 0 {
        return Err(ExecutorError::io(format!("G1: process {pid} has exited"))(std::io::Error::from_raw_os_error(
            libc::ESRCH,
        )));
    }
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
    let maps = match maps::by_query(pid, scratch_dev)? {
        Some(found) => found,
        None => {
            static NOTED: std::sync::Once = std::sync::Once::new();
            NOTED.call_once(|| {
                tracing::info!("this kernel has no PROCMAP_QUERY (Linux 6.11): G3 reads the text of /proc/PID/maps")
            });
            maps::by_text(pid)?
        }
    };
    match g3_findings(&maps, scratch_dev).into_iter().next() {
        Some((_, finding)) => Err(ExecutorError::refused("G3", finding)),
        None => Ok(()),
    }
}

/// What G3 refuses among `maps`, in address order. An allowlist: a mapping passes when it
/// is private and not of a file on `scratch_dev`, or shared, read-only and of a named,
/// existing file (a path, not `(deleted)`, not `/dev/zero`, a memfd or System V memory).
/// Anything else that is shared, anonymous shared memory under any name included
/// (`[anon_shmem:NAME]` where the kernel allows naming it), is memory every copy would
/// share.
fn g3_findings(maps: &[maps::Mapping], scratch_dev: Option<(u32, u32)>) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for m in maps {
        if scratch_dev == Some(m.dev) {
            let kind = if m.shared { "shared" } else { "private" };
            out.push((m.start, format!("{kind} mapping {} of a file of the germline's import scratch", m.describe())));
            continue;
        }
        if m.shared && (m.writable || !maps::names_an_existing_file(&m.name)) {
            out.push((m.start, format!("shared mapping {}", m.describe())));
        }
    }
    out
}

/// A process's mappings as G3 reads them: asked one at a time of the kernel
/// (`PROCMAP_QUERY`, Linux 6.11), or parsed from the text of `/proc/PID/maps` where the
/// kernel lacks it. The query skips in the kernel what G3 need not see (private mappings,
/// or anonymous ones when the import scratch is checked) and formats no path but those of
/// shared mappings: reading the text formats every mapping's path, about a seventh of
/// the broker's CPU per call under load.
mod maps {
    use std::fs;
    use std::os::fd::AsRawFd;

    use crate::ExecutorError;

    /// One mapping: its range, permissions, the device of its file (0:0 for none) and its
    /// name as `/proc/PID/maps` prints it (a path, `[heap]`, ... or empty; asked of the
    /// kernel for shared mappings only).
    #[derive(Debug, PartialEq, Eq)]
    pub struct Mapping {
        pub start: u64,
        pub end: u64,
        pub readable: bool,
        pub writable: bool,
        pub executable: bool,
        pub shared: bool,
        pub dev: (u32, u32),
        pub name: String,
    }

    impl Mapping {
        pub fn describe(&self) -> String {
            let flag = |on: bool, c: char| if on { c } else { '-' };
            let perms: String = [
                flag(self.readable, 'r'),
                flag(self.writable, 'w'),
                flag(self.executable, 'x'),
                if self.shared { 's' } else { 'p' },
            ]
            .into_iter()
            .collect();
            let (major, minor) = self.dev;
            let name = if self.name.is_empty() { String::new() } else { format!(" {}", self.name) };
            format!("{:x}-{:x} {perms} {major:02x}:{minor:02x}{name}", self.start, self.end)
        }
    }

    /// Whether a shared mapping's name is that of a file that has a path: not anonymous
    /// shared memory (`/dev/zero`, memfd, System V, any `[...]` name), not an unlinked file.
    pub fn names_an_existing_file(name: &str) -> bool {
        name.starts_with('/')
            && !name.ends_with("(deleted)")
            && !name.starts_with("/dev/zero")
            && !name.starts_with("/memfd:")
            && !name.starts_with("/SYSV")
    }

    /// `struct procmap_query` of `<linux/fs.h>`.
    #[repr(C)]
    #[derive(Default)]
    struct ProcmapQuery {
        size: u64,
        query_flags: u64,
        query_addr: u64,
        vma_start: u64,
        vma_end: u64,
        vma_flags: u64,
        vma_page_size: u64,
        vma_offset: u64,
        inode: u64,
        dev_major: u32,
        dev_minor: u32,
        vma_name_size: u32,
        build_id_size: u32,
        vma_name_addr: u64,
        build_id_addr: u64,
    }

    const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 104);
    /// `_IOWR('f', 17, struct procmap_query)`.
    const PROCMAP_QUERY: libc::c_ulong = 0xc068_6611;
    const VMA_READABLE: u64 = 0x01;
    const VMA_WRITABLE: u64 = 0x02;
    const VMA_EXECUTABLE: u64 = 0x04;
    const VMA_SHARED: u64 = 0x08;
    const COVERING_OR_NEXT_VMA: u64 = 0x10;
    const FILE_BACKED_VMA: u64 = 0x20;
    /// More mappings than a process can have (`vm.max_map_count` is 65530 by default).
    const MAX_MAPPINGS: usize = 1 << 22;

    /// The mappings G3 must see, asked of the kernel: every shared mapping (with its
    /// name), and with `scratch_dev` every mapping of a file too (named when it is of a
    /// file on that device). `None` when this kernel has no `PROCMAP_QUERY`.
    pub fn by_query(pid: i32, scratch_dev: Option<(u32, u32)>) -> Result<Option<Vec<Mapping>>, ExecutorError> {
        let path = format!("/proc/{pid}/maps");
        let maps = fs::File::open(&path).map_err(ExecutorError::io(format!("opening {path}")))?;
        let mut out = Vec::new();
        if !query_each(&maps, &path, VMA_SHARED, true, &mut out)? {
            return Ok(None);
        }
        if let Some(dev) = scratch_dev {
            let mut file_backed = Vec::new();
            if !query_each(&maps, &path, FILE_BACKED_VMA, false, &mut file_backed)? {
                return Ok(None);
            }
            for mut m in file_backed.into_iter().filter(|m| !m.shared) {
                if m.dev == dev {
                    let mut named = Vec::new();
                    query_at(&maps, &path, m.start, FILE_BACKED_VMA, true, &mut named)?;
                    m.name = named.pop().filter(|n| n.start == m.start).map(|n| n.name).unwrap_or_default();
                }
                out.push(m);
            }
            out.sort_by_key(|m| m.start);
        }
        Ok(Some(out))
    }

    /// Asks for every mapping matching `filter`, in address order; false when the kernel
    /// does not know the request (before any answer).
    fn query_each(
        maps: &fs::File,
        path: &str,
        filter: u64,
        names: bool,
        out: &mut Vec<Mapping>,
    ) -> Result<bool, ExecutorError> {
        let mut addr = 0u64;
        loop {
            if out.len() >= MAX_MAPPINGS {
                return Err(ExecutorError::refused("G3", format!("more than {MAX_MAPPINGS} mappings in {path}")));
            }
            match query_at(maps, path, addr, filter, names, out)? {
                Answer::Unknown if out.is_empty() => return Ok(false),
                Answer::Unknown => {
                    return Err(ExecutorError::io(format!("asking {path} for its mappings"))(std::io::Error::other(
                        "the kernel stopped answering PROCMAP_QUERY",
                    )))
                }
                Answer::NoMore => return Ok(true),
                Answer::Next(end) => addr = end,
            }
        }
    }

    enum Answer {
        /// The kernel does not know `PROCMAP_QUERY`.
        Unknown,
        /// No mapping matches at or after the address.
        NoMore,
        /// One was pushed; it ends here.
        Next(u64),
    }

    /// Asks for the first mapping matching `filter` at or after `addr` (with its name
    /// when `name`) and pushes it onto `out`.
    fn query_at(
        maps: &fs::File,
        path: &str,
        addr: u64,
        filter: u64,
        name: bool,
        out: &mut Vec<Mapping>,
    ) -> Result<Answer, ExecutorError> {
        let mut buf = if name { vec![0u8; libc::PATH_MAX as usize] } else { Vec::new() };
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_flags: filter | COVERING_OR_NEXT_VMA,
            query_addr: addr,
            vma_name_size: buf.len() as u32,
            // The kernel refuses an address with a size of 0.
            vma_name_addr: if name { buf.as_mut_ptr() as u64 } else { 0 },
            ..Default::default()
        };
        // SAFETY: PROCMAP_QUERY writes only into `q` and, up to `vma_name_size` bytes,
        // into `buf`, both live across the call.
        let rc = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY, &mut q as *mut ProcmapQuery) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(Answer::NoMore),
                Some(libc::ENOTTY | libc::EINVAL) => Ok(Answer::Unknown),
                // A name longer than PATH_MAX: a mapping G3 cannot name.
                Some(libc::ENAMETOOLONG) => Err(ExecutorError::refused(
                    "G3",
                    format!("a mapping at or after {addr:x} whose name is too long to read"),
                )),
                _ => Err(ExecutorError::io(format!("asking {path} for its mappings"))(e)),
            };
        }
        if q.vma_end <= addr || q.vma_end <= q.vma_start {
            return Err(ExecutorError::io(format!("asking {path} for its mappings"))(std::io::Error::other(format!(
                "the kernel answered {:x}-{:x} for an address of {addr:x}",
                q.vma_start, q.vma_end
            ))));
        }
        // The size counts the terminating NUL.
        let len = (q.vma_name_size as usize).saturating_sub(1).min(buf.len());
        out.push(Mapping {
            start: q.vma_start,
            end: q.vma_end,
            readable: q.vma_flags & VMA_READABLE != 0,
            writable: q.vma_flags & VMA_WRITABLE != 0,
            executable: q.vma_flags & VMA_EXECUTABLE != 0,
            shared: q.vma_flags & VMA_SHARED != 0,
            dev: (q.dev_major, q.dev_minor),
            name: String::from_utf8_lossy(&buf[..len]).into_owned(),
        });
        Ok(Answer::Next(q.vma_end))
    }

    /// Every mapping, parsed from the text of `/proc/PID/maps`.
    pub fn by_text(pid: i32) -> Result<Vec<Mapping>, ExecutorError> {
        let path = format!("/proc/{pid}/maps");
        let text = fs::read_to_string(&path).map_err(ExecutorError::io(format!("reading {path}")))?;
        text.lines()
            .map(|l| {
                parse_line(l).ok_or_else(|| ExecutorError::refused("G3", format!("unreadable line of {path}: {l}")))
            })
            .collect()
    }

    /// `start-end perms offset major:minor inode   name`; the name (which may hold spaces)
    /// is the rest of the line.
    fn parse_line(line: &str) -> Option<Mapping> {
        let mut f = line.splitn(6, ' ');
        let (range, perms, _offset, dev, _inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let name = f.next().unwrap_or("").trim_start().to_owned();
        let (start, end) = range.split_once('-')?;
        let (major, minor) = dev.split_once(':')?;
        let perms = perms.as_bytes();
        if perms.len() != 4 {
            return None;
        }
        Some(Mapping {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            readable: perms[0] == b'r',
            writable: perms[1] == b'w',
            executable: perms[2] == b'x',
            shared: perms[3] == b's',
            dev: (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?),
            name,
        })
    }
}

/// The ranges of `pid`'s private, writable, anonymous mappings (its heap and anonymous
/// `mmap`s, not its stack), read from `/proc/PID/maps`.
pub fn private_anonymous_ranges(pid: i32) -> Result<Vec<(u64, u64)>, ExecutorError> {
    Ok(maps::by_text(pid)?
        .into_iter()
        .filter(|m| m.writable && !m.shared && m.dev == (0, 0) && (m.name.is_empty() || m.name == "[heap]"))
        .map(|m| (m.start, m.end))
        .collect())
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

    /// Maps `len` bytes of `fd` (or anonymous memory for -1) at an address of the kernel's choosing.
    fn map(len: usize, prot: i32, flags: i32, fd: i32) -> usize {
        // SAFETY: a fresh mapping at an address the kernel picks; unmapped by the caller.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        p as usize
    }

    #[test]
    fn g3_finds_the_same_by_query_and_by_text() {
        use std::os::fd::AsRawFd;
        let me = std::process::id() as i32;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file with spaces");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
        let read_only = std::fs::File::open(&path).unwrap();
        // SAFETY: memfd_create on a constant name; the descriptor is owned below.
        let memfd = unsafe { libc::memfd_create(c"g3".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(memfd >= 0);
        // SAFETY: a fresh descriptor owned by nobody else.
        let memfd = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(memfd) };
        memfd.set_len(4096).unwrap();
        let (r, rw) = (libc::PROT_READ, libc::PROT_READ | libc::PROT_WRITE);
        let (shared, private, anon) = (libc::MAP_SHARED, libc::MAP_PRIVATE, libc::MAP_ANONYMOUS);
        let made = [
            (map(8192, r, shared, read_only.as_raw_fd()), 8192, "shared read-only file: allowed"),
            (map(8192, r, private, read_only.as_raw_fd()), 8192, "private file: allowed but on the scratch device"),
            (map(4096, rw, shared | anon, -1), 4096, "shared anonymous writable"),
            (map(4096, r, shared | anon, -1), 4096, "shared anonymous read-only"),
            (map(4096, r, shared, memfd.as_raw_fd()), 4096, "memfd read-only"),
        ];
        let ours = |maps: Vec<maps::Mapping>| -> Vec<maps::Mapping> {
            maps.into_iter().filter(|m| made.iter().any(|(p, ..)| m.start == *p as u64)).collect()
        };
        let by_text = ours(maps::by_text(me).unwrap());
        assert_eq!(by_text.len(), made.len(), "{by_text:?}");
        assert!(by_text.iter().any(|m| m.name.ends_with("file with spaces")), "{by_text:?}");
        let by_query = match maps::by_query(me, Some(dev)).unwrap() {
            Some(found) => ours(found),
            None => {
                // Before Linux 6.11 the text is all there is.
                let (major, minor) = kernel_version();
                assert!((major, minor) < (6, 11), "PROCMAP_QUERY missing on Linux {major}.{minor}");
                return;
            }
        };
        let starts = |f: Vec<(u64, String)>| f.into_iter().map(|(s, _)| s as usize).collect::<Vec<_>>();
        for scratch in [None, Some(dev)] {
            let (q, t) = (g3_findings(&by_query, scratch), g3_findings(&by_text, scratch));
            assert_eq!(starts(q.clone()), starts(t.clone()), "query {q:?}\ntext {t:?}");
            let mut expected: Vec<usize> = made[2..].iter().map(|(p, ..)| *p).collect();
            if scratch.is_some() {
                expected.extend(made[..2].iter().map(|(p, ..)| *p));
            }
            expected.sort();
            if scratch.is_some() {
                // Both name the file a refused mapping of the scratch is of.
                for f in [&q, &t] {
                    let (_, text) = f.iter().find(|(s, _)| *s as usize == made[1].0).unwrap();
                    assert!(
                        text.contains("private mapping")
                            && text.ends_with("file with spaces of a file of the germline's import scratch"),
                        "{text}"
                    );
                }
            }
            assert_eq!(starts(q), expected, "scratch {scratch:?}");
        }
        for (p, len, _) in made {
            // SAFETY: unmapping what `map` mapped above.
            unsafe { libc::munmap(p as *mut libc::c_void, len) };
        }
    }

    fn kernel_version() -> (u32, u32) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release.trim().split(['.', '-']).map(|n| n.parse().unwrap_or(0));
        (v.next().unwrap_or(0), v.next().unwrap_or(0))
    }

    #[test]
    fn g3_allows_shared_memory_only_of_a_named_existing_file() {
        for (name, allowed) in [
            ("/usr/lib/x86_64-linux-gnu/libc.so.6", true),
            ("/a path/with spaces", true),
            ("", false),
            ("[anon_shmem:named]", false),
            ("[heap]", false),
            ("/dev/zero (deleted)", false),
            ("/memfd:buffer (deleted)", false),
            ("/SYSV00000000 (deleted)", false),
            ("/tmp/unlinked (deleted)", false),
        ] {
            assert_eq!(maps::names_an_existing_file(name), allowed, "{name:?}");
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
