//! The germline process: a release's MCP server, imported once inside the sandbox, from
//! which every copy is forked. The broker treats it as hostile (DESIGN §5): it stops the
//! germline with SIGSTOP whenever it is not forking, checks G1–G3 from `/proc` before and
//! after every fork, and identifies the copy and its namespaces by what the kernel shows.
//!
//! The control channel is signals, not a descriptor: the germline stops itself when it
//! is ready and after each fork, and the broker asks for a fork with SIGUSR1 + SIGCONT.
//! Any descriptor the germline held at a fork would be one open file description shared
//! with the copy, whose options and queue a copy that has seen an item could change and
//! the germline or a later copy read; so the germline holds none (G2).

use std::collections::BTreeSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cgroup::{CgroupLimits, CgroupSet, CopyCgroup, Departure};
use crate::confine::{Confinement, ResourceLimits, SandboxSwitches};
use crate::ids::{IdBlock, IdLease};
use crate::inspect::{self, AllowedFds, NsId, COPY_NAMESPACES};
use crate::outside::{CopyIds, CopyScratch};
use crate::seccomp::SeccompPolicy;
use crate::timings::CopyTimings;
use crate::{ExecutorError, CHANNEL_PORT, PROXY_PORT};

/// The Python tool host and helper module, shipped inside the binary.
const HOST_PY: &str = include_str!("../python/germline_host.py");
const SLOT_PY: &str = include_str!("../python/germline_slot.py");

/// Where the interpreter and shim live; everything here is read-only to the germline.
#[derive(Clone, Debug)]
pub struct PythonRuntime {
    /// The interpreter to run.
    pub python: PathBuf,
    /// Directory holding `germline_host.py` and `germline_slot.py`.
    pub shim_dir: PathBuf,
    /// Paths the interpreter needs to read (prefixes, stdlib, site-packages).
    pub read_paths: Vec<PathBuf>,
    /// Where the interpreter says it reads from (for a resident root, [`crate::resident`]).
    pub layout: InterpreterLayout,
}

/// The interpreter's own account of its paths (`sys.prefix`, `sys.base_prefix`, `sys.path`).
#[derive(Clone, Debug, Default)]
pub struct InterpreterLayout {
    /// `sys.prefix` (a venv's directory under a venv).
    pub prefix: PathBuf,
    /// `sys.base_prefix`.
    pub base_prefix: PathBuf,
    /// `sys.path`, empty entries left out.
    pub sys_path: Vec<PathBuf>,
}

impl PythonRuntime {
    /// Finds the interpreter (`GERMLINE_PYTHON`, else `./.venv/bin/python` as made by
    /// `scripts/setup.sh`, else `python3`), asks it where it reads
    /// from, and writes the shim into `shim_root` (content-addressed, so a tampered copy
    /// is never reused).
    pub fn discover(shim_root: &Path) -> Result<PythonRuntime, ExecutorError> {
        let python = match std::env::var_os("GERMLINE_PYTHON") {
            Some(p) => PathBuf::from(p),
            // Absolute, not resolved: a venv's `python` is a symlink to its base
            // interpreter, and only the link's own path makes it the venv's (with its
            // packages, the MCP SDK among them).
            None if Path::new(".venv/bin/python").exists() => {
                std::path::absolute(".venv/bin/python").map_err(ExecutorError::io("the path of .venv/bin/python"))?
            }
            None => PathBuf::from("python3"),
        };
        let python = if python.is_absolute() { python } else { which(&python)? };
        Self::at(python, shim_root)
    }

    /// The runtime of the interpreter `python` (an absolute path), with the shim written
    /// into `shim_root`.
    pub fn at(python: PathBuf, shim_root: &Path) -> Result<PythonRuntime, ExecutorError> {
        let out = Command::new(&python)
            .args(["-I", "-c", "import sys,json;print(json.dumps([sys.executable,sys.prefix,sys.base_prefix,sys.exec_prefix,sys.base_exec_prefix]+sys.path))"])
            .stdin(Stdio::null())
            .output()
            .map_err(ExecutorError::io(format!("running {}", python.display())))?;
        if !out.status.success() {
            return Err(ExecutorError::Sandbox(format!(
                "{} failed: {}",
                python.display(),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let paths: Vec<String> = serde_json::from_slice(&out.stdout)
            .map_err(|e| ExecutorError::Sandbox(format!("interpreter paths: {e}")))?;
        // A launcher script (a pyenv or asdf shim: `#!/usr/bin/env bash`, then a version
        // manager picks the interpreter) runs neither in the germline's root, which holds
        // no version manager, nor as the interpreter it names: the germline runs what the
        // script ran, `sys.executable`. (A venv's `python` is a symlink to a binary, not a
        // script, and is kept as it is: only its own path makes it the venv's.)
        let python = match paths.first().map(PathBuf::from) {
            Some(real) if is_script(&python) && real.is_absolute() && real.is_file() => {
                tracing::info!("{} is a launcher script; the germline runs {}", python.display(), real.display());
                real
            }
            _ => python,
        };
        let mut read: BTreeSet<PathBuf> = BTreeSet::new();
        for p in paths.iter().filter(|p| !p.is_empty()) {
            let pb = PathBuf::from(p);
            if pb.exists() {
                read.insert(pb.canonicalize().unwrap_or(pb.clone()));
                read.insert(pb);
            }
        }
        if let Ok(real) = python.canonicalize() {
            if let Some(dir) = real.parent() {
                read.insert(dir.to_path_buf());
            }
        }
        // System libraries the interpreter and its extensions load. (Host `/etc` is not
        // among them: the germline's root has a minimal `/etc` of its own.)
        for sys in ["/usr", "/lib", "/lib64", "/bin", "/sbin"] {
            if Path::new(sys).exists() {
                read.insert(PathBuf::from(sys));
            }
        }
        let shim_dir = write_shim(shim_root)?;
        read.insert(shim_dir.clone());
        let read_paths = fold_nested(read);
        let at = |i: usize| paths.get(i).map(PathBuf::from).unwrap_or_default();
        let layout = InterpreterLayout {
            prefix: at(1),
            base_prefix: at(2),
            sys_path: paths.iter().skip(5).filter(|p| !p.is_empty()).map(PathBuf::from).collect(),
        };
        Ok(PythonRuntime { python, shim_dir, read_paths, layout })
    }
}

impl PythonRuntime {
    /// One line on the interpreter, for figures and diagnostics: its version and path, and
    /// whether its germlines make their heap immortal before forking (CPython 3.12 and
    /// 3.13, unless switched off; see [`IMMORTAL_HEAP_OFF`]).
    pub fn describe(&self) -> String {
        let probe = "import sys; sys.path.insert(0, sys.argv[1]); import germline_host as g; \
                     print(sys.version.split()[0], g._immortal_refcount() is not None)";
        let out =
            Command::new(&self.python).args(["-I", "-c", probe]).arg(&self.shim_dir).stdin(Stdio::null()).output();
        let text = match &out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
            _ => return format!("{} (did not answer)", self.python.display()),
        };
        let (version, capable) = text.split_once(' ').unwrap_or((text.as_str(), "False"));
        let heap = match (capable == "True", immortal_heap_off()) {
            (true, false) => "immortal heap: on",
            (true, true) => "immortal heap: off (switched off)",
            (false, _) => "immortal heap: not available (CPython 3.12 or 3.13 only)",
        };
        format!("Python {version} ({}), {heap}", self.python.display())
    }
}

/// Whether `path` is a script (starts with `#!`) rather than a binary.
fn is_script(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head)).is_ok() && &head == b"#!"
}

fn which(name: &Path) -> Result<PathBuf, ExecutorError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| ExecutorError::Sandbox(format!("{} not found on PATH", name.display())))
}

fn fold_nested(set: BTreeSet<PathBuf>) -> Vec<PathBuf> {
    let all: Vec<PathBuf> = set.into_iter().collect();
    all.iter().filter(|p| !all.iter().any(|o| o != *p && p.starts_with(o))).cloned().collect()
}

impl PythonRuntime {
    /// This runtime with a shim of its own written into `root` (new files: their own
    /// inode numbers and times).
    pub fn with_shim_in(&self, root: &Path) -> Result<PythonRuntime, ExecutorError> {
        let shim_dir = write_shim(root)?;
        let mut read: BTreeSet<PathBuf> = self.read_paths.iter().filter(|p| **p != self.shim_dir).cloned().collect();
        read.insert(shim_dir.clone());
        Ok(PythonRuntime { shim_dir, read_paths: fold_nested(read), ..self.clone() })
    }
}

/// Copies a release directory to `to` (which must not exist) as its canonical archive holds
/// it: directories 0755, files 0644 or 0755 as they are executable, links as links, in name
/// order, byte code left out ([`germline_model::left_out_of_release`]). Anything else is
/// refused.
pub fn copy_release(from: &Path, to: &Path) -> Result<(), ExecutorError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |what: &str, p: &Path| ExecutorError::io(format!("copying the release: {what} {}", p.display()));
    let set =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).map_err(io("mode of", p));
    std::fs::create_dir(to).map_err(io("creating", to))?;
    set(to, 0o755)?;
    let mut entries: Vec<std::fs::DirEntry> =
        std::fs::read_dir(from).map_err(io("listing", from))?.collect::<Result<_, _>>().map_err(io("listing", from))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if germline_model::left_out_of_release(&e.file_name().to_string_lossy()) {
            continue;
        }
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let meta = std::fs::symlink_metadata(&src).map_err(io("reading", &src))?;
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&src).map_err(io("reading", &src))?;
            std::os::unix::fs::symlink(target, &dst).map_err(io("linking", &dst))?;
        } else if meta.is_dir() {
            copy_release(&src, &dst)?;
        } else if meta.is_file() {
            std::fs::copy(&src, &dst).map_err(io("copying", &src))?;
            set(&dst, if meta.permissions().mode() & 0o111 != 0 { 0o755 } else { 0o644 })?;
        } else {
            return Err(ExecutorError::Sandbox(format!(
                "copying the release: {} is neither a file, a directory nor a link",
                src.display()
            )));
        }
    }
    Ok(())
}

