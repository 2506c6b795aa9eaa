//! The seccomp policy of the germline and every copy: an allowlist of the syscalls (and of
//! the `fcntl`, `ioctl`, `prctl`, `madvise`, `futex`, `socket` arguments and the signal
//! numbers of `kill`, `tkill`, `tgkill`, `pidfd_send_signal` and `clone`) a Python MCP
//! server needs, so that no kernel object two copies alive at the same time could both
//! reach is left to carry a bit between them (DESIGN §5). Everything else fails with EPERM.
//!
//! Next to each allowed group stands why it cannot carry data between copies. The reasons
//! lean on the rest of the sandbox: every copy is PID 1 of fresh user, PID, network, IPC,
//! mount and UTS namespaces; every file system it can name is read-only (mount flags and
//! Landlock), except `/dev/null`; Landlock scopes signals and abstract sockets to the copy.
//!
//! Stacked filters, because one seccompiler filter has one match action; the allowlist is
//! installed last and allows the calls the others answer themselves: faked success for
//! file locks (a lock never taken cannot be observed by another copy, and SQLite still
//! works), ENOSYS for `clone3` (its flags sit behind a pointer seccomp cannot read; glibc
//! falls back to `clone`) and for `statx` (its answer carries a mount ID; every library
//! falls back to `newfstatat`). Only x86_64 is allowed: seccompiler's
//! architecture check kills a process calling through another ABI (i386 `int 0x80`), and
//! an instruction spliced in front of the allowlist refuses the x32 ABI (numbers with
//! bit 0x40000000), whatever the kernel supports.

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::ExecutorError;

/// Which filter a germline gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Allowlist,
    DenylistOnly,
}

/// The germline's seccomp policy, as data that tests can inspect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeccompPolicy {
    kind: Kind,
}

/// One group of unconditionally allowed syscalls, with why none of them reaches a kernel
/// object that another copy can also reach.
struct Group {
    why: &'static str,
    calls: &'static [(&'static str, i64)],
}

macro_rules! sys {
    ($($name:ident),* $(,)?) => { &[$((stringify!($name), libc::$name)),*] };
}

const ALLOWED: &[Group] = &[
    Group {
        why: "the caller's own address space; G3 refuses a germline holding a shared \
              writable mapping at every fork, every file is read-only (so a file mapping \
              cannot be written), and a new shared anonymous mapping reaches only the \
              copy's own descendants",
        calls: sys![SYS_brk, SYS_munmap, SYS_mremap, SYS_mprotect, SYS_msync, SYS_mseal],
    },
    Group {
        why: "descriptors and read-only files: every file system a copy can name is mounted \
              read-only and under a read-only Landlock rule (only /dev/null takes writes, and \
              keeps nothing), except the copy's own scratch (ramfs where the copy has a memory limit); what a copy writes goes to its own pipes and sockets, \
              which no other copy holds; reading a shared file moves at most its page-cache \
              residency (a timing channel, see SECURITY.md) and never its atime (noatime). \
              `statfs`/`fstatfs` are not here: a read-only bind still reports the host file \
              system's live free-block and free-inode counts, which the broker's own writes \
              (trigger openings, ledger, logs) move at a copy's choice. `statx` is listed \
              but answered ENOSYS before this list (`no_statx_program`): its answer carries \
              a mount ID",
        calls: sys![
            SYS_read,
            SYS_write,
            SYS_readv,
            SYS_writev,
            SYS_pread64,
            SYS_pwrite64,
            SYS_preadv,
            SYS_pwritev,
            SYS_preadv2,
            SYS_pwritev2,
            SYS_open,
            SYS_openat,
            SYS_close,
            SYS_close_range,
            SYS_lseek,
            SYS_dup,
            SYS_dup2,
            SYS_dup3,
            SYS_pipe,
            SYS_pipe2,
            SYS_stat,
            SYS_fstat,
            SYS_lstat,
            SYS_newfstatat,
            SYS_statx,
            SYS_access,
            SYS_faccessat,
            SYS_faccessat2,
            SYS_readlink,
            SYS_readlinkat,
            SYS_getdents64,
            SYS_getcwd,
            SYS_chdir,
            SYS_fchdir,
            SYS_umask,
            SYS_fsync,
            SYS_fdatasync,
            SYS_ftruncate,
            SYS_sendfile,
            SYS_copy_file_range,
            SYS_getxattr,
            SYS_lgetxattr,
            SYS_fgetxattr,
            SYS_listxattr,
            SYS_llistxattr,
            SYS_flistxattr,
        ],
    },
    Group {
        why: "changing names and metadata in the copy's own scratch tmpfs (TMPDIR), mounted \
              per copy in the copy's own mount namespace: every other file system a copy can \
              name is mounted read-only (EROFS) and Landlock grants making and removing names \
              only beneath the scratch's parent, so none of these reaches an inode another \
              copy or the germline can see",
        calls: sys![
            SYS_mkdir,
            SYS_mkdirat,
            SYS_rmdir,
            SYS_unlink,
            SYS_unlinkat,
            SYS_rename,
            SYS_renameat,
            SYS_renameat2,
            SYS_symlink,
            SYS_symlinkat,
            SYS_truncate,
            SYS_chmod,
            SYS_fchmod,
            SYS_fchmodat,
            SYS_utimensat,
        ],
    },
    Group {
        why: "waiting on the caller's own descriptors, timers and signals; epoll and \
              eventfd instances are unnamed and shared only by inheritance",
        calls: sys![
            SYS_poll,
            SYS_ppoll,
            SYS_select,
            SYS_pselect6,
            SYS_epoll_create,
            SYS_epoll_create1,
            SYS_epoll_ctl,
            SYS_epoll_wait,
            SYS_epoll_pwait,
            SYS_epoll_pwait2,
            SYS_eventfd,
            SYS_eventfd2,
            SYS_nanosleep,
            SYS_clock_nanosleep,
            SYS_sched_yield,
            SYS_restart_syscall,
        ],
    },
    Group {
        why: "reading clocks and the kernel's entropy (timing channels are out of scope and \
              bounded in SECURITY.md; setting clocks is not allowed)",
        calls: sys![
            SYS_clock_gettime,
            SYS_clock_getres,
            SYS_gettimeofday,
            SYS_time,
            SYS_getrandom,
            SYS_getitimer,
            SYS_setitimer,
            SYS_alarm,
        ],
    },
    Group {
        why: "processes, threads and signals: a copy is PID 1 of its own PID namespace, so \
              kill, wait and prlimit name only its own descendants; Landlock scopes signals \
              to the copy's domain; namespaces made by clone belong to the caller. \
              Signal-sending calls and clone are checked by argument below (standard signals \
              only: real-time ones queue against a limit shared per host user; no \
              CLONE_PIDFD). capset can only lower what the caller holds in its own user \
              namespace (a copy gives up everything before it is given data). Not \
              pidfd_open: a pidfd's inode number (fstat) is the process's pidfs number, drawn \
              from one counter of the whole host that every new thread moves, so a copy that \
              could open one would read how many threads all others made (`pidino`); Python \
              falls back to waiting without one",
        calls: sys![
            SYS_clone3,
            SYS_fork,
            SYS_vfork,
            SYS_execve,
            SYS_exit,
            SYS_exit_group,
            SYS_wait4,
            SYS_waitid,
            SYS_set_tid_address,
            SYS_set_robust_list,
            SYS_rseq,
            SYS_arch_prctl,
            SYS_getpid,
            SYS_getppid,
            SYS_gettid,
            SYS_getpgrp,
            SYS_getpgid,
            SYS_setpgid,
            SYS_getsid,
            SYS_setsid,
            SYS_getuid,
            SYS_geteuid,
            SYS_getgid,
            SYS_getegid,
            SYS_getresuid,
            SYS_getresgid,
            SYS_getgroups,
            SYS_capget,
            SYS_capset,
            SYS_prlimit64,
            SYS_getrlimit,
            SYS_setrlimit,
            SYS_getrusage,
            SYS_times,
            SYS_sched_getaffinity,
            SYS_uname,
            SYS_rt_sigaction,
            SYS_rt_sigprocmask,
            SYS_rt_sigreturn,
            SYS_rt_sigsuspend,
            SYS_rt_sigpending,
            SYS_rt_sigtimedwait,
            SYS_sigaltstack,
            SYS_pause,
        ],
    },
    Group {
        why: "sockets the caller already holds: each copy's network namespace holds only the \
              broker's listeners, Landlock allows TCP connect only to the broker's ports, and \
              socketpairs are unnamed (binding, listening and accepting are not allowed). Not \
              sendmsg/sendmmsg: their control messages (SCM_RIGHTS) put descriptors in flight, \
              which the kernel counts per host user (every copy's), and seccomp cannot read a \
              msghdr; Python sends with sendto. Not getsockname: a connected socket's own port \
              is drawn through the host-wide `table_perturb`, which any connect on the host \
              moves (asyncio does without it). Socket options are checked by argument below",
        calls: sys![SYS_connect, SYS_getpeername, SYS_sendto, SYS_recvfrom, SYS_recvmsg, SYS_recvmmsg, SYS_shutdown,],
    },
    Group {
        why: "confining the caller further (a copy's own Landlock layer): a ruleset only \
              narrows what its creator may do",
        calls: sys![SYS_landlock_create_ruleset, SYS_landlock_add_rule, SYS_landlock_restrict_self],
    },
];

