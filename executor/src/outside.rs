//! Per-copy steps imposed from outside the copy (DESIGN §5): the broker never trusts the
//! germline to have set up a copy; it enters the copy's fresh namespaces itself.
//!
//! Two short-lived helper processes of the broker do this. The first enters the copy's
//! user and network namespaces, maps the copy's ids, brings its loopback up and opens the
//! broker's listeners there (proxy, MCP channel, slot), so a connection accepted on one of
//! them provably came from that copy's network namespace, and passes them back over a
//! socketpair. The second runs only once the broker has seen (from `/proc`) that the copy
//! switched to its own host ids and gave up its capabilities ([`ViewGate::open`]): it
//! closes the copy's way to new namespaces and kernel notification groups (the copy
//! namespace's `user.max_*` limits, set to 0), mounts a fresh tmpfs over each data root
//! holding exactly the copy's view (empty files for out-of-view items, owned by the copy's
//! root), read-only, and the copy's private scratch tmpfs (`TMPDIR`: writable,
//! size-limited, gone with the copy's mount namespace).
//! A helper is a process of its own because `setns(2)` into a user namespace needs a
//! single-threaded caller. It shares the broker's memory and borrows the calling thread
//! until it exits ([`vfork_helper`]), so nothing of the broker is copied; everything it
//! uses is prepared before it starts, and it only makes syscalls.

use std::ffi::CString;
use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::cgroup::Departure;
use crate::{ExecutorError, CHANNEL_PORT, PROXY_PORT, SLOT_PORT};

/// A file the copy will find at `path`: the item's contents if it is in the copy's view,
/// otherwise empty.
#[derive(Clone, Debug)]
pub struct CopyFile {
    /// Absolute path (under one of the data roots).
    pub path: PathBuf,
    /// Contents the copy may see.
    pub contents: Vec<u8>,
    /// The host file's mode and times, for an item in the copy's view; `None` (an item
    /// outside the view, or a replay without them) gives mode 0444 and both times at the
    /// epoch, which say nothing about the item.
    pub meta: Option<FileMeta>,
}

/// One thing the germline's import left in its scratch, by its path relative to the
/// scratch directory; copied into every copy's fresh scratch before the copy holds data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScratchEntry {
    /// A directory, with its permission bits.
    Dir {
        /// Relative path.
        path: PathBuf,
        /// Permission bits.
        mode: u32,
    },
    /// A regular file, with its contents, mode and times.
    File {
        /// Relative path.
        path: PathBuf,
        /// Contents.
        contents: Vec<u8>,
        /// Mode and times.
        meta: FileMeta,
    },
    /// A symbolic link (its target as written; it resolves inside the copy's root).
    Link {
        /// Relative path.
        path: PathBuf,
        /// Target.
        target: PathBuf,
    },
}

/// A copy's scratch: where its private file system goes, and what it starts with.
#[derive(Clone, Debug)]
pub struct CopyScratch {
    /// The scratch directory ([`crate::confine::scratch_dir`]).
    pub dir: PathBuf,
    /// What the germline's import left in its own scratch (data-free).
    pub seed: std::sync::Arc<Vec<ScratchEntry>>,
    /// Which file system the scratch is ([`ScratchKind`]).
    pub kind: ScratchKind,
}

/// The file system of a copy's scratch.
///
/// Why not always tmpfs. Since Linux 6.13 tmpfs (with ext4, xfs and btrfs) keeps
/// *multigrain* timestamps: changing an inode whose times were read since its last change
/// takes a fine-grained clock reading and publishes it in one host-wide variable, the floor,
/// which every later coarse timestamp of any file system on the host is raised to. A copy
/// that writes and `fstat`s a file of its own sets the floor to a time of its choosing, to
/// the nanosecond, and any other copy reads it back from the times of a file it changes:
/// a channel between live copies, and into every inode the broker changes while the floor
/// holds (SECURITY.md, "The multigrain timestamp floor"). ramfs keeps coarse times only: a
/// copy that writes nothing else of a multigrain file system (its view and root are
/// read-only, `memfd_create` is refused) never moves the floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScratchKind {
    /// ramfs: never moves the floor, and has no size limit of its own, so only where the
    /// copy's memory cgroup holds it to its memory limit (every page of it is charged there
    /// and cannot be reclaimed: past the limit the copy is killed).
    Ramfs,
    /// tmpfs of [`SCRATCH_OPTS`]: bounded by itself, but a sender of the floor; where the
    /// copy has no memory limit.
    Tmpfs,
}

