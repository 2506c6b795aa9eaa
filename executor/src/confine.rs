//! The germline's irremovable sandbox, imposed by Rust before the interpreter starts
//! (DESIGN §5).
//!
//! Everything here runs in the child between `fork` and `execve` of the Python tool
//! host, so nothing the release does later can undo it: new user, mount, network, IPC,
//! UTS and cgroup namespaces; a fresh root file system holding only the read-only
//! allowlist, a minimal `/etc` of its own and an empty tmpfs at every data root (the
//! germline cannot even name user data, and nothing is ever created on the host), all of
//! it read-only; an unprivileged host uid and gid when the broker is host root; Landlock
//! (read-only, TCP only to the broker's fixed ports, signal and abstract-socket scoping);
//! a seccomp allowlist (with arguments) that leaves no inter-copy channel; no-new-privs; every capability dropped;
//! rlimits. Copies inherit all of it at fork.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
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
    /// Mechanisms on (the default) or off (tests only).
    pub switches: SandboxSwitches,
    /// The syscall filter (the allowlist unless a test turns it off).
    pub seccomp: SeccompPolicy,
    /// Absolute paths the manifest declares as scratch (`[release] scratch`): each is a link
    /// to a directory of the scratch ([`scratch_target`]), private to the germline while it
    /// imports and to each copy after.
    pub scratch_paths: Vec<PathBuf>,
    /// Directories beneath a read-only path that get an empty, read-only tmpfs over them
    /// (a resident root's, [`crate::resident::ResidentPaths::masks`]).
    pub masks: Vec<PathBuf>,
    /// A resident root's in-memory tree: the read-only paths and the host `/etc` entries
    /// are bound from it rather than from the host ([`crate::resident::Tree`]).
    pub tree: Option<crate::resident::TreeSource>,
    /// Read-only paths bound at a place of [`LAYOUT_DIR`] rather than where the host keeps
    /// them (the release, the shim, the deployment CA's certificate).
    pub relocate: Relocations,
}

/// Where the root holds what germline itself provides: the release at [`RELEASE_IN_ROOT`],
/// the tool host's shim at [`SHIM_IN_ROOT`], the deployment CA's certificate beneath
/// [`CA_IN_ROOT`]. Each is at the same path on every host, whatever directory the host
/// unpacked or wrote it to, so a request built from a path (the working directory,
/// `__file__`, `sys.path`, the CA variables) is the same in the call's copies, the
/// verifier's replay and a third party's `germline verify`, which unpacks the release into
/// a temporary directory.
pub const LAYOUT_DIR: &str = "/.germline";
/// The release's directory in the root, the germline's working directory.
pub const RELEASE_IN_ROOT: &str = "/.germline/release";
/// The shim's directory (`germline_host.py`, `germline_slot.py`) in the root.
pub const SHIM_IN_ROOT: &str = "/.germline/shim";
/// The directory of the deployment CA's certificate in the root.
pub const CA_IN_ROOT: &str = "/.germline/ca";

/// Host paths bound at another path of the root: each host path, and where it is in the
/// root (beneath [`LAYOUT_DIR`]); what lies beneath a host path lies beneath its place.
#[derive(Clone, Debug, Default)]
pub struct Relocations(Vec<(PathBuf, PathBuf)>);

impl Relocations {
    /// Binds host path `host` (canonical: no link on the way, as a resident root binds the
    /// end of every link chain) at `in_root`.
    pub fn add(&mut self, host: &Path, in_root: &Path) {
        self.0.retain(|(from, _)| from != host);
        self.0.push((host.to_path_buf(), in_root.to_path_buf()));
        // The deepest host path first, so a nested one wins.
        self.0.sort_by_key(|(from, _)| std::cmp::Reverse(from.components().count()));
    }

    /// Where host path `p` is in the root.
    pub fn in_root(&self, p: &Path) -> PathBuf {
        for (from, to) in &self.0 {
            if let Ok(rest) = p.strip_prefix(from) {
                return if rest.as_os_str().is_empty() { to.clone() } else { to.join(rest) };
            }
        }
        p.to_path_buf()
    }

    /// The host path a path of the root is bound from (itself unless relocated).
    fn on_host(&self, p: &Path) -> PathBuf {
        for (from, to) in &self.0 {
            if let Ok(rest) = p.strip_prefix(to) {
                return if rest.as_os_str().is_empty() { from.clone() } else { from.join(rest) };
            }
        }
        p.to_path_buf()
    }

    /// Whether a host path is relocated (it, or a directory above it).
    pub fn covers(&self, p: &Path) -> bool {
        self.0.iter().any(|(from, _)| p.starts_with(from))
    }
}

/// Where a declared scratch path leads: beneath [`SCRATCH_DIR`], in `.germline/`.
pub fn scratch_target(declared: &Path) -> PathBuf {
    Path::new(SCRATCH_DIR).join(".germline").join(declared.strip_prefix("/").unwrap_or(declared))
}

/// Where each copy finds its private writable scratch (`TMPDIR`): a fresh size-limited
/// tmpfs the broker mounts here in every copy ([`crate::outside::prepare_copy`]). In the
/// germline it is an empty directory of the read-only root. Its parent, [`SCRATCH_PARENT`],
/// holds nothing else and is the one path Landlock lets be written (Landlock skips a mount
/// point on its way up, so the rule sits on the parent, never a mount point itself).
pub const SCRATCH_DIR: &str = "/.germline-scratch/tmp";
/// [`SCRATCH_DIR`] for syscalls.
pub const SCRATCH_DIR_C: &std::ffi::CStr = c"/.germline-scratch/tmp";
const _: () = {
    let (a, b) = (SCRATCH_DIR.as_bytes(), SCRATCH_DIR_C.to_bytes());
    assert!(a.len() == b.len());
    let mut i = 0;
    while i < a.len() {
        assert!(a[i] == b[i]);
        i += 1;
    }
};
/// The parent of [`SCRATCH_DIR`].
pub const SCRATCH_PARENT: &str = "/.germline-scratch";
/// System temporary directories that become links to [`SCRATCH_DIR`] where nothing the
/// germline reads lies at, beneath or above them.
const TEMP_LINKS: [&str; 2] = ["/tmp", "/var/tmp"];

/// The copies' scratch directory, unless a read-only path or data root lies at, beneath or
/// above [`SCRATCH_PARENT`] (then copies have none).
pub fn scratch_dir(read_only: &[PathBuf], data_roots: &[PathBuf]) -> Option<PathBuf> {
    free(Path::new(SCRATCH_PARENT), read_only, data_roots).then(|| PathBuf::from(SCRATCH_DIR))
}

/// Refuses a root where anything but the relocated paths would lie at, beneath or above
/// [`LAYOUT_DIR`].
fn layout_free(
    read_only: &[PathBuf],
    relocate: &Relocations,
    data_roots: &[PathBuf],
    scratch_paths: &[PathBuf],
) -> Result<(), ExecutorError> {
    let others: Vec<PathBuf> = read_only.iter().filter(|p| !relocate.covers(p)).cloned().collect();
    let layout = Path::new(LAYOUT_DIR);
    if free(layout, &others, data_roots)
        && scratch_paths.iter().all(|p| !p.starts_with(layout) && !layout.starts_with(p))
    {
        return Ok(());
    }
    Err(sandbox_err(format!(
        "{LAYOUT_DIR} is where the germline's root holds the release and germline's own files: no other read-only \
         path, data root or scratch path may lie at, beneath or above it"
    )))
}

fn free(c: &Path, read_only: &[PathBuf], data_roots: &[PathBuf]) -> bool {
    read_only.iter().chain(data_roots).all(|p| !p.starts_with(c) && !c.starts_with(p))
}

/// Sandbox mechanisms a test switches off to show what each one prevents (every security
/// property has its mechanism-off twin). Everything outside tests uses the default: all on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SandboxSwitches {
    /// The germline's root holds a minimal `/etc` of its own and an empty tmpfs at every
    /// data root, and nothing is created on the host. Off: host `/etc` is bound whole and
    /// data roots are plain directories of the root (so one under a host mount shows the
    /// host's contents, and a missing one is created on the host).
    pub minimal_root: bool,
    /// When the broker runs as host root, the germline and its copies run as the
    /// unprivileged [`SandboxIds`]. Off: in-namespace root is host root.
    pub sandbox_ids: bool,
    /// Everything the germline starts lives in a PID namespace of the germline's own,
    /// held by a keeper process (its init, forked before the release is imported): a
    /// process the germline leaves behind is reparented to the keeper, where the broker
    /// sees it, and dies with the namespace. Off: the germline's children live in the
    /// broker's PID namespace (an orphan is reparented out of sight).
    pub pid_namespace: bool,
    /// When the germline runs as the sandbox ids, each copy switches to host ids of its
    /// own before it is given data ([`crate::ids`]), so kernel counters kept per host uid
    /// (pipe buffers among them) are never shared between copies or with a germline.
    /// Off: copies run as the germline's sandbox ids.
    pub copy_ids: bool,
    /// The germline imports the release with a writable scratch tmpfs of its own at
    /// [`SCRATCH_DIR`] (`TMPDIR`), which the broker copies out and unmounts before the
    /// first fork; every copy's scratch starts with what the import left there
    /// ([`crate::germline`]). Off: the germline's scratch is the read-only root's empty
    /// directory (a release that writes a temporary file at import fails to start).
    pub import_scratch: bool,
}

impl Default for SandboxSwitches {
    fn default() -> Self {
        SandboxSwitches {
            minimal_root: true,
            sandbox_ids: true,
            pid_namespace: true,
            copy_ids: true,
            import_scratch: true,
        }
    }
}

/// The host uid and gid a germline and its copies run as when the broker is host root
/// (in-namespace root maps to them), so a file only host root may read stays unreadable
/// even where the root shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SandboxIds {
    /// Host uid.
    pub uid: u32,
    /// Host gid.
    pub gid: u32,
}

/// The environment variable that overrides [`SandboxIds::DEFAULT`], as `uid:gid`.
pub const SANDBOX_IDS_VAR: &str = "GERMLINE_SANDBOX_IDS";

impl SandboxIds {
    /// `nobody:nogroup`.
    pub const DEFAULT: SandboxIds = SandboxIds { uid: 65534, gid: 65534 };