fn write_shim(root: &Path) -> Result<PathBuf, ExecutorError> {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::PermissionsExt;
    let mut h = Sha256::new();
    h.update(HOST_PY);
    h.update(SLOT_PY);
    let dir = root.join(format!("shim-{}", &hex::encode(h.finalize())[..16]));
    let want = [("germline_host.py", HOST_PY), ("germline_slot.py", SLOT_PY)];
    // Modes are set, not left to the umask: the sandbox ids read the shim.
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777).ok();
    let intact = mode(&dir) == Some(0o755)
        && want.iter().all(|(n, c)| {
            std::fs::read_to_string(dir.join(n)).is_ok_and(|s| s == *c) && mode(&dir.join(n)) == Some(0o644)
        });
    if !intact {
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
                .map_err(ExecutorError::io(format!("setting the mode of {}", p.display())))
        };
        std::fs::create_dir_all(&dir).map_err(ExecutorError::io(format!("creating {}", dir.display())))?;
        set(&dir, 0o755)?;
        for (n, c) in want {
            let tmp = dir.join(format!(".{n}.tmp{}", std::process::id()));
            std::fs::write(&tmp, c).map_err(ExecutorError::io(format!("writing {}", tmp.display())))?;
            set(&tmp, 0o644)?;
            std::fs::rename(&tmp, dir.join(n)).map_err(ExecutorError::io("installing shim"))?;
        }
    }
    Ok(dir)
}

/// How to start one germline.
#[derive(Clone, Debug)]
pub struct GermlineSpec {
    /// The interpreter and shim.
    pub runtime: PythonRuntime,
    /// The (admitted or local) release directory.
    pub release_dir: PathBuf,
    /// Directories that may hold user data (shadowed by empty tmpfs in the germline).
    pub data_roots: Vec<PathBuf>,
    /// Limits inherited by every copy.
    pub limits: ResourceLimits,
    /// How long importing the release may take.
    pub start_timeout: Duration,
    /// Extra CA bundle path (HTTPS through the broker), read-only.
    pub extra_read: Vec<PathBuf>,
    /// Per-copy cgroup limits, used where the host lets the broker write cgroups.
    pub cgroup_limits: Option<CgroupLimits>,
    /// Sandbox mechanisms; all on except in tests that show what one prevents.
    pub switches: SandboxSwitches,
    /// Refuse to start where no cgroup enforces `cgroup_limits` (`[limits] require_limits`).
    pub require_limits: bool,
    /// The syscall filter: [`SeccompPolicy::germline`] except in "mechanism off" tests.
    pub seccomp: SeccompPolicy,
    /// Further environment for the germline (and so every copy), set before the release
    /// is imported: the manifest's `[release] env`, then the policy's `[environment]`, which
    /// wins ([`germline_environment`]).
    pub env: Vec<(String, String)>,
    /// Whether the germline imports the release (`fork`) or each copy does (`spawn`).
    pub copy_source: crate::manifest::CopySourceKind,
    /// The manifest's scratch paths ([`crate::confine::Confinement::scratch_paths`]).
    pub scratch_paths: Vec<PathBuf>,
    /// Host programs and files the release runs or reads beyond its interpreter's
    /// ([`crate::manifest::Manifest::system_paths_on_host`]): bound read-only if they lie
    /// where the default root already reaches ([`PythonRuntime::read_paths`]), else refused.
    pub system_paths: Vec<PathBuf>,
    /// A root of only what the germline reads, all of it locked in memory
    /// ([`crate::resident`], `[sandbox] resident_root`).
    pub resident_root: bool,
    /// A resident root copied into an in-memory tree of this germline's own rather than the
    /// broker's shared one ([`crate::resident::make`]): a replay's germline.
    pub own_tree: bool,
}

/// Variables a manifest or policy may not set: the interpreter's and the loader's, and
/// those germline itself sets for the sandbox (proxy, CA trust, scratch, control).
const RESERVED_ENV: &[&str] =
    &["PATH", "TMPDIR", "HOME", "LANG", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"];

/// The environment a germline gets beyond germline's own: `manifest` first, `policy`
/// over it. Names must be `[A-Za-z_][A-Za-z0-9_]*`; the interpreter's (`PYTHON*`), the
/// loader's (`LD_*`), germline's (`GERMLINE_*`), the proxy variables and [`RESERVED_ENV`]
/// are refused, so neither can undo the sandbox's settings.
pub fn germline_environment(
    manifest: &std::collections::BTreeMap<String, String>,
    policy: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, ExecutorError> {
    let mut out = manifest.clone();
    out.extend(policy.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (k, v) in &out {
        let upper = k.to_ascii_uppercase();
        let well_formed = k.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        let reserved = ["PYTHON", "LD_", "GERMLINE_"].iter().any(|p| upper.starts_with(p))
            || upper.ends_with("_PROXY")
            || RESERVED_ENV.contains(&upper.as_str());
        if !well_formed || reserved || v.contains('\0') {
            return Err(ExecutorError::Manifest(format!("environment variable {k:?} may not be set for a germline")));
        }
    }
    Ok(out.into_iter().collect())
}

/// [`germline_environment`] of a manifest whose item placeholders are filled, plus the
/// placeholder values for the tool host ([`crate::manifest::ITEMS_VAR`]).
pub fn startup_environment(
    manifest: &crate::manifest::Manifest,
    policy: &crate::policy::Policy,
) -> Result<Vec<(String, String)>, ExecutorError> {
    let mut env = germline_environment(&manifest.env, &policy.environment)?;
    if !policy.startup_items.is_empty() {
        let items =
            serde_json::to_string(&policy.startup_items).map_err(|_| ExecutorError::internal("startup items"))?;
        env.push((crate::manifest::ITEMS_VAR.to_owned(), items));
    }
    Ok(env)
}

/// Where the C library looks for the zone `TZ` names in `env` (a leading `:` dropped; a
/// relative name under `TZDIR`, else `/usr/share/zoneinfo`), if the host has a file there.
/// `None` without `TZ`, for a POSIX rule such as `CET-1CEST,M3.5.0,M10.5.0/3` (no such
/// file: the C library parses the rule, in every root alike), for a name that is no file
/// (a directory: the C library cannot read it in any root either) and for a file in `/etc`,
/// which is the root's own (germline writes its `/etc/localtime`).
pub fn zone_file(env: &[(String, String)]) -> Option<PathBuf> {
    let get = |k: &str| env.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let tz = get("TZ")?;
    let name = tz.strip_prefix(':').unwrap_or(tz);
    if name.is_empty() {
        return None;
    }
    let path = if name.starts_with('/') {
        PathBuf::from(name)
    } else {
        Path::new(get("TZDIR").filter(|d| !d.is_empty()).unwrap_or("/usr/share/zoneinfo")).join(name)
    };
    let lexical = path.components().any(|c| c == std::path::Component::ParentDir);
    if !lexical && path.starts_with("/etc") {
        return None;
    }
    std::fs::metadata(&path).is_ok_and(|m| m.is_file()).then_some(path)
}

/// Test-only switch ("mechanism off"): hand the germline a control socket (at fd 3) that
/// it keeps across forks, as before issue 11, so every copy shares its options and queue.
/// Never set outside tests.
pub static SHARED_CONTROL_SOCKET_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// Test-only switch ("mechanism off"): every copy's scratch is a tmpfs, as before, even
/// where its memory cgroup would hold a ramfs to its limit, so writing and `fstat`ing a
/// file there moves the host's timestamp floor ([`crate::outside::ScratchKind`]). Never
/// set outside tests. Debug builds also take `GERMLINE_TEST_TMPFS_SCRATCH=1` (a service run
/// by a test).
pub static TMPFS_SCRATCH_FOR_TESTS: AtomicBool = AtomicBool::new(false);

fn tmpfs_scratch_for_tests() -> bool {
    crate::test_switch("GERMLINE_TEST_TMPFS_SCRATCH") || TMPFS_SCRATCH_FOR_TESTS.load(Ordering::SeqCst)
}

/// The file system of a copy's scratch: ramfs where the copy's cgroup holds it to a memory
/// limit (`limited`), else tmpfs, said once in the log (the timestamp floor stays a
/// channel between live copies there).
fn scratch_kind(limited: bool) -> crate::outside::ScratchKind {
    use crate::outside::ScratchKind;
    if limited && !tmpfs_scratch_for_tests() {
        return ScratchKind::Ramfs;
    }
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            "copies have no memory limit here (no cgroup v2 delegation): each copy's scratch is a size-capped \
             tmpfs, whose multigrain timestamps let a copy move the host's timestamp floor, which live copies can \
             read (SECURITY.md, \"The multigrain timestamp floor\")"
        );
    });
    ScratchKind::Tmpfs
}

/// Debug builds only: `GERMLINE_TEST_HASH_SEED_OFF=1` starts each germline with a hash
/// seed of its own, as when `python -I` ignored `PYTHONHASHSEED`, so a test can show a
/// replay on another germline ordering a set of strings differently from the call.
fn hash_seed_off_for_tests() -> bool {
    crate::test_switch("GERMLINE_TEST_HASH_SEED_OFF")
}

/// Debug builds only: `GERMLINE_TEST_HOST_PATHS=1` binds the release, the shim and the CA
/// certificate at the host's paths, as before the fixed layout, so a test can show a
/// request carrying a path replaying otherwise at a third party.
fn host_paths_for_tests() -> bool {
    crate::test_switch("GERMLINE_TEST_HOST_PATHS")
}

/// Test-only switch ("mechanism off"): skip the check that the germline's cgroups hold
/// only the germline and its live copies. Never set outside tests.
pub static PROCESS_ACCOUNTING_OFF_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// Test-only switch ("mechanism off"): the first process does not watch the broker, so a
/// broker killed without dropping its germlines leaves them (and the keeper) running, as
/// before. Never set outside tests.
pub static BROKER_WATCH_OFF_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// Switch for comparisons (`germline bench`, tests): the germline leaves its objects'
/// reference counts as they are instead of making them immortal before its first fork
/// (`_immortalize_heap` in the tool host, CPython 3.12 and 3.13), so every copy writes
/// them again, a copy-on-write fault for each page. Performance only: no guarantee rests
/// on it. `GERMLINE_IMMORTAL_HEAP=0` in the broker's environment sets it too.
pub static IMMORTAL_HEAP_OFF: AtomicBool = AtomicBool::new(false);

/// Whether germlines started now leave their heap mortal ([`IMMORTAL_HEAP_OFF`]).
pub fn immortal_heap_off() -> bool {
    IMMORTAL_HEAP_OFF.load(Ordering::SeqCst) || std::env::var_os("GERMLINE_IMMORTAL_HEAP").is_some_and(|v| v == "0")
}

