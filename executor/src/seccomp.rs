//! The seccomp policy of the germline and every copy: it closes each channel through which
//! two copies alive at the same time could exchange a byte (DESIGN §5), and each way out
//! of the sandbox the kernel offers besides.
//!
//! Four stacked filters, because one seccompiler filter has one match action:
//! denied outright (EPERM), faked success (file locks: a lock that is never taken cannot
//! be observed by another copy, and SQLite still works), ENOSYS for `clone3` (its flags
//! sit behind a pointer seccomp cannot read; glibc falls back to `clone`), and sockets
//! other than TCP over IPv4/IPv6 (EACCES). `socketpair` stays: an unnamed pair is shared
//! only by inheritance (asyncio needs one), and G2 refuses a germline that holds one.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

use crate::ExecutorError;

/// The germline's seccomp policy, as data that tests can inspect.
#[derive(Clone, Debug)]
pub struct SeccompPolicy {
    /// Syscalls that fail with EPERM.
    pub denied: Vec<(&'static str, i64)>,
    /// Set to false only by "mechanism off" tests.
    pub enabled: bool,
}

macro_rules! sys {
    ($($name:ident),* $(,)?) => { vec![$((stringify!($name), libc::$name)),*] };
}

impl SeccompPolicy {
    /// The policy every germline gets.
    pub fn germline() -> Self {
        let denied = sys![
            // entering or building other namespaces' mounts, and leaving the sandbox
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
            // reading or writing another process
            SYS_ptrace,
            SYS_process_vm_readv,
            SYS_process_vm_writev,
            SYS_pidfd_getfd,
            SYS_process_madvise,
            SYS_kcmp,
            // SysV and POSIX IPC (also isolated by the IPC namespace)
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
            // watching what other copies touch
            SYS_inotify_init,
            SYS_inotify_init1,
            SYS_inotify_add_watch,
            SYS_fanotify_init,
            SYS_fanotify_mark,
            SYS_mincore,
            // kernel facilities shared across the machine
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
        SeccompPolicy { denied, enabled: true }
    }

    /// Compiles the stacked filters for x86_64.
    pub fn compile(&self) -> Result<Vec<BpfProgram>, ExecutorError> {
        if !self.enabled {
            return Ok(Vec::new());
        }
        let arch = TargetArch::x86_64;
        let err = |e: seccompiler::BackendError| ExecutorError::Sandbox(format!("seccomp: {e}"));
        let cond =
            |arg: u8, op: SeccompCmpOp, v: u64| SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, v).map_err(err);
        let mut out = Vec::new();

        let mut deny = BTreeMap::new();
        for (_, nr) in &self.denied {
            deny.insert(*nr, vec![]);
        }
        // cachestat(2) reveals page-cache residency of shared files (451 on x86_64).
        deny.insert(451, vec![]);
        out.push(build(deny, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch)?);

        let mut locks = BTreeMap::new();
        locks.insert(libc::SYS_flock, vec![]);
        let lock_cmds = [libc::F_SETLK, libc::F_SETLKW, libc::F_OFD_SETLK, libc::F_OFD_SETLKW];
        let rules = lock_cmds
            .iter()
            .map(|c| SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, *c as u64)?]).map_err(err))
            .collect::<Result<Vec<_>, _>>()?;
        locks.insert(libc::SYS_fcntl, rules);
        out.push(build(locks, SeccompAction::Allow, SeccompAction::Errno(0), arch)?);

        let mut clone3 = BTreeMap::new();
        clone3.insert(libc::SYS_clone3, vec![]);
        out.push(build(clone3, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32), arch)?);

        // socket(domain, type, proto): refuse every domain but AF_INET/AF_INET6 and every
        // type but SOCK_STREAM (flags in the high bits are masked off).
        let mut sock_rules = vec![SeccompRule::new(vec![
            cond(0, SeccompCmpOp::Ne, libc::AF_INET as u64)?,
            cond(0, SeccompCmpOp::Ne, libc::AF_INET6 as u64)?,
        ])
        .map_err(err)?];
        for ty in (0u64..16).filter(|t| *t != libc::SOCK_STREAM as u64) {
            sock_rules.push(SeccompRule::new(vec![cond(1, SeccompCmpOp::MaskedEq(0xf), ty)?]).map_err(err)?);
        }
        let mut sockets = BTreeMap::new();
        sockets.insert(libc::SYS_socket, sock_rules);
        out.push(build(sockets, SeccompAction::Allow, SeccompAction::Errno(libc::EACCES as u32), arch)?);
        Ok(out)
    }
}

fn build(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
    arch: TargetArch,
) -> Result<BpfProgram, ExecutorError> {
    let filter = SeccompFilter::new(rules, mismatch, matched, arch)
        .map_err(|e| ExecutorError::Sandbox(format!("seccomp: {e}")))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| ExecutorError::Sandbox(format!("seccomp: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_compiles_and_covers_channels() {
        let p = SeccompPolicy::germline();
        let names: Vec<_> = p.denied.iter().map(|(n, _)| *n).collect();
        for must in ["SYS_setns", "SYS_ptrace", "SYS_shmget", "SYS_inotify_init1", "SYS_mincore"] {
            assert!(names.contains(&must), "{must} not denied");
        }
        assert_eq!(p.compile().unwrap().len(), 4);
        let off = SeccompPolicy { enabled: false, ..p };
        assert!(off.compile().unwrap().is_empty());
    }
}