/// Socket options (level, name) a Python client sets or reads on its own TCP sockets: each
/// is a setting or state of that socket alone. Not among them: `SO_COOKIE` and
/// `SO_NETNS_COOKIE` (drawn from host-wide counters that every copy moves),
/// `SO_INCOMING_CPU`, `SO_MEMINFO`, `TCP_INFO` and every other option.
const SOCKET_OPTIONS: [(i32, i32); 17] = [
    (libc::SOL_SOCKET, libc::SO_ERROR),
    (libc::SOL_SOCKET, libc::SO_TYPE),
    (libc::SOL_SOCKET, libc::SO_DOMAIN),
    (libc::SOL_SOCKET, libc::SO_PROTOCOL),
    (libc::SOL_SOCKET, libc::SO_ACCEPTCONN),
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::SOL_SOCKET, libc::SO_REUSEADDR),
    (libc::SOL_SOCKET, libc::SO_LINGER),
    (libc::SOL_SOCKET, libc::SO_RCVBUF),
    (libc::SOL_SOCKET, libc::SO_SNDBUF),
    (libc::SOL_SOCKET, libc::SO_RCVTIMEO),
    (libc::SOL_SOCKET, libc::SO_SNDTIMEO),
    (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
    (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY),
];

/// `fcntl` commands a Python server uses on its own descriptors. Not among them: F_NOTIFY
/// (dnotify: a copy would learn when another copy reads a shared directory), F_SETLEASE and
/// F_GETLEASE (a lease on a shared read-only file is visible to every other opener),
/// F_SETOWN/F_SETOWN_EX/F_SETSIG and their getters (signal-driven I/O delivers signals to
/// processes the caller names), F_SETPIPE_SZ (pipe buffers count against a per-user quota
/// every copy shares), the read/write hints (inode state).
const FCNTL_COMMANDS: [i32; 14] = [
    libc::F_DUPFD,
    libc::F_DUPFD_CLOEXEC,
    libc::F_GETFD,
    libc::F_SETFD,
    libc::F_GETFL,
    libc::F_GETLK,
    libc::F_SETLK,
    libc::F_SETLKW,
    libc::F_OFD_GETLK,
    libc::F_OFD_SETLK,
    libc::F_OFD_SETLKW,
    libc::F_GETPIPE_SZ,
    libc::F_GET_SEALS,
    libc::F_ADD_SEALS,
];

