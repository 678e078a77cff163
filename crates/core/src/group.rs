//! Process groups: rendezvous through a store, a mesh of links (shared memory on one host, TCP
//! otherwise), and the engine that runs the group's operations in issue order.
//!
//! The engine sits behind a lock. A synchronous call on an idle group (nothing queued, no
//! point-to-point transfer pending) runs on the calling thread (the binding releases the GIL):
//! no thread hand-off before a byte moves. Asynchronous calls, and synchronous ones behind
//! queued work, go to the group's worker thread, which also moves posted point-to-point
//! transfers while nothing is queued. (An asynchronous call never runs inline: it must return
//! at once even when its peers come late.)

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::algorithms::{self, streams_per_peer, AlgoOverrides, LinkModel, Measured};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::reduce;
use crate::spin::Spin;
use crate::store::Store;
use crate::tensor::{any_overlap, RawBuf, Tensor};
use crate::timeout::Timeout;
use crate::transport::mesh::MeshTransport;
use crate::transport::{LinkKind, OpCtx, P2pDone, Signature, Transport};
use crate::types::{CollectiveKind, DType, ReduceOp};
use crate::work::{Keepalive, Work};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
struct Queue {
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

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Self::destroyed());
        }
        Ok(())
    }

    fn push(&self, job: Job) -> Result<()> {
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

    fn close(&self) {
        lock(&self.state).closed = true;
        self.closed.store(true, Ordering::Release);
        self.cond.notify_all();
    }
}

/// The state operations run on: the transport and the group's collective sequence.
struct Engine {
    transport: Box<dyn Transport>,
    seq: u64,
    /// The timeout of the operation running: the group's when it was issued (set by
    /// [`ProcessGroup::start`] and [`ProcessGroup::enqueue`] before each one runs).
    timeout: Duration,
    algos: AlgoOverrides,
    failed: Option<Error>,
    size: usize,
    /// monitored_barrier calls so far (they use tags of their own).
    monitored: u64,
    cancel: Arc<Cancel>,
}

impl Engine {
    /// Runs one collective under a fresh sequence number; a network or backend failure (or
    /// the user interrupting it) makes the group fail every later operation and tells the
    /// peers.
    fn collective(
        &mut self,
        sig: Signature,
        reduce: ReduceOp,
        body: impl FnOnce(&mut dyn Transport, &OpCtx, &AlgoOverrides) -> Result<()>,
    ) -> Result<()> {
        self.check()?;
        self.seq += 1;
        let ctx = OpCtx::new(self.seq, sig, reduce, self.timeout);
        let outcome = body(self.transport.as_mut(), &ctx, &self.algos);
        self.record(outcome)
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn record<T>(&mut self, outcome: Result<T>) -> Result<T> {
        let failure = match &outcome {
            Err(e @ (Error::Network(_) | Error::Backend(_))) => e.clone(),
            Err(Error::Interrupted) => Error::backend(
                "the process group was aborted: an operation was interrupted (KeyboardInterrupt) \
                 midway; destroy the group and create a new one",
            ),
            _ => return outcome,
        };
        if self.failed.is_none() {
            self.cancel.raise(failure.clone());
            self.transport.abort(&failure.to_string());
            self.failed = Some(failure);
        }
        outcome
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }
}

/// What a group's handle, its worker and its Works share.
struct Shared {
    engine: Mutex<Engine>,
    queue: Queue,
    /// Raised by `abort`, an interrupted wait or a failure: the operation in progress stops,
    /// queued and later ones fail.
    cancel: Arc<Cancel>,
}

impl Shared {
    /// The engine, when the group is idle: nothing queued, nothing in progress, no
    /// point-to-point transfer pending. Jobs are taken from the queue only under the engine's
    /// lock, so an empty queue seen under it means no earlier operation is still to run.
    fn idle_engine(&self) -> Option<MutexGuard<'_, Engine>> {
        let engine = self.engine.try_lock().ok()?;
        (!self.queue.has_jobs() && !engine.transport.has_pending()).then_some(engine)
    }

