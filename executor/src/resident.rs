//! The resident root (`[sandbox] resident_root`): a germline root in which every page a
//! copy can read is in memory, and locked there by the broker, before the germline starts.
//!
//! Why. A page of a file in the root is either in the page cache or not, and that state is
//! shared by every process on the host. A copy that holds an item can change it (read a cold
//! page; evict a page charged to its own memory cgroup by filling that cgroup) and any later
//! copy can read it (its own major-fault count, or timing): SECURITY.md, "Page-cache
//! residency". With the whole of `/usr` bound (5.5 GB, almost all of it cold) that carries
//! thousands of bits per call.
//!
//! What. The root binds only what the interpreter and the release need
//! ([`resident_paths`]): the interpreter's link chain, its `sys.path` directories (less the
//! standard library's tests and any `site-packages` not on the path), the shim, the release,
//! and the shared libraries all of their ELF files load (DT_NEEDED, RUNPATH and PT_INTERP,
//! followed to the end). Before the germline starts, a process of its own (its locker,
//! forked from the broker) maps every regular file in that root and locks it with `mlock`
//! ([`lock`]): each page is read in, charged to the broker, and kept off every LRU list, so
//! no copy can load a page (none is cold) or evict one (none is evictable, whoever it is
//! charged to). The locks go when the germline's lock is dropped; a germline whose locker
//! died counts as gone. They are not in the broker's address space: every set-up helper
//! shares it, and the kernel walks all of its mappings at each helper's exit.
//!
//! Where from. The root binds none of it from the host: the broker first copies it into its
//! in-memory tree ([`Tree`], a tmpfs in a mount namespace of its own) and the root binds the
//! tree's copies, which are what it locks. A lookup on a host file system leaves state a
//! later copy can time (a negative dentry for a missing name, a cached directory block or
//! link); on the tree it leaves none (SECURITY.md, "Resident root").
//!
//! When. On by default wherever the broker can mount and lock the tree, that is, runs as
//! root ([`crate::policy::resident_root_default`]); a policy's `resident_root = true` requires
//! it (a germline is refused without), `false` chooses the default root.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use crate::germline::PythonRuntime;
use crate::ExecutorError;

/// Test-only switch ("mechanism off"): a germline whose resident root's locker is gone
/// still forks copies. Never set outside tests.
pub static LOCKER_CHECK_OFF_FOR_TESTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Most bytes one germline's resident root may lock: beyond it the germline is refused.
pub const MAX_RESIDENT_BYTES: u64 = 4 << 30;

/// What the default decision ([`crate::policy::resident_root_default`]) and `germline doctor`
/// ask a broker to be able to lock: a FastMCP release on the project's venv locks about
/// 260 MiB; twice that leaves room for larger ones.
pub const TYPICAL_ROOT_BYTES: u64 = 512 << 20;

/// Largest ELF file whose dependencies are read (a larger one is still bound and locked).
const MAX_ELF_BYTES: u64 = 512 << 20;

/// Most files walked for ELF objects and locks, per germline.
const MAX_FILES: usize = 200_000;

/// Libraries the C library opens by name at run time rather than through DT_NEEDED: the
/// unwinder (thread exit and cancellation).
const LOADED_BY_NAME: &[&str] = &["libgcc_s.so.1"];

/// The resident root's read-only paths and the directories hidden beneath them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResidentPaths {
    /// Bound read-only, as on the host (links as links).
    pub read_only: Vec<PathBuf>,
    /// Directories under a bound one that get an empty tmpfs over them.
    pub masks: Vec<PathBuf>,
}

/// The paths a resident root binds for `runtime` running `release_dir`, with `extra`
/// (files or directories the germline needs besides: the CA certificate, the manifest's
/// system paths, already checked to lie where the default root reaches).
pub fn resident_paths(
    runtime: &PythonRuntime,
    release_dir: &Path,
    extra: &[PathBuf],
) -> Result<ResidentPaths, ExecutorError> {
    let layout = &runtime.layout;
    let mut binds: BTreeSet<PathBuf> = BTreeSet::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    let add = |p: &Path, binds: &mut BTreeSet<PathBuf>| -> Result<Option<PathBuf>, ExecutorError> {
        let links = chain(p)?;
        let end = links.last().cloned();
        binds.extend(links.into_iter().filter(|l| !l.starts_with("/etc")));
        Ok(end)
    };
    let interpreter = add(&runtime.python, &mut binds)?
        .ok_or_else(|| ExecutorError::Sandbox(format!("interpreter {}: no path", runtime.python.display())))?;
    if layout.prefix != layout.base_prefix {
        let cfg = layout.prefix.join("pyvenv.cfg");
        if cfg.exists() {
            add(&cfg, &mut binds)?;
        }
    }
    // A merged-/usr host's top-level links (`/bin` -> `usr/bin`), links only: `/bin/sh`
    // then resolves to whatever of `/usr/bin` is bound, as programs spell it.
    for d in ["/bin", "/sbin", "/lib", "/lib64"].map(Path::new) {
        if std::fs::symlink_metadata(d).is_ok_and(|m| m.file_type().is_symlink()) {
            binds.insert(d.to_path_buf());
        }
    }
    // Where the host `/etc` entries the root binds lead (`/etc/localtime` into the zone
    // files), so they resolve in the root as on the host.
    for e in crate::confine::HOST_ETC.iter().map(Path::new) {
        if std::fs::symlink_metadata(e).is_ok_and(|m| m.file_type().is_symlink()) {
            let Ok(links) = chain(e) else { continue };
            if links.iter().all(|l| l.starts_with("/etc") || runtime.read_paths.iter().any(|r| l.starts_with(r))) {
                add(e, &mut binds)?;
            }
        }
    }
    let on_path: BTreeSet<PathBuf> = layout.sys_path.iter().filter_map(|p| p.canonicalize().ok()).collect();
    for p in layout.sys_path.iter().filter(|p| p.is_dir()) {
        if let Some(end) = add(p, &mut binds)? {
            dirs.push(end);
        }
    }
    let mut programs = Vec::new();
    for p in [&runtime.shim_dir, &release_dir.to_path_buf()].into_iter().chain(extra) {
        if let Some(end) = add(p, &mut binds)? {
            if end.is_dir() {
                dirs.push(end);
            } else if is_elf(&end) {
                programs.push(end);
            }
        }
    }
    // What a bound directory holds but nothing on the path reads: the standard library's
    // own tests, and package directories that are not on `sys.path` (the base interpreter's
    // `site-packages` under a venv's standard library).
    let mut masks = BTreeSet::new();
    for d in &dirs {
        let stdlib = d.join("os.py").is_file();
        for entry in std::fs::read_dir(d).map_err(ExecutorError::io(format!("reading {}", d.display())))? {
            let entry = entry.map_err(ExecutorError::io(format!("reading {}", d.display())))?;
            let Ok(kind) = entry.file_type() else { continue };
            if !kind.is_dir() {
                continue;
            }
            let name = entry.file_name();
            let packages = name == "site-packages" || name == "dist-packages";
            let real = entry.path().canonicalize().unwrap_or(entry.path());
            if (packages && !on_path.contains(&real)) || (stdlib && name == "test") {
                masks.insert(entry.path());
            }
        }
    }
    let masks: Vec<PathBuf> = masks.into_iter().collect();
    // Every ELF object bound, and everything each loads.
    let mut queue: VecDeque<PathBuf> = VecDeque::from([interpreter]);
    queue.extend(programs);
    let mut seen = 0usize;
    for d in &dirs {
        walk(d, &masks, &mut seen, &mut |p, meta| {
            let named_like_one = p.file_name().is_some_and(|n| n.as_bytes().windows(3).any(|w| w == b".so"));
            if (named_like_one || meta.mode() & 0o111 != 0) && is_elf(p) {
                queue.push_back(p.to_path_buf());
            }
        })?;
    }
    let mut done: BTreeSet<PathBuf> = BTreeSet::new();
    let mut first = true;
    while let Some(object) = queue.pop_front() {
        if !done.insert(object.clone()) {
            continue;
        }
        let Some(deps) = elf_dependencies(&object) else { continue };
        let origin = object.parent().unwrap_or(Path::new("/")).to_path_buf();
        let mut wanted: Vec<PathBuf> = deps.interpreter.into_iter().collect();
        let by_name = if first { LOADED_BY_NAME } else { &[] };
        first = false;
        for name in deps.needed.iter().map(String::as_str).chain(by_name.iter().copied()) {
            match resolve(name, &origin, &deps.runpath) {
                Some(p) => wanted.push(p),
                None => tracing::debug!("resident root: {} needs {name}, found nowhere", object.display()),
            }
        }
        for w in wanted {
            // A dependency is bound only where the default root already reaches (the system
            // directories and the interpreter's paths) or inside the release: a release's
            // ELF file cannot name a host file into the root.
            let Ok(links) = chain(&w) else { continue };
            let inside =
                |l: &PathBuf| l.starts_with(release_dir) || runtime.read_paths.iter().any(|r| l.starts_with(r));
            if !links.iter().all(inside) {
                tracing::warn!(
                    "resident root: {} asks for {}, outside what a root may bind; not bound",
                    object.display(),
                    w.display()
                );
                continue;
            }
            if let Some(end) = add(&w, &mut binds)? {
                queue.push_back(end);
            }
        }
    }
    Ok(ResidentPaths { read_only: binds.into_iter().collect(), masks })
}

