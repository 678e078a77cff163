//! The group's job queue and its worker thread: queued operations run in issue order, and
//! posted point-to-point transfers move while nothing is queued.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use super::engine::Engine;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::interrupt;
use crate::spin::Spin;
use crate::transport::tcp::poll_fds;
use crate::wake::Wake;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep using it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

type Job = Box<dyn FnOnce(&mut Engine) + Send>;

/// How long the program must have made no call before the worker reads the links it left
/// (see `Shared::serve`).
const LINKS_BACKOFF: Duration = Duration::from_micros(50);
/// The longest such wait, doubled from `LINKS_BACKOFF` while the program keeps calling.
const LINKS_BACKOFF_MAX: Duration = Duration::from_millis(1);

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    closed: bool,
    /// The worker should look again at what it serves (a window was attached).
    nudged: bool,
}

#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<QueueState>,
    /// Jobs queued and not yet taken, readable without the lock.
    queued: AtomicUsize,
    /// Set once closed, readable without the lock.
    closed: AtomicBool,
    cond: Condvar,
    /// Set while the worker pumps the transport (asleep in poll(2), not on `cond`).
    pumping: AtomicBool,
    /// Rung by `push` while the worker pumps (None where no eventfd could be made). Made on
    /// the first pump: a group that never pumps holds no descriptor for it.
    wake: OnceLock<Option<Arc<Wake>>>,
    /// Set while the worker holds the engine only to read its links once (`Transport::sweep`).
    sweeping: AtomicBool,
    /// Operations run on the program's own thread (`Shared::idle_engine`) so far.
    calls: AtomicU64,
}

impl Queue {
    fn destroyed() -> Error {
        Error::Runtime("the process group has been destroyed; create a new one".into())
    }

    pub(super) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Self::destroyed());
        }
        Ok(())
    }

    pub(super) fn push(&self, job: Job) -> Result<()> {
        let mut st = lock(&self.state);
        if st.closed {
            return Err(Self::destroyed());
        }
        st.jobs.push_back(job);
        self.queued.fetch_add(1, Ordering::Release);
        drop(st);
        self.cond.notify_one();
        self.wake_pump();
        Ok(())
    }

    /// Wakes the worker if it sleeps in the transport's pump. Paired with the fence in
    /// `serve`: either the worker sees the news before it sleeps, or this sees it pumping.
    fn wake_pump(&self) {
        fence(Ordering::SeqCst);
        if self.pumping.load(Ordering::Relaxed) {
            if let Some(Some(wake)) = self.wake.get() {
                wake.ring();
            }
        }
    }

    fn has_jobs(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
    }

    fn try_pop(&self) -> Option<Job> {
        if !self.has_jobs() {
            return None;
        }
        let job = lock(&self.state).jobs.pop_front();
        if job.is_some() {
            self.queued.fetch_sub(1, Ordering::Release);
        }
        job
    }

    /// Waits until a job is queued or the worker is nudged (true), or the queue is closed
    /// and drained (false).
    fn wait_for_job(&self) -> bool {
        let mut spin = Spin::new();
        while spin.again() {
            if self.has_jobs() {
                return true;
            }
        }
        let mut st = lock(&self.state);
        while st.jobs.is_empty() && !st.closed && !st.nudged {
            st = self
                .cond
                .wait(st)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        st.nudged = false;
        !st.jobs.is_empty() || !st.closed
    }

    /// Has the worker look again at what it serves: a window attached on the caller's thread
    /// needs it reading the links even while nothing is queued.
    pub(super) fn nudge(&self) {
        lock(&self.state).nudged = true;
        self.cond.notify_one();
    }

    pub(super) fn close(&self) {
        lock(&self.state).closed = true;
        self.closed.store(true, Ordering::Release);
        self.cond.notify_all();
        self.wake_pump();
    }
}

/// What a group's handle, its worker and its Works share.
pub(super) struct Shared {
    pub(super) engine: Mutex<Engine>,
    pub(super) queue: Queue,
    /// Raised by `abort`, an interrupted wait or a failure: the operation in progress stops,
    /// queued and later ones fail.
    pub(super) cancel: Arc<Cancel>,
}

