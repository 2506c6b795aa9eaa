//! Pooled copies: made ahead of time, set up from outside, checked, connected and past MCP
//! `initialize` — with no data — so that a call only sends its twin inputs, mounts its
//! view, and asks (the copy asks for its slot when it needs it, [`crate::slots`]). A server
//! that opens its data at start-up is readied short of starting ([`Readiness::Connected`]):
//! the call sends its twin inputs, mounts its view, and only then lets the server start.
//!
//! The pool does not know how a copy is made: a [`CopySource`] makes one data-free copy at
//! a time (a fork from a Python germline today; a fresh sandboxed process per copy for a
//! runtime that cannot fork would be another source). Everything after that — listeners,
//! the ids check, scratch, the channel, `initialize` — is the same for every source.
//!
//! What keeps copies apart when several live side by side:
//! - **No data while the source makes a copy.** A germline's fork window lets release code
//!   run in the germline, which every later copy inherits. Kernel state that copies move
//!   and the germline can read there — the pid counter of its PID namespace, the process
//!   count kept for its user namespace — must hold nothing of any item, so the pool makes a
//!   copy only while none of the source's copies holds data (taken copies are counted until
//!   they are retired, and retired ones are awaited before the next fork). A call taking a
//!   copy waits for a fork in progress to end before the copy gets its view.
//! - **Idle copies are stopped.** A ready copy waits under SIGSTOP, so it is not running
//!   while another copy holds data; it runs again when a call takes it. A copy still being
//!   readied when a call takes a copy is stopped the same way (every thread, no process of
//!   its own, else it is killed and awaited) and runs on only once no copy holds data: no
//!   call in progress, every taken copy awaited gone. (Killing it instead threw away the
//!   readying of about one copy per call under concurrent load.)
//! - **One copy, one group of one call.** A taken copy is never returned to the pool: it
//!   is killed after its answer, and the pool refills in the background.
//! - **Every check of a forked copy holds for a pooled one**: the same fork checks (G1–G3
//!   before and after, namespaces, accounting), the same ids check before anything but
//!   `initialize` runs, the same deadline, limits and egress rules once it serves a call.

use std::collections::VecDeque;
use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::broker::PooledChannel;
use crate::germline::{CopyKiller, CopyProcess, Germline};
use crate::mcp::McpClient;
use crate::outside::prepare_copy;
use crate::ExecutorError;

/// Test-only switch ("mechanism off"): idle copies keep their children running, and a call
/// takes a copy while others are still being readied. Never set outside tests.
pub static IDLE_CHECKS_OFF_FOR_TESTS: AtomicBool = AtomicBool::new(false);

fn idle_checks() -> bool {
    !IDLE_CHECKS_OFF_FOR_TESTS.load(Ordering::SeqCst)
}

/// Makes data-free copies of one release.
pub trait CopySource: Send {
    /// Makes one copy, identified and checked from outside, before anything is set up in
    /// it. Called only while no copy of this source holds data.
    fn make(&mut self) -> Result<CopyProcess, ExecutorError>;

    /// Takes back a copy that is done: it is killed now; its death may be awaited later.
    fn retire(&mut self, copy: CopyProcess);

    /// Waits until every retired copy is gone (with all its processes, so nothing it
    /// counted in a level it shares with other copies is left).
    fn settle(&mut self) -> Result<(), ExecutorError>;

    /// How the source ended, if it has (then it makes no more copies, and the copies it
    /// made are not used). A source without a process of its own never ends.
    fn gone(&mut self) -> Option<String> {
        None
    }

    /// The process copies are made from, if there is one (for tests and diagnostics).
    fn pid(&self) -> Option<i32> {
        None
    }
}

impl CopySource for Germline {
    fn make(&mut self) -> Result<CopyProcess, ExecutorError> {
        // A germline that died makes every check of the fork fail on its missing `/proc`
        // entry: the error says what happened instead.
        self.fork_copy().map_err(|e| match self.gone() {
            Some(how) if !e.is_refusal() => ExecutorError::GermlineGone(how),
            _ => e,
        })
    }

    fn gone(&mut self) -> Option<String> {
        Germline::gone(self)
    }

    fn pid(&self) -> Option<i32> {
        Some(Germline::pid(self))
    }

    fn retire(&mut self, copy: CopyProcess) {
        Germline::retire(self, copy)
    }

    fn settle(&mut self) -> Result<(), ExecutorError> {
        self.reap_retired()
    }
}

