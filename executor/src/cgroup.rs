//! The germline's cgroups: every process it or its copies make is born inside them, so
//! the broker can account for each one (no process it did not make), kill all of them,
//! and hold each copy to memory and process limits.
//!
//! cgroup v1 (`memory` and `pids` hierarchies) where the host has them writable; else a
//! cgroup v2 hierarchy (the unified one), with limits where its `memory` and `pids`
//! controllers can be enabled for our subtree and accounting only where they cannot.
//! Where neither can be written, per-process rlimits are all that applies: the germline
//! start warns every time, `/readyz` says so, and `[limits] require_limits = true` refuses.
//!
//! A copy must start inside its cgroup, or its first children could escape the limit.
//! Since the germline forks the copy, the broker moves the (stopped) germline into the
//! copy's fresh cgroup before letting it fork, and out again right after, straight into
//! the next copy's fresh cgroup: the copy and everything it spawns are born inside.
//! Charges do not move with a task: what the germline had before stays billed where it
//! was, but what it faults in during the fork window (release code runs there) is billed to
//! the copy and stays there, so the copy can evict those file pages by filling its own
//! cgroup (SECURITY.md, page-cache residency; `tests/attacks/kernel/memcgevict`).
//!
//! Moving a task between cgroups waits for an RCU grace period on cgroup v1 (the kernel
//! takes `cgroup_threadgroup_rwsem` for writing): milliseconds, more on an idle VM. So the
//! move out runs in the background while the copy is set up, and the copy's view gate
//! waits for it ([`Departure`]): the germline never shares a cgroup (memory, process
//! count, OOM choice) with a copy that holds data, only with a data-free copy it just
//! forked, which is stopped or setting up.

use std::ffi::CString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::ExecutorError;

const V1_ROOT: &str = "/sys/fs/cgroup";

/// Test-only switch: behave as on a host with no writable cgroup hierarchy.
pub static NO_CGROUPS_FOR_TESTS: AtomicBool = AtomicBool::new(false);
/// Test-only switch: a germline's cgroup directory is made under a name with a newline in
/// it, which cgroupfs refuses (EINVAL): a real `mkdir` failure on a host that offers
/// cgroups. Never set outside tests.
pub static MKDIR_FAILS_FOR_TESTS: AtomicBool = AtomicBool::new(false);
/// Test-only switch ("mechanism off"): a germline whose cgroups could not be made starts
/// without them, with a warning, as before. Never set outside tests.
pub static CREATE_FALLBACK_FOR_TESTS: AtomicBool = AtomicBool::new(false);
/// Test-only switch: use the cgroup v2 hierarchy even where v1 is available.
pub static PREFER_V2_FOR_TESTS: AtomicBool = AtomicBool::new(false);
/// Test-only switch ("mechanism off"): the germline stays in a copy's cgroups after the
/// fork (until the next fork moves it) and the copy's view gate does not wait for it.
/// Never set outside tests.
pub static DEPARTURE_OFF_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// Limits applied to each copy's cgroup.
#[derive(Clone, Copy, Debug)]
pub struct CgroupLimits {
    /// Memory limit in bytes (`memory.limit_in_bytes` / `memory.max`).
    pub memory_bytes: u64,
    /// `pids.max`.
    pub processes: u64,
}

#[derive(Clone, Debug)]
enum Backend {
    /// v1: the germline sits in `memory` and `pids`; copies in `copy-N` below each.
    V1 { memory: PathBuf, pids: PathBuf },
    /// v2: `root/germline` holds the germline and `root/copy-N` each copy (a v2 cgroup
    /// with processes cannot hand controllers to children, so `root` itself stays empty).
    V2 { root: PathBuf, limits: bool },
}

/// A background move of the germline into the next copy's cgroups (their directories).
type Staging = std::thread::JoinHandle<Result<Vec<PathBuf>, ExecutorError>>;

