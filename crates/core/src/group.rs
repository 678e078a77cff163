//! Process groups: rendezvous through a store, a TCP mesh, and one worker thread that runs the
//! group's operations in issue order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::algorithms::{self, AlgoOverrides};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::reduce;
use crate::spin::Spin;
use crate::store::Store;
use crate::tensor::{RawBuf, Tensor};
use crate::transport::mesh::MeshTransport;
use crate::transport::{Op, OpCtx, P2pDone, Signature, Transport};
use crate::types::{CollectiveKind, DType, ReduceOp};
use crate::work::{Keepalive, Work};

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
    cond: Condvar,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, job: Job) -> Result<()> {
        let mut st = self.lock();
        if st.closed {
            return Err(Error::Runtime(
                "the process group has been destroyed; create a new one".into(),
            ));
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
        let job = self.lock().jobs.pop_front();
        if job.is_some() {
            self.queued.fetch_sub(1, Ordering::Release);
        }
        job
    }

    /// The next job; `None` once closed and drained.
    fn pop(&self) -> Option<Job> {
        let mut spin = Spin::new();
        loop {
            if let Some(job) = self.try_pop() {
                return Some(job);
            }
            let st = self.lock();
            if st.closed {
                return None;
            }
            drop(st);
            if spin.again() {
                continue;
            }
            let mut st = self.lock();
            while st.jobs.is_empty() && !st.closed {
                st = self
                    .cond
                    .wait(st)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            drop(st);
            if let Some(job) = self.try_pop() {
                return Some(job);
            }
            return None;
        }
    }

    fn close(&self) {
        self.lock().closed = true;
        self.cond.notify_all();
    }
}

/// State owned by the worker thread.
struct Engine {
    transport: Box<dyn Transport>,
    seq: u64,
    timeout: Duration,
    algos: AlgoOverrides,
    failed: Option<Error>,
    size: usize,
    /// monitored_barrier calls so far (they use tags of their own).
    monitored: u64,
}

/// A point-to-point transfer run to completion inside one job.
enum P2p {
    Send(usize, i64, RawBuf),
    Recv(usize, i64, RawBuf),
}

impl Engine {
    /// Posts `ops` and moves bytes until each has finished or failed (a timeout fails only
    /// that transfer); returns the per-op outcomes, or the error that broke the group.
    fn drive_p2p(&mut self, ops: Vec<P2p>, deadline: Instant) -> Result<Vec<Result<usize>>> {
        let outcomes: Arc<Mutex<Vec<Option<Result<usize>>>>> =
            Arc::new(Mutex::new(vec![None; ops.len()]));
        for (i, op) in ops.into_iter().enumerate() {
            let slot = outcomes.clone();
            let done: P2pDone = Box::new(move |r| {
                if let Ok(mut v) = slot.lock() {
                    v[i] = Some(r);
                }
            });
            match op {
                P2p::Send(p, tag, buf) => self.transport.post_send(p, tag, buf, deadline, done),
                P2p::Recv(p, tag, buf) => {
                    self.transport.post_recv(Some(p), tag, buf, deadline, done)
                }
            }
        }
        let all_done = || {
            outcomes
                .lock()
                .map_or(true, |v| v.iter().all(Option::is_some))
        };
        while !all_done() {
            let outcome = self.transport.pump(&all_done);
            self.record(outcome)?;
        }
        let mut v = outcomes
            .lock()
            .map_err(|_| Error::Runtime("point-to-point bookkeeping poisoned".into()))?;
        Ok(v.drain(..).map(|o| o.unwrap_or(Ok(0))).collect())
    }

    /// Runs one collective under a fresh sequence number; a network or backend failure makes
    /// the group fail every later operation and tells the peers.
    fn collective(
        &mut self,
        sig: Signature,
        reduce: ReduceOp,
        body: impl FnOnce(&mut dyn Transport, &OpCtx, &AlgoOverrides) -> Result<()>,
    ) -> Result<()> {
        self.check()?;
        self.seq += 1;
        let ctx = OpCtx {
            seq: self.seq,
            sig,
            reduce,
            deadline: Instant::now() + self.timeout,
        };
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
        if let Err(e @ (Error::Network(_) | Error::Backend(_))) = &outcome {
            if self.failed.is_none() {
                self.failed = Some(e.clone());
                self.transport.abort(&e.to_string());
            }
        }
        outcome
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }
}

/// A group of ranks. Construction is collective: every rank constructs it with the same store
/// and name. Operations are queued to the group's worker and return a [`Work`].
pub struct ProcessGroup {
    rank: usize,
    size: usize,
    name: String,
    timeout: Duration,
    queue: Arc<Queue>,
    /// Raised by `abort` or an interrupted wait: the operation in progress stops, queued and
    /// later ones fail.
    cancel: Arc<Cancel>,
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

impl ProcessGroup {
    /// Joins the group: rendezvous under `name` in `store`, a TCP connection to every peer.
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
        let algos = AlgoOverrides::from_env()?;
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
        )?;
        let queue = Arc::new(Queue::default());
        let mut engine = Engine {
            transport: Box::new(transport),
            seq: 0,
            timeout,
            algos,
            failed: None,
            size,
            monitored: 0,
        };
        let worker_queue = queue.clone();
        let worker = std::thread::Builder::new()
            .name(format!("rustdist-{rank}"))
            .spawn(move || {
                loop {
                    if let Some(job) = worker_queue.try_pop() {
                        job(&mut engine);
                    } else if engine.transport.has_pending() {
                        // Posted sends and receives move while no job is queued.
                        let outcome = engine.transport.pump(&|| worker_queue.has_jobs());
                        let _ = engine.record(outcome);
                    } else {
                        match worker_queue.pop() {
                            Some(job) => job(&mut engine),
                            None => break,
                        }
                    }
                }
                if engine.failed.is_none() {
                    engine.transport.shutdown();
                }
            })
            .map_err(|e| Error::Runtime(format!("cannot start the group's worker: {e}")))?;
        Ok(ProcessGroup {
            rank,
            size,
            name: name.to_string(),
            timeout,
            queue,
            cancel,
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

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Queues `job` (operation `what`) with a new Work for it to complete; an aborted group
    /// refuses new work, and its queued work fails instead of running.
    fn enqueue(
        &self,
        keep: Option<Keepalive>,
        what: &'static str,
        job: impl FnOnce(&mut Engine, Work) + Send + 'static,
    ) -> Result<Work> {
        self.cancel.check()?;
        let work = Work::owned(keep, &self.cancel, what);
        let done = work.clone();
        let cancel = self.cancel.clone();
        self.queue
            .push(Box::new(move |engine| match cancel.check() {
                Err(e) => done.complete(Err(e), None),
                Ok(()) => job(engine, done),
            }))?;
        Ok(work)
    }

    /// Queues `body` (operation `what`); its `Ok(Some(rank))` becomes the Work's source rank.
    fn submit(
        &self,
        keep: Option<Keepalive>,
        what: &'static str,
        body: impl FnOnce(&mut Engine) -> Result<Option<usize>> + Send + 'static,
    ) -> Result<Work> {
        self.enqueue(keep, what, move |engine, done| match body(engine) {
            Ok(src) => done.complete(Ok(()), src),
            Err(e) => done.complete(Err(e), None),
        })
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
    pub fn all_reduce(&self, t: Tensor, red: Reduction, keep: Option<Keepalive>) -> Result<Work> {
        self.reduction(t, None, red, keep)
    }

    /// Reduces every rank's `t` into `t` on `root`; other ranks' tensors are left unchanged.
    pub fn reduce(
        &self,
        t: Tensor,
        root: usize,
        red: Reduction,
        keep: Option<Keepalive>,
    ) -> Result<Work> {
        self.check_rank("reduce destination rank", root)?;
        self.reduction(t, Some(root), red, keep)
    }

    /// all_reduce (`root` None) or reduce to `root`: non-roots reduce a copy of their tensor.
    fn reduction(
        &self,
        t: Tensor,
        root: Option<usize>,
        red: Reduction,
        keep: Option<Keepalive>,
    ) -> Result<Work> {
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
        self.submit(keep, sig.kind.name(), move |eng| {
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
                algorithms::all_reduce(tr, ctx, buf, algos)?;
                red.after(t.dtype, buf, size)
            })?;
            Ok(None)
        })
    }

    /// One collective step of point-to-point transfers: `sends[i] = (peer, data)` and
    /// `recvs[j] = (peer, buffer)`, all concurrent; a transfer to this rank itself is a copy
    /// (the k-th send to self fills the k-th receive from self). Serves gather, scatter,
    /// all_to_all and gathers of different sizes; `count` is what every rank agrees on (0 when
    /// sizes legitimately differ: the lengths are still checked message by message).
    pub fn exchange(
        &self,
        kind: CollectiveKind,
        dtype: DType,
        count: u64,
        sends: Vec<(usize, RawBuf)>,
        recvs: Vec<(usize, RawBuf)>,
        keep: Option<Keepalive>,
    ) -> Result<Work> {
        for &(p, _) in sends.iter().chain(recvs.iter()) {
            self.check_rank(&format!("{} peer rank", kind.name()), p)?;
        }
        let to_self: Vec<RawBuf> = sends
            .iter()
            .filter(|(p, _)| *p == self.rank)
            .map(|(_, b)| *b)
            .collect();
        let from_self: Vec<RawBuf> = recvs
            .iter()
            .filter(|(p, _)| *p == self.rank)
            .map(|(_, b)| *b)
            .collect();
        if to_self.len() != from_self.len()
            || to_self
                .iter()
                .zip(&from_self)
                .any(|(a, b)| a.len() != b.len())
        {
            return Err(Error::invalid(format!(
                "{}: the block this rank sends to itself does not fit the block it receives from itself",
                kind.name()
            )));
        }
        let sig = Signature {
            kind,
            dtype,
            op: ReduceOp::Sum,
            count,
        };
        let rank = self.rank;
        self.submit(keep, kind.name(), move |eng| {
            eng.collective(sig, ReduceOp::Sum, |tr, ctx, _| {
                for (src, dst) in to_self.iter().zip(&from_self) {
                    // SAFETY: both blocks are alive until the Work completes; ptr::copy allows
                    // them to overlap.
                    unsafe {
                        std::ptr::copy(
                            src.as_slice().as_ptr(),
                            dst.as_mut_slice().as_mut_ptr(),
                            src.len(),
                        )
                    };
                }
                // SAFETY: the caller keeps every block alive and untouched until completion.
                let mut ops: Vec<Op<'_>> = sends
                    .iter()
                    .filter(|(p, _)| *p != rank)
                    .map(|(p, b)| Op::Send {
                        peer: *p,
                        data: unsafe { b.as_slice() },
                    })
                    .chain(recvs.iter().filter(|(p, _)| *p != rank).map(|(p, b)| {
                        // SAFETY: as above.
                        Op::Recv {
                            peer: *p,
                            buf: unsafe { b.as_mut_slice() },
                        }
                    }))
                    .collect();
                tr.exchange(ctx, &mut ops)
            })?;
            Ok(None)
        })
    }

    /// torch's monitored_barrier: rank 0 waits up to `timeout` for every other rank and fails
    /// naming the first rank that did not arrive (every such rank with `wait_all_ranks`); the
    /// others wait for rank 0's verdict. A failure here does not break the group.
    pub fn monitored_barrier(&self, timeout: Duration, wait_all_ranks: bool) -> Result<Work> {
        let (rank, size) = (self.rank, self.size);
        self.submit(None, "monitored_barrier", move |eng| {
            eng.check()?;
            eng.monitored += 1;
            // Tags below every user tag, one pair per call, so late arrivals never match.
            let tag = i64::MIN + 2 * eng.monitored as i64;
            let deadline = Instant::now() + timeout;
            let verdict = if rank == 0 {
                let mut arrived = vec![0u8; size];
                let peers: Vec<usize> = (1..size).collect();
                let outcomes = eng.drive_p2p(
                    peers
                        .iter()
                        .map(|&p| P2p::Recv(p, tag, RawBuf::from_mut_slice(&mut arrived[p..p + 1])))
                        .collect(),
                    deadline,
                )?;
                let missing: Vec<usize> = peers
                    .iter()
                    .zip(&outcomes)
                    .filter(|(_, o)| o.is_err())
                    .map(|(&p, _)| p)
                    .collect();
                let shown: Vec<String> = missing
                    .iter()
                    .take(if wait_all_ranks { missing.len() } else { 1 })
                    .map(|p| p.to_string())
                    .collect();
                let verdict = if missing.is_empty() {
                    Ok(())
                } else {
                    Err(Error::backend(format!(
                        "[Rank 0]: Rank{} {} failed to pass monitoredBarrier in {} ms",
                        if shown.len() > 1 { "s" } else { "" },
                        shown.join(", "),
                        timeout.as_millis()
                    )))
                };
                let mut flag = [u8::from(verdict.is_err())];
                let arrived_peers: Vec<usize> =
                    peers.iter().copied().filter(|p| !missing.contains(p)).collect();
                let sends = arrived_peers
                    .iter()
                    .map(|&p| P2p::Send(p, tag + 1, RawBuf::from_mut_slice(&mut flag)))
                    .collect();
                eng.drive_p2p(sends, eng.deadline())?;
                verdict
            } else {
                let mut token = [1u8];
                let mut flag = [0u8];
                let arrive = vec![P2p::Send(0, tag, RawBuf::from_mut_slice(&mut token))];
                let sent = eng.drive_p2p(arrive, deadline)?;
                // Rank 0 decides only once its own wait is over: allow the group's timeout.
                let verdict = vec![P2p::Recv(0, tag + 1, RawBuf::from_mut_slice(&mut flag))];
                let mut outcomes = eng.drive_p2p(verdict, deadline.max(eng.deadline()))?;
                outcomes.splice(0..0, sent);
                match (&outcomes[1], flag[0]) {
                    (Ok(_), 0) => Ok(()),
                    (Ok(_), _) => Err(Error::backend(format!(
                        "[Rank {rank}]: monitored_barrier failed on rank 0: another rank did not arrive in {} ms",
                        timeout.as_millis()
                    ))),
                    (Err(_), _) => Err(Error::backend(format!(
                        "[Rank {rank}]: rank 0 did not complete monitored_barrier in {} ms",
                        timeout.as_millis()
                    ))),
                }
            };
            verdict.map(|()| None)
        })
    }

    /// Broadcast of `t` from `root` to every rank, in place.
    pub fn broadcast(&self, t: Tensor, root: usize, keep: Option<Keepalive>) -> Result<Work> {
        self.check_rank("broadcast root", root)?;
        let sig = Signature {
            kind: CollectiveKind::Broadcast,
            dtype: t.dtype,
            op: ReduceOp::Sum,
            count: t.numel as u64,
        };
        self.submit(keep, "broadcast", move |eng| {
            eng.collective(sig, ReduceOp::Sum, |tr, ctx, algos| {
                // SAFETY: the caller keeps `t` alive and untouched until the Work completes.
                let buf = unsafe { t.buf.as_mut_slice() };
                algorithms::broadcast(tr, ctx, buf, root, algos)
            })?;
            Ok(None)
        })
    }

    /// Gathers every rank's `input` into `outputs[rank]` on every rank.
    pub fn all_gather(
        &self,
        input: Tensor,
        outputs: Vec<RawBuf>,
        keep: Option<Keepalive>,
    ) -> Result<Work> {
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
        self.submit(keep, "all_gather", move |eng| {
            eng.collective(sig, ReduceOp::Sum, |tr, ctx, algos| {
                let own = outputs[rank];
                // SAFETY: both views are alive until the Work completes; ptr::copy allows the
                // input to be (part of) the output, as all_gather_into_tensor in place does.
                unsafe {
                    std::ptr::copy(
                        input.buf.as_slice().as_ptr(),
                        own.as_mut_slice().as_mut_ptr(),
                        input.nbytes(),
                    )
                };
                // SAFETY: the caller keeps every output alive and untouched until completion.
                let mut blocks: Vec<&mut [u8]> = outputs
                    .iter()
                    .map(|o| unsafe { o.as_mut_slice() })
                    .collect();
                algorithms::all_gather(tr, ctx, &mut blocks, algos)
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
        keep: Option<Keepalive>,
    ) -> Result<Work> {
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
        self.submit(keep, "reduce_scatter", move |eng| {
            let size = eng.size;
            eng.collective(sig, kernel_op(red.op), |tr, ctx, algos| {
                // SAFETY: the caller keeps both tensors alive and untouched until completion.
                let (src, out) = unsafe { (input.buf.as_slice(), output.buf.as_mut_slice()) };
                let mut work = src.to_vec();
                red.before(input.dtype, &mut work)?;
                algorithms::reduce_scatter(tr, ctx, &mut work, out.len(), out, algos)?;
                red.after(output.dtype, out, size)
            })?;
            Ok(None)
        })
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> Result<Work> {
        let sig = Signature {
            kind: CollectiveKind::Barrier,
            dtype: DType::U8,
            op: ReduceOp::Sum,
            count: 0,
        };
        self.submit(None, "barrier", move |eng| {
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
        self.queue.close();
        let worker = self
            .worker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(worker) = worker {
            // A worker that panicked has nothing left to clean up.
            let _ = worker.join();
        }
    }

    /// Fails the operation in progress (at its next poll, within milliseconds) and all queued
    /// work, and tells the peers.
    pub fn abort(&self) {
        self.cancel
            .raise(Error::backend("the process group was aborted"));
        let _ = self.queue.push(Box::new(|engine| {
            let outcome: Result<()> = Err(Error::backend("the process group was aborted"));
            let _ = engine.record(outcome);
        }));
        self.queue.close();
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.queue.close();
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