/// Test-only switch ("mechanism off"): the germline's PID namespace keeps its pid counter
/// between forks, so the pids a copy burned show in the next fork window. Never set
/// outside tests.
pub static PID_COUNTER_RESET_OFF_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// Resets the pid counter of the germline's PID namespace before every fork, so the pids
/// the germline sees in a fork window (the copy's, or a child it forks and reaps) never
/// depend on how many processes and threads earlier copies started: a copy's threads take
/// pids in every ancestor namespace, the germline's included.
///
/// `ns_last_pid` applies to the writer's own PID namespace, so the writer is a shell the
/// broker starts inside the germline's namespace (`setns` from a thread of its own, which
/// needs CAP_SYS_ADMIN in the broker's user namespace: host root). It runs no release
/// code, is outside the germline's Landlock domain (which scopes signals), and dies with
/// the namespace.
struct PidCounter {
    child: Child,
    input: std::process::ChildStdin,
    output: std::io::BufReader<std::process::ChildStdout>,
}

impl PidCounter {
    /// What the shell does per line: the counter back to its own pid.
    const SCRIPT: &'static str = "while read _; do if echo $$ > /proc/sys/kernel/ns_last_pid; then echo ok; \
                                  else echo failed; fi; done";

    fn start(germline: i32) -> Result<PidCounter, ExecutorError> {
        let ns = std::fs::File::open(format!("/proc/{germline}/ns/pid"))
            .map_err(ExecutorError::io("opening the germline's PID namespace"))?;
        let spawned = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: setns on a namespace descriptor we own; it changes where this
                    // thread's children are born (this thread only, and it ends here).
                    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWPID) } < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Command::new("/bin/sh")
                        .arg("-c")
                        .arg(Self::SCRIPT)
                        .env_clear()
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::null())
                        .spawn()
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the spawning thread panicked")))
        });
        let mut child =
            spawned.map_err(ExecutorError::io("starting the pid counter reset in the germline's namespace"))?;
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(ExecutorError::internal("pid counter pipes"));
        };
        let mut c = PidCounter { child, input, output: std::io::BufReader::new(output) };
        c.reset()?;
        Ok(c)
    }

    fn reset(&mut self) -> Result<(), ExecutorError> {
        use std::io::{BufRead, Write};
        let fail = |why: String| ExecutorError::refused("processes", format!("the pid counter was not reset: {why}"));
        self.input.write_all(b"\n").and_then(|()| self.input.flush()).map_err(|e| fail(e.to_string()))?;
        let mut line = String::new();
        self.output.read_line(&mut line).map_err(|e| fail(e.to_string()))?;
        match line.trim() {
            "ok" => Ok(()),
            "" => Err(fail("the resetting shell is gone".into())),
            other => Err(fail(other.to_owned())),
        }
    }
}

impl Drop for PidCounter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The environment that keeps known native thread pools from starting threads at import
/// (G1 refuses a germline with more than one thread): BLAS (OpenBLAS, MKL, BLIS,
/// Accelerate), OpenMP, numexpr, numba, Rayon (polars, tokenizers), TensorFlow, and the
/// GHC runtime of programs a server shells out to (pandoc): `-V0` turns off its ticker,
/// a thread driven by a `timerfd`, which the copy's seccomp filter refuses (without it
/// such a program aborts at start). Public constants, the same for every germline; copies
/// inherit them (a copy's pools stay single-threaded).
pub const SINGLE_THREADED_POOLS: &[(&str, &str)] = &[
    ("OPENBLAS_NUM_THREADS", "1"),
    ("GOTO_NUM_THREADS", "1"),
    ("OMP_NUM_THREADS", "1"),
    ("MKL_NUM_THREADS", "1"),
    ("BLIS_NUM_THREADS", "1"),
    ("VECLIB_MAXIMUM_THREADS", "1"),
    ("NUMEXPR_NUM_THREADS", "1"),
    ("NUMEXPR_MAX_THREADS", "1"),
    ("NUMBA_NUM_THREADS", "1"),
    ("RAYON_NUM_THREADS", "1"),
    ("POLARS_MAX_THREADS", "1"),
    ("TOKENIZERS_PARALLELISM", "false"),
    ("TF_NUM_INTEROP_THREADS", "1"),
    ("TF_NUM_INTRAOP_THREADS", "1"),
    ("GHCRTS", "-V0"),
];

/// glibc's malloc arenas for a germline and its copies. Each thread that allocates can get
/// an arena of its own, up to 8 per core, and each reserves 64 MiB of address space: a
/// copy that starts 16 threads on this 2-core kind has reserved 1 GiB, the default
/// RLIMIT_AS, and a thread whose start then fails hangs `Thread.start()` in CPython. Two
/// arenas keep a thread pool inside the limit. Public, the same for every germline; a
/// manifest may set another value.
pub const MALLOC_ARENAS: (&str, &str) = ("MALLOC_ARENA_MAX", "2");

/// At most this many bytes of the germline's stderr are kept while it starts.
const STDERR_TAIL_BYTES: usize = 8192;
/// At most this many of its last lines are quoted in a start error.
const STDERR_TAIL_LINES: usize = 25;

/// The end of what the interpreter wrote to stderr while it imported the release (a
/// traceback, a crash message), read by a thread of the broker from a pipe. The germline
/// is data-free, so the text carries no item: it goes into the start error unlabelled.
/// The pipe never outlives the start: the shim closes stderr before the germline is ready,
/// and G2 refuses a germline that still holds any descriptor but `/dev/null`.
struct StartStderr {
    tail: std::sync::Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl StartStderr {
    /// The reader and the write end for the germline's stderr.
    fn pipe() -> Result<(Option<StartStderr>, Option<OwnedFd>), ExecutorError> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 fills two fresh descriptors that we take ownership of.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
            return Err(ExecutorError::io("the germline's stderr pipe")(std::io::Error::last_os_error()));
        }
        // SAFETY: both descriptors are fresh and owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let tail = std::sync::Arc::new(Mutex::new(Vec::new()));
        let kept = tail.clone();
        let reader = std::thread::Builder::new()
            .name("germline-stderr".into())
            .spawn(move || {
                use std::io::Read;
                let mut f = std::fs::File::from(read);
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = f.read(&mut buf) {
                    let mut t = kept.lock().unwrap_or_else(|p| p.into_inner());
                    t.extend_from_slice(&buf[..n]);
                    if t.len() > STDERR_TAIL_BYTES {
                        let cut = t.len() - STDERR_TAIL_BYTES;
                        t.drain(..cut);
                    }
                }
            })
            .map_err(ExecutorError::io("starting the germline's stderr reader"))?;
        Ok((Some(StartStderr { tail, reader: Some(reader) }), Some(write)))
    }

    /// The last lines written, once every writer has closed the pipe (waiting at most
    /// half a second for that).
    fn last_lines(&mut self) -> String {
        let until = Instant::now() + Duration::from_millis(500);
        while self.reader.as_ref().is_some_and(|r| !r.is_finished()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        if self.reader.as_ref().is_some_and(|r| r.is_finished()) {
            let _ = self.reader.take().map(|r| r.join());
        }
        let t = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        let text = String::from_utf8_lossy(&t);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join("\n")
    }
}

/// Adds the germline's last stderr lines to a start error.
fn with_stderr(e: ExecutorError, stderr: &mut Option<StartStderr>) -> ExecutorError {
    let Some(s) = stderr.as_mut() else {
        return e;
    };
    let tail = s.last_lines();
    match e {
        ExecutorError::GermlineRefused { check, detail } if !tail.is_empty() => ExecutorError::GermlineRefused {
            check,
            detail: format!("{detail}; the interpreter's stderr ended with:\n{tail}"),
        },
        other => other,
    }
}

/// The fallback a G1 refusal offers, with what it costs: `start` is how long the germline
/// took to import the release (and to be refused), which every copy would then pay.
fn spawn_offer(start: Duration) -> String {
    format!(
        "or set copy_source = \"spawn\" (policy [limits], or manifest [release]): the germline then never imports \
         the release and each copy imports it itself, after its checks and before it holds any item; the import \
         took {} ms here, paid by every copy (while the pool readies it, ahead of calls; inside the call with pool 0)",
        start.as_millis()
    )
}

/// Most entries and bytes the germline's import may leave in its scratch (its tmpfs holds
/// no more; [`crate::confine::IMPORT_SCRATCH_OPTS`]).
const IMPORT_SCRATCH_ENTRIES: usize = 1024;
const IMPORT_SCRATCH_BYTES: usize = 16 << 20;

/// Copies out what the import left in the germline's scratch tmpfs (the germline is
/// stopped; nothing else runs in its namespaces yet), then unmounts it in the germline, so
/// no copy ever shares it: each copy's own scratch starts with these entries instead.
/// Returns them and the tmpfs's device (major, minor), which G3 then refuses any mapping
/// of, shared or private ([`inspect::check_g3`]). Links are read, never followed (an
/// absolute target would resolve in the broker's root here); anything but directories,
/// regular files and links, and a working directory inside the scratch, are refused.
fn take_import_scratch(pid: i32, dir: &Path) -> Result<(Vec<crate::outside::ScratchEntry>, (u32, u32)), ExecutorError> {
    use crate::outside::{FileMeta, ScratchEntry};
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let refuse = |what: String| ExecutorError::refused("scratch", what);
    let base = PathBuf::from(format!("/proc/{pid}/root")).join(dir.strip_prefix("/").unwrap_or(dir));
    let meta = std::fs::symlink_metadata(&base).map_err(ExecutorError::io("the germline's import scratch"))?;
    let parent = std::fs::symlink_metadata(base.parent().unwrap_or(&base))
        .map_err(ExecutorError::io("the germline's import scratch"))?;
    if !meta.is_dir() || meta.dev() == parent.dev() {
        return Err(refuse("the germline's import scratch is not mounted".into()));
    }
    let dev = meta.dev();
    let cwd = std::fs::metadata(format!("/proc/{pid}/cwd")).map_err(ExecutorError::io("the germline's directory"))?;
    if cwd.dev() == dev {
        return Err(refuse(
            "the germline's working directory is in its import scratch, which copies never share".into(),
        ));
    }
    let mut entries = Vec::new();
    let mut bytes = 0usize;
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let mut names: Vec<_> = std::fs::read_dir(base.join(&rel))
            .map_err(ExecutorError::io("listing the germline's import scratch"))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(ExecutorError::io("listing the germline's import scratch"))?;
        names.sort();
        for name in names {
            let path = rel.join(&name);
            let full = base.join(&path);
            let m = std::fs::symlink_metadata(&full).map_err(ExecutorError::io("the germline's import scratch"))?;
            if entries.len() >= IMPORT_SCRATCH_ENTRIES {
                return Err(refuse(format!(
                    "the import left more than {IMPORT_SCRATCH_ENTRIES} entries in its scratch"
                )));
            }
            let ft = m.file_type();
            if ft.is_dir() {
                entries.push(ScratchEntry::Dir { path: path.clone(), mode: m.mode() & 0o7777 });
                pending.push(path);
            } else if ft.is_file() {
                let mut contents = Vec::new();
                std::fs::File::options()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&full)
                    .and_then(|f| f.take((IMPORT_SCRATCH_BYTES - bytes) as u64 + 1).read_to_end(&mut contents))
                    .map_err(ExecutorError::io("reading the germline's import scratch"))?;
                bytes += contents.len();
                if bytes > IMPORT_SCRATCH_BYTES {
                    return Err(refuse(format!(
                        "the import left more than {IMPORT_SCRATCH_BYTES} bytes in its scratch"
                    )));
                }
                entries.push(ScratchEntry::File { path, contents, meta: FileMeta::of(&m) });
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&full).map_err(ExecutorError::io("the germline's import scratch"))?;
                entries.push(ScratchEntry::Link { path, target });
            } else {
                return Err(refuse(format!(
                    "the import left {} in its scratch, which is neither a file, a directory nor a link",
                    path.display()
                )));
            }
        }
    }
    // Directories before what they hold, whatever order the walk took.
    entries.sort_by(|a, b| entry_path(a).cmp(entry_path(b)));
    crate::outside::unmount_in_germline(pid, dir)?;
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .map_err(ExecutorError::io("reading the germline's mounts"))?;
    if mountinfo.lines().any(|l| l.split_whitespace().nth(4) == Some(&*dir.to_string_lossy())) {
        return Err(refuse("the germline's import scratch is still mounted".into()));
    }
    Ok((entries, (libc::major(dev), libc::minor(dev))))
}