/// What a copy sees of an item file's metadata besides its size (the contents' length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileMeta {
    /// Permission bits (`& 0o777`; the view is read-only whatever they say).
    pub mode: u32,
    /// Access time: seconds and nanoseconds since the epoch.
    pub atime: (i64, i64),
    /// Modification time: seconds and nanoseconds since the epoch.
    pub mtime: (i64, i64),
}

impl FileMeta {
    /// The metadata of an open host file.
    pub fn of(meta: &std::fs::Metadata) -> FileMeta {
        use std::os::unix::fs::MetadataExt;
        FileMeta {
            mode: meta.mode() & 0o777,
            atime: (meta.atime(), meta.atime_nsec()),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }
}

/// The broker's three listeners inside a copy's network namespace.
pub struct CopyListeners {
    /// HTTP proxy: the copy's only way out.
    pub proxy: TcpListener,
    /// MCP channel: the copy's stdio.
    pub channel: TcpListener,
    /// Slot writes.
    pub slot: TcpListener,
    /// Opens the copy's view once it runs as its own ids.
    pub gate: ViewGate,
}

/// What the copy must run as before it is given its view: the host uid and gid of its
/// lease (or, with per-copy ids off, the germline's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyIds {
    /// The copy's uid and gid in the germline's user namespace (0: the germline's own).
    pub offset: u32,
    /// Host uid.
    pub uid: u32,
    /// Host gid.
    pub gid: u32,
}

/// What mounts the copy's view (and its scratch) once the broker has checked the copy's ids.
pub struct ViewGate {
    prepared: Prepared,
    copy: i32,
    ids: CopyIds,
    /// The germline out of the copy's cgroups.
    departure: Departure,
}

impl ViewGate {
    /// Checks that every thread of the copy runs as its own ids with no capability and
    /// holds nothing from before the switch ([`crate::inspect::check_copy_ids`]); then
    /// closes the copy's way to new namespaces and mounts its scratch and view, from a
    /// helper in the copy's user and mount namespaces.
    pub fn open(self) -> Result<(), ExecutorError> {
        // The germline forked the copy from inside the copy's cgroups and leaves them in
        // the background: it shares no cgroup with a copy that holds data.
        self.departure.wait()?;
        // Without ids of its own (a broker that is not host root, or the switch off) the
        // copy shares the germline's ids anyway, and nothing here would keep them apart.
        if self.ids.offset != 0 {
            crate::inspect::check_copy_ids(self.copy, self.ids)?;
        }
        run_helper(&|| gate_main(&self.prepared))
    }
}

/// A pooled copy's view, mounted once the copy has taken its twin inputs.
pub struct ViewMount {
    /// The copy.
    pub pid: i32,
    /// The data roots.
    pub roots: Vec<PathBuf>,
    /// The view's files (out-of-view items empty).
    pub files: Vec<CopyFile>,
}

impl ViewMount {
    /// Mounts it ([`mount_view`]); a call with no item leaves the data roots as the copy
    /// has them, empty.
    pub fn mount(self) -> Result<(), ExecutorError> {
        if self.files.is_empty() {
            return Ok(());
        }
        mount_view(self.pid, &self.roots, &self.files)
    }
}

/// A set-up helper's failure at `step`, with the error it met.
fn step_error(step: u8, errno: i32) -> ExecutorError {
    ExecutorError::Sandbox(format!(
        "the copy's set-up helper failed at step '{}': {}",
        step as char,
        io::Error::from_raw_os_error(errno)
    ))
}