    /// The worker: runs queued jobs, and moves posted transfers while none is queued.
    fn serve(&self) {
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

/// How an operation runs: queued (or, when small, inline) with a Work the caller waits on, or
/// synchronously, returning once done.
pub enum Run {
    /// Returns a Work; the keepalive holds the caller's buffers until it completes.
    Async(Option<Keepalive>),
    /// Returns once the operation is done (the caller keeps its buffers meanwhile).
    Sync,
}

impl Run {
    /// An asynchronous mode without a keepalive (buffers owned by the engine).
    pub fn detached() -> Run {
        Run::Async(None)
    }
}

type Body = Box<dyn FnOnce(&mut Engine) -> Result<Option<usize>> + Send>;

/// A group of ranks. Construction is collective: every rank constructs it with the same store
/// and name.
pub struct ProcessGroup {
    rank: usize,
    size: usize,
    name: String,
    /// Read once per operation, when it is issued (see [`ProcessGroup::set_timeout`]).
    timeout: Timeout,
    link: LinkKind,
    link_model: LinkModel,
    /// TCP streams to each peer on another host.
    streams: usize,
    shared: Arc<Shared>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// FNV-1a: a stable 32-bit id of the group name, carried in every frame header.
fn group_id(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

/// The kernel op that carries `op` on the wire: AVG and PREMUL_SUM travel as SUM.
fn kernel_op(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Avg | ReduceOp::PremulSum => ReduceOp::Sum,
        other => other,
    }
}

/// A reduction as the user asked for it: the op, and PREMUL_SUM's factor.
#[derive(Debug, Clone, Copy)]
pub struct Reduction {
    pub op: ReduceOp,
    pub premul: Option<f64>,
}

impl Reduction {
    pub fn new(op: ReduceOp, premul: Option<f64>) -> Result<Reduction> {
        if op == ReduceOp::PremulSum && premul.is_none() {
            return Err(Error::invalid(
                "ReduceOp.PREMUL_SUM needs a scale factor (use make_premul_sum(factor))",
            ));
        }
        Ok(Reduction { op, premul })
    }

    fn check(&self, dtype: DType) -> Result<()> {
        let scaled = matches!(self.op, ReduceOp::Avg | ReduceOp::PremulSum);
        if scaled && !(dtype.is_float() || dtype.is_complex()) {
            return Err(Error::Runtime(format!(
                "ReduceOp.{} is not supported for {}",
                self.op.name(),
                dtype.name()
            )));
        }
        reduce::check_supported(dtype, kernel_op(self.op))
    }

    /// Scales this rank's contribution before the SUM (PREMUL_SUM).
    fn before(&self, dtype: DType, buf: &mut [u8]) -> Result<()> {
        match self.premul {
            Some(factor) if self.op == ReduceOp::PremulSum => reduce::scale(dtype, buf, factor),
            _ => Ok(()),
        }
    }

    /// Scales the reduced result (AVG divides by the group size).
    fn after(&self, dtype: DType, buf: &mut [u8], size: usize) -> Result<()> {
        if self.op == ReduceOp::Avg {
            reduce::scale(dtype, buf, 1.0 / size as f64)?;
        }
        Ok(())
    }
}

/// Mutable slices of `bufs`.
///
/// # Safety
/// As for [`RawBuf::as_mut_slice`], for every buffer, and no two of them overlap.
unsafe fn mut_slices<'a>(bufs: &[RawBuf]) -> Vec<&'a mut [u8]> {
    // SAFETY: forwarded to the caller.
    bufs.iter().map(|b| unsafe { b.as_mut_slice() }).collect()
}

/// all_gather of `input` into `outputs` by rank, `outputs[rank]` included. An input apart
/// from every output goes to the algorithm, which copies it into the own block when it suits
/// it (shared memory: from cache); one that is (part of) an output, as all_gather_into_tensor
/// in place, is copied into the own block first.
///
/// # Safety
/// Every view is alive and touched by nothing else until the call returns, no slice of any
/// exists, and the outputs are distinct from each other; `outputs[rank]` is as long as `input`.
unsafe fn all_gather_views(
    tr: &mut dyn Transport,
    ctx: &OpCtx,
    input: RawBuf,
    outputs: &[RawBuf],
    rank: usize,
    algos: &AlgoOverrides,
) -> Result<()> {
    let apart = !any_overlap(&[input], outputs);
    if !apart {
        // SAFETY: guaranteed by the caller; ptr::copy allows the views to overlap.
        unsafe { std::ptr::copy(input.as_mut_ptr(), outputs[rank].as_mut_ptr(), input.len()) };
    }
    // SAFETY: guaranteed by the caller.
    let mut blocks = unsafe { mut_slices(outputs) };
    // SAFETY: guaranteed by the caller, and the input shares no byte with the outputs.
    let src = apart.then(|| unsafe { input.as_slice() });
    algorithms::all_gather_from(tr, ctx, src, &mut blocks, algos)
}

/// The blocks of a gather, scatter, all_to_all or all_gather of blocks of different sizes,
/// by peer: `sends[q]` goes to rank q, `recvs[q]` comes from rank q.
pub struct Blocks {
    pub sends: Vec<(usize, RawBuf)>,
    pub recvs: Vec<(usize, RawBuf)>,
}

impl ProcessGroup {
    /// Joins the group: rendezvous under `name` in `store`, a link to every peer.
    pub fn new(
        store: Arc<dyn Store>,
        rank: usize,
        size: usize,
        name: &str,
        timeout: Duration,
    ) -> Result<ProcessGroup> {
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "rank {rank} is out of range for a group of size {size}"
            )));
        }
        // Read (and checked) before connecting; what connecting measured joins the model after.
        let mut algos = AlgoOverrides::from_env(Measured::default())?;
        // RUSTDIST_SHM=0 keeps peers on one host on TCP (every rank must agree).
        let shared_memory = std::env::var("RUSTDIST_SHM").map_or(true, |v| v != "0");
        let cancel = Arc::new(Cancel::default());
        let transport = MeshTransport::connect(
            store,
            name,
            rank,
            size,
            group_id(name),
            timeout,
            shared_memory,
            cancel.clone(),
            &|latency, bandwidth, window| streams_per_peer(Measured { latency, bandwidth }, window),
        )?;
        algos.tcp = LinkModel::from_env(Measured {
            latency: transport.latency(),
            bandwidth: transport.bandwidth(),
        })?;
        let (link, link_model, streams) = (transport.link_kind(), algos.tcp, transport.streams());
        let shared = Arc::new(Shared {
            engine: Mutex::new(Engine {
                transport: Box::new(transport),
                seq: 0,
                timeout,
                algos,
                failed: None,
                size,
                monitored: 0,
                cancel: cancel.clone(),
            }),
            queue: Queue::default(),
            cancel,
        });
        let serving = shared.clone();
        let worker = std::thread::Builder::new()
            .name(format!("rustdist-{rank}"))
            .spawn(move || serving.serve())
            .map_err(|e| Error::Runtime(format!("cannot start the group's worker: {e}")))?;
        Ok(ProcessGroup {
            rank,
            size,
            name: name.to_string(),
            timeout: Timeout::new(timeout),
            link,
            link_model,
            streams,
            shared,
            worker: Mutex::new(Some(worker)),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The timeout operations issued now get.
    pub fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    /// Changes the group's timeout (torch's `_set_default_timeout`, `_set_pg_timeout`) for the
    /// operations issued after this call on this rank, point-to-point ones and
    /// monitored_barrier's grace included. An operation issued before keeps the timeout it
    /// was issued with, whether it is still queued or already running (its deadline is fixed).
    /// Every rank should set the same value, as torch asks.
    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }

    /// How the group's ranks reach each other (what selection chooses algorithms for).
    pub fn link(&self) -> LinkKind {
        self.link
    }

    /// The TCP link model selection uses: settings, else what connecting measured.
    pub fn link_model(&self) -> LinkModel {
        self.link_model
    }

    /// TCP streams joining this rank to each peer on another host (1 when none is):
    /// `RUSTDIST_STREAMS_PER_PEER`, else what the link model needs.
    pub fn streams_per_peer(&self) -> usize {
        self.streams
    }

    /// Queues `job` (operation `what`) with a new Work for it to complete; an aborted group
    /// refuses new work, and its queued work fails instead of running. The job runs under the
    /// group's timeout as it is now.
    fn enqueue(
        &self,
        keep: Option<Keepalive>,
        what: &'static str,
        job: impl FnOnce(&mut Engine, Work) + Send + 'static,
    ) -> Result<Work> {
        self.shared.cancel.check()?;
        let work = Work::owned(keep, &self.shared.cancel, what);
        let done = work.clone();
        let cancel = self.shared.cancel.clone();
        let timeout = self.timeout.get();
        self.shared
            .queue
            .push(Box::new(move |engine| match cancel.check() {
                Err(e) => done.complete(Err(e), None),
                Ok(()) => {
                    engine.timeout = timeout;
                    job(engine, done)
                }
            }))?;
        Ok(work)
    }

    /// Runs `body` (operation `what`) as `mode` says: a synchronous call on an idle group on
    /// the calling thread, returning `None`; else queued, with a Work (waited for here when
    /// synchronous). `Ok(Some(rank))` of `body` becomes the Work's source rank.
    fn start(
        &self,
        mode: Run,
        what: &'static str,
        body: impl FnOnce(&mut Engine) -> Result<Option<usize>> + Send + 'static,
    ) -> Result<Option<Work>> {
        self.shared.cancel.check()?;
        self.shared.queue.check_open()?;
        if matches!(mode, Run::Sync) {
            if let Some(mut engine) = self.shared.idle_engine() {
                engine.timeout = self.timeout.get();
                return body(&mut engine).map(|_| None);
            }
        }
        let body: Body = Box::new(body);
        let (keep, sync) = match mode {
            Run::Async(keep) => (keep, false),
            Run::Sync => (None, true),
        };
        let work = self.enqueue(keep, what, move |engine, done| match body(engine) {
            Ok(src) => done.complete(Ok(()), src),
            Err(e) => done.complete(Err(e), None),
        })?;
        if sync {
            work.wait(None)?;
            return Ok(None);
        }
        Ok(Some(work))
    }

    fn check_rank(&self, what: &str, r: usize) -> Result<()> {
        if r >= self.size {
            return Err(Error::invalid(format!(
                "{what} {r} is out of range for a group of size {}",
                self.size
            )));
        }
        Ok(())
    }

    /// In-place all_reduce of `t` with `red`.
    pub fn all_reduce(&self, t: Tensor, red: Reduction, mode: Run) -> Result<Option<Work>> {
        self.reduction(t, None, red, mode)
    }

    /// Reduces every rank's `t` into `t` on `root`; other ranks' tensors are left unchanged.
    pub fn reduce(
        &self,
        t: Tensor,
        root: usize,
        red: Reduction,
        mode: Run,
    ) -> Result<Option<Work>> {
        self.check_rank("reduce destination rank", root)?;
        self.reduction(t, Some(root), red, mode)
    }

    /// all_reduce (`root` None) or reduce to `root`: non-roots reduce a copy of their tensor.
    fn reduction(
        &self,
        t: Tensor,
        root: Option<usize>,
        red: Reduction,
        mode: Run,
    ) -> Result<Option<Work>> {
        red.check(t.dtype)?;
        let sig = Signature {
            kind: match root {
                None => CollectiveKind::AllReduce,
                Some(_) => CollectiveKind::Reduce,
            },
            dtype: t.dtype,
            op: red.op,
            count: t.numel as u64,
        };
        let in_place = root.is_none_or(|r| r == self.rank);
        self.start(mode, sig.kind.name(), move |eng| {
            let size = eng.size;
            eng.collective(sig, kernel_op(red.op), |tr, ctx, algos| {
                // SAFETY: the caller keeps `t` alive and untouched until the Work completes.
                let own = unsafe { t.buf.as_mut_slice() };
                let mut scratch;
                let buf = if in_place {
                    own
                } else {
                    scratch = own.to_vec();
                    &mut scratch[..]
                };
                red.before(t.dtype, buf)?;
                match root {
                    None => algorithms::all_reduce(tr, ctx, buf, algos)?,
                    Some(root) => algorithms::reduce(tr, ctx, buf, root, algos)?,
                }
                red.after(t.dtype, buf, size)
            })?;
            Ok(None)
        })
    }

    /// gather, scatter, all_to_all, or all_gather of blocks of different sizes (`kind`),
    /// given as the blocks this rank sends and receives by peer (see [`Blocks`]): a gather
    /// sends one block to the root, which receives one from every rank; a scatter the other
    /// way; an all_gather sends the same block to every rank. `count` is what every rank
    /// agrees on (0 when sizes legitimately differ: each block's length is still checked).
    pub fn exchange(
        &self,
        kind: CollectiveKind,
        dtype: DType,
        count: u64,
        blocks: Blocks,
        mode: Run,
    ) -> Result<Option<Work>> {
        for &(p, _) in blocks.sends.iter().chain(blocks.recvs.iter()) {
            if p >= self.size {
                self.check_rank(&format!("{} peer rank", kind.name()), p)?;
            }
        }
        fn own(list: &[(usize, RawBuf)], rank: usize) -> impl Iterator<Item = usize> + '_ {
            list.iter()
                .filter(move |(p, _)| *p == rank)
                .map(|(_, b)| b.len())
        }
        if matches!(kind, CollectiveKind::AllToAll | CollectiveKind::AllGather)
            && !own(&blocks.sends, self.rank).eq(own(&blocks.recvs, self.rank))
        {
            return Err(Error::invalid(format!(
                "{}: the block this rank sends to itself does not fit the block it receives from itself",
                kind.name()
            )));
        }
        let (rank, size) = (self.rank, self.size);
        let root = match kind {
            CollectiveKind::Gather => blocks.sends.first().map(|&(p, _)| p),
            CollectiveKind::Scatter => blocks.recvs.first().map(|&(p, _)| p),
            CollectiveKind::AllToAll | CollectiveKind::AllGather => Some(rank),
            other => {
                return Err(Error::invalid(format!(
                    "{} is not an exchange of blocks",
                    other.name()
                )))
            }
        }
        .ok_or_else(|| Error::invalid(format!("{}: no block to move", kind.name())))?;
        let by_peer = |list: &[(usize, RawBuf)], what: &str| -> Result<Vec<RawBuf>> {
            // Usually listed in rank order already (always so from all_to_all_single).
            if list.len() == size && list.iter().enumerate().all(|(q, &(p, _))| p == q) {
                return Ok(list.iter().map(|&(_, b)| b).collect());
            }
            let mut out: Vec<Option<RawBuf>> = vec![None; size];
            for &(p, b) in list {
                if out[p].replace(b).is_some() {
                    return Err(Error::invalid(format!(
                        "{}: two {what} blocks for rank {p}",
                        kind.name()
                    )));
                }
            }
            out.into_iter()
                .enumerate()
                .map(|(p, b)| {
                    b.ok_or_else(|| {
                        Error::invalid(format!("{}: no {what} block for rank {p}", kind.name()))
                    })
                })
                .collect()
        };
        let (sends, recvs) = match kind {
            CollectiveKind::Gather if rank == root => {
                (vec![blocks.sends[0].1], by_peer(&blocks.recvs, "receive")?)
            }
            CollectiveKind::Scatter if rank == root => {
                (by_peer(&blocks.sends, "send")?, vec![blocks.recvs[0].1])
            }
            CollectiveKind::Gather | CollectiveKind::Scatter => (
                blocks.sends.iter().map(|&(_, b)| b).collect(),
                blocks.recvs.iter().map(|&(_, b)| b).collect(),
            ),
            _ => (
                by_peer(&blocks.sends, "send")?,
                by_peer(&blocks.recvs, "receive")?,
            ),
        };
        // Inputs that share memory with outputs (all_to_all_single(t, t), a gather into the
        // root's own input) are read from a copy, else the exchange overwrites blocks before
        // sending them. An all_gather's input may be its own output block (see all_gather_views).
        let stage_sends = kind != CollectiveKind::AllGather && any_overlap(&sends, &recvs);
        let sig = Signature {
            kind,
            dtype,
            op: ReduceOp::Sum,
            count,
        };
        self.start(mode, kind.name(), move |eng| {
            eng.collective(sig, ReduceOp::Sum, |tr, ctx, algos| {
                if kind == CollectiveKind::AllGather {
                    // SAFETY: the caller keeps every block alive and untouched until
                    // completion; no slice exists yet; output blocks are distinct and the own
                    // one is as long as the input (checked above).
                    return unsafe { all_gather_views(tr, ctx, sends[rank], &recvs, rank, algos) };
                }
                // SAFETY: as above; no output slice exists yet.
                let staged: Option<Vec<Vec<u8>>> = stage_sends.then(|| {
                    sends
                        .iter()
                        .map(|b| unsafe { b.as_slice() }.to_vec())
                        .collect()
                });
                let ins: Vec<&[u8]> = match &staged {
                    Some(copies) => copies.iter().map(Vec::as_slice).collect(),
                    // SAFETY: as above; the inputs share no byte with the outputs (checked
                    // above).
                    None => sends.iter().map(|b| unsafe { b.as_slice() }).collect(),
                };
                // SAFETY: as above; output blocks are distinct from each other.
                let mut outs = unsafe { mut_slices(&recvs) };
                match kind {
                    CollectiveKind::Gather => {
                        let input = ins.first().copied().unwrap_or(&[]);
                        algorithms::gather(tr, ctx, input, &mut outs, root, algos)
                    }
                    CollectiveKind::Scatter => {
                        let mut empty: [u8; 0] = [];
                        let output = outs.first_mut().map_or(&mut empty[..], |o| &mut **o);
                        algorithms::scatter(tr, ctx, &ins, output, root, algos)
                    }
                    _ => algorithms::all_to_all(tr, ctx, &ins, &mut outs, algos),
                }
            })?;
            Ok(None)
        })
    }

