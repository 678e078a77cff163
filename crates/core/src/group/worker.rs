//! The group's job queue and its worker thread: queued operations run in issue order, and
//! posted point-to-point transfers move while nothing is queued.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::engine::Engine;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::spin::Spin;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep using it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

type Job = Box<dyn FnOnce(&mut Engine) + Send>;

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    closed: bool,
}

#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<QueueState>,
    /// Jobs queued and not yet taken, readable without the lock.
    queued: AtomicUsize,
    /// Set once closed, readable without the lock.
    closed: AtomicBool,
    cond: Condvar,
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
        Ok(())
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

    /// Waits until a job is queued (true) or the queue is closed and drained (false).
    fn wait_for_job(&self) -> bool {
        let mut spin = Spin::new();
        while spin.again() {
            if self.has_jobs() {
                return true;
            }
        }
        let mut st = lock(&self.state);
        while st.jobs.is_empty() && !st.closed {
            st = self
                .cond
                .wait(st)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        !st.jobs.is_empty()
    }

    pub(super) fn close(&self) {
        lock(&self.state).closed = true;
        self.closed.store(true, Ordering::Release);
        self.cond.notify_all();
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
    pub(super) fn idle_engine(&self) -> Option<MutexGuard<'_, Engine>> {
        let engine = self.engine.try_lock().ok()?;
        (!self.queue.has_jobs() && !engine.transport.has_pending()).then_some(engine)
    }

    /// The worker: runs queued jobs, and moves posted transfers while none is queued.
    pub(super) fn serve(&self) {
        loop {
            let mut engine = lock(&self.engine);
            if let Some(job) = self.queue.try_pop() {
                job(&mut engine);
                continue;
            }
            if engine.transport.has_pending() {
                let outcome = engine.transport.pump(&|| self.queue.has_jobs());
                let _ = engine.record(outcome);
                continue;
            }
            drop(engine);
            if !self.queue.wait_for_job() {
                break;
            }
        }
        let mut engine = lock(&self.engine);
        if engine.failed.is_none() {
            engine.transport.shutdown();
        }
    }
}