/// Mounts a view into a pooled copy `pid` that was set up without one
/// ([`prepare_copy`] with no data roots) and has passed its ids check: a helper enters the
/// copy's user and mount namespaces as the copy's own root and mounts the items as
/// [`prepare_copy`] would have. The copy keeps running meanwhile; it cannot write the view
/// (its Landlock domain allows writes to its scratch only) and sees the roots read-only
/// once this returns.
pub fn mount_view(pid: i32, data_roots: &[PathBuf], files: &[CopyFile]) -> Result<(), ExecutorError> {
    let p = prepare(pid, CopyIds { offset: 0, uid: 0, gid: 0 }, data_roots, files)?;
    run_helper(&|| view_main(&p))
}

/// [`vfork_helper`], its failure as an error.
fn run_helper(f: &dyn Fn() -> Result<(), StepErr>) -> Result<(), ExecutorError> {
    match vfork_helper(f) {
        Ok(Ok(())) => Ok(()),
        Ok(Err((step, errno))) => Err(step_error(step, errno)),
        Err(e) => Err(ExecutorError::io("running a set-up helper")(e)),
    }
}

/// Runs `f` in a helper process that shares the broker's memory and borrows the calling
/// thread until it exits (`CLONE_VM | CLONE_VFORK`, as `posix_spawn` does): nothing of the
/// broker is copied (copying its page tables is most of what a forked helper costs), and
/// the helper is a process of its own with one thread, as `setns(2)` into a user namespace
/// requires. `f` may only make syscalls on buffers prepared before it runs (it must not
/// allocate: the heap is the broker's), and every signal is blocked meanwhile, so no
/// handler of the broker runs in the helper. The helper's end sends no signal (exit signal
/// 0, awaited with `__WALL`): a SIGCHLD raised while the calling thread blocks every signal
/// would be queued for the broker and, though ignored, interrupt another thread's blocking
/// read that has a timeout (such reads end with EINTR and are not restarted), as a read
/// from a copy's channel did. Returns what `f` returned, or the error that kept the helper
/// from starting or finishing.
fn vfork_helper(f: &dyn Fn() -> Result<(), StepErr>) -> io::Result<Result<(), StepErr>> {
    struct Job<'a> {
        f: &'a dyn Fn() -> Result<(), StepErr>,
        out: Option<Result<(), StepErr>>,
    }
    extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `Job` below, which the suspended parent does not touch until
        // this child has exited.
        let job = unsafe { &mut *arg.cast::<Job<'_>>() };
        job.out = Some((job.f)());
        0
    }
    const STACK: usize = 256 << 10;
    let mut stack = vec![0u8; STACK];
    // The stack grows down from its (16-byte aligned) top.
    let top = (stack.as_mut_ptr() as usize + STACK) & !15;
    let mut job = Job { f, out: None };
    // SAFETY: signal masks on local sets; clone with a stack we own for the child's whole
    // life (CLONE_VFORK: this thread resumes only once the child has exited); waitpid on
    // our own child.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            entry,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK,
            (&mut job as *mut Job<'_>).cast(),
        );
        let err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(err);
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, libc::__WALL) < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        drop(stack);
        match job.out {
            Some(out) if libc::WIFEXITED(status) => Ok(out),
            _ => Err(io::Error::other(format!("the helper died (wait status {status:#x})"))),
        }
    }
}

fn view_main(p: &Prepared) -> Result<(), StepErr> {
    let mnt = enter_copy_user(p)?;
    // SAFETY: setns on the helper's own descriptor; then raw syscalls on buffers of `p`.
    unsafe {
        ck(b'k', libc::setns(mnt, libc::CLONE_NEWNS) as libc::c_long)?;
        mount_view_files(p)
    }
}

