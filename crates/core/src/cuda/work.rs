//! `CudaWork`: the handle of one CUDA operation, with torch's stream semantics.

use std::any::Any;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustdist_nccl_sys::{CudaStream, Cudart};

use super::rt::{self, DeviceGuard, Event};
use crate::error::{Error, Result};
use crate::recorder::Ticket;
use crate::work::Work;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One operation's state, shared by its [`CudaWork`], the launcher and the watchdog.
pub(crate) struct OpState {
    pub(crate) seq: u64,
    pub(crate) name: &'static str,
    pub(crate) start: Instant,
    /// The group's timeout when the operation was issued: it must finish within this of
    /// `start` (a later change of the group's timeout does not touch it).
    pub(crate) timeout: Duration,
    /// Set once the GPU work is enqueued: the event recorded after it, or why it never will be.
    launched: Mutex<Option<Result<Arc<Event>>>>,
    launched_cond: Condvar,
    /// The sender of a receive, once known.
    source: Mutex<Option<usize>>,
    /// Host buffers the GPU work reads or writes (released with the op).
    hold: Mutex<Option<Box<dyn Any + Send>>>,
    /// Its entries in the group's flight recorder (one per transfer of a batch).
    pub(crate) tickets: Vec<Ticket>,
}

impl OpState {
    pub(crate) fn new(
        seq: u64,
        name: &'static str,
        source: Option<usize>,
        timeout: Duration,
        tickets: Vec<Ticket>,
    ) -> Arc<OpState> {
        Arc::new(OpState {
            tickets,
            seq,
            name,
            start: Instant::now(),
            timeout,
            launched: Mutex::new(None),
            launched_cond: Condvar::new(),
            source: Mutex::new(source),
            hold: Mutex::new(None),
        })
    }

    pub(crate) fn set_launched(&self, outcome: Result<Arc<Event>>) {
        let mut slot = lock(&self.launched);
        if slot.is_none() {
            *slot = Some(outcome);
        }
        drop(slot);
        self.launched_cond.notify_all();
    }

    pub(crate) fn launched(&self) -> Option<Result<Arc<Event>>> {
        lock(&self.launched).clone()
    }

    /// Waits until enqueued (only ops queued behind a host-staged one wait at all).
    fn wait_launched(&self, timeout: Duration) -> Result<Arc<Event>> {
        let deadline = self.start + timeout;
        let mut slot = lock(&self.launched);
        loop {
            if let Some(outcome) = slot.as_ref() {
                return outcome.clone();
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Err(Error::backend(format!(
                    "CUDA {} (sequence number {}) was not enqueued within the group's timeout",
                    self.name, self.seq
                )));
            };
            slot = self
                .launched_cond
                .wait_timeout(slot, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    pub(crate) fn set_source(&self, source: Option<usize>) {
        if source.is_some() {
            *lock(&self.source) = source;
        }
    }

    pub(crate) fn hold(&self, what: Box<dyn Any + Send>) {
        *lock(&self.hold) = Some(what);
    }

    /// Completes `work` with `outcome`. On success the host buffers go back at once; after a
    /// failure the device may still be copying from them, so they are returned to the caller
    /// to keep until the group is gone.
    pub(crate) fn finish(&self, work: &Work, outcome: Result<()>) -> Option<Box<dyn Any + Send>> {
        let held = lock(&self.hold).take();
        let source = *lock(&self.source);
        let failed = outcome.is_err();
        work.complete(outcome, source);
        if failed {
            held
        } else {
            None
        }
    }

    /// Whether the GPU work has finished (`Some(error)` when the device reported one); `None`
    /// while not launched, or when the launch failed (the launcher completes the Work then).
    pub(crate) fn device_done(&self) -> Option<Result<()>> {
        match self.launched()? {
            Ok(end) => match end.done() {
                Ok(true) => Some(Ok(())),
                Ok(false) => None,
                Err(e) => Some(Err(e)),
            },
            Err(_) => None,
        }
    }
}

/// The handle of a CUDA operation (torch's `WorkNCCL`). The inner [`Work`] completes, and
/// releases the tensors it keeps alive, once the GPU work has finished (or failed), so
/// callbacks and futures behave as for CPU operations.
pub struct CudaWork {
    pub(crate) op: Arc<OpState>,
    pub(crate) work: Work,
    pub(crate) rt: &'static Cudart,
    pub(crate) device: i32,
    pub(crate) timeout: Duration,
}

impl CudaWork {
    /// The engine Work that completes when the GPU work does.
    pub fn work(&self) -> &Work {
        &self.work
    }

    /// torch's `Work.wait()` for CUDA: makes `stream` (the caller's current stream, as a raw
    /// `cudaStream_t`) wait on the device for the operation's end; does not block the host,
    /// except for an operation queued behind a host-staged one, until it is enqueued. Raises
    /// the operation's error if it has already failed.
    pub fn wait_stream(&self, stream: usize) -> Result<()> {
        let end = self.op.wait_launched(self.timeout)?;
        if let Some(Err(e)) = self.work.outcome() {
            return Err(e);
        }
        let _device = DeviceGuard::set(self.rt, self.device)?;
        rt::stream_wait(self.rt, stream as CudaStream, &end)
    }

    /// Blocks the host until the operation has finished on the device and returns its outcome
    /// (`timeout`: as [`Work::wait`]; the group's watchdog bounds it in any case).
    pub fn synchronize(&self, timeout: Option<Duration>) -> Result<()> {
        self.work.wait(timeout)
    }

    /// Whether the operation has finished on the device (cudaEventQuery), successfully or not.
    pub fn is_completed(&self) -> bool {
        if self.work.is_completed() {
            return true;
        }
        match self.op.device_done() {
            Some(Ok(())) => {
                // Complete now rather than at the watchdog's next poll.
                self.op.finish(&self.work, Ok(()));
                true
            }
            // Device errors are the watchdog's to report (it aborts the group).
            Some(Err(_)) | None => false,
        }
    }
}