    /// Parses `uid:gid`; host root's uid or gid is refused (copies would read what only
    /// root may read).
    pub fn parse(s: &str) -> Result<SandboxIds, ExecutorError> {
        let bad = |why: &str| ExecutorError::Sandbox(format!("{SANDBOX_IDS_VAR}={s:?}: {why}"));
        let (u, g) = s.split_once(':').ok_or_else(|| bad("expected uid:gid"))?;
        let uid: u32 = u.trim().parse().map_err(|_| bad("uid is not a number"))?;
        let gid: u32 = g.trim().parse().map_err(|_| bad("gid is not a number"))?;
        if uid == 0 || gid == 0 {
            return Err(bad("the sandbox may not run as host root (uid or gid 0)"));
        }
        if uid == u32::MAX || gid == u32::MAX {
            return Err(bad("-1 is not an id"));
        }
        Ok(SandboxIds { uid, gid })
    }

    /// [`SANDBOX_IDS_VAR`] if set, else [`SandboxIds::DEFAULT`].
    pub fn from_env() -> Result<SandboxIds, ExecutorError> {
        match std::env::var(SANDBOX_IDS_VAR) {
            Ok(s) => SandboxIds::parse(&s),
            Err(std::env::VarError::NotPresent) => Ok(SandboxIds::DEFAULT),
            Err(e) => Err(ExecutorError::Sandbox(format!("{SANDBOX_IDS_VAR}: {e}"))),
        }
    }

    fn may_read(&self, meta: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        let need = if meta.is_dir() { 0o5 } else { 0o4 };
        let mode = meta.mode();
        let bits = if meta.uid() == self.uid {
            mode >> 6
        } else if meta.gid() == self.gid {
            mode >> 3
        } else {
            mode
        };
        bits & need == need
    }
}

/// A prepared sandbox: everything that allocates much is done in the parent, so the
/// child between fork and exec mostly makes syscalls on ready-made buffers.
pub struct PreparedSandbox {
    uid_map: CString,
    gid_map: CString,
    /// The maps hold the broker's block of copy ids: host root writes them from a helper
    /// forked before the germline gives up root (a process may map only itself).
    mapped_by_root: bool,
    /// The block of copy ids mapped into the germline's user namespace, if any.
    pub copy_ids: Option<std::sync::Arc<crate::ids::IdBlock>>,
    /// The host uid and gid in-namespace root maps to (what copies run as without ids of
    /// their own).
    pub host_ids: (u32, u32),
    drop_to: Option<SandboxIds>,
    /// Where the root's tmpfs is mounted (in the germline's mount namespace only).
    stage: CString,
    /// The directory of that tmpfs the root is built in (`<stage>/root`).
    tree: CString,
    root_ops: Vec<RootOp>,
    workdir: CString,
    seccomp: Vec<seccompiler::BpfProgram>,
    limits: ResourceLimits,
    pid_namespace: bool,
    /// Whether RLIMIT_SIGPENDING is lifted before the user namespace and set to
    /// [`PENDING_SIGNALS`] inside (off only with [`SIGNAL_QUEUE_LIMITS_OFF_FOR_TESTS`]).
    signal_queue_limits: bool,
    /// [`host_machine_for_tests`]: leave the broker's host name, unset limits, umask and
    /// signal actions.
    host_machine: bool,
    control_fd: Option<RawFd>,
    report: OwnedFd,
    report_rx: Option<OwnedFd>,
    descriptions: Vec<String>,
    /// [`SCRATCH_PARENT`] when copies have a scratch: the one path Landlock lets be written.
    scratch: Option<CString>,
    /// Mount the germline's import scratch at [`SCRATCH_DIR`] ([`SandboxSwitches::import_scratch`]).
    import_scratch: bool,
    /// Directories made in it: the targets of declared scratch paths, parents first.
    import_dirs: Vec<CString>,
    /// The resident tree's mount namespace, entered before the germline's own is made.
    tree_namespace: Option<RawFd>,
    /// A pidfd of the broker, kept open across exec for the germline's first process.
    broker_pidfd: Option<RawFd>,
}

/// Mount options of the germline's import scratch: 16 MiB, 1024 files and directories,
/// `/tmp`'s mode. What the import leaves there is copied into every copy's scratch, so it
/// is kept small.
pub const IMPORT_SCRATCH_OPTS: &std::ffi::CStr = c"size=16777216,nr_inodes=1024,mode=1777";

/// One step of building the germline's root filesystem under the stage directory.
enum RootOp {
    Mkdir(CString),
    Touch(CString),
    Write(CString, Vec<u8>),
    Bind(CString, CString),
    Symlink(CString, CString),
    /// An empty, read-only tmpfs: what the germline finds at a data root.
    Empty(CString),
}

/// What the planned root holds at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    /// A directory of the root's own tmpfs.
    Dir,
    /// A file of the root's own tmpfs.
    File,
    /// A host directory bound read-only, or one seen through such a bind.
    HostDir,
    /// A host file bound read-only.
    HostFile,
    /// A symbolic link of the root's own tmpfs.
    Symlink,
}

/// The germline's root, planned in the parent as a list of operations on the stage.
struct RootPlan<'a> {
    stage: &'a Path,
    ops: Vec<RootOp>,
    what: Vec<String>,
    nodes: BTreeMap<PathBuf, Node>,
    binds: Vec<PathBuf>,
    /// Where read-only paths and host `/etc` entries are bound from, if not the host.
    tree: Option<crate::resident::TreeSource>,
    /// Host paths bound beneath [`LAYOUT_DIR`].
    relocate: Relocations,
}

/// The Landlock ABI germline needs: V6 brings signal and abstract-socket scoping, without
/// which copies alive at once could signal each other.
const LANDLOCK_ABI: ABI = ABI::V6;

/// Devices a Python process expects; bound read-only except /dev/null.
const DEVICES: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];

/// The only host `/etc` entries the germline's root holds: data the interpreter and its
/// libraries read and that is the same on every host of a distribution, never a secret:
/// the dynamic linker's cache, public CA certificates and OpenSSL's defaults, the IANA
/// service and protocol tables, and the `alternatives` symlink farm that `/usr/bin`
/// entries point through. Missing entries are skipped. Not the host's time zone: the
/// root's own is UTC ([`SYNTHETIC_ETC`]), so a copy's local time is the same on every
/// host and a third party's replay sees what the call saw.
pub const HOST_ETC: [&str; 6] = [
    "/etc/ld.so.cache",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/services",
    "/etc/protocols",
    "/etc/alternatives",
];