/// Lock commands whose success is faked: the lock is never taken.
const FAKED_LOCKS: [i32; 4] = [libc::F_SETLK, libc::F_SETLKW, libc::F_OFD_SETLK, libc::F_OFD_SETLKW];

/// `ioctl` requests on the caller's own descriptors: terminal probes (`isatty`, window
/// size), non-blocking and close-on-exec switches, bytes ready. Not FIOASYNC (signal-driven
/// I/O) nor anything that changes a device or a file system.
const IOCTL_REQUESTS: [u64; 7] =
    [libc::TCGETS, libc::TIOCGWINSZ, libc::TIOCGPGRP, libc::FIONREAD, libc::FIONBIO, libc::FIOCLEX, libc::FIONCLEX];

/// `prctl` options that read or name the caller itself or narrow it (no-new-privs).
const PRCTL_OPTIONS: [i32; 8] = [
    libc::PR_SET_NAME,
    libc::PR_GET_NAME,
    libc::PR_GET_PDEATHSIG,
    libc::PR_GET_DUMPABLE,
    libc::PR_GET_SECCOMP,
    libc::PR_CAPBSET_READ,
    libc::PR_SET_NO_NEW_PRIVS,
    libc::PR_GET_NO_NEW_PRIVS,
];

/// Signals a process may send or have sent on its behalf: the standard ones (and 0, the
/// existence probe). A real-time signal, or any signal sent with a caller-made siginfo, is
/// queued under the host user's RLIMIT_SIGPENDING, which every copy of every germline shares
/// (ucounts): one copy keeping many queued moves how many another can queue. Standard
/// signals are queued at most once per signal and thread, and past the limit they still
/// arrive. Checked wherever a signal number is chosen: `kill`, `tkill`, `tgkill`,
/// `pidfd_send_signal` (without a siginfo), the exit signal in `clone`'s flags and the
/// parent-death signal (`PR_SET_PDEATHSIG`).
const STANDARD_SIGNAL_MASK: u64 = 0xffff_ffe0;

/// `madvise` advice on the caller's own memory. Not MADV_MERGEABLE (KSM merges equal pages
/// across processes, and a write to a merged page is slow), MADV_COLD/MADV_PAGEOUT and
/// MADV_WILLNEED (they move shared page cache), nor the poisoning and collapsing advice.
const MADVISE_ADVICE: [i32; 13] = [
    libc::MADV_NORMAL,
    libc::MADV_RANDOM,
    libc::MADV_SEQUENTIAL,
    libc::MADV_DONTNEED,
    libc::MADV_FREE,
    libc::MADV_DONTFORK,
    libc::MADV_DOFORK,
    libc::MADV_HUGEPAGE,
    libc::MADV_NOHUGEPAGE,
    libc::MADV_DONTDUMP,
    libc::MADV_DODUMP,
    18, // MADV_WIPEONFORK
    19, // MADV_KEEPONFORK
];

/// `futex` operations (without flags) that reach the kernel on shared futexes (keyed by
/// file for a page of a file): none but the waits glibc's `pthread_join` makes on a
/// thread's id, and those are answered EAGAIN before they wait (see
/// [`shared_waits_program`]). A shared futex on a page of a read-only file that two copies
/// map is one kernel object: a shared wake would be a channel, and so would a shared wait,
/// woken by the kernel when a thread of another copy exits with its `clear_child_tid` on
/// that page.
const SHARED_FUTEX_OPS: [i32; 2] = [libc::FUTEX_WAIT, libc::FUTEX_WAIT_BITSET];

/// Test-only switch ("mechanism off"): shared futex waits reach the kernel and wait, so a
/// thread's exit in one copy can wake a waiter in another. Never set outside tests.
pub static SHARED_FUTEX_WAITS_FOR_TESTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The x32 ABI's syscall-number bit.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `cachestat(2)` (451 on x86_64): page-cache residency of a file, denied by name in the
/// denylist (the allowlist never names it).
const SYS_CACHESTAT: i64 = 451;

impl SeccompPolicy {
    /// The policy every germline gets: the allowlist.
    pub fn germline() -> Self {
        SeccompPolicy { kind: Kind::Allowlist }
    }

    /// Tests only ("mechanism off"): the earlier filter, which named the syscalls to deny
    /// and checked `fcntl` only for lock commands. dnotify, leases, F_SETOWN and the x32
    /// ABI get through it.
    pub fn denylist_only() -> Self {
        SeccompPolicy { kind: Kind::DenylistOnly }
    }

    /// Whether this is the allowlist every germline gets by default.
    pub fn is_allowlist(&self) -> bool {
        self.kind == Kind::Allowlist
    }

    /// The unconditionally allowed syscalls, by name (for tests and review).
    pub fn allowed_names() -> impl Iterator<Item = &'static str> {
        ALLOWED.iter().flat_map(|g| g.calls.iter().map(|(n, _)| *n))
    }

    /// Compiles the stacked filters for x86_64, in the order they must be installed.
    pub fn compile(&self) -> Result<Vec<BpfProgram>, ExecutorError> {
        match self.kind {
            Kind::DenylistOnly => denylist_programs(),
            Kind::Allowlist => {
                let mut out = common_programs()?;
                out.push(no_statx_program()?);
                out.push(allowlist_program()?);
                Ok(out)
            }
        }
    }
}

const ARCH: TargetArch = TargetArch::x86_64;

fn err(e: seccompiler::BackendError) -> ExecutorError {
    ExecutorError::Sandbox(format!("seccomp: {e}"))
}

fn cond(arg: u8, op: SeccompCmpOp, v: u64) -> Result<SeccompCondition, ExecutorError> {
    // Dword: the kernel reads these arguments as 32-bit ints, so upper bits a caller sets
    // must not make a denied value look different.
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, v).map_err(err)
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, ExecutorError> {
    SeccompRule::new(conds).map_err(err)
}