    /// torch's monitored_barrier (see `algorithms/monitored_barrier`): a late rank fails this
    /// call only; the group stays usable.
    pub fn monitored_barrier(&self, timeout: Duration, wait_all_ranks: bool) -> Result<Work> {
        let work = self.start(Run::detached(), "monitored_barrier", move |eng| {
            eng.check()?;
            eng.monitored += 1;
            // Tags below every user tag, one pair per call, so late arrivals never match.
            let tag = i64::MIN + 2 * eng.monitored as i64;
            let grace = eng.timeout;
            let verdict = algorithms::monitored_barrier::linear::monitored_barrier(
                eng.transport.as_mut(),
                tag,
                timeout,
                wait_all_ranks,
                grace,
            );
            match verdict {
                // A transport failure breaks the group; a late rank fails only this call.
                Err(e @ (Error::Network(_) | Error::Interrupted)) => eng.record(Err(e)),
                other => other,
            }
            .map(|()| None)
        })?;
        work.ok_or_else(|| Error::Runtime("monitored_barrier returned no Work".into()))
    }

    /// Broadcast of `t` from `root` to every rank, in place.
    pub fn broadcast(&self, t: Tensor, root: usize, mode: Run) -> Result<Option<Work>> {
        self.check_rank("broadcast root", root)?;
        let sig = Signature {
            kind: CollectiveKind::Broadcast,
            dtype: t.dtype,
            op: ReduceOp::Sum,
            count: t.numel as u64,
        };
        self.start(mode, "broadcast", move |eng| {
            eng.collective(sig, ReduceOp::Sum, |tr, ctx, algos| {
                // SAFETY: the caller keeps `t` alive and untouched until the Work completes.
                let buf = unsafe { t.buf.as_mut_slice() };
                algorithms::broadcast(tr, ctx, buf, root, algos)
            })?;
            Ok(None)
        })
    }