/// Enters the copy's user namespace as its root; returns a descriptor of its mount
/// namespace, opened before (the path is the broker's `/proc`).
fn enter_copy_user(p: &Prepared) -> Result<RawFd, StepErr> {
    use libc::*;
    // SAFETY: opens of NUL-terminated paths prepared before the helper started; setns on
    // the helper's own descriptors.
    unsafe {
        let user = ck(b'a', open(p.ns_user.as_ptr(), O_RDONLY | O_CLOEXEC) as c_long)? as c_int;
        let mnt = ck(b'c', open(p.ns_mnt.as_ptr(), O_RDONLY | O_CLOEXEC) as c_long)? as c_int;
        ck(b'i', setns(user, CLONE_NEWUSER) as c_long)?;
        become_namespace_root()?;
        Ok(mnt)
    }
}

/// Takes root of the user namespace the helper just entered: the raw syscalls, as glibc's
/// wrappers would also try to change the ids of every thread of the broker, whose memory
/// (and thread list) a helper shares.
fn become_namespace_root() -> Result<(), StepErr> {
    // SAFETY: id syscalls on the calling task only.
    unsafe {
        // Gid first: it needs a capability that a uid change may drop.
        ck(b'w', libc::syscall(libc::SYS_setresgid, 0, 0, 0))?;
        ck(b'x', libc::syscall(libc::SYS_setresuid, 0, 0, 0))?;
    }
    Ok(())
}

struct Prepared {
    ns_user: CString,
    ns_net: CString,
    ns_mnt: CString,
    setgroups: CString,
    uid_map_path: CString,
    gid_map_path: CString,
    id_map: CString,
    roots: Vec<CString>,
    dirs: Vec<CString>,
    files: Vec<(CString, Vec<u8>, Option<FileMeta>)>,
    tmpfs_opts: CString,
    scratch: Option<(CString, ScratchKind)>,
    scratch_seed: Vec<SeedOp>,
}

/// A [`ScratchEntry`] with its absolute path in the copy, ready for the set-up helper.
enum SeedOp {
    Dir(CString, u32),
    File(CString, Vec<u8>, FileMeta),
    Link(CString, CString),
}

/// Sets up the copy `pid` from outside and returns the listeners in its network namespace.
///
/// `scratch` (the germline's [`crate::confine::scratch_dir`]) gets a fresh writable tmpfs of
/// this copy's own: mounted in the copy's mount namespace, where no other copy or the
/// germline can reach it (the germline's directory there lies on its read-only root), and
/// holding, as the copy's own files, what the germline's import left in its scratch.
pub fn prepare_copy(
    pid: i32,
    ids: CopyIds,
    data_roots: &[PathBuf],
    files: &[CopyFile],
    scratch: Option<&CopyScratch>,
    departure: Departure,
) -> Result<CopyListeners, ExecutorError> {
    let mut p = prepare(pid, ids, data_roots, files)?;
    let cp =
        |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|_| ExecutorError::internal("NUL in scratch path"));
    if let Some(sc) = scratch {
        p.scratch = Some((cp(&sc.dir)?, sc.kind));
        for e in sc.seed.iter() {
            p.scratch_seed.push(match e {
                ScratchEntry::Dir { path, mode } => SeedOp::Dir(cp(&sc.dir.join(path))?, *mode),
                ScratchEntry::File { path, contents, meta } => {
                    SeedOp::File(cp(&sc.dir.join(path))?, contents.clone(), *meta)
                }
                ScratchEntry::Link { path, target } => SeedOp::Link(cp(target)?, cp(&sc.dir.join(path))?),
            });
        }
    }
    let (ours, theirs) = UnixStream::pair().map_err(ExecutorError::io("socketpair for copy set-up"))?;
    run_helper(&|| listeners_main(&p, theirs.as_raw_fd()))?;
    drop(theirs);
    let (proxy, channel, slot) = receive_listeners(&ours)?;
    Ok(CopyListeners { proxy, channel, slot, gate: ViewGate { prepared: p, copy: pid, ids, departure } })
}