/// The cgroups of one germline: its own, and a fresh one per copy.
#[derive(Debug)]
pub struct CgroupSet {
    backend: Backend,
    limits: Option<CgroupLimits>,
    next: AtomicU64,
    /// The next copy's cgroups, which the stopped germline is moved into off the call's
    /// path once no copy of it is left alive (a move between cgroups waits for an RCU
    /// grace period: milliseconds on a loaded host).
    staged: std::sync::Mutex<Option<Staging>>,
}

/// What this host offers for per-copy limits and process accounting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostSupport {
    /// cgroup v1 memory and pids.
    V1,
    /// cgroup v2; `limits` says whether memory and pids controllers are available.
    V2 {
        /// Memory and pids controllers can be enabled below our cgroup.
        limits: bool,
    },
    /// No writable hierarchy.
    None,
}

impl HostSupport {
    /// Whether per-copy memory and process limits are enforced by a cgroup.
    pub fn limits(&self) -> bool {
        matches!(self, HostSupport::V1 | HostSupport::V2 { limits: true })
    }

    /// One line for logs and `/readyz`.
    pub fn describe(&self) -> &'static str {
        match self {
            HostSupport::V1 => "cgroup v1 memory and pids per copy, plus rlimits per process",
            HostSupport::V2 { limits: true } => "cgroup v2 memory.max and pids.max per copy, plus rlimits per process",
            HostSupport::V2 { limits: false } => {
                "NO per-copy cgroup limits (cgroup v2 without memory/pids controllers): rlimits per process only"
            }
            HostSupport::None => "NO per-copy cgroup limits (no writable cgroup hierarchy): rlimits per process only",
        }
    }
}

/// Probes the host without changing anything.
pub fn host_support() -> HostSupport {
    if NO_CGROUPS_FOR_TESTS.load(Ordering::SeqCst) {
        return HostSupport::None;
    }
    if !PREFER_V2_FOR_TESTS.load(Ordering::SeqCst) && v1_available() {
        return HostSupport::V1;
    }
    match v2_base() {
        Some(base) if writable(&base) => HostSupport::V2 { limits: v2_controllers(&base) },
        _ if v1_available() => HostSupport::V1,
        _ => HostSupport::None,
    }
}

fn writable(p: &Path) -> bool {
    let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: access on a NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

fn v1_available() -> bool {
    ["memory", "pids"].iter().all(|c| writable(&Path::new(V1_ROOT).join(c).join("cgroup.procs")))
}

/// The broker's own cgroup in the unified hierarchy.
fn v2_base() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mounts.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next() == Some("cgroup2")).then(|| pre.split_whitespace().nth(4).map(PathBuf::from))?
    })?;
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim_start_matches('/')))
}

fn v2_controllers(base: &Path) -> bool {
    fs::read_to_string(base.join("cgroup.controllers"))
        .map(|c| c.split_whitespace().any(|x| x == "memory") && c.split_whitespace().any(|x| x == "pids"))
        .unwrap_or(false)
}

/// Passes the memory and pids controllers down `levels`, top first: whether they reach the
/// last. The kernel refuses them below the top level when it holds processes (EBUSY: the
/// broker's own cgroup, unless it is the hierarchy's root) or is threaded (EOPNOTSUPP): a
/// property of where the broker runs, so copies get accounting without limits, as
/// [`HostSupport::describe`] says. Any other refusal is an error.
fn enable_controllers(levels: &[&Path]) -> Result<bool, ExecutorError> {
    for (i, d) in levels.iter().enumerate() {
        if let Err(e) = fs::write(d.join("cgroup.subtree_control"), "+memory +pids") {
            if i == 0 && matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EOPNOTSUPP)) {
                return Ok(false);
            }
            return Err(ExecutorError::Sandbox(format!(
                "the host offers cgroup v2 memory and pids controllers, but they could not be enabled in {} ({e}): \
                 the germline is not started without them",
                d.display()
            )));
        }
    }
    Ok(true)
}