/// The `/etc` files germline writes for the root: the sandbox user is in-namespace root,
/// named `germline`; `nobody` is how unmapped host ids appear. No resolver: copies reach
/// hosts only through the broker's proxy, which resolves names itself. The time zone is
/// UTC ([`UTC_TZIF`]) on every host.
const SYNTHETIC_ETC: [(&str, &str); 7] = [
    (
        "/etc/passwd",
        "germline:x:0:0:germline sandbox:/nonexistent:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    ),
    ("/etc/group", "germline:x:0:\nnogroup:x:65534:\n"),
    ("/etc/nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files\nservices: files\nprotocols: files\n"),
    ("/etc/hosts", "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"),
    ("/etc/resolv.conf", "# germline: no name servers; names are resolved by the broker.\noptions attempts:1 timeout:1\n"),
    ("/etc/localtime", UTC_TZIF),
    ("/etc/timezone", "Etc/UTC\n"),
];

/// One TZif block (RFC 8536, section 3) of a zone with no transitions and one local time
/// type, UTC: the header (version 2, counts isut 0, isstd 0, leap 0, time 0, type 1,
/// char 4), the type (offset 0, not DST, designation 0) and the designation `UTC`.
macro_rules! utc_tzif_block {
    () => {
        concat!(
            "TZif2",
            "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
            "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
            "\0\0\0\x01\0\0\0\x04",
            "\0\0\0\0\0\0",
            "UTC\0"
        )
    };
}

/// `/etc/localtime` of the root: UTC as a version-2 TZif file (the version-1 block, the
/// 64-bit block, and the footer's POSIX TZ string).
pub const UTC_TZIF: &str = concat!(utc_tzif_block!(), utc_tzif_block!(), "\nUTC0\n");

fn sandbox_err(s: String) -> ExecutorError {
    ExecutorError::Sandbox(s)
}

impl<'a> RootPlan<'a> {
    fn new(stage: &'a Path) -> RootPlan<'a> {
        let mut nodes = BTreeMap::new();
        nodes.insert(PathBuf::from("/"), Node::Dir);
        RootPlan {
            stage,
            ops: Vec::new(),
            what: Vec::new(),
            nodes,
            binds: Vec::new(),
            tree: None,
            relocate: Relocations::default(),
        }
    }

    fn staged(&self, p: &Path) -> Result<CString, ExecutorError> {
        cstring(&self.stage.join(p.strip_prefix("/").unwrap_or(p)))
    }

    fn push(&mut self, op: RootOp, what: String) {
        self.ops.push(op);
        self.what.push(what);
    }

    /// The deepest host directory mount at or above `p`, if any.
    fn host_mount_above<'p>(&self, p: &'p Path) -> Option<&'p Path> {
        p.ancestors().find(|a| self.nodes.get(*a) == Some(&Node::HostDir))
    }

    /// Makes `p` a directory of the root. Inside the root's own tmpfs missing directories
    /// are created; beneath a directory mounted from the host nothing is ever created, so
    /// every component there must already exist on the host as a directory (not a link).
    fn ensure_dir(&mut self, p: &Path, what: &str, whole: &Path) -> Result<(), ExecutorError> {
        let mut acc = PathBuf::from("/");
        let mut host: Option<PathBuf> = None;
        for c in p.components().skip(1) {
            acc.push(c);
            match self.nodes.get(&acc) {
                Some(Node::Dir) => {}
                Some(Node::HostDir) => host = Some(acc.clone()),
                Some(Node::Symlink) => {
                    return Err(sandbox_err(format!(
                        "{what} {}: {} is a symbolic link in the germline's root",
                        whole.display(),
                        acc.display()
                    )))
                }
                Some(Node::File | Node::HostFile) => {
                    return Err(sandbox_err(format!(
                        "{what} {}: {} is a file in the germline's root",
                        whole.display(),
                        acc.display()
                    )))
                }
                None => match &host {
                    Some(mount) => {
                        let meta = std::fs::symlink_metadata(self.relocate.on_host(&acc)).map_err(|e| {
                            sandbox_err(format!(
                                "{what} {}: {} cannot be used ({e}); it lies under {}, which is mounted from the \
                                 host, and germline never creates anything on the host",
                                whole.display(),
                                acc.display(),
                                mount.display()
                            ))
                        })?;
                        if meta.file_type().is_symlink() || !meta.is_dir() {
                            return Err(sandbox_err(format!(
                                "{what} {}: {} on the host is {}, not a directory",
                                whole.display(),
                                acc.display(),
                                if meta.file_type().is_symlink() { "a symbolic link" } else { "a file" }
                            )));
                        }
                        self.nodes.insert(acc.clone(), Node::HostDir);
                    }
                    None => {
                        let op = RootOp::Mkdir(self.staged(&acc)?);
                        self.push(op, format!("creating directory {} in the root", acc.display()));
                        self.nodes.insert(acc.clone(), Node::Dir);
                    }
                },
            }
        }
        Ok(())
    }

    /// The copies' scratch directory ([`scratch_dir`]) and, where free, `/tmp` and
    /// `/var/tmp` as links to it; each of `declared` (the manifest's scratch paths) as a
    /// link to its [`scratch_target`], or refused where it is not free.
    fn scratch(
        &mut self,
        read_only: &[PathBuf],
        data_roots: &[PathBuf],
        declared: &[PathBuf],
    ) -> Result<Option<PathBuf>, ExecutorError> {
        let Some(dir) = scratch_dir(read_only, data_roots) else {
            if let Some(p) = declared.first() {
                return Err(sandbox_err(format!(
                    "scratch path {}: there is no scratch (a read-only path or data root overlaps {SCRATCH_PARENT})",
                    p.display()
                )));
            }
            return Ok(None);
        };
        self.ensure_dir(&dir, "scratch directory", &dir)?;
        for link in TEMP_LINKS.map(Path::new) {
            if free(link, read_only, data_roots) && !self.nodes.contains_key(link) {
                if let Some(parent) = link.parent() {
                    self.ensure_dir(parent, "temporary directory", link)?;
                }
                let op = RootOp::Symlink(cstring(&dir)?, self.staged(link)?);
                self.push(op, format!("linking {} to the copies' scratch", link.display()));
                self.nodes.insert(link.to_path_buf(), Node::Symlink);
            }
        }
        for p in declared {
            let plain = p.is_absolute()
                && p.components().nth(1).is_some()
                && p.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
            let taken = self.nodes.keys().any(|n| n.starts_with(p));
            if !plain || !free(p, read_only, data_roots) || p.starts_with(SCRATCH_PARENT) || taken {
                return Err(sandbox_err(format!(
                    "scratch path {}: it must be a plain absolute path that no read-only path, data root or other \
                     entry of the germline's root lies at, beneath or above",
                    p.display()
                )));
            }
            if let Some(parent) = p.parent() {
                self.ensure_dir(parent, "scratch path", p)?;
            }
            let op = RootOp::Symlink(cstring(&scratch_target(p))?, self.staged(p)?);
            self.push(op, format!("linking scratch path {} to the scratch", p.display()));
            self.nodes.insert(p.to_path_buf(), Node::Symlink);
        }
        Ok(Some(dir))
    }

    /// Binds host path `p` (read-only later) at the same place in the root, or at its place
    /// beneath [`LAYOUT_DIR`] if relocated, from the resident tree if the root has one; a
    /// symbolic link is recreated as a link (it resolves inside the root).
    fn bind(&mut self, p: &Path, what: &str) -> Result<(), ExecutorError> {
        self.bind_from(p, what, true)
    }

    /// [`RootPlan::bind`], from the host itself unless `from_tree` (devices).
    fn bind_from(&mut self, p: &Path, what: &str, from_tree: bool) -> Result<(), ExecutorError> {
        if !p.is_absolute() || p.components().any(|c| !matches!(c, Component::RootDir | Component::Normal(_))) {
            return Err(sandbox_err(format!("{what} {} is not a plain absolute path", p.display())));
        }
        let meta = std::fs::symlink_metadata(p).map_err(|e| sandbox_err(format!("{what} {}: {e}", p.display())))?;
        // Where `p` is in the root.
        let q = self.relocate.in_root(p);
        if let Some(parent) = q.parent() {
            if self.host_mount_above(parent).is_some() {
                // Already visible, as it is on the host, through a bind above it.
                return Ok(());
            }
            self.ensure_dir(parent, what, &q)?;
        }
        if self.nodes.contains_key(&q) {
            return Ok(());
        }
        let at = self.staged(&q)?;
        let source = match &self.tree {
            Some(t) if from_tree => t.source_of(p),
            _ => p.to_path_buf(),
        };
        let shown = if q == p { p.display().to_string() } else { format!("{} at {}", p.display(), q.display()) };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(p).map_err(ExecutorError::io(format!("reading link {}", p.display())))?;
            self.push(RootOp::Symlink(cstring(&target)?, at), format!("linking {shown} in the root"));
            self.nodes.insert(q, Node::Symlink);
        } else if meta.is_dir() {
            self.push(RootOp::Mkdir(at.clone()), format!("creating directory {} in the root", q.display()));
            self.push(RootOp::Bind(cstring(&source)?, at), format!("binding {shown} into the root"));
            self.nodes.insert(q, Node::HostDir);
            self.binds.push(p.to_path_buf());
        } else {
            self.push(RootOp::Touch(at.clone()), format!("creating file {} in the root", q.display()));
            self.push(RootOp::Bind(cstring(&source)?, at), format!("binding {shown} into the root"));
            self.nodes.insert(q, Node::HostFile);
            self.binds.push(p.to_path_buf());
        }
        Ok(())
    }

    fn write(&mut self, p: &Path, contents: &[u8]) -> Result<(), ExecutorError> {
        if self.nodes.contains_key(p) {
            return Ok(());
        }
        if let Some(parent) = p.parent() {
            self.ensure_dir(parent, "file", p)?;
        }
        let op = RootOp::Write(self.staged(p)?, contents.to_vec());
        self.push(op, format!("writing {} in the root", p.display()));
        self.nodes.insert(p.to_path_buf(), Node::File);
        Ok(())
    }

    /// An empty tmpfs over directory `p`, which must lie beneath a directory bound from the
    /// host: what the host holds there is not in the root.
    fn mask(&mut self, p: &Path) -> Result<(), ExecutorError> {
        let plain = p.is_absolute() && p.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        let meta =
            std::fs::symlink_metadata(p).map_err(|e| sandbox_err(format!("hidden directory {}: {e}", p.display())))?;
        let q = self.relocate.in_root(p);
        if !plain || !meta.is_dir() || q.parent().and_then(|d| self.host_mount_above(d)).is_none() {
            return Err(sandbox_err(format!(
                "hidden directory {}: it must be a plain path of a directory beneath one bound from the host",
                p.display()
            )));
        }
        let op = RootOp::Empty(self.staged(&q)?);
        self.push(op, format!("hiding {} under an empty tmpfs", q.display()));
        Ok(())
    }

    /// The minimal `/etc`: [`SYNTHETIC_ETC`] and the [`HOST_ETC`] entries present.
    fn minimal_etc(&mut self) -> Result<(), ExecutorError> {
        if self.nodes.get(Path::new("/etc")) == Some(&Node::HostDir) {
            return Err(sandbox_err("read-only path /etc: the germline's root has a minimal /etc of its own".into()));
        }
        let host_machine = host_machine_for_tests();
        for (p, contents) in SYNTHETIC_ETC {
            let host_zone = match host_machine && matches!(p, "/etc/localtime" | "/etc/timezone") {
                true => std::fs::read(p).ok(),
                false => None,
            };
            self.write(Path::new(p), host_zone.as_deref().unwrap_or(contents.as_bytes()))?;
        }
        for p in HOST_ETC {
            if std::fs::symlink_metadata(p).is_ok() {
                self.bind(Path::new(p), "host /etc entry")?;
            }
        }
        Ok(())
    }

    /// An empty tmpfs at data root `r`, wherever it sits; created only inside the root's
    /// own tmpfs, never on the host. A data root that would hide something the germline
    /// reads is refused.
    fn empty_data_root(&mut self, r: &Path) -> Result<(), ExecutorError> {
        if !r.is_absolute() || r.components().any(|c| !matches!(c, Component::RootDir | Component::Normal(_))) {
            return Err(sandbox_err(format!("data root {} is not a plain absolute path", r.display())));
        }
        if r == Path::new("/") {
            return Err(sandbox_err("data root / would hide the whole root".into()));
        }
        if let Some((hidden, _)) = self.nodes.iter().find(|(p, n)| **n != Node::Dir && p.starts_with(r)) {
            return Err(sandbox_err(format!(
                "data root {} would hide {}, which the germline reads",
                r.display(),
                hidden.display()
            )));
        }
        self.ensure_dir(r, "data root", r)?;
        let op = RootOp::Empty(self.staged(r)?);
        self.push(op, format!("mounting an empty tmpfs over data root {}", r.display()));
        Ok(())
    }

    /// The data root as a plain directory of the root (mechanism off): every missing
    /// component is created, on the host if it lies under a host mount.
    fn plain_data_root(&mut self, r: &Path) -> Result<(), ExecutorError> {
        let mut acc = PathBuf::from("/");
        for c in r.components().skip(1) {
            acc.push(c);
            if !self.nodes.contains_key(&acc) {
                let op = RootOp::Mkdir(self.staged(&acc)?);
                self.push(op, format!("creating directory {}", acc.display()));
                self.nodes.entry(acc.clone()).or_insert(Node::Dir);
            }
        }
        Ok(())
    }
}

impl Confinement {
    /// Where the read-only paths are in the root.
    pub fn read_only_in_root(&self) -> Vec<PathBuf> {
        self.read_only.iter().map(|p| self.relocate.in_root(p)).collect()
    }