fn prepare(pid: i32, ids: CopyIds, data_roots: &[PathBuf], files: &[CopyFile]) -> Result<Prepared, ExecutorError> {
    let c = |s: String| CString::new(s).map_err(|_| ExecutorError::internal("NUL in path"));
    let cp = |p: &Path| {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| ExecutorError::Call(format!("NUL in {}", p.display())))
    };
    let mut dirs = Vec::new();
    let mut out_files = Vec::new();
    let mut total = 0usize;
    let paths: Vec<&Path> = files.iter().map(|f| f.path.as_path()).collect();
    for f in crate::view_order::creation_order(&paths).into_iter().map(|i| &files[i]) {
        let root = data_roots
            .iter()
            .find(|r| f.path.starts_with(r))
            .ok_or_else(|| ExecutorError::Call(format!("item {} is under no data root", f.path.display())))?;
        let mut d = f.path.parent();
        let mut chain = Vec::new();
        while let Some(dir) = d {
            if dir == root.as_path() {
                break;
            }
            chain.push(dir.to_path_buf());
            d = dir.parent();
        }
        for dir in chain.into_iter().rev() {
            let cd = cp(&dir)?;
            if !dirs.contains(&cd) {
                dirs.push(cd);
            }
        }
        total += f.contents.len();
        out_files.push((cp(&f.path)?, f.contents.clone(), f.meta));
    }
    Ok(Prepared {
        ns_user: c(format!("/proc/{pid}/ns/user"))?,
        ns_net: c(format!("/proc/{pid}/ns/net"))?,
        ns_mnt: c(format!("/proc/{pid}/ns/mnt"))?,
        setgroups: c(format!("/proc/{pid}/setgroups"))?,
        uid_map_path: c(format!("/proc/{pid}/uid_map"))?,
        gid_map_path: c(format!("/proc/{pid}/gid_map"))?,
        id_map: c(format!("0 {} 1", ids.offset))?,
        roots: data_roots.iter().map(|r| cp(r)).collect::<Result<_, _>>()?,
        dirs,
        files: out_files,
        tmpfs_opts: c(format!("size={},mode=0755,nr_inodes={}", total + (1 << 20), files.len() * 2 + 64))?,
        scratch: None,
        scratch_seed: Vec::new(),
    })
}

/// Mount options of a copy's scratch tmpfs: 64 MiB (its pages are charged to the copy's
/// memory cgroup), 4096 files and directories, `/tmp`'s mode.
const SCRATCH_OPTS: &std::ffi::CStr = c"size=67108864,nr_inodes=4096,mode=1777";

/// Mount options of a copy's scratch ramfs: `/tmp`'s mode (ramfs has no other).
const SCRATCH_RAMFS_OPTS: &std::ffi::CStr = c"mode=1777";

type StepErr = (u8, i32);

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn ck(step: u8, rc: libc::c_long) -> Result<libc::c_long, StepErr> {
    if rc < 0 {
        Err((step, errno()))
    } else {
        Ok(rc)
    }
}

