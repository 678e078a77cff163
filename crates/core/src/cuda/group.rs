//! `CudaGroup`: the CUDA operations of one process group on one device (see the module docs
//! for what runs on NCCL and what is staged through host memory).

use std::any::Any;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rustdist_nccl_sys::{
    CudaMemcpyKind, CudaStream, Cudart, Nccl, NcclComm, NcclDataType, NcclRedOp, NcclResult,
    NcclUniqueId,
};

use super::codes::{self, OpSpec, Route, BYTES};
use super::comm::Comm;
use super::rt::{DeviceGuard, DeviceMem, Event, Lease, PinnedPool, Stream};
use super::work::{CudaWork, OpState};
use crate::error::{Error, Result};
use crate::group::{Blocks, ProcessGroup, Reduction, Run};
use crate::store::Store;
use crate::tensor::{RawBuf, Tensor};
use crate::timeout::Timeout;
use crate::types::{CollectiveKind, DType};
use crate::work::{Keepalive, Work};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A contiguous CUDA tensor: device address, dtype and element count. Never dereferenced on
/// the host.
#[derive(Debug, Clone, Copy)]
pub struct DevTensor {
    pub ptr: usize,
    pub dtype: DType,
    pub numel: usize,
}

impl DevTensor {
    pub fn nbytes(&self) -> usize {
        self.numel * self.dtype.size()
    }

    /// Elements `[start, start + numel)` of this tensor.
    fn slice(&self, start: usize, numel: usize) -> DevTensor {
        DevTensor {
            ptr: self.ptr + start * self.dtype.size(),
            dtype: self.dtype,
            numel,
        }
    }
}

/// One transfer of a batched send/recv (torch's `P2POp`).
#[derive(Debug, Clone, Copy)]
pub struct P2pOp {
    pub send: bool,
    pub peer: usize,
    pub tensor: DevTensor,
    pub tag: i64,
}

/// How the group's operations run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every rank has its own GPU: an NCCL communicator.
    Nccl,
    /// Some ranks share a GPU: everything goes through host memory and the CPU engine.
    Staged,
}

/// A member's side of [`CudaGroup::split`]: what [`CudaGroup::new`] takes for the subgroup.
pub struct SplitArgs {
    pub cpu: Arc<ProcessGroup>,
    pub store: Arc<dyn Store>,
    pub rank: usize,
    pub size: usize,
    pub name: String,
    pub timeout: Duration,
}

/// The NCCL calls of one operation, made inside `Comm::launch`.
type NcclBody =
    Box<dyn FnOnce(&'static Nccl, NcclComm, NcclRedOp, CudaStream) -> Result<()> + Send>;

/// The CPU part of a staged operation, given the staging buffer's address; returns the source
/// rank of a receive.
type Step = Box<dyn FnOnce(usize) -> Result<Option<usize>> + Send>;

/// A copy between a device range and the staging buffer (at `host` bytes from its start).
struct HostCopy {
    dev: usize,
    host: usize,
    len: usize,
}

impl HostCopy {
    /// All of `t`, at `host` in the staging buffer.
    fn of(t: &DevTensor, host: usize) -> HostCopy {
        HostCopy {
            dev: t.ptr,
            host,
            len: t.nbytes(),
        }
    }
}

enum Plan {
    Nccl {
        dtype: NcclDataType,
        op: OpSpec,
        body: NcclBody,
    },
    Staged {
        host_bytes: usize,
        to_host: Vec<HostCopy>,
        from_host: Vec<HostCopy>,
        step: Step,
    },
}

/// Places blocks in the staging buffer, 64-byte aligned (the CPU kernels' fast path).
#[derive(Default)]
struct Layout {
    bytes: usize,
}

impl Layout {
    fn add(&mut self, len: usize) -> usize {
        let at = self.bytes.next_multiple_of(64);
        self.bytes = at + len;
        at
    }
}

/// A CPU-engine view of `numel` elements at `base + off` in the staging buffer.
fn host_tensor(base: usize, off: usize, dtype: DType, numel: usize) -> Tensor {
    // SAFETY: the staging lease outlives the step, which waits for every CPU Work it starts;
    // nothing else touches the buffer meanwhile.
    unsafe { Tensor::new((base + off) as *mut u8, dtype, numel) }
}

/// Waits for a CPU Work; its source rank (receives).
fn finish_cpu(work: Result<Work>) -> Result<Option<usize>> {
    let work = work?;
    work.wait(None)?;
    Ok(work.source_rank())
}

/// The outcome of a CPU collective run synchronously ([`Run::Sync`]).
fn sync_cpu(done: Result<Option<Work>>) -> Result<Option<usize>> {
    done.map(|_| None)
}

/// `Ok` for success and ncclInProgress (settled at ncclGroupEnd), else NCCL's error.
fn nccl_ok(nccl: &Nccl, r: NcclResult, call: &'static str, comm: NcclComm) -> Result<()> {
    if r == NcclResult::IN_PROGRESS {
        return Ok(());
    }
    // SAFETY: called only inside `Comm::launch`, which holds the live communicator's lock.
    Ok(unsafe { nccl.check_comm(r, call, comm) }?)
}

fn int(v: usize) -> c_int {
    v as c_int
}

fn hostname() -> String {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer has room for the length passed; the last byte stays NUL.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr(), buf.len() - 1) };
    if r != 0 {
        return "unknown-host".into();
    }
    // SAFETY: NUL-terminated within the buffer (its last byte is never written).
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// The same error with `context` in front.
fn context(e: Error, context: &str) -> Error {
    let wrap = |m: String| format!("{context}: {m}");
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(wrap(m)),
        Error::Type(m) => Error::Type(wrap(m)),
        Error::Runtime(m) => Error::Runtime(wrap(m)),
        Error::Store(m) => Error::Store(wrap(m)),
        Error::Network(m) => Error::Network(wrap(m)),
        Error::Backend(m) => Error::Backend(wrap(m)),
        Error::Interrupted => Error::Interrupted,
    }
}

