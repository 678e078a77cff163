//! The engine under [`super::CudaGroup`]: the job queue, the helper thread that runs queued
//! and host-staged jobs, the watchdog thread that completes Works as their end events fire and
//! fails the group on a timeout or an NCCL error, the group's failure state, and the staging
//! buffers held by failed operations. It runs [`Plan`]s: NCCL bodies (built from
//! [`super::nccl_calls`]) inside `Comm::launch`, host-staged plans ([`Staged`]) through pinned
//! memory and the CPU engine.
//!
//! Uses the staged plans' types ([`super::staged`]); used by the group, never the other way.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rustdist_nccl_sys::{
    CudaMemcpyKind, CudaStream, Cudart, Nccl, NcclComm, NcclDataType, NcclRedOp,
};

use super::codes::OpSpec;
use super::comm::Comm;
use super::rt::{DeviceGuard, DeviceMem, Event, Lease, PinnedPool, Stream};
use super::staged::Staged;
use super::types::Mode;
use super::work::{CudaWork, OpState};
use crate::error::{Error, Result};
use crate::group::ProcessGroup;
use crate::recorder::{self, Op, Recorder};
use crate::timeout::Timeout;
use crate::work::{Keepalive, Work};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The NCCL calls of one operation, made inside `Comm::launch`.
pub(super) type NcclBody =
    Box<dyn FnOnce(&'static Nccl, NcclComm, NcclRedOp, CudaStream) -> Result<()> + Send>;

/// What one operation does: NCCL calls, or a host-staged plan.
pub(super) enum Plan {
    Nccl {
        dtype: NcclDataType,
        op: OpSpec,
        body: NcclBody,
    },
    Staged(Staged),
}

/// One issued operation: its state and Work, the event its stream waits for, its plan.
struct Job {
    op: Arc<OpState>,
    work: Work,
    ready: Event,
    plan: Plan,
}

/// Jobs waiting for the helper thread.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// The helper thread has (or is running) jobs: new operations queue behind them.
    busy: bool,
    closed: bool,
}

/// The state a [`super::CudaGroup`] shares with its helper and watchdog threads.
pub(super) struct Inner {
    pub(super) rt: &'static Cudart,
    pub(super) device: i32,
    pub(super) rank: usize,
    pub(super) size: usize,
    name: String,
    /// Read once per operation, when it is issued (see [`super::CudaGroup::set_timeout`]).
    pub(super) timeout: Timeout,
    pub(super) mode: Mode,
    pub(super) comm: Option<Comm>,
    /// Runs the staged steps; used by nothing else (see [`super::CudaGroup::new`]).
    pub(super) cpu: Arc<ProcessGroup>,
    stream: Stream,
    pool: Arc<PinnedPool>,
    /// The barrier's one-element buffer (NCCL mode).
    pub(super) scratch: Option<DeviceMem>,
    seq: AtomicU64,
    queue: Mutex<Queue>,
    queue_cond: Condvar,
    pending: Mutex<Vec<(Arc<OpState>, Work)>>,
    pending_cond: Condvar,
    /// The error that broke the group (sticky: every later operation fails with it).
    failed: Mutex<Option<Error>>,
    stopping: AtomicBool,
    /// Staging buffers of failed operations, which the device may still be copying.
    graveyard: Mutex<Vec<Box<dyn Any + Send>>>,
    /// The group's flight recorder (its staging group's is hidden: these entries say it all).
    pub(super) recorder: Arc<Recorder>,
}

impl Inner {
    fn failure(&self) -> Option<Error> {
        lock(&self.failed).clone()
    }

    pub(super) fn check(&self) -> Result<()> {
        self.failure().map_or(Ok(()), Err)
    }

    fn finish(&self, op: &OpState, work: &Work, outcome: Result<()>) {
        if outcome.is_ok() {
            for &t in &op.tickets {
                self.recorder.completed(t);
            }
        }
        if let Some(held) = op.finish(work, outcome) {
            lock(&self.graveyard).push(held);
        }
    }

    /// Breaks the group: aborts the communicator and fails every pending operation with `e`
    /// (the first error wins), and dumps the flight recorder after a first failure.
    fn fail(&self, e: Error) {
        self.break_with(e, true);
    }

