//! The germline's irremovable sandbox, imposed by Rust before the interpreter starts
//! (DESIGN §5).
//!
//! Everything here runs in the child between `fork` and `execve` of the Python tool
//! host, so nothing the release does later can undo it: new user, mount, network, IPC,
//! UTS and cgroup namespaces; a fresh root file system holding only the read-only
//! allowlist and empty data roots (the germline cannot even name user data), all of it
//! read-only; Landlock (read-only, TCP only to the broker's fixed ports, signal and
//! abstract-socket scoping); a seccomp
//! allowlist (with arguments) that leaves no inter-copy channel; no-new-privs; every capability dropped; rlimits.
//! Copies inherit all of it at fork.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope, ABI,
};

use crate::seccomp::SeccompPolicy;
use crate::{ExecutorError, CHANNEL_PORT, PROXY_PORT, SLOT_PORT};

/// Per-process limits set on the germline and inherited by every copy.
#[derive(Clone, Debug)]
pub struct ResourceLimits {
    /// Address-space limit in bytes (RLIMIT_AS).
    pub memory_bytes: u64,
    /// Processes per user namespace (RLIMIT_NPROC).
    pub processes: u64,
    /// CPU seconds per process (RLIMIT_CPU).
    pub cpu_seconds: u64,
    /// Open descriptors per process (RLIMIT_NOFILE).
    pub open_files: u64,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits { memory_bytes: 2 << 30, processes: 256, cpu_seconds: 60, open_files: 1024 }
    }
}

/// What the germline may read and which directories it must see empty.
#[derive(Clone, Debug, Default)]
pub struct Confinement {
    /// Read-only (and executable) paths: interpreter, libraries, the release, the shim.
    pub read_only: Vec<PathBuf>,
    /// Directories that may hold user data: empty in the germline; the broker mounts each
    /// copy's view there.
    pub data_roots: Vec<PathBuf>,
    /// Process limits.
    pub limits: ResourceLimits,
    /// The syscall filter (the allowlist unless a test turns it off).
    pub seccomp: SeccompPolicy,
}

/// A prepared sandbox: everything that allocates much is done in the parent, so the
/// child between fork and exec mostly makes syscalls on ready-made buffers.
pub struct PreparedSandbox {
    uid_map: CString,
    gid_map: CString,
    stage: CString,
    root_ops: Vec<RootOp>,
    workdir: CString,
    seccomp: Vec<seccompiler::BpfProgram>,
    limits: ResourceLimits,
    control_fd: RawFd,
}

/// One step of building the germline's root filesystem under the stage directory.
enum RootOp {
    Mkdir(CString),
    Touch(CString),
    Bind(CString, CString),
    Symlink(CString, CString),
}

/// The Landlock ABI germline needs: V6 brings signal and abstract-socket scoping, without
/// which copies alive at once could signal each other.
const LANDLOCK_ABI: ABI = ABI::V6;

/// Devices a Python process expects; bound read-only except /dev/null.
const DEVICES: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];

impl Confinement {
    /// Plans the germline's root filesystem and compiles seccomp in the parent.
    ///
    /// The germline gets a fresh tmpfs root holding only the read-only paths (bound
    /// read-only), a few devices, and an empty directory at each data root; nothing else
    /// of the host exists for it. Landlock then makes that whole root read-only. (A
    /// Landlock rule on a directory does not reach a file system mounted on it, so the
    /// view the broker later mounts at a data root inside a copy is covered by the rule
    /// on `/`.)
    pub fn prepare(&self, stage: &Path, workdir: &Path, control_fd: RawFd) -> Result<PreparedSandbox, ExecutorError> {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let seccomp = self.seccomp.compile()?;
        let mut ops = Vec::new();
        let mut made: std::collections::BTreeSet<PathBuf> = std::collections::BTreeSet::new();
        let staged = |p: &Path| stage.join(p.strip_prefix("/").unwrap_or(p));
        let mut mkdirs = |p: &Path, ops: &mut Vec<RootOp>| -> Result<(), ExecutorError> {
            let mut acc = PathBuf::from("/");
            for c in p.components().skip(1) {
                acc.push(c);
                if made.insert(acc.clone()) {
                    ops.push(RootOp::Mkdir(cstring(&staged(&acc))?));
                }
            }
            Ok(())
        };
        let mut paths: Vec<&PathBuf> = self.read_only.iter().collect();
        paths.sort();
        for p in paths {
            if !p.is_absolute() {
                return Err(ExecutorError::Sandbox(format!("read-only path {} is not absolute", p.display())));
            }
            let meta = std::fs::symlink_metadata(p)
                .map_err(|e| ExecutorError::Sandbox(format!("read-only path {}: {e}", p.display())))?;
            if let Some(parent) = p.parent() {
                mkdirs(parent, &mut ops)?;
            }
            if meta.file_type().is_symlink() {
                let target =
                    std::fs::read_link(p).map_err(ExecutorError::io(format!("reading link {}", p.display())))?;
                ops.push(RootOp::Symlink(cstring(&target)?, cstring(&staged(p))?));
            } else if meta.is_dir() {
                mkdirs(p, &mut ops)?;
                ops.push(RootOp::Bind(cstring(p)?, cstring(&staged(p))?));
            } else {
                ops.push(RootOp::Touch(cstring(&staged(p))?));
                ops.push(RootOp::Bind(cstring(p)?, cstring(&staged(p))?));
            }
        }
        mkdirs(Path::new("/dev"), &mut ops)?;
        for d in DEVICES {
            ops.push(RootOp::Touch(cstring(&staged(Path::new(d)))?));
            ops.push(RootOp::Bind(cstring(Path::new(d))?, cstring(&staged(Path::new(d)))?));
        }
        for r in &self.data_roots {
            mkdirs(r, &mut ops)?;
        }
        Ok(PreparedSandbox {
            uid_map: CString::new(format!("0 {uid} 1")).map_err(|_| ExecutorError::internal("uid map"))?,
            gid_map: CString::new(format!("0 {gid} 1")).map_err(|_| ExecutorError::internal("gid map"))?,
            stage: cstring(stage)?,
            root_ops: ops,
            workdir: cstring(workdir)?,
            seccomp,
            limits: self.limits.clone(),
            control_fd,
        })
    }
}

