//! Calls to one release at the same time: each runs on a *lane* of its own, a germline
//! with its own pool of copies, started when every lane is busy (up to `limits.lanes`).
//!
//! Lanes are separate germlines, not copies of one germline side by side: whatever keeps
//! copies of one germline apart (none runs while another holds data; the germline is
//! stopped while any copy holds data, and forks only when none does) holds within each
//! lane unchanged, and two lanes share no more kernel state than germlines of two
//! different releases do. What the lanes of a release share is kept by the broker: its
//! slots ([`crate::slots`], one lease per slot). Timing is not kept apart: with lanes one
//! release can time its own calls, and keep what it measured in a lane's germline, which is
//! why a policy asks for lanes (`limits.lanes`, default 1; SECURITY.md, "Calls to one
//! release at the same time").
//!
//! A lane is taken whole for one call (or one session's calls) and given back after it.
//! The first lane is started by the first call; more are started in the background when a
//! call finds every lane busy, and that call takes whichever lane is free first.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Starts one more lane like the first (same release, policy and slots).
pub type Grow<T> = Arc<dyn Fn() -> Result<T, String> + Send + Sync>;

/// The lanes of one release.
pub struct Lanes<T> {
    state: Mutex<State<T>>,
    changed: Condvar,
}

struct State<T> {
    idle: Vec<T>,
    /// Lanes taken by calls.
    out: usize,
    /// Lanes being started.
    starting: usize,
    /// Most lanes wanted (set by the first lane's start).
    max: usize,
    /// How to start more (none: one lane only).
    grow: Option<Grow<T>>,
    /// Bumped by [`Lanes::clear`]: lanes of an older generation are dropped when given back.
    generation: u64,
}

/// What [`Lanes::take`] gives.
pub enum Taken<T: Send + 'static> {
    /// A started lane.
    Lane(Lane<T>),
    /// No lane is running: the caller starts the first one ([`FirstLane::started`]).
    First(FirstLane<T>),
}

impl<T: Send + 'static> Default for Lanes<T> {
    fn default() -> Self {
        Lanes {
            state: Mutex::new(State { idle: Vec::new(), out: 0, starting: 0, max: 1, grow: None, generation: 0 }),
            changed: Condvar::new(),
        }
    }
}

impl<T: Send + 'static> Lanes<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A free lane, or the duty to start the first one. Waits while every lane is busy,
    /// starting one more in the background when the release may have more.
    pub fn take(self: &Arc<Self>) -> Taken<T> {
        let mut st = self.lock();
        loop {
            if let Some(t) = st.idle.pop() {
                st.out += 1;
                let generation = st.generation;
                return Taken::Lane(Lane { lanes: self.clone(), value: Some(t), generation });
            }
            let running = st.out + st.starting;
            if running == 0 {
                st.starting += 1;
                let generation = st.generation;
                return Taken::First(FirstLane { lanes: self.clone(), generation, done: false });
            }
            if running < st.max {
                if let Some(grow) = st.grow.clone() {
                    st.starting += 1;
                    self.grow_in_background(grow, st.generation);
                }
            }
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn grow_in_background(self: &Arc<Self>, grow: Grow<T>, generation: u64) {
        let lanes = self.clone();
        let spawned = std::thread::Builder::new().name("germline-lane".into()).spawn(move || {
            let started = grow();
            let mut st = lanes.lock();
            st.starting -= 1;
            let stale = match started {
                Ok(t) if st.generation == generation => {
                    st.idle.push(t);
                    None
                }
                Ok(t) => Some(t),
                Err(e) => {
                    // Calls go on with the lanes there are.
                    tracing::warn!("another lane for this release could not be started: {e}");
                    st.max = (st.out + st.idle.len() + st.starting).max(1);
                    None
                }
            };
            lanes.changed.notify_all();
            drop(st);
            drop(stale);
        });
        if spawned.is_err() {
            let mut st = self.lock();
            st.starting -= 1;
            st.max = (st.out + st.idle.len() + st.starting).max(1);
        }
    }

    /// Stops every lane: idle ones now, busy ones when their call gives them back; the
    /// next call starts a first lane again (under whatever changed).
    pub fn clear(&self) {
        let idle = {
            let mut st = self.lock();
            st.generation += 1;
            st.grow = None;
            st.max = 1;
            std::mem::take(&mut st.idle)
        };
        self.changed.notify_all();
        drop(idle);
    }

    /// Lanes started (idle, busy or starting).
    pub fn count(&self) -> usize {
        let st = self.lock();
        st.idle.len() + st.out + st.starting
    }
}

/// The duty to start a release's first lane.
pub struct FirstLane<T: Send + 'static> {
    lanes: Arc<Lanes<T>>,
    generation: u64,
    done: bool,
}