    /// [`Inner::fail`]; `dump`: write the flight recorder after a first failure (not for an
    /// abort: the front door dumps after a user's).
    fn break_with(&self, e: Error, dump: bool) {
        let (e, first) = {
            let mut failed = lock(&self.failed);
            let first = failed.is_none();
            (failed.get_or_insert(e).clone(), first)
        };
        if first && dump {
            recorder::dump_after_failure(&e.to_string());
        }
        if let Some(comm) = &self.comm {
            comm.abort();
        }
        let pending: Vec<_> = lock(&self.pending).drain(..).collect();
        for (op, work) in pending {
            op.set_launched(Err(e.clone()));
            self.finish(&op, &work, Err(e.clone()));
        }
    }

    /// Runs `job` on this thread (the caller's, or the helper's).
    fn run(&self, job: Job) -> Result<()> {
        let Job {
            op,
            work,
            ready,
            plan,
        } = job;
        let launched = self.check().and_then(|()| match plan {
            Plan::Nccl {
                dtype,
                op: spec,
                body,
            } => self.run_nccl(&op, &ready, dtype, spec, body),
            Plan::Staged(staged) => self.run_staged(&op, &ready, staged),
        });
        match launched {
            Ok(end) => {
                for &t in &op.tickets {
                    self.recorder.started(t);
                }
                op.set_launched(Ok(end));
                Ok(())
            }
            Err(e) => {
                op.set_launched(Err(e.clone()));
                self.finish(&op, &work, Err(e.clone()));
                Err(e)
            }
        }
    }

    fn run_nccl(
        &self,
        op: &OpState,
        ready: &Event,
        dtype: NcclDataType,
        spec: OpSpec,
        body: NcclBody,
    ) -> Result<Arc<Event>> {
        let comm = self
            .comm
            .as_ref()
            .ok_or_else(|| Error::Runtime("this CUDA group has no NCCL communicator".into()))?;
        self.stream.wait(ready)?;
        let stream = self.stream.raw;
        comm.launch(op.name, dtype, spec, |nccl, raw, red_op| {
            body(nccl, raw, red_op, stream)
        })?;
        Ok(Arc::new(Event::record(self.rt, stream)?))
    }

    fn run_staged(&self, op: &OpState, ready: &Event, staged: Staged) -> Result<Arc<Event>> {
        let Staged {
            host_bytes,
            to_host,
            from_host,
            step,
        } = staged;
        self.stream.wait(ready)?;
        let host: Lease = self.pool.take(host_bytes)?;
        let base = host.addr();
        for c in &to_host {
            // SAFETY: the device range is kept alive by the Work's keepalive, the host range
            // by `host`, which is buried below if the copy may still be running.
            unsafe {
                self.stream
                    .copy(base + c.host, c.dev, c.len, CudaMemcpyKind::DEVICE_TO_HOST)
            }?;
        }
        let copied = Event::record(self.rt, self.stream.raw)?;
        let what = format!(
            "CUDA {} (sequence number {}): the copy to host memory",
            op.name, op.seq
        );
        if let Err(e) = copied.wait(op.start + op.timeout, &what, || self.failure()) {
            lock(&self.graveyard).push(Box::new(host));
            return Err(e);
        }
        let source = step(base)?;
        // Under the failure lock: a group that fails meanwhile releases the tensors, so no copy
        // into them may be enqueued after that.
        let failed = lock(&self.failed);
        if let Some(e) = failed.clone() {
            return Err(e);
        }
        for c in &from_host {
            // SAFETY: as above; the copy reads `host`, which the op holds until it completes.
            unsafe {
                self.stream
                    .copy(c.dev, base + c.host, c.len, CudaMemcpyKind::HOST_TO_DEVICE)
            }?;
        }
        let end = Event::record(self.rt, self.stream.raw)?;
        drop(failed);
        op.set_source(source);
        op.hold(Box::new(host));
        Ok(Arc::new(end))
    }