fn landlock_restrict() -> io::Result<()> {
    let ll = io::Error::other;
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(LANDLOCK_ABI))
        .map_err(ll)?
        .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
        .map_err(ll)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(ll)?
        .create()
        .map_err(ll)?;
    let root = PathFd::new("/").map_err(io::Error::other)?;
    rs = rs.add_rule(PathBeneath::new(root, AccessFs::from_read(LANDLOCK_ABI))).map_err(ll)?;
    let devnull = PathFd::new("/dev/null").map_err(io::Error::other)?;
    rs = rs.add_rule(PathBeneath::new(devnull, AccessFs::ReadFile | AccessFs::WriteFile)).map_err(ll)?;
    for port in [PROXY_PORT, CHANNEL_PORT, SLOT_PORT] {
        rs = rs.add_rule(NetPort::new(port, AccessNet::ConnectTcp)).map_err(ll)?;
    }
    let status = rs.restrict_self().map_err(ll)?;
    if status.ruleset != landlock::RulesetStatus::FullyEnforced {
        return Err(io::Error::other("landlock not fully enforced"));
    }
    Ok(())
}

fn cstring(p: &Path) -> Result<CString, ExecutorError> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| ExecutorError::Sandbox(format!("path with NUL: {}", p.display())))
}

/// The fd number the control socket has inside the germline.
pub const GERMLINE_CONTROL_FD: RawFd = 3;

impl PreparedSandbox {
    /// Installs the sandbox as the command's pre-exec step.
    pub fn install(mut self, cmd: &mut Command) {
        // SAFETY: the closure runs in the forked child before exec; it makes syscalls on
        // buffers prepared above, and Landlock's small allocations are safe in a forked
        // child under glibc (malloc is reinitialised at fork).
        unsafe {
            cmd.pre_exec(move || self.apply_in_child());
        }
    }

