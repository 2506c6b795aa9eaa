//! Blocking waits with a wake-up: the broker's listener and reader threads sleep in the
//! kernel until their descriptor is ready, the deadline passes, or the call is over —
//! never in a polling loop that looks at a flag every few milliseconds (a fixed cost per
//! call that holds no user data; issue 15).

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A one-shot, level-triggered wake-up (an eventfd): once [`Wake::wake`] ran, every
/// present and future wait returns [`Ready::Woken`].
#[derive(Debug)]
pub struct Wake(OwnedFd);

/// Why a wait ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ready {
    /// The descriptor waited on is ready.
    Fd,
    /// [`Wake::wake`] was called.
    Woken,
    /// The deadline passed.
    Timeout,
}

impl Wake {
    /// A fresh, unwoken eventfd.
    pub fn new() -> io::Result<Wake> {
        // SAFETY: eventfd returns a new descriptor we take ownership of.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is fresh and owned by nobody else.
        Ok(Wake(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Wakes every waiter, now and later.
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: an 8-byte write to our eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Blocks until `fd` is readable, this wake-up fired, or `deadline` passed
    /// (`None`: no deadline).
    pub fn wait(&self, fd: RawFd, deadline: Option<Instant>) -> Ready {
        loop {
            let timeout = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ready::Timeout;
                    }
                    // Round up, so a wait never ends just before its deadline.
                    left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
                }
            };
            let mut pfd = [
                libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd, events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: poll on two descriptors we own, for a bounded or infinite time.
            let rc = unsafe { libc::poll(pfd.as_mut_ptr(), 2, timeout) };
            if rc < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Ready::Woken;
            }
            if pfd[0].revents != 0 {
                return Ready::Woken;
            }
            if pfd[1].revents != 0 {
                return Ready::Fd;
            }
        }
    }

    /// Accepts one connection, blocking until one arrives, the wake-up fires or
    /// `deadline` passes.
    pub fn accept(&self, listener: &TcpListener, deadline: Option<Instant>) -> Option<TcpStream> {
        listener.set_nonblocking(true).ok()?;
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).ok()?;
                    return Some(s);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return None,
            }
            if self.wait(listener.as_raw_fd(), deadline) != Ready::Fd {
                return None;
            }
        }
    }
}

/// Kills a long-lived server process whose request outlives its deadline, without a
/// polling thread: one thread per runtime sleeps on a condition variable until a request
/// is armed, then until that request's deadline or its answer, whichever comes first.
/// Disarming never waits for the thread, so the watchdog adds nothing to a call's latency.
pub struct Watchdog {
    shared: Arc<(Mutex<WatchState>, Condvar)>,
    thread: Option<thread::JoinHandle<()>>,
}

#[derive(Default)]
struct WatchState {
    armed: Option<(i32, Instant)>,
    quit: bool,
}

impl Watchdog {
    /// Starts the watchdog's thread.
    pub fn new() -> Watchdog {
        let shared = Arc::new((Mutex::new(WatchState::default()), Condvar::new()));
        let thread = {
            let shared = shared.clone();
            thread::spawn(move || {
                let (lock, cv) = &*shared;
                let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
                while !st.quit {
                    match st.armed {
                        None => st = cv.wait(st).unwrap_or_else(|p| p.into_inner()),
                        Some((pid, end)) => {
                            let now = Instant::now();
                            if now >= end {
                                // SAFETY: signalling the runtime's own child.
                                unsafe { libc::kill(pid, libc::SIGKILL) };
                                st.armed = None;
                                continue;
                            }
                            st = cv.wait_timeout(st, end - now).unwrap_or_else(|p| p.into_inner()).0;
                        }
                    }
                }
            })
        };
        Watchdog { shared, thread: Some(thread) }
    }

    /// Runs `f` (one request to the long-lived process `pid`) with `pid` killed if `f`
    /// has not returned within `budget`.
    pub fn guard<T>(&self, pid: i32, budget: Duration, f: impl FnOnce() -> T) -> T {
        let (lock, cv) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).armed = Some((pid, Instant::now() + budget));
        cv.notify_one();
        let r = f();
        lock.lock().unwrap_or_else(|p| p.into_inner()).armed = None;
        r
    }
}

impl Default for Watchdog {
    fn default() -> Self {
        Watchdog::new()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cv) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).quit = true;
        cv.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_at_the_wake_up_not_at_a_poll_interval() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let w = Arc::new(Wake::new().unwrap());
        let t0 = Instant::now();
        let waker = {
            let w = w.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(30));
                w.wake();
            })
        };
        assert!(w.accept(&l, Some(Instant::now() + Duration::from_secs(20))).is_none());
        assert!(t0.elapsed() < Duration::from_secs(10));
        waker.join().unwrap();
        // Level-triggered: later waits end at once.
        assert_eq!(w.wait(l.as_raw_fd(), None), Ready::Woken);
        let w2 = Wake::new().unwrap();
        let addr = l.local_addr().unwrap();
        let _c = TcpStream::connect(addr).unwrap();
        assert!(w2.accept(&l, Some(Instant::now() + Duration::from_secs(20))).is_some());
        assert_eq!(w2.wait(l.as_raw_fd(), Some(Instant::now() + Duration::from_millis(5))), Ready::Timeout);
    }

    #[test]
    fn the_watchdog_kills_only_past_the_deadline() {
        let wd = Watchdog::new();
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        assert_eq!(wd.guard(pid, Duration::from_secs(30), || 7), 7);
        assert!(child.try_wait().unwrap().is_none(), "killed although answered in time");
        wd.guard(pid, Duration::from_millis(50), || {
            let _ = child.wait();
        });
        assert!(child.try_wait().unwrap().is_some());
    }
}