    /// Plans the germline's root filesystem and compiles seccomp in the parent.
    ///
    /// The germline gets a fresh tmpfs root holding only the read-only paths (bound
    /// read-only), a few devices, a minimal `/etc`, and an empty tmpfs at each data root;
    /// nothing else of the host exists for it, and nothing is created on the host. When
    /// the broker runs as host root, the germline gives up root before it creates its user
    /// namespace, whose root then maps to the unprivileged [`SandboxIds`]. Landlock then
    /// makes the whole root read-only. (A Landlock rule on a directory does not reach a
    /// file system mounted on it, so the view the broker later mounts at a data root
    /// inside a copy is covered by the rule on `/`.)
    ///
    /// A root that cannot be built as planned is refused here, with the path named; the
    /// germline never starts with a weaker root.
    pub fn prepare(
        &self,
        stage: &Path,
        workdir: &Path,
        control_fd: Option<RawFd>,
    ) -> Result<PreparedSandbox, ExecutorError> {
        // SAFETY: getuid/getgid/geteuid cannot fail.
        let (uid, gid, euid) = unsafe { (libc::getuid(), libc::getgid(), libc::geteuid()) };
        let drop_to = if euid == 0 && self.switches.sandbox_ids { Some(SandboxIds::from_env()?) } else { None };
        let seccomp = self.seccomp.compile()?;
        let tree = stage.join("root");
        let mut plan = RootPlan::new(&tree);
        if self.tree.is_some() && !self.switches.minimal_root {
            return Err(sandbox_err("a resident root's tree needs the minimal root (its own /etc)".into()));
        }
        plan.tree = self.tree.clone();
        plan.relocate = self.relocate.clone();
        layout_free(&self.read_only, &self.relocate, &self.data_roots, &self.scratch_paths)?;
        let mut paths: Vec<PathBuf> = self.read_only.clone();
        if !self.switches.minimal_root {
            paths.push(PathBuf::from("/etc"));
        }
        paths.sort();
        paths.dedup();
        for p in &paths {
            plan.bind(p, "read-only path")?;
        }
        for m in &self.masks {
            plan.mask(m)?;
        }
        plan.ensure_dir(Path::new("/dev"), "device", Path::new("/dev"))?;
        for d in DEVICES {
            plan.bind_from(Path::new(d), "device", false)?;
        }
        if self.switches.minimal_root {
            plan.minimal_etc()?;
        }
        for r in &self.data_roots {
            if self.switches.minimal_root {
                plan.empty_data_root(r)?;
            } else {
                plan.plain_data_root(r)?;
            }
        }
        let scratch = plan.scratch(&self.read_only_in_root(), &self.data_roots, &self.scratch_paths)?;
        // The declared paths' directories, parents first, made in the import scratch (and
        // so in every copy's, which starts as a copy of it).
        let mut import_dirs: Vec<CString> = Vec::new();
        for p in &self.scratch_paths {
            let target = scratch_target(p);
            for d in target.ancestors().collect::<Vec<_>>().into_iter().rev() {
                if d.starts_with(SCRATCH_DIR) && d != Path::new(SCRATCH_DIR) {
                    let c = cstring(d)?;
                    if !import_dirs.contains(&c) {
                        import_dirs.push(c);
                    }
                }
            }
        }
        if let Some(ids) = drop_to {
            for p in &plan.binds {
                let meta =
                    std::fs::metadata(p).map_err(|e| sandbox_err(format!("read-only path {}: {e}", p.display())))?;
                if !ids.may_read(&meta) {
                    use std::os::unix::fs::MetadataExt;
                    return Err(sandbox_err(format!(
                        "read-only path {} (owner {}:{}, mode {:o}) is not readable by the sandbox ids {}:{} the \
                         germline runs as; make it readable by them or choose other ids with {SANDBOX_IDS_VAR}",
                        p.display(),
                        meta.uid(),
                        meta.gid(),
                        meta.mode() & 0o7777,
                        ids.uid,
                        ids.gid
                    )));
                }
            }
        }
        let (map_uid, map_gid) = drop_to.map_or((uid, gid), |ids| (ids.uid, ids.gid));
        let copy_ids = match drop_to {
            Some(_) if self.switches.copy_ids => Some(crate::ids::block()?),
            _ => None,
        };
        let (uid_map, gid_map) = match &copy_ids {
            Some(block) => block.maps(map_uid, map_gid),
            None => (format!("0 {map_uid} 1"), format!("0 {map_gid} 1")),
        };
        let (report_rx, report) = report_pipe()?;
        Ok(PreparedSandbox {
            uid_map: CString::new(uid_map).map_err(|_| ExecutorError::internal("uid map"))?,
            gid_map: CString::new(gid_map).map_err(|_| ExecutorError::internal("gid map"))?,
            mapped_by_root: copy_ids.is_some(),
            copy_ids,
            host_ids: (map_uid, map_gid),
            drop_to,
            stage: cstring(stage)?,
            tree: cstring(&tree)?,
            root_ops: plan.ops,
            workdir: cstring(workdir)?,
            seccomp,
            limits: self.limits.clone(),
            pid_namespace: self.switches.pid_namespace,
            signal_queue_limits: !SIGNAL_QUEUE_LIMITS_OFF_FOR_TESTS.load(std::sync::atomic::Ordering::SeqCst),
            host_machine: host_machine_for_tests(),
            control_fd,
            report,
            report_rx: Some(report_rx),
            descriptions: plan.what,
            scratch: scratch.is_some().then(|| cstring(Path::new(SCRATCH_PARENT))).transpose()?,
            import_scratch: scratch.is_some() && self.switches.import_scratch,
            import_dirs,
            tree_namespace: self.tree.as_ref().map(|t| t.namespace),
            broker_pidfd: None,
        })
    }
}

/// A close-on-exec pipe on which the child names the step that failed.
fn report_pipe() -> Result<(OwnedFd, OwnedFd), ExecutorError> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills two fresh descriptors that we take ownership of.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
        return Err(ExecutorError::io("sandbox report pipe")(io::Error::last_os_error()));
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Fixed steps of the child, reported by code (root operations report their index).
#[derive(Clone, Copy)]
#[repr(u32)]
enum Step {
    MountNamespace = 0x8000_0000,
    StageTmpfs,
    StageDir,
    SandboxIds,
    Namespaces,
    IdMaps,
    PivotRoot,
    ReadOnly,
    Workdir,
    Limits,
    Capabilities,
    NoNewPrivs,
    Landlock,
    Seccomp,
    ControlFd,
    ImportScratch,
    ResidentTree,
    HostName,
    Clocks,
}

const STEPS: [&str; 19] = [
    "creating the private mount namespace",
    "mounting the root's tmpfs",
    "entering the stage directory",
    "switching to the sandbox ids",
    "creating the germline's namespaces",
    "writing the user namespace's id maps",
    "pivoting into the root",
    "making the root read-only",
    "entering the release directory",
    "setting resource limits",
    "dropping capabilities",
    "setting no-new-privileges",
    "applying Landlock",
    "applying seccomp",
    "passing the control socket",
    "mounting the germline's import scratch",
    "entering the resident tree's mount namespace",
    "naming the germline's host",
    "setting the germline's boot clocks",
];

const _: () = assert!(STEPS.len() == (Step::Clocks as u32 - Step::MountNamespace as u32 + 1) as usize);

/// Explains a failed germline start by the step the child reported.
pub struct BuildReport {
    rx: Option<OwnedFd>,
    descriptions: Vec<String>,
}

impl BuildReport {
    /// The error for a spawn that failed with `e`, naming the failed step (and path).
    pub fn explain(&self, e: &io::Error) -> String {
        let mut buf = [0u8; 4];
        let n = match &self.rx {
            // SAFETY: non-blocking read into a local buffer from a pipe we own.
            Some(rx) => unsafe { libc::read(rx.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) },
            None => -1,
        };
        if n != 4 {
            return format!("could not start the germline: {e}");
        }
        let code = u32::from_le_bytes(buf);
        let step = if code >= Step::MountNamespace as u32 {
            STEPS.get((code - Step::MountNamespace as u32) as usize).map(|s| s.to_string())
        } else {
            self.descriptions.get(code as usize).cloned()
        };
        format!(
            "could not build the germline's sandbox: {} failed: {e}",
            step.unwrap_or_else(|| format!("step {code}"))
        )
    }
}

/// What a copy may do in its scratch tmpfs: make, write, rename and remove regular files,
/// directories and symbolic links; no devices, sockets or FIFOs.
fn scratch_access() -> landlock::BitFlags<AccessFs> {
    AccessFs::WriteFile
        | AccessFs::RemoveDir
        | AccessFs::RemoveFile
        | AccessFs::MakeDir
        | AccessFs::MakeReg
        | AccessFs::MakeSym
        | AccessFs::Refer
        | AccessFs::Truncate
}