/// How far the pool readies a copy before a call takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Its server started and past `initialize` (and the warm-up requests).
    Initialized,
    /// Connected and checked, its server not started: for a server that opens its data at
    /// start-up (a path under a data root among its arguments, say), which must start once
    /// the call's view is in. The copy waits for the call's start line; the tool host runs
    /// no release code in it before the call's twin inputs.
    Connected,
}

/// A copy ready for a call: connected, checked, holding nothing, stopped; past `initialize`
/// when its readiness is [`Readiness::Initialized`].
pub struct ReadyCopy {
    /// The copy.
    pub copy: CopyProcess,
    /// Its HTTP proxy listener.
    pub proxy: TcpListener,
    /// Its slot-write listener.
    pub slot: TcpListener,
    /// Its MCP session (not yet initialized for [`Readiness::Connected`]).
    pub channel: PooledChannel,
    /// How far it was readied.
    pub readiness: Readiness,
}

/// A copy taken for one group of one call.
pub enum Taken {
    /// From the pool: only the view, twin inputs and slot are left to give it.
    Pooled(Box<ReadyCopy>),
    /// Just made, nothing set up (pooling off, or no copy ready and none coming).
    Fresh(Box<CopyProcess>),
}

impl Taken {
    /// The copy process.
    pub fn copy(&self) -> &CopyProcess {
        match self {
            Taken::Pooled(r) => &r.copy,
            Taken::Fresh(c) => c,
        }
    }
}

/// How long readying one copy may take (its server's start-up and `initialize`).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Copies in a row that must fail to be made or readied before the pool readies less
/// (short of starting the server, then not at all): one failure may be the copy's own
/// (killed from outside, out of memory for a moment) and says little about the release;
/// two in a row, each a fresh copy of the same germline, say it of the release.
const READY_ATTEMPTS: u32 = 2;

struct State {
    source: Box<dyn CopySource>,
    ready: VecDeque<ReadyCopy>,
    /// Copies handed to calls and not yet retired (they may hold data).
    holding: usize,
    /// Calls in progress: the pool is not refilled meanwhile (a fork would hold up the
    /// call's next take, and a taken copy may hold data until it is given back).
    calls: usize,
    /// Copies made and being readied (data-free).
    readying: usize,
    /// The copies being readied that may be stopped or killed: a call stops them (or kills
    /// one that cannot be stopped whole) before it gives any copy data, as their servers
    /// run release code; they run on once no copy holds data. A copy that finished
    /// readying, or was killed, is no longer listed.
    readying_copies: Vec<Readying>,
    /// Ready copies wanted; 0 once pooling is off for this source.
    size: usize,
    /// How far copies are readied from now on.
    readiness: Readiness,
    /// Copies in a row that could not be made, or readied to `readiness`, for no reason a
    /// call gave.
    failures: u32,
    /// A failure of the source itself (a germline check): every later take returns it.
    failed: Option<ExecutorError>,
    closed: bool,
}

impl State {
    /// Counts one more copy that could not be made or readied; whether the pool tries
    /// another the same way (fewer than [`READY_ATTEMPTS`] in a row so far).
    fn try_again(&mut self) -> bool {
        self.failures += 1;
        if self.failures < READY_ATTEMPTS {
            return true;
        }
        self.failures = 0;
        false
    }
}

