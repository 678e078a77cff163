//! Transports: how bytes move between the ranks of a group.
//!
//! Algorithms are written against [`Transport`] (messages between ranks, over TCP or
//! shared-memory pipes, or the in-memory transport of the tests) and, where the ranks share a
//! host, [`SharedMemory`] (the group's workspace: ranks read each other's data in place). The
//! transport only moves bytes; which algorithm runs is chosen in `algorithms/select/`.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::tensor::RawBuf;
use crate::types::ReduceOp;
use crate::wake::Wake;
use workspace::{Arrival, Workspace, DEPTH, SLOT_BYTES};

pub mod cma;
pub mod frame;
pub mod heartbeat;
pub mod local;
pub mod members;
pub mod mesh;
pub mod shm;
pub mod shm_object;
mod signature;
pub mod tcp;
pub mod window;
pub mod workspace;

pub use signature::Signature;

pub use crate::timeout::remaining;

/// Completion of a point-to-point operation: the peer's rank, or the error.
pub type P2pDone = Box<dyn FnOnce(Result<usize>) + Send>;

fn no_point_to_point(done: P2pDone) {
    done(Err(Error::Runtime(
        "this transport has no point-to-point operations".into(),
    )))
}

fn no_windows() -> Error {
    Error::Runtime("this transport carries no one-sided windows".into())
}

/// A one-sided operation carried on a link to a window's owner (SEPARATE access).
pub enum WindowFrame {
    /// `data` into the owner's window at byte `offset`. `eager` (a small synchronous put):
    /// the transport copies the data and completes the put at once; the copy is queued, not
    /// waited for, and leaves with whatever follows it to the same rank (its signal) in one
    /// write.
    Put {
        offset: u64,
        data: RawBuf,
        eager: bool,
    },
    /// One more signal from this rank, after its earlier puts.
    Signal,
}

/// One collective in progress: its sequence number in the group, its signature, the kernel op
/// used by [`Op::RecvReduce`], and when it must have finished.
#[derive(Debug, Clone)]
pub struct OpCtx {
    pub seq: u64,
    pub sig: Signature,
    /// The elementwise op applied by `RecvReduce` (SUM for AVG and PREMUL_SUM).
    pub reduce: ReduceOp,
    timeout: Duration,
    /// Fixed on first need: a small collective that completes without waiting never reads
    /// the clock (a noticeable share of its cost).
    deadline: OnceLock<Instant>,
}

impl OpCtx {
    /// Collective `seq` with signature `sig`, which must finish within `timeout` of its
    /// first wait.
    pub fn new(seq: u64, sig: Signature, reduce: ReduceOp, timeout: Duration) -> Self {
        OpCtx {
            seq,
            sig,
            reduce,
            timeout,
            deadline: OnceLock::new(),
        }
    }

    /// When the collective must have finished.
    pub fn deadline(&self) -> Instant {
        *self.deadline.get_or_init(|| Instant::now() + self.timeout)
    }
}

/// One transfer of an [`Transport::exchange`] step.
///
/// Messages between a pair of ranks are matched in order within a collective: the k-th `Send`
/// from a to b in collective `seq` is the k-th `Recv`/`RecvReduce` posted by b for a.
/// Lengths must match exactly; a zero-length message is still a message.
pub enum Op<'a> {
    /// Send `data` to `peer`.
    Send { peer: usize, data: &'a [u8] },
    /// Receive exactly `buf.len()` bytes from `peer` into `buf`.
    Recv { peer: usize, buf: &'a mut [u8] },
    /// Receive `buf.len()` bytes from `peer` and reduce them into `buf` elementwise with
    /// `ctx.reduce` over `ctx.sig.dtype` (`buf[i] = buf[i] op incoming[i]`).
    RecvReduce { peer: usize, buf: &'a mut [u8] },
}

/// How the ranks of a group are connected, as algorithm selection sees it (the same on every
/// rank of the group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    /// Every rank on one host: the shared-memory workspace.
    SharedMemory,
    /// No two ranks share memory (separate hosts, or `RUSTDIST_SHM=0`): TCP.
    Tcp,
    /// Some hosts hold several ranks: shared memory inside each, TCP between hosts.
    Hierarchical,
}

impl LinkKind {
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::SharedMemory => "shm",
            LinkKind::Tcp => "tcp",
            LinkKind::Hierarchical => "hierarchical",
        }
    }

    /// The kind of a group whose ranks sit on hosts `host_of` (host index per rank).
    pub fn of(host_of: &[usize]) -> LinkKind {
        let hosts = host_of.iter().max().map_or(0, |&h| h + 1);
        if hosts <= 1 && host_of.len() > 1 {
            LinkKind::SharedMemory
        } else if hosts == host_of.len() {
            LinkKind::Tcp
        } else {
            LinkKind::Hierarchical
        }
    }
}