fn entry_path(e: &crate::outside::ScratchEntry) -> &Path {
    use crate::outside::ScratchEntry::*;
    match e {
        Dir { path, .. } | File { path, .. } | Link { path, .. } => path,
    }
}

/// Test-only switch ("mechanism off"), re-exported: let the germline wait for its copies.
pub use crate::inspect::CHILD_EXIT_CHECK_OFF_FOR_TESTS;

/// Names each germline's cgroups uniquely within this broker.
static GERMLINE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Namespaces held by copies alive right now, across every germline of this process.
static LIVE_COPY_NAMESPACES: Mutex<BTreeSet<NsId>> = Mutex::new(BTreeSet::new());

/// A running germline.
pub struct Germline {
    /// The process the broker spawned: the germline itself, or (with its own PID
    /// namespace) the first process, which forks the keeper and the germline and waits.
    child: Option<Child>,
    /// The germline's pid in the broker's PID namespace.
    pid: i32,
    /// The germline, held by a pidfd (it need not be the broker's child).
    pidfd: OwnedFd,
    /// Only with [`SHARED_CONTROL_SOCKET_FOR_TESTS`]: the broker's end, kept open.
    _control: Option<UnixStream>,
    allowed: AllowedFds,
    namespaces: Vec<NsId>,
    cgroups: Option<CgroupSet>,
    /// The init of the germline's own PID namespace (see [`Keeper`]).
    keeper: Option<Keeper>,
    /// Resets that namespace's pid counter before every fork (see [`PidCounter`]).
    pid_counter: Option<PidCounter>,
    /// Time the germline took to import the release.
    pub start_time: Duration,
    /// Copies killed after their answer was returned, whose death the next fork awaits.
    retired: Vec<CopyProcess>,
    /// Readable whenever the germline has stopped (one byte per stop, from the first
    /// process, its parent): a wake-up only; the stop itself is read from `/proc`.
    stops: Option<OwnedFd>,
    /// Where each copy gets its private scratch tmpfs ([`crate::confine::scratch_dir`]).
    scratch: Option<PathBuf>,
    /// What the import left in the germline's own scratch, which every copy's starts with.
    import_seed: Arc<Vec<crate::outside::ScratchEntry>>,
    /// The broker's block of copy ids, mapped into the germline's user namespace: each
    /// copy runs as ids of its own (see [`crate::ids`]).
    copy_ids: Option<Arc<IdBlock>>,
    /// The host ids the germline runs as (and copies, without ids of their own).
    host_ids: (u32, u32),
    /// Copies this germline forked that may still be alive (its only allowed children).
    copy_pids: Vec<i32>,
    /// With a resident root, its files' locks, held while the germline lives.
    _resident: Option<crate::resident::ResidentLock>,
}

/// Warns (once per broker) that copies share the germline's host ids.
fn warn_shared_copy_ids(ids: (u32, u32)) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            uid = ids.0,
            gid = ids.1,
            "the broker is not host root (or runs without sandbox ids): copies share the germline's host ids, so \
             kernel counters kept per user (pipe buffers) are shared between copies (SECURITY.md)"
        );
    });
}

/// The keeper: the first child of the germline, forked before the release is imported,
/// init of the PID namespace every later child of the germline is born in. Orphans are
/// reparented to it (so a process the germline leaves behind is its child, seen and
/// refused), copies' namespaces are nested inside its namespace, and killing it tears
/// down everything in there.
struct Keeper {
    pid: i32,
    pidfd: OwnedFd,
    /// The germline's PID namespace for children, which the keeper is PID 1 of.
    namespace: NsId,
}