/// The first helper: maps the copy's ids, enters its user and network namespaces as its
/// root, brings loopback up and sends the three listeners it opens there over `sock`.
fn listeners_main(p: &Prepared, sock: RawFd) -> Result<(), StepErr> {
    use libc::*;
    // SAFETY (whole block): raw syscalls on NUL-terminated strings and buffers prepared
    // before the helper started; descriptors are the helper's own.
    unsafe {
        let user = ck(b'a', open(p.ns_user.as_ptr(), O_RDONLY | O_CLOEXEC) as c_long)? as c_int;
        let net = ck(b'b', open(p.ns_net.as_ptr(), O_RDONLY | O_CLOEXEC) as c_long)? as c_int;
        let parent_user = ck(b'd', ioctl(user, NS_GET_PARENT) as c_long)? as c_int;
        ck(b'e', setns(parent_user, CLONE_NEWUSER) as c_long)?;
        write_file(b'f', &p.setgroups, b"deny", true)?;
        write_file(b'g', &p.uid_map_path, p.id_map.as_bytes(), false)?;
        write_file(b'h', &p.gid_map_path, p.id_map.as_bytes(), false)?;
        ck(b'i', setns(user, CLONE_NEWUSER) as c_long)?;
        // Act as the copy's own root (its own host ids, or the germline's), so the view's
        // files belong to the copy and can be created at all: a file system mounted in the
        // copy's namespace takes no owner its map lacks (host root is unmapped when the
        // germline runs as the sandbox ids).
        become_namespace_root()?;
        ck(b'j', setns(net, CLONE_NEWNET) as c_long)?;
        loopback_up()?;
        let mut fds = [0 as c_int; 3];
        for (i, port) in [PROXY_PORT, CHANNEL_PORT, SLOT_PORT].into_iter().enumerate() {
            fds[i] = listen_on(port)?;
        }
        send_fds(sock, &fds)?;
    }
    Ok(())
}

/// The second helper, once the copy runs as its own ids without capabilities: enters the
/// copy's user and mount namespaces as its root, closes its way to new namespaces and
/// notification groups, and mounts its scratch and its view.
fn gate_main(p: &Prepared) -> Result<(), StepErr> {
    use libc::*;
    let mnt = enter_copy_user(p)?;
    // SAFETY (whole block): raw syscalls on NUL-terminated strings and buffers prepared
    // before the helper started; descriptors are the helper's own.
    unsafe {
        // The copy may create no namespace and no inotify/fanotify group: each would count
        // against limits the copy's user namespace shares with the germline's and the
        // host's (per owner), which other copies could then read. Set only now: until the
        // copy gave up its capabilities it could have raised them again. (Before entering
        // the copy's mount namespace: these paths are the broker's `/proc`.)
        for name in NAMESPACE_LIMITS {
            write_file(b'y', std::ffi::CStr::from_bytes_with_nul_unchecked(name), b"0", true)?;
        }
        ck(b'k', setns(mnt, CLONE_NEWNS) as c_long)?;
        if let Some((dir, kind)) = &p.scratch {
            let (fs, opts) = match kind {
                ScratchKind::Ramfs => (c"ramfs", SCRATCH_RAMFS_OPTS),
                ScratchKind::Tmpfs => (c"tmpfs", SCRATCH_OPTS),
            };
            ck(
                b's',
                mount(
                    c"germline-scratch".as_ptr(),
                    dir.as_ptr(),
                    fs.as_ptr(),
                    MS_NOSUID | MS_NODEV,
                    opts.as_ptr().cast(),
                ) as c_long,
            )?;
            seed_scratch(&p.scratch_seed)?;
        }
        mount_view_files(p)?;
    }
    Ok(())
}

/// Mounts the view of `p` (a tmpfs per data root holding the items, with their modes and
/// times) in the mount namespace the caller is in, then makes every root read-only.
///
/// # Safety
/// Raw syscalls on buffers of `p`; called in a set-up helper only.
unsafe fn mount_view_files(p: &Prepared) -> Result<(), StepErr> {
    use libc::*;
    for root in &p.roots {
        ck(
            b'l',
            mount(
                c"germline-view".as_ptr(),
                root.as_ptr(),
                c"tmpfs".as_ptr(),
                MS_NOSUID | MS_NODEV | MS_NOEXEC,
                p.tmpfs_opts.as_ptr().cast(),
            ) as c_long,
        )?;
    }
    for d in &p.dirs {
        if mkdir(d.as_ptr(), 0o755) < 0 && errno() != EEXIST {
            return Err((b'm', errno()));
        }
    }
    for (path, contents, meta) in &p.files {
        let fd = ck(b'n', open(path.as_ptr(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o444) as c_long)? as c_int;
        let mut off = 0;
        while off < contents.len() {
            let n = ck(b'o', write(fd, contents[off..].as_ptr().cast(), contents.len() - off) as c_long)?;
            off += n as usize;
        }
        // The host file's mode and times for an item in view; fixed ones otherwise.
        let (mode, times) = match meta {
            Some(m) => (m.mode, [timespec_of(m.atime), timespec_of(m.mtime)]),
            None => (0o444, [timespec_of((0, 0)), timespec_of((0, 0))]),
        };
        ck(b't', fchmod(fd, mode) as c_long)?;
        ck(b'u', futimens(fd, times.as_ptr()) as c_long)?;
        close(fd);
    }
    for root in &p.roots {
        ck(
            b'p',
            mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                std::ptr::null(),
            ) as c_long,
        )?;
    }
    Ok(())
}