    /// Gathers every rank's `input` into `outputs[rank]` on every rank (blocks of one size).
    pub fn all_gather(
        &self,
        input: Tensor,
        outputs: Vec<RawBuf>,
        mode: Run,
    ) -> Result<Option<Work>> {
        if outputs.len() != self.size {
            return Err(Error::invalid(format!(
                "all_gather needs {} output tensors (one per rank), got {}",
                self.size,
                outputs.len()
            )));
        }
        if let Some((r, o)) = outputs
            .iter()
            .enumerate()
            .find(|(_, o)| o.len() != input.nbytes())
        {
            return Err(Error::invalid(format!(
                "all_gather output {r} has {} bytes but the input has {} ({} elements of {})",
                o.len(),
                input.nbytes(),
                input.numel,
                input.dtype.name()
            )));
        }
        let sig = Signature {
            kind: CollectiveKind::AllGather,
            dtype: input.dtype,
            op: ReduceOp::Sum,
            count: input.numel as u64,
        };
        let rank = self.rank;
        self.start(mode, "all_gather", move |eng| {
            eng.collective(sig, ReduceOp::Sum, |tr, ctx, algos| {
                // SAFETY: the caller keeps the input and every output alive and untouched
                // until completion; no slice exists yet; output blocks are distinct from each
                // other and as long as the input (checked above).
                unsafe { all_gather_views(tr, ctx, input.buf, &outputs, rank, algos) }
            })?;
            Ok(None)
        })
    }