/// `arg` equals one of `values` (one rule each, on top of `extra` conditions).
fn one_of(arg: u8, values: &[u64], extra: &[SeccompCondition]) -> Result<Vec<SeccompRule>, ExecutorError> {
    values
        .iter()
        .map(|v| {
            let mut c = extra.to_vec();
            c.push(cond(arg, SeccompCmpOp::Eq, *v)?);
            rule(c)
        })
        .collect()
}

fn word(v: i32) -> u64 {
    u64::from(v as u32)
}

fn words(vs: &[i32]) -> Vec<u64> {
    vs.iter().map(|v| word(*v)).collect()
}

fn build(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, ExecutorError> {
    let filter = SeccompFilter::new(rules, mismatch, matched, ARCH).map_err(err)?;
    filter.try_into().map_err(err)
}

/// Faked locks, and ENOSYS for `clone3`; shared by both policies.
fn common_programs() -> Result<Vec<BpfProgram>, ExecutorError> {
    let mut locks = BTreeMap::new();
    locks.insert(libc::SYS_flock, vec![]);
    locks.insert(libc::SYS_fcntl, one_of(1, &words(&FAKED_LOCKS), &[])?);
    let mut clone3 = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, vec![]);
    let mut out = vec![
        build(locks, SeccompAction::Allow, SeccompAction::Errno(0))?,
        build(clone3, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32))?,
    ];
    if !SHARED_FUTEX_WAITS_FOR_TESTS.load(std::sync::atomic::Ordering::SeqCst) {
        out.push(shared_waits_program()?);
    }
    Ok(out)
}

/// ENOSYS for `statx` (the allowlist policy only). Whatever mask it is asked for, its answer
/// carries the ID of the mount the path is on: the unique one (`STATX_MNT_ID_UNIQUE`), drawn
/// from one 64-bit counter of the whole host that every mount anyone makes moves, the
/// broker's copies and trigger replays included, so a copy's root mount tells how many
/// mounts were made before it (`mntid`); otherwise the lowest free one, which tells which
/// mounts are live. ENOSYS is what a kernel without `statx` answers: glibc, Rust's std,
/// libuv and CPython fall back to `newfstatat`, whose `struct stat` carries no mount ID.
fn no_statx_program() -> Result<BpfProgram, ExecutorError> {
    let mut statx = BTreeMap::new();
    statx.insert(libc::SYS_statx, vec![]);
    build(statx, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32))
}

