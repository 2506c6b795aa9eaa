//! Host ids of copies: each live copy runs as a host uid and gid of its own.
//!
//! The kernel keeps some counters per host uid, not per namespace: the pipe buffers a
//! user holds (`pipe-user-pages-soft`; past it every new pipe gets one page), and with them
//! the other `user_struct` counters. Copies that share one host uid share those counters,
//! so a copy holding an item could spell it in how large another copy's pipes may grow
//! (96 of 96 bits between copies of two releases, `redteam_kernel`). With an id of its own
//! per live copy no copy can move a counter another copy or a germline reads.
//!
//! A broker claims one block of [`BLOCK`] ids from the configured range (by an exclusive
//! `flock` on a file per block under [`LOCK_DIR`], held for the broker's life, so brokers
//! on one host never share an id), maps the whole block into every germline's user
//! namespace (in-namespace ids `1..=BLOCK`), and lends each copy one offset in it. A copy
//! maps its namespace's root to that offset and switches to it before it is given data;
//! the broker checks the switch from `/proc` (see [`crate::inspect::check_copy_ids`]).
//! Offsets are reused in the order they were returned, and only once their copy is dead.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::sync::{Arc, Mutex, OnceLock};

use crate::ExecutorError;

/// Ids per broker block.
pub const BLOCK: u32 = 1024;

/// Where brokers claim their blocks.
pub const LOCK_DIR: &str = "/run/germline/copy-ids";

/// The environment variable that overrides [`DEFAULT_RANGE`], as `first_uid:first_gid:count`.
pub const COPY_IDS_VAR: &str = "GERMLINE_COPY_IDS";

/// 65536 uids and gids from 0x70000000: above the ranges systemd and container tools
/// hand out (nspawn's end at 0x6FFFFFFF) and below 2^31, where tools that treat ids as
/// signed go wrong.
pub const DEFAULT_RANGE: (u32, u32, u32) = (0x7000_0000, 0x7000_0000, 65536);

/// One broker's block: host uid/gid of in-namespace offset 1 and the free offsets.
pub struct IdBlock {
    /// Host uid of offset 1.
    pub uid: u32,
    /// Host gid of offset 1.
    pub gid: u32,
    free: Mutex<VecDeque<u32>>,
    _lock: File,
}

/// One offset lent to one copy; given back by [`IdBlock::give_back`] only when the copy
/// is dead.
#[derive(Debug)]
pub struct IdLease {
    /// The offset: the copy's uid and gid in the germline's user namespace.
    pub offset: u32,
    /// The copy's host uid.
    pub uid: u32,
    /// The copy's host gid.
    pub gid: u32,
    block: Arc<IdBlock>,
}

impl std::fmt::Debug for IdBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdBlock({}:{} +{BLOCK})", self.uid, self.gid)
    }
}

impl IdBlock {
    /// The lines of a germline's `uid_map` and `gid_map`: in-namespace root is `sandbox`,
    /// offsets `1..=BLOCK` are this block.
    pub fn maps(&self, sandbox_uid: u32, sandbox_gid: u32) -> (String, String) {
        (format!("0 {sandbox_uid} 1\n1 {} {BLOCK}\n", self.uid), format!("0 {sandbox_gid} 1\n1 {} {BLOCK}\n", self.gid))
    }

    /// Lends the offset that was returned longest ago.
    pub fn lend(self: &Arc<Self>) -> Result<IdLease, ExecutorError> {
        let offset = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop_front().ok_or_else(|| {
            ExecutorError::Sandbox(format!("all {BLOCK} copy ids of this broker are in use (copies not yet reaped)"))
        })?;
        Ok(IdLease { offset, uid: self.uid + offset - 1, gid: self.gid + offset - 1, block: self.clone() })
    }
}