    /// Reduces `input` (size blocks of `output.numel` elements) and leaves block `rank` of the
    /// result in `output`. The input is not modified.
    pub fn reduce_scatter(
        &self,
        input: Tensor,
        output: Tensor,
        red: Reduction,
        mode: Run,
    ) -> Result<Option<Work>> {
        red.check(input.dtype)?;
        if input.dtype != output.dtype {
            return Err(Error::invalid(format!(
                "reduce_scatter input is {} but output is {}",
                input.dtype.name(),
                output.dtype.name()
            )));
        }
        if input.numel != output.numel * self.size {
            return Err(Error::invalid(format!(
                "reduce_scatter input must have world_size ({}) times the output's {} elements, got {}",
                self.size, output.numel, input.numel
            )));
        }
        let sig = Signature {
            kind: CollectiveKind::ReduceScatter,
            dtype: input.dtype,
            op: red.op,
            count: output.numel as u64,
        };
        // An output inside the input (reduce_scatter in place) would be written before all of
        // the input is read: the input is read from a copy then, as when it is scaled first.
        let scaled = red.premul.is_some() && red.op == ReduceOp::PremulSum;
        let copy_input = scaled || input.buf.overlaps(&output.buf);
        self.start(mode, "reduce_scatter", move |eng| {
            let size = eng.size;
            eng.collective(sig, kernel_op(red.op), |tr, ctx, algos| {
                let mut staged;
                let src = if copy_input {
                    // SAFETY: the caller keeps both tensors alive and untouched until
                    // completion; no slice of the output exists yet.
                    staged = unsafe { input.buf.as_slice() }.to_vec();
                    if scaled {
                        red.before(input.dtype, &mut staged)?;
                    }
                    &staged[..]
                } else {
                    // SAFETY: as above, and the input shares no byte with the output.
                    unsafe { input.buf.as_slice() }
                };
                // SAFETY: as above; `src` is a copy whenever the two share a byte.
                let out = unsafe { output.buf.as_mut_slice() };
                algorithms::reduce_scatter(tr, ctx, src, out, algos)?;
                red.after(output.dtype, out, size)
            })?;
            Ok(None)
        })
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self, mode: Run) -> Result<Option<Work>> {
        let sig = Signature {
            kind: CollectiveKind::Barrier,
            dtype: DType::U8,
            op: ReduceOp::Sum,
            count: 0,
        };
        self.start(mode, "barrier", move |eng| {
            eng.collective(sig, ReduceOp::Sum, |tr, ctx, algos| {
                algorithms::barrier(tr, ctx, algos)
            })?;
            Ok(None)
        })
    }

