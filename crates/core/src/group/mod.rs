//! Process groups: rendezvous through a store, a mesh of links (shared memory on one host, TCP
//! otherwise), and the engine that runs the group's operations in issue order.
//!
//! The engine sits behind a lock. A synchronous call on an idle group (nothing queued, no
//! point-to-point transfer pending) runs on the calling thread (the binding releases the GIL):
//! no thread hand-off before a byte moves. Asynchronous calls, and synchronous ones behind
//! queued work, go to the group's worker thread, which also moves posted point-to-point
//! transfers while nothing is queued. (An asynchronous call never runs inline: it must return
//! at once even when its peers come late.)
//!
//! The pieces, each in its own file, with imports running one way (a module uses only those
//! listed before it): `engine` (the state operations run on), `reduction` (a reduction's op
//! checks and scaling) and `blocks` (the blocks of an exchange, and an all_gather's views)
//! use none of the others; `worker` (the job queue, and the worker thread that serves it)
//! uses `engine`; this file (the [`ProcessGroup`] itself: construction, issuing operations,
//! shutdown and abort) uses `engine`, `worker`, `reduction` and `blocks`; `collectives` (each
//! collective's entry point), `p2p` (point-to-point operations) and `window` (one-sided
//! windows on one host) add methods to [`ProcessGroup`] and use this file, `engine`,
//! `reduction` and `blocks` (`window` also calls the all_gather and barrier of
//! `collectives`), and nothing uses them but this file's re-exports. Every path stays
//! `group::X`: this file re-exports the public surface.

mod blocks;
mod collectives;
mod engine;
mod p2p;
mod reduction;
mod window;
mod worker;

pub use blocks::Blocks;
pub use reduction::Reduction;
pub use window::{Window, META_BYTES};

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::algorithms::{streams_per_peer, AlgoOverrides, LinkModel, Measured};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::recorder::{self, Op, Recorder};
use crate::store::Store;
use crate::timeout::Timeout;
use crate::transport::mesh::MeshTransport;
use crate::transport::{LinkKind, Transport};
use crate::work::{Keepalive, Work};
use engine::Engine;
use worker::{lock, Queue, Shared};

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
    /// The group's flight recorder: every operation issued on it.
    recorder: Arc<Recorder>,
    /// Where this rank answers status queries (its heartbeats' socket), if it does.
    status_addr: Option<SocketAddr>,
}