/// The local ranks a [`SharedMemory::wait`] waits for.
#[derive(Debug, Clone, Copy)]
pub enum Peers<'a> {
    /// Every local rank.
    All,
    /// These local ranks.
    Only(&'a [usize]),
}

/// The shared-memory workspace of the ranks of a group on this host (see `workspace.rs` for
/// the protocol). Ranks are local indices (`0..local_size()`, in group-rank order). Every
/// local rank publishes the same sequence of steps; a step's data is read only between
/// waiting for it and publishing the next step, which the borrows below enforce.
pub trait SharedMemory {
    fn local_rank(&self) -> usize;
    fn local_size(&self) -> usize;
    /// The group rank of local rank `local`.
    fn group_rank(&self, local: usize) -> usize;
    /// This rank's data slot for the next step, once every local rank is done with the
    /// step two back (waits for that, within `ctx`'s deadline).
    fn prepare(&mut self, ctx: &OpCtx) -> Result<&mut [u8]>;
    /// [`SharedMemory::prepare`] for `len` bytes (at most a slot's) published whole: where
    /// in the slot they go (see `workspace::ROTATED_MAX_BYTES`).
    fn prepare_data(&mut self, ctx: &OpCtx, len: usize) -> Result<&mut [u8]>;
    /// Waits until the next step may be published without slot data (every local rank is
    /// done with its flag entry, `workspace::DEPTH` steps back), within `ctx`'s deadline.
    fn prepare_flag(&mut self, ctx: &OpCtx) -> Result<()>;
    /// Publishes the next step, with `inline` (at most `workspace::INLINE_BYTES`) in the
    /// flag entry.
    fn publish(&mut self, inline: &[u8]);
    /// Waits until `peers` have published the current step.
    fn wait(&mut self, ctx: &OpCtx, peers: Peers<'_>) -> Result<()>;
    /// The inline payload of local rank `local` for the current step (`len` bytes).
    fn inline(&self, local: usize, len: usize) -> &[u8];
    /// Local rank `local`'s data slot of the current step.
    fn slot(&self, local: usize) -> &[u8];
    /// Local rank `local`'s `len` bytes of the current step, published whole with
    /// [`SharedMemory::prepare_data`].
    fn data(&self, local: usize, len: usize) -> &[u8];
    /// Whether [`SharedMemory::read_from`] is available: the local ranks may read each
    /// other's memory.
    fn single_copy(&self) -> bool;
    /// Whether the local ranks are more than the CPUs they may run on.
    fn oversubscribed(&self) -> bool;
    /// Copies `dst.len()` bytes at address `addr` of local rank `local`'s process into `dst`
    /// (one copy, no slot). `ctx` names the collective in the error.
    fn read_from(&self, ctx: &OpCtx, local: usize, addr: usize, dst: &mut [u8]) -> Result<()>;
    /// Copies `src` to address `addr` of local rank `local`'s process (one copy, no slot),
    /// between [`SharedMemory::begin_writes`] and [`SharedMemory::end_writes`]; writes
    /// nothing once `local` has withdrawn its buffer ([`SharedMemory::withdraw`]).
    fn write_to(&self, ctx: &OpCtx, local: usize, addr: usize, src: &[u8]) -> Result<()>;
    /// Starts writing into local peers' buffers in `ctx`'s collective.
    fn begin_writes(&self, ctx: &OpCtx);
    /// Done writing into local peers' buffers in `ctx`'s collective; follows
    /// [`SharedMemory::begin_writes`] on every path, failures included.
    fn end_writes(&self, ctx: &OpCtx);
    /// After this rank failed in `ctx`'s collective: withdraws the buffer it published for
    /// local rank `writer` to write into, and returns once `writer` no longer does (it had not
    /// begun and now will not, it is done, or its process has gone), or after
    /// [`WITHDRAW_GRACE`] (a stopped process), so that the caller may free the buffer.
    fn withdraw(&self, ctx: &OpCtx, writer: usize);
}

/// The longest [`SharedMemory::withdraw`] waits for a writer that neither finishes nor exits
/// (one stopped, by a debugger or SIGSTOP); its writes take milliseconds otherwise.
pub const WITHDRAW_GRACE: Duration = Duration::from_secs(10);

/// What a transport with a workspace provides; [`SharedMemory`] is built on it once for all.
pub(crate) trait WorkspaceHost {
    fn workspace(&self) -> Option<&Workspace>;
    fn workspace_mut(&mut self) -> Option<&mut Workspace>;
    /// Waits until `ready` holds (announcing `ctx` first), watching `peers` for failures,
    /// within `ctx`'s deadline.
    fn await_workspace(
        &mut self,
        ctx: &OpCtx,
        peers: Peers<'_>,
        ready: &mut dyn FnMut(&mut Workspace) -> bool,
    ) -> Result<()>;
    /// The error naming local rank `local`, which is in another collective than `ctx`.
    fn mismatch(&mut self, ctx: &OpCtx, local: usize) -> Error;
    /// Wakes the local ranks that sleep waiting for a step (after a publish).
    fn wake_local(&self) {}
}

fn no_workspace() -> Error {
    Error::Runtime("this group has no shared-memory workspace".into())
}

impl<T: WorkspaceHost> SharedMemory for T {
    fn local_rank(&self) -> usize {
        self.workspace().map_or(0, Workspace::local_rank)
    }