    /// Queues a point-to-point operation: `post` hands it to the transport, whose completion
    /// (possibly during a later operation) completes the Work with the peer's rank.
    fn submit_p2p(
        &self,
        keep: Option<Keepalive>,
        what: &'static str,
        post: impl FnOnce(&mut Engine, Instant, P2pDone) + Send + 'static,
    ) -> Result<Work> {
        self.enqueue(keep, what, move |engine, done| {
            if let Err(e) = engine.check() {
                done.complete(Err(e), None);
                return;
            }
            let deadline = engine.deadline();
            post(
                engine,
                deadline,
                Box::new(move |outcome| match outcome {
                    Ok(peer) => done.complete(Ok(()), Some(peer)),
                    Err(e) => done.complete(Err(e), None),
                }),
            );
        })
    }

    /// Sends `t` to `dst` with `tag`; the Work completes once the bytes are handed over.
    pub fn send(&self, t: Tensor, dst: usize, tag: i64, keep: Option<Keepalive>) -> Result<Work> {
        self.check_rank("send destination rank", dst)?;
        self.submit_p2p(keep, "send", move |eng, deadline, done| {
            eng.transport.post_send(dst, tag, t.buf, deadline, done)
        })
    }

    /// Receives into `t` from `src` (any rank when `None`) with `tag`; the Work's source rank is
    /// the sender.
    pub fn recv(
        &self,
        t: Tensor,
        src: Option<usize>,
        tag: i64,
        keep: Option<Keepalive>,
    ) -> Result<Work> {
        if let Some(s) = src {
            self.check_rank("recv source rank", s)?;
        }
        self.submit_p2p(keep, "recv", move |eng, deadline, done| {
            eng.transport.post_recv(src, tag, t.buf, deadline, done)
        })
    }

    /// Leaves the group cleanly: queued work still runs, then peers are told and sockets
    /// close; returns once the worker has finished (each queued operation is bounded by the
    /// group's timeout).
    pub fn shutdown(&self) {
        self.shared.queue.close();
        let worker = lock(&self.worker).take();
        if let Some(worker) = worker {
            // A worker that panicked has nothing left to clean up.
            let _ = worker.join();
        }
    }

    /// Fails the operation in progress (at its next poll, within milliseconds) and all queued
    /// work, and tells the peers.
    pub fn abort(&self) {
        self.shared
            .cancel
            .raise(Error::backend("the process group was aborted"));
        let _ = self.shared.queue.push(Box::new(|engine| {
            let outcome: Result<()> = Err(Error::backend("the process group was aborted"));
            let _ = engine.record(outcome);
        }));
        self.shared.queue.close();
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.shared.queue.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ids_differ_and_are_stable() {
        assert_eq!(group_id("default_pg"), group_id("default_pg"));
        assert_ne!(group_id("a"), group_id("b"));
    }
}