    /// One watchdog pass: completes finished operations, fails the group on a timeout, a
    /// device error or an NCCL error. Returns (anything pending, anything completed).
    fn poll(&self) -> (bool, bool) {
        let mut finished = Vec::new();
        let mut broken: Option<Error> = None;
        let left = {
            let mut pending = lock(&self.pending);
            pending.retain(|(op, work)| {
                if work.is_completed() {
                    return false;
                }
                match op.device_done() {
                    Some(outcome) => {
                        finished.push((op.clone(), work.clone(), outcome));
                        false
                    }
                    None => {
                        let ran = op.start.elapsed();
                        if broken.is_none() && ran > op.timeout {
                            broken = Some(Error::backend(format!(
                                "[Rank {}] Watchdog caught collective operation timeout: CUDA {} \
                                 (sequence number {}) on process group {:?} ran for {} ms, longer \
                                 than the group's timeout of {} ms; the NCCL communicator was \
                                 aborted and every pending CUDA operation failed",
                                self.rank,
                                op.name,
                                op.seq,
                                self.name,
                                ran.as_millis(),
                                op.timeout.as_millis()
                            )));
                        }
                        true
                    }
                }
            });
            !pending.is_empty()
        };
        let progressed = !finished.is_empty();
        for (op, work, outcome) in finished {
            if let Err(e) = &outcome {
                broken.get_or_insert_with(|| {
                    e.clone()
                        .context(&format!("[Rank {}] CUDA {}", self.rank, op.name))
                });
            }
            self.finish(&op, &work, outcome);
        }
        if broken.is_none() && self.failure().is_none() {
            if let Some(e) = self.comm.as_ref().and_then(Comm::async_error) {
                broken = Some(e.context(&format!(
                    "[Rank {}] the NCCL communicator of process group {:?} failed \
                     (every pending CUDA operation was aborted)",
                    self.rank, self.name
                )));
            }
        }
        if let Some(e) = broken {
            self.fail(e);
        }
        (left, progressed)
    }
}

fn helper_thread(inner: Arc<Inner>) {
    // The helper's own thread: set its device once.
    // SAFETY: plain call with a device ordinal validated at construction.
    let _ = unsafe { (inner.rt.set_device)(inner.device) };
    loop {
        let job = {
            let mut q = lock(&inner.queue);
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    break job;
                }
                q.busy = false;
                inner.queue_cond.notify_all();
                if q.closed {
                    return;
                }
                q = inner.queue_cond.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        // Its error is already the Work's outcome.
        let _ = inner.run(job);
    }
}

fn watchdog_thread(inner: Arc<Inner>) {
    // SAFETY: plain call with a device ordinal validated at construction.
    let _ = unsafe { (inner.rt.set_device)(inner.device) };
    let mut pause = Duration::from_micros(20);
    loop {
        let (left, progressed) = inner.poll();
        if progressed {
            pause = Duration::from_micros(20);
        }
        if left {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
            continue;
        }
        let pending = lock(&inner.pending);
        if !pending.is_empty() {
            continue;
        }
        if inner.stopping.load(Ordering::Acquire) {
            return;
        }
        // Idle: wake for new work, and now and then to notice a communicator error.
        drop(
            inner
                .pending_cond
                .wait_timeout(pending, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner()),
        );
        pause = Duration::from_micros(20);
    }
}