impl IdLease {
    /// Returns the offset for reuse; call only once the copy (and with it its PID
    /// namespace) is gone.
    pub fn give_back(self) {
        self.block.free.lock().unwrap_or_else(|p| p.into_inner()).push_back(self.offset);
    }
}

fn parse_range(s: &str) -> Result<(u32, u32, u32), ExecutorError> {
    let bad = |why: &str| ExecutorError::Sandbox(format!("{COPY_IDS_VAR}={s:?}: {why}"));
    let parts: Vec<&str> = s.split(':').collect();
    let [u, g, n] = parts.as_slice() else {
        return Err(bad("expected first_uid:first_gid:count"));
    };
    let num = |x: &str, what: &str| x.trim().parse::<u32>().map_err(|_| bad(&format!("{what} is not a number")));
    let (u, g, n) = (num(u, "first_uid")?, num(g, "first_gid")?, num(n, "count")?);
    if u < 1000 || g < 1000 {
        return Err(bad("copy ids start below 1000, among the host's own users"));
    }
    if n < BLOCK {
        return Err(bad(&format!("count must be at least one block ({BLOCK})")));
    }
    if u64::from(u) + u64::from(n) > u64::from(u32::MAX) || u64::from(g) + u64::from(n) > u64::from(u32::MAX) {
        return Err(bad("the range passes the largest id"));
    }
    Ok((u, g, n))
}

fn claim() -> Result<IdBlock, ExecutorError> {
    let (uid, gid, count) = match std::env::var(COPY_IDS_VAR) {
        Ok(s) => parse_range(&s)?,
        Err(std::env::VarError::NotPresent) => DEFAULT_RANGE,
        Err(e) => return Err(ExecutorError::Sandbox(format!("{COPY_IDS_VAR}: {e}"))),
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(LOCK_DIR)
        .map_err(ExecutorError::io(format!("creating {LOCK_DIR}")))?;
    for b in 0..count / BLOCK {
        let path = format!("{LOCK_DIR}/{uid}-{gid}-{b}");
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(ExecutorError::io(format!("opening {path}")))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(IdBlock {
                uid: uid + b * BLOCK,
                gid: gid + b * BLOCK,
                free: Mutex::new((1..=BLOCK).collect()),
                _lock: f,
            });
        }
    }
    Err(ExecutorError::Sandbox(format!(
        "every block of copy ids in {uid}:{gid}:{count} is held by another broker on this host; give this one \
         another range with {COPY_IDS_VAR}"
    )))
}

/// This broker's block, claimed on first use.
pub fn block() -> Result<Arc<IdBlock>, ExecutorError> {
    static BLOCK_OF_THIS_BROKER: OnceLock<Result<Arc<IdBlock>, String>> = OnceLock::new();
    BLOCK_OF_THIS_BROKER
        .get_or_init(|| claim().map(Arc::new).map_err(|e| e.to_string()))
        .clone()
        .map_err(ExecutorError::Sandbox)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked() {
        assert_eq!(parse_range("1879048192:1879048192:65536").unwrap(), DEFAULT_RANGE);
        for bad in ["1:2", "0:0:65536", "5000:5000:10", "4294967000:5000:2048", "a:b:c"] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn offsets_come_back_last_in_line() {
        let f = tempfile::tempfile().unwrap();
        let b = Arc::new(IdBlock { uid: 70000, gid: 80000, free: Mutex::new((1..=3).collect()), _lock: f });
        let a = b.lend().unwrap();
        assert_eq!((a.offset, a.uid, a.gid), (1, 70000, 80000));
        let c = b.lend().unwrap();
        a.give_back();
        assert_eq!(b.lend().unwrap().offset, 3);
        assert_eq!(b.lend().unwrap().offset, 1);
        assert!(b.lend().is_err());
        drop(c);
        let (u, g) = b.maps(65534, 65534);
        assert_eq!(u, "0 65534 1\n1 70000 1024\n");
        assert_eq!(g, "0 65534 1\n1 80000 1024\n");
    }
}
