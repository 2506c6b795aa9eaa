//! Per-copy resource limits through cgroup v1 (`memory`, `pids`) where the host lets us
//! write them (root on this kind of machine); otherwise the rlimits set on the germline
//! before exec are what applies, per process, inside each copy's own user namespace.
//!
//! A copy must start inside its cgroup, or its first children could escape the limit.
//! Since the germline forks the copy, the broker moves the (stopped) germline into the
//! copy's fresh cgroup just before letting it fork, and back into its own right after:
//! the copy and everything it spawns are born inside. Charges do not move with a task in
//! cgroup v1, so the germline's own memory is never billed to a copy.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::ExecutorError;

const V1_ROOT: &str = "/sys/fs/cgroup";

/// Limits applied to each copy's cgroup.
#[derive(Clone, Copy, Debug)]
pub struct CgroupLimits {
    /// `memory.limit_in_bytes`.
    pub memory_bytes: u64,
    /// `pids.max`.
    pub processes: u64,
}

/// The cgroups of one germline: its own, and a fresh one per copy.
#[derive(Debug)]
pub struct CgroupSet {
    memory: PathBuf,
    pids: PathBuf,
    limits: CgroupLimits,
    next: AtomicU64,
}

/// What enforces per-copy limits on this host, for the log.
pub fn describe(set: Option<&CgroupSet>) -> &'static str {
    if set.is_some() {
        "cgroup v1 memory and pids per copy, plus rlimits per process"
    } else {
        "rlimits per process in each copy's user namespace (no writable cgroup hierarchy)"
    }
}

impl CgroupSet {
    /// Creates `germline-<broker pid>-<n>` under the v1 memory and pids hierarchies, or
    /// `None` where they are absent or not writable.
    pub fn create(name: &str, limits: CgroupLimits) -> Option<CgroupSet> {
        let memory = Path::new(V1_ROOT).join("memory").join("germline").join(name);
        let pids = Path::new(V1_ROOT).join("pids").join("germline").join(name);
        if !Path::new(V1_ROOT).join("memory/cgroup.procs").exists()
            || !Path::new(V1_ROOT).join("pids/cgroup.procs").exists()
        {
            return None;
        }
        fs::create_dir_all(&memory).ok()?;
        fs::create_dir_all(&pids).ok()?;
        Some(CgroupSet { memory, pids, limits, next: AtomicU64::new(0) })
    }

    /// Puts `pid` (the stopped germline) into a fresh per-copy cgroup.
    pub fn enter_copy(&self, pid: i32) -> Result<CopyCgroup, ExecutorError> {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let mem = self.memory.join(format!("copy-{n}"));
        let pids = self.pids.join(format!("copy-{n}"));
        let io = |p: &Path| ExecutorError::io(format!("cgroup {}", p.display()));
        fs::create_dir_all(&mem).map_err(io(&mem))?;
        fs::create_dir_all(&pids).map_err(io(&pids))?;
        fs::write(mem.join("memory.limit_in_bytes"), self.limits.memory_bytes.to_string()).map_err(io(&mem))?;
        let _ = fs::write(mem.join("memory.memsw.limit_in_bytes"), self.limits.memory_bytes.to_string());
        fs::write(pids.join("pids.max"), self.limits.processes.to_string()).map_err(io(&pids))?;
        fs::write(mem.join("cgroup.procs"), pid.to_string()).map_err(io(&mem))?;
        fs::write(pids.join("cgroup.procs"), pid.to_string()).map_err(io(&pids))?;
        Ok(CopyCgroup { dirs: [mem, pids] })
    }

    /// Puts `pid` back into the germline's own cgroups.
    pub fn leave_copy(&self, pid: i32) -> Result<(), ExecutorError> {
        for dir in [&self.memory, &self.pids] {
            fs::write(dir.join("cgroup.procs"), pid.to_string())
                .map_err(ExecutorError::io(format!("cgroup {}", dir.display())))?;
        }
        Ok(())
    }

    /// Puts `pid` into the germline's own cgroups (at start).
    pub fn adopt(&self, pid: i32) -> Result<(), ExecutorError> {
        self.leave_copy(pid)
    }
}

impl Drop for CgroupSet {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.memory);
        let _ = fs::remove_dir(&self.pids);
    }
}

/// A copy's cgroups; removed once the copy is gone.
#[derive(Debug)]
pub struct CopyCgroup {
    dirs: [PathBuf; 2],
}

impl CopyCgroup {
    /// Peak memory the copy used, where the kernel reports it.
    pub fn peak_memory(&self) -> Option<u64> {
        fs::read_to_string(self.dirs[0].join("memory.max_usage_in_bytes")).ok()?.trim().parse().ok()
    }
}

impl Drop for CopyCgroup {
    fn drop(&mut self) {
        for d in &self.dirs {
            // A killed copy may take a moment to leave; try a few times, bounded.
            for _ in 0..50 {
                if fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
    }
}