struct Job {
    op: Arc<OpState>,
    work: Work,
    ready: Event,
    plan: Plan,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// The helper thread has (or is running) jobs: new operations queue behind them.
    busy: bool,
    closed: bool,
}

struct Inner {
    rt: &'static Cudart,
    device: i32,
    rank: usize,
    size: usize,
    name: String,
    /// Read once per operation, when it is issued (see [`CudaGroup::set_timeout`]).
    timeout: Timeout,
    mode: Mode,
    comm: Option<Comm>,
    /// Runs the staged steps; used by nothing else (see [`CudaGroup::new`]).
    cpu: Arc<ProcessGroup>,
    stream: Stream,
    pool: Arc<PinnedPool>,
    /// The barrier's one-element buffer (NCCL mode).
    scratch: Option<DeviceMem>,
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
}

impl Inner {
    fn failure(&self) -> Option<Error> {
        lock(&self.failed).clone()
    }

    fn check(&self) -> Result<()> {
        self.failure().map_or(Ok(()), Err)
    }

    fn finish(&self, op: &OpState, work: &Work, outcome: Result<()>) {
        if let Some(held) = op.finish(work, outcome) {
            lock(&self.graveyard).push(held);
        }
    }

    /// Breaks the group: aborts the communicator and fails every pending operation with `e`
    /// (the first error wins).
    fn fail(&self, e: Error) {
        let e = {
            let mut failed = lock(&self.failed);
            failed.get_or_insert(e).clone()
        };
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
            Plan::Staged {
                host_bytes,
                to_host,
                from_host,
                step,
            } => self.run_staged(&op, &ready, host_bytes, to_host, from_host, step),
        });
        match launched {
            Ok(end) => {
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

    fn run_staged(
        &self,
        op: &OpState,
        ready: &Event,
        host_bytes: usize,
        to_host: Vec<HostCopy>,
        from_host: Vec<HostCopy>,
        step: Step,
    ) -> Result<Arc<Event>> {
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
                    context(e.clone(), &format!("[Rank {}] CUDA {}", self.rank, op.name))
                });
            }
            self.finish(&op, &work, outcome);
        }
        if broken.is_none() && self.failure().is_none() {
            if let Some(e) = self.comm.as_ref().and_then(Comm::async_error) {
                broken = Some(context(
                    e,
                    &format!(
                        "[Rank {}] the NCCL communicator of process group {:?} failed \
                         (every pending CUDA operation was aborted)",
                        self.rank, self.name
                    ),
                ));
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

/// The CUDA side of a process group on one device. Construction is collective over the
/// group's ranks; so are the operations, which every rank issues in the same order.
pub struct CudaGroup {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    closed: AtomicBool,
}

impl CudaGroup {
    /// Joins the CUDA group `name` of `size` ranks on `device`: ranks exchange their GPU's
    /// identity (host and PCI bus id) through `store`; distinct GPUs get an NCCL communicator
    /// (rank 0's unique id through the store, a non-blocking init bounded by `timeout`), a GPU
    /// shared by several ranks makes every operation staged. `cpu` runs the staged steps; the
    /// CUDA group owns it (shuts it down or aborts it with itself) and nothing else may use it:
    /// its operations are issued from this group's helper thread, and another thread's could
    /// interleave differently on each rank.
    /// The CUDA runtime and NCCL are those already loaded ([`Cudart::global`],
    /// [`Nccl::global`]), else found on the system.
    pub fn new(
        cpu: Arc<ProcessGroup>,
        store: Arc<dyn Store>,
        rank: usize,
        size: usize,
        name: &str,
        timeout: Duration,
        device: i32,
    ) -> Result<CudaGroup> {
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "rank {rank} is out of range for a group of size {size}"
            )));
        }
        let unavailable =
            |e: rustdist_nccl_sys::Error| Error::Runtime(format!("CUDA is not available: {e}"));
        let rt = Cudart::global(&[]).map_err(unavailable)?;
        let count = rt.device_count().map_err(unavailable)?;
        if count == 0 {
            return Err(Error::Runtime(
                "CUDA is not available: no CUDA device is visible".into(),
            ));
        }
        if device < 0 || device as usize >= count {
            return Err(Error::invalid(format!(
                "CUDA device {device} does not exist ({count} visible)"
            )));
        }
        let _device = DeviceGuard::set(rt, device)?;
        let me = format!("{}/{}", hostname(), rt.pci_bus_id(device)?);
        store.set(&format!("{name}/device/{rank}"), me.as_bytes())?;
        let keys: Vec<String> = (0..size).map(|r| format!("{name}/device/{r}")).collect();
        let mut gpus = store.multi_get(&keys, Some(timeout))?;
        gpus.sort();
        let shared = gpus.windows(2).any(|w| w[0] == w[1]);
        let comm = if shared {
            None
        } else {
            let nccl = Nccl::global(&[])
                .map_err(|e| Error::Runtime(format!("NCCL is not available: {e}")))?;
            let key = format!("{name}/nccl_unique_id");
            let id = if rank == 0 {
                let id = nccl.unique_id()?;
                store.set(&key, &id.to_bytes())?;
                id
            } else {
                NcclUniqueId::from_bytes(&store.get(&key, Some(timeout))?).ok_or_else(|| {
                    Error::backend(format!("{key} in the store is not an ncclUniqueId"))
                })?
            };
            Some(Comm::init(nccl, rank, size, id, timeout)?)
        };
        Self::start(cpu, rt, device, rank, size, name, timeout, comm)
    }

    #[allow(clippy::too_many_arguments)]
    fn start(
        cpu: Arc<ProcessGroup>,
        rt: &'static Cudart,
        device: i32,
        rank: usize,
        size: usize,
        name: &str,
        timeout: Duration,
        comm: Option<Comm>,
    ) -> Result<CudaGroup> {
        let _device = DeviceGuard::set(rt, device)?;
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
        Ok(CudaGroup {
            inner,
            threads: Mutex::new(vec![helper, watchdog]),
            closed: AtomicBool::new(false),
        })
    }

    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    pub fn device(&self) -> i32 {
        self.inner.device
    }

    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The timeout operations issued now get.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout.get()
    }

    /// Changes the timeout of the CUDA operations issued after this call (the watchdog's
    /// bound, from issue to completion), of the NCCL communicator's later calls, and of the
    /// staging group that runs host-staged steps. Operations issued before keep theirs.
    pub fn set_timeout(&self, timeout: Duration) {
        self.inner.timeout.set(timeout);
        if let Some(comm) = &self.inner.comm {
            comm.set_timeout(timeout);
        }
        self.inner.cpu.set_timeout(timeout);
    }

    /// Enqueues `plan` as operation `name` after the work queued so far on `stream`.
    fn submit(
        &self,
        name: &'static str,
        source: Option<usize>,
        stream: usize,
        keep: Option<Keepalive>,
        plan: Plan,
    ) -> Result<CudaWork> {
        let inner = &self.inner;
        inner.check()?;
        let _device = DeviceGuard::set(inner.rt, inner.device)?;
        let ready = Event::record(inner.rt, stream as CudaStream)?;
        let seq = inner.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let timeout = inner.timeout.get();
        let op = OpState::new(seq, name, source, timeout);
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

    fn nccl_plan(&self, dtype: NcclDataType, op: OpSpec, body: NcclBody) -> Plan {
        Plan::Nccl { dtype, op, body }
    }

    fn data_plan(body: NcclBody) -> Plan {
        Plan::Nccl {
            dtype: BYTES,
            op: OpSpec::Builtin(NcclRedOp::SUM),
            body,
        }
    }

    fn staged(
        layout: Layout,
        to_host: Vec<HostCopy>,
        from_host: Vec<HostCopy>,
        step: Step,
    ) -> Plan {
        Plan::Staged {
            host_bytes: layout.bytes,
            to_host,
            from_host,
            step,
        }
    }

    fn check_rank(&self, what: &str, r: usize) -> Result<()> {
        if r >= self.inner.size {
            return Err(Error::invalid(format!(
                "{what} {r} is out of range for a group of size {}",
                self.inner.size
            )));
        }
        Ok(())
    }

    /// The NCCL route of a reduction, unless this group stages everything.
    fn route(&self, dtype: DType, red: &Reduction) -> Result<Route> {
        let route = codes::route(dtype, red)?;
        Ok(if self.inner.mode == Mode::Staged {
            Route::Staged
        } else {
            route
        })
    }

    /// In-place all_reduce of `t` on `stream` (torch's current stream, as a raw handle).
    pub fn all_reduce(
        &self,
        t: DevTensor,
        red: Reduction,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        let plan = match self.route(t.dtype, &red)? {
            Route::Nccl(r) => self.nccl_plan(
                r.dtype,
                r.op,
                Box::new(move |nccl, comm, op, s| {
                    let ptr = t.ptr as *mut c_void;
                    let count = t.numel * r.per_element;
                    // SAFETY: `t` is a live device tensor (kept by the Work) of `count` NCCL
                    // elements; in place, as NCCL allows.
                    let res = unsafe { (nccl.all_reduce)(ptr, ptr, count, r.dtype, op, comm, s) };
                    nccl_ok(nccl, res, "ncclAllReduce", comm)
                }),
            ),
            Route::Staged => {
                let cpu = self.inner.cpu.clone();
                let mut layout = Layout::default();
                let at = layout.add(t.nbytes());
                let copy = || vec![HostCopy::of(&t, at)];
                Self::staged(
                    layout,
                    copy(),
                    copy(),
                    Box::new(move |base| {
                        sync_cpu(cpu.all_reduce(
                            host_tensor(base, at, t.dtype, t.numel),
                            red,
                            Run::Sync,
                        ))
                    }),
                )
            }
        };
        self.submit("all_reduce", None, stream, keep, plan)
    }

    /// Reduces every rank's `t` into `t` on `root`; other ranks' tensors are left unchanged.
    pub fn reduce(
        &self,
        t: DevTensor,
        root: usize,
        red: Reduction,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        self.check_rank("reduce destination rank", root)?;
        let plan = match self.route(t.dtype, &red)? {
            Route::Nccl(r) => self.nccl_plan(
                r.dtype,
                r.op,
                Box::new(move |nccl, comm, op, s| {
                    let ptr = t.ptr as *mut c_void;
                    let count = t.numel * r.per_element;
                    // SAFETY: as for all_reduce; NCCL writes only the root's buffer.
                    let res =
                        unsafe { (nccl.reduce)(ptr, ptr, count, r.dtype, op, int(root), comm, s) };
                    nccl_ok(nccl, res, "ncclReduce", comm)
                }),
            ),
            Route::Staged => {
                let cpu = self.inner.cpu.clone();
                let mut layout = Layout::default();
                let at = layout.add(t.nbytes());
                let copy = || vec![HostCopy::of(&t, at)];
                let back = if self.inner.rank == root {
                    copy()
                } else {
                    Vec::new()
                };
                Self::staged(
                    layout,
                    copy(),
                    back,
                    Box::new(move |base| {
                        let h = host_tensor(base, at, t.dtype, t.numel);
                        sync_cpu(cpu.reduce(h, root, red, Run::Sync))
                    }),
                )
            }
        };
        self.submit("reduce", None, stream, keep, plan)
    }

    /// Broadcast of `t` from `root` to every rank, in place.
    pub fn broadcast(
        &self,
        t: DevTensor,
        root: usize,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        self.check_rank("broadcast root", root)?;
        let plan = match self.inner.mode {
            Mode::Nccl => Self::data_plan(Box::new(move |nccl, comm, _, s| {
                let ptr = t.ptr as *mut c_void;
                // SAFETY: `t` is a live device tensor of nbytes bytes; in place.
                let res =
                    unsafe { (nccl.broadcast)(ptr, ptr, t.nbytes(), BYTES, int(root), comm, s) };
                nccl_ok(nccl, res, "ncclBroadcast", comm)
            })),
            Mode::Staged => {
                let cpu = self.inner.cpu.clone();
                let mut layout = Layout::default();
                let at = layout.add(t.nbytes());
                let copy = vec![HostCopy::of(&t, at)];
                let (to, back) = if self.inner.rank == root {
                    (copy, Vec::new())
                } else {
                    (Vec::new(), copy)
                };
                Self::staged(
                    layout,
                    to,
                    back,
                    Box::new(move |base| {
                        sync_cpu(cpu.broadcast(
                            host_tensor(base, at, t.dtype, t.numel),
                            root,
                            Run::Sync,
                        ))
                    }),
                )
            }
        };
        self.submit("broadcast", None, stream, keep, plan)
    }

    /// Gathers every rank's `input` into `outputs[r]` on every rank; `outputs[r]` has rank
    /// r's size (they may differ: torch's uneven all_gather). NCCL: one grouped broadcast per
    /// rank.
    pub fn all_gather(
        &self,
        input: DevTensor,
        outputs: Vec<DevTensor>,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        let (rank, size) = (self.inner.rank, self.inner.size);
        if outputs.len() != size {
            return Err(Error::invalid(format!(
                "all_gather needs {size} output tensors (one per rank), got {}",
                outputs.len()
            )));
        }
        if outputs.iter().any(|o| o.dtype != input.dtype) {
            return Err(Error::invalid(
                "all_gather outputs must have the input's dtype",
            ));
        }
        if outputs[rank].numel != input.numel {
            return Err(Error::invalid(format!(
                "all_gather output {rank} has {} elements but this rank's input has {}",
                outputs[rank].numel, input.numel
            )));
        }
        let plan = match self.inner.mode {
            Mode::Nccl => Self::data_plan(Box::new(move |nccl, comm, _, s| {
                for (r, out) in outputs.iter().enumerate() {
                    let src = if r == rank { input.ptr } else { out.ptr };
                    // SAFETY: live device tensors of the given sizes (kept by the Work).
                    let res = unsafe {
                        (nccl.broadcast)(
                            src as *const c_void,
                            out.ptr as *mut c_void,
                            out.nbytes(),
                            BYTES,
                            int(r),
                            comm,
                            s,
                        )
                    };
                    nccl_ok(nccl, res, "ncclBroadcast", comm)?;
                }
                Ok(())
            })),
            Mode::Staged => self.staged_all_gather(input, outputs),
        };
        self.submit("all_gather", None, stream, keep, plan)
    }

    fn staged_all_gather(&self, input: DevTensor, outputs: Vec<DevTensor>) -> Plan {
        let cpu = self.inner.cpu.clone();
        let mut layout = Layout::default();
        let at_in = layout.add(input.nbytes());
        let at_out: Vec<usize> = outputs.iter().map(|o| layout.add(o.nbytes())).collect();
        let to = vec![HostCopy::of(&input, at_in)];
        let back = outputs
            .iter()
            .zip(&at_out)
            .map(|(o, &host)| HostCopy::of(o, host))
            .collect();
        let even = outputs.iter().all(|o| o.numel == input.numel);
        let dtype = input.dtype;
        let sizes: Vec<usize> = outputs.iter().map(|o| o.numel).collect();
        Self::staged(
            layout,
            to,
            back,
            Box::new(move |base| {
                let h_in = host_tensor(base, at_in, dtype, input.numel);
                let h_out: Vec<RawBuf> = at_out
                    .iter()
                    .zip(&sizes)
                    .map(|(&at, &n)| host_tensor(base, at, dtype, n).buf)
                    .collect();
                if even {
                    return sync_cpu(cpu.all_gather(h_in, h_out, Run::Sync));
                }
                let blocks = Blocks {
                    sends: (0..h_out.len()).map(|p| (p, h_in.buf)).collect(),
                    recvs: h_out.into_iter().enumerate().collect(),
                };
                sync_cpu(cpu.exchange(CollectiveKind::AllGather, dtype, 0, blocks, Run::Sync))
            }),
        )
    }

    /// torch's all_gather_into_tensor: `output` holds size × `input` (flat or stacked).
    pub fn all_gather_into(
        &self,
        input: DevTensor,
        output: DevTensor,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        let size = self.inner.size;
        if output.dtype != input.dtype || output.numel != input.numel * size {
            return Err(Error::invalid(format!(
                "all_gather_into_tensor: the output must have world_size ({size}) times the \
                 input's {} elements of {}, got {} of {}",
                input.numel,
                input.dtype.name(),
                output.numel,
                output.dtype.name()
            )));
        }
        let plan = match self.inner.mode {
            Mode::Nccl => Self::data_plan(Box::new(move |nccl, comm, _, s| {
                // SAFETY: live device tensors; in place when the input is the rank's block.
                let res = unsafe {
                    (nccl.all_gather)(
                        input.ptr as *const c_void,
                        output.ptr as *mut c_void,
                        input.nbytes(),
                        BYTES,
                        comm,
                        s,
                    )
                };
                nccl_ok(nccl, res, "ncclAllGather", comm)
            })),
            Mode::Staged => {
                let blocks = (0..size)
                    .map(|r| output.slice(r * input.numel, input.numel))
                    .collect();
                self.staged_all_gather(input, blocks)
            }
        };
        self.submit("all_gather_into_tensor", None, stream, keep, plan)
    }

    /// torch's reduce_scatter: reduces `inputs[r]` of every rank into `output` on rank r.
    /// NCCL: one grouped reduce per rank.
    pub fn reduce_scatter(
        &self,
        inputs: Vec<DevTensor>,
        output: DevTensor,
        red: Reduction,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        let (rank, size) = (self.inner.rank, self.inner.size);
        if inputs.len() != size
            || inputs
                .iter()
                .any(|i| i.numel != output.numel || i.dtype != output.dtype)
        {
            return Err(Error::invalid(format!(
                "reduce_scatter needs {size} input tensors (one per rank) of the output's {} \
                 elements of {}",
                output.numel,
                output.dtype.name()
            )));
        }
        let plan = match self.route(output.dtype, &red)? {
            Route::Nccl(r) => self.nccl_plan(
                r.dtype,
                r.op,
                Box::new(move |nccl, comm, op, s| {
                    for (root, input) in inputs.iter().enumerate() {
                        // Only the root's receive buffer is written (NULL elsewhere).
                        let recv = if root == rank {
                            output.ptr as *mut c_void
                        } else {
                            std::ptr::null_mut()
                        };
                        let count = output.numel * r.per_element;
                        // SAFETY: live device tensors of `count` NCCL elements.
                        let res = unsafe {
                            (nccl.reduce)(
                                input.ptr as *const c_void,
                                recv,
                                count,
                                r.dtype,
                                op,
                                int(root),
                                comm,
                                s,
                            )
                        };
                        nccl_ok(nccl, res, "ncclReduce", comm)?;
                    }
                    Ok(())
                }),
            ),
            Route::Staged => self.staged_reduce_scatter(inputs, output, red),
        };
        self.submit("reduce_scatter", None, stream, keep, plan)
    }

    fn staged_reduce_scatter(
        &self,
        inputs: Vec<DevTensor>,
        output: DevTensor,
        red: Reduction,
    ) -> Plan {
        let cpu = self.inner.cpu.clone();
        let nb = output.nbytes();
        let mut layout = Layout::default();
        let at_in = layout.add(nb * inputs.len());
        let at_out = layout.add(nb);
        let to = inputs
            .iter()
            .enumerate()
            .map(|(r, i)| HostCopy::of(i, at_in + r * nb))
            .collect();
        let back = vec![HostCopy::of(&output, at_out)];
        let n = inputs.len();
        Self::staged(
            layout,
            to,
            back,
            Box::new(move |base| {
                let h_in = host_tensor(base, at_in, output.dtype, output.numel * n);
                let h_out = host_tensor(base, at_out, output.dtype, output.numel);
                sync_cpu(cpu.reduce_scatter(h_in, h_out, red, Run::Sync))
            }),
        )
    }

    /// torch's reduce_scatter_tensor: `input` holds size blocks of `output.numel` elements.
    pub fn reduce_scatter_tensor(
        &self,
        input: DevTensor,
        output: DevTensor,
        red: Reduction,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        let size = self.inner.size;
        if input.dtype != output.dtype || input.numel != output.numel * size {
            return Err(Error::invalid(format!(
                "reduce_scatter_tensor: the input must have world_size ({size}) times the \
                 output's {} elements of {}, got {} of {}",
                output.numel,
                output.dtype.name(),
                input.numel,
                input.dtype.name()
            )));
        }
        let plan = match self.route(output.dtype, &red)? {
            Route::Nccl(r) => self.nccl_plan(
                r.dtype,
                r.op,
                Box::new(move |nccl, comm, op, s| {
                    // SAFETY: live device tensors; `input` holds size × recvcount elements.
                    let res = unsafe {
                        (nccl.reduce_scatter)(
                            input.ptr as *const c_void,
                            output.ptr as *mut c_void,
                            output.numel * r.per_element,
                            r.dtype,
                            op,
                            comm,
                            s,
                        )
                    };
                    nccl_ok(nccl, res, "ncclReduceScatter", comm)
                }),
            ),
            Route::Staged => {
                let blocks = (0..size)
                    .map(|r| input.slice(r * output.numel, output.numel))
                    .collect();
                self.staged_reduce_scatter(blocks, output, red)
            }
        };
        self.submit("reduce_scatter_tensor", None, stream, keep, plan)
    }

    /// One step of concurrent transfers, as the CPU group's `exchange`: `sends[i] = (peer,
    /// tensor)`, `recvs[j] = (peer, tensor)`; the k-th send to this rank fills the k-th receive
    /// from it. Serves gather, scatter and all_to_all(_single) with any split sizes (NCCL:
    /// grouped send/recv); `count` is what every rank agrees on (0 when sizes differ).
    #[allow(clippy::too_many_arguments)]
    pub fn exchange(
        &self,
        kind: CollectiveKind,
        dtype: DType,
        count: u64,
        sends: Vec<(usize, DevTensor)>,
        recvs: Vec<(usize, DevTensor)>,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        for &(p, _) in sends.iter().chain(recvs.iter()) {
            self.check_rank(&format!("{} peer rank", kind.name()), p)?;
        }
        let plan = match self.inner.mode {
            Mode::Nccl => self.nccl_transfers(kind.name(), sends, recvs)?,
            Mode::Staged => {
                let cpu = self.inner.cpu.clone();
                let mut layout = Layout::default();
                let place = |list: &[(usize, DevTensor)], layout: &mut Layout| -> Vec<HostCopy> {
                    list.iter()
                        .map(|(_, t)| HostCopy::of(t, layout.add(t.nbytes())))
                        .collect()
                };
                let to = place(&sends, &mut layout);
                let back = place(&recvs, &mut layout);
                let blocks = |list: &[(usize, DevTensor)],
                              copies: &[HostCopy]|
                 -> Vec<(usize, usize, usize)> {
                    list.iter()
                        .zip(copies)
                        .map(|((p, t), c)| (*p, c.host, t.numel))
                        .collect()
                };
                let (s_blocks, r_blocks) = (blocks(&sends, &to), blocks(&recvs, &back));
                Self::staged(
                    layout,
                    to,
                    back,
                    Box::new(move |base| {
                        let host = |list: Vec<(usize, usize, usize)>| -> Vec<(usize, RawBuf)> {
                            list.into_iter()
                                .map(|(p, at, n)| (p, host_tensor(base, at, dtype, n).buf))
                                .collect()
                        };
                        let blocks = Blocks {
                            sends: host(s_blocks),
                            recvs: host(r_blocks),
                        };
                        sync_cpu(cpu.exchange(kind, dtype, count, blocks, Run::Sync))
                    }),
                )
            }
        };
        self.submit(kind.name(), None, stream, keep, plan)
    }

    /// Grouped NCCL sends and receives; transfers to this rank itself are device copies.
    fn nccl_transfers(
        &self,
        what: &str,
        sends: Vec<(usize, DevTensor)>,
        recvs: Vec<(usize, DevTensor)>,
    ) -> Result<Plan> {
        let (rank, rt) = (self.inner.rank, self.inner.rt);
        let to_self: Vec<DevTensor> = sends
            .iter()
            .filter(|(p, _)| *p == rank)
            .map(|(_, t)| *t)
            .collect();
        let from_self: Vec<DevTensor> = recvs
            .iter()
            .filter(|(p, _)| *p == rank)
            .map(|(_, t)| *t)
            .collect();
        if to_self.len() != from_self.len()
            || to_self
                .iter()
                .zip(&from_self)
                .any(|(a, b)| a.nbytes() != b.nbytes())
        {
            return Err(Error::invalid(format!(
                "{what}: the block this rank sends to itself does not fit the block it receives from itself"
            )));
        }
        Ok(Self::data_plan(Box::new(move |nccl, comm, _, s| {
            for (src, dst) in to_self.iter().zip(&from_self) {
                // SAFETY: live device tensors of equal size (checked above).
                let r = unsafe {
                    (rt.memcpy_async)(
                        dst.ptr as *mut c_void,
                        src.ptr as *const c_void,
                        src.nbytes(),
                        CudaMemcpyKind::DEVICE_TO_DEVICE,
                        s,
                    )
                };
                rt.check(r, "cudaMemcpyAsync")?;
            }
            for (peer, t) in sends.iter().filter(|(p, _)| *p != rank) {
                // SAFETY: a live device tensor (kept by the Work).
                let r = unsafe {
                    (nccl.send)(
                        t.ptr as *const c_void,
                        t.nbytes(),
                        BYTES,
                        int(*peer),
                        comm,
                        s,
                    )
                };
                nccl_ok(nccl, r, "ncclSend", comm)?;
            }
            for (peer, t) in recvs.iter().filter(|(p, _)| *p != rank) {
                // SAFETY: as above.
                let r = unsafe {
                    (nccl.recv)(t.ptr as *mut c_void, t.nbytes(), BYTES, int(*peer), comm, s)
                };
                nccl_ok(nccl, r, "ncclRecv", comm)?;
            }
            Ok(())
        })))
    }

    /// Whether a point-to-point transfer with `tag` goes through NCCL (else host memory).
    fn p2p_on_nccl(&self, tag: i64) -> bool {
        self.inner.mode == Mode::Nccl && tag == 0
    }

    /// Sends `t` to `dst`. NCCL for tag 0, else through host memory (the receiver routes the
    /// same tag the same way, so they match).
    pub fn send(
        &self,
        t: DevTensor,
        dst: usize,
        tag: i64,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        self.check_rank("send destination rank", dst)?;
        self.batch_isend_irecv(
            vec![P2pOp {
                send: true,
                peer: dst,
                tensor: t,
                tag,
            }],
            stream,
            keep,
        )
        .map(|(w, _)| w)
    }

    /// Receives into `t` from `src` (any rank when `None`: needs a nonzero tag when this group
    /// has NCCL, whose receives always name their peer). The Work's source rank is the sender.
    pub fn recv(
        &self,
        t: DevTensor,
        src: Option<usize>,
        tag: i64,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<CudaWork> {
        match src {
            Some(peer) => {
                self.check_rank("recv source rank", peer)?;
                let op = P2pOp {
                    send: false,
                    peer,
                    tensor: t,
                    tag,
                };
                self.batch_isend_irecv(vec![op], stream, keep)
                    .map(|(w, _)| w)
            }
            None if self.p2p_on_nccl(tag) => Err(Error::Runtime(
                "recv from any source on CUDA tensors needs a nonzero tag (on the sender too): \
                 tag 0 travels through NCCL, which cannot receive from any source"
                    .into(),
            )),
            None => {
                let cpu = self.inner.cpu.clone();
                let mut layout = Layout::default();
                let at = layout.add(t.nbytes());
                let back = vec![HostCopy::of(&t, at)];
                let plan = Self::staged(
                    layout,
                    Vec::new(),
                    back,
                    Box::new(move |base| {
                        finish_cpu(cpu.recv(
                            host_tensor(base, at, t.dtype, t.numel),
                            None,
                            tag,
                            None,
                        ))
                    }),
                );
                self.submit("recv", None, stream, keep, plan)
            }
        }
    }

    /// torch's batch_isend_irecv: tag-0 transfers in one NCCL group, the others through host
    /// memory after it. Returns the Work of the last part (it ends after the others on the
    /// stream) and whether the batch was split in two.
    pub fn batch_isend_irecv(
        &self,
        ops: Vec<P2pOp>,
        stream: usize,
        keep: Option<Keepalive>,
    ) -> Result<(CudaWork, bool)> {
        for op in &ops {
            let what = if op.send {
                "send destination rank"
            } else {
                "recv source rank"
            };
            self.check_rank(what, op.peer)?;
        }
        let (on_nccl, staged): (Vec<P2pOp>, Vec<P2pOp>) =
            ops.into_iter().partition(|op| self.p2p_on_nccl(op.tag));
        let single_recv = |list: &[P2pOp]| match list {
            [op] if !op.send => Some(op.peer),
            _ => None,
        };
        let name = |list: &[P2pOp]| match list {
            [op] if op.send => "send",
            [_] => "recv",
            _ => "batch_isend_irecv",
        };
        let split = !on_nccl.is_empty() && !staged.is_empty();
        let mut keep = keep;
        let mut last = None;
        if !on_nccl.is_empty() {
            let source = single_recv(&on_nccl);
            let what = name(&on_nccl);
            let split_keep = if staged.is_empty() { keep.take() } else { None };
            let (sends, recvs): (Vec<&P2pOp>, Vec<&P2pOp>) = on_nccl.iter().partition(|op| op.send);
            let plan = self.nccl_transfers(
                what,
                sends.iter().map(|op| (op.peer, op.tensor)).collect(),
                recvs.iter().map(|op| (op.peer, op.tensor)).collect(),
            )?;
            last = Some(self.submit(what, source, stream, split_keep, plan)?);
        }
        if !staged.is_empty() {
            let source = single_recv(&staged);
            let what = name(&staged);
            let cpu = self.inner.cpu.clone();
            let mut layout = Layout::default();
            let placed: Vec<(P2pOp, usize)> = staged
                .into_iter()
                .map(|op| (op, layout.add(op.tensor.nbytes())))
                .collect();
            let copies = |send: bool| -> Vec<HostCopy> {
                placed
                    .iter()
                    .filter(|(op, _)| op.send == send)
                    .map(|(op, at)| HostCopy::of(&op.tensor, *at))
                    .collect()
            };
            let (to, back) = (copies(true), copies(false));
            let plan = Self::staged(
                layout,
                to,
                back,
                Box::new(move |base| {
                    // All posted at once (they progress concurrently), then waited for.
                    let works: Vec<Result<Work>> = placed
                        .iter()
                        .map(|(op, at)| {
                            let h = host_tensor(base, *at, op.tensor.dtype, op.tensor.numel);
                            if op.send {
                                cpu.send(h, op.peer, op.tag, None)
                            } else {
                                cpu.recv(h, Some(op.peer), op.tag, None)
                            }
                        })
                        .collect();
                    let mut source = None;
                    for w in works {
                        source = finish_cpu(w)?.or(source);
                    }
                    Ok(source)
                }),
            );
            last = Some(self.submit(what, source, stream, keep.take(), plan)?);
        }
        let work =
            last.ok_or_else(|| Error::invalid("batch_isend_irecv needs at least one operation"))?;
        Ok((work, split))
    }

    /// A barrier on the device: a one-element all_reduce (NCCL), or the CPU engine's barrier
    /// once the stream has reached it (staged). torch's barrier then blocks the host
    /// ([`CudaWork::synchronize`]).
    pub fn barrier(&self, stream: usize) -> Result<CudaWork> {
        let plan = match &self.inner.scratch {
            Some(scratch) => {
                let ptr = scratch.ptr;
                self.nccl_plan(
                    NcclDataType::FLOAT32,
                    OpSpec::Builtin(NcclRedOp::SUM),
                    Box::new(move |nccl, comm, op, s| {
                        let p = ptr as *mut c_void;
                        // SAFETY: the group's own 4-byte device buffer, alive with the group.
                        let res = unsafe {
                            (nccl.all_reduce)(p, p, 1, NcclDataType::FLOAT32, op, comm, s)
                        };
                        nccl_ok(nccl, res, "ncclAllReduce", comm)
                    }),
                )
            }
            None => {
                let cpu = self.inner.cpu.clone();
                Self::staged(
                    Layout::default(),
                    Vec::new(),
                    Vec::new(),
                    Box::new(move |_| sync_cpu(cpu.barrier(Run::Sync))),
                )
            }
        };
        self.submit("barrier", None, stream, None, plan)
    }

    /// Runs `f` while no other thread can use the communicator and nothing is queued.
    fn exclusive<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut q = lock(&self.inner.queue);
        while q.busy {
            q = self
                .inner
                .queue_cond
                .wait(q)
                .unwrap_or_else(|p| p.into_inner());
        }
        f()
    }

    /// A subgroup (torch's `new_group` with a bound device). Collective over *every* rank of
    /// this group when it has NCCL with ncclCommSplit (members pass `Some`, the others `None`);
    /// otherwise only members take part, with a fresh [`CudaGroup::new`] (so non-members may
    /// skip the call). Returns the member's group, `None` for the others.
    pub fn split(&self, member: Option<SplitArgs>) -> Result<Option<CudaGroup>> {
        let parent = self.inner.comm.as_ref().filter(|c| c.can_split());
        let Some(parent) = parent else {
            return member
                .map(|m| {
                    CudaGroup::new(
                        m.cpu,
                        m.store,
                        m.rank,
                        m.size,
                        &m.name,
                        m.timeout,
                        self.inner.device,
                    )
                })
                .transpose();
        };
        self.inner.check()?;
        let color = member.as_ref().map(|_| 0);
        let key = member.as_ref().map_or(0, |m| m.rank);
        let child = {
            let _device = DeviceGuard::set(self.inner.rt, self.inner.device)?;
            self.exclusive(|| parent.split(color, key))?
        };
        match (member, child) {
            (Some(m), Some(comm)) => CudaGroup::start(
                m.cpu,
                self.inner.rt,
                self.inner.device,
                m.rank,
                m.size,
                &m.name,
                m.timeout,
                Some(comm),
            )
            .map(Some),
            (Some(_), None) => Err(Error::backend(
                "ncclCommSplit returned no communicator for a member",
            )),
            (None, _) => Ok(None),
        }
    }

    /// Leaves cleanly: queued operations still run, pending ones finish (bounded by the
    /// timeout: the watchdog fails them), then ncclCommFinalize + ncclCommDestroy and the
    /// staging group's shutdown. Blocks.
    pub fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = &self.inner;
        lock(&inner.queue).closed = true;
        inner.queue_cond.notify_all();
        let mut threads = std::mem::take(&mut *lock(&self.threads));
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

    /// Aborts: the communicator and the staging group are aborted, every pending and later
    /// operation fails with DistBackendError. Does not wait for the group's threads (they end
    /// on their own).
    pub fn abort(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = &self.inner;
        inner.fail(Error::backend(format!(
            "the CUDA process group {:?} was aborted",
            inner.name
        )));
        lock(&inner.queue).closed = true;
        inner.queue_cond.notify_all();
        inner.stopping.store(true, Ordering::Release);
        inner.pending_cond.notify_all();
        inner.cpu.abort();
    }
}

impl Drop for CudaGroup {
    fn drop(&mut self) {
        // Neither shut down nor aborted (e.g. the process is exiting): abort, as torch does.
        self.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_blocks_are_aligned_and_disjoint() {
        let mut layout = Layout::default();
        assert_eq!(layout.add(10), 0);
        assert_eq!(layout.add(3), 64);
        assert_eq!(layout.add(0), 128);
        assert_eq!(layout.add(100), 128);
        assert_eq!(layout.bytes, 228);
    }

    #[test]
    fn slices_offset_by_whole_elements() {
        let t = DevTensor {
            ptr: 0x1000,
            dtype: DType::C128,
            numel: 10,
        };
        let s = t.slice(3, 4);
        assert_eq!((s.ptr, s.numel, s.nbytes()), (0x1000 + 48, 4, 64));
        let copy = HostCopy::of(&s, 64);
        assert_eq!((copy.dev, copy.host, copy.len), (0x1030, 64, 64));
    }

    #[test]
    fn context_keeps_the_error_kind() {
        let e = context(Error::network("peer 1 hung up"), "[Rank 0] CUDA all_reduce");
        assert_eq!(
            e,
            Error::network("[Rank 0] CUDA all_reduce: peer 1 hung up")
        );
    }
}