/// Writes what the germline's import left in its scratch into the copy's fresh scratch
/// (parents before children), as the copy's own root.
///
/// # Safety
/// Raw syscalls on buffers prepared before the helper started; called in a set-up helper
/// only.
unsafe fn seed_scratch(ops: &[SeedOp]) -> Result<(), StepErr> {
    use libc::*;
    for op in ops {
        match op {
            SeedOp::Dir(path, mode) => {
                ck(b'A', mkdir(path.as_ptr(), 0o700) as c_long)?;
                ck(b'B', chmod(path.as_ptr(), *mode & 0o7777) as c_long)?;
            }
            SeedOp::File(path, contents, meta) => {
                let flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
                let fd = ck(b'C', open(path.as_ptr(), flags, 0o600) as c_long)? as c_int;
                let mut off = 0;
                while off < contents.len() {
                    let n = ck(b'D', write(fd, contents[off..].as_ptr().cast(), contents.len() - off) as c_long)?;
                    off += n as usize;
                }
                ck(b'E', fchmod(fd, meta.mode & 0o7777) as c_long)?;
                let times = [timespec_of(meta.atime), timespec_of(meta.mtime)];
                ck(b'F', futimens(fd, times.as_ptr()) as c_long)?;
                close(fd);
            }
            SeedOp::Link(target, path) => {
                ck(b'G', symlink(target.as_ptr(), path.as_ptr()) as c_long)?;
            }
        }
    }
    Ok(())
}

/// Unmounts `dir` in the germline `pid`'s mount namespace (detached: nothing there can
/// reach it again by path), from a helper that enters the germline's user and mount
/// namespaces as their root. The germline must be stopped.
pub fn unmount_in_germline(pid: i32, dir: &Path) -> Result<(), ExecutorError> {
    let c = |s: String| CString::new(s).map_err(|_| ExecutorError::internal("NUL in path"));
    let user = c(format!("/proc/{pid}/ns/user"))?;
    let mnt = c(format!("/proc/{pid}/ns/mnt"))?;
    let target = CString::new(dir.as_os_str().as_bytes()).map_err(|_| ExecutorError::internal("NUL in path"))?;
    run_helper(&|| {
        use libc::*;
        // SAFETY (whole block): raw syscalls on NUL-terminated strings prepared above.
        unsafe {
            let u = ck(b'a', open(user.as_ptr(), O_RDONLY | O_CLOEXEC) as c_long)? as c_int;
            let m = ck(b'c', open(mnt.as_ptr(), O_RDONLY | O_CLOEXEC) as c_long)? as c_int;
            ck(b'i', setns(u, CLONE_NEWUSER) as c_long)?;
            become_namespace_root()?;
            ck(b'k', setns(m, CLONE_NEWNS) as c_long)?;
            ck(b'U', umount2(target.as_ptr(), MNT_DETACH) as c_long)?;
            Ok(())
        }
    })
    .map_err(|e| ExecutorError::Sandbox(format!("unmounting the germline's import scratch: {e}")))
}

fn timespec_of((sec, nsec): (i64, i64)) -> libc::timespec {
    libc::timespec { tv_sec: sec, tv_nsec: nsec }
}