impl CgroupSet {
    /// Creates `germline/<name>` under the hierarchy [`host_support`] finds: `Ok(None)`
    /// where the host offers none (the documented rlimits-only case, which the caller warns
    /// of). Where it offers one, a germline that cannot have its cgroups is refused with
    /// the kernel's error, never started without them: that would take its process
    /// accounting and its copies' limits (and so their ramfs scratch) away on a failure of
    /// the moment, with `/readyz` still saying the host has them.
    pub fn create(name: &str, limits: Option<CgroupLimits>) -> Result<Option<CgroupSet>, ExecutorError> {
        static REAPED: std::sync::Once = std::sync::Once::new();
        REAPED.call_once(|| {
            for parent in germline_parents() {
                reap_abandoned(&parent);
            }
        });
        let name = if MKDIR_FAILS_FOR_TESTS.load(Ordering::SeqCst) { format!("{name}\n") } else { name.to_owned() };
        let mkdir = |d: &Path| {
            fs::create_dir_all(d).map_err(|e| {
                ExecutorError::Sandbox(format!(
                    "the host offers cgroups, but the germline's cgroup {:?} could not be made ({e}): it is not \
                     started without one",
                    d
                ))
            })
        };
        let backend = match host_support() {
            HostSupport::V1 => {
                let memory = Path::new(V1_ROOT).join("memory").join("germline").join(&name);
                let pids = Path::new(V1_ROOT).join("pids").join("germline").join(&name);
                mkdir(&memory)?;
                if let Err(e) = mkdir(&pids) {
                    let _ = fs::remove_dir(&memory);
                    return Err(e);
                }
                Backend::V1 { memory, pids }
            }
            HostSupport::V2 { limits: wanted } => {
                let base = v2_base().ok_or_else(|| {
                    ExecutorError::Sandbox("the broker's own cgroup v2 directory is no longer found".into())
                })?;
                let parent = base.join("germline");
                mkdir(&parent)?;
                let root = parent.join(&name);
                if let Err(e) = mkdir(&root.join("germline")) {
                    let _ = fs::remove_dir(&root);
                    return Err(e);
                }
                // Dropped (and so removed) if the controllers below refuse it.
                let mut set = CgroupSet {
                    backend: Backend::V2 { root: root.clone(), limits: false },
                    limits,
                    next: AtomicU64::new(0),
                    staged: std::sync::Mutex::new(None),
                };
                if wanted {
                    set.backend = Backend::V2 { limits: enable_controllers(&[&base, &parent, &root])?, root };
                }
                return Ok(Some(set));
            }
            HostSupport::None => return Ok(None),
        };
        Ok(Some(CgroupSet { backend, limits, next: AtomicU64::new(0), staged: std::sync::Mutex::new(None) }))
    }

    /// Whether this set holds copies to memory and process limits.
    pub fn enforces_limits(&self) -> bool {
        self.limits.is_some() && self.support().limits()
    }

    /// What this set offers, for logs.
    pub fn support(&self) -> HostSupport {
        match self.backend {
            Backend::V1 { .. } => HostSupport::V1,
            Backend::V2 { limits, .. } => HostSupport::V2 { limits },
        }
    }

    /// The `cgroup.procs` files the germline joins (by writing "0") before it execs.
    pub fn join_files(&self) -> Vec<CString> {
        self.own_dirs()
            .iter()
            .filter_map(|d| CString::new(d.join("cgroup.procs").as_os_str().as_encoded_bytes()).ok())
            .collect()
    }

    fn own_dirs(&self) -> Vec<PathBuf> {
        match &self.backend {
            Backend::V1 { memory, pids } => vec![memory.clone(), pids.clone()],
            Backend::V2 { root, .. } => vec![root.join("germline")],
        }
    }

    /// Where membership is read: the directory whose subtree holds every process.
    fn accounting_root(&self) -> &Path {
        match &self.backend {
            Backend::V1 { pids, .. } => pids,
            Backend::V2 { root, .. } => root,
        }
    }

