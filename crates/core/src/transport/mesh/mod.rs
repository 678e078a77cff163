//! The mesh transport: one link to every peer (TCP, or shared memory for peers on this host) and
//! one progress loop that drives all of them, plus the shared-memory workspace of the ranks on
//! this host.
//!
//! Every call reads from every peer (those it needs each round, the rest at least once a
//! millisecond and whenever poll(2) says), so a peer that dies (EOF) or aborts is noticed by
//! every rank at once, not only by its ring neighbours. Outgoing frames queue per peer and are
//! written whole and in order, so a point-to-point send never interleaves with a collective's
//! frame.
//! Point-to-point operations are posted and complete whenever their bytes have moved, during any
//! later call, so an `irecv` never blocks the collectives queued after it. Errors are sticky:
//! once failed, the transport fails every pending and later operation.
//!
//! The parts: `link` (the byte pipes), `secure` (TLS on them), `state` (the transport's state
//! and the frames and receives in it), `tx` (writing queued frames), `p2p` (posted
//! point-to-point operations), `rx` (reading frames and matching them to receives),
//! `progress` (the loop that moves bytes and waits), `shared` (waiting in the workspace),
//! `shrink` (going on as a smaller group over the same links), `window` (one-sided window
//! frames: puts, signals, deregistration, and the worker's sleep while windows are attached,
//! which also makes links through `demand`); `demand` (links made on first use) uses `secure`
//! and `state`. Each part uses only those before it in that list; this
//! file, which connects the transport and implements [`Transport`], uses them.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::AuthKey;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::interrupt;
use crate::store::Store;
use crate::tensor::RawBuf;
use crate::tls::{self, Tls};
use crate::transport::frame::{abort_class, FrameKind, Header};
use crate::transport::heartbeat::{Heartbeat, HeartbeatConfig, Identity};
use crate::transport::shm::share_memory;
use crate::transport::tcp::{
    agree_latency, agree_links, connect_mesh_with, connect_streams, poll_fds, OnDemand,
};
use crate::transport::window::WindowMemory;
use crate::transport::{remaining, Op, OpCtx, P2pDone, SharedMemory, Transport, WindowFrame};
use crate::types::CollectiveKind;
use crate::wake::Wake;

mod demand;
mod link;
mod p2p;
mod progress;
mod rx;
mod secure;
mod shared;
mod shrink;
mod state;
#[cfg(test)]
mod tests;
mod tx;
mod window;

pub use state::MeshTransport;

use progress::PUMP_NAP;
use rx::StepRecv;
use secure::{connection, handshake_failed, LinkTls, OnDemandLinks};
use state::{Frame, OutFrame, Peer, PostedRecv};

/// `RUSTDIST_EAGER_CONNECT=1`: link every peer at connect (a full mesh), as before links on
/// demand; every rank must set it alike.
fn eager_connect() -> Result<bool> {
    match std::env::var("RUSTDIST_EAGER_CONNECT").as_deref() {
        Err(_) | Ok("" | "0") => Ok(false),
        Ok("1") => Ok(true),
        Ok(other) => Err(Error::invalid(format!(
            "RUSTDIST_EAGER_CONNECT={other:?}: expected 0 or 1"
        ))),
    }
}

/// The store keys rank `rank` of a `size`-rank group may have published under `prefix` while
/// connecting (its address, its shared-memory segment and verdict, its link bandwidth; the last
/// rank the agreed latency, rank 0 the agreed bandwidth). Nothing reads them once every rank
/// has connected: deleting them then forgets the rendezvous.
pub fn published_keys(prefix: &str, rank: usize, size: usize) -> Vec<String> {
    let mut keys: Vec<String> = ["addr", "shm", "shm_mapped", "link_bandwidth"]
        .iter()
        .map(|what| format!("{prefix}/{what}/{rank}"))
        .collect();
    if rank + 1 == size {
        keys.push(format!("{prefix}/link_latency_ns"));
    }
    if rank == 0 {
        keys.push(format!("{prefix}/link_bandwidth"));
    }
    keys
}

