//! The mesh transport: one link to every peer (TCP, or shared memory for peers on this host) and
//! one progress loop that drives all of them.
//!
//! Every call reads from every peer, so a peer that dies (EOF) or aborts is noticed by every rank
//! at once, not only by its ring neighbours. Outgoing frames queue per peer and are written whole
//! and in order, so a point-to-point send never interleaves with a collective's frame.
//! Point-to-point operations are posted and complete whenever their bytes have moved, during any
//! later call, so an `irecv` never blocks the collectives queued after it. Errors are sticky:
//! once failed, the transport fails every pending and later operation.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::interrupt;
use crate::reduce;
use crate::spin::Spin;
use crate::store::Store;
use crate::tensor::RawBuf;
use crate::transport::frame::{
    abort_class, collective_name, error_from_abort, signature_diff, Codes, FrameKind, Header,
    HEADER_LEN,
};
use crate::transport::shm::{share_memory, ShmHost, ShmPipe};
use crate::transport::tcp::{connect_mesh, poll_fds, pollfd};
use crate::transport::workspace::{unpacked, Arrival, Workspace};
use crate::transport::{remaining, Op, OpCtx, P2pDone, Peers, SharedMemory, Transport};
use crate::types::{CollectiveKind, DType, ReduceOp};

/// Bytes read at once into a stash (a claimed length is never allocated before it arrives).
const STASH_CHUNK: usize = 4 << 20;
/// Longest sleep of an idle pump, so that new work queued behind posted receives starts soon.
const PUMP_NAP: Duration = Duration::from_micros(200);

/// The byte pipe to one peer: its TCP connection, and a shared-memory pipe when the peer shares
/// the host (the socket then only tells whether the peer is alive).
struct Link {
    sock: TcpStream,
    shm: Option<ShmPipe>,
}

impl Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.shm {
            Some(pipe) => pipe.read(buf),
            None => self.sock.read(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match &mut self.shm {
            Some(pipe) => pipe.write_vectored(bufs),
            None => io::Write::write_vectored(&mut self.sock, bufs),
        }
    }

    /// For a shared-memory link: false once the peer's socket reports EOF or an error.
    fn alive(&mut self) -> bool {
        let mut probe = [0u8; 1];
        match self.sock.read(&mut probe) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ),
        }
    }
}

/// A complete frame read before anyone asked for it.
struct Frame {
    hdr: Header,
    payload: Vec<u8>,
}

/// Where the bytes of the frame being read from a peer go.
enum Rx {
    /// Reading a header.
    Header { buf: [u8; HEADER_LEN], got: usize },
    /// Streaming into receive `idx` of the current collective step.
    Posted { idx: usize },
    /// Streaming into the posted point-to-point receive with this id.
    Tagged { id: u64 },
    /// Collecting a frame nobody asked for yet.
    Stash { frame: Frame, got: usize },
    /// Dropping the rest of a frame whose receive failed (it was matched, so it is consumed).
    Discard { left: usize },
}

const RX_IDLE: Rx = Rx::Header {
    buf: [0; HEADER_LEN],
    got: 0,
};

/// A frame queued for a peer. The payload is borrowed from the caller, who keeps it alive until
/// the frame is flushed (a collective step waits for that; a posted send's Work holds it).
struct OutFrame {
    header: [u8; HEADER_LEN],
    data: RawBuf,
    off: usize,
    /// Identifies the frame to the step waiting for it.
    ticket: u64,
    /// Completion of a point-to-point send, with its deadline.
    done: Option<(P2pDone, Instant)>,
}

struct Peer {
    link: Link,
    rx: Rx,
    txq: VecDeque<OutFrame>,
    /// Frames ever queued: the next frame's ticket.
    queued: u64,
    /// Collective frames received ahead of their receive (FIFO per peer).
    collective: VecDeque<Frame>,
    /// Tagged frames waiting for a matching receive.
    tagged: VecDeque<Frame>,
    /// Set once the peer said goodbye; its EOF is then not a failure.
    left: bool,
    closed: bool,
    /// Scratch for `RecvReduce`: incoming bytes before they are reduced into place.
    scratch: Vec<u8>,
}

impl Peer {
    fn new(sock: TcpStream, shm: Option<ShmPipe>) -> Peer {
        Peer {
            link: Link { sock, shm },
            rx: RX_IDLE,
            txq: VecDeque::new(),
            queued: 0,
            collective: VecDeque::new(),
            tagged: VecDeque::new(),
            left: false,
            closed: false,
            scratch: Vec::new(),
        }
    }
}

/// One receive of the current collective step.
struct StepRecv<'a> {
    peer: usize,
    step: u32,
    buf: &'a mut [u8],
    reduce: bool,
    /// True once the frame's header was matched to this receive.
    started: bool,
    got: usize,
    reduced: usize,
    done: bool,
}

/// A posted point-to-point receive.
struct PostedRecv {
    id: u64,
    src: Option<usize>,
    tag: u64,
    buf: RawBuf,
    got: usize,
    /// The sender, once a frame is streaming in.
    from: Option<usize>,
    deadline: Instant,
    done: Option<P2pDone>,
}

