//! Probes of what this host lets germline enforce (`germline doctor`): each one asks the
//! kernel, in a child where it changes anything.

/// Whether this process can make user, PID and network namespaces (tried in a child).
pub fn can_make_namespaces() -> bool {
    // SAFETY: the child only calls unshare and leaves with _exit; the parent reaps it.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return false;
        }
        if pid == 0 {
            let rc = libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNET);
            libc::_exit(if rc == 0 { 0 } else { 1 });
        }
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }
}

/// The Landlock ABI version the kernel offers (0: none).
pub fn landlock_abi() -> i64 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only returns
    // the ABI version.
    let abi = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    abi.max(0)
}

/// Whether seccomp filters can be installed (the mode is readable and the actions
/// germline uses are offered).
pub fn seccomp_filters() -> bool {
    let actions = std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").unwrap_or_default();
    // SAFETY: prctl(PR_GET_SECCOMP) reads this process's mode.
    let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    mode >= 0 && actions.contains("errno") && actions.contains("kill_process")
}

/// Whether this process is host root (copies get host ids of their own).
pub fn host_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}