/// A copy being readied.
struct Readying {
    pid: i32,
    killer: CopyKiller,
    /// Stopped by a call, to run on once no copy holds data.
    paused: bool,
    /// Stopped by a call at some point: a readying that fails afterwards (it may have
    /// timed out while stopped) says nothing about the release.
    was_paused: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    max_message: usize,
    /// The release's warm-up calls (tool, arguments), made in every copy as it is readied.
    warm_up: Vec<(String, serde_json::Value)>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Ready copies of one release, refilled in the background.
pub struct CopyPool {
    shared: Arc<Shared>,
    /// The refill thread, and the thread that lets stopped copies being readied run on.
    threads: Vec<JoinHandle<()>>,
}

impl CopyPool {
    /// A pool of `size` copies of `source` readied to `readiness` (size 0: every call
    /// makes its copies as it needs them, and gives them their data before their server
    /// starts).
    pub fn new(
        source: Box<dyn CopySource>,
        size: usize,
        readiness: Readiness,
        max_message: usize,
        warm_up: Vec<(String, serde_json::Value)>,
    ) -> CopyPool {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                source,
                ready: VecDeque::new(),
                holding: 0,
                calls: 0,
                readying: 0,
                readying_copies: Vec::new(),
                size,
                readiness,
                failures: 0,
                failed: None,
                closed: false,
            }),
            changed: Condvar::new(),
            max_message,
            warm_up,
        });
        let spawn = |name: &str, f: fn(&Shared)| {
            let shared = shared.clone();
            (size > 0).then(|| std::thread::Builder::new().name(name.into()).spawn(move || f(&shared)).ok()).flatten()
        };
        let refill = spawn("germline-pool", refill_loop);
        let resume = spawn("germline-resume", resume_loop);
        CopyPool { shared, threads: refill.into_iter().chain(resume).collect() }
    }

    /// The process copies are made from, if there is one (for tests and diagnostics).
    pub fn source_pid(&self) -> Option<i32> {
        self.shared.lock().source.pid()
    }

    /// Ready copies right now (for tests and the bench).
    pub fn ready(&self) -> usize {
        self.shared.lock().ready.len()
    }

    /// Whether copies come from the pool (false: pooling is off, or was turned off for
    /// this release because its copies could not be readied).
    pub fn pooling(&self) -> bool {
        self.shared.lock().size > 0
    }

    /// How far copies are readied now.
    pub fn readiness(&self) -> Readiness {
        self.shared.lock().readiness
    }

    /// Waits until `n` copies are ready (or the pool cannot get there), at most `timeout`.
    pub fn wait_ready(&self, n: usize, timeout: Duration) -> usize {
        let until = Instant::now() + timeout;
        let mut st = self.shared.lock();
        loop {
            let want = n.min(st.size);
            if st.ready.len() >= want || st.failed.is_some() {
                return st.ready.len();
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return st.ready.len();
            }
            st = self.shared.changed.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Marks a call in progress until the guard is dropped: the pool is refilled between
    /// calls, not during one.
    pub fn begin_call(&self) -> CallGuard {
        self.shared.lock().calls += 1;
        CallGuard(self.shared.clone())
    }

    /// Takes a copy for one group of a call: a ready one, or (none ready and none coming)
    /// one made now. Never while a copy is being made, and never makes one while another
    /// taken copy may hold data.
    pub fn take(&self) -> Result<Taken, ExecutorError> {
        let mut st = self.shared.lock();
        loop {
            if st.failed.is_none() {
                // Its ready copies die with it (torn down with its PID namespace): none is
                // handed out after it.
                if let Some(how) = st.source.gone() {
                    st.failed = Some(ExecutorError::GermlineGone(how));
                }
            }
            if let Some(e) = &st.failed {
                return Err(e.clone_refusal());
            }
            // Nothing of this germline runs while the copy taken here holds data: copies an
            // earlier group or call held are dead; copies being readied (release code
            // running, data-free) are stopped like ready ones, every thread, with no process
            // of their own (one that has one is killed and awaited), and run on only once no
            // copy holds data; ready ones are stopped with no process of their own. (A
            // process beside a data-holding copy could read what that copy moves in the
            // levels all copies of a germline share — its process count, its queued signals
            // — and serve a later call.)
            if idle_checks() {
                for r in st.readying_copies.iter_mut().filter(|r| !r.paused) {
                    match r.killer.pause(r.pid, true) {
                        Ok(()) => (r.paused, r.was_paused) = (true, true),
                        // Not listed once killed: its readying thread counts it out.
                        Err(_) => r.killer.kill(),
                    }
                }
                st.readying_copies.retain(|r| r.paused);
                // Killed ones are counted until their readying thread sees them gone.
                if st.readying > st.readying_copies.len() {
                    st = self.shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                    continue;
                }
            }
            st.source.settle()?;
            while let Some(r) = st.ready.pop_front() {
                // A ready copy that died, woke or made a process meanwhile is dropped.
                if r.copy.exited() || (idle_checks() && !r.copy.idle()) {
                    continue;
                }
                st.holding += 1;
                self.shared.changed.notify_all();
                return Ok(Taken::Pooled(Box::new(r)));
            }
            if st.size > 0 && st.readying > 0 && !idle_checks() {
                st = self.shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            if st.holding == 0 {
                let made = st.source.make();
                match made {
                    Ok(copy) => {
                        st.holding += 1;
                        return Ok(Taken::Fresh(Box::new(copy)));
                    }
                    Err(e) => {
                        if matches!(e, ExecutorError::GermlineRefused { .. } | ExecutorError::GermlineGone(_)) {
                            st.failed = Some(e.clone_refusal());
                        }
                        return Err(e);
                    }
                }
            }
            st = self.shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Gives back a copy a call is done with: it is killed, and the pool may make copies
    /// again once no taken copy is left.
    pub fn give_back(&self, copy: CopyProcess) {
        let mut st = self.shared.lock();
        st.source.retire(copy);
        st.holding = st.holding.saturating_sub(1);
        self.shared.changed.notify_all();
    }
}

/// A call in progress ([`CopyPool::begin_call`]).
pub struct CallGuard(Arc<Shared>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.calls = st.calls.saturating_sub(1);
        self.0.changed.notify_all();
    }
}

impl Drop for CopyPool {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.closed = true;
            st.ready.clear();
            // A copy being readied may be stopped by the last call and never let run on
            // (the resuming thread stops too): killed, the refill thread's read of it ends
            // at once rather than at its readying deadline.
            for r in st.readying_copies.drain(..) {
                r.killer.kill();
            }
        }
        self.shared.changed.notify_all();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

fn refill_loop(shared: &Shared) {
    loop {
        let (copy, readiness) = {
            let mut st = shared.lock();
            loop {
                if st.closed {
                    return;
                }
                if st.failed.is_none() && st.holding == 0 && st.calls == 0 && st.ready.len() + st.readying < st.size {
                    break;
                }
                st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            match st.source.make() {
                Ok(c) => {
                    match c.killer() {
                        Ok(killer) => {
                            st.readying_copies.push(Readying { pid: c.pid, killer, paused: false, was_paused: false })
                        }
                        // A copy no call could stop is not readied.
                        Err(_) => {
                            st.source.retire(c);
                            continue;
                        }
                    }
                    st.readying += 1;
                    (c, st.readiness)
                }
                Err(e) => {
                    if matches!(e, ExecutorError::GermlineRefused { .. } | ExecutorError::GermlineGone(_)) {
                        st.failed = Some(e);
                    } else if st.try_again() {
                        // Counted with the readying failures: a copy was not readied.
                        tracing::info!("a data-free copy could not be made ({e}); making another");
                    } else {
                        tracing::warn!(
                            "copy pool off for this release: {READY_ATTEMPTS} data-free copies in a row could not be \
                             made or readied (the last could not be made: {e})"
                        );
                        st.size = 0;
                    }
                    shared.changed.notify_all();
                    continue;
                }
            }
        };
        let pid = copy.pid;
        let readied = ready_up(copy, readiness, shared.max_message, &shared.warm_up);
        let mut st = shared.lock();
        st.readying -= 1;
        // Gone from the list when a call killed it.
        let listed = st.readying_copies.iter().position(|r| r.pid == pid).map(|i| st.readying_copies.remove(i));
        let was_paused = listed.as_ref().is_some_and(|r| r.was_paused);
        // Stopped as an idle copy here, under the lock: no call can be stopping it, nor the
        // resuming thread letting it run, in between.
        let readied = readied.and_then(|r| r.copy.pause_idle(idle_checks()).map(|()| r));
        match readied {
            Ok(r) if !st.closed && listed.is_some() => {
                st.failures = 0;
                st.ready.push_back(r)
            }
            Ok(_) => {}
            // Killed by a call that needed the germline quiet: nothing wrong with the copy.
            Err(_) if listed.is_none() => {}
            // Stopped by a call meanwhile (its readying may have run out of time).
            Err(e) if was_paused => tracing::debug!("a copy stopped while it was readied is dropped: {e}"),
            Err(e) if st.try_again() => {
                tracing::info!("a data-free copy could not be readied ({e}); readying another");
            }
            // The copy held nothing: its error names no item. A server that needs its data
            // to start is readied short of starting from now on; the server starts at the
            // call, once the view is in.
            Err(e) if readiness == Readiness::Initialized => {
                tracing::warn!(
                    "pooled copies of this release start their server at the call: {READY_ATTEMPTS} data-free copies \
                     in a row could not be readied past initialize and left idle (the last: {e})"
                );
                st.readiness = Readiness::Connected;
            }
            Err(e) => {
                tracing::warn!(
                    "copy pool off for this release: {READY_ATTEMPTS} data-free copies in a row could not be readied \
                     (the last: {e})"
                );
                st.size = 0;
            }
        }
        shared.changed.notify_all();
    }
}

/// Lets copies being readied that a call stopped run on, once no copy holds data: no call in
/// progress and every copy a call held awaited (gone with all its processes).
fn resume_loop(shared: &Shared) {
    let mut st = shared.lock();
    loop {
        if st.closed {
            return;
        }
        if st.holding == 0 && st.calls == 0 && st.readying_copies.iter().any(|r| r.paused) {
            if let Err(e) = st.source.settle() {
                // Copies a call held are not known gone: the stopped ones are killed instead.
                tracing::warn!("copies being readied are dropped: earlier copies were not seen gone ({e})");
                for r in st.readying_copies.drain(..) {
                    r.killer.kill();
                }
            }
            for r in st.readying_copies.iter_mut().filter(|r| r.paused) {
                if r.killer.resume().is_ok() {
                    r.paused = false;
                }
            }
            shared.changed.notify_all();
        }
        st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
    }
}

/// Sets a data-free copy up without a view, lets it connect, checks its ids (the gate
/// with no view to mount), and for [`Readiness::Initialized`] starts its server and gets
/// it past `initialize`; the refill loop then stops it.
fn ready_up(
    copy: CopyProcess,
    readiness: Readiness,
    max_message: usize,
    warm_up: &[(String, serde_json::Value)],
) -> Result<ReadyCopy, ExecutorError> {
    let listeners = prepare_copy(copy.pid, copy.ids(), &[], &[], copy.scratch.as_ref(), copy.departure())?;
    copy.channel_ready()?;
    let deadline = Instant::now() + READY_TIMEOUT;
    let conn = accept_or_exit(&listeners.channel, &copy, deadline)?;
    drop(listeners.channel);
    listeners.gate.open()?;
    let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    conn.set_read_timeout(Some(remaining)).map_err(ExecutorError::io("channel timeout"))?;
    conn.set_write_timeout(Some(remaining)).map_err(ExecutorError::io("channel timeout"))?;
    let _ = conn.set_nodelay(true);
    let mut writer = conn.try_clone().map_err(ExecutorError::io("channel"))?;
    let reader = BufReader::new(conn.try_clone().map_err(ExecutorError::io("channel"))?);
    if readiness == Readiness::Connected {
        // Waits for the call's start line, its server not started.
        let client = McpClient::new(reader, writer, max_message);
        let channel = PooledChannel { client, conn };
        return Ok(ReadyCopy { copy, proxy: listeners.proxy, slot: listeners.slot, channel, readiness });
    }
    writer.write_all(b"{\"pool\":true}\n").map_err(ExecutorError::io("starting a pooled copy"))?;
    let mut client = McpClient::new(reader, writer, max_message);
    client.initialize()?;
    // Two data-free requests through the server's dispatch, so the pages a request touches
    // are the copy's own before a call waits on them (a fresh fork pays a copy-on-write
    // fault for each): a list, and a call of a tool no server has, which runs the call path
    // up to the tool's lookup (its error answer is expected and dropped).
    client
        .request("tools/list", serde_json::json!({}))?
        .map_err(|e| ExecutorError::Copy(format!("tools/list: {e}")))?;
    // Then the release's own warm-up calls (manifest `warm_up`), answers dropped likewise.
    let nothing = ("germline warm-up".to_owned(), serde_json::json!({}));
    for (tool, arguments) in std::iter::once(&nothing).chain(warm_up) {
        let _ = client.request("tools/call", serde_json::json!({"name": tool, "arguments": arguments}))?;
    }
    // Stopped by the refill loop, under the pool's lock.
    let channel = PooledChannel { client, conn };
    Ok(ReadyCopy { copy, proxy: listeners.proxy, slot: listeners.slot, channel, readiness })
}

/// Accepts the copy's connection, or fails at once if the copy exits first.
fn accept_or_exit(
    listener: &TcpListener,
    copy: &CopyProcess,
    deadline: Instant,
) -> Result<std::net::TcpStream, ExecutorError> {
    let pidfd = copy.killer()?.pidfd().map_err(ExecutorError::io("copy pidfd"))?;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ExecutorError::Copy("a pooled copy never connected to its channel".into()));
        }
        let mut pfd = [
            libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: poll on two descriptors we own, bounded in time.
        let rc = unsafe { libc::poll(pfd.as_mut_ptr(), 2, left.as_millis().clamp(1, i32::MAX as u128) as i32) };
        if rc > 0 && pfd[0].revents & libc::POLLIN != 0 {
            let (conn, _) = listener.accept().map_err(ExecutorError::io("accepting a pooled copy"))?;
            return Ok(conn);
        }
        if rc > 0 && pfd[1].revents != 0 {
            return Err(ExecutorError::Copy("a pooled copy exited before it connected to its channel".into()));
        }
    }
}