/// The mesh transport of one group.
pub struct MeshTransport {
    rank: usize,
    size: usize,
    group: u32,
    peers: Vec<Option<Peer>>,
    /// Collective sequence number of the current message counters.
    seq: u64,
    sent_steps: Vec<u32>,
    recv_steps: Vec<u32>,
    posted: Vec<PostedRecv>,
    next_id: u64,
    /// Tagged messages this rank sent to itself, waiting for a matching receive.
    own_tagged: VecDeque<Frame>,
    failed: Option<Error>,
    /// The group's abort signal, polled while waiting.
    cancel: Arc<Cancel>,
    /// Host index of every rank (ranks of a host share memory).
    host_of: Vec<usize>,
    /// The workspace of the ranks on this host, when there are several.
    ws: Option<Workspace>,
    /// The collective the workspace was last told about.
    ws_seq: u64,
    /// More local ranks than CPUs: waiting ranks yield at once instead of spinning.
    oversubscribed: bool,
    /// Shared memory with the peers on this host; after `peers` and `ws`, so the pipes and
    /// the workspace go first.
    host: Option<ShmHost>,
}

fn next_step_recv(recvs: &[StepRecv<'_>], p: usize) -> Option<usize> {
    recvs.iter().position(|r| r.peer == p && !r.done)
}

impl MeshTransport {
    /// Joins the mesh of group `group` (rendezvous keys under `prefix` in `store`) within
    /// `timeout`: TCP to every peer, and shared memory to those on this host when
    /// `shared_memory` (every rank must pass the same). Waits stop once `cancel` is raised.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        store: Arc<dyn Store>,
        prefix: &str,
        rank: usize,
        size: usize,
        group: u32,
        timeout: Duration,
        shared_memory: bool,
        cancel: Arc<Cancel>,
    ) -> Result<MeshTransport> {
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "rank {rank} is out of range for a group of size {size}"
            )));
        }
        let deadline = Instant::now() + timeout;
        let socks = connect_mesh(&*store, prefix, rank, size, group, deadline)?;
        let (host, host_of) = if shared_memory {
            share_memory(&*store, prefix, rank, size, group, deadline)?
        } else {
            (None, (0..size).collect())
        };
        let ws = host
            .as_ref()
            .map(|h| h.workspace(rank))
            .filter(|w| w.local_size() > 1);
        let peers = socks
            .into_iter()
            .enumerate()
            .map(|(p, sock)| {
                sock.map(|s| Peer::new(s, host.as_ref().and_then(|h| h.pipe(rank, p))))
            })
            .collect();
        Ok(MeshTransport {
            rank,
            size,
            group,
            peers,
            seq: u64::MAX,
            sent_steps: vec![0; size],
            recv_steps: vec![0; size],
            posted: Vec::new(),
            next_id: 0,
            own_tagged: VecDeque::new(),
            failed: None,
            cancel,
            host_of,
            oversubscribed: ws.as_ref().is_some_and(|w| {
                std::thread::available_parallelism().map_or(1, |n| n.get()) < w.local_size()
            }),
            ws,
            ws_seq: u64::MAX,
            host,
        })
    }

    fn peer(&mut self, p: usize) -> Result<&mut Peer> {
        let size = self.size;
        self.peers
            .get_mut(p)
            .and_then(|x| x.as_mut())
            .ok_or_else(|| {
                Error::invalid(format!("rank {p} is not a peer in a group of size {size}"))
            })
    }

    /// Makes `e` the transport's sticky error and fails every pending point-to-point operation
    /// (dropping queued frames, whose borrowed payloads must not be touched after this).
    fn fail(&mut self, e: Error) -> Error {
        if self.failed.is_none() {
            self.failed = Some(e.clone());
        }
        let mut dones = Vec::new();
        for peer in self.peers.iter_mut().flatten() {
            dones.extend(peer.txq.drain(..).filter_map(|f| f.done.map(|(d, _)| d)));
        }
        dones.extend(self.posted.drain(..).filter_map(|r| r.done));
        for done in dones {
            done(Err(e.clone()));
        }
        e
    }

    fn check_failed(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Restarts the per-peer message counters when a new collective begins.
    fn enter(&mut self, seq: u64) {
        if self.seq != seq {
            self.seq = seq;
            self.sent_steps.iter_mut().for_each(|s| *s = 0);
            self.recv_steps.iter_mut().for_each(|s| *s = 0);
        }
    }

    /// Queues a frame for `p`; returns its ticket (flushed once no queued frame has it).
    fn queue(&mut self, p: usize, mut frame: OutFrame) -> Result<u64> {
        let peer = self.peer(p)?;
        peer.queued += 1;
        frame.ticket = peer.queued;
        peer.txq.push_back(frame);
        Ok(peer.queued)
    }

    fn flushed(&self, p: usize, ticket: u64) -> bool {
        self.peers[p]
            .as_ref()
            .is_some_and(|x| !x.txq.iter().any(|f| f.ticket == ticket))
    }

    fn has_pending_p2p(&self) -> bool {
        !self.posted.is_empty() || self.peers.iter().flatten().any(|p| !p.txq.is_empty())
    }

    /// The progress loop: writes every queued frame, fills `recvs`, serves posted receives,
    /// reading every peer all the while, until `finished` says so, a peer fails, or `deadline`.
    /// Between rounds without progress it spins briefly, then sleeps (at most `nap` if given).
    fn progress(
        &mut self,
        ctx: Option<&OpCtx>,
        recvs: &mut [StepRecv<'_>],
        finished: &dyn Fn(&MeshTransport, &[StepRecv<'_>]) -> bool,
        deadline: Instant,
        nap: Option<Duration>,
    ) -> Result<()> {
        for i in 0..recvs.len() {
            self.match_stashed(ctx, recvs, i)?;
        }
        let mut spin = Spin::new();
        loop {
            let mut moved = false;
            for p in 0..self.size {
                if p != self.rank {
                    moved |= self.flush_peer(p)?;
                    moved |= self.read_peer(p, ctx, recvs)?;
                }
            }
            self.expire_p2p();
            if finished(self, recvs) {
                return Ok(());
            }
            self.check_needed_peers(recvs)?;
            if let Err(e) = self.cancel.check() {
                return Err(self.fail(e));
            }
            interrupt::check()?;
            if moved {
                spin = Spin::new();
                continue;
            }
            if spin.again() {
                continue;
            }
            let Some(left) = remaining(deadline) else {
                let what = match ctx {
                    Some(c) => format!("{} (collective #{})", c.sig.kind.name(), c.seq),
                    None => "point-to-point operation".to_string(),
                };
                return Err(self.fail(Error::backend(format!(
                    "rank {}: {what} timed out waiting for its peers",
                    self.rank
                ))));
            };
            // Capped so that an abort is noticed while blocked.
            let wait = nap.map_or(left, |n| n.min(left)).min(interrupt::POLL);
            self.block(wait)?;
            if nap.is_some() {
                return Ok(());
            }
            spin = Spin::new();
        }
    }

    /// Sleeps until a peer may have made progress possible, or `left` passes: poll(2) on the
    /// sockets, or the shared-memory doorbell (in short naps, checking that peers are alive).
    fn block(&mut self, left: Duration) -> Result<()> {
        if let Some(host) = &self.host {
            let all_shm = self.peers.iter().flatten().all(|p| p.link.shm.is_some());
            let nap = left.min(Duration::from_millis(if all_shm { 5 } else { 1 }));
            let peers = &self.peers;
            host.sleep(nap, || {
                peers.iter().flatten().any(|peer| {
                    peer.link.shm.as_ref().is_some_and(|pipe| {
                        pipe.has_data() || (!peer.txq.is_empty() && pipe.has_space())
                    })
                })
            });
            for p in 0..self.size {
                let Some(peer) = self.peers[p].as_mut() else {
                    continue;
                };
                // Unread bytes (perhaps a goodbye) come first; the socket's EOF is only news
                // once the pipe is drained.
                let drained = peer.link.shm.as_ref().is_some_and(|pipe| !pipe.has_data());
                if drained && !peer.closed && !peer.link.alive() {
                    peer.closed = true;
                    if !peer.left {
                        let rank = self.rank;
                        return Err(self.fail(Error::network(format!(
                            "rank {p} closed its connection to rank {rank} unexpectedly; it probably died"
                        ))));
                    }
                }
            }
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.size);
        for peer in self.peers.iter().flatten() {
            if peer.closed {
                continue;
            }
            let events = if peer.txq.is_empty() {
                libc::POLLIN
            } else {
                libc::POLLIN | libc::POLLOUT
            };
            fds.push(pollfd(peer.link.sock.as_raw_fd(), events));
        }
        poll_fds(&mut fds, left);
        Ok(())
    }

    /// Errors when an operation still needs a peer that has left.
    fn check_needed_peers(&mut self, recvs: &[StepRecv<'_>]) -> Result<()> {
        let gone = |p: usize| self.peers[p].as_ref().is_some_and(|x| x.closed);
        let stuck = recvs
            .iter()
            .filter(|r| !r.done)
            .map(|r| r.peer)
            .chain(self.posted.iter().filter_map(|r| r.src))
            .chain(
                self.peers
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.as_ref().is_some_and(|x| !x.txq.is_empty()))
                    .map(|(p, _)| p),
            )
            .find(|&p| gone(p));
        if let Some(p) = stuck {
            let rank = self.rank;
            return Err(self.fail(Error::network(format!(
                "rank {p} has left the group (it destroyed its process group or exited) while rank {rank} still needs it"
            ))));
        }
        Ok(())
    }

    /// Fails posted point-to-point operations whose deadline passed and that have not started
    /// moving bytes (a half-moved frame cannot be abandoned without breaking the stream).
    fn expire_p2p(&mut self) {
        let now = Instant::now();
        let mut expired = Vec::new();
        self.posted.retain_mut(|r| {
            if r.from.is_none() && r.deadline <= now {
                expired.push((r.done.take(), format!("recv (tag {})", r.tag as i64)));
                return false;
            }
            true
        });
        for peer in self.peers.iter_mut().flatten() {
            // Only frames not yet started can be dropped; the front one may be half written.
            let keep_front = usize::from(peer.txq.front().is_some_and(|f| f.off > 0));
            let mut i = keep_front;
            while i < peer.txq.len() {
                if peer.txq[i].done.as_ref().is_some_and(|(_, d)| *d <= now) {
                    if let Some(f) = peer.txq.remove(i) {
                        expired.push((f.done.map(|(d, _)| d), "send".to_string()));
                    }
                } else {
                    i += 1;
                }
            }
        }
        for (done, what) in expired {
            if let Some(done) = done {
                done(Err(Error::backend(format!("{what} timed out"))));
            }
        }
    }

    /// Writes queued frames to `p` as far as its link takes them.
    fn flush_peer(&mut self, p: usize) -> Result<bool> {
        let mut moved = false;
        loop {
            let peer = self.peer(p)?;
            let Some(f) = peer.txq.front_mut() else {
                return Ok(moved);
            };
            // SAFETY: the frame's owner keeps the payload alive until it is flushed (see
            // OutFrame); frames of a failed transport are dropped before their owners return.
            let data = unsafe { f.data.as_slice() };
            let res = if f.off < HEADER_LEN {
                peer.link
                    .write_vectored(&[IoSlice::new(&f.header[f.off..]), IoSlice::new(data)])
            } else {
                peer.link
                    .write_vectored(&[IoSlice::new(&data[f.off - HEADER_LEN..])])
            };
            match res {
                Ok(0) if f.off < HEADER_LEN + data.len() => {
                    return Err(self.fail(Error::network(format!(
                        "connection to rank {p} closed while sending"
                    ))))
                }
                Ok(n) => {
                    f.off += n;
                    moved = true;
                    if f.off == HEADER_LEN + data.len() {
                        let done = peer.txq.pop_front().and_then(|f| f.done);
                        if let Some((done, _)) = done {
                            done(Ok(p));
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(self.fail(Error::network(format!(
                        "rank {p} is unreachable (sending failed: {e}); it probably died"
                    ))))
                }
            }
        }
    }

    /// Reads whatever peer `p` has sent, routing frames to receives or stashes.
    fn read_peer(
        &mut self,
        p: usize,
        ctx: Option<&OpCtx>,
        recvs: &mut [StepRecv<'_>],
    ) -> Result<bool> {
        let mut moved = false;
        loop {
            let rank = self.rank;
            let Some(peer) = self.peers[p].as_mut() else {
                return Ok(moved);
            };
            if peer.closed {
                return Ok(moved);
            }
            let res = match &mut peer.rx {
                Rx::Header { buf, got } => peer.link.read(&mut buf[*got..]),
                Rx::Posted { idx } => {
                    let r = &mut recvs[*idx];
                    if r.reduce {
                        peer.link.read(&mut peer.scratch[r.got..r.buf.len()])
                    } else {
                        peer.link.read(&mut r.buf[r.got..])
                    }
                }
                Rx::Tagged { id } => {
                    let id = *id;
                    let Some(r) = self.posted.iter_mut().find(|r| r.id == id) else {
                        return Err(Error::backend("a posted receive vanished mid-frame"));
                    };
                    // SAFETY: the posted receive's Work keeps its buffer alive until completion.
                    let buf = unsafe { r.buf.as_mut_slice() };
                    peer.link.read(&mut buf[r.got..])
                }
                Rx::Stash { frame, got } => {
                    let want = (frame.hdr.len as usize - *got).min(STASH_CHUNK);
                    if frame.payload.len() < *got + want {
                        frame.payload.resize(*got + want, 0);
                    }
                    peer.link.read(&mut frame.payload[*got..*got + want])
                }
                Rx::Discard { left } => {
                    let want = (*left).min(STASH_CHUNK);
                    if peer.scratch.len() < want {
                        peer.scratch.resize(want, 0);
                    }
                    peer.link.read(&mut peer.scratch[..want])
                }
            };
            let n = match res {
                Ok(0) => {
                    peer.closed = true;
                    if peer.left && matches!(peer.rx, Rx::Header { got: 0, .. }) {
                        return Ok(true);
                    }
                    return Err(self.fail(Error::network(format!(
                        "rank {p} closed its connection to rank {rank} unexpectedly; it probably died"
                    ))));
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    peer.closed = true;
                    return Err(self.fail(Error::network(format!(
                        "connection from rank {p} to rank {rank} failed ({e}); rank {p} probably died"
                    ))));
                }
            };
            moved = true;
            self.advance(p, n, ctx, recvs)?;
        }
    }

    /// Accounts for `n` bytes just read from peer `p`.
    fn advance(
        &mut self,
        p: usize,
        n: usize,
        ctx: Option<&OpCtx>,
        recvs: &mut [StepRecv<'_>],
    ) -> Result<()> {
        let Some(peer) = self.peers[p].as_mut() else {
            return Ok(());
        };
        match &mut peer.rx {
            Rx::Header { buf, got } => {
                *got += n;
                if *got < HEADER_LEN {
                    return Ok(());
                }
                let hdr = Header::decode(buf, p);
                peer.rx = RX_IDLE;
                match hdr {
                    Ok(hdr) => self.on_header(p, hdr, ctx, recvs),
                    Err(e) => Err(self.fail(e)),
                }
            }
            Rx::Posted { idx } => {
                let r = &mut recvs[*idx];
                r.got += n;
                if r.reduce {
                    let (dtype, op) =
                        ctx.map_or((DType::U8, ReduceOp::Sum), |c| (c.sig.dtype, c.reduce));
                    let upto = if r.got == r.buf.len() {
                        r.got
                    } else {
                        r.got - r.got % dtype.size()
                    };
                    if upto > r.reduced {
                        reduce::reduce_into(
                            dtype,
                            op,
                            &mut r.buf[r.reduced..upto],
                            &peer.scratch[r.reduced..upto],
                        )?;
                        r.reduced = upto;
                    }
                }
                if r.got == r.buf.len() {
                    r.done = true;
                    peer.rx = RX_IDLE;
                }
                Ok(())
            }
            Rx::Tagged { id } => {
                let id = *id;
                let Some(pos) = self.posted.iter().position(|r| r.id == id) else {
                    return Err(Error::backend("a posted receive vanished mid-frame"));
                };
                let r = &mut self.posted[pos];
                r.got += n;
                if r.got == r.buf.len() {
                    peer.rx = RX_IDLE;
                    let r = self.posted.remove(pos);
                    if let Some(done) = r.done {
                        done(Ok(p));
                    }
                }
                Ok(())
            }
            Rx::Discard { left } => {
                *left -= n;
                if *left == 0 {
                    peer.rx = RX_IDLE;
                }
                Ok(())
            }
            Rx::Stash { frame, got } => {
                *got += n;
                if *got as u64 == frame.hdr.len {
                    if let Rx::Stash { frame, .. } = std::mem::replace(&mut peer.rx, RX_IDLE) {
                        self.on_frame(p, frame, ctx, recvs)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// A header arrived from `p`: stream the payload into the receive expecting it, if any,
    /// else into a stash.
    fn on_header(
        &mut self,
        p: usize,
        hdr: Header,
        ctx: Option<&OpCtx>,
        recvs: &mut [StepRecv<'_>],
    ) -> Result<()> {
        let group = self.group;
        if hdr.group != group {
            return Err(self.fail(Error::network(format!(
                "rank {p} sent a frame of another group ({:#x}, expected {group:#x})",
                hdr.group
            ))));
        }
        match hdr.kind {
            FrameKind::Collective => {
                if let (Some(ctx), Some(idx)) = (ctx, next_step_recv(recvs, p)) {
                    if let Err(e) =
                        self.check_frame(p, &hdr, ctx, recvs[idx].step, recvs[idx].buf.len())
                    {
                        return Err(self.fail(e));
                    }
                    let r = &mut recvs[idx];
                    r.started = true;
                    if r.buf.is_empty() {
                        r.done = true;
                        return Ok(());
                    }
                    let peer = self.peer(p)?;
                    if r.reduce && peer.scratch.len() < r.buf.len() {
                        peer.scratch.resize(r.buf.len(), 0);
                    }
                    peer.rx = Rx::Posted { idx };
                    return Ok(());
                }
            }
            FrameKind::Tagged => {
                let posted = self
                    .posted
                    .iter_mut()
                    .find(|r| r.from.is_none() && r.tag == hdr.seq && r.src.is_none_or(|s| s == p));
                if let Some(r) = posted {
                    if r.buf.len() as u64 == hdr.len {
                        if hdr.len == 0 {
                            let id = r.id;
                            self.complete_posted(id, Ok(p));
                            return Ok(());
                        }
                        r.from = Some(p);
                        let id = r.id;
                        self.peer(p)?.rx = Rx::Tagged { id };
                        return Ok(());
                    }
                    // A size mismatch fails that receive, which consumes the frame.
                    let (id, want) = (r.id, r.buf.len());
                    let rank = self.rank;
                    self.complete_posted(
                        id,
                        Err(Error::backend(format!(
                            "recv size mismatch: rank {rank} posted a receive of {want} bytes (tag {}) but rank {p} sent {} bytes",
                            hdr.seq as i64, hdr.len
                        ))),
                    );
                    if hdr.len > 0 {
                        self.peer(p)?.rx = Rx::Discard {
                            left: hdr.len as usize,
                        };
                    }
                    return Ok(());
                }
            }
            FrameKind::Abort | FrameKind::Goodbye => {}
        }
        let frame = Frame {
            hdr,
            payload: Vec::new(),
        };
        if hdr.len == 0 {
            return self.on_frame(p, frame, ctx, recvs);
        }
        self.peer(p)?.rx = Rx::Stash { frame, got: 0 };
        Ok(())
    }

    fn complete_posted(&mut self, id: u64, outcome: Result<usize>) {
        if let Some(pos) = self.posted.iter().position(|r| r.id == id) {
            if let Some(done) = self.posted.remove(pos).done {
                done(outcome);
            }
        }
    }

    /// A whole frame arrived that no receive was streaming into.
    fn on_frame(
        &mut self,
        p: usize,
        frame: Frame,
        ctx: Option<&OpCtx>,
        recvs: &mut [StepRecv<'_>],
    ) -> Result<()> {
        match frame.hdr.kind {
            FrameKind::Abort => {
                let why = String::from_utf8_lossy(&frame.payload);
                let e = error_from_abort(frame.hdr.coll, format!("rank {p} failed: {why}"));
                Err(self.fail(e))
            }
            FrameKind::Goodbye => {
                self.peer(p)?.left = true;
                Ok(())
            }
            FrameKind::Tagged => {
                let tag = frame.hdr.seq;
                self.peer(p)?.tagged.push_back(frame);
                // A receive posted while this frame was still arriving can take it now.
                let waiting = self
                    .posted
                    .iter()
                    .find(|r| r.from.is_none() && r.tag == tag && r.src.is_none_or(|s| s == p))
                    .map(|r| r.id);
                if let Some(id) = waiting {
                    self.match_posted_from_stash(id);
                }
                Ok(())
            }
            FrameKind::Collective => {
                self.peer(p)?.collective.push_back(frame);
                if let Some(idx) = next_step_recv(recvs, p) {
                    self.match_stashed(ctx, recvs, idx)?;
                }
                Ok(())
            }
        }
    }

    /// Serves step receive `idx` from its peer's stash when the frame it expects is there.
    fn match_stashed(
        &mut self,
        ctx: Option<&OpCtx>,
        recvs: &mut [StepRecv<'_>],
        idx: usize,
    ) -> Result<()> {
        let p = recvs[idx].peer;
        if recvs[idx].done || recvs[idx].started || next_step_recv(recvs, p) != Some(idx) {
            return Ok(());
        }
        let Some(ctx) = ctx else { return Ok(()) };
        let Some(frame) = self.peer(p)?.collective.pop_front() else {
            return Ok(());
        };
        if let Err(e) = self.check_frame(p, &frame.hdr, ctx, recvs[idx].step, recvs[idx].buf.len())
        {
            return Err(self.fail(e));
        }
        let r = &mut recvs[idx];
        if r.reduce {
            reduce::reduce_into(ctx.sig.dtype, ctx.reduce, r.buf, &frame.payload)?;
        } else {
            r.buf.copy_from_slice(&frame.payload);
        }
        r.got = r.buf.len();
        r.done = true;
        Ok(())
    }

    /// Checks a collective frame from `p` against what this rank expects next from it.
    fn check_frame(
        &self,
        p: usize,
        hdr: &Header,
        ctx: &OpCtx,
        step: u32,
        len: usize,
    ) -> Result<()> {
        let me = self.rank;
        let ours = ctx.sig;
        if hdr.seq != ctx.seq {
            return Err(Error::backend(format!(
                "collective mismatch: rank {me} is at collective #{} ({}) but rank {p} sent data of collective #{} ({}); ranks called a different number of collectives",
                ctx.seq,
                ours.kind.name(),
                hdr.seq,
                collective_name(hdr)
            )));
        }
        if let Some(diff) = signature_diff(&ours, hdr.into()) {
            return Err(Error::backend(format!(
                "{} mismatch between ranks: {diff} (rank {me} vs rank {p}, collective #{})",
                ours.kind.name(),
                ctx.seq
            )));
        }
        if hdr.step != step || hdr.len as usize != len {
            return Err(Error::backend(format!(
                "{} mismatch between ranks: rank {me} expected message {step} of {len} bytes from rank {p}, got message {} of {} bytes",
                ours.kind.name(),
                hdr.step,
                hdr.len
            )));
        }
        Ok(())
    }

    /// Serves a new posted receive from the stash when a matching frame already arrived.
    fn match_posted_from_stash(&mut self, id: u64) {
        let Some(pos) = self.posted.iter().position(|r| r.id == id) else {
            return;
        };
        let (src, tag) = (self.posted[pos].src, self.posted[pos].tag);
        let candidates: Vec<usize> = match src {
            Some(s) => vec![s],
            None => (0..self.size).collect(),
        };
        for p in candidates {
            let stash = match self.peers[p].as_mut() {
                Some(peer) => &mut peer.tagged,
                None if p == self.rank => &mut self.own_tagged,
                None => continue,
            };
            let Some(at) = stash.iter().position(|f| f.hdr.seq == tag) else {
                continue;
            };
            let Some(frame) = stash.remove(at) else {
                continue;
            };
            let r = &mut self.posted[pos];
            let outcome = if frame.payload.len() == r.buf.len() {
                // SAFETY: the posted receive's Work keeps its buffer alive until completion.
                unsafe { r.buf.as_mut_slice() }.copy_from_slice(&frame.payload);
                Ok(p)
            } else {
                Err(Error::backend(format!(
                    "recv size mismatch: rank {} posted a receive of {} bytes (tag {}) but rank {p} sent {} bytes",
                    self.rank,
                    r.buf.len(),
                    tag as i64,
                    frame.payload.len()
                )))
            };
            self.complete_posted(id, outcome);
            return;
        }
    }

    fn send_control(&mut self, kind: FrameKind, class: u8, payload: &[u8]) {
        let hdr = Header {
            kind,
            coll: class,
            dtype: 0,
            op: 0,
            group: self.group,
            step: 0,
            seq: 0,
            count: 0,
            len: payload.len() as u64,
        }
        .encode();
        let deadline = Instant::now() + Duration::from_millis(200);
        for peer in self.peers.iter_mut().flatten() {
            if peer.closed {
                continue;
            }
            // Best effort: a peer that does not drain its link in time gets no notice and
            // finds out from the closed connection instead.
            let mut frame = hdr.to_vec();
            frame.extend_from_slice(payload);
            let mut off = 0;
            while off < frame.len() && Instant::now() < deadline {
                match peer.link.write_vectored(&[IoSlice::new(&frame[off..])]) {
                    Ok(0) => break,
                    Ok(n) => off += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        }
    }
}

/// Rounds of busy polling (with a pause) before a workspace wait starts servicing links and
/// yielding: a peer on another core answers within a few hundred nanoseconds.
const WS_SPIN: u32 = 2000;
/// Longest sleep on the doorbell before links and peers are checked again.
const WS_NAP: Duration = Duration::from_millis(5);

impl MeshTransport {
    /// Announces collective `ctx` in the workspace on its first use.
    fn ws_begin(&mut self, ctx: &OpCtx) -> Result<&mut Workspace> {
        let Some(ws) = self.ws.as_mut() else {
            return Err(Error::Runtime(
                "this group has no shared-memory workspace".into(),
            ));
        };
        if self.ws_seq != ctx.seq {
            ws.begin(ctx.seq, &ctx.sig);
            self.ws_seq = ctx.seq;
        }
        Ok(ws)
    }

    /// Waits until `ready` holds for the workspace: a short busy poll, then (servicing the
    /// links for aborts, dead peers and point-to-point traffic) yielding, then sleeping on
    /// the doorbell in short naps, until `ctx`'s deadline.
    fn ws_await(
        &mut self,
        ctx: &OpCtx,
        waited: Peers<'_>,
        ready: &mut dyn FnMut(&mut Workspace) -> bool,
    ) -> Result<()> {
        let busy_poll = !self.oversubscribed;
        let ws = self.ws_begin(ctx)?;
        if ready(ws) {
            return Ok(());
        }
        if busy_poll {
            for _ in 0..WS_SPIN {
                std::hint::spin_loop();
                if ready(ws) {
                    return Ok(());
                }
            }
        }
        let mut spin = Spin::new();
        loop {
            for p in 0..self.size {
                if p != self.rank {
                    self.flush_peer(p)?;
                    self.read_peer(p, Some(ctx), &mut [])?;
                }
            }
            self.check_needed_peers(&[])?;
            if let Err(e) = self.cancel.check() {
                return Err(self.fail(e));
            }
            interrupt::check()?;
            self.ws_check_peers(ctx, waited)?;
            let Some(ws) = self.ws.as_mut() else {
                return Ok(());
            };
            if ready(ws) {
                return Ok(());
            }
            if spin.again() {
                continue;
            }
            let Some(left) = remaining(ctx.deadline) else {
                return Err(self.fail(self.timed_out(ctx, waited)));
            };
            if let (Some(host), Some(ws)) = (&self.host, self.ws.as_mut()) {
                host.sleep(left.min(WS_NAP), || ready(ws));
            }
            self.check_alive()?;
            if let Some(ws) = self.ws.as_mut() {
                if ready(ws) {
                    return Ok(());
                }
            }
        }
    }

    /// Fails when a waited-for local peer announced a different collective at this
    /// sequence number (it publishes on another kind's flags, so it never arrives here).
    fn ws_check_peers(&mut self, ctx: &OpCtx, waited: Peers<'_>) -> Result<()> {
        let Some(ws) = self.ws.as_ref() else {
            return Ok(());
        };
        let differing = waited_ranks(ws, waited).find(|&p| {
            let a = ws.announced(p);
            a.seq == ctx.seq && Workspace::differs(&ctx.sig, &a)
        });
        match differing {
            Some(p) => Err(self.ws_mismatch(ctx, p)),
            None => Ok(()),
        }
    }

    /// Fails the transport with a mismatch between this rank and local rank `p`, described
    /// from `p`'s announce line.
    fn ws_mismatch(&mut self, ctx: &OpCtx, p: usize) -> Error {
        let Some(ws) = self.ws.as_ref() else {
            return Error::backend("workspace mismatch without a workspace");
        };
        let a = ws.announced(p);
        let (kind, dtype, op) = unpacked(a.sig);
        let theirs = Codes {
            kind,
            dtype,
            op,
            count: a.count,
        };
        let diff = signature_diff(&ctx.sig, theirs)
            .unwrap_or_else(|| "the ranks' steps differ (RUSTDIST_ALGO set differently?)".into());
        let e = Error::backend(format!(
            "{} mismatch between ranks: {diff} (rank {} vs rank {}, collective #{})",
            ctx.sig.kind.name(),
            self.rank,
            ws.group_ranks()[p],
            ctx.seq
        ));
        self.fail(e)
    }

    /// The timeout of a workspace wait, naming the ranks that did not arrive.
    fn timed_out(&self, ctx: &OpCtx, waited: Peers<'_>) -> Error {
        let missing: Vec<String> = self.ws.as_ref().map_or_else(Vec::new, |ws| {
            waited_ranks(ws, waited)
                .filter(|&p| ws.announced(p).seq < ctx.seq || !ws.peek_arrived(p))
                .map(|p| ws.group_ranks()[p].to_string())
                .collect()
        });
        Error::backend(format!(
            "rank {}: {} (collective #{}) Timed out waiting for rank(s) {}",
            self.rank,
            ctx.sig.kind.name(),
            ctx.seq,
            missing.join(", ")
        ))
    }

    /// Fails when a peer on this host has closed its connection (it died).
    fn check_alive(&mut self) -> Result<()> {
        for p in 0..self.size {
            let Some(peer) = self.peers[p].as_mut() else {
                continue;
            };
            let drained = peer.link.shm.as_ref().is_some_and(|pipe| !pipe.has_data());
            if drained && !peer.closed && !peer.link.alive() {
                peer.closed = true;
                if !peer.left {
                    let rank = self.rank;
                    return Err(self.fail(Error::network(format!(
                        "rank {p} closed its connection to rank {rank} unexpectedly; it probably died"
                    ))));
                }
            }
        }
        Ok(())
    }
}

/// The local ranks `waited` names, this rank excluded.
fn waited_ranks<'a>(ws: &'a Workspace, waited: Peers<'a>) -> impl Iterator<Item = usize> + 'a {
    let me = ws.local_rank();
    let all = 0..ws.local_size();
    let only: &[usize] = match waited {
        Peers::All => &[],
        Peers::Only(list) => list,
    };
    all.filter(move |&p| p != me && (matches!(waited, Peers::All) || only.contains(&p)))
}

impl SharedMemory for MeshTransport {
    fn local_rank(&self) -> usize {
        self.ws.as_ref().map_or(0, Workspace::local_rank)
    }

    fn local_size(&self) -> usize {
        self.ws.as_ref().map_or(1, Workspace::local_size)
    }

    fn group_rank(&self, local: usize) -> usize {
        self.ws
            .as_ref()
            .map_or(self.rank, |ws| ws.group_ranks()[local])
    }

    fn prepare(&mut self, ctx: &OpCtx) -> Result<&mut [u8]> {
        self.ws_await(ctx, Peers::All, &mut |ws| ws.may_write())?;
        match self.ws.as_mut() {
            Some(ws) => Ok(ws.next_slot()),
            None => Err(Error::Runtime(
                "this group has no shared-memory workspace".into(),
            )),
        }
    }

    fn publish(&mut self, inline: &[u8]) {
        if let Some(ws) = self.ws.as_mut() {
            ws.publish(inline);
            if let Some(host) = &self.host {
                host.wake(ws.group_ranks(), self.rank);
            }
        }
    }

    fn wait(&mut self, ctx: &OpCtx, peers: Peers<'_>) -> Result<()> {
        let mut differing = None;
        self.ws_await(ctx, peers, &mut |ws| {
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
            Some(p) => Err(self.ws_mismatch(ctx, p)),
            None => Ok(()),
        }
    }

    fn inline(&self, local: usize, len: usize) -> &[u8] {
        self.ws.as_ref().map_or(&[], |ws| ws.inline(local, len))
    }

    fn slot(&self, local: usize) -> &[u8] {
        self.ws.as_ref().map_or(&[], |ws| ws.slot(local))
    }
}

impl Transport for MeshTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn host_of(&self) -> &[usize] {
        &self.host_of
    }

    fn shared(&mut self) -> Option<&mut dyn SharedMemory> {
        if self.ws.is_some() {
            Some(self)
        } else {
            None
        }
    }

    fn exchange(&mut self, ctx: &OpCtx, ops: &mut [Op<'_>]) -> Result<()> {
        self.check_failed()?;
        self.enter(ctx.seq);
        let mut tickets: Vec<(usize, u64)> = Vec::new();
        let mut recvs = Vec::new();
        for op in ops.iter_mut() {
            let (peer, buf, reduce) = match op {
                Op::Send { peer, data } => {
                    let step = self.sent_steps[*peer];
                    self.sent_steps[*peer] += 1;
                    let frame = OutFrame {
                        header: Header::collective(self.group, ctx, step, data.len()).encode(),
                        // SAFETY: `data` outlives this call, which returns only once the frame
                        // is flushed or the transport failed (which drops the frame).
                        data: unsafe { RawBuf::new(data.as_ptr() as *mut u8, data.len()) },
                        off: 0,
                        ticket: 0,
                        done: None,
                    };
                    tickets.push((*peer, self.queue(*peer, frame)?));
                    continue;
                }
                Op::Recv { peer, buf } => (*peer, &mut **buf, false),
                Op::RecvReduce { peer, buf } => (*peer, &mut **buf, true),
            };
            self.peer(peer)?;
            let step = self.recv_steps[peer];
            self.recv_steps[peer] += 1;
            recvs.push(StepRecv {
                peer,
                step,
                buf,
                reduce,
                started: false,
                got: 0,
                reduced: 0,
                done: false,
            });
        }
        let finished = |t: &MeshTransport, recvs: &[StepRecv<'_>]| {
            recvs.iter().all(|r| r.done) && tickets.iter().all(|&(p, ticket)| t.flushed(p, ticket))
        };
        self.progress(Some(ctx), &mut recvs, &finished, ctx.deadline, None)
    }

    fn post_send(&mut self, peer: usize, tag: i64, data: RawBuf, deadline: Instant, done: P2pDone) {
        let valid = if peer == self.rank {
            Ok(())
        } else {
            self.peer(peer).map(|_| ())
        };
        if let Err(e) = self.check_failed().and(valid) {
            return done(Err(e));
        }
        let header = Header {
            kind: FrameKind::Tagged,
            coll: CollectiveKind::SendRecv as u8,
            dtype: 0,
            op: 0,
            group: self.group,
            step: 0,
            seq: tag as u64,
            count: data.len() as u64,
            len: data.len() as u64,
        }
        .encode();
        if peer == self.rank {
            // To itself: a copy waits in the own stash, so the send completes at once.
            let Ok(hdr) = Header::decode(&header, peer) else {
                return done(Err(Error::Runtime("bad frame header".into())));
            };
            // SAFETY: the caller keeps `data` alive until `done` runs, which is right here.
            let payload = unsafe { data.as_slice() }.to_vec();
            self.own_tagged.push_back(Frame { hdr, payload });
            done(Ok(peer));
            let waiting = self
                .posted
                .iter()
                .find(|r| r.tag == hdr.seq && r.from.is_none() && r.src.is_none_or(|s| s == peer))
                .map(|r| r.id);
            if let Some(id) = waiting {
                self.match_posted_from_stash(id);
            }
            return;
        }
        let frame = OutFrame {
            header,
            data,
            off: 0,
            ticket: 0,
            done: Some((done, deadline)),
        };
        if let Err(e) = self.queue(peer, frame) {
            self.fail(e);
        }
    }

    fn post_recv(
        &mut self,
        src: Option<usize>,
        tag: i64,
        buf: RawBuf,
        deadline: Instant,
        done: P2pDone,
    ) {
        let valid = match src {
            Some(s) if s != self.rank => self.peer(s).map(|_| ()),
            _ => Ok(()),
        };
        if let Err(e) = self.check_failed().and(valid) {
            return done(Err(e));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.posted.push(PostedRecv {
            id,
            src,
            tag: tag as u64,
            buf,
            got: 0,
            from: None,
            deadline,
            done: Some(done),
        });
        self.match_posted_from_stash(id);
    }

    fn has_pending(&self) -> bool {
        self.has_pending_p2p()
    }

    fn pump(&mut self, interrupt: &dyn Fn() -> bool) -> Result<()> {
        self.check_failed()?;
        let finished = |t: &MeshTransport, _: &[StepRecv<'_>]| !t.has_pending_p2p() || interrupt();
        let far = Instant::now() + Duration::from_secs(3600);
        self.progress(None, &mut [], &finished, far, Some(PUMP_NAP))
    }

    fn abort(&mut self, reason: &str) {
        let class = self.failed.as_ref().map_or(2, abort_class);
        self.send_control(FrameKind::Abort, class, reason.as_bytes());
        if self.failed.is_none() {
            self.fail(Error::backend(reason.to_string()));
        }
    }

    fn shutdown(&mut self) {
        if self.failed.is_none() {
            self.send_control(FrameKind::Goodbye, 0, &[]);
        }
        for peer in self.peers.iter_mut().flatten() {
            let _ = peer.link.sock.shutdown(std::net::Shutdown::Both);
            peer.closed = true;
        }
    }
}