fn landlock_restrict(scratch: Option<&std::ffi::CStr>) -> io::Result<()> {
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
    if let Some(dir) = scratch {
        // Writes reach only the tmpfs the broker mounts beneath it in each copy: in the
        // germline the directory and its one subdirectory lie on the read-only root.
        use std::os::unix::ffi::OsStrExt;
        let dir = std::ffi::OsStr::from_bytes(dir.to_bytes());
        let fd = PathFd::new(dir).map_err(io::Error::other)?;
        rs = rs.add_rule(PathBeneath::new(fd, scratch_access())).map_err(ll)?;
    }
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
    /// Keeps `fd`, a pidfd of the broker, open across exec: the germline's first process
    /// watches the broker through it (a process inside the sandbox cannot open one, see
    /// [`crate::seccomp`]). It must stay open until the command is spawned; the first
    /// process closes it in the keeper and the germline before any release code runs.
    pub fn pass_broker_pidfd(&mut self, fd: RawFd) {
        self.broker_pidfd = Some(fd);
    }

    /// Installs the sandbox as the command's pre-exec step; the report explains a spawn
    /// that fails by the step (and path) that failed.
    pub fn install(mut self, cmd: &mut Command) -> BuildReport {
        let report = BuildReport { rx: self.report_rx.take(), descriptions: std::mem::take(&mut self.descriptions) };
        // SAFETY: the closure runs in the forked child before exec; it makes syscalls on
        // buffers prepared above, and Landlock's small allocations are safe in a forked
        // child under glibc (malloc is reinitialised at fork).
        unsafe {
            cmd.pre_exec(move || self.apply_in_child());
        }
        report
    }

    /// Passes `r` on; on failure first writes `code` to the report pipe.
    fn step<T>(&self, code: u32, r: io::Result<T>) -> io::Result<T> {
        if r.is_err() {
            let b = code.to_le_bytes();
            // SAFETY: write of a local buffer to a pipe we own.
            unsafe { libc::write(self.report.as_raw_fd(), b.as_ptr().cast(), b.len()) };
        }
        r
    }

    /// Mounts the root's tmpfs on the stage and builds the root in it.
    fn populate_stage(&self) -> io::Result<()> {
        use libc::*;
        // SAFETY (whole block): mount/mkdir/open/write/symlink on NUL-terminated strings
        // and buffers prepared in the parent.
        unsafe {
            let rc = mount(std::ptr::null(), c"/".as_ptr(), std::ptr::null(), MS_REC | MS_PRIVATE, std::ptr::null());
            self.step(Step::MountNamespace as u32, check(rc))?;
            let rc = mount(
                c"germline-root".as_ptr(),
                self.stage.as_ptr(),
                c"tmpfs".as_ptr(),
                MS_NOSUID | MS_NODEV,
                c"size=1m,mode=0755".as_ptr().cast(),
            );
            self.step(Step::StageTmpfs as u32, check(rc))?;
            self.step(Step::StageTmpfs as u32, check(mkdir(self.tree.as_ptr(), 0o755)))?;
            for (i, op) in self.root_ops.iter().enumerate() {
                let r = match op {
                    RootOp::Mkdir(p) => {
                        if mkdir(p.as_ptr(), 0o755) < 0 && *__errno_location() != EEXIST {
                            Err(io::Error::last_os_error())
                        } else {
                            Ok(())
                        }
                    }
                    RootOp::Touch(p) => create_file(p, &[]),
                    RootOp::Write(p, bytes) => create_file(p, bytes),
                    RootOp::Bind(src, dst) => {
                        check(mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), MS_BIND | MS_REC, std::ptr::null()))
                    }
                    RootOp::Symlink(target, at) => check(symlink(target.as_ptr(), at.as_ptr())),
                    RootOp::Empty(at) => check(mount(
                        c"germline-empty".as_ptr(),
                        at.as_ptr(),
                        c"tmpfs".as_ptr(),
                        MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
                        c"size=4k,nr_inodes=1,mode=0755".as_ptr().cast(),
                    )),
                };
                self.step(i as u32, r)?;
            }
        }
        Ok(())
    }

    /// Makes the built tree (`root` in the current directory, the stage) the root and
    /// the old root unreachable. The tree is first bound onto itself: a mount copied into
    /// a less privileged user namespace is locked, and pivot_root refuses a locked new
    /// root; the bind on top is this namespace's own (what it covers stays locked).
    /// Relative paths only: the sandbox ids may not be able to walk the stage's path.
    fn enter_stage(&self) -> io::Result<()> {
        use libc::*;
        // SAFETY: mount/chdir/pivot_root/umount2 on constant paths.
        let r = unsafe {
            check(mount(c"root".as_ptr(), c"root".as_ptr(), std::ptr::null(), MS_BIND | MS_REC, std::ptr::null()))
                .and_then(|()| check(chdir(c"root".as_ptr())))
                .and_then(|()| check(syscall(SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as c_int))
                .and_then(|()| check(umount2(c".".as_ptr(), MNT_DETACH)))
                .and_then(|()| check(chdir(c"/".as_ptr())))
        };
        self.step(Step::PivotRoot as u32, r)?;
        self.step(Step::ReadOnly as u32, make_tree_read_only())?;
        if self.import_scratch {
            // Writable while the release is imported (no item is there yet); the broker
            // copies it out and unmounts it before the germline's first fork.
            // SAFETY: mount on constant NUL-terminated strings.
            let r = check(unsafe {
                mount(
                    c"germline-import-scratch".as_ptr(),
                    SCRATCH_DIR_C.as_ptr(),
                    c"tmpfs".as_ptr(),
                    MS_NOSUID | MS_NODEV,
                    IMPORT_SCRATCH_OPTS.as_ptr().cast(),
                )
            });
            self.step(Step::ImportScratch as u32, r)?;
            for d in &self.import_dirs {
                // SAFETY: mkdir on a NUL-terminated path prepared before fork.
                let r = check(unsafe { mkdir(d.as_ptr(), 0o755) });
                self.step(Step::ImportScratch as u32, r)?;
            }
        }
        Ok(())
    }

    fn apply_in_child(&mut self) -> io::Result<()> {
        use libc::*;
        // The root is built, and the germline runs, with umask 022 whatever the broker's:
        // under 077 the root's own directories and files would be unreadable by the
        // sandbox ids, and a copy would read the broker's umask back.
        // SAFETY: umask cannot fail.
        let broker_umask = unsafe { umask(0o022) };
        // CLONE_NEWPID moves the germline's children (not the germline) into a new PID
        // namespace; the first of them, the keeper, is its init.
        let namespaces: c_int = CLONE_NEWUSER
            | CLONE_NEWNS
            | CLONE_NEWNET
            | CLONE_NEWIPC
            | CLONE_NEWUTS
            | CLONE_NEWCGROUP
            | if self.pid_namespace { CLONE_NEWPID } else { 0 };
        if let Some(ns) = self.tree_namespace {
            // Still host root: the namespace the resident tree is mounted in becomes the one
            // the germline's is copied from, so the root can bind from the tree (and the
            // tree is gone again once the old root is detached).
            // SAFETY: setns on a descriptor the broker holds open across this fork.
            self.step(Step::ResidentTree as u32, check(unsafe { setns(ns, CLONE_NEWNS) }))?;
        }
        match self.drop_to {
            Some(ids) => {
                // As host root: build the root in a private mount namespace while root may
                // still bind what it needs, give up root for good, and only then create the
                // user namespace, so its root maps to the sandbox ids. The new mount
                // namespace copies the built root with every mount locked.
                // SAFETY: plain syscall.
                self.step(Step::MountNamespace as u32, check(unsafe { unshare(CLONE_NEWNS) }))?;
                self.populate_stage()?;
                // SAFETY: chdir to a prepared path (pivot_root works on the current directory).
                self.step(Step::StageDir as u32, check(unsafe { chdir(self.stage.as_ptr()) }))?;
                // Still host root: lift the host-level limit on queued signals (see
                // `unshared_signal_queue`) before the user namespace records it.
                if self.signal_queue_limits {
                    self.step(Step::Limits as u32, unshared_signal_queue(true))?;
                }
                // Still host root: no hard limit the starter set stands below a value the
                // germline sets.
                self.step(Step::Limits as u32, lift_hard_limits(&self.limits, !self.host_machine))?;
                // Still host root: the helper that will write maps holding more than
                // this process's own id is forked now.
                let mapper =
                    if self.mapped_by_root { Some(self.step(Step::IdMaps as u32, self.fork_mapper())?) } else { None };
                self.step(Step::SandboxIds as u32, become_sandbox_ids(ids))?;
                // SAFETY: plain syscall.
                self.step(Step::Namespaces as u32, check(unsafe { unshare(namespaces) }))?;
                match mapper {
                    Some(m) => self.step(Step::IdMaps as u32, m.map_now())?,
                    None => self.step(Step::IdMaps as u32, self.write_id_maps())?,
                }
            }
            None => {
                // Not host root: the soft limit can only go up to the hard one.
                if self.signal_queue_limits {
                    self.step(Step::Limits as u32, unshared_signal_queue(false))?;
                }
                // SAFETY: plain syscall.
                self.step(Step::Namespaces as u32, check(unsafe { unshare(namespaces) }))?;
                self.step(Step::IdMaps as u32, self.write_id_maps())?;
                self.populate_stage()?;
                // SAFETY: chdir to a prepared path.
                self.step(Step::StageDir as u32, check(unsafe { chdir(self.stage.as_ptr()) }))?;
            }
        }
        if !self.host_machine {
            // Root in the germline's user namespace, and the host's /proc still mounted.
            self.step(Step::Clocks as u32, fixed_boot_clocks())?;
        }
        self.enter_stage()?;
        // SAFETY: chdir to a prepared path.
        self.step(Step::Workdir as u32, check(unsafe { chdir(self.workdir.as_ptr()) }))?;
        for (res, val) in [
            (RLIMIT_AS, self.limits.memory_bytes),
            (RLIMIT_NPROC, self.limits.processes),
            (RLIMIT_CPU, self.limits.cpu_seconds),
            (RLIMIT_NOFILE, self.limits.open_files),
            (RLIMIT_CORE, 0),
        ] {
            let lim = rlimit { rlim_cur: val, rlim_max: val };
            // SAFETY: valid pointer to a local rlimit.
            self.step(Step::Limits as u32, check(unsafe { setrlimit(res, &lim) }))?;
        }
        if self.host_machine {
            // SAFETY: umask cannot fail.
            unsafe { umask(broker_umask) };
        } else {
            self.step(Step::Limits as u32, fixed_limits())?;
            self.step(Step::HostName as u32, fixed_host_name())?;
            self.step(Step::Limits as u32, randomized_layout())?;
            default_signal_actions();
        }
        if self.signal_queue_limits {
            let lim = rlimit { rlim_cur: PENDING_SIGNALS, rlim_max: PENDING_SIGNALS };
            // SAFETY: valid pointer to a local rlimit.
            self.step(Step::Limits as u32, check(unsafe { setrlimit(RLIMIT_SIGPENDING, &lim) }))?;
        }
        self.step(Step::Capabilities as u32, drop_capabilities())?;
        // SAFETY: prctl with constant arguments.
        self.step(Step::NoNewPrivs as u32, check(unsafe { prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }))?;
        // The germline's control channel is signals; only the "mechanism off" test of a
        // shared control socket hands it a descriptor (at GERMLINE_CONTROL_FD).
        let first_closed = match self.control_fd {
            Some(fd) if fd != GERMLINE_CONTROL_FD => {
                // SAFETY: dup2 onto a fixed descriptor number; the result is checked.
                self.step(Step::ControlFd as u32, check(unsafe { dup2(fd, GERMLINE_CONTROL_FD) }))?;
                GERMLINE_CONTROL_FD + 1
            }
            Some(_) => {
                // SAFETY: clear close-on-exec so the control socket survives exec.
                self.step(Step::ControlFd as u32, check(unsafe { fcntl(GERMLINE_CONTROL_FD, F_SETFD, 0) }))?;
                GERMLINE_CONTROL_FD + 1
            }
            None => GERMLINE_CONTROL_FD,
        };
        // Nothing else the broker holds (or inherited) may reach the germline: every
        // descriptor above stdio (and the test's control socket) is marked close-on-exec,
        // so exec closes it. Marked, not closed here: the standard library's own
        // close-on-exec pipe, which tells the parent why an exec failed (an interpreter the
        // root cannot run, say), stays open until exec, so that failure is an error the
        // broker reads instead of an abort in the child. Only this pre-exec code runs in
        // between. The broker's pidfd for the first process is kept across exec below.
        // SAFETY: close_range over a range of descriptor numbers, marking only.
        check(unsafe {
            syscall(SYS_close_range, first_closed as c_uint, c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) as c_int
        })?;
        if let Some(fd) = self.broker_pidfd {
            // SAFETY: clears close-on-exec on a descriptor the broker passed.
            self.step(Step::ControlFd as u32, check(unsafe { fcntl(fd, F_SETFD, 0) }))?;
        }
        self.step(Step::Landlock as u32, landlock_restrict(self.scratch.as_deref()))?;
        // Last, right before exec: the allowlist allows neither seccomp(2) itself (so it
        // is the last of the stacked filters) nor most of the set-up above; only the
        // report write on failure and execve follow.
        for prog in &self.seccomp {
            self.step(Step::Seccomp as u32, seccompiler::apply_filter(prog).map_err(io::Error::other))?;
        }
        Ok(())
    }

    fn write_id_maps(&self) -> io::Result<()> {
        write_proc(c"/proc/self/setgroups", c"deny")?;
        write_proc(c"/proc/self/uid_map", &self.uid_map)?;
        write_proc(c"/proc/self/gid_map", &self.gid_map)
    }

    /// Forks a helper, still host root, that waits until this process has created its user
    /// namespace and then writes that namespace's maps from the parent namespace (only a
    /// writer with CAP_SETUID there may map more than its own id).
    fn fork_mapper(&self) -> io::Result<Mapper> {
        // SAFETY: getpid cannot fail.
        let me = unsafe { libc::getpid() };
        let paths = ["setgroups", "uid_map", "gid_map"].map(|f| proc_path(me, f));
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 fills two fresh descriptors.
        check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
        // SAFETY: the child makes only syscalls on buffers prepared before the fork and
        // leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: as above.
            unsafe {
                libc::close(fds[1]);
                let mut b = 0u8;
                if libc::read(fds[0], (&mut b as *mut u8).cast(), 1) != 1 {
                    libc::_exit(2);
                }
                let contents: [&[u8]; 3] = [b"deny", self.uid_map.as_bytes(), self.gid_map.as_bytes()];
                for (i, (path, data)) in paths.iter().zip(contents).enumerate() {
                    let fd = libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 || libc::write(fd, data.as_ptr().cast(), data.len()) != data.len() as isize {
                        libc::_exit(10 + i as i32);
                    }
                    libc::close(fd);
                }
                libc::_exit(0);
            }
        }
        // SAFETY: closing our copy of the read end.
        unsafe { libc::close(fds[0]) };
        Ok(Mapper { pid, go: fds[1] })
    }
}