impl<T: Send + 'static> FirstLane<T> {
    /// The first lane is `t`; up to `max` lanes in all, more started by `grow`.
    pub fn started(mut self, t: T, max: usize, grow: Option<Grow<T>>) -> Lane<T> {
        self.done = true;
        let mut st = self.lanes.lock();
        st.starting -= 1;
        st.out += 1;
        if st.generation == self.generation {
            st.max = if grow.is_some() { max.max(1) } else { 1 };
            st.grow = grow;
        }
        // Calls waiting for this start may now start lanes of their own.
        self.lanes.changed.notify_all();
        Lane { lanes: self.lanes.clone(), value: Some(t), generation: self.generation }
    }
}

impl<T: Send + 'static> Drop for FirstLane<T> {
    fn drop(&mut self) {
        if !self.done {
            // The start failed: the next call tries again.
            self.lanes.lock().starting -= 1;
            self.lanes.changed.notify_all();
        }
    }
}

/// A lane taken for a call; given back when dropped.
pub struct Lane<T: Send + 'static> {
    lanes: Arc<Lanes<T>>,
    value: Option<T>,
    generation: u64,
}

impl<T: Send + 'static> Lane<T> {
    /// Drops this lane instead of giving it back (its germline was refused, or stopped).
    pub fn discard(mut self) {
        let value = self.value.take();
        let mut st = self.lanes.lock();
        st.out -= 1;
        self.lanes.changed.notify_all();
        drop(st);
        drop(value);
    }
}

impl<T: Send + 'static> Deref for Lane<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value.as_ref().expect("a lane holds its value until dropped")
    }
}

impl<T: Send + 'static> DerefMut for Lane<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value.as_mut().expect("a lane holds its value until dropped")
    }
}

impl<T: Send + 'static> Drop for Lane<T> {
    fn drop(&mut self) {
        let Some(value) = self.value.take() else { return };
        let mut st = self.lanes.lock();
        st.out -= 1;
        let stale = if st.generation == self.generation {
            st.idle.push(value);
            None
        } else {
            Some(value)
        };
        self.lanes.changed.notify_all();
        drop(st);
        // A lane of an older generation stops here, outside the lock.
        drop(stale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn a_busy_release_grows_to_its_limit_and_no_further() {
        let lanes: Arc<Lanes<usize>> = Arc::default();
        let made = Arc::new(AtomicUsize::new(1));
        let first = match lanes.take() {
            Taken::First(f) => {
                let made = made.clone();
                f.started(0, 3, Some(Arc::new(move || Ok(made.fetch_add(1, Ordering::SeqCst)))))
            }
            Taken::Lane(_) => panic!("no lane was running"),
        };
        let take = |lanes: &Arc<Lanes<usize>>| match lanes.take() {
            Taken::Lane(l) => l,
            Taken::First(_) => panic!("a lane is running"),
        };
        let second = take(&lanes);
        let third = take(&lanes);
        assert_eq!((*first, *second, *third), (0, 1, 2));
        assert_eq!(lanes.count(), 3);
        // A fourth call waits for a lane given back; none is started.
        let waiter = {
            let lanes = lanes.clone();
            std::thread::spawn(move || *take(&lanes))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(made.load(Ordering::SeqCst), 3);
        drop(second);
        assert_eq!(waiter.join().expect("join"), 1);
        assert_eq!(lanes.count(), 3);
        drop((first, third));
    }

    #[test]
    fn a_cleared_release_drops_its_lanes_and_starts_again() {
        let lanes: Arc<Lanes<usize>> = Arc::default();
        let busy = match lanes.take() {
            Taken::First(f) => f.started(7, 2, None),
            Taken::Lane(_) => panic!("no lane was running"),
        };
        lanes.clear();
        drop(busy);
        assert_eq!(lanes.count(), 0);
        assert!(matches!(lanes.take(), Taken::First(_)));
    }
}