/// Each symbolic link the resolution of `p` meets (in any component), then the path it
/// ends at; bound as they are, the links resolve in the root as they do on the host.
pub fn chain(p: &Path) -> Result<Vec<PathBuf>, ExecutorError> {
    let err = |what: String| ExecutorError::Sandbox(format!("resident root: {}: {what}", p.display()));
    let mut out = Vec::new();
    let mut todo = normal(p).ok_or_else(|| err("not an absolute path".into()))?;
    for _ in 0..40 {
        let parts: Vec<PathBuf> = todo.components().skip(1).map(|c| PathBuf::from(c.as_os_str())).collect();
        let mut at = PathBuf::from("/");
        let mut link = None;
        for (i, c) in parts.iter().enumerate() {
            at.push(c);
            let meta = std::fs::symlink_metadata(&at).map_err(|e| err(format!("{}: {e}", at.display())))?;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&at).map_err(|e| err(format!("{}: {e}", at.display())))?;
                let mut next = at.parent().unwrap_or(Path::new("/")).join(target);
                next.extend(&parts[i + 1..]);
                link = Some((at.clone(), normal(&next).ok_or_else(|| err("a link leads nowhere".into()))?));
                break;
            }
        }
        match link {
            None => {
                out.push(todo);
                return Ok(out);
            }
            Some((at, next)) => {
                out.push(at);
                todo = next;
            }
        }
    }
    Err(err("too many symbolic links".into()))
}

/// `p` with `.` and `..` taken out lexically; `None` for a relative path.
fn normal(p: &Path) -> Option<PathBuf> {
    if !p.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Some(out)
}

/// Calls `each` for every regular file under `dir` (links read, not followed; `masks`
/// skipped).
fn walk(
    dir: &Path,
    masks: &[PathBuf],
    seen: &mut usize,
    each: &mut dyn FnMut(&Path, &std::fs::Metadata),
) -> Result<(), ExecutorError> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if masks.iter().any(|m| m == &d) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            *seen += 1;
            if *seen > MAX_FILES {
                return Err(ExecutorError::Sandbox(format!(
                    "resident root: more than {MAX_FILES} files under {}",
                    dir.display()
                )));
            }
            let p = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&p) else { continue };
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file() {
                each(&p, &meta);
            } else if meta.file_type().is_symlink() {
                // A slow link (target of 60 bytes or more) keeps its target in a data block,
                // which `mlock` cannot hold: read here, it is in memory, charged to the
                // broker, before any copy could be the first to resolve it (SECURITY.md,
                // "Resident root"). Its directory's blocks were read by `read_dir` above.
                let _ = std::fs::read_link(&p);
            }
        }
    }
    Ok(())
}

fn is_elf(p: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(p).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && magic == *b"\x7fELF"
}

/// What an ELF object asks the loader for.
#[derive(Debug, Default)]
struct ElfDependencies {
    interpreter: Option<PathBuf>,
    needed: Vec<String>,
    runpath: Vec<String>,
}

/// The PT_INTERP, DT_NEEDED and DT_RUNPATH/DT_RPATH of a 64-bit ELF object; `None` for
/// anything else (or a file larger than [`MAX_ELF_BYTES`]).
fn elf_dependencies(path: &Path) -> Option<ElfDependencies> {
    use object::read::elf::{Dyn as _, FileHeader as _, ProgramHeader as _};
    if std::fs::metadata(path).ok()?.len() > MAX_ELF_BYTES {
        return None;
    }
    let data = std::fs::read(path).ok()?;
    let data = &*data;
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let mut out = ElfDependencies::default();
    for ph in header.program_headers(endian, data).ok()? {
        if let Ok(Some(i)) = ph.interpreter(endian, data) {
            out.interpreter = Some(PathBuf::from(OsStr::from_bytes(i)));
        }
    }
    let sections = header.sections(endian, data).ok()?;
    if let Ok(Some((dyns, link))) = sections.dynamic(endian, data) {
        let strings = sections.strings(endian, data, link).ok()?;
        for d in dyns {
            let text = || d.string(endian, strings).ok().map(|s| String::from_utf8_lossy(s).into_owned());
            match d.tag32(endian) {
                Some(object::elf::DT_NEEDED) => out.needed.extend(text()),
                Some(object::elf::DT_RUNPATH | object::elf::DT_RPATH) => out.runpath.extend(text()),
                _ => {}
            }
        }
    }
    Some(out)
}

/// Where the loader finds `name` for an object in `origin`: its RUNPATH, then the system's
/// library directories (as `ld.so.cache` lists them on Debian-like hosts).
fn resolve(name: &str, origin: &Path, runpath: &[String]) -> Option<PathBuf> {
    if name.contains('/') {
        let p = origin.join(name);
        return p.exists().then_some(p);
    }
    let origin = origin.to_string_lossy();
    let arch = format!("{}-linux-gnu", std::env::consts::ARCH);
    let system = [
        format!("/lib/{arch}"),
        format!("/usr/lib/{arch}"),
        "/lib64".into(),
        "/usr/lib64".into(),
        "/lib".into(),
        "/usr/lib".into(),
        "/usr/local/lib".into(),
    ];
    runpath
        .iter()
        .flat_map(|r| r.split(':'))
        .map(|d| d.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin))
        .chain(system)
        .map(|d| Path::new(&d).join(name))
        .find(|p| p.is_file())
}

/// A read-only shared mapping of a whole file, unmapped when dropped (locked, in
/// [`lock`]'s registry).
struct Locked {
    addr: usize,
    len: usize,
}

impl Locked {
    /// Maps all `len` bytes of `f` read-only.
    fn map(f: &std::fs::File, len: usize) -> std::io::Result<Locked> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh read-only shared mapping of an open file; only ever unmapped by
        // `Locked::drop`.
        let addr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Locked { addr: addr as usize, len })
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value made and owns.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// The locks one germline holds, in a process of their own ([`Locker`]); dropping them
/// unlocks its files (a file another germline binds stays locked by that germline's).
pub struct ResidentLock {
    /// Dropped first: unlocked before [`Held`] removes what no germline holds any more.
    locker: Option<Locker>,
    /// The in-memory tree the files are in ([`make`]) and the paths this germline holds
    /// there, while it lives.
    held: Option<Held>,
    /// Bytes of the files this germline's root holds, locked.
    pub bytes: u64,
}

/// One germline's hold on paths of the tree ([`Tree::hold`]), given back on drop.
struct Held {
    tree: Arc<Tree>,
    roots: Vec<PathBuf>,
}

impl Drop for Held {
    fn drop(&mut self) {
        // The last holder of the tree: all of it goes with the tmpfs, nothing to remove.
        if Arc::strong_count(&self.tree) > 1 {
            self.tree.release(&self.roots);
        }
    }
}