/// EAGAIN ("the value changed") for every wait on a shared futex, before it waits: no
/// copy can be woken by the exit of another copy's thread whose `clear_child_tid` lies on
/// a page of a file both map (the kernel's wake at thread exit is always shared). glibc
/// takes EAGAIN as a changed value and tries again, so `pthread_join`, its only user here,
/// spins until the kernel clears the thread's id; Python's own threads are detached and
/// joined through private locks.
fn shared_waits_program() -> Result<BpfProgram, ExecutorError> {
    let private = word(libc::FUTEX_PRIVATE_FLAG);
    let op_mask = word(!(libc::FUTEX_PRIVATE_FLAG | libc::FUTEX_CLOCK_REALTIME));
    let waits = SHARED_FUTEX_OPS
        .iter()
        .map(|&op| {
            rule(vec![
                cond(1, SeccompCmpOp::MaskedEq(private), 0)?,
                cond(1, SeccompCmpOp::MaskedEq(op_mask), word(op))?,
            ])
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut rules = BTreeMap::new();
    rules.insert(libc::SYS_futex, waits);
    build(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EAGAIN as u32))
}

fn allowlist_program() -> Result<BpfProgram, ExecutorError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for g in ALLOWED {
        debug_assert!(!g.why.is_empty());
        for (_, nr) in g.calls {
            rules.insert(*nr, vec![]);
        }
    }
    // Locks reach the kernel only as faked successes (see `common_programs`).
    rules.insert(libc::SYS_flock, vec![]);
    let mut fcntl = one_of(1, &words(&FCNTL_COMMANDS), &[])?;
    // F_SETFL, but never O_ASYNC (signal-driven I/O).
    fcntl.push(rule(vec![
        cond(1, SeccompCmpOp::Eq, word(libc::F_SETFL))?,
        cond(2, SeccompCmpOp::MaskedEq(word(libc::O_ASYNC)), 0)?,
    ])?);
    rules.insert(libc::SYS_fcntl, fcntl);
    rules.insert(libc::SYS_ioctl, one_of(1, &IOCTL_REQUESTS, &[])?);
    let mut prctl = one_of(0, &words(&PRCTL_OPTIONS), &[])?;
    // PR_SET_PDEATHSIG only with a standard signal (see STANDARD_SIGNAL_MASK).
    prctl.push(rule(vec![
        cond(0, SeccompCmpOp::Eq, word(libc::PR_SET_PDEATHSIG))?,
        cond(1, SeccompCmpOp::MaskedEq(STANDARD_SIGNAL_MASK), 0)?,
    ])?);
    rules.insert(libc::SYS_prctl, prctl);
    let standard = |arg: u8| cond(arg, SeccompCmpOp::MaskedEq(STANDARD_SIGNAL_MASK), 0);
    rules.insert(libc::SYS_kill, vec![rule(vec![standard(1)?])?]);
    rules.insert(libc::SYS_tkill, vec![rule(vec![standard(1)?])?]);
    rules.insert(libc::SYS_tgkill, vec![rule(vec![standard(2)?])?]);
    rules.insert(
        libc::SYS_pidfd_send_signal,
        vec![rule(vec![
            standard(1)?,
            SeccompCondition::new(2, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, 0).map_err(err)?,
        ])?],
    );
    // No huge pages (MAP_HUGETLB, MFD_HUGETLB): they come from one pool of the host, which
    // a copy could drain for another to notice (the pool is empty on most hosts, and then
    // the call fails anyway).
    rules.insert(libc::SYS_mmap, vec![rule(vec![cond(3, SeccompCmpOp::MaskedEq(word(libc::MAP_HUGETLB)), 0)?])?]);
    // No `memfd_create`: a memfd is a tmpfs inode, and a tmpfs keeps multigrain timestamps,
    // so writing and `fstat`ing one moves the host's timestamp floor, which every other
    // copy reads back from the times of its own files (`crate::outside::ScratchKind`).
    // clone's low byte is the child's exit signal (CSIGNAL); CLONE_PIDFD would hand the
    // caller a pidfd, whose inode number is a host-wide count (see pidfd_open above).
    let clone_refused = 0xe0 | libc::CLONE_PIDFD as u64;
    rules.insert(libc::SYS_clone, vec![rule(vec![cond(0, SeccompCmpOp::MaskedEq(clone_refused), 0)?])?]);
    // A copy switches to its own ids (its namespace's root, mapped to host ids of its
    // own) before it is given data; only to root of the caller's namespace, which in the
    // germline is who it is already (and it holds no capability to become anyone else).
    // Each position may also be -1 ("unchanged"): posix_spawn's POSIX_SPAWN_RESETIDS calls
    // setresuid(-1, 0, -1), and GNU make spawns every recipe so. The caller's namespace
    // maps one uid and one gid, its root, so this can only re-set ids it already has.
    for call in [libc::SYS_setresuid, libc::SYS_setresgid] {
        let mut any = Vec::new();
        for combo in 0..8u8 {
            let id = |bit: u8| if combo & (1 << bit) != 0 { u64::from(u32::MAX) } else { 0 };
            any.push(rule(vec![
                cond(0, SeccompCmpOp::Eq, id(0))?,
                cond(1, SeccompCmpOp::Eq, id(1))?,
                cond(2, SeccompCmpOp::Eq, id(2))?,
            ])?);
        }
        rules.insert(call, any);
    }
    rules.insert(libc::SYS_madvise, one_of(2, &words(&MADVISE_ADVICE), &[])?);
    // Private futexes (keyed by the caller's own mm) freely; shared ones only to wait.
    let private = word(libc::FUTEX_PRIVATE_FLAG);
    let mut futex = vec![rule(vec![cond(1, SeccompCmpOp::MaskedEq(private), private)?])?];
    let op_mask = word(!(libc::FUTEX_PRIVATE_FLAG | libc::FUTEX_CLOCK_REALTIME));
    for op in SHARED_FUTEX_OPS {
        futex.push(rule(vec![cond(1, SeccompCmpOp::MaskedEq(op_mask), word(op))?])?);
    }
    rules.insert(libc::SYS_futex, futex);
    // TCP over IPv4/IPv6 only (to the broker's listeners); SCTP and MPTCP also come as
    // SOCK_STREAM, so the protocol is checked too. Socket type flags sit above bit 3.
    let mut socket = Vec::new();
    for domain in [libc::AF_INET, libc::AF_INET6] {
        for proto in [0, libc::IPPROTO_TCP] {
            socket.push(rule(vec![
                cond(0, SeccompCmpOp::Eq, word(domain))?,
                cond(1, SeccompCmpOp::MaskedEq(0xf), word(libc::SOCK_STREAM))?,
                cond(2, SeccompCmpOp::Eq, word(proto))?,
            ])?);
        }
    }
    rules.insert(libc::SYS_socket, socket);
    rules.insert(libc::SYS_socketpair, one_of(0, &[word(libc::AF_UNIX)], &[])?);
    for call in [libc::SYS_getsockopt, libc::SYS_setsockopt] {
        let options = SOCKET_OPTIONS
            .iter()
            .map(|&(level, name)| {
                rule(vec![cond(1, SeccompCmpOp::Eq, word(level))?, cond(2, SeccompCmpOp::Eq, word(name))?])
            })
            .collect::<Result<Vec<_>, _>>()?;
        rules.insert(call, options);
    }
    let prog = build(rules, SeccompAction::Errno(libc::EPERM as u32), SeccompAction::Allow)?;
    Ok(refuse_x32(prog))
}

/// Splices an x32 check in front of a seccompiler program. seccompiler emits
/// `[load arch, jump-if-x86_64 over the next, kill]` and then loads the syscall number;
/// the three instructions inserted after the architecture check (reached by its jump)
/// load the number and answer EPERM for any number with the x32 bit. Every jump in
/// seccompiler's output is forward and relative within what follows, so none crosses the
/// insertion point.
fn refuse_x32(prog: BpfProgram) -> BpfProgram {
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JSET_K: u16 = 0x45;
    const BPF_RET_K: u16 = 0x06;
    let mut out = Vec::with_capacity(prog.len() + 3);
    out.extend_from_slice(&prog[..3]);
    out.push(sock_filter { code: BPF_LD_W_ABS, jt: 0, jf: 0, k: 0 });
    out.push(sock_filter { code: BPF_JMP_JSET_K, jt: 0, jf: 1, k: X32_SYSCALL_BIT });
    out.push(sock_filter { code: BPF_RET_K, jt: 0, jf: 0, k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32 });
    out.extend_from_slice(&prog[3..]);
    out
}