    fn local_size(&self) -> usize {
        self.workspace().map_or(1, Workspace::local_size)
    }

    fn group_rank(&self, local: usize) -> usize {
        self.workspace().map_or(local, |ws| ws.group_ranks()[local])
    }

    fn prepare(&mut self, ctx: &OpCtx) -> Result<&mut [u8]> {
        // A whole slot's data sits at its start.
        self.prepare_data(ctx, SLOT_BYTES)
    }

    fn prepare_data(&mut self, ctx: &OpCtx, len: usize) -> Result<&mut [u8]> {
        self.await_workspace(ctx, Peers::All, &mut |ws| ws.may_write(true))?;
        self.workspace_mut()
            .map(|ws| ws.next_data(len))
            .ok_or_else(no_workspace)
    }

    fn prepare_flag(&mut self, ctx: &OpCtx) -> Result<()> {
        // A rank that has to wait for a flag entry waits until half of them are free, not
        // one: with more ranks than cores it then runs a burst ahead of its readers instead
        // of a step at a time, each of which would cost them a turn of their core.
        let mut room = DEPTH;
        self.await_workspace(ctx, Peers::All, &mut |ws| {
            let ready = ws.may_write_flag(room);
            room = DEPTH / 2;
            ready
        })
    }

    fn publish(&mut self, inline: &[u8]) {
        if let Some(ws) = self.workspace_mut() {
            ws.publish(inline);
            self.wake_local();
        }
    }

    fn wait(&mut self, ctx: &OpCtx, peers: Peers<'_>) -> Result<()> {
        let mut differing = None;
        self.await_workspace(ctx, peers, &mut |ws| {
            let (me, n) = (ws.local_rank(), ws.local_size());
            let mut check = |p: usize| match ws.arrived(p) {
                Arrival::Pending => false,
                Arrival::Arrived => true,
                Arrival::Mismatch => {
                    differing = Some(p);
                    true
                }
            };
            match peers {
                Peers::All => (0..n).all(|p| p == me || check(p)),
                Peers::Only(list) => list.iter().all(|&p| p == me || check(p)),
            }
        })?;
        match differing {
            Some(p) => Err(self.mismatch(ctx, p)),
            None => Ok(()),
        }
    }

    fn inline(&self, local: usize, len: usize) -> &[u8] {
        self.workspace().map_or(&[], |ws| ws.inline(local, len))
    }