    /// Every process in the germline's cgroups and its copies' (sorted).
    pub fn processes(&self) -> Vec<i32> {
        let mut out = Vec::new();
        collect_procs(self.accounting_root(), 0, &mut out);
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Puts `pid` (the stopped germline) into a fresh per-copy cgroup, so the copy it
    /// forks next is born there: the cgroup [`CgroupSet::stage_next`] moved it into, or
    /// (none staged, or staging failed) a new one now.
    pub fn enter_copy(&self, pid: i32) -> Result<CopyCgroup, ExecutorError> {
        let staged = self.staged.lock().unwrap_or_else(|p| p.into_inner()).take();
        let dirs = match staged.and_then(|h| h.join().ok()).and_then(Result::ok) {
            Some(dirs) => dirs,
            None => {
                let dirs = make_copy_dirs(&self.backend, self.limits, self.next.fetch_add(1, Ordering::SeqCst))?;
                join_dirs(&dirs, pid)?;
                dirs
            }
        };
        Ok(CopyCgroup {
            dirs,
            v2: matches!(self.backend, Backend::V2 { .. }),
            germline: pid,
            departure: Departure::default(),
        })
    }

    /// Takes `pid` (the stopped germline, which has just forked the copy of `copy`) out
    /// of the copy's cgroups, in the background: straight into a fresh cgroup for the next
    /// copy, or (that failing) back into its own. The copy is given nothing until the move
    /// is done: [`CopyCgroup::departure`] is what its view gate waits for. Then the next
    /// fork finds its cgroup staged ([`CgroupSet::enter_copy`]).
    pub fn leave_copy(&self, pid: i32, copy: &CopyCgroup) {
        if DEPARTURE_OFF_FOR_TESTS.load(Ordering::SeqCst) {
            copy.departure.set(Ok(()));
            return;
        }
        self.stage(pid, Some(copy.departure.clone()));
    }

    /// Puts `pid` back into the germline's own cgroups now (a fork that failed), out of
    /// those of `copy`.
    pub fn leave_copy_now(&self, pid: i32, copy: Option<&CopyCgroup>) -> Result<(), ExecutorError> {
        let left = join_dirs(&self.own_dirs(), pid);
        if let Some(c) = copy {
            c.departure.set(left.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        }
        left
    }

    /// Moves `pid` (the stopped germline, at its start) into
    /// a fresh cgroup for the next copy, in the background; [`CgroupSet::enter_copy`]
    /// waits for it. Meanwhile the germline is in its own cgroup or that fresh one: it
    /// never shares a cgroup (memory, process count, OOM choice) with a copy that may
    /// have received data, only with the data-free copy it is forking, and is out before
    /// that copy is given any ([`CgroupSet::leave_copy`]).
    pub fn stage_next(&self, pid: i32) {
        self.stage(pid, None);
    }

    /// Moves `pid` into a fresh cgroup for the next copy in a background thread, which
    /// [`CgroupSet::enter_copy`] joins. With `departure` (the germline leaving a copy's
    /// cgroups), a move that fails puts it back into its own cgroups instead, and the
    /// outcome is set there.
    fn stage(&self, pid: i32, departure: Option<Departure>) {
        let mut staged = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = staged.take() {
            // Not used for a copy (a fork without enter_copy): removed when the set is.
            let _ = h.join();
        }
        let (backend, limits, own) = (self.backend.clone(), self.limits, self.own_dirs());
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        *staged = Some(std::thread::spawn(move || {
            let next = make_copy_dirs(&backend, limits, n).and_then(|dirs| join_dirs(&dirs, pid).map(|()| dirs));
            if let Some(d) = departure {
                d.set(match &next {
                    Ok(_) => Ok(()),
                    Err(_) => join_dirs(&own, pid).map_err(|e| e.to_string()),
                });
            }
            next
        }));
    }
}

/// The `germline` directories every broker's sets live under, in the hierarchy
/// [`host_support`] finds.
fn germline_parents() -> Vec<PathBuf> {
    match host_support() {
        HostSupport::V1 => ["memory", "pids"].iter().map(|c| Path::new(V1_ROOT).join(c).join("germline")).collect(),
        HostSupport::V2 { .. } => v2_base().map(|b| vec![b.join("germline")]).unwrap_or_default(),
        HostSupport::None => Vec::new(),
    }
}

/// Removes what brokers that are gone left under `parent`. A broker killed outright
/// (SIGKILL, the OOM killer, a crash) never drops its sets, and their directories would
/// stay for good: a memory and a pids cgroup per germline and per copy it had staged, each
/// kernel state that slows every later cgroup operation. A set's name starts with the pid
/// of the broker that made it (`<pid>-<n>`); a set is abandoned when no process has that
/// pid and no process is left anywhere in its subtree. Anything holding a process, or
/// named otherwise, is left alone. Returns how many sets were removed.
///
/// Brokers that share one cgroup hierarchy must share a PID namespace: a broker in another
/// one looks gone from here, and the empty cgroups it staged for its next copies would be
/// removed (its next fork then fails, as for any cgroup it cannot enter).
fn reap_abandoned(parent: &Path) -> usize {
    let Ok(entries) = fs::read_dir(parent) else { return 0 };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.split_once('-')).and_then(|(p, _)| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = e.path();
        let mut procs = Vec::new();
        collect_procs(&dir, 0, &mut procs);
        if procs.is_empty() && remove_empty_tree(&dir, 0) {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!(removed, parent = %parent.display(), "removed the cgroups of brokers that are gone");
    }
    removed
}

/// Removes an empty cgroup subtree, deepest first, in one attempt each; whether `dir` is gone.
fn remove_empty_tree(dir: &Path, depth: usize) -> bool {
    if depth < 8 {
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    remove_empty_tree(&e.path(), depth + 1);
                }
            }
        }
    }
    fs::remove_dir(dir).is_ok()
}

