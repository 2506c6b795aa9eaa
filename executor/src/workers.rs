//! Broker threads that outlive their job. A copy's three relay threads (deadline, proxy,
//! slot) are taken from here instead of being spawned for each copy: three spawns were
//! about 0.1 ms of every call. A job runs on an idle worker when there is one, else on a
//! new thread; a worker that has finished its job waits for the next one (at most
//! [`MAX_IDLE`] wait, for at most [`IDLE_FOR`]), and the others end. Jobs may block for as
//! long as their copy lives, so the number of workers is never a limit: a job never waits
//! for another to end.
//!
//! A worker carries nothing from one job to the next: every job owns what it uses, and
//! the broker's threads keep no thread-local state.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::Duration;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Workers kept waiting for a job; more end when their job does.
pub const MAX_IDLE: usize = 32;
/// How long a worker waits for a job before it ends.
pub const IDLE_FOR: Duration = Duration::from_secs(60);

struct Workers {
    /// Jobs handed to waiting workers and not yet taken.
    queue: VecDeque<Job>,
    /// Workers waiting for a job.
    idle: usize,
}

static WORKERS: Mutex<Workers> = Mutex::new(Workers { queue: VecDeque::new(), idle: 0 });
static READY: Condvar = Condvar::new();

fn lock() -> std::sync::MutexGuard<'static, Workers> {
    WORKERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `job` on a worker thread now: an idle one, or a new one.
pub fn run(job: impl FnOnce() + Send + 'static) {
    let job: Job = Box::new(job);
    {
        let mut w = lock();
        // Each waiting worker takes one queued job.
        if w.idle > w.queue.len() {
            w.queue.push_back(job);
            READY.notify_one();
            return;
        }
    }
    thread::spawn(move || work(job));
}

fn work(first: Job) {
    let mut job = first;
    loop {
        job();
        let mut w = lock();
        if w.idle >= MAX_IDLE {
            return;
        }
        w.idle += 1;
        let mut waited = Duration::ZERO;
        let next = loop {
            if let Some(j) = w.queue.pop_front() {
                break Some(j);
            }
            if waited >= IDLE_FOR {
                break None;
            }
            let t = std::time::Instant::now();
            w = READY.wait_timeout(w, IDLE_FOR - waited).unwrap_or_else(|p| p.into_inner()).0;
            waited += t.elapsed();
        };
        w.idle -= 1;
        match next {
            Some(j) => job = j,
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn jobs_run_on_reused_threads_and_a_blocked_job_never_holds_up_another() {
        // A job that blocks until told: the next job still runs at once.
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<thread::ThreadId>();
        run(move || {
            let _ = release_rx.recv();
        });
        let tx = done_tx.clone();
        run(move || tx.send(thread::current().id()).expect("send"));
        done_rx.recv_timeout(Duration::from_secs(10)).expect("a second job runs beside a blocked one");
        // Jobs one after another, each once the last is done: idle workers take them.
        let mut threads = std::collections::HashSet::new();
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(2));
            let tx = done_tx.clone();
            run(move || tx.send(thread::current().id()).expect("send"));
            threads.insert(done_rx.recv_timeout(Duration::from_secs(10)).expect("job ran"));
        }
        assert!(threads.len() < 10, "idle workers are reused: 20 jobs ran on {} threads", threads.len());
        release_tx.send(()).expect("release");
    }
}