    fn slot(&self, local: usize) -> &[u8] {
        self.workspace().map_or(&[], |ws| ws.slot(local))
    }

    fn data(&self, local: usize, len: usize) -> &[u8] {
        self.workspace().map_or(&[], |ws| ws.data(local, len))
    }

    fn single_copy(&self) -> bool {
        self.workspace().is_some_and(Workspace::single_copy)
    }

    fn oversubscribed(&self) -> bool {
        self.workspace().is_some_and(Workspace::oversubscribed)
    }

    fn read_from(&self, ctx: &OpCtx, local: usize, addr: usize, dst: &mut [u8]) -> Result<()> {
        let ws = self.workspace().ok_or_else(no_workspace)?;
        let len = dst.len();
        ws.read_from(local, addr, dst)
            .map_err(|e| cma_error(ctx, ws, local, format!("read {len} bytes from"), e))
    }

    fn write_to(&self, ctx: &OpCtx, local: usize, addr: usize, src: &[u8]) -> Result<()> {
        let ws = self.workspace().ok_or_else(no_workspace)?;
        if ws.withdrawn(local, ctx.seq) {
            return Ok(());
        }
        ws.write_to(local, addr, src)
            .map_err(|e| cma_error(ctx, ws, local, format!("write {} bytes to", src.len()), e))
    }

    fn begin_writes(&self, ctx: &OpCtx) {
        if let Some(ws) = self.workspace() {
            ws.begin_writes(ctx.seq);
        }
    }

    fn end_writes(&self, ctx: &OpCtx) {
        if let Some(ws) = self.workspace() {
            ws.end_writes(ctx.seq);
        }
    }