fn collect_procs(dir: &Path, depth: usize, out: &mut Vec<i32>) {
    if let Ok(s) = fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    if depth >= 8 {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_procs(&e.path(), depth + 1, out);
            }
        }
    }
}

/// Kills every process in `dir`'s subtree (`cgroup.kill` on v2) and removes the
/// directories, deepest first; bounded in time.
fn kill_and_remove(dir: &Path, v2: bool, spare: Option<i32>) {
    if v2 {
        let _ = fs::write(dir.join("cgroup.kill"), "1");
    }
    for _ in 0..200 {
        let mut pids = Vec::new();
        collect_procs(dir, 0, &mut pids);
        pids.retain(|&p| Some(p) != spare);
        if pids.is_empty() {
            break;
        }
        for p in pids {
            // SAFETY: SIGKILL to a process in a cgroup only germline processes can enter.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    remove_tree(dir, 0);
}

fn remove_tree(dir: &Path, depth: usize) {
    if depth < 8 {
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    remove_tree(&e.path(), depth + 1);
                }
            }
        }
    }
    for _ in 0..50 {
        if fs::remove_dir(dir).is_ok() || !dir.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

impl Drop for CgroupSet {
    fn drop(&mut self) {
        // A cgroup still being made would be left behind by the removal below.
        if let Some(h) = self.staged.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
        match &self.backend {
            Backend::V1 { memory, pids } => {
                kill_and_remove(pids, false, None);
                kill_and_remove(memory, false, None);
            }
            Backend::V2 { root, .. } => kill_and_remove(root, true, None),
        }
    }
}

/// Whether the germline has left a copy's cgroups: set once by the thread that moves it
/// ([`CgroupSet::leave_copy`]), waited for before the copy is given any data and before
/// anything kills the cgroup's members.
#[derive(Clone, Debug, Default)]
pub struct Departure(Arc<(Mutex<Option<Moved>>, Condvar)>);

/// How a move out of a copy's cgroups ended (the error as text).
type Moved = Result<(), String>;

/// How long a move out of a copy's cgroups may take before the copy is refused its data.
const DEPARTURE_TIMEOUT: Duration = Duration::from_secs(10);

impl Departure {
    /// A departure that already happened (the germline was never in the copy's cgroups).
    pub fn done() -> Departure {
        let d = Departure::default();
        d.set(Ok(()));
        d
    }

    fn set(&self, r: Moved) {
        let (m, cv) = &*self.0;
        *m.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        cv.notify_all();
    }

    /// Waits until the germline is out of the copy's cgroups; an error if the move failed
    /// or did not end in time (the copy must then not be given data).
    pub fn wait(&self) -> Result<(), ExecutorError> {
        let (m, cv) = &*self.0;
        let until = Instant::now() + DEPARTURE_TIMEOUT;
        let mut st = m.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match &*st {
                Some(Ok(())) => return Ok(()),
                Some(Err(e)) => {
                    return Err(ExecutorError::Copy(format!("the germline could not leave the copy's cgroups: {e}")))
                }
                None => {}
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ExecutorError::Copy("the germline did not leave the copy's cgroups in time".into()));
            }
            st = cv.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// A copy's cgroups; emptied and removed once the copy is gone.
#[derive(Debug)]
pub struct CopyCgroup {
    dirs: Vec<PathBuf>,
    v2: bool,
    /// The germline, which forked the copy from inside these cgroups.
    germline: i32,
    /// Whether the germline has left them.
    departure: Departure,
}

impl CopyCgroup {
    /// What the copy's view gate waits for: the germline out of these cgroups.
    pub fn departure(&self) -> Departure {
        self.departure.clone()
    }

    /// Sends SIGKILL to every process in the copy's cgroups (the copy and everything it
    /// started), so none of them runs again while the copy's PID namespace winds down.
    pub fn kill_members(&self) {
        // Not before the germline is out (it is never killed here: its move out may have
        // failed).
        let _ = self.departure.wait();
        for d in &self.dirs {
            let mut pids = Vec::new();
            collect_procs(d, 0, &mut pids);
            for p in pids.into_iter().filter(|&p| p != self.germline) {
                // SAFETY: SIGKILL to a process in a cgroup only this copy's processes can enter.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
    }

    /// Peak memory the copy used, where the kernel reports it.
    pub fn peak_memory(&self) -> Option<u64> {
        let file = if self.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        fs::read_to_string(self.dirs[0].join(file)).ok()?.trim().parse().ok()
    }
}

impl Drop for CopyCgroup {
    fn drop(&mut self) {
        // Whatever is left inside (the copy is dead by now) is killed with it; off the
        // caller's path (removing a memory cgroup costs milliseconds). Anything still
        // there at the next fork is not in a live copy, so process accounting refuses it.
        let (dirs, v2, germline, departure) =
            (std::mem::take(&mut self.dirs), self.v2, self.germline, self.departure.clone());
        std::thread::spawn(move || {
            // Not before the germline is out, and never the germline (its move out may have
            // failed): `cgroup.kill` only once it is known gone from here.
            let out = departure.wait().is_ok() && !DEPARTURE_OFF_FOR_TESTS.load(Ordering::SeqCst);
            for d in &dirs {
                kill_and_remove(d, v2 && out, Some(germline));
            }
        });
    }
}

fn join_dirs(dirs: &[PathBuf], pid: i32) -> Result<(), ExecutorError> {
    for d in dirs {
        fs::write(d.join("cgroup.procs"), pid.to_string())
            .map_err(ExecutorError::io(format!("cgroup {}", d.display())))?;
    }
    Ok(())
}

/// Makes copy `n`'s cgroups with their limits, empty.
fn make_copy_dirs(backend: &Backend, limits: Option<CgroupLimits>, n: u64) -> Result<Vec<PathBuf>, ExecutorError> {
    let io = |p: &Path| ExecutorError::io(format!("cgroup {}", p.display()));
    Ok(match backend {
        Backend::V1 { memory, pids } => {
            let mem = memory.join(format!("copy-{n}"));
            let pids = pids.join(format!("copy-{n}"));
            fs::create_dir_all(&mem).map_err(io(&mem))?;
            fs::create_dir_all(&pids).map_err(io(&pids))?;
            if let Some(l) = &limits {
                fs::write(mem.join("memory.limit_in_bytes"), l.memory_bytes.to_string()).map_err(io(&mem))?;
                let _ = fs::write(mem.join("memory.memsw.limit_in_bytes"), l.memory_bytes.to_string());
                fs::write(pids.join("pids.max"), l.processes.to_string()).map_err(io(&pids))?;
            }
            vec![mem, pids]
        }
        Backend::V2 { root, limits: enforced } => {
            let dir = root.join(format!("copy-{n}"));
            fs::create_dir_all(&dir).map_err(io(&dir))?;
            if let (true, Some(l)) = (*enforced, &limits) {
                fs::write(dir.join("memory.max"), l.memory_bytes.to_string()).map_err(io(&dir))?;
                let _ = fs::write(dir.join("memory.swap.max"), "0");
                fs::write(dir.join("pids.max"), l.processes.to_string()).map_err(io(&dir))?;
            }
            vec![dir]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroups_of_a_broker_that_is_gone_are_removed_and_live_ones_kept() {
        if germline_parents().is_empty() || !matches!(host_support(), HostSupport::V1 | HostSupport::V2 { .. }) {
            eprintln!("no cgroup hierarchy germline can write here: nothing to show");
            return;
        }
        // A pid no process has: a child that ran and was reaped.
        let mut child = std::process::Command::new("true").spawn().expect("true");
        let gone = child.id();
        child.wait().expect("wait");
        // What a broker killed outright leaves: its sets, never dropped (as `Drop` never
        // runs), each with a copy's cgroup staged inside.
        let abandoned = CgroupSet::create(&format!("{gone}-990001"), None).expect("made").expect("set");
        let live = CgroupSet::create(&format!("{}-990002", std::process::id()), None).expect("made").expect("set");
        let dirs = |set: &CgroupSet| -> Vec<PathBuf> {
            set.own_dirs().iter().map(|d| d.join("copy-1")).chain(set.own_dirs()).collect()
        };
        for d in dirs(&abandoned).iter().chain(&dirs(&live)) {
            fs::create_dir_all(d).expect("copy cgroup");
        }
        let left = dirs(&abandoned);
        std::mem::forget(abandoned);
        // Without the reaper (no broker started since): they stay.
        assert!(left.iter().all(|d| d.exists()), "{left:?}");
        let removed: usize = germline_parents().iter().map(|p| reap_abandoned(p)).sum();
        assert!(removed >= 1, "nothing removed");
        assert!(
            left.iter().all(|d| !d.exists()),
            "still there: {:?}",
            left.iter().filter(|d| d.exists()).collect::<Vec<_>>()
        );
        assert!(dirs(&live).iter().all(|d| d.exists()), "a live broker's set was removed");
        drop(live);
    }

    #[test]
    fn a_departure_is_waited_for_and_a_failed_one_refuses_the_data() {
        let d = Departure::default();
        let mover = d.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            mover.set(Ok(()));
        });
        let t0 = Instant::now();
        d.wait().unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(15), "returned before the move was done");
        t.join().unwrap();
        let failed = Departure::default();
        failed.set(Err("EBUSY".into()));
        let e = failed.wait().unwrap_err().to_string();
        assert!(e.contains("could not leave the copy's cgroups") && e.contains("EBUSY"), "{e}");
        Departure::done().wait().unwrap();
    }
}