impl std::fmt::Debug for ResidentLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ResidentLock({} bytes, locker {:?})", self.bytes, self.locker.as_ref().map(|l| l.pid))
    }
}

/// Every regular file under `paths` (links not followed, `masks` skipped) and `etc`.
pub fn files(paths: &ResidentPaths, etc: &[&str]) -> Result<Vec<(PathBuf, std::fs::Metadata)>, ExecutorError> {
    let mut files: Vec<(PathBuf, std::fs::Metadata)> = Vec::new();
    let mut seen = 0usize;
    let roots = paths.read_only.iter().cloned().chain(etc.iter().map(PathBuf::from));
    for p in roots {
        let Ok(meta) = std::fs::symlink_metadata(&p) else { continue };
        if meta.is_file() {
            files.push((p, meta));
        } else if meta.is_dir() {
            walk(&p, &paths.masks, &mut seen, &mut |f, m| files.push((f.to_path_buf(), m.clone())))?;
        }
    }
    Ok(files)
}

/// A germline's resident root: `paths` and the host `etc` entries copied into an in-memory
/// tree ([`Tree::fill`]) and every file of theirs there locked ([`lock`]). The root binds
/// them from the tree ([`ResidentLock::source`]). The tree is the broker's, shared by its
/// germlines, or with `own` one made for this germline alone, dropped with it: a replay's
/// germline gets its own, so that what the call's tree shows (its device, its files' change
/// times and inode numbers) is no more the replay's than a third party's.
pub fn make(paths: &ResidentPaths, etc: &[&str], own: bool) -> Result<ResidentLock, ExecutorError> {
    let t0 = std::time::Instant::now();
    let tree = if own { Arc::new(Tree::make()?) } else { Tree::get()? };
    let roots: Vec<PathBuf> = paths.read_only.iter().cloned().chain(etc.iter().map(PathBuf::from)).collect();
    tree.hold(&roots);
    // Held before the fill: a fill that fails part way gives back what it copied.
    let held = Held { tree: tree.clone(), roots };
    tree.fill(paths, etc)?;
    let filled = t0.elapsed();
    let mut lock = lock(&tree.broker_view(paths, etc), &[])?;
    tracing::debug!(
        fill_ms = filled.as_millis() as u64,
        lock_ms = (t0.elapsed() - filled).as_millis() as u64,
        "resident tree"
    );
    lock.held = Some(held);
    Ok(lock)
}

impl ResidentLock {
    /// Where the germline's root binds its paths from.
    pub fn source(&self) -> Option<TreeSource> {
        self.held.as_ref().map(|h| h.tree.source())
    }

    /// Fails if the files are no longer locked (their locker is gone): a germline does not
    /// fork from a root that is not resident any more.
    pub fn check(&self) -> Result<(), ExecutorError> {
        match &self.locker {
            Some(l) if !l.alive() && !LOCKER_CHECK_OFF_FOR_TESTS.load(std::sync::atomic::Ordering::SeqCst) => {
                Err(ExecutorError::Sandbox(
                    "resident root: its files are no longer locked in memory (the process holding the locks is gone)"
                        .into(),
                ))
            }
            _ => Ok(()),
        }
    }
}

/// Maps and locks every regular file under `paths` (links not followed, `masks` skipped)
/// and the host `/etc` entries the root binds. Fails, naming the cause, if one cannot be
/// locked or the whole exceeds [`MAX_RESIDENT_BYTES`]: a germline never starts with a root
/// that is only partly resident.
pub fn lock(paths: &ResidentPaths, etc: &[&str]) -> Result<ResidentLock, ExecutorError> {
    raise_memlock_limit();
    let files = files(paths, etc)?;
    let bytes: u64 = files.iter().map(|(_, m)| m.len()).sum();
    if bytes > MAX_RESIDENT_BYTES {
        return Err(ExecutorError::Sandbox(format!(
            "resident root: its {} files hold {} MiB, more than the {} MiB a germline's root may lock",
            files.len(),
            bytes >> 20,
            MAX_RESIDENT_BYTES >> 20
        )));
    }
    let files: Vec<(PathBuf, usize)> =
        files.into_iter().filter(|(_, m)| m.len() > 0).map(|(p, m)| (p, m.len() as usize)).collect();
    Ok(ResidentLock { locker: Some(Locker::start(&files)?), bytes, held: None })
}

/// The process that holds one germline's locked mappings. Forked from the broker, it maps
/// and locks every file, reports, and waits until its hold pipe is closed (the lock's
/// drop, or the broker's end) to exit, which unlocks them. The mappings are kept out of
/// the broker's own address space because every set-up helper of a copy shares that
/// address space (`clone(CLONE_VM)`), and the kernel walks all of its mappings when a
/// helper exits (`acct_collect`): with a resident root's ~7,000 files, 0.85 ms per helper.
struct Locker {
    pid: i32,
    /// The locker's pidfd: readable once it has exited.
    pidfd: std::os::fd::OwnedFd,
    /// The write end of its hold pipe.
    _hold: std::os::fd::OwnedFd,
}

/// What a locker reports: the index of the file it failed on (`u32::MAX`: none), the step
/// (0 open, 1 map, 2 lock) and the error.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct LockReport {
    index: u32,
    step: u32,
    errno: i32,
}

impl Locker {
    fn start(files: &[(PathBuf, usize)]) -> Result<Locker, ExecutorError> {
        use std::os::fd::{FromRawFd, OwnedFd};
        // The tree's files are named through a descriptor of the broker's
        // (`/proc/self/fd/N/...`), which the locker closes: it names the broker's.
        let own = PathBuf::from(format!("/proc/{}", std::process::id()));
        let paths: Vec<std::ffi::CString> = files
            .iter()
            .map(|(p, _)| match p.strip_prefix("/proc/self") {
                Ok(rest) => cstr(&own.join(rest)),
                Err(_) => cstr(p),
            })
            .collect::<std::io::Result<_>>()
            .map_err(ExecutorError::io("resident root: a path"))?;
        let lens: Vec<usize> = files.iter().map(|(_, l)| *l).collect();
        let pipe = || -> Result<(OwnedFd, OwnedFd), ExecutorError> {
            let mut fds = [0; 2];
            // SAFETY: pipe2 fills two descriptors we then own.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return Err(ExecutorError::io("resident root: a pipe")(std::io::Error::last_os_error()));
            }
            // SAFETY: both were just made and are owned here only.
            Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
        };
        let (report_r, report_w) = pipe()?;
        let (hold_r, hold_w) = pipe()?;
        use std::os::fd::AsRawFd;
        let (rw, hr) = (report_w.as_raw_fd(), hold_r.as_raw_fd());
        // A raw clone with no exit signal and no fork handlers: the child makes only raw
        // syscalls on buffers prepared above (no allocation, no lock: the broker has other
        // threads) and ends with `_exit`; with no exit signal it is waited for only with
        // `__WALL`, so no other wait in the broker can reap it and leave its pid to be reused.
        // SAFETY: as above; a null stack makes the child run on a copy of this one, as fork.
        let pid = unsafe { libc::syscall(libc::SYS_clone, 0 as libc::c_ulong, 0usize, 0usize, 0usize, 0usize) } as i32;
        if pid < 0 {
            return Err(ExecutorError::io("resident root: forking its locker")(std::io::Error::last_os_error()));
        }
        if pid == 0 {
            // SAFETY: see above; never returns.
            unsafe { locker_main(&paths, &lens, rw, hr) }
        }
        drop(report_w);
        drop(hold_r);
        // SAFETY: a pidfd of our own child, which no one has waited for yet.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        let mut report = LockReport::default();
        let size = std::mem::size_of::<LockReport>();
        // SAFETY: reads at most `size` bytes into `report`.
        let n = loop {
            let n = unsafe { libc::read(report_r.as_raw_fd(), (&mut report as *mut LockReport).cast(), size) };
            if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break n;
            }
        };
        let outcome = if pidfd < 0 {
            Err(format!("resident root: watching its locker: {}", std::io::Error::last_os_error()))
        } else if n != size as isize {
            Err("resident root: its locker died before it locked the files".into())
        } else if report.index != u32::MAX {
            let i = report.index as usize;
            let (p, len) = files.get(i).map(|(p, l)| (p.display().to_string(), *l)).unwrap_or_default();
            let e = std::io::Error::from_raw_os_error(report.errno);
            Err(match report.step {
                0 => format!("resident root: opening {p}: {e}"),
                1 => format!("resident root: mapping {p}: {e}"),
                _ => format!(
                    "resident root: locking {p} ({} KiB) in memory failed: {e} (RLIMIT_MEMLOCK is {}; the broker \
                     needs CAP_IPC_LOCK or a limit above the root's size)",
                    len >> 10,
                    memlock_limit()
                ),
            })
        } else {
            Ok(())
        };
        if let Err(why) = outcome {
            drop(hold_w);
            if pidfd >= 0 {
                // SAFETY: closes the pidfd opened above, owned here only.
                unsafe { libc::close(pidfd) };
            }
            reap(pid);
            return Err(ExecutorError::Sandbox(why));
        }
        // SAFETY: a pidfd just opened and owned here only.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        Ok(Locker { pid, pidfd, _hold: hold_w })
    }

    /// Whether the locker still holds the files.
    fn alive(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd { fd: self.pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: polls one descriptor we own, without waiting.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 0
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        // Its hold pipe closes with this value; it unlocks and exits, reaped off the caller's
        // path (its exit unmaps everything it locked).
        let pid = self.pid;
        crate::workers::run(move || reap(pid));
    }
}

fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waits for our own child.
    while unsafe { libc::waitpid(pid, &mut status, libc::__WALL) } < 0
        && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
    {}
}

/// The locker's life ([`Locker`]): every descriptor but its two pipe ends closed, every
/// signal blocked; each file opened, mapped whole and locked; the report written; then a
/// read of the hold pipe until it ends.
///
/// # Safety
/// Called in the child of a fork only; raw syscalls on buffers prepared before it.
unsafe fn locker_main(paths: &[std::ffi::CString], lens: &[usize], report: i32, hold: i32) -> ! {
    use libc::*;
    let (lo, hi) = (report.min(hold) as c_uint, report.max(hold) as c_uint);
    if lo > 0 {
        syscall(SYS_close_range, 0, lo - 1, 0);
    }
    if hi > lo + 1 {
        syscall(SYS_close_range, lo + 1, hi - 1, 0);
    }
    syscall(SYS_close_range, hi + 1, c_uint::MAX, 0);
    let mut all: sigset_t = std::mem::zeroed();
    sigfillset(&mut all);
    sigprocmask(SIG_SETMASK, &all, std::ptr::null_mut());
    let send = |r: LockReport| {
        write(report, (&r as *const LockReport).cast(), std::mem::size_of::<LockReport>());
    };
    for (i, (p, &len)) in paths.iter().zip(lens).enumerate() {
        let fd = open(p.as_ptr(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if fd < 0 {
            send(LockReport { index: i as u32, step: 0, errno: *__errno_location() });
            _exit(1);
        }
        let addr = mmap(std::ptr::null_mut(), len, PROT_READ, MAP_SHARED, fd, 0);
        let err = *__errno_location();
        close(fd);
        if addr == MAP_FAILED {
            send(LockReport { index: i as u32, step: 1, errno: err });
            _exit(1);
        }
        if mlock(addr, len) != 0 {
            send(LockReport { index: i as u32, step: 2, errno: *__errno_location() });
            _exit(1);
        }
    }
    send(LockReport { index: u32::MAX, step: 0, errno: 0 });
    let mut b = 0u8;
    loop {
        let n = read(hold, (&mut b as *mut u8).cast(), 1);
        if n == 0 || (n < 0 && *__errno_location() != EINTR) {
            _exit(0);
        }
    }
}

/// The soft RLIMIT_MEMLOCK, for messages.
fn memlock_limit() -> String {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    if limit.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".to_owned()
    } else {
        format!("{} KiB", limit.rlim_cur >> 10)
    }
}

/// Whether this process can make a resident root of `bytes` (`Ok`) or why not (`Err`): it
/// needs CAP_SYS_ADMIN to mount the in-memory tree ([`Tree`]) and, to lock it, CAP_IPC_LOCK
/// (which lifts every limit) or a hard RLIMIT_MEMLOCK of at least `bytes`.
pub fn lock_capacity(bytes: u64) -> Result<String, String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_IPC_LOCK: u32 = 14;
    const CAP_SYS_ADMIN: u32 = 21;
    if cap_eff & (1 << CAP_SYS_ADMIN) == 0 {
        return Err("no CAP_SYS_ADMIN: the resident root's in-memory tree cannot be mounted, so a policy with \
                    [sandbox] resident_root = true is refused"
            .into());
    }
    if cap_eff & (1 << CAP_IPC_LOCK) != 0 {
        return Ok("CAP_SYS_ADMIN and CAP_IPC_LOCK: the broker can mount and lock a resident root".into());
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    if limit.rlim_max == libc::RLIM_INFINITY || limit.rlim_max >= bytes {
        Ok(format!(
            "CAP_SYS_ADMIN, and RLIMIT_MEMLOCK allows {} MiB: the broker can mount and lock a resident root",
            limit.rlim_max >> 20
        ))
    } else {
        Err(format!(
            "RLIMIT_MEMLOCK is {} KiB and there is no CAP_IPC_LOCK: a resident root (about {} MiB) cannot be locked, so \
             a policy with [sandbox] resident_root = true is refused",
            limit.rlim_max >> 10,
            bytes >> 20
        ))
    }
}

/// Raises the soft RLIMIT_MEMLOCK to the hard one (which only CAP_IPC_LOCK lifts further).
fn raise_memlock_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit);
        }
    }
}

/// How many of the pages of file `p` are in memory, of how many (`mincore`, broker side).
pub fn resident_pages(p: &Path) -> Result<(usize, usize), ExecutorError> {
    let f = std::fs::File::open(p).map_err(ExecutorError::io(format!("opening {}", p.display())))?;
    let len = f.metadata().map_err(ExecutorError::io("metadata"))?.len() as usize;
    if len == 0 {
        return Ok((0, 0));
    }
    let map = Locked::map(&f, len).map_err(ExecutorError::io("mmap"))?;
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: `vec` holds one byte per page of the mapping.
    if unsafe { libc::mincore(map.addr as *mut libc::c_void, len, vec.as_mut_ptr()) } != 0 {
        return Err(ExecutorError::io("mincore")(std::io::Error::last_os_error()));
    }
    Ok((vec.iter().filter(|b| **b & 1 == 1).count(), vec.len()))
}

/// Where a germline's root binds its resident paths from: the broker's in-memory tree
/// ([`Tree`]), as the germline's set-up sees it.
#[derive(Clone, Debug)]
pub struct TreeSource {
    /// The mount namespace the tree is mounted in; the germline's set-up enters it before
    /// it makes its own, so its root can bind from the tree.
    pub namespace: std::os::fd::RawFd,
    /// Where the tree is mounted in that namespace; host path `/p` is at `<mountpoint>/p`.
    pub mountpoint: PathBuf,
}

impl TreeSource {
    /// Where host path `p` is in the tree, in the tree's namespace.
    pub fn source_of(&self, p: &Path) -> PathBuf {
        self.mountpoint.join(p.strip_prefix("/").unwrap_or(p))
    }
}

/// Devices no tree this process makes may have: every device its shared tree (the one
/// calls are made on, [`Tree::get`]) has had, and the device of the call's tree an opening
/// records ([`avoid_device`]). The kernel gives a
/// new tmpfs the lowest free device number, so a tree made after the call's tree went away
/// (a third party's `germline verify` on a like machine, or a host's replay after its
/// germline restarted) would often get the call's device, and a request carrying it would
/// replay as it ran there but not at a replay made while the call's tree was live.
static AVOIDED_DEVICES: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// Most devices [`AVOIDED_DEVICES`] keeps (the oldest are forgotten first).
const MAX_AVOIDED_DEVICES: usize = 256;