/// The copy namespace's limits on namespaces and kernel notification groups (each path
/// NUL-terminated); a missing one (older kernel) is skipped.
const NAMESPACE_LIMITS: [&[u8]; 12] = [
    b"/proc/sys/user/max_user_namespaces\0",
    b"/proc/sys/user/max_pid_namespaces\0",
    b"/proc/sys/user/max_net_namespaces\0",
    b"/proc/sys/user/max_mnt_namespaces\0",
    b"/proc/sys/user/max_ipc_namespaces\0",
    b"/proc/sys/user/max_uts_namespaces\0",
    b"/proc/sys/user/max_cgroup_namespaces\0",
    b"/proc/sys/user/max_time_namespaces\0",
    b"/proc/sys/user/max_inotify_instances\0",
    b"/proc/sys/user/max_inotify_watches\0",
    b"/proc/sys/user/max_fanotify_groups\0",
    b"/proc/sys/user/max_fanotify_marks\0",
];

unsafe fn write_file(step: u8, path: &std::ffi::CStr, data: &[u8], optional: bool) -> Result<(), StepErr> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return if optional { Ok(()) } else { Err((step, errno())) };
    }
    let n = libc::write(fd, data.as_ptr().cast(), data.len());
    let e = errno();
    libc::close(fd);
    if n < 0 && !optional {
        return Err((step, e));
    }
    Ok(())
}

unsafe fn loopback_up() -> Result<(), StepErr> {
    let s =
        ck(b'q', libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) as libc::c_long)? as libc::c_int;
    let mut ifr: libc::ifreq = std::mem::zeroed();
    for (i, b) in b"lo".iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    ck(b'r', libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr) as libc::c_long)?;
    libc::close(s);
    Ok(())
}

unsafe fn listen_on(port: u16) -> Result<libc::c_int, StepErr> {
    let s = ck(b's', libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) as libc::c_long)?
        as libc::c_int;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be() },
        sin_zero: [0; 8],
    };
    ck(
        b't',
        libc::bind(s, (&addr as *const libc::sockaddr_in).cast(), std::mem::size_of::<libc::sockaddr_in>() as u32)
            as libc::c_long,
    )?;
    ck(b'u', libc::listen(s, 64) as libc::c_long)?;
    Ok(s)
}

unsafe fn send_fds(sock: RawFd, fds: &[libc::c_int; 3]) -> Result<(), StepErr> {
    let payload = *b"OK";
    let mut iov = libc::iovec { iov_base: payload.as_ptr() as *mut _, iov_len: payload.len() };
    let space = libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as usize;
    let mut cbuf = [0u8; 64];
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    let cmsg = libc::CMSG_FIRSTHDR(&msg);
    (*cmsg).cmsg_level = libc::SOL_SOCKET;
    (*cmsg).cmsg_type = libc::SCM_RIGHTS;
    (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
    std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), 3);
    ck(b'v', libc::sendmsg(sock, &msg, 0) as libc::c_long)?;
    Ok(())
}

fn receive_listeners(sock: &UnixStream) -> Result<(TcpListener, TcpListener, TcpListener), ExecutorError> {
    let mut buf = [0u8; 4];
    let mut cbuf = [0u8; 64];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: recvmsg into local buffers; received descriptors are taken into OwnedFd.
    let (n, fds) = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = cbuf.len();
        let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<libc::c_int>();
                let data = libc::CMSG_DATA(cmsg) as *const libc::c_int;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(*data.add(i)));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        (n, fds)
    };
    if n < 2 || &buf[..2] != b"OK" || fds.len() != 3 {
        return Err(ExecutorError::Sandbox("copy set-up helper died".into()));
    }
    let mut it = fds.into_iter().map(TcpListener::from);
    let (proxy, channel, slot) = match (it.next(), it.next(), it.next()) {
        (Some(a), Some(b), Some(c)) => (a, b, c),
        _ => return Err(ExecutorError::internal("listener count")),
    };
    Ok((proxy, channel, slot))
}