impl Keeper {
    /// Finds the keeper and the germline among the first process's children: PID 1 and
    /// PID 2 of one PID namespace that is not the first process's own. Waits (bounded)
    /// for both to exist; fails if the first process exits first.
    fn find(first: &mut Child, timeout: Duration) -> Result<(Keeper, i32), ExecutorError> {
        let leader = first.id() as i32;
        let until = Instant::now() + timeout;
        let own = inspect::namespace(leader, "pid")?;
        loop {
            if let Ok(Some(status)) = first.try_wait() {
                return Err(ExecutorError::refused("start", format!("the germline exited ({status})")));
            }
            let children = inspect::live_children(leader)?;
            let mut keeper = None;
            let mut germline = None;
            for &c in &children {
                match inspect::pid_in_own_namespace(c) {
                    Ok(1) => keeper = Some(c),
                    Ok(2) => germline = Some(c),
                    _ => {}
                }
            }
            if let (Some(k), Some(g), 2) = (keeper, germline, children.len()) {
                let pidfd = pidfd_open(k)?;
                let namespace = inspect::namespace(k, "pid")?;
                if namespace == own || inspect::namespace(g, "pid")? != namespace {
                    let _ = pidfd_kill(&pidfd);
                    return Err(ExecutorError::refused(
                        "children",
                        "the keeper and the germline are not in a PID namespace of their own",
                    ));
                }
                return Ok((Keeper { pid: k, pidfd, namespace }, g));
            }
            if children.len() > 2 || Instant::now() > until {
                kill_all(&children);
                return Err(ExecutorError::refused(
                    "children",
                    format!(
                        "expected the keeper and the germline in the germline's PID namespace, found {} processes",
                        children.len()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Anything reparented to the keeper is a process the germline left behind.
    fn check_no_orphans(&self) -> Result<(), ExecutorError> {
        if !std::path::Path::new(&format!("/proc/{}", self.pid)).exists() {
            return Err(ExecutorError::refused("processes", "the keeper of the germline's PID namespace is gone"));
        }
        if let Some(&p) = inspect::live_children(self.pid)?.first() {
            return Err(ExecutorError::refused(
                "processes",
                format!(
                    "stray process {p} ({}) in the germline's PID namespace: every process there must be the germline's \
                     keeper or inside a copy the broker made",
                    inspect::comm(p)
                ),
            ));
        }
        Ok(())
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // The namespace's init: everything left in the namespace dies with it.
        let _ = pidfd_kill(&self.pidfd);
    }
}

impl Germline {
    /// Starts the germline under its sandbox, waits for it to import the release, and
    /// checks G1–G3. The germline is left stopped.
    pub fn start(spec: &GermlineSpec) -> Result<Germline, ExecutorError> {
        let t0 = Instant::now();
        let release_dir = spec
            .release_dir
            .canonicalize()
            .map_err(ExecutorError::io(format!("release directory {}", spec.release_dir.display())))?;
        crate::confine::hard_limits_allow(&spec.limits).map_err(|e| ExecutorError::refused("start", e))?;
        // Data roots need not exist on the host: the germline's root holds them empty, and
        // each copy gets its view mounted there.
        let (ours, theirs, control_inode) = if SHARED_CONTROL_SOCKET_FOR_TESTS.load(Ordering::SeqCst) {
            let (ours, theirs) = UnixStream::pair().map_err(ExecutorError::io("control socketpair"))?;
            let inode = std::fs::metadata(format!("/proc/self/fd/{}", theirs.as_raw_fd()))
                .map(|m| m.ino())
                .map_err(ExecutorError::io("control socket inode"))?;
            (Some(ours), Some(theirs), Some(inode))
        } else {
            (None, None, None)
        };
        // A manifest names system paths, so each must lie where the default root already
        // reaches: a release cannot have a host file bound that its germline could not read.
        let mut system = Vec::new();
        for p in &spec.system_paths {
            let links = crate::resident::chain(p)
                .map_err(|e| ExecutorError::refused("start", format!("the germline's root: {e}")))?;
            if let Some(outside) = links.iter().find(|l| !spec.runtime.read_paths.iter().any(|r| l.starts_with(r))) {
                return Err(ExecutorError::refused(
                    "start",
                    format!(
                        "system path {} leads to {}, outside the interpreter's paths and the system directories a \
                         germline's root may bind",
                        p.display(),
                        outside.display()
                    ),
                ));
            }
            system.extend(links);
        }
        // The zone file a `TZ` in the environment names: with all of `/usr` bound the
        // default root has it, so a resident root binds it too rather than leave the C
        // library to fall back, silently, to UTC.
        if let Some(zone) = zone_file(&spec.env) {
            let links = crate::resident::chain(&zone)
                .map_err(|e| ExecutorError::refused("start", format!("the germline's time zone: {e}")))?;
            if let Some(outside) = links.iter().find(|l| !spec.runtime.read_paths.iter().any(|r| l.starts_with(r))) {
                return Err(ExecutorError::refused(
                    "start",
                    format!(
                        "TZ names the zone file {}, which leads to {}, outside the system directories a germline's \
                         root may bind",
                        zone.display(),
                        outside.display()
                    ),
                ));
            }
            system.extend(links);
        }
        let (read_only, masks, resident) = if spec.resident_root {
            let extra: Vec<PathBuf> = spec.extra_read.iter().cloned().chain(system).collect();
            let made = crate::resident::resident_paths(&spec.runtime, &release_dir, &extra).and_then(|paths| {
                let lock = crate::resident::make(&paths, &crate::confine::HOST_ETC, spec.own_tree)?;
                Ok((paths, lock))
            });
            let (paths, lock) = made.map_err(|e| {
                ExecutorError::refused(
                    "start",
                    format!(
                        "the germline's resident root: {e} (a policy may set [sandbox] resident_root = false for \
                             the default root, where page-cache residency and negative dentries stay channels between \
                             copies: SECURITY.md)"
                    ),
                )
            })?;
            tracing::debug!(
                paths = paths.read_only.len(),
                hidden = paths.masks.len(),
                mib = lock.bytes >> 20,
                "resident root locked"
            );
            (paths.read_only, paths.masks, Some(lock))
        } else {
            let mut read_only = spec.runtime.read_paths.clone();
            read_only.push(release_dir.clone());
            read_only.extend(spec.extra_read.iter().cloned());
            // Each link on the way as a link, so that `/bin/sh` is bound where `/bin` leads.
            read_only.extend(system);
            (read_only, Vec::new(), None)
        };
        // The release, the shim and the CA certificate at the same paths in every root
        // ([`crate::confine::LAYOUT_DIR`]), wherever this host keeps them.
        let fixed = !host_paths_for_tests();
        let mut relocate = crate::confine::Relocations::default();
        let shim = spec
            .runtime
            .shim_dir
            .canonicalize()
            .map_err(ExecutorError::io(format!("shim directory {}", spec.runtime.shim_dir.display())))?;
        let (release_at, shim_at) = if fixed {
            relocate.add(&release_dir, Path::new(crate::confine::RELEASE_IN_ROOT));
            relocate.add(&shim, Path::new(crate::confine::SHIM_IN_ROOT));
            (PathBuf::from(crate::confine::RELEASE_IN_ROOT), PathBuf::from(crate::confine::SHIM_IN_ROOT))
        } else {
            (release_dir.clone(), shim.clone())
        };
        let ca = match spec.extra_read.iter().find(|p| p.file_name().is_some_and(|n| n == crate::ca::CA_CERT_FILE)) {
            Some(p) => {
                let host = p.canonicalize().map_err(ExecutorError::io(format!("CA certificate {}", p.display())))?;
                let at = if fixed {
                    Path::new(crate::confine::CA_IN_ROOT).join(crate::ca::CA_CERT_FILE)
                } else {
                    host.clone()
                };
                if fixed {
                    relocate.add(&host, &at);
                }
                Some((host, at))
            }
            None => None,
        };
        // Each relocated path by its canonical name only (another name for it would bind
        // it at the host's path as well).
        let mut read_only = read_only;
        if fixed {
            read_only.retain(|p| relocate.covers(p) || !p.canonicalize().is_ok_and(|c| relocate.covers(&c)));
            for p in [Some(&release_dir), Some(&shim), ca.as_ref().map(|(host, _)| host)].into_iter().flatten() {
                if !read_only.contains(p) {
                    read_only.push(p.clone());
                }
            }
        }
        let in_root: Vec<PathBuf> = read_only.iter().map(|p| relocate.in_root(p)).collect();
        let scratch = crate::confine::scratch_dir(&in_root, &spec.data_roots);
        let confinement = Confinement {
            tree: resident.as_ref().and_then(|l| l.source()),
            masks,
            relocate,
            read_only,
            data_roots: spec.data_roots.clone(),
            limits: spec.limits.clone(),
            switches: spec.switches,
            seccomp: spec.seccomp.clone(),
            scratch_paths: spec.scratch_paths.clone(),
        };
        let stage = spec.runtime.shim_dir.with_file_name("stage");
        std::fs::create_dir_all(&stage).map_err(ExecutorError::io(format!("creating {}", stage.display())))?;
        let mut sandbox = confinement
            .prepare(&stage, &release_at, theirs.as_ref().map(AsRawFd::as_raw_fd))
            .map_err(|e| ExecutorError::refused("start", format!("the germline's sandbox cannot be built: {e}")))?;
        let debug_stderr = std::env::var_os("GERMLINE_DEBUG_GERMLINE").is_some();
        if debug_stderr {
            tracing::warn!("GERMLINE_DEBUG_GERMLINE is set: the germline's stderr stays open (debugging only)");
        }
        // Without the debug switch, stderr is a pipe the broker reads while the release
        // imports: a failed start names its cause (see [`StartStderr`]).
        let (mut start_stderr, stderr_pipe) = if debug_stderr { (None, None) } else { StartStderr::pipe()? };
        // Held until the germline is spawned (the child keeps its own copy).
        let mut broker_pidfd: Option<OwnedFd> = None;
        let mut cmd = Command::new(&spec.runtime.python);
        // Not `-I`: it ignores every `PYTHON*` variable, the hash seed among them, and each
        // germline then hashed `str` and `bytes` with a seed of its own, so a set of strings
        // iterated in another order in the verifier's replay, or a third party's, than in
        // the call it replays. The environment is cleared and every `PYTHON*` variable in it
        // is set here (a release may name none, see [`germline_environment`]), so `-E` adds
        // nothing; `-s` keeps the user's site-packages out and `PYTHONSAFEPATH` (3.11 and
        // later) the script's directory out of `sys.path`, the rest of what `-I` does.
        cmd.arg("-s")
            .arg(shim_at.join("germline_host.py"))
            .arg("germline")
            .arg(&release_at)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .env("PYTHONSAFEPATH", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .envs(SINGLE_THREADED_POOLS.iter().copied())
            .env(MALLOC_ARENAS.0, MALLOC_ARENAS.1)
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(scratch.iter().flat_map(|d| [("TMPDIR", d.as_os_str()), ("GERMLINE_SCRATCH", d.as_os_str())]))
            .current_dir(&release_dir)
            .stdin(Stdio::null())
            // With its own PID namespace, the first process (never the germline, never
            // release code) reports each stop of the germline on its stdout: the broker
            // sleeps until then instead of polling (see `wait_stopped`).
            .stdout(if spec.switches.pid_namespace { Stdio::piped() } else { Stdio::null() })
            .stderr(match stderr_pipe {
                Some(w) => Stdio::from(w),
                None if debug_stderr => Stdio::inherit(),
                None => Stdio::null(),
            });
        if !hash_seed_off_for_tests() {
            cmd.env("PYTHONHASHSEED", "0");
        }
        if debug_stderr {
            cmd.env("GERMLINE_KEEP_STDERR", "1");
        }
        let spawn = spec.copy_source == crate::manifest::CopySourceKind::Spawn;
        if spawn {
            cmd.env("GERMLINE_COPY_SOURCE", "spawn");
        }
        if theirs.is_some() {
            cmd.env("GERMLINE_SHARED_CONTROL", "1");
        }
        if immortal_heap_off() {
            cmd.env("GERMLINE_IMMORTAL_HEAP", "0");
        }
        if spec.switches.pid_namespace {
            cmd.env("GERMLINE_PID_NAMESPACE", "1");
            // The first process watches this process (its parent) through a pidfd opened
            // here: no process in the sandbox may open one (its inode number is a count of
            // the host's threads), and by the time it looks its parent may already be
            // someone else. A pidfd of a process that has ended is readable at once.
            if BROKER_WATCH_OFF_FOR_TESTS.load(Ordering::SeqCst) {
                cmd.env("GERMLINE_BROKER_WATCH", "0");
            } else {
                let mut me = pidfd_open(std::process::id() as i32)?;
                if me.as_raw_fd() <= crate::confine::GERMLINE_CONTROL_FD {
                    // Above the descriptor a test's shared control socket is moved to.
                    me = me.try_clone().map_err(ExecutorError::io("duplicating the broker's pidfd"))?;
                }
                cmd.env("GERMLINE_BROKER_PIDFD", me.as_raw_fd().to_string());
                sandbox.pass_broker_pidfd(me.as_raw_fd());
                broker_pidfd = Some(me);
            }
        }
        let proxy = format!("http://127.0.0.1:{PROXY_PORT}");
        for var in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
            cmd.env(var, &proxy);
        }
        // Copies trust the deployment CA (its certificate only) for HTTPS through the broker.
        if let Some((_, at)) = &ca {
            for var in crate::tls::CA_TRUST_VARS {
                cmd.env(var, at);
            }
        }
        let cgroups = match CgroupSet::create(
            &format!("{}-{}", std::process::id(), GERMLINE_COUNTER.fetch_add(1, Ordering::SeqCst)),
            spec.cgroup_limits,
        ) {
            Ok(c) => c,
            Err(e) if crate::cgroup::CREATE_FALLBACK_FOR_TESTS.load(Ordering::SeqCst) => {
                tracing::warn!("{e}");
                None
            }
            Err(e) => return Err(e),
        };
        let support = cgroups.as_ref().map(CgroupSet::support).unwrap_or(crate::cgroup::HostSupport::None);
        if spec.cgroup_limits.is_some() && !cgroups.as_ref().is_some_and(CgroupSet::enforces_limits) {
            if spec.require_limits {
                return Err(ExecutorError::Sandbox(format!(
                    "[limits] require_limits = true, but this host cannot hold copies to memory and process \
                     limits: {}",
                    support.describe()
                )));
            }
            tracing::warn!("per-copy limits: {}", support.describe());
        }
        if cgroups.is_none() {
            tracing::warn!("no cgroup for the germline: processes it leaves behind are neither seen nor killed");
        }
        if let Some(cg) = &cgroups {
            // The germline joins its cgroups before exec, so nothing it ever runs is born
            // outside them. Runs first among the pre-exec steps (still the broker's user
            // namespace); writing "0" moves the writer; only syscalls on prepared paths.
            let files = cg.join_files();
            // SAFETY: the closure only calls open/write/close on NUL-terminated paths
            // prepared before fork.
            unsafe {
                cmd.pre_exec(move || {
                    for f in &files {
                        let fd = libc::open(f.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                        if fd < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        let rc = libc::write(fd, b"0".as_ptr().cast(), 1);
                        let err = std::io::Error::last_os_error();
                        libc::close(fd);
                        if rc != 1 {
                            return Err(err);
                        }
                    }
                    Ok(())
                });
            }
        }
        let copy_ids = sandbox.copy_ids.clone();
        let host_ids = sandbox.host_ids;
        if copy_ids.is_none() && spec.switches.copy_ids {
            warn_shared_copy_ids(host_ids);
        }
        let report = sandbox.install(&mut cmd);
        let spawned = cmd.spawn();
        drop(broker_pidfd);
        let mut child = spawned.map_err(|e| {
            ExecutorError::refused(
                "start",
                format!("{} (the interpreter: {})", report.explain(&e), spec.runtime.python.display()),
            )
        })?;
        // The broker's copy of the stderr pipe's write end goes with the command, so the
        // reader sees the end of the file once the germline and its first processes close it.
        drop(cmd);
        let stops = child.stdout.take().map(OwnedFd::from);
        if let Some(fd) = &stops {
            // SAFETY: fcntl on a descriptor we own.
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        }
        drop(theirs);
        let leader = child.id() as i32;
        let leader_fd = pidfd_open(leader)?;
        let mut g = Germline {
            child: Some(child),
            pid: leader,
            pidfd: leader_fd,
            _control: ours,
            allowed: AllowedFds { control_socket_inode: control_inode, debug_stderr, scratch_dev: None },
            namespaces: Vec::new(),
            cgroups,
            keeper: None,
            pid_counter: None,
            start_time: Duration::ZERO,
            retired: Vec::new(),
            stops,
            scratch,
            import_seed: Arc::new(Vec::new()),
            copy_ids,
            host_ids,
            copy_pids: Vec::new(),
            _resident: resident,
        };
        if spec.switches.pid_namespace {
            let first = g.child.as_mut().ok_or_else(|| ExecutorError::internal("germline child"))?;
            let (keeper, pid) =
                Keeper::find(first, spec.start_timeout).map_err(|e| with_stderr(e, &mut start_stderr))?;
            g.keeper = Some(keeper);
            g.pidfd = pidfd_open(pid)?;
            g.pid = pid;
            if !PID_COUNTER_RESET_OFF_FOR_TESTS.load(Ordering::SeqCst) {
                // SAFETY: geteuid cannot fail.
                if unsafe { libc::geteuid() } == 0 {
                    g.pid_counter = Some(PidCounter::start(pid)?);
                } else {
                    tracing::warn!(
                        "the broker is not host root: the germline's pid counter is not reset between forks \
                         (a copy can move the pids the germline sees next; SECURITY.md)"
                    );
                }
            }
        }
        let pid = g.pid;
        // The germline stops itself once the release is imported.
        g.wait_stopped(spec.start_timeout).map_err(|e| {
            with_stderr(
                ExecutorError::refused("start", format!("the release did not finish importing: {e}")),
                &mut start_stderr,
            )
        })?;
        if let (Some(dir), true) = (&g.scratch, spec.switches.import_scratch) {
            let (seed, dev) = take_import_scratch(pid, dir)?;
            g.import_seed = Arc::new(seed);
            g.allowed.scratch_dev = Some(dev);
        }
        g.namespaces = COPY_NAMESPACES.iter().map(|k| inspect::namespace(pid, k)).collect::<Result<_, _>>()?;
        inspect::check_germline(pid, &g.allowed).map_err(|e| match e {
            ExecutorError::GermlineRefused { check, detail } if check == "G1" && !spawn => {
                ExecutorError::GermlineRefused { check, detail: format!("{detail}; {}", spawn_offer(t0.elapsed())) }
            }
            other => other,
        })?;
        if !inspect::live_children(pid)?.is_empty() {
            return Err(ExecutorError::refused("children", "the germline left a process running at start"));
        }
        g.account_processes()?;
        if huge_heap() {
            collapse_heap(&g.pidfd, pid);
        }
        if let Some(cg) = &g.cgroups {
            cg.stage_next(pid);
        }
        g.start_time = t0.elapsed();
        Ok(g)
    }

    /// What enforces per-copy limits for this germline (for logs).
    pub fn limits_mechanism(&self) -> &'static str {
        self.cgroups.as_ref().map(CgroupSet::support).unwrap_or(crate::cgroup::HostSupport::None).describe()
    }

    /// Every process in the germline's cgroups must be the germline or inside a live
    /// copy's PID namespace; anything else (a relay double-forked in the fork window, a
    /// child left over from import) is refused, named. Listing and checking repeat until
    /// two listings agree, so a process that forks and exits meanwhile is still seen.
    fn account_processes(&self) -> Result<(), ExecutorError> {
        if PROCESS_ACCOUNTING_OFF_FOR_TESTS.load(Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(k) = &self.keeper {
            k.check_no_orphans()?;
        }
        let Some(cg) = &self.cgroups else {
            return Ok(());
        };
        // The germline, its keeper and the first process (which only waits for it).
        let keeper = self.keeper.as_ref().map(|k| k.pid);
        let first = self.child.as_ref().map(|c| c.id() as i32);
        let mut seen = cg.processes();
        for _ in 0..8 {
            for &p in &seen {
                if p != self.pid
                    && Some(p) != keeper
                    && Some(p) != first
                    && !inspect::in_live_copy(p, &live_pid_namespaces())
                {
                    // Gone already: the next listing decides.
                    if std::path::Path::new(&format!("/proc/{p}")).exists() {
                        return Err(ExecutorError::refused(
                            "processes",
                            format!(
                                "stray process {p} ({}) in the germline's cgroup: every process there must be \
                                 the germline or inside a copy the broker made",
                                inspect::comm(p)
                            ),
                        ));
                    }
                }
            }
            let again = cg.processes();
            if again == seen {
                return Ok(());
            }
            seen = again;
        }
        Err(ExecutorError::refused("processes", "the germline's cgroups did not settle (processes keep appearing)"))
    }

    /// The germline's pid (in the broker's PID namespace).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// How the germline ended, once it has (its pidfd is readable then); `None` while it
    /// lives. With its own PID namespace the germline is not the broker's child: the first
    /// process, which exits right after it, reports its end (128 + signal for a signal).
    pub fn gone(&mut self) -> Option<String> {
        // A germline whose resident root is no longer locked is as good as gone: no copy is
        // taken from it or forked from it, and it is started again (with a new lock).
        if let Some(Err(e)) = self._resident.as_ref().map(|r| r.check()) {
            return Some(e.to_string());
        }
        if !pidfd_exited(&self.pidfd).unwrap_or(false) {
            return None;
        }
        let relayed = self.keeper.is_some();
        let status = self.child.as_mut().and_then(|c| {
            // Bounded: the first process exits as soon as it has read the germline's end.
            for _ in 0..50 {
                match c.try_wait() {
                    Ok(Some(s)) => return Some(s),
                    Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                    Err(_) => return None,
                }
            }
            None
        });
        Some(match status.map(|s| (s, s.code())) {
            Some((_, Some(code))) if relayed && code > 128 => {
                format!("it ended with status {code} (killed by signal {}, or exited so)", code - 128)
            }
            Some((_, Some(code))) => format!("it exited with status {code}"),
            Some((s, None)) => format!("it ended: {s}"),
            None => "it ended; how is not known".into(),
        })
    }

    /// Waits until the germline has stopped (itself or by us). Read from `/proc` (the
    /// germline need not be the broker's child): the state stays `T` until a SIGCONT,
    /// which wakes it before `kill` returns. An exit shows on the pidfd. Between looks the
    /// broker sleeps in the kernel until the first process reports a stop (or, without
    /// that report, naps of 20–200 µs).
    fn wait_stopped(&self, timeout: Duration) -> Result<(), String> {
        let until = Instant::now() + timeout;
        let mut nap = Duration::from_micros(20);
        let mut stops = self.stops.as_ref().map(AsRawFd::as_raw_fd);
        loop {
            if pidfd_exited(&self.pidfd).unwrap_or(false) {
                return Err("the germline exited".into());
            }
            match inspect::state(self.pid) {
                Ok('T') => return Ok(()),
                Ok('t') => return Err("the germline is traced".into()),
                Ok('Z' | 'X') | Err(_) => return Err("the germline exited".into()),
                Ok(_) => {}
            }
            let now = Instant::now();
            if now > until {
                return Err(format!("the germline did not stop within {timeout:?}"));
            }
            match stops {
                Some(fd) => {
                    // Bounded, so a first process that stopped reporting only slows this.
                    let wait = until.saturating_duration_since(now).min(Duration::from_millis(50));
                    let mut pfd = [
                        libc::pollfd { fd, events: libc::POLLIN, revents: 0 },
                        libc::pollfd { fd: self.pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                    ];
                    // SAFETY: poll on two descriptors we own, for a bounded time.
                    unsafe { libc::poll(pfd.as_mut_ptr(), 2, wait.as_millis().max(1) as i32) };
                    if pfd[0].revents & (libc::POLLHUP | libc::POLLERR) != 0 && pfd[0].revents & libc::POLLIN == 0 {
                        stops = None;
                    }
                    let mut buf = [0u8; 64];
                    // SAFETY: non-blocking reads into a local buffer, draining stale reports.
                    while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
                }
                None => {
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_micros(200));
                }
            }
        }
    }

    fn signal(&self, sig: i32) -> Result<(), ExecutorError> {
        // SAFETY: signalling through a pidfd we own (never a recycled pid).
        let rc = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, self.pidfd.as_raw_fd(), sig, 0, 0) };
        if rc < 0 {
            return Err(ExecutorError::io("signalling the germline")(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn stop(&self) -> Result<(), ExecutorError> {
        self.signal(libc::SIGSTOP)?;
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            match inspect::state(self.pid)? {
                'T' | 't' => return Ok(()),
                'Z' | 'X' => return Err(ExecutorError::refused("start", "the germline died")),
                _ if Instant::now() > until => {
                    return Err(ExecutorError::refused("start", "the germline did not stop"))
                }
                _ => std::thread::sleep(Duration::from_micros(50)),
            }
        }
    }

    /// Forks one copy: checks G1–G3, lets the germline run just long enough to fork,
    /// stops it again, re-checks G1–G3, and identifies the copy by the kernel's view:
    /// the germline's only live child, in fresh user, PID, network, IPC and mount
    /// namespaces shared with nothing else alive. A germline that fails any of this is
    /// refused, and the copy (if any) is killed before it holds data.
    pub fn fork_copy(&mut self) -> Result<CopyProcess, ExecutorError> {
        let t0 = Instant::now();
        // A copy that held data is gone before the germline runs again: the broker forks
        // only while no copy of this germline holds data (see `crate::pool`), and the
        // ones retired since the last fork are awaited here.
        self.reap_retired()?;
        let t1 = Instant::now();
        inspect::check_germline(self.pid, &self.allowed)?;
        if let Some(r) = &self._resident {
            // Reported as the germline gone ([`Germline::gone`]).
            r.check()?;
        }
        self.account_processes()?;
        // The germline's live children before the fork: copies it made earlier that are
        // still alive (pooled ones), and nothing else.
        let keeper = self.keeper.as_ref().map(|k| k.pid);
        let before: Vec<i32> = inspect::live_children(self.pid)?.into_iter().filter(|&c| Some(c) != keeper).collect();
        self.copy_pids.retain(|p| before.contains(p));
        if let Some(&stray) = before.iter().find(|p| !self.copy_pids.contains(p)) {
            return Err(ExecutorError::refused(
                "children",
                format!("the germline has a child that is not a copy ({stray}, {})", inspect::comm(stray)),
            ));
        }
        let t_cg = Instant::now();
        let cgroup = match &self.cgroups {
            Some(cg) => Some(cg.enter_copy(self.pid)?),
            None => None,
        };
        let t2 = Instant::now();
        if let Some(c) = &mut self.pid_counter {
            c.reset()?;
        }
        // SIGUSR1 stays pending (the germline blocks it and waits for it) until SIGCONT
        // lets the germline run; it forks once and stops itself.
        self.signal(libc::SIGUSR1)?;
        self.signal(libc::SIGCONT)?;
        let forked = self.wait_stopped(Duration::from_secs(5));
        let t3 = Instant::now();
        if forked.is_err() {
            self.stop()?;
            if let Some(cg) = &self.cgroups {
                cg.leave_copy_now(self.pid, cgroup.as_ref())?;
            }
        } else if let (Some(cg), Some(copy_cg)) = (&self.cgroups, &cgroup) {
            // In the background, into the next copy's cgroups; this copy's view gate waits
            // for it (`crate::cgroup`).
            cg.leave_copy(self.pid, copy_cg);
        }
        let t_left = Instant::now();
        let children: Vec<i32> = inspect::live_children(self.pid)?
            .into_iter()
            .filter(|&c| Some(c) != keeper && !before.contains(&c))
            .collect();
        if let Err(e) = forked {
            kill_all(&children);
            return Err(ExecutorError::Copy(format!("germline could not fork: {e}")));
        }
        let copy_pid = match children.as_slice() {
            [one] => *one,
            _ => {
                kill_all(&children);
                return Err(ExecutorError::refused(
                    "children",
                    format!("{} new live children after fork, expected 1", children.len()),
                ));
            }
        };
        let pidfd = pidfd_open(copy_pid)?;
        self.copy_pids.push(copy_pid);
        let fail = |e: ExecutorError| {
            let _ = pidfd_kill(&pidfd);
            e
        };
        inspect::check_germline(self.pid, &self.allowed).map_err(fail)?;
        if inspect::parent(copy_pid).map_err(fail)? != self.pid {
            return Err(fail(ExecutorError::refused("children", "the copy is not the germline's child")));
        }
        if let Some(k) = &self.keeper {
            if inspect::parent_pid_namespace(copy_pid).map_err(fail)? != k.namespace {
                return Err(fail(ExecutorError::refused(
                    "namespaces",
                    "the copy's PID namespace is not nested in the germline's own",
                )));
            }
        }
        inspect::check_exit_signal(copy_pid).map_err(fail)?;
        // Holding each namespace open keeps its identity from being reused while this copy
        // is tracked as live (namespace inode numbers are recycled as soon as one dies).
        let mut ns = Vec::new();
        let mut ns_files = Vec::new();
        for (i, kind) in COPY_NAMESPACES.iter().enumerate() {
            let f = std::fs::File::open(format!("/proc/{copy_pid}/ns/{kind}"))
                .map_err(|e| fail(ExecutorError::io(format!("opening namespace {kind} of the copy"))(e)))?;
            let m = f.metadata().map_err(|e| fail(ExecutorError::io("namespace identity")(e)))?;
            let id = (m.dev(), m.ino());
            ns_files.push(f);
            if id == self.namespaces[i] {
                return Err(fail(ExecutorError::refused(
                    "namespaces",
                    format!("the copy shares the germline's {kind} namespace"),
                )));
            }
            ns.push(id);
        }
        {
            let mut live = LIVE_COPY_NAMESPACES.lock().unwrap_or_else(|p| p.into_inner());
            if ns.iter().any(|id| live.contains(id)) {
                return Err(fail(ExecutorError::refused("namespaces", "the copy shares a namespace with a live copy")));
            }
            live.extend(ns.iter().copied());
        }
        let lease = match &self.copy_ids {
            Some(block) => Some(block.lend().map_err(fail)?),
            None => None,
        };
        let ids = match &lease {
            Some(l) => CopyIds { offset: l.offset, uid: l.uid, gid: l.gid },
            None => CopyIds { offset: 0, uid: self.host_ids.0, gid: self.host_ids.1 },
        };
        let limited = cgroup.is_some() && self.cgroups.as_ref().is_some_and(CgroupSet::enforces_limits);
        let mut copy = CopyProcess {
            pid: copy_pid,
            pidfd,
            namespaces: ns,
            _namespace_handles: ns_files,
            cgroup,
            timings: CopyTimings::default(),
            scratch: self.scratch.clone().map(|dir| CopyScratch {
                dir,
                seed: self.import_seed.clone(),
                kind: scratch_kind(limited),
            }),
            ids,
            lease,
        };
        // Before the copy holds any data: nothing else came out of the fork window.
        self.account_processes()?;
        copy.timings.reap = t1 - t0;
        copy.timings.checks_before = t_cg - t1;
        copy.timings.cgroup = t2 - t_cg;
        copy.timings.fork = t3 - t2;
        copy.timings.leave_cgroup = t_left - t3;
        copy.timings.checks_after = t_left.elapsed();
        Ok(copy)
    }

    /// Kills `copy` now and leaves waiting for its death to the next fork (or to the
    /// germline's end), so a call's answer is not held up by the copy's teardown.
    pub fn retire(&mut self, copy: CopyProcess) {
        let _ = pidfd_kill(&copy.pidfd);
        // Its descendants too, now: the namespace's own teardown comes only after the
        // copy's memory is freed.
        if let Some(cg) = &copy.cgroup {
            cg.kill_members();
        }
        // Its memory is unmapped from a worker on the other core (`process_mrelease`,
        // Linux 5.15+) while its own exit does the rest: the next copy of a call waits for
        // its death, and a forked copy's exit was mostly unmapping what it shares with the
        // germline. The copy's own exit still takes the address space down under the
        // mmap lock, after the worker is done with it, so it is all gone once its pidfd
        // says it exited, as before. Errors (an older kernel, a copy already gone) leave
        // the exit to do it all.
        if let Ok(fd) = copy.pidfd.try_clone() {
            crate::workers::run(move || {
                // SAFETY: on a pidfd we own; the call reads nothing of ours.
                unsafe { libc::syscall(libc::SYS_process_mrelease, fd.as_raw_fd(), 0) };
            });
        }
        self.retired.push(copy);
    }

    pub(crate) fn reap_retired(&mut self) -> Result<(), ExecutorError> {
        for copy in std::mem::take(&mut self.retired) {
            copy.kill()?;
        }
        Ok(())
    }
}

impl Drop for Germline {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = self.signal(libc::SIGKILL);
        let _ = self.signal(libc::SIGCONT);
        if self.keeper.is_none() && child.id() as i32 != self.pid {
            // Started but not yet identified: whatever the first process forked dies too.
            if let Ok(children) = inspect::live_children(child.id() as i32) {
                kill_all(&children);
            }
        }
        // The keeper's drop tears the germline's PID namespace down.
        drop(self.keeper.take());
        let _ = child.kill();
        // Reaping the germline and killing whatever is left in its cgroups (strays
        // included) happens off the caller's path.
        let cgroups = self.cgroups.take();
        std::thread::spawn(move || {
            let _ = child.wait();
            drop(cgroups);
        });
    }
}

/// Switch for comparisons: germlines started while it is set keep their heap in small
/// pages ([`collapse_heap`] is skipped). Performance only: no guarantee rests on it.
/// `GERMLINE_HUGE_HEAP=0` in the broker's environment sets it too.
pub static HUGE_HEAP_OFF: AtomicBool = AtomicBool::new(false);

fn huge_heap() -> bool {
    !HUGE_HEAP_OFF.load(Ordering::SeqCst) && std::env::var_os("GERMLINE_HUGE_HEAP").is_none_or(|v| v != "0")
}

/// Backs the stopped, data-free germline's heap (its private anonymous mappings) with
/// huge pages, from outside (`process_madvise` with `MADV_COLLAPSE`, which needs
/// `CAP_SYS_NICE`). A fork then shares each 2 MiB of it with one page-table entry instead
/// of 512, and a copy's exit drops one, not 512. Of a Python germline's ~41 MiB of private
/// anonymous memory ~16–20 MiB is collapsed (CPython's 1 MiB arenas, mapped one by one
/// between other mappings, rarely fill an aligned 2 MiB range), and in `germline bench` a
/// fork and a copy's exit take about a quarter less time. A copy that writes into such
/// a page gets a copy of the 4 KiB it wrote, as before (the kernel splits the copy's
/// mapping, never the germline's page). The mappings are not marked for huge pages
/// (`MADV_HUGEPAGE`): a copy's own new memory is backed as it would be without this, and
/// `khugepaged` never scans it for this. Performance only: where the kernel refuses
/// (an older one, a broker without the capability) or has no free huge page, the heap
/// stays as it was.
fn collapse_heap(pidfd: &OwnedFd, pid: i32) {
    const HUGE: u64 = 2 << 20;
    let Ok(ranges) = inspect::private_anonymous_ranges(pid) else {
        return;
    };
    let mut made = 0;
    for (start, end) in ranges {
        let (s, e) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
        if e <= s {
            continue;
        }
        let iov = libc::iovec { iov_base: s as *mut libc::c_void, iov_len: (e - s) as usize };
        // SAFETY: advice on another process's memory through a pidfd we own; the iovec
        // names its addresses, none of ours is read or written.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd.as_raw_fd(),
                &iov as *const libc::iovec,
                1,
                libc::MADV_COLLAPSE,
                0,
            )
        };
        if rc >= 0 {
            made += ((e - s) / HUGE) as usize;
            continue;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            // No free huge page, or a page that could not be taken now: the next range may.
            Some(libc::ENOMEM | libc::EAGAIN) => {}
            Some(e) => {
                tracing::debug!(errno = e, "a germline's heap is not backed with huge pages (process_madvise refused)");
                break;
            }
            None => break,
        }
    }
    tracing::debug!(huge_pages = made, "germline heap collapsed into huge pages");
}

fn live_pid_namespaces() -> BTreeSet<NsId> {
    LIVE_COPY_NAMESPACES.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

fn kill_all(pids: &[i32]) {
    for p in pids {
        if let Ok(fd) = pidfd_open(*p) {
            let _ = pidfd_kill(&fd);
        }
    }
}

fn pidfd_open(pid: i32) -> Result<OwnedFd, ExecutorError> {
    // SAFETY: pidfd_open returns a new descriptor we take ownership of.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(ExecutorError::io(format!("pidfd_open({pid})"))(std::io::Error::last_os_error()));
    }
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The first wait in [`pause_stopped`] between reading a copy's thread states; each
/// later one doubles, up to [`STOP_POLL_MAX`].
const STOP_POLL_FIRST: Duration = Duration::from_micros(25);
const STOP_POLL_MAX: Duration = Duration::from_micros(400);

/// [`CopyProcess::pause_idle`] by the copy's pidfd and pid.
fn pause_stopped(pidfd: &OwnedFd, pid: i32, check_children: bool) -> Result<(), ExecutorError> {
    signal(pidfd, libc::SIGSTOP)?;
    let until = Instant::now() + Duration::from_secs(2);
    // No event tells a process other than its parent that a process stopped, so its
    // threads' states are read again until every one is stopped. An idle copy stops as
    // soon as it is scheduled; on a busy machine that can take a scheduler slice or more,
    // so the waits between readings grow (each reading lists the threads and reads each
    // one's `stat`, most of this loop's cost) instead of reading every 100 us.
    let mut wait = STOP_POLL_FIRST;
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", pid))
            .map_err(ExecutorError::io("listing a pooled copy's threads"))?;
        let mut running = false;
        for t in tasks.flatten() {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let state = stat.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next());
            running |= !matches!(state, Some('T' | 't' | 'Z' | 'X') | None);
        }
        if !running {
            break;
        }
        if Instant::now() > until {
            return Err(ExecutorError::Copy("a pooled copy did not stop".into()));
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(STOP_POLL_MAX);
    }
    if check_children {
        if let Some(&c) = inspect::live_children(pid)?.first() {
            return Err(ExecutorError::Copy(format!(
                "a data-free copy keeps a process of its own running ({c}, {}) once its server is ready: \
                 it cannot wait in the pool",
                inspect::comm(c)
            )));
        }
    }
    Ok(())
}

/// Sends `sig` to a copy through its pidfd.
fn signal(pidfd: &OwnedFd, sig: i32) -> Result<(), ExecutorError> {
    // SAFETY: signalling through a pidfd we own.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), sig, 0, 0) };
    if rc < 0 {
        return Err(ExecutorError::io("signalling a copy")(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Whether the process behind `fd` has exited (a pidfd is readable then), without waiting.
fn pidfd_exited(fd: &OwnedFd) -> std::io::Result<bool> {
    let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll on one pidfd the caller owns, without waiting.
    match unsafe { libc::poll(&mut pfd, 1, 0) } {
        n if n < 0 => Err(std::io::Error::last_os_error()),
        n => Ok(n > 0),
    }
}

fn pidfd_kill(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: signalling through a pidfd we own.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), libc::SIGKILL, 0, 0) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(e);
        }
    }
    Ok(())
}

/// One live copy, held by a pidfd so a recycled pid can never be mistaken for it.
pub struct CopyProcess {
    /// The copy's pid in the broker's PID namespace.
    pub pid: i32,
    pidfd: OwnedFd,
    namespaces: Vec<NsId>,
    _namespace_handles: Vec<std::fs::File>,
    cgroup: Option<CopyCgroup>,
    /// Reap, checks and fork phases of this copy (the broker adds the rest).
    pub timings: CopyTimings,
    /// Where the broker mounts this copy's private scratch tmpfs, and what it starts with.
    pub scratch: Option<CopyScratch>,
    ids: CopyIds,
    /// The copy's ids, given back once it is dead.
    lease: Option<IdLease>,
}

impl CopyProcess {
    /// Lets the copy connect to its channel: its listeners are in place. (The copy waits
    /// for this signal instead of retrying its connection; nothing rides on it.)
    pub fn channel_ready(&self) -> Result<(), ExecutorError> {
        self.send(libc::SIGUSR2)
    }

    /// Stops the copy (SIGSTOP) and waits until every thread of it has stopped; then
    /// refuses a copy that has any other process (a child, or an orphan reparented to it,
    /// PID 1 of its namespace): an idle pooled copy must have nothing running while another
    /// copy of its germline holds data (`crate::pool`). With `check_children` off (tests
    /// only, "mechanism off") the children are left running.
    pub fn pause_idle(&self, check_children: bool) -> Result<(), ExecutorError> {
        pause_stopped(&self.pidfd, self.pid, check_children)
    }

    /// Whether the copy is stopped and has no other process (checked again when a call
    /// takes a pooled copy).
    pub fn idle(&self) -> bool {
        matches!(inspect::state(self.pid), Ok('T' | 't'))
            && inspect::live_children(self.pid).map(|c| c.is_empty()).unwrap_or(false)
    }

    /// Lets a paused copy run again (SIGCONT).
    pub fn resume(&self) -> Result<(), ExecutorError> {
        self.send(libc::SIGCONT)
    }

    /// Whether the copy has exited (its pidfd is readable then).
    pub fn exited(&self) -> bool {
        // A pidfd that cannot be polled counts as exited: the copy is not used.
        pidfd_exited(&self.pidfd).unwrap_or(true)
    }

    fn send(&self, sig: i32) -> Result<(), ExecutorError> {
        signal(&self.pidfd, sig)
    }

    /// Kills the copy; as PID 1 of its PID namespace, every descendant dies with it.
    /// Waits (bounded) until the kernel reports it gone.
    pub fn kill(&self) -> Result<(), ExecutorError> {
        pidfd_kill(&self.pidfd).map_err(ExecutorError::io("killing a copy"))?;
        let mut pfd = libc::pollfd { fd: self.pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: poll on one pidfd we own.
        let rc = unsafe { libc::poll(&mut pfd, 1, 5000) };
        if rc <= 0 {
            return Err(ExecutorError::Copy("copy did not die within 5 s of SIGKILL".into()));
        }
        Ok(())
    }

    /// A handle that can kill this copy from another thread (the deadline watchdog).
    pub fn killer(&self) -> Result<CopyKiller, ExecutorError> {
        let fd = self.pidfd.try_clone().map_err(ExecutorError::io("duplicating pidfd"))?;
        Ok(CopyKiller(fd))
    }

    /// The ids the copy must run as before it is given data.
    pub fn ids(&self) -> CopyIds {
        self.ids
    }

    /// What must have happened before the copy is given data: the germline out of the
    /// copy's cgroups.
    pub fn departure(&self) -> Departure {
        self.cgroup.as_ref().map_or_else(Departure::done, CopyCgroup::departure)
    }

    /// The copy's network namespace identity.
    pub fn net_namespace(&self) -> NsId {
        self.namespaces[2]
    }

    /// The copy's PID namespace identity (all its descendants live there).
    pub fn pid_namespace(&self) -> NsId {
        self.namespaces[1]
    }
}

impl Drop for CopyProcess {
    fn drop(&mut self) {
        // Its ids are reused only once it is dead (a copy that does not die keeps them).
        if self.kill().is_ok() {
            if let Some(lease) = self.lease.take() {
                lease.give_back();
            }
        }
        let mut live = LIVE_COPY_NAMESPACES.lock().unwrap_or_else(|p| p.into_inner());
        for id in &self.namespaces {
            live.remove(id);
        }
    }
}

/// Kills a copy from another thread.
pub struct CopyKiller(OwnedFd);

impl CopyKiller {
    /// Sends SIGKILL to the copy.
    pub fn kill(&self) {
        let _ = pidfd_kill(&self.0);
    }

    /// A duplicate of the copy's pidfd: readable once the copy has exited.
    pub fn pidfd(&self) -> std::io::Result<OwnedFd> {
        self.0.try_clone()
    }

    /// Stops the copy (pid `pid`) as [`CopyProcess::pause_idle`] does: every thread
    /// stopped, and (`check_children`) no other process of it.
    pub fn pause(&self, pid: i32, check_children: bool) -> Result<(), ExecutorError> {
        pause_stopped(&self.0, pid, check_children)
    }

    /// Lets a copy stopped by [`CopyKiller::pause`] run again.
    pub fn resume(&self) -> Result<(), ExecutorError> {
        signal(&self.0, libc::SIGCONT)
    }
}

/// The port a copy's channel connects to (for tests and docs).
pub const fn channel_port() -> u16 {
    CHANNEL_PORT
}

/// The admission-time germline check: starts the release's germline with no data roots,
/// checks G1–G3, forks one copy (G1–G3 again before and after the fork, namespaces
/// verified) and kills it. Returns how long the germline took to start.
pub fn check_release(release_dir: &Path, runtime: PythonRuntime) -> Result<Duration, ExecutorError> {
    let manifest = crate::manifest::Manifest::load(release_dir)?;
    let spec = GermlineSpec {
        runtime,
        release_dir: release_dir.to_path_buf(),
        data_roots: Vec::new(),
        limits: ResourceLimits::default(),
        start_timeout: Duration::from_secs(60),
        extra_read: Vec::new(),
        system_paths: manifest.system_paths_on_host(),
        cgroup_limits: None,
        switches: SandboxSwitches::default(),
        require_limits: false,
        seccomp: SeccompPolicy::germline(),
        env: germline_environment(&manifest.env, &Default::default())?,
        copy_source: manifest.copy_source,
        scratch_paths: manifest.scratch.clone(),
        resident_root: crate::policy::default_resident_root(),
        own_tree: false,
    };
    let mut g = Germline::start(&spec)?;
    let copy = g.fork_copy()?;
    copy.kill()?;
    Ok(g.start_time)
}
