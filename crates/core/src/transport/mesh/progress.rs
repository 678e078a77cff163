//! The progress loop: writes queued frames, reads peers, serves receives, and between rounds
//! without progress spins briefly, then sleeps (poll(2) on the sockets, or the shared-memory
//! doorbell in short naps), noticing aborts, dead peers and deadlines.
//!
//! A round reads the peers the operations in progress need, those poll(2) found readable,
//! and every peer at least once per `SWEEP` (and after each shared-memory nap): a read of an
//! idle socket is a system call, and at hundreds of peers reading every one each round cost
//! more than the collective. A frame nobody waits for (an early collective frame, a
//! point-to-point message, an abort, a goodbye) is still read within a sweep or as soon as
//! this rank sleeps, and a dead peer still wakes the poll.

use std::time::{Duration, Instant};

use super::rx::StepRecv;
use super::state::{closed_unexpectedly, MeshTransport};
use crate::error::{Error, Result};
use crate::interrupt;
use crate::spin::Spin;
use crate::transport::tcp::poll_fds;
use crate::transport::{remaining, OpCtx};

/// Longest sleep of an idle pump, so that new work queued behind posted receives starts soon.
pub(super) const PUMP_NAP: Duration = Duration::from_micros(200);
/// Longest time between two rounds that read every peer.
const SWEEP: Duration = Duration::from_millis(1);