/// Test-only switch ("mechanism off"): a tree takes the device the kernel gives it.
pub static AVOID_DEVICES_OFF_FOR_TESTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes `dev` a device no tree this process makes from now on has: the device of the
/// call's tree, as the opening records it, before a replay's germline is started.
pub fn avoid_device(dev: u64) {
    let mut avoided = AVOIDED_DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    if !avoided.contains(&dev) {
        if avoided.len() >= MAX_AVOIDED_DEVICES {
            avoided.remove(0);
        }
        avoided.push(dev);
    }
}

/// Whether a tree may have device `dev` (not one of [`AVOIDED_DEVICES`]).
fn device_allowed(dev: u64) -> bool {
    AVOID_DEVICES_OFF_FOR_TESTS.load(std::sync::atomic::Ordering::SeqCst)
        || !AVOIDED_DEVICES.lock().unwrap_or_else(|p| p.into_inner()).contains(&dev)
}

/// Most inode numbers [`burn_inode_numbers`] skips.
const INODE_BURN: u32 = 1 << 12;

/// Test-only switch ("mechanism off"): a new tree numbers its inodes from 1, as a tmpfs does.
pub static INODE_BURN_OFF_FOR_TESTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Skips a random number (below [`INODE_BURN`]) of the inode numbers of the new tmpfs at
/// `dir`, which numbers its inodes in order from 1: two trees filled alike (the call's and
/// its replay's, or a third party's) would otherwise give their files the same numbers
/// whenever as many files went in before them, and a copy reads them (`stat`).
fn burn_inode_numbers(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if INODE_BURN_OFF_FOR_TESTS.load(std::sync::atomic::Ordering::SeqCst) {
        return Ok(());
    }
    let mut n = [0u8; 4];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(e.to_string()))?;
    for _ in 0..u32::from_ne_bytes(n) % INODE_BURN {
        // An unnamed file takes an inode number and gives none back when it is closed.
        std::fs::OpenOptions::new().read(true).write(true).mode(0o600).custom_flags(libc::O_TMPFILE).open(dir)?;
    }
    Ok(())
}

/// What a file of the tree was copied from, to notice a host file that changed since.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The broker's in-memory copy of the resident roots' files: a tmpfs, mounted in a private
/// mount namespace of its own (never in the host's), holding each bound host path at the
/// same path beneath it, with the host's modes, owners and times.
///
/// Why. A resident root's files are locked in memory, but a directory bound from the host
/// is still the host file system's: a copy that looks up a name it lacks leaves a negative
/// dentry there, which outlasts the copy, and any later copy can time the same lookup
/// (SECURITY.md, "Resident root"). Symbolic links and directory blocks are cached the same
/// way. A tmpfs keeps nothing of a failed lookup (its dentries are deleted with their last
/// reference), and every directory, link and inode it holds lives in memory for as long as
/// the tmpfs does, so a lookup, found or not, leaves the tree as it was. The root then binds
/// its read-only paths from the tree, and nothing a copy can look a name up in is on a host
/// file system: the root's own directories are its tmpfs, views and scratch are per copy.
///
/// One tree per broker, shared by every germline with a resident root (each file copied
/// once), dropped with the last of them. A host file that changed since it was copied is
/// copied again, into a new inode, when the next germline starts (running germlines keep
/// the one they mapped). What no live germline holds any more is removed ([`Tree::release`]):
/// a long-running broker's tree holds what its germlines bind, not every release it ever ran.
pub struct Tree {
    namespace: std::os::fd::OwnedFd,
    dir: std::os::fd::OwnedFd,
    mountpoint: PathBuf,
    state: Mutex<TreeState>,
    /// The mountpoint's host directory, open with an exclusive `flock` while the tree
    /// lives: a sweep ([`remove_stale_mountpoints`]) leaves it alone.
    _held: std::fs::File,
}

/// What the tree holds, under one lock: filling and removing never overlap.
#[derive(Default)]
struct TreeState {
    /// Each regular file copied, by host path, and what it was copied from.
    copied: HashMap<PathBuf, Stamp>,
    /// Each root path a germline's root binds ([`make`]), by how many live germlines hold
    /// it; 0: in the tree, held by none, removed at the next [`Tree::release`] that finds no
    /// held path at, above or below it.
    holds: HashMap<PathBuf, usize>,
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tree({})", self.mountpoint.display())
    }
}

static TREE: Mutex<Weak<Tree>> = Mutex::new(Weak::new());

impl Tree {
    /// The broker's tree, made on first use (it needs CAP_SYS_ADMIN: mount namespaces of
    /// the host's user namespace).
    pub fn get() -> Result<Arc<Tree>, ExecutorError> {
        let mut slot = TREE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = slot.upgrade() {
            return Ok(t);
        }
        let t = Arc::new(Tree::make()?);
        // The tree calls are made on: no replay's tree of this process gets its device, even
        // once it is gone.
        avoid_device(t.device()?);
        *slot = Arc::downgrade(&t);
        Ok(t)
    }

    /// The tree while a germline holds it (tests).
    pub fn current() -> Option<Arc<Tree>> {
        TREE.lock().unwrap_or_else(|p| p.into_inner()).upgrade()
    }