/// The group's side: starting the engine, issuing operations, stopping it.
impl Inner {
    /// Builds the engine of a group and starts its helper and watchdog threads (returned in
    /// that order: [`Inner::shutdown`] joins the helper first).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
        cpu: Arc<ProcessGroup>,
        rt: &'static Cudart,
        device: i32,
        rank: usize,
        size: usize,
        name: &str,
        timeout: Duration,
        comm: Option<Comm>,
    ) -> Result<(Arc<Inner>, Vec<JoinHandle<()>>)> {
        let _device = DeviceGuard::set(rt, device)?;
        cpu.recorder().hide();
        let scratch = match comm {
            Some(_) => Some(DeviceMem::new(rt, 4)?),
            None => None,
        };
        let inner = Arc::new(Inner {
            rt,
            device,
            rank,
            size,
            name: name.to_string(),
            timeout: Timeout::new(timeout),
            mode: if comm.is_some() {
                Mode::Nccl
            } else {
                Mode::Staged
            },
            comm,
            cpu,
            stream: Stream::new(rt)?,
            pool: PinnedPool::new(rt),
            scratch,
            seq: AtomicU64::new(0),
            queue: Mutex::new(Queue::default()),
            queue_cond: Condvar::new(),
            pending: Mutex::new(Vec::new()),
            pending_cond: Condvar::new(),
            failed: Mutex::new(None),
            stopping: AtomicBool::new(false),
            graveyard: Mutex::new(Vec::new()),
            recorder: Recorder::new(name, None, size),
        });
        let spawn = |what: &str, f: fn(Arc<Inner>)| {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name(format!("rustdist-cuda-{what}-{rank}"))
                .spawn(move || f(inner))
                .map_err(|e| Error::Runtime(format!("cannot start the CUDA {what} thread: {e}")))
        };
        let helper = spawn("helper", helper_thread)?;
        let watchdog = match spawn("watchdog", watchdog_thread) {
            Ok(w) => w,
            Err(e) => {
                lock(&inner.queue).closed = true;
                inner.queue_cond.notify_all();
                return Err(e);
            }
        };
        Ok((inner, vec![helper, watchdog]))
    }

    /// Enqueues `plan` as operation `name`, recorded as `ops`, after the work queued so far
    /// on `stream`.
    pub(super) fn submit(
        &self,
        name: &'static str,
        ops: &[Op],
        source: Option<usize>,
        stream: usize,
        keep: Option<Keepalive>,
        plan: Plan,
    ) -> Result<CudaWork> {
        let inner = self;
        inner.check()?;
        let _device = DeviceGuard::set(inner.rt, inner.device)?;
        let ready = Event::record(inner.rt, stream as CudaStream)?;
        let seq = inner.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let timeout = inner.timeout.get();
        let tickets = ops
            .iter()
            .map(|&op| inner.recorder.record(op, timeout, false))
            .collect();
        let op = OpState::new(seq, name, source, timeout, tickets);
        let work = Work::new(keep);
        let handle = CudaWork {
            op: op.clone(),
            work: work.clone(),
            rt: inner.rt,
            device: inner.device,
            timeout,
        };
        let mut q = lock(&inner.queue);
        if q.closed {
            return Err(Error::Runtime(
                "the CUDA process group has been shut down; create a new one".into(),
            ));
        }
        lock(&inner.pending).push((op.clone(), work.clone()));
        inner.pending_cond.notify_all();
        let job = Job {
            op,
            work,
            ready,
            plan,
        };
        if !q.busy && matches!(job.plan, Plan::Nccl { .. }) {
            // Launched here, under the queue lock: one thread at a time uses the communicator,
            // and the stream order is the call order.
            inner.run(job)?;
        } else {
            q.busy = true;
            q.jobs.push_back(job);
            inner.queue_cond.notify_all();
        }
        Ok(handle)
    }

    /// Runs `f` while no other thread can use the communicator and nothing is queued.
    pub(super) fn exclusive<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut q = lock(&self.queue);
        while q.busy {
            q = self.queue_cond.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        f()
    }

    /// [`super::CudaGroup::shutdown`], once: queued operations still run, pending ones finish,
    /// `threads` (those of [`Inner::start`]) are joined, then the communicator is finalized
    /// and the staging group shut down.
    pub(super) fn shutdown(&self, mut threads: Vec<JoinHandle<()>>) {
        let inner = self;
        lock(&inner.queue).closed = true;
        inner.queue_cond.notify_all();
        if !threads.is_empty() {
            // The helper first: it drains the queue.
            let _ = threads.remove(0).join();
        }
        while !lock(&inner.pending).is_empty() {
            std::thread::sleep(Duration::from_micros(200));
        }
        inner.stopping.store(true, Ordering::Release);
        inner.pending_cond.notify_all();
        for t in threads {
            let _ = t.join();
        }
        if let Some(comm) = &inner.comm {
            let _device = DeviceGuard::set(inner.rt, inner.device);
            comm.finalize();
        }
        inner.cpu.shutdown();
    }

    /// [`super::CudaGroup::abort`], once: fails the group, closes the queue, stops the threads
    /// (without waiting for them) and aborts the staging group.
    pub(super) fn abort(&self) {
        let inner = self;
        inner.break_with(
            Error::backend(format!(
                "the CUDA process group {:?} was aborted",
                inner.name
            )),
            false,
        );
        lock(&inner.queue).closed = true;
        inner.queue_cond.notify_all();
        inner.stopping.store(true, Ordering::Release);
        inner.pending_cond.notify_all();
        inner.cpu.abort();
    }
}