impl MeshTransport {
    /// The links' one-way latency measured at connect, the same on every rank (None alone).
    pub fn latency(&self) -> Option<Duration> {
        self.latency
    }

    /// The slowest link between hosts in bytes per second, measured at connect, the same on
    /// every rank (None on one host).
    pub fn bandwidth(&self) -> Option<u64> {
        self.bandwidth
    }

    /// TCP streams joining this rank to each peer on another host (1 when none is).
    pub fn streams(&self) -> usize {
        self.streams
    }

    /// Where this rank's heartbeats answer status queries (None without heartbeats).
    pub fn status_addr(&self) -> Option<SocketAddr> {
        self.heartbeat.as_ref().and_then(Heartbeat::local_addr)
    }

    /// Joins the mesh of group `group` (rendezvous keys under `prefix` in `store`) within
    /// `timeout`: TCP to every peer, and shared memory to those on this host when
    /// `shared_memory` (every rank must pass the same). Peers on other hosts get as many TCP
    /// streams as `streams_for(latency, bandwidth, window)` says on rank 0, given what
    /// connecting measured and the bytes one stream keeps in flight. Waits stop once `cancel`
    /// is raised.
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
        streams_for: &dyn Fn(Option<Duration>, Option<u64>, u64) -> Result<usize>,
    ) -> Result<MeshTransport> {
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "rank {rank} is out of range for a group of size {size}"
            )));
        }
        let deadline = Instant::now() + timeout;
        let heartbeat_config = HeartbeatConfig::from_env()?;
        let (host, host_of) = if shared_memory {
            share_memory(&*store, prefix, rank, size, group, deadline)?
        } else {
            (None, (0..size).collect())
        };
        // Linked at once: the ring's neighbours (the links' latency and bandwidth are
        // measured on them) and the peers on this host (their sockets tell whether they
        // live); every peer with RUSTDIST_EAGER_CONNECT=1. The rest on first use.
        let eager = eager_connect()?;
        let now = |p: usize| {
            eager
                || p == (rank + 1) % size
                || p == (rank + size - 1) % size
                || (shared_memory && host_of[p] == host_of[rank])
        };
        let key = AuthKey::from_env();
        // Settings this rank cannot use are published, not raised here: every rank then fails
        // at `agree`, saying why.
        let tls = Tls::from_env(key.as_ref());
        let mut mesh = connect_mesh_with(
            &*store,
            prefix,
            rank,
            size,
            group,
            deadline,
            key.as_ref(),
            tls.as_ref().map(Option::as_ref),
            &now,
        )?;
        // Every rank read every rank's settings: all fail alike where they disagree.
        let entry = |r: usize| format!("{prefix}/addr/{r}");
        let pins = tls::agree(&mesh.tls, rank, key.as_ref(), &entry)?;
        let tls = tls?.map(|t| LinkTls::new(t, pins, rank));
        let peer_ips: Vec<_> = mesh.addrs.iter().map(|a| a.map(|a| a.ip())).collect();
        let heartbeat = match (heartbeat_config, mesh.udp.take()) {
            (Some(config), Some(udp)) => Some(Heartbeat::start(
                udp,
                Identity {
                    job: mesh.job,
                    group,
                    rank,
                    size,
                },
                &peer_ips,
                &mesh.addrs,
                config,
                key.clone(),
                cancel.clone(),
            )?),
            _ => None,
        };
        let latency = agree_latency(&*store, prefix, rank, size, mesh.round_trip, deadline)?;
        let links = agree_links(
            &*store,
            prefix,
            rank,
            size,
            &mesh.socks,
            mesh.spans_hosts(),
            deadline,
            &|b, w| streams_for(latency, b, w),
        )?;
        let mut extra = connect_streams(
            &mut mesh,
            rank,
            group,
            links.streams,
            deadline,
            key.as_ref(),
        )?
        .into_iter();
        let on_demand = match eager {
            true => None,
            false => {
                let setup = OnDemandLinks { tls: tls.clone() };
                OnDemand::start(&mut mesh, group, rank, links.streams, key, setup)?
            }
        };
        let socks = mesh.socks;
        let ws = host
            .as_ref()
            .map(|h| h.workspace(rank))
            .filter(|w| w.local_size() > 1);
        let peers = socks
            .into_iter()
            .enumerate()
            .map(|(p, sock)| {
                let extra = extra.next().unwrap_or_default();
                Ok(match sock {
                    Some(s) => {
                        let pipe = host.as_ref().and_then(|h| h.pipe(rank, p));
                        Some(Peer::new(connection(tls.as_ref(), p, s, pipe, extra)?))
                    }
                    None if p == rank => None,
                    None => Some(Peer::unlinked()),
                })
            })
            .collect::<Result<_>>()?;
        let mut transport = MeshTransport {
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
            latency,
            bandwidth: links.bandwidth,
            streams: links.streams,
            ws,
            ws_seq: u64::MAX,
            swept: None,
            heartbeat,
            waited: Duration::ZERO,
            on_demand,
            windows: Vec::new(),
            windows_made: 0,
            wake: None,
            host,
        };
        transport.finish_handshakes(0..size, deadline)?;
        Ok(transport)
    }

    /// Completes the TLS handshakes of the links of `peers`, every stream of each, all at once
    /// (links without TLS have none): at connect, every peer, so that a refused certificate
    /// fails init on both sides, naming the peer; and the peer this rank has just dialled on
    /// demand (the peer's end is its accepting thread's).
    fn finish_handshakes(&mut self, peers: Range<usize>, deadline: Instant) -> Result<()> {
        let rank = self.rank;
        loop {
            let mut fds = Vec::new();
            let mut waiting = Vec::new();
            let links = self.peers.get_mut(peers.clone()).unwrap_or_default();
            for (p, peer) in peers.clone().zip(links) {
                let Some(peer) = peer.as_mut().filter(|x| x.link.linked()) else {
                    continue;
                };
                match peer.link.handshake() {
                    Ok(true) => {}
                    Ok(false) => {
                        waiting.push(p);
                        fds.extend(peer.link.pollfds(true, false));
                    }
                    Err(e) => return Err(handshake_failed(rank, p, &e)),
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            let Some(left) = remaining(deadline) else {
                return Err(Error::network(format!(
                    "rank {rank} timed out in the TLS handshakes with ranks {waiting:?}"
                )));
            };
            poll_fds(
                &mut fds,
                interrupt::slice(left.min(Duration::from_millis(50))),
            );
            self.cancel.check()?;
            interrupt::check()?;
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
}

impl Transport for MeshTransport {
    fn take_waited(&mut self) -> Duration {
        std::mem::take(&mut self.waited)
    }

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
        for op in ops.iter() {
            let (Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. }) = op;
            self.link(*peer, ctx.deadline())?;
        }
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
                        owned: None,
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
        let outcome = self.progress(Some(ctx), &mut recvs, &finished, ctx.deadline(), None);
        if outcome.is_err() {
            self.abandon_step(&recvs);
        }
        outcome
    }

    fn post_send(&mut self, peer: usize, tag: i64, data: RawBuf, deadline: Instant, done: P2pDone) {
        let valid = self.check_failed().and_then(|()| match peer == self.rank {
            true => Ok(()),
            false => self.link(peer, deadline),
        });
        if let Err(e) = valid {
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
        let mut frame = OutFrame {
            header,
            data,
            off: 0,
            ticket: 0,
            done: Some((done, deadline)),
            owned: None,
        };
        // A send reads its tensor as it is now, even where a receive posted earlier will write
        // (a buffer used twice in one batch_isend_irecv, which torch posts op by op).
        if self.posted.iter().any(|r| r.buf.overlaps(&data)) {
            frame.detach();
        }
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
        // A receive from anyone links nobody: its sender links to this rank.
        let valid = self.check_failed().and_then(|()| match src {
            Some(s) if s != self.rank => self.link(s, deadline),
            _ => Ok(()),
        });
        if let Err(e) = valid {
            return done(Err(e));
        }
        // A queued send of these bytes sends them as they were when it was posted.
        for peer in self.peers.iter_mut().flatten() {
            for frame in peer.txq.iter_mut() {
                if frame.done.is_some() && frame.data.overlaps(&buf) {
                    frame.detach();
                }
            }
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

    fn has_windows(&self) -> bool {
        !self.windows.is_empty()
    }

    fn sleep_fds(&self) -> Option<Vec<libc::pollfd>> {
        MeshTransport::sleep_fds(self)
    }

    fn sweep(&mut self) -> Result<bool> {
        MeshTransport::sweep(self)
    }

    fn pump(&mut self, interrupt: &dyn Fn() -> bool) -> Result<()> {
        self.check_failed()?;
        if !self.has_pending_p2p() {
            return self.serve_windows(interrupt);
        }
        let finished = |t: &MeshTransport, _: &[StepRecv<'_>]| !t.has_pending_p2p() || interrupt();
        let far = Instant::now() + Duration::from_secs(3600);
        self.progress(None, &mut [], &finished, far, Some(PUMP_NAP))
    }

    fn set_wake(&mut self, wake: &Arc<Wake>) {
        if !self.wake.as_ref().is_some_and(|w| Arc::ptr_eq(w, wake)) {
            self.wake = Some(wake.clone());
        }
    }

    fn attach_window(&mut self, memory: Arc<WindowMemory>) -> Result<u32> {
        self.check_failed()?;
        Ok(self.attach(memory))
    }

    fn post_window(
        &mut self,
        peer: usize,
        window: u32,
        frame: WindowFrame,
        deadline: Instant,
        done: P2pDone,
    ) {
        self.queue_window_frame(peer, window, frame, deadline, done)
    }

    fn wait_window(
        &mut self,
        peer: usize,
        arrived: &dyn Fn() -> bool,
        deadline: Instant,
        what: &str,
    ) -> Result<()> {
        // What is awaited comes on (or goes over) the link to `peer`; made now, it also tells
        // of `peer`'s death.
        if peer != self.rank {
            self.link(peer, deadline)?;
        }
        let what = |_: &MeshTransport| what.to_string();
        self.progress_until(&[peer], &|_, _| true, &|_| arrived(), deadline, &what)
    }

    fn close_window(&mut self, window: u32, deadline: Instant) -> Result<()> {
        self.close(window, deadline)
    }

    fn abort(&mut self, reason: &str) {
        let class = self.failed.as_ref().map_or(2, abort_class);
        self.send_control(FrameKind::Abort, class, reason.as_bytes());
        if self.failed.is_none() {
            self.fail(Error::backend(reason.to_string()));
        }
    }

    fn shrink(
        &mut self,
        excluded: &[usize],
        group: u32,
        cancel: Arc<Cancel>,
        deadline: Instant,
    ) -> Result<Box<dyn Transport>> {
        let survivors = self.shrink_to(excluded, group, cancel, deadline)?;
        Ok(Box::new(survivors))
    }

    fn shutdown(&mut self) {
        self.heartbeat = None;
        self.on_demand = None;
        if self.failed.is_none() {
            // Behind what is queued: a put not yet sent still lands.
            self.send_control(FrameKind::Goodbye, 0, &[]);
        }
        for peer in self.peers.iter_mut().flatten() {
            peer.link.shutdown();
            peer.closed = true;
        }
    }
}