/// FNV-1a: a stable 32-bit id of the group name, carried in every frame header.
fn group_id(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
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
        let streams = transport.streams();
        let status_addr = transport.status_addr();
        let mut group = Self::assemble(Box::new(transport), name, timeout, algos, streams, cancel)?;
        group.status_addr = status_addr;
        Ok(group)
    }

    /// The group running on `transport` (failed through `cancel`): its engine and worker.
    fn assemble(
        transport: Box<dyn Transport>,
        name: &str,
        timeout: Duration,
        algos: AlgoOverrides,
        streams: usize,
        cancel: Arc<Cancel>,
    ) -> Result<ProcessGroup> {
        let (rank, size, link) = (transport.rank(), transport.size(), transport.link_kind());
        let link_model = algos.tcp;
        let shared = Arc::new(Shared {
            engine: Mutex::new(Engine {
                transport,
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
            recorder: Recorder::new(name, Some(group_id(name)), size),
            status_addr: None,
        })
    }

    /// The group of this group's ranks but `excluded` (torch's `shrink_group`), numbered in
    /// order, over this group's links: every other rank of this group calls it with the same
    /// `excluded`, which must not hold this rank. `abort_pending` (`SHRINK_ABORT`) first
    /// aborts this group's pending operations; without it, pending work is an error, unless
    /// the group has failed already (its pending work is failing anyway). This group refuses
    /// work afterwards, whatever the outcome. Bounded by the group's timeout.
    pub fn shrink(&self, excluded: &[usize], abort_pending: bool) -> Result<ProcessGroup> {
        let (rank, size) = (self.rank, self.size);
        if excluded.windows(2).any(|w| w[0] >= w[1]) || excluded.last().is_some_and(|&r| r >= size)
        {
            return Err(Error::invalid(format!(
                "the ranks to exclude must be distinct ranks of the group (0 to {}), in order: \
                 {excluded:?}",
                size - 1
            )));
        }
        if excluded.len() >= size || excluded.binary_search(&rank).is_ok() {
            return Err(Error::invalid(format!(
                "rank {rank} cannot shrink the group excluding {excluded:?}: only the ranks that \
                 stay call it, and at least one must"
            )));
        }
        let timeout = self.timeout.get();
        let deadline = std::time::Instant::now() + timeout;
        if abort_pending {
            self.shared.cancel.raise(Error::backend(
                "the process group was aborted by shrink_group (SHRINK_ABORT)",
            ));
        }
        let doomed = self.shared.cancel.is_raised();
        let mut engine = loop {
            if let Some(engine) = self.shared.idle_engine() {
                break engine;
            }
            if !doomed {
                return Err(Error::Runtime(
                    "shrink_group: operations are still pending on the group; wait for them, \
                     or pass SHRINK_ABORT to abort them"
                        .into(),
                ));
            }
            if std::time::Instant::now() > deadline {
                return Err(Error::backend(format!(
                    "shrink_group: the group's pending operations did not end within {timeout:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let list: Vec<String> = excluded.iter().map(|r| r.to_string()).collect();
        let name = format!("{}/shrunk-{}", self.name, list.join("-"));
        let cancel = Arc::new(Cancel::default());
        let shrunk = engine
            .transport
            .shrink(excluded, group_id(&name), cancel.clone(), deadline);
        engine.failed.get_or_insert(Error::Runtime(format!(
            "process group {} was shrunk; use the group shrink_group returned",
            self.name
        )));
        let algos = engine.algos;
        drop(engine);
        self.shutdown();
        let mut group = Self::assemble(shrunk?, &name, timeout, algos, self.streams, cancel)?;
        let info = self.recorder.info();
        let ranks = (0..size)
            .filter(|r| excluded.binary_search(r).is_err())
            .map(|r| info.ranks.get(r).copied().unwrap_or(r))
            .collect();
        group.recorder.set_info(&name, &info.desc, ranks);
        // The shrunk group keeps this one's heartbeats.
        group.status_addr = self.status_addr;
        Ok(group)
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

    /// The group's flight recorder (whose name, description and members the front doors set
    /// as torch knows them).
    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.recorder
    }

    /// Where this rank answers status queries (`transport::heartbeat::ask_status`): its
    /// heartbeats' socket; None alone or with heartbeats off.
    pub fn status_addr(&self) -> Option<SocketAddr> {
        self.status_addr
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

    /// Runs `body` (operation `op`, recorded unless None; `what` names it in its Work) as
    /// `mode` says: a synchronous call on an idle group on the calling thread, returning
    /// `None`; else queued, with a Work (waited for here when synchronous). `Ok(Some(rank))` of
    /// `body` becomes the Work's source rank.
    fn start(
        &self,
        mode: Run,
        what: &'static str,
        op: Option<Op>,
        body: impl FnOnce(&mut Engine) -> Result<Option<usize>> + Send + 'static,
    ) -> Result<Option<Work>> {
        self.shared.cancel.check()?;
        self.shared.queue.check_open()?;
        let timeout = self.timeout.get();
        if matches!(mode, Run::Sync) {
            if let Some(mut engine) = self.shared.idle_engine() {
                engine.timeout = timeout;
                let ticket = op.map(|op| self.recorder.record(op, timeout, true));
                let ran = body(&mut engine);
                let waited = engine.transport.take_waited();
                self.recorder.ran(ticket, ran.is_ok(), waited);
                ran?;
                return Ok(None);
            }
        }
        let ticket = op.map(|op| self.recorder.record(op, timeout, false));
        let recorder = self.recorder.clone();
        let body: Body = Box::new(body);
        let (keep, sync) = match mode {
            Run::Async(keep) => (keep, false),
            Run::Sync => (None, true),
        };
        let work = self.enqueue(keep, what, move |engine, done| {
            if let Some(t) = ticket {
                recorder.started(t);
            }
            let ran = body(engine);
            recorder.ran(ticket, ran.is_ok(), engine.transport.take_waited());
            match ran {
                Ok(src) => done.complete(Ok(()), src),
                Err(e) => done.complete(Err(e), None),
            }
        })?;
        if sync {
            if let Err(e) = work.wait(None) {
                // Interrupted: the group is failed, but the worker may write the caller's
                // buffers until its next poll sees that; the caller frees them on return.
                work.wait_completed();
                return Err(e);
            }
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

    /// The error that failed the group (an operation's, an abort, a dead or silent peer):
    /// every later operation fails with it. None while the group works.
    pub fn error(&self) -> Option<Error> {
        self.shared.cancel.check().err()
    }

    /// Waits up to `timeout` for the group to fail; the error that failed it, else None.
    pub fn wait_failed(&self, timeout: Duration) -> Option<Error> {
        self.shared.cancel.wait_raised(timeout)
    }

    /// Deletes from `store` (the one the group was made on) the keys this rank published
    /// while connecting, once every member has connected (a barrier first): a group made and
    /// remade many times (reconfigures) leaves the store as it found it. Collective.
    pub fn forget_rendezvous(&self, store: &dyn Store) -> Result<()> {
        self.barrier(Run::Sync)?;
        for key in crate::transport::mesh::published_keys(&self.name, self.rank, self.size) {
            store.delete_key(&key)?;
        }
        Ok(())
    }

    /// Leaves a group that another has replaced (a reconfigure): its pending and later
    /// operations fail with `reason`, then it shuts down as [`ProcessGroup::shutdown`] does.
    /// Bounded: nothing queued runs any more.
    pub fn retire(&self, reason: &str) {
        self.shared.cancel.raise(Error::Runtime(reason.to_string()));
        self.shutdown();
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
        recorder::retire(&self.recorder);
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