    fn withdraw(&self, ctx: &OpCtx, writer: usize) {
        let Some(ws) = self.workspace() else {
            return;
        };
        if !ws.withdraw(ctx.seq, writer) {
            return;
        }
        let give_up = Instant::now() + WITHDRAW_GRACE;
        while !ws.writes_ended(writer, ctx.seq)
            && ws.may_write_here(writer)
            && Instant::now() < give_up
        {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// The error of a single-copy transfer (`what`: "read N bytes from") with local rank `local`.
fn cma_error(ctx: &OpCtx, ws: &Workspace, local: usize, what: String, e: std::io::Error) -> Error {
    let peer = ws.group_ranks()[local];
    let what = format!(
        "{} (collective #{}): could not {what} rank {peer}'s memory",
        ctx.sig.kind.name(),
        ctx.seq,
    );
    match e.raw_os_error() {
        // The peer's process is gone: as any dead peer, a network error.
        Some(libc::ESRCH) => Error::Network(format!("{what}: rank {peer} has exited")),
        _ => Error::backend(format!("{what}: {e}")),
    }
}

/// Point-to-point and collective messaging between the ranks of one group.
pub trait Transport: Send {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;

    /// Host index of every rank (hosts numbered by their lowest rank): ranks of one host
    /// share memory.
    fn host_of(&self) -> &[usize];

    /// The kind of links between the ranks.
    fn link_kind(&self) -> LinkKind {
        LinkKind::of(self.host_of())
    }

    /// The time slept waiting for peers since the last call (for the group's counters).
    fn take_waited(&mut self) -> Duration {
        Duration::ZERO
    }

    /// The workspace of the ranks on this host, when there are several.
    fn shared(&mut self) -> Option<&mut dyn SharedMemory> {
        None
    }

    /// Runs all `ops` concurrently (sends never wait for this rank's receives) and returns
    /// once all completed, or with the first error. Errors: [`crate::Error::Network`] when a
    /// peer died or hung up, [`crate::Error::Backend`] on timeout or when a peer's header
    /// disagrees with `ctx.sig` (the message names both ranks and what differs).
    fn exchange(&mut self, ctx: &OpCtx, ops: &mut [Op<'_>]) -> Result<()>;

    /// Posts a tagged point-to-point send of `data` (outside any collective's sequence).
    /// Returns at once; `done` runs, on whichever call moves the last byte, with the peer's
    /// rank or the error. The caller keeps `data` alive and unchanged until then.
    fn post_send(&mut self, peer: usize, tag: i64, data: RawBuf, deadline: Instant, done: P2pDone) {
        let _ = (peer, tag, data, deadline);
        no_point_to_point(done)
    }

    /// Posts a receive of a message with `tag` from `src` (any rank when `None`) into `buf`;
    /// `done` gets the sender's rank. The message length must equal `buf.len()`. The caller
    /// keeps `buf` alive and untouched until `done` runs.
    fn post_recv(
        &mut self,
        src: Option<usize>,
        tag: i64,
        buf: RawBuf,
        deadline: Instant,
        done: P2pDone,
    ) {
        let _ = (src, tag, buf, deadline);
        no_point_to_point(done)
    }

    /// True while posted point-to-point operations are unfinished.
    fn has_pending(&self) -> bool {
        false
    }

    /// True while windows are attached (see [`Transport::attach_window`]).
    fn has_windows(&self) -> bool {
        false
    }

    /// What the group's worker may poll(2) without holding the transport, while windows are
    /// attached and nothing else is pending: news on any of them means [`Transport::sweep`]
    /// has work. None: the worker pumps instead.
    fn sleep_fds(&self) -> Option<Vec<libc::pollfd>> {
        None
    }

    /// Reads every peer once, applying what arrived; whether bytes moved.
    fn sweep(&mut self) -> Result<bool> {
        Ok(false)
    }

    /// Moves pending point-to-point bytes (and window frames) until none are pending,
    /// `interrupt` says stop, or a short nap passes.
    fn pump(&mut self, interrupt: &dyn Fn() -> bool) -> Result<()> {
        let _ = interrupt;
        Ok(())
    }

    /// Has [`Transport::pump`] wake when `wake` rings (work queued for the group's worker)
    /// rather than at its next nap.
    fn set_wake(&mut self, wake: &Arc<Wake>) {
        let _ = wake;
    }

    /// Takes window frames for `memory` (this rank's window) from now on; returns the
    /// window's id, the same on every rank when every rank attaches its windows in the same
    /// order. While a window is attached ([`Transport::has_windows`]) the group's worker pumps
    /// the transport, so puts and signals land however busy or idle this rank's program is.
    fn attach_window(&mut self, memory: Arc<window::WindowMemory>) -> Result<u32> {
        let _ = memory;
        Err(no_windows())
    }

    /// Posts `frame` to rank `peer`'s window `window`; `done` runs once it has left this rank
    /// (the caller keeps a put's data alive and unchanged until then).
    fn post_window(
        &mut self,
        peer: usize,
        window: u32,
        frame: WindowFrame,
        deadline: Instant,
        done: P2pDone,
    ) {
        let _ = (peer, window, frame, deadline);
        done(Err(no_windows()))
    }

    /// Moves bytes (applying window frames as they arrive) until `arrived`, failing when
    /// rank `peer` is gone or at `deadline` (saying that `what` timed out).
    fn wait_window(
        &mut self,
        peer: usize,
        arrived: &dyn Fn() -> bool,
        deadline: Instant,
        what: &str,
    ) -> Result<()> {
        let _ = (peer, arrived, deadline, what);
        Err(no_windows())
    }

    /// Deregisters window `window` (every rank calls it): tells every peer, applies what
    /// they sent before they did the same, then takes no more frames for it.
    fn close_window(&mut self, window: u32, deadline: Instant) -> Result<()> {
        let _ = (window, deadline);
        Err(no_windows())
    }

    /// Tells every peer this group failed with `reason`, so that they fail fast too.
    fn abort(&mut self, reason: &str);

    /// Goes on as the group of this group's ranks but `excluded` (sorted, without this
    /// rank), numbered in order, with group id `group`, failed through `cancel`; every
    /// survivor calls it, within `deadline`. This transport is failed afterwards.
    fn shrink(
        &mut self,
        excluded: &[usize],
        group: u32,
        cancel: Arc<Cancel>,
        deadline: Instant,
    ) -> Result<Box<dyn Transport>> {
        let _ = (excluded, group, cancel, deadline);
        Err(Error::Runtime("this transport cannot shrink".into()))
    }

    /// Tells every peer this rank leaves the group cleanly.
    fn shutdown(&mut self);
}