    fn make() -> Result<Tree, ExecutorError> {
        use std::os::fd::OwnedFd;
        use std::os::unix::fs::DirBuilderExt;
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // An empty directory on the host, the tmpfs mounted over it in the tree's namespace
        // only; removed when the tree is dropped. A broker killed first leaves its directory
        // behind, and pids are reused: the name has a random part, and directories of brokers
        // that are gone are removed here.
        remove_stale_mountpoints();
        let mut tag = [0u8; 8];
        getrandom::fill(&mut tag).map_err(|e| ExecutorError::Sandbox(format!("resident root: randomness: {e}")))?;
        let name = format!("{}-{n}-{:016x}", std::process::id(), u64::from_ne_bytes(tag));
        let mountpoint = std::env::temp_dir().join(format!("{MOUNTPOINT}{name}"));
        // Made under a name no sweep takes while live, held, then named.
        let new = std::env::temp_dir().join(format!("{MOUNTPOINT_NEW}{name}"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&new)
            .map_err(ExecutorError::io(format!("resident root: creating {}", new.display())))?;
        let held = std::fs::File::open(&new)
            .and_then(|d| d.lock().map(|()| d))
            .and_then(|d| std::fs::rename(&new, &mountpoint).map(|()| d))
            .map_err(|e| {
                let _ = std::fs::remove_dir(&new);
                ExecutorError::Sandbox(format!("resident root: holding {}: {e}", mountpoint.display()))
            })?;
        let at = cstr(&mountpoint).map_err(ExecutorError::io("resident root: the tree's path"))?;
        // A thread of its own enters the new mount namespace (unsharing it unshares only
        // the calling thread's), mounts the tmpfs, opens both and ends; the descriptors keep
        // the namespace, and so the mount, alive.
        let made = std::thread::spawn(move || -> std::io::Result<(OwnedFd, OwnedFd)> {
            use libc::*;
            let ck = |rc: c_int| if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) };
            // SAFETY: unshare/mount on constant or prepared NUL-terminated strings.
            unsafe {
                ck(unshare(CLONE_NEWNS))?;
                ck(mount(std::ptr::null(), c"/".as_ptr(), std::ptr::null(), MS_REC | MS_PRIVATE, std::ptr::null()))?;
            }
            let path = at.to_str().map_err(std::io::Error::other)?;
            // A tmpfs whose device is avoided stays mounted beneath the next, holding its
            // device, so the next gets another; all go with the namespace. Each holds a
            // device of its own, so one more mount than there are devices to avoid has one
            // that is not.
            let most = AVOIDED_DEVICES.lock().unwrap_or_else(|p| p.into_inner()).len() + 1;
            let mut mounts = 0;
            loop {
                // SAFETY: mount on constant or prepared NUL-terminated strings.
                ck(unsafe {
                    mount(
                        c"germline-tree".as_ptr(),
                        at.as_ptr(),
                        c"tmpfs".as_ptr(),
                        MS_NOSUID | MS_NODEV | MS_NOATIME,
                        c"mode=0755".as_ptr().cast(),
                    )
                })?;
                mounts += 1;
                let dev = std::fs::metadata(path)?.dev();
                if device_allowed(dev) {
                    break;
                }
                if mounts >= most {
                    return Err(std::io::Error::other(format!(
                        "{mounts} tmpfs mounts in a row got devices a replay must not have (the call's, or an \
                         earlier tree's)"
                    )));
                }
            }
            burn_inode_numbers(Path::new(path))?;
            let dir = std::fs::File::open(path)?;
            let ns = std::fs::File::open("/proc/thread-self/ns/mnt")?;
            Ok((ns.into(), dir.into()))
        })
        .join()
        .map_err(|_| ExecutorError::internal("the resident tree's set-up thread panicked"))?;
        match made {
            Ok((namespace, dir)) => Ok(Tree { namespace, dir, mountpoint, state: Mutex::default(), _held: held }),
            Err(e) => {
                let _ = std::fs::remove_dir(&mountpoint);
                Err(ExecutorError::Sandbox(format!(
                    "resident root: mounting its in-memory tree failed: {e} (the broker needs CAP_SYS_ADMIN, that is \
                     to run as root, for a resident root)"
                )))
            }
        }
    }

    /// The tree's device (`st_dev` of every file in it).
    pub fn device(&self) -> Result<u64, ExecutorError> {
        let f = std::fs::File::open(self.here(Path::new("/")))
            .map_err(ExecutorError::io("resident root: opening the tree"))?;
        Ok(f.metadata().map_err(ExecutorError::io("resident root: the tree's device"))?.dev())
    }

    /// How the germline's set-up finds the tree.
    pub fn source(&self) -> TreeSource {
        use std::os::fd::AsRawFd;
        TreeSource { namespace: self.namespace.as_raw_fd(), mountpoint: self.mountpoint.clone() }
    }

    /// Where host path `p` is in the tree, as the broker reaches it (through its descriptor
    /// of the tree; the broker is not in the tree's namespace).
    pub fn here(&self, p: &Path) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_raw_fd())).join(p.strip_prefix("/").unwrap_or(p))
    }

    /// `paths` as the broker reaches them in the tree: what [`lock`] and tests walk. `etc`
    /// entries present on the host are read-only paths of it.
    pub fn broker_view(&self, paths: &ResidentPaths, etc: &[&str]) -> ResidentPaths {
        let etc = etc.iter().map(PathBuf::from).filter(|p| std::fs::symlink_metadata(p).is_ok());
        ResidentPaths {
            read_only: paths.read_only.iter().cloned().chain(etc).map(|p| self.here(&p)).collect(),
            masks: paths.masks.iter().map(|p| self.here(p)).collect(),
        }
    }

    /// Copies into the tree every path of `paths` and every `etc` entry present: links as
    /// links, regular files with their contents, directories whole (less `masks`, which are
    /// left empty), each with the host's mode, owner and times. What is already there and
    /// unchanged on the host is not copied again. Devices, sockets and FIFOs are left out.
    pub fn fill(&self, paths: &ResidentPaths, etc: &[&str]) -> Result<(), ExecutorError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let copied = &mut state.copied;
        let (mut seen, mut bytes) = (0usize, 0u64);
        let etc = etc.iter().map(PathBuf::from).filter(|p| std::fs::symlink_metadata(p).is_ok());
        for p in paths.read_only.iter().cloned().chain(etc) {
            let err =
                |e: std::io::Error| ExecutorError::Sandbox(format!("resident root: copying {}: {e}", p.display()));
            for a in p.ancestors().collect::<Vec<_>>().into_iter().rev().skip(1) {
                if a == p {
                    break;
                }
                let here = self.here(a);
                if std::fs::symlink_metadata(&here).is_err() {
                    std::fs::create_dir(&here).map_err(err)?;
                }
            }
            let meta = std::fs::symlink_metadata(&p).map_err(err)?;
            let mut dirs = Vec::new();
            let mut stack = vec![(p.clone(), meta)];
            while let Some((at, meta)) = stack.pop() {
                seen += 1;
                if seen > MAX_FILES {
                    return Err(ExecutorError::Sandbox(format!(
                        "resident root: more than {MAX_FILES} files under {}",
                        p.display()
                    )));
                }
                let err = |e: std::io::Error| {
                    ExecutorError::Sandbox(format!("resident root: copying {} into memory: {e}", at.display()))
                };
                let here = self.here(&at);
                let kind = meta.file_type();
                if kind.is_symlink() {
                    let target = std::fs::read_link(&at).map_err(err)?;
                    if std::fs::read_link(&here).ok().as_ref() != Some(&target) {
                        let _ = std::fs::remove_file(&here);
                        std::os::unix::fs::symlink(&target, &here).map_err(err)?;
                    }
                } else if kind.is_file() {
                    // The cap [`lock`] applies, before anything is copied into memory.
                    bytes += meta.len();
                    if bytes > MAX_RESIDENT_BYTES {
                        return Err(ExecutorError::Sandbox(format!(
                            "resident root: its files hold more than the {} MiB a germline's root may lock",
                            MAX_RESIDENT_BYTES >> 20
                        )));
                    }
                    let stamp = Stamp::of(&meta);
                    if copied.get(&at) != Some(&stamp) || std::fs::symlink_metadata(&here).is_err() {
                        self.copy_file(&at, &here, &meta).map_err(err)?;
                        copied.insert(at.clone(), stamp);
                    }
                } else if kind.is_dir() {
                    match std::fs::symlink_metadata(&here) {
                        Ok(m) if m.is_dir() => {}
                        _ => std::fs::create_dir(&here).map_err(err)?,
                    }
                    dirs.push((at.clone(), meta));
                    if paths.masks.iter().any(|m| m == &at) {
                        continue;
                    }
                    // Made in name order (popped from the stack in reverse of the push),
                    // whatever order the host's file system lists them in: a directory in
                    // the tree lists, and numbers, its entries alike on every host. Off
                    // (`GERMLINE_TEST_TREE_HOST_ORDER=1`, debug builds): the host's order.
                    let mut entries = std::fs::read_dir(&at)
                        .map_err(err)?
                        .map(|e| e.map(|e| e.path()))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(err)?;
                    if !crate::test_switch("GERMLINE_TEST_TREE_HOST_ORDER") {
                        entries.sort();
                    }
                    for path in entries.into_iter().rev() {
                        let m = std::fs::symlink_metadata(&path).map_err(err)?;
                        stack.push((path, m));
                    }
                }
            }
            // Modes, owners and times of the directories last, deepest first (filling one
            // changes its times), and only where they differ from the host's: setting them
            // gives the directory a new ctime, which every copy binding it can read, and a
            // ctime taken while a copy runs tells when that was, and may carry the host's
            // timestamp floor (`crate::outside::ScratchKind`). A directory this fill left
            // alone keeps the ctime it had.
            for (at, meta) in dirs.iter().rev() {
                let here = self.here(at);
                let err = |e: std::io::Error| {
                    ExecutorError::Sandbox(format!("resident root: copying {} into memory: {e}", at.display()))
                };
                let restamp = RESTAMP_TREE_FOR_TESTS.load(std::sync::atomic::Ordering::SeqCst);
                if restamp || !same_attributes(&std::fs::symlink_metadata(&here).map_err(err)?, meta) {
                    set_attributes(&here, meta).map_err(err)?;
                }
            }
        }
        Ok(())
    }

    /// Counts one more germline holding each of `roots` (before it fills them).
    fn hold(&self, roots: &[PathBuf]) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for r in roots {
            *state.holds.entry(r.clone()).or_default() += 1;
        }
    }

    /// One germline fewer holds each of `roots`. Then every root no germline holds, with no
    /// held root at, above or below it, is removed from the tree with what was copied under
    /// it. Germlines that bound it are gone; a germline that binds it again copies it again.
    fn release(&self, roots: &[PathBuf]) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for r in roots {
            if let Some(n) = state.holds.get_mut(r) {
                *n = n.saturating_sub(1);
            }
        }
        let held: Vec<PathBuf> = state.holds.iter().filter(|(_, &n)| n > 0).map(|(p, _)| p.clone()).collect();
        let orphans: Vec<PathBuf> = state
            .holds
            .iter()
            .filter(|(p, &n)| n == 0 && !held.iter().any(|h| h.starts_with(p) || p.starts_with(h)))
            .map(|(p, _)| p.clone())
            .collect();
        for r in orphans {
            let here = self.here(&r);
            let gone = match std::fs::symlink_metadata(&here) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&here),
                Ok(_) => std::fs::remove_file(&here),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            };
            match gone {
                Ok(()) => {
                    state.holds.remove(&r);
                    state.copied.retain(|p, _| !p.starts_with(&r));
                }
                // Kept as held by none: the next release tries again.
                Err(e) => tracing::warn!(path = %r.display(), "resident tree: removing what no germline holds: {e}"),
            }
        }
    }

    /// Copies regular file `from` to `to` in the tree: written under a name of the tree's
    /// own (bound nowhere), then renamed into place, so a germline that already binds the
    /// directory never sees a partial file.
    fn copy_file(&self, from: &Path, to: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
        let mut src =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(from)?;
        let staging = self.here(Path::new("/.incoming"));
        let mut dst = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&staging)?;
        std::io::copy(&mut src, &mut dst)?;
        drop(dst);
        set_attributes(&staging, meta)?;
        std::fs::rename(&staging, to)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        // The namespace and its mount go with the descriptors (once no germline's root
        // binds from the tree); the host directory is empty.
        let _ = std::fs::remove_dir(&self.mountpoint);
    }
}