/// The filter before the allowlist: named syscalls denied, everything else allowed.
fn denylist_programs() -> Result<Vec<BpfProgram>, ExecutorError> {
    let denied: &[(&str, i64)] = sys![
        SYS_setns,
        SYS_mount,
        SYS_umount2,
        SYS_pivot_root,
        SYS_chroot,
        SYS_move_mount,
        SYS_open_tree,
        SYS_fsopen,
        SYS_fsconfig,
        SYS_fsmount,
        SYS_fspick,
        SYS_mount_setattr,
        SYS_ptrace,
        SYS_process_vm_readv,
        SYS_process_vm_writev,
        SYS_pidfd_getfd,
        SYS_process_madvise,
        SYS_kcmp,
        SYS_shmget,
        SYS_shmat,
        SYS_shmctl,
        SYS_msgget,
        SYS_msgsnd,
        SYS_msgrcv,
        SYS_msgctl,
        SYS_semget,
        SYS_semop,
        SYS_semtimedop,
        SYS_semctl,
        SYS_mq_open,
        SYS_mq_unlink,
        SYS_mq_timedsend,
        SYS_mq_timedreceive,
        SYS_mq_notify,
        SYS_mq_getsetattr,
        SYS_inotify_init,
        SYS_inotify_init1,
        SYS_inotify_add_watch,
        SYS_fanotify_init,
        SYS_fanotify_mark,
        SYS_mincore,
        SYS_keyctl,
        SYS_add_key,
        SYS_request_key,
        SYS_bpf,
        SYS_perf_event_open,
        SYS_userfaultfd,
        SYS_io_uring_setup,
        SYS_io_uring_enter,
        SYS_io_uring_register,
        SYS_kexec_load,
        SYS_kexec_file_load,
        SYS_init_module,
        SYS_finit_module,
        SYS_delete_module,
        SYS_acct,
        SYS_swapon,
        SYS_swapoff,
        SYS_reboot,
        SYS_syslog,
        SYS_quotactl,
        SYS_name_to_handle_at,
        SYS_open_by_handle_at,
        SYS_lookup_dcookie,
        SYS_vhangup,
        SYS_settimeofday,
        SYS_clock_settime,
        SYS_adjtimex,
    ];
    let mut deny = BTreeMap::new();
    for (_, nr) in denied {
        deny.insert(*nr, vec![]);
    }
    deny.insert(SYS_CACHESTAT, vec![]);
    let mut out = vec![build(deny, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32))?];
    out.extend(common_programs()?);
    // socket(domain, type, proto): every domain but AF_INET/AF_INET6 and every type but
    // SOCK_STREAM refused with EACCES.
    let mut sock_rules = vec![rule(vec![
        cond(0, SeccompCmpOp::Ne, word(libc::AF_INET))?,
        cond(0, SeccompCmpOp::Ne, word(libc::AF_INET6))?,
    ])?];
    for ty in (0u64..16).filter(|t| *t != word(libc::SOCK_STREAM)) {
        sock_rules.push(rule(vec![cond(1, SeccompCmpOp::MaskedEq(0xf), ty)?])?);
    }
    let mut sockets = BTreeMap::new();
    sockets.insert(libc::SYS_socket, sock_rules);
    out.push(build(sockets, SeccompAction::Allow, SeccompAction::Errno(libc::EACCES as u32))?);
    Ok(out)
}