impl MeshTransport {
    /// The progress loop: writes every queued frame, fills `recvs`, serves posted receives,
    /// reading every peer all the while, until `finished` says so, a peer fails, or `deadline`.
    /// Between rounds without progress it spins briefly, then sleeps (at most `nap` if given).
    pub(super) fn progress(
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
        // Peers poll(2) found readable, to read in the next round.
        let mut ready: Vec<usize> = Vec::new();
        loop {
            let moved = self.serve_peers(ctx, recvs, &mut ready)?;
            self.expire_p2p();
            if finished(self, recvs) {
                return Ok(());
            }
            self.check_needed_peers(recvs, &[])?;
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
                let e = match ctx {
                    Some(c) => self.timeout_error(c, &[]),
                    None => Error::backend(format!(
                        "rank {}: point-to-point operation Timed out waiting for its peers",
                        self.rank
                    )),
                };
                return Err(self.fail(e));
            };
            // Capped so that an abort is noticed while blocked.
            let wait = nap.map_or(left, |n| n.min(left)).min(interrupt::POLL);
            self.block(wait, &mut ready)?;
            if nap.is_some() {
                return Ok(());
            }
            spin = Spin::new();
        }
    }

    /// One round over the peers: writes and reads those an operation in progress needs, those
    /// in `ready` (emptied), and every one when a sweep is due. Returns whether bytes moved.
    pub(super) fn serve_peers(
        &mut self,
        ctx: Option<&OpCtx>,
        recvs: &mut [StepRecv<'_>],
        ready: &mut Vec<usize>,
    ) -> Result<bool> {
        let sweep = self.swept.is_none_or(|at| at.elapsed() >= SWEEP);
        if sweep {
            self.swept = Some(Instant::now());
            self.take_arrivals();
        }
        let mut moved = false;
        for p in 0..self.size {
            if p != self.rank && (sweep || ready.contains(&p) || self.needed(p, recvs)) {
                moved |= self.flush_peer(p)?;
                moved |= self.read_peer(p, ctx, recvs)?;
            }
        }
        ready.clear();
        Ok(moved)
    }

    /// Whether an operation in progress needs peer `p` read or written now: a frame queued
    /// for it, one half read from it, a receive of this step or a posted point-to-point
    /// receive that it may serve, or a memory link (whose read costs no system call).
    fn needed(&self, p: usize, recvs: &[StepRecv<'_>]) -> bool {
        let Some(peer) = self.peers[p].as_ref() else {
            return false;
        };
        !peer.txq.is_empty()
            || peer.mid_frame()
            || peer.link.in_memory()
            || recvs.iter().any(|r| !r.done && r.peer == p)
            || self.posted.iter().any(|r| r.src.is_none_or(|s| s == p))
    }

    /// Sleeps until a peer may have made progress possible, or `left` passes: poll(2) on the
    /// sockets (the peers found readable or writable are added to `ready`), or the
    /// shared-memory doorbell (in short naps, checking that peers are alive; every peer is
    /// read after one).
    pub(super) fn block(&mut self, left: Duration, ready: &mut Vec<usize>) -> Result<()> {
        let started = Instant::now();
        let blocked = self.block_until_progress(left, ready);
        self.waited += started.elapsed();
        blocked
    }

    fn block_until_progress(&mut self, left: Duration, ready: &mut Vec<usize>) -> Result<()> {
        if let Some(host) = &self.host {
            let all_shm = self.peers.iter().flatten().all(|p| p.link.in_memory());
            let nap = left.min(Duration::from_millis(if all_shm { 5 } else { 1 }));
            let peers = &self.peers;
            host.sleep(nap, || {
                peers.iter().flatten().any(|peer| {
                    peer.link.in_memory()
                        && ((peer.link.has_data() && !peer.unread())
                            || (!peer.txq.is_empty() && peer.link.has_space()))
                })
            });
            // The TCP peers of a hierarchical group were not polled: the next round reads all.
            self.swept = None;
            self.note_closed_peers();
            return Ok(());
        }
        // Bytes decrypted already are no news to poll(2): their peers are read at once.
        let buffered = self.peers.iter().enumerate().filter(|(_, peer)| {
            peer.as_ref()
                .is_some_and(|x| !x.closed && !x.unread() && x.link.buffered())
        });
        let before = ready.len();
        ready.extend(buffered.map(|(p, _)| p));
        if ready.len() > before {
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.size);
        let mut owners = Vec::with_capacity(self.size);
        for (p, peer) in self.peers.iter().enumerate() {
            let Some(peer) = peer.as_ref().filter(|peer| !peer.closed) else {
                continue;
            };
            let polled = peer.link.pollfds(!peer.unread(), !peer.txq.is_empty());
            owners.extend(std::iter::repeat_n(p, polled.len()));
            fds.extend(polled);
        }
        let links = fds.len();
        // A link a peer made to this rank wakes the poll; its peer is read next round.
        let arrivals = self.on_demand.as_ref().map(|d| d.wake_fd());
        fds.extend(arrivals);
        // So does work queued for the worker that pumps (see `window.rs`).
        let queued = self.wake.as_ref().map(|w| w.pollfd());
        fds.extend(queued);
        poll_fds(&mut fds, left);
        let woke = |f: Option<&libc::pollfd>| f.is_some_and(|f| f.revents != 0);
        if arrivals.is_some() && woke(fds.get(links)) {
            ready.extend(self.take_arrivals());
        }
        if let Some(wake) = self.wake.as_ref().filter(|_| woke(fds.last())) {
            wake.drain();
        }
        for (fd, p) in fds.iter().zip(owners) {
            if fd.revents != 0 && ready.last() != Some(&p) {
                ready.push(p);
            }
            // A broken link would wake every poll while its frame is held: the frame goes to
            // the stash instead, so the next read meets the error.
            if fd.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                self.release_held(p, None, &mut [])?;
            }
        }
        Ok(())
    }

    /// Errors when an operation still needs a peer that has left (or shrunk the group).
    pub(super) fn check_needed_peers(
        &mut self,
        recvs: &[StepRecv<'_>],
        awaited: &[usize],
    ) -> Result<()> {
        let gone = |p: usize| self.peers[p].as_ref().is_some_and(|x| x.closed || x.paused);
        let stuck = recvs
            .iter()
            .filter(|r| !r.done)
            .map(|r| r.peer)
            .chain(awaited.iter().copied())
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
            let why = if self.peers[p].as_ref().is_some_and(|x| x.paused) {
                format!(
                    "rank {p} has left the group (it shrank it with shrink_group without this \
                     rank's operation; shrink it too) while rank {rank} still needs it"
                )
            } else if let Some(lost) = self.peers[p].as_ref().and_then(|x| x.lost.clone()) {
                lost
            } else {
                // gloo's words first, which programs written for gloo (torchft) look for.
                format!(
                    "Connection closed by peer: rank {p} has left the group (it destroyed its \
                     process group or exited) while rank {rank} still needs it"
                )
            };
            return Err(self.fail(Error::network(why)));
        }
        Ok(())
    }

    /// Marks the peers on this host whose connection closed as gone, once their pipes are
    /// drained; `check_needed_peers` fails what still needs one.
    pub(super) fn note_closed_peers(&mut self) {
        let rank = self.rank;
        for (p, peer) in self.peers.iter_mut().enumerate() {
            let Some(peer) = peer.as_mut() else {
                continue;
            };
            // Unread bytes (perhaps a goodbye) come first; the socket's EOF is only news once
            // the pipe is drained.
            let drained = peer.link.in_memory() && !peer.link.has_data();
            if drained && !peer.closed && !peer.link.alive() {
                peer.closed = true;
                if !peer.left {
                    peer.lost = Some(closed_unexpectedly(p, rank));
                }
            }
        }
    }
}