    fn build_root(&self) -> io::Result<()> {
        use libc::*;
        // SAFETY (whole block): mount/mkdir/open/symlink/pivot_root on NUL-terminated
        // strings prepared in the parent.
        unsafe {
            check(mount(std::ptr::null(), c"/".as_ptr(), std::ptr::null(), MS_REC | MS_PRIVATE, std::ptr::null()))?;
            check(mount(
                c"germline-root".as_ptr(),
                self.stage.as_ptr(),
                c"tmpfs".as_ptr(),
                MS_NOSUID | MS_NODEV,
                c"size=1m,mode=0755".as_ptr().cast(),
            ))?;
            for op in &self.root_ops {
                match op {
                    RootOp::Mkdir(p) => {
                        if mkdir(p.as_ptr(), 0o755) < 0 && *__errno_location() != EEXIST {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    RootOp::Touch(p) => {
                        let fd = open(p.as_ptr(), O_WRONLY | O_CREAT | O_CLOEXEC, 0o444);
                        if fd < 0 {
                            return Err(io::Error::last_os_error());
                        }
                        close(fd);
                    }
                    RootOp::Bind(src, dst) => {
                        check(mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), MS_BIND | MS_REC, std::ptr::null()))?;
                    }
                    RootOp::Symlink(target, at) => check(symlink(target.as_ptr(), at.as_ptr()))?,
                }
            }
            check(chdir(self.stage.as_ptr()))?;
            check(syscall(SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as c_int)?;
            check(umount2(c".".as_ptr(), MNT_DETACH))?;
            check(chdir(c"/".as_ptr()))?;
        }
        make_tree_read_only()
    }

    fn apply_in_child(&mut self) -> io::Result<()> {
        use libc::*;
        check(unsafe {
            // SAFETY: plain syscall.
            unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP)
        })?;
        write_proc(c"/proc/self/setgroups", c"deny")?;
        write_proc(c"/proc/self/uid_map", &self.uid_map)?;
        write_proc(c"/proc/self/gid_map", &self.gid_map)?;
        self.build_root()?;
        // SAFETY: chdir to a prepared path.
        check(unsafe { chdir(self.workdir.as_ptr()) })?;
        for (res, val) in [
            (RLIMIT_AS, self.limits.memory_bytes),
            (RLIMIT_NPROC, self.limits.processes),
            (RLIMIT_CPU, self.limits.cpu_seconds),
            (RLIMIT_NOFILE, self.limits.open_files),
            (RLIMIT_CORE, 0),
        ] {
            let lim = rlimit { rlim_cur: val, rlim_max: val };
            // SAFETY: valid pointer to a local rlimit.
            check(unsafe { setrlimit(res, &lim) })?;
        }
        drop_capabilities()?;
        // SAFETY: prctl with constant arguments.
        check(unsafe { prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })?;
        if self.control_fd != GERMLINE_CONTROL_FD {
            // SAFETY: dup2 onto a fixed descriptor number; the result is checked.
            check(unsafe { dup2(self.control_fd, GERMLINE_CONTROL_FD) })?;
        } else {
            // SAFETY: clear close-on-exec so the control socket survives exec.
            check(unsafe { fcntl(GERMLINE_CONTROL_FD, F_SETFD, 0) })?;
        }
        // Nothing else the broker holds (or inherited) may reach the germline.
        // SAFETY: close_range over descriptors above the control socket.
        check(unsafe { syscall(SYS_close_range, GERMLINE_CONTROL_FD + 1, c_uint::MAX, 0) as c_int })?;
        landlock_restrict()?;
        // Last, right before exec: the allowlist allows neither seccomp(2) itself (so it
        // is the last of the stacked filters) nor most of the set-up above; only execve
        // follows.
        for prog in &self.seccomp {
            seccompiler::apply_filter(prog).map_err(io::Error::other)?;
        }
        Ok(())
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn write_proc(path: &std::ffi::CStr, value: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: open/write/close on a NUL-terminated path and a live buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let bytes = value.to_bytes();
        let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let err = io::Error::last_os_error();
        libc::close(fd);
        if n as usize != bytes.len() {
            return Err(err);
        }
    }
    Ok(())
}

/// Recursively read-only, nosuid, nodev; atime updates off where the kernel lets us
/// (an inherited, locked atime setting stays: reading a shared file may then still move
/// its atime, at most once a day under relatime).
fn make_tree_read_only() -> io::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    const MOUNT_ATTR_NODEV: u64 = 0x4;
    const MOUNT_ATTR_NOATIME: u64 = 0x10;
    const MOUNT_ATTR__ATIME: u64 = 0x70;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    let setattr = |path: &std::ffi::CStr, flags: libc::c_uint, set: u64, clr: u64| -> libc::c_long {
        let attr = MountAttr { attr_set: set, attr_clr: clr, propagation: 0, userns_fd: 0 };
        // SAFETY: mount_setattr on a NUL-terminated path with a correctly sized attribute struct.
        unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                path.as_ptr(),
                flags,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        }
    };
    if setattr(c"/", AT_RECURSIVE, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0) < 0 {
        return Err(io::Error::last_os_error());
    }
    let _ = setattr(c"/", AT_RECURSIVE, MOUNT_ATTR_NOATIME, MOUNT_ATTR__ATIME);
    // The four device binds stay usable (git and others open /dev/null themselves); every
    // other mount keeps nodev.
    for dev in [c"/dev/null", c"/dev/zero", c"/dev/urandom", c"/dev/random"] {
        if setattr(dev, 0, 0, MOUNT_ATTR_NODEV) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn drop_capabilities() -> io::Result<()> {
    // SAFETY: prctl/capset with constant arguments and local structs.
    unsafe {
        for cap in 0..=63 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINVAL) {
                    break;
                }
                return Err(e);
            }
        }
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let hdr = Header { version: 0x2008_0522, pid: 0 };
        let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
        if libc::syscall(libc::SYS_capset, &hdr as *const Header, data.as_ptr()) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Keeps the raw fd of a socket alive in the parent until the child has execed.
pub fn raw(fd: &impl AsRawFd) -> RawFd {
    fd.as_raw_fd()
}