impl Default for SeccompPolicy {
    fn default() -> Self {
        SeccompPolicy::germline()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const AUDIT_ARCH_I386: u32 = 0x4000_0003;
    const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const FAKED: u32 = libc::SECCOMP_RET_ERRNO;

    /// A classic-BPF interpreter for the instructions seccompiler (and `refuse_x32`) emit,
    /// run over a `struct seccomp_data`.
    fn run(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let ins = &prog[pc];
            pc += 1;
            let jump = |cond: bool| usize::from(if cond { ins.jt } else { ins.jf });
            match ins.code {
                0x20 => {
                    let k = ins.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                0x54 => acc &= ins.k,
                0x05 => pc += ins.k as usize,
                0x15 => pc += jump(acc == ins.k),
                0x25 => pc += jump(acc > ins.k),
                0x35 => pc += jump(acc >= ins.k),
                0x45 => pc += jump(acc & ins.k != 0),
                0x06 => return ins.k,
                code => panic!("instruction {code:#x} not interpreted"),
            }
        }
    }

    /// Stacked filters as the kernel combines them: the most restrictive action wins;
    /// among equal actions, the one of the filter installed last.
    fn verdict(progs: &[BpfProgram], arch: u32, nr: i64, args: [u64; 6]) -> u32 {
        let rank = |v: u32| (v & 0xffff_0000) as i32;
        let mut best = ALLOW;
        for p in progs.iter().rev() {
            let r = run(p, arch, nr as u32, args);
            if rank(r) < rank(best) {
                best = r;
            }
        }
        best
    }

    fn call(progs: &[BpfProgram], nr: i64, args: &[u64]) -> u32 {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        verdict(progs, AUDIT_ARCH_X86_64, nr, a)
    }

    fn fcntl(progs: &[BpfProgram], cmd: i32, arg: u64) -> u32 {
        call(progs, libc::SYS_fcntl, &[3, word(cmd), arg])
    }

    #[test]
    fn the_allowlist_refuses_kernel_channels_that_the_denylist_let_through() {
        let on = SeccompPolicy::germline().compile().unwrap();
        let off = SeccompPolicy::denylist_only().compile().unwrap();
        let channels = [
            libc::F_NOTIFY,
            libc::F_SETLEASE,
            libc::F_GETLEASE,
            libc::F_SETOWN,
            15, // F_SETOWN_EX
            10, // F_SETSIG
            libc::F_SETPIPE_SZ,
        ];
        for cmd in channels {
            assert_eq!(fcntl(&on, cmd, 0), EPERM, "fcntl {cmd} refused");
            assert_eq!(fcntl(&off, cmd, 0), ALLOW, "fcntl {cmd} passed the denylist");
        }
        // The kernel reads the command as a 32-bit int: high bits change nothing.
        assert_eq!(call(&on, libc::SYS_fcntl, &[3, (1 << 32) | word(libc::F_NOTIFY), 0]), EPERM);
        assert_eq!(fcntl(&on, libc::F_SETFL, word(libc::O_NONBLOCK)), ALLOW);
        assert_eq!(fcntl(&on, libc::F_SETFL, word(libc::O_NONBLOCK | libc::O_ASYNC)), EPERM);
        assert_eq!(fcntl(&on, libc::F_GETFD, 0), ALLOW);
        assert_eq!(fcntl(&on, libc::F_DUPFD_CLOEXEC, 0), ALLOW);
        for lock in FAKED_LOCKS {
            assert_eq!(fcntl(&on, lock, 0), FAKED, "lock {lock} faked");
        }
        assert_eq!(call(&on, libc::SYS_flock, &[3, 2]), FAKED);
        assert_eq!(call(&on, libc::SYS_clone3, &[]), libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
        // statx answers a mount ID (`mntid`): ENOSYS under the allowlist, for any mask.
        for mask in [0, 0x1000, 0x4000, 0xfff] {
            assert_eq!(call(&on, libc::SYS_statx, &[0, 0, 0, mask]), libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
            assert_eq!(call(&off, libc::SYS_statx, &[0, 0, 0, mask]), ALLOW, "statx passed the denylist");
        }
        // Syscalls nobody named: refused by the allowlist, passed by the denylist.
        for nr in [
            libc::SYS_sethostname,
            libc::SYS_unshare,
            libc::SYS_sysinfo,
            libc::SYS_futex_waitv,
            454,
            libc::SYS_mknod,
            libc::SYS_statfs,
            libc::SYS_fstatfs,
        ] {
            assert_eq!(call(&on, nr, &[]), EPERM, "syscall {nr}");
            assert_eq!(call(&off, nr, &[]), ALLOW, "syscall {nr} passed the denylist");
        }
        for nr in [libc::SYS_ptrace, libc::SYS_inotify_init1, libc::SYS_setns, SYS_CACHESTAT, libc::SYS_mincore] {
            assert_eq!(call(&on, nr, &[]), EPERM, "syscall {nr}");
            assert_eq!(call(&off, nr, &[]), EPERM, "syscall {nr} was denied by name");
        }
    }

    #[test]
    fn foreign_architectures_are_killed_and_the_x32_abi_refused() {
        let on = SeccompPolicy::germline().compile().unwrap();
        let off = SeccompPolicy::denylist_only().compile().unwrap();
        for arch in [AUDIT_ARCH_I386, AUDIT_ARCH_AARCH64] {
            assert_eq!(verdict(&on, arch, libc::SYS_read, [0; 6]), KILL);
        }
        let x32 = |nr: i64| nr | i64::from(X32_SYSCALL_BIT);
        let notify = [3, word(libc::F_NOTIFY), 0x8000_0000 | 0x1, 0, 0, 0];
        for (nr, args) in
            [(x32(libc::SYS_fcntl), notify), (x32(libc::SYS_read), [0; 6]), (x32(libc::SYS_ptrace), [0; 6])]
        {
            assert_eq!(verdict(&on, AUDIT_ARCH_X86_64, nr, args), EPERM, "x32 {nr:#x}");
        }
        assert_eq!(
            verdict(&off, AUDIT_ARCH_X86_64, x32(libc::SYS_fcntl), notify),
            ALLOW,
            "denylist passed x32 dnotify"
        );
        assert_eq!(verdict(&off, AUDIT_ARCH_X86_64, x32(libc::SYS_inotify_init1), [0; 6]), ALLOW);
    }

    #[test]
    fn argument_filters_allow_what_python_needs_and_nothing_shared() {
        let on = SeccompPolicy::germline().compile().unwrap();
        for req in IOCTL_REQUESTS {
            assert_eq!(call(&on, libc::SYS_ioctl, &[0, req]), ALLOW);
        }
        assert_eq!(call(&on, libc::SYS_ioctl, &[0, libc::FIOASYNC]), EPERM);
        assert_eq!(call(&on, libc::SYS_ioctl, &[0, libc::TIOCSTI]), EPERM);
        let sock = |d: i32, t: i32, p: i32| call(&on, libc::SYS_socket, &[word(d), word(t), word(p)]);
        assert_eq!(sock(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0), ALLOW);
        assert_eq!(sock(libc::AF_INET6, libc::SOCK_STREAM, libc::IPPROTO_TCP), ALLOW);
        assert_eq!(sock(libc::AF_INET, libc::SOCK_DGRAM, 0), EPERM);
        assert_eq!(sock(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP), EPERM);
        assert_eq!(sock(libc::AF_UNIX, libc::SOCK_STREAM, 0), EPERM);
        assert_eq!(sock(libc::AF_NETLINK, libc::SOCK_RAW, 0), EPERM);
        assert_eq!(call(&on, libc::SYS_socketpair, &[word(libc::AF_UNIX), word(libc::SOCK_STREAM)]), ALLOW);
        assert_eq!(call(&on, libc::SYS_socketpair, &[word(libc::AF_INET), word(libc::SOCK_STREAM)]), EPERM);
        for nr in [libc::SYS_bind, libc::SYS_listen, libc::SYS_accept4, libc::SYS_getsockname] {
            assert_eq!(call(&on, nr, &[]), EPERM);
        }
        let opt = |level: i32, name: i32| call(&on, libc::SYS_getsockopt, &[0, word(level), word(name)]);
        assert_eq!(opt(libc::SOL_SOCKET, libc::SO_ERROR), ALLOW);
        assert_eq!(opt(libc::IPPROTO_TCP, libc::TCP_NODELAY), ALLOW);
        assert_eq!(opt(libc::SOL_SOCKET, libc::SO_COOKIE), EPERM, "a host-wide counter");
        assert_eq!(opt(libc::SOL_SOCKET, libc::SO_NETNS_COOKIE), EPERM, "a host-wide counter");
        assert_eq!(opt(libc::IPPROTO_TCP, libc::TCP_INFO), EPERM);
        let set = |level: i32, name: i32| call(&on, libc::SYS_setsockopt, &[0, word(level), word(name)]);
        assert_eq!(set(libc::IPPROTO_TCP, libc::TCP_NODELAY), ALLOW);
        assert_eq!(set(libc::SOL_SOCKET, libc::SO_PEEK_OFF), EPERM);
        let prctl = |o: i32| call(&on, libc::SYS_prctl, &[word(o)]);
        assert_eq!(prctl(libc::PR_SET_NAME), ALLOW);
        assert_eq!(prctl(libc::PR_SET_NO_NEW_PRIVS), ALLOW);
        assert_eq!(prctl(libc::PR_SET_DUMPABLE), EPERM);
        assert_eq!(prctl(libc::PR_SET_SECCOMP), EPERM);
        assert_eq!(prctl(libc::PR_SET_PTRACER), EPERM);
        let madvise = |a: i32| call(&on, libc::SYS_madvise, &[0, 4096, word(a)]);
        assert_eq!(madvise(libc::MADV_DONTNEED), ALLOW);
        assert_eq!(madvise(libc::MADV_MERGEABLE), EPERM);
        assert_eq!(madvise(libc::MADV_PAGEOUT), EPERM);
        let futex = |op: i32| call(&on, libc::SYS_futex, &[0, word(op)]);
        let eagain = libc::SECCOMP_RET_ERRNO | libc::EAGAIN as u32;
        assert_eq!(futex(libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG), ALLOW);
        assert_eq!(futex(libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG), ALLOW);
        assert_eq!(futex(libc::FUTEX_WAIT), eagain, "a shared wait never waits");
        assert_eq!(futex(libc::FUTEX_WAIT_BITSET | libc::FUTEX_CLOCK_REALTIME), eagain);
        assert_eq!(futex(libc::FUTEX_WAKE), EPERM, "a shared wake");
        assert_eq!(futex(libc::FUTEX_CMP_REQUEUE), EPERM);
    }

    #[test]
    fn no_descriptor_in_flight_and_no_queued_real_time_signal() {
        let on = SeccompPolicy::germline().compile().unwrap();
        let off = SeccompPolicy::denylist_only().compile().unwrap();
        // SCM_RIGHTS travels only in sendmsg/sendmmsg; Python sends with sendto.
        for nr in [libc::SYS_sendmsg, libc::SYS_sendmmsg] {
            assert_eq!(call(&on, nr, &[3, 0, 0]), EPERM, "syscall {nr}");
            assert_eq!(call(&off, nr, &[3, 0, 0]), ALLOW, "syscall {nr} passed the denylist");
        }
        assert_eq!(call(&on, libc::SYS_sendto, &[3, 0, 1, 0, 0, 0]), ALLOW);
        // The host's huge page pool is shared.
        let anon = word(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
        assert_eq!(call(&on, libc::SYS_mmap, &[0, 4096, 3, anon]), ALLOW);
        assert_eq!(call(&on, libc::SYS_mmap, &[0, 2 << 20, 3, anon | word(libc::MAP_HUGETLB)]), EPERM);
        // No memfd at all: a tmpfs inode, whose multigrain times move the host's floor.
        assert_eq!(call(&on, libc::SYS_memfd_create, &[0, u64::from(libc::MFD_CLOEXEC)]), EPERM);
        assert_eq!(call(&on, libc::SYS_memfd_create, &[0, u64::from(libc::MFD_HUGETLB)]), EPERM);
        assert_eq!(call(&off, libc::SYS_memfd_create, &[0, u64::from(libc::MFD_CLOEXEC)]), ALLOW);
        let rt = word(libc::SIGRTMIN());
        for (nr, args) in [
            (libc::SYS_kill, vec![1, rt]),
            (libc::SYS_tkill, vec![1, rt]),
            (libc::SYS_tgkill, vec![1, 1, rt]),
            (libc::SYS_pidfd_send_signal, vec![3, rt, 0, 0]),
            (libc::SYS_pidfd_send_signal, vec![3, word(libc::SIGTERM), 0x7fff_0000_0000, 0]),
            (libc::SYS_clone, vec![word(libc::CLONE_VM) | rt, 0]),
            (libc::SYS_prctl, vec![word(libc::PR_SET_PDEATHSIG), rt]),
            // A pidfd's inode number is a host-wide count of threads (`pidino`).
            (libc::SYS_pidfd_open, vec![1, 0]),
            (libc::SYS_clone, vec![word(libc::SIGCHLD | libc::CLONE_PIDFD), 0]),
        ] {
            assert_eq!(call(&on, nr, &args), EPERM, "syscall {nr} {args:x?}");
            assert_eq!(call(&off, nr, &args), ALLOW, "syscall {nr} {args:x?} passed the denylist");
        }
        for (nr, args) in [
            (libc::SYS_kill, vec![1, word(libc::SIGTERM)]),
            (libc::SYS_kill, vec![1, 0]),
            (libc::SYS_tgkill, vec![1, 1, word(libc::SIGUSR1)]),
            (libc::SYS_pidfd_send_signal, vec![3, word(libc::SIGKILL), 0, 0]),
            (libc::SYS_clone, vec![word(libc::SIGCHLD), 0]),
            (libc::SYS_clone, vec![0x003d_0f00, 0]), // glibc's pthread_create flags, no exit signal
            (libc::SYS_prctl, vec![word(libc::PR_SET_PDEATHSIG), word(libc::SIGKILL)]),
        ] {
            assert_eq!(call(&on, nr, &args), ALLOW, "syscall {nr} {args:x?}");
        }
    }

    #[test]
    fn every_allowed_group_says_why_and_names_nothing_the_denylist_denied() {
        let mut seen = std::collections::BTreeSet::new();
        for g in ALLOWED {
            assert!(g.why.len() > 40, "group without a reason: {:?}", g.calls);
            for (name, nr) in g.calls {
                assert!(seen.insert(*nr), "{name} allowed twice");
            }
        }
        let off = SeccompPolicy::denylist_only().compile().unwrap();
        for (name, nr) in ALLOWED.iter().flat_map(|g| g.calls.iter()) {
            assert_eq!(verdict(&off[..1], AUDIT_ARCH_X86_64, *nr, [0; 6]), ALLOW, "{name} was denied before");
        }
        assert!(SeccompPolicy::allowed_names().any(|n| n == "SYS_openat"));
    }
}