impl Shared {
    /// The engine, when the group is idle: nothing queued, nothing in progress, no
    /// point-to-point transfer pending. Jobs are taken from the queue only under the engine's
    /// lock, so an empty queue seen under it means no earlier operation is still to run.
    /// The worker's sweep of its links while a window is registered is brief: a caller that
    /// meets it waits for the engine rather than queue behind it.
    pub(super) fn idle_engine(&self) -> Option<MutexGuard<'_, Engine>> {
        let engine = match self.engine.try_lock() {
            Ok(engine) => engine,
            Err(_) if self.queue.sweeping.load(Ordering::Acquire) => lock(&self.engine),
            Err(_) => return None,
        };
        let idle = !self.queue.has_jobs() && !engine.transport.has_pending();
        if idle {
            self.queue.calls.fetch_add(1, Ordering::Relaxed);
        }
        idle.then_some(engine)
    }

    /// The worker: runs queued jobs, and while none is queued moves posted transfers and
    /// applies what peers put into this rank's windows (until the group closes).
    pub(super) fn serve(&self) {
        // Set when the worker woke for news on the links. A program calling the group (on its
        // own thread, `idle_engine`) reads the links itself: the worker leaves them to it until
        // it has made no call for a backoff, rather than contend for the engine after each.
        let mut woke_for_links = false;
        let mut calls_seen = 0;
        loop {
            let mut backoff = LINKS_BACKOFF;
            while woke_for_links && !self.queue.has_jobs() {
                let calls = self.queue.calls.load(Ordering::Relaxed);
                if calls == calls_seen {
                    break;
                }
                calls_seen = calls;
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(LINKS_BACKOFF_MAX);
            }
            woke_for_links = false;
            let mut engine = lock(&self.engine);
            if let Some(job) = self.queue.try_pop() {
                job(&mut engine);
                continue;
            }
            let closed = self.queue.closed.load(Ordering::Acquire);
            // A failed group's windows take nothing more.
            let windows = engine.transport.has_windows() && !closed && engine.failed.is_none();
            let pending = engine.transport.has_pending();
            if !pending && !windows {
                drop(engine);
                if !self.queue.wait_for_job() {
                    break;
                }
                continue;
            }
            let wake = self
                .queue
                .wake
                .get_or_init(|| Wake::new().ok().map(Arc::new));
            if let (false, Some(wake)) = (pending, wake) {
                if let Some(fds) = engine.transport.sleep_fds() {
                    self.queue.sweeping.store(true, Ordering::Release);
                    let swept = engine.transport.sweep();
                    self.queue.sweeping.store(false, Ordering::Release);
                    match swept {
                        Ok(false) => {
                            // Asleep without the engine, so that the program's own calls run
                            // on its thread meanwhile (reading the links themselves).
                            drop(engine);
                            woke_for_links = self.sleep_unlocked(fds, wake);
                        }
                        moved => {
                            let _ = engine.record(moved.map(|_| ()));
                        }
                    }
                    continue;
                }
            }
            if let Some(wake) = wake {
                engine.transport.set_wake(wake);
            }
            self.queue.pumping.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            let interrupt = || self.queue.has_jobs() || self.queue.closed.load(Ordering::Acquire);
            let outcome = engine.transport.pump(&interrupt);
            self.queue.pumping.store(false, Ordering::Relaxed);
            let _ = engine.record(outcome);
        }
        let mut engine = lock(&self.engine);
        if engine.failed.is_none() {
            engine.transport.shutdown();
        }
    }

    /// Sleeps until a link in `fds` has news, work is queued (`wake` rings) or a nap passes;
    /// whether a link had news.
    fn sleep_unlocked(&self, mut fds: Vec<libc::pollfd>, wake: &Wake) -> bool {
        fds.push(wake.pollfd());
        self.queue.pumping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !self.queue.has_jobs() && !self.queue.closed.load(Ordering::Acquire) {
            poll_fds(&mut fds, interrupt::POLL);
        }
        self.queue.pumping.store(false, Ordering::Relaxed);
        let Some((rang, links)) = fds.split_last() else {
            return false;
        };
        if rang.revents != 0 {
            wake.drain();
        }
        links.iter().any(|f| f.revents != 0)
    }
}