/// Prefix of a tree's mountpoint directory (in the temporary directory).
const MOUNTPOINT: &str = "germline-tree-";
/// Prefix of one made but not yet held and named (for microseconds).
const MOUNTPOINT_NEW: &str = ".germline-tree-new-";

/// Removes the (empty) mountpoint directories of trees whose broker is gone, which a
/// broker that was killed leaves behind: those no process holds (a tree holds its own
/// with a lock, which goes with its process, in whatever pid namespace it ran) and
/// unnamed ones older than a minute.
fn remove_stale_mountpoints() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let stale = if name.starts_with(MOUNTPOINT) {
            std::fs::File::open(e.path()).is_ok_and(|d| d.try_lock().is_ok())
        } else if name.starts_with(MOUNTPOINT_NEW) {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|a| a > std::time::Duration::from_secs(60)))
        } else {
            false
        };
        if stale {
            // Only an empty directory: anything else is not a mountpoint this left.
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// The mode a file of the tree gets from the host's `meta`: the host's, but a regular file
/// loses group and other write permission. The tree is bound read-only, so those bits
/// grant nothing, but with them a copy's `open(O_WRONLY)` passes the permission check and
/// reaches the kernel's write-access check, which fails ETXTBSY while any copy of any
/// germline executes that inode and only then EROFS: one bit between live copies (a local
/// release keeps its host modes). Without them it fails EACCES either way.
fn tree_mode(meta: &std::fs::Metadata) -> u32 {
    let mode = meta.mode() & 0o7777;
    if meta.is_file() {
        mode & !0o022
    } else {
        mode
    }
}

/// Test-only switch ("mechanism off"): every fill sets the attributes of every directory
/// of its paths again, as before, giving each a new ctime. Never set outside tests.
pub static RESTAMP_TREE_FOR_TESTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a file of the tree (`ours`) has the owner, mode and modification time
/// [`set_attributes`] would give it from `host`.
fn same_attributes(ours: &std::fs::Metadata, host: &std::fs::Metadata) -> bool {
    // Not the access time: the broker's own reads of the host directory move it (relatime).
    (ours.uid(), ours.gid(), ours.mode() & 0o7777) == (host.uid(), host.gid(), tree_mode(host))
        && (ours.mtime(), ours.mtime_nsec()) == (host.mtime(), host.mtime_nsec())
}

/// The host's owner, mode (with its special bits) and times of `meta` on `p` in the tree,
/// less group and other write permission on a regular file ([`tree_mode`]).
fn set_attributes(p: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::lchown(p, Some(meta.uid()), Some(meta.gid()))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(tree_mode(meta)))?;
    let c = cstr(p)?;
    let times = [
        libc::timespec { tv_sec: meta.atime(), tv_nsec: meta.atime_nsec() },
        libc::timespec { tv_sec: meta.mtime(), tv_nsec: meta.mtime_nsec() },
    ];
    // SAFETY: utimensat on a NUL-terminated path and two timespecs.
    if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn cstr(p: &Path) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_chain_names_every_link_then_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().canonicalize().unwrap();
        std::fs::create_dir(d.join("real")).unwrap();
        std::fs::write(d.join("real/lib.so.1.2"), b"x").unwrap();
        std::os::unix::fs::symlink("real", d.join("dirlink")).unwrap();
        std::os::unix::fs::symlink("lib.so.1.2", d.join("real/lib.so.1")).unwrap();
        let got = chain(&d.join("dirlink/lib.so.1")).unwrap();
        assert_eq!(got, vec![d.join("dirlink"), d.join("real/lib.so.1"), d.join("real/lib.so.1.2")]);
        assert_eq!(chain(&d.join("real/../real/lib.so.1.2")).unwrap(), vec![d.join("real/lib.so.1.2")]);
    }

    /// A temporary directory (and its canonical path) for a test of the tree, or `None` where
    /// the test cannot mount one (not root: it needs CAP_SYS_ADMIN; CI runs as root).
    fn tree_test_dir() -> Option<(tempfile::TempDir, PathBuf)> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting the tree needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().canonicalize().unwrap();
        Some((dir, d))
    }

    /// The tree copies a bound directory whole (less its masks), links as links, with the
    /// host's modes and times, onto tmpfs; a host file that changed is copied again. Needs
    /// CAP_SYS_ADMIN (CI runs as root).
    #[test]
    fn the_tree_holds_each_path_in_memory_with_the_hosts_attributes() {
        use std::os::unix::fs::PermissionsExt;
        let Some((_dir, d)) = tree_test_dir() else { return };
        let pkg = d.join("pkg");
        std::fs::create_dir_all(pkg.join("sub")).unwrap();
        std::fs::create_dir_all(pkg.join("test")).unwrap();
        std::fs::write(pkg.join("a.py"), b"print(1)\n").unwrap();
        std::fs::set_permissions(pkg.join("a.py"), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::write(pkg.join("run"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(pkg.join("run"), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(pkg.join("sub/b.txt"), b"b").unwrap();
        std::fs::write(pkg.join("test/hidden.py"), b"x").unwrap();
        std::os::unix::fs::symlink("a.py", pkg.join("l")).unwrap();
        let paths = ResidentPaths { read_only: vec![pkg.clone()], masks: vec![pkg.join("test")] };
        let tree = Tree::get().unwrap();
        tree.fill(&paths, &[]).unwrap();
        let here = |p: &str| tree.here(&pkg.join(p));
        assert_eq!(std::fs::read(here("a.py")).unwrap(), b"print(1)\n");
        assert_eq!(std::fs::read(here("sub/b.txt")).unwrap(), b"b");
        assert_eq!(std::fs::read_link(here("l")).unwrap(), Path::new("a.py"));
        assert_eq!(
            std::fs::metadata(here("run")).unwrap().mode() & 0o7777,
            0o755,
            "no group or other write bit: a copy's open for writing fails EACCES, never ETXTBSY"
        );
        assert_eq!(std::fs::read_dir(here("test")).unwrap().count(), 0, "a masked directory is left empty");
        let (host, copy) = (std::fs::metadata(pkg.join("a.py")).unwrap(), std::fs::metadata(here("a.py")).unwrap());
        assert_eq!(
            (copy.mode(), copy.uid(), copy.mtime(), copy.mtime_nsec()),
            (host.mode(), host.uid(), host.mtime(), host.mtime_nsec())
        );
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        let c = cstr(&here("sub")).unwrap();
        // SAFETY: statfs fills the struct.
        assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut fs) }, 0);
        assert_eq!(fs.f_type, libc::TMPFS_MAGIC, "the tree is a tmpfs");
        // A fill that finds nothing changed touches no directory: every copy binding one
        // reads its ctime, which would otherwise tell when the last germline started.
        let ctime = |p: &str| {
            let m = std::fs::symlink_metadata(here(p)).unwrap();
            (m.ctime(), m.ctime_nsec())
        };
        let (pkg_ctime, sub_ctime) = (ctime(""), ctime("sub"));
        std::thread::sleep(std::time::Duration::from_millis(20));
        tree.fill(&paths, &[]).unwrap();
        assert_eq!((ctime(""), ctime("sub")), (pkg_ctime, sub_ctime), "an unchanged fill restamps nothing");
        // What the check avoids (mechanism off): setting the same attributes again.
        set_attributes(&here("sub"), &std::fs::symlink_metadata(pkg.join("sub")).unwrap()).unwrap();
        assert_ne!(ctime("sub"), sub_ctime, "setting attributes gives a new ctime");
        let sub_ctime = ctime("sub");
        let before = copy.ino();
        std::fs::write(pkg.join("a.py"), b"print(2)\n").unwrap();
        tree.fill(&paths, &[]).unwrap();
        assert_eq!(std::fs::read(here("a.py")).unwrap(), b"print(2)\n", "a changed host file is copied again");
        assert_ne!(std::fs::metadata(here("a.py")).unwrap().ino(), before, "into a new inode");
        assert_eq!(ctime("sub"), sub_ctime, "a directory with nothing changed in it keeps its ctime");
    }

    /// Trees filled alike number their files apart (a random count of inode numbers skipped
    /// first); off, a new tmpfs numbers from 1, so they match. Their devices always differ.
    #[test]
    fn trees_filled_alike_number_their_files_apart() {
        use std::sync::atomic::Ordering::SeqCst;
        let Some((_dir, d)) = tree_test_dir() else { return };
        std::fs::create_dir_all(d.join("pkg")).unwrap();
        std::fs::write(d.join("pkg/a.py"), b"a").unwrap();
        let paths = ResidentPaths { read_only: vec![d.join("pkg")], masks: vec![] };
        let numbers = |burn: bool| {
            INODE_BURN_OFF_FOR_TESTS.store(!burn, SeqCst);
            // All three live at once, as the call's, the replay's and a third party's may.
            let trees: Vec<Tree> = (0..3).map(|_| Tree::make().unwrap()).collect();
            let got: Vec<(u64, u64)> = trees
                .iter()
                .map(|tree| {
                    tree.fill(&paths, &[]).unwrap();
                    let m = std::fs::metadata(tree.here(&d.join("pkg/a.py"))).unwrap();
                    (m.ino(), m.dev())
                })
                .collect();
            INODE_BURN_OFF_FOR_TESTS.store(false, SeqCst);
            got
        };
        let off = numbers(false);
        assert!(off.iter().all(|(ino, _)| *ino == off[0].0), "off: a new tmpfs numbers alike: {off:?}");
        let on = numbers(true);
        assert!(!on.iter().all(|(ino, _)| *ino == on[0].0), "on: three trees numbered alike: {on:?}");
        assert!(on.iter().all(|(_, dev)| on.iter().filter(|(_, d)| d == dev).count() == 1), "{on:?}");
    }

    /// A tree made after the call's is gone never gets the call's device, which the kernel
    /// gives the next tmpfs (the lowest free number); off, it does.
    #[test]
    fn a_tree_never_gets_a_device_to_avoid() {
        use std::sync::atomic::Ordering::SeqCst;
        let Some((_dir, _d)) = tree_test_dir() else { return };
        // Whether a tree made after one with device `dev` is dropped gets `dev`, in one of
        // 50 tries over a second (the kernel frees a device once the tmpfs is torn down,
        // and another test's mount may take the number in between).
        let reused = |off: bool| {
            let dev = Tree::make().unwrap().device().unwrap();
            avoid_device(dev);
            (0..50).any(|_| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                AVOID_DEVICES_OFF_FOR_TESTS.store(off, SeqCst);
                let next = Tree::make().map(|t| t.device().unwrap());
                AVOID_DEVICES_OFF_FOR_TESTS.store(false, SeqCst);
                next.unwrap() == dev
            })
        };
        assert!(reused(true), "off: a new tmpfs never took the device the last one freed");
        assert!(!reused(false), "on: a tree got a device it was to avoid");
    }

    /// A long-running broker's tree holds what its live germlines bind: what the last
    /// germline holding it drops is removed (a path under a held one stays until that goes).
    #[test]
    fn the_tree_keeps_only_what_live_germlines_hold() {
        let Some((_dir, d)) = tree_test_dir() else { return };
        for f in ["one/a.py", "two/b.py", "shared/s.py", "shared/inner/i.py"] {
            std::fs::create_dir_all(d.join(f).parent().unwrap()).unwrap();
            std::fs::write(d.join(f), f).unwrap();
        }
        let root = |ps: &[&str]| ResidentPaths { read_only: ps.iter().map(|p| d.join(p)).collect(), masks: vec![] };
        let one = make(&root(&["one", "shared"]), &[], false).unwrap();
        let two = make(&root(&["two", "shared"]), &[], false).unwrap();
        let inner = make(&root(&["shared/inner"]), &[], false).unwrap();
        let tree = Tree::current().expect("held by the germlines");
        let present = |f: &str| tree.here(&d.join(f)).exists();
        for f in ["one/a.py", "two/b.py", "shared/s.py", "shared/inner/i.py"] {
            assert!(present(f), "{f} is in the tree");
        }
        drop(one);
        assert!(!present("one"), "what only a dropped germline held is removed");
        assert!(present("two/b.py") && present("shared/s.py"), "what a live germline holds stays");
        drop(two);
        assert!(!present("two"));
        assert!(present("shared/inner/i.py") && present("shared/s.py"), "a held path keeps the root above it");
        let again = make(&root(&["one"]), &[], false).unwrap();
        assert!(present("one/a.py"), "bound again, copied again");
        drop(inner);
        assert!(!present("shared"), "with the path below it gone, the root above goes too");
        drop(again);
    }

    /// A killed broker leaves its tree's empty mountpoint behind; the next tree removes it,
    /// never one of a live pid.
    #[test]
    fn mountpoints_of_brokers_that_are_gone_are_removed() {
        let gone = std::env::temp_dir().join(format!("germline-tree-{}-998-00", std::process::id()));
        let live = std::env::temp_dir().join(format!("germline-tree-{}-999-00", std::process::id()));
        for d in [&gone, &live] {
            std::fs::create_dir_all(d).unwrap();
        }
        // Held as a live broker's tree holds it (another open file description).
        let held = std::fs::File::open(&live).unwrap();
        held.lock().unwrap();
        remove_stale_mountpoints();
        assert!(!gone.exists(), "no process holds it");
        assert!(live.exists(), "held, whatever pid it names");
        drop(held);
        remove_stale_mountpoints();
        assert!(!live.exists(), "its holder gone");
    }

    #[test]
    fn the_interpreter_of_this_process_needs_the_c_library() {
        let me = std::fs::canonicalize("/proc/self/exe").unwrap();
        let deps = elf_dependencies(&me).expect("an ELF object");
        assert!(deps.interpreter.is_some_and(|i| i.to_string_lossy().contains("ld-linux")), "PT_INTERP");
        assert!(deps.needed.iter().any(|n| n.starts_with("libc.so")), "{:?}", deps.needed);
        let libc = resolve("libc.so.6", Path::new("/"), &[]).expect("libc.so.6 is found");
        assert!(elf_dependencies(&libc).is_some());
    }
}