/// The helper of [`PreparedSandbox::fork_mapper`].
struct Mapper {
    pid: libc::pid_t,
    go: libc::c_int,
}

impl Mapper {
    /// Lets the helper write the maps and waits for it.
    fn map_now(self) -> io::Result<()> {
        // SAFETY: write/close/waitpid on our own pipe and child.
        unsafe {
            let wrote = libc::write(self.go, b"g".as_ptr().cast(), 1);
            libc::close(self.go);
            let mut status = 0;
            check(libc::waitpid(self.pid, &mut status, 0))?;
            if wrote != 1 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
        }
        Ok(())
    }
}

/// `/proc/<pid>/<file>` NUL-terminated in a fixed buffer (no allocation between fork and
/// exec).
fn proc_path(pid: libc::pid_t, file: &str) -> [u8; 48] {
    let mut out = [0u8; 48];
    let mut digits = [0u8; 12];
    let mut n = pid.unsigned_abs();
    let mut d = 0;
    loop {
        digits[d] = b'0' + (n % 10) as u8;
        d += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let path = b"/proc/".iter().chain(digits[..d].iter().rev()).chain(b"/".iter()).chain(file.as_bytes());
    for (i, &b) in path.enumerate() {
        out[i] = b;
    }
    out
}

/// The limits no policy sets, each fixed (soft and hard) at Linux's usual default, or at
/// the broker's hard limit where that is lower: a copy that reads them sees the same on
/// every host, not the broker's (`ulimit -s` of whoever started it).
const FIXED_LIMITS: [(libc::__rlimit_resource_t, u64); 10] = [
    (libc::RLIMIT_STACK, 8 << 20),
    (libc::RLIMIT_FSIZE, libc::RLIM_INFINITY),
    (libc::RLIMIT_DATA, libc::RLIM_INFINITY),
    (libc::RLIMIT_RSS, libc::RLIM_INFINITY),
    (libc::RLIMIT_MEMLOCK, 8 << 20),
    (libc::RLIMIT_LOCKS, libc::RLIM_INFINITY),
    (libc::RLIMIT_MSGQUEUE, 819_200),
    (libc::RLIMIT_NICE, 0),
    (libc::RLIMIT_RTPRIO, 0),
    (libc::RLIMIT_RTTIME, libc::RLIM_INFINITY),
];

/// As host root: raises each hard limit that stands below a value the germline sets, the
/// policy's limits and (with `fixed`) [`FIXED_LIMITS`], so that a broker or `germline
/// verify` started under lower ones (`prlimit`, a container's) gives its germline the same
/// limits as any other, and is not refused for them.
fn lift_hard_limits(limits: &ResourceLimits, fixed: bool) -> io::Result<()> {
    use libc::*;
    let policy = [
        (RLIMIT_AS, limits.memory_bytes),
        (RLIMIT_NPROC, limits.processes),
        (RLIMIT_CPU, limits.cpu_seconds),
        (RLIMIT_NOFILE, limits.open_files),
    ];
    let fixed: &[(__rlimit_resource_t, u64)] = if fixed { &FIXED_LIMITS } else { &[] };
    for &(res, val) in policy.iter().chain(fixed) {
        let mut now = rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: valid pointer to a local rlimit.
        check(unsafe { getrlimit(res, &mut now) })?;
        if now.rlim_max < val {
            // SAFETY: valid pointer to a local rlimit. Raising a hard limit needs
            // CAP_SYS_RESOURCE, which host root may lack (a container's): the limit then
            // stays, a fixed one lower ([`clamped_fixed_limits`] records it) and a policy's
            // refused by name before the germline was forked ([`hard_limits_allow`]).
            let rc = unsafe { setrlimit(res, &rlimit { rlim_cur: now.rlim_cur, rlim_max: val }) };
            if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(EPERM) {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Address-space layout randomization, whatever the starter chose (`setarch -R` sets the
/// personality flag that turns it off, and it is inherited): with it off, every germline of
/// a release, the call's and its replays', would lay out its memory alike, and a request
/// carrying an address would replay at the host as it never does elsewhere. The system-wide
/// switch (`kernel.randomize_va_space`) is the machine's ([`crate::evidence::Machine`]).
fn randomized_layout() -> io::Result<()> {
    // SAFETY: personality with 0xffffffff only reads the current persona.
    let persona = unsafe { libc::personality(0xffff_ffff) };
    check(persona)?;
    let off = libc::ADDR_NO_RANDOMIZE as libc::c_int;
    if persona & off != 0 {
        // SAFETY: plain syscall with a persona derived from the current one.
        check(unsafe { libc::personality((persona & !off) as libc::c_ulong) })?;
    }
    Ok(())
}

/// `CAP_SYS_RESOURCE` (linux/capability.h).
const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process may raise its hard limits (CAP_SYS_RESOURCE in its effective set).
fn may_raise_limits() -> bool {
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
    })
}

/// Refuses, naming it, a policy limit above this process's hard limit where it may not
/// raise it (no CAP_SYS_RESOURCE: a broker that is not root, or a container's root): the
/// germline would otherwise fail to start with the bare error of `setrlimit`.
pub fn hard_limits_allow(limits: &ResourceLimits) -> Result<(), String> {
    if may_raise_limits() {
        return Ok(());
    }
    let named = [
        ("address space (RLIMIT_AS, [limits] memory_mb)", libc::RLIMIT_AS, limits.memory_bytes),
        ("processes (RLIMIT_NPROC, [limits] processes)", libc::RLIMIT_NPROC, limits.processes),
        ("CPU seconds (RLIMIT_CPU, [limits] cpu_seconds)", libc::RLIMIT_CPU, limits.cpu_seconds),
        ("open files (RLIMIT_NOFILE)", libc::RLIMIT_NOFILE, limits.open_files),
    ];
    for (what, res, val) in named {
        let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: valid pointer to a local rlimit.
        if unsafe { libc::getrlimit(res, &mut now) } == 0 && now.rlim_max < val {
            return Err(format!(
                "the germline's {what} limit is {val}, above this process's hard limit {} (which it may not \
                 raise without CAP_SYS_RESOURCE): raise the hard limit for the broker (ulimit -H, prlimit)",
                now.rlim_max
            ));
        }
    }
    Ok(())
}

/// The limits of [`FIXED_LIMITS`] this process's germlines get below their fixed value
/// (name=value), because the broker's hard limits are lower and it may not raise them (no
/// CAP_SYS_RESOURCE): what the machine's starter chose, recorded as the machine's
/// ([`crate::evidence::Machine`]).
pub fn clamped_fixed_limits() -> Vec<String> {
    if may_raise_limits() {
        return Vec::new();
    }
    let name = |res| match res {
        libc::RLIMIT_STACK => "stack",
        libc::RLIMIT_FSIZE => "fsize",
        libc::RLIMIT_DATA => "data",
        libc::RLIMIT_RSS => "rss",
        libc::RLIMIT_MEMLOCK => "memlock",
        libc::RLIMIT_LOCKS => "locks",
        libc::RLIMIT_MSGQUEUE => "msgqueue",
        libc::RLIMIT_NICE => "nice",
        libc::RLIMIT_RTPRIO => "rtprio",
        _ => "rttime",
    };
    let mut out = Vec::new();
    for (res, val) in FIXED_LIMITS {
        let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: valid pointer to a local rlimit.
        if unsafe { libc::getrlimit(res, &mut now) } == 0 && now.rlim_max < val {
            out.push(format!("{}={}", name(res), now.rlim_max));
        }
    }
    out
}

fn fixed_limits() -> io::Result<()> {
    for (res, val) in FIXED_LIMITS {
        let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: valid pointer to a local rlimit.
        check(unsafe { libc::getrlimit(res, &mut now) })?;
        let v = val.min(now.rlim_max);
        // SAFETY: valid pointer to a local rlimit; never above the current hard limit.
        check(unsafe { libc::setrlimit(res, &libc::rlimit { rlim_cur: v, rlim_max: v }) })?;
    }
    Ok(())
}

/// Debug builds only ("mechanism off"): `GERMLINE_TEST_HOST_MACHINE=1` gives the germline
/// the broker's host name, time zone, stack and other unset limits, umask and ignored
/// signals, and leaves its trigger evidence without the deployment
/// ([`crate::evidence::Deployment`]), as before: what a third party's replay then fails
/// to reproduce.
pub fn host_machine_for_tests() -> bool {
    crate::test_switch("GERMLINE_TEST_HOST_MACHINE")
}

/// Signal actions as no one set them: an ignored signal stays ignored across exec (`nohup`
/// ignores SIGHUP), and a copy could read back how the broker was started. Every signal
/// gets its default action and none is blocked.
fn default_signal_actions() {
    // SAFETY: signal and sigprocmask are async-signal-safe and take plain values; signal
    // fails harmlessly for SIGKILL, SIGSTOP and the C library's own signals.
    unsafe {
        for sig in 1..=libc::SIGRTMAX() {
            libc::signal(sig, libc::SIG_DFL);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

/// What the germline's monotonic and boot clocks read as it starts (seconds): the same on
/// every host, rather than how long the host has been up.
pub const CLOCKS_AT_START: i64 = 86_400;

/// Moves the germline into a time namespace of its own whose monotonic and boot clocks
/// read [`CLOCKS_AT_START`] now: every germline, the call's, its replay's and a third
/// party's, starts its boot clocks alike, where the host's would tell when the host booted
/// (and a replay on another machine would not reproduce a request carrying it). A kernel
/// without time namespaces leaves the host's clocks (its build is the machine's, in the
/// opening). Runs in the forked child: no allocation.
fn fixed_boot_clocks() -> io::Result<()> {
    use libc::*;
    // SAFETY: plain syscall; the new namespace is for this process's children until the
    // setns below.
    if unsafe { unshare(CLONE_NEWTIME) } != 0 {
        let e = io::Error::last_os_error();
        return if matches!(e.raw_os_error(), Some(EINVAL) | Some(ENOSYS)) { Ok(()) } else { Err(e) };
    }
    // The new namespace starts with the offsets of the one this process is in (a broker or
    // `germline verify` run in a time namespace of its own), and an offset is taken from
    // the host's clock: the clock this process reads, less its offset.
    let inherited = time_offsets()?;
    let mut text = [0u8; 96];
    let mut at = 0usize;
    let mut put = |bytes: &[u8]| {
        text[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    const NS: i128 = 1_000_000_000;
    for (i, (name, clock)) in
        [(&b"monotonic "[..], CLOCK_MONOTONIC), (&b"boottime "[..], CLOCK_BOOTTIME)].into_iter().enumerate()
    {
        let mut now = timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: valid pointer to a local timespec.
        check(unsafe { clock_gettime(clock, &mut now) })?;
        let here = i128::from(now.tv_sec) * NS + i128::from(now.tv_nsec);
        let (off_sec, off_nsec) = inherited[i];
        let host = here - (i128::from(off_sec) * NS + i128::from(off_nsec));
        let offset = i128::from(CLOCKS_AT_START) * NS - host;
        let (sec, nsec) = (offset.div_euclid(NS) as i64, offset.rem_euclid(NS) as i64);
        put(name);
        let mut digits = [0u8; 24];
        put(decimal(sec, &mut digits));
        put(b" ");
        put(decimal(nsec, &mut digits));
        put(b"\n");
    }
    // SAFETY: open/write/close on a constant path and a local buffer.
    unsafe {
        let fd = open(c"/proc/self/timens_offsets".as_ptr(), O_WRONLY | O_CLOEXEC);
        check(fd)?;
        let wrote = write(fd, text.as_ptr().cast(), at);
        close(fd);
        if wrote != at as isize {
            return Err(if wrote < 0 { io::Error::last_os_error() } else { io::Error::from_raw_os_error(EIO) });
        }
        let ns = open(c"/proc/self/ns/time_for_children".as_ptr(), O_RDONLY | O_CLOEXEC);
        check(ns)?;
        let joined = setns(ns, CLONE_NEWTIME);
        let e = io::Error::last_os_error();
        close(ns);
        if joined != 0 {
            return Err(e);
        }
    }
    Ok(())
}

/// The monotonic and boot-time offsets (seconds, nanoseconds) of the time namespace this
/// process's children start in, as `/proc/self/timens_offsets` lists them. No allocation.
fn time_offsets() -> io::Result<[(i64, i64); 2]> {
    use libc::*;
    let mut buf = [0u8; 256];
    // SAFETY: open/read/close on a constant path into a local buffer.
    let n = unsafe {
        let fd = open(c"/proc/self/timens_offsets".as_ptr(), O_RDONLY | O_CLOEXEC);
        check(fd)?;
        let n = read(fd, buf.as_mut_ptr().cast(), buf.len());
        close(fd);
        n
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let number = |f: Option<&[u8]>| -> io::Result<i64> {
        let f = f.ok_or_else(|| io::Error::from_raw_os_error(EINVAL))?;
        let (negative, digits) = match f.split_first() {
            Some((b'-', rest)) => (true, rest),
            _ => (false, f),
        };
        let mut v: i64 = 0;
        for &d in digits {
            if !d.is_ascii_digit() {
                return Err(io::Error::from_raw_os_error(EINVAL));
            }
            v = v
                .checked_mul(10)
                .and_then(|v| v.checked_add(i64::from(d - b'0')))
                .ok_or_else(|| io::Error::from_raw_os_error(ERANGE))?;
        }
        Ok(if negative { -v } else { v })
    };
    let mut out = [(0, 0); 2];
    for line in buf[..n as usize].split(|&b| b == b'\n') {
        let mut fields = line.split(|&b| b == b' ' || b == b'\t').filter(|f| !f.is_empty());
        let i = match fields.next() {
            Some(b"monotonic") => 0,
            Some(b"boottime") => 1,
            _ => continue,
        };
        out[i] = (number(fields.next())?, number(fields.next())?);
    }
    Ok(out)
}

/// `n` in decimal, written at the end of `buf`, without allocating.
fn decimal(n: i64, buf: &mut [u8; 24]) -> &[u8] {
    let mut i = buf.len();
    let mut m = n.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (m % 10) as u8;
        m /= 10;
        if m == 0 {
            break;
        }
    }
    if n < 0 {
        i -= 1;
        buf[i] = b'-';
    }
    &buf[i..]
}

/// The germline's host and domain name, in its own UTS namespace: the same on every host.
pub const HOST_NAME: &str = "germline";

fn fixed_host_name() -> io::Result<()> {
    let domain = b"(none)";
    // SAFETY: pointers to constant buffers with their lengths.
    check(unsafe { libc::sethostname(HOST_NAME.as_ptr().cast(), HOST_NAME.len()) })?;
    // SAFETY: as above.
    check(unsafe { libc::setdomainname(domain.as_ptr().cast(), domain.len()) })
}

/// Test-only switch ("mechanism off"): leave RLIMIT_SIGPENDING as the broker's, as before
/// the kernel-channel pass. Never set outside tests.
pub static SIGNAL_QUEUE_LIMITS_OFF_FOR_TESTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Signals the germline and each of its copies may have queued at once (RLIMIT_SIGPENDING,
/// soft and hard): plenty for a Python server, which queues a handful.
const PENDING_SIGNALS: u64 = 1024;

/// Queued signals are counted per user namespace level (ucounts), and each level's limit
/// is the RLIMIT_SIGPENDING its creator had when it made the namespace. The germline's
/// user namespace hangs below the host's, where every germline and copy is the one
/// sandbox uid: with the broker's own limit there (96362 on the test host), a copy that
/// keeps many real-time signals queued moves how many a copy of another release can queue
/// (96 of 96 bits, `redteam_kernel`). The seccomp allowlist refuses real-time signals and
/// caller-made siginfo, which leaves only standard signals (at most one queued per signal
/// and thread); in addition the creator's limit is lifted before `unshare(CLONE_NEWUSER)`
/// where the broker may (CAP_SYS_RESOURCE; else the soft limit goes up to the hard one)
/// and the germline's own limit is set after it ([`PENDING_SIGNALS`]), so each germline
/// and its copies count against their own limits first.
fn unshared_signal_queue(host_root: bool) -> io::Result<()> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: get/setrlimit on a local struct.
    unsafe {
        check(libc::getrlimit(libc::RLIMIT_SIGPENDING, &mut lim))?;
        if host_root {
            let lifted = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
            if libc::setrlimit(libc::RLIMIT_SIGPENDING, &lifted) == 0 {
                return Ok(());
            }
        }
        lim.rlim_cur = lim.rlim_max;
        check(libc::setrlimit(libc::RLIMIT_SIGPENDING, &lim))
    }
}

/// Host root gives up root for good: no supplementary groups, then gid, then uid (the
/// order matters: changing the gid needs the capability the uid change drops). The
/// process is then made dumpable again so it may write its own user namespace's maps
/// (execve recomputes that flag anyway).
fn become_sandbox_ids(ids: SandboxIds) -> io::Result<()> {
    // SAFETY: id syscalls with plain integer arguments and local out-parameters.
    unsafe {
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setresgid(ids.gid, ids.gid, ids.gid))?;
        check(libc::setresuid(ids.uid, ids.uid, ids.uid))?;
        let (mut r, mut e, mut s) = (0, 0, 0);
        check(libc::getresuid(&mut r, &mut e, &mut s))?;
        let (mut gr, mut ge, mut gs) = (0, 0, 0);
        check(libc::getresgid(&mut gr, &mut ge, &mut gs))?;
        let groups = libc::getgroups(0, std::ptr::null_mut());
        if [r, e, s] != [ids.uid; 3] || [gr, ge, gs] != [ids.gid; 3] || groups != 0 {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        check(libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0))?;
    }
    Ok(())
}

fn create_file(p: &CString, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: open/write/close on a NUL-terminated path and a live buffer.
    unsafe {
        let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o444);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut off = 0;
        while off < bytes.len() {
            let n = libc::write(fd, bytes[off..].as_ptr().cast(), bytes.len() - off);
            if n <= 0 {
                let e = io::Error::last_os_error();
                libc::close(fd);
                return Err(e);
            }
            off += n as usize;
        }
        libc::close(fd);
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_for(
        read_only: &[&Path],
        data_roots: &[&Path],
        minimal_root: bool,
    ) -> Result<RootPlan<'static>, ExecutorError> {
        let mut plan = RootPlan::new(Path::new("/stage"));
        let mut paths: Vec<PathBuf> = read_only.iter().map(|p| p.to_path_buf()).collect();
        paths.sort();
        for p in &paths {
            plan.bind(p, "read-only path")?;
        }
        if minimal_root {
            plan.minimal_etc()?;
        }
        for r in data_roots {
            if minimal_root {
                plan.empty_data_root(r)?;
            } else {
                plan.plain_data_root(r)?;
            }
        }
        Ok(plan)
    }

    #[test]
    fn temporary_directories_lead_to_the_copies_scratch_where_free() {
        let usr = [PathBuf::from("/usr")];
        let mut plan = plan_for(&[Path::new("/usr")], &[], true).unwrap();
        assert_eq!(plan.scratch(&usr, &[], &[]).unwrap(), Some(PathBuf::from(SCRATCH_DIR)));
        for link in ["/tmp", "/var/tmp"] {
            assert!(plan.what.iter().any(|w| w == &format!("linking {link} to the copies' scratch")), "{link}");
        }
        let data = [PathBuf::from("/tmp/app/data")];
        let mut plan = plan_for(&[Path::new("/usr")], &[Path::new("/tmp/app/data")], true).unwrap();
        assert_eq!(plan.scratch(&usr, &data, &[]).unwrap(), Some(PathBuf::from(SCRATCH_DIR)));
        assert!(!plan.what.iter().any(|w| w.starts_with("linking /tmp ")), "a data root lies under /tmp");
        assert!(plan.what.iter().any(|w| w.starts_with("linking /var/tmp ")));
        assert_eq!(scratch_dir(&[PathBuf::from("/.germline-scratch/x")], &[]), None);
    }

    #[test]
    fn declared_scratch_paths_link_into_the_scratch_where_free() {
        let usr = [PathBuf::from("/usr")];
        let mut plan = plan_for(&[Path::new("/usr")], &[], true).unwrap();
        let declared = [PathBuf::from("/var/cache/indexer")];
        plan.scratch(&usr, &[], &declared).unwrap();
        assert!(plan.what.iter().any(|w| w == "linking scratch path /var/cache/indexer to the scratch"));
        assert_eq!(scratch_target(&declared[0]), Path::new("/.germline-scratch/tmp/.germline/var/cache/indexer"));
        for bad in ["/usr/share/x", "/", "relative", "/var/../etc", "/.germline-scratch/tmp/x", "/tmp"] {
            let mut plan = plan_for(&[Path::new("/usr")], &[], true).unwrap();
            let e = plan.scratch(&usr, &[], &[PathBuf::from(bad)]).unwrap_err().to_string();
            assert!(e.contains("scratch path"), "{bad}: {e}");
        }
    }

    #[test]
    fn relocated_paths_are_bound_beneath_the_layout_directory_only() {
        let host = tempfile::tempdir().unwrap();
        let release = host.path().join("unpacked").join("rel");
        std::fs::create_dir_all(release.join("pkg")).unwrap();
        std::fs::write(release.join("server.py"), "").unwrap();
        let release = release.canonicalize().unwrap();
        let mut relocate = Relocations::default();
        relocate.add(&release, Path::new(RELEASE_IN_ROOT));
        assert_eq!(relocate.in_root(&release.join("pkg/m.py")), Path::new("/.germline/release/pkg/m.py"));
        assert_eq!(relocate.on_host(Path::new("/.germline/release/pkg")), release.join("pkg"));
        assert_eq!(relocate.in_root(Path::new("/usr/lib")), Path::new("/usr/lib"));
        let mut plan = RootPlan::new(Path::new("/stage"));
        plan.relocate = relocate.clone();
        for p in [&release, &release.join("pkg"), &release.join("server.py")] {
            plan.bind(p, "read-only path").unwrap();
        }
        plan.bind(Path::new("/usr"), "read-only path").unwrap();
        assert_eq!(plan.nodes.get(Path::new(RELEASE_IN_ROOT)), Some(&Node::HostDir));
        assert_eq!(plan.nodes.get(Path::new(LAYOUT_DIR)), Some(&Node::Dir));
        assert!(!plan.nodes.keys().any(|n| n.starts_with(host.path())), "the host path is not in the root");
        let binds: Vec<(String, String)> = plan
            .ops
            .iter()
            .filter_map(|op| match op {
                RootOp::Bind(from, to) => {
                    Some((from.to_string_lossy().into_owned(), to.to_string_lossy().into_owned()))
                }
                _ => None,
            })
            .collect();
        assert!(binds.contains(&(release.display().to_string(), "/stage/.germline/release".to_owned())), "{binds:?}");
        assert!(binds.iter().all(|(_, to)| !to.contains("unpacked")), "{binds:?}");
        // Nothing else may lie at, beneath or above the layout directory.
        let ro = [release.clone(), PathBuf::from("/usr")];
        assert!(layout_free(&ro, &relocate, &[], &[]).is_ok());
        let e = layout_free(&ro, &relocate, &[PathBuf::from("/.germline/data")], &[]).unwrap_err().to_string();
        assert!(e.contains(LAYOUT_DIR), "{e}");
        assert!(layout_free(&[PathBuf::from("/.germline")], &relocate, &[], &[]).is_err());
        assert!(layout_free(&ro, &relocate, &[], &[PathBuf::from("/.germline/x")]).is_err());
        assert!(layout_free(&ro, &relocate, &[PathBuf::from("/")], &[]).is_err());
    }

    fn err(r: Result<RootPlan<'static>, ExecutorError>) -> String {
        r.err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn the_minimal_root_has_its_own_etc_and_binds_no_host_secret() {
        let plan = plan_for(&[Path::new("/usr")], &[Path::new("/etc/app/finance")], true).unwrap();
        assert_eq!(plan.nodes.get(Path::new("/etc")), Some(&Node::Dir), "/etc is the root's own");
        assert_eq!(plan.nodes.get(Path::new("/etc/passwd")), Some(&Node::File));
        assert!(plan.binds.iter().all(|b| !b.starts_with("/etc") || HOST_ETC.iter().any(|h| b.starts_with(h))));
        assert!(!plan.binds.iter().any(|b| b == Path::new("/etc/shadow") || b == Path::new("/etc")));
        assert!(plan.what.last().is_some_and(|w| w.contains("empty tmpfs over data root /etc/app/finance")));
        // The time zone is the root's own, not the host's.
        assert_eq!(plan.nodes.get(Path::new("/etc/localtime")), Some(&Node::File));
        assert!(!plan.binds.iter().any(|b| b.ends_with("localtime") || b.ends_with("timezone")));
    }

    #[test]
    fn the_roots_time_zone_is_utc_as_tzdata_writes_it() {
        let tz = UTC_TZIF.as_bytes();
        // RFC 8536: two blocks of header (44 bytes), one type (6) and "UTC\0", a footer.
        assert_eq!(tz.len(), 2 * (44 + 6 + 4) + 6);
        assert!(tz.starts_with(b"TZif2") && tz[54..].starts_with(b"TZif2") && tz.ends_with(b"\nUTC0\n"));
        assert_eq!(&tz[36..44], &[0, 0, 0, 1, 0, 0, 0, 4], "one type, four designation bytes");
        if let Ok(tzdata) = std::fs::read("/usr/share/zoneinfo/Etc/UTC") {
            assert_eq!(tz, &tzdata[..], "as tzdata writes Etc/UTC");
        }
    }

    #[test]
    fn nothing_is_created_beneath_a_host_mount() {
        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path().join("host");
        std::fs::create_dir_all(host.join("present")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), host.join("link")).unwrap();
        let ok = plan_for(&[&host], &[&host.join("present")], true).unwrap();
        assert!(!ok.ops.iter().any(|op| matches!(op, RootOp::Mkdir(p) if p.to_bytes().ends_with(b"/present"))));
        let missing = err(plan_for(&[&host], &[&host.join("absent/finance")], true));
        assert!(missing.contains(&format!("{} cannot be used", host.join("absent").display())), "{missing}");
        assert!(missing.contains("never creates anything on the host"), "{missing}");
        assert!(missing.contains(&format!("lies under {}", host.display())), "{missing}");
        let link = err(plan_for(&[&host], &[&host.join("link/finance")], true));
        assert!(link.contains(&format!("{} on the host is a symbolic link", host.join("link").display())), "{link}");
        let hides = err(plan_for(&[&host], &[tmp.path()], true));
        assert!(hides.contains(&format!("would hide {}", host.display())), "{hides}");
        // Mechanism off: the plain directory is made wherever it sits.
        let off = plan_for(&[&host], &[&host.join("absent/finance")], false).unwrap();
        assert!(off.ops.iter().any(|op| matches!(op, RootOp::Mkdir(p) if p.to_bytes().ends_with(b"/absent/finance"))));
    }

    #[test]
    fn sandbox_ids_are_never_root() {
        assert_eq!(SandboxIds::parse("65534:65534").unwrap(), SandboxIds::DEFAULT);
        assert_eq!(SandboxIds::parse("1000:100").unwrap(), SandboxIds { uid: 1000, gid: 100 });
        for bad in ["0:0", "0:65534", "65534:0", "nobody", "1:x", "4294967295:1"] {
            assert!(SandboxIds::parse(bad).unwrap_err().to_string().contains(SANDBOX_IDS_VAR), "{bad}");
        }
    }
}
