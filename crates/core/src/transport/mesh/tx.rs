//! Queueing frames for peers and writing them ([`OutFrame`]): whole and in order per peer, so
//! a point-to-point send never interleaves with a collective's frame.

use std::io::{self, IoSlice};
use std::time::{Duration, Instant};

use super::state::{MeshTransport, OutFrame};
use crate::error::{Error, Result};
use crate::transport::frame::{FrameKind, Header, HEADER_LEN};

/// The most frames one write takes.
const GATHER: usize = 16;

impl MeshTransport {
    /// Queues a frame for `p`; returns its ticket (flushed once no queued frame has it).
    pub(super) fn queue(&mut self, p: usize, mut frame: OutFrame) -> Result<u64> {
        let peer = self.peer(p)?;
        peer.queued += 1;
        frame.ticket = peer.queued;
        peer.txq.push_back(frame);
        Ok(peer.queued)
    }

    pub(super) fn flushed(&self, p: usize, ticket: u64) -> bool {
        self.peers[p]
            .as_ref()
            .is_some_and(|x| !x.txq.iter().any(|f| f.ticket == ticket))
    }

    /// Writes queued frames to `p` as far as its link takes them: the frames not yet taken, up
    /// to GATHER of them, in one write (a put and the signal behind it leave in one segment).
    /// Frames partly or wholly taken are always a prefix of the queue.
    pub(super) fn flush_peer(&mut self, p: usize) -> Result<bool> {
        let mut moved = false;
        loop {
            let peer = self.peer(p)?;
            let Some(f) = peer.txq.front() else {
                return Ok(moved);
            };
            if f.off == f.total() {
                // Every byte taken: sent once the link holds none of them (TLS records).
                match peer.link.flush() {
                    Ok(true) => {
                        let done = peer.txq.pop_front().and_then(|f| f.done);
                        if let Some((done, _)) = done {
                            done(Ok(p));
                        }
                        moved = true;
                        continue;
                    }
                    Ok(false) => return Ok(moved),
                    Err(e) => return Err(self.send_failed(p, e)),
                }
            }
            // On the stack: this runs for every frame sent.
            let mut bufs = [IoSlice::new(&[]); 2 * GATHER];
            let mut used = 0;
            for f in peer.txq.iter().take(GATHER) {
                // SAFETY: the frame's owner keeps the payload alive until it is flushed (see
                // OutFrame); frames of a failed transport are dropped before their owners return.
                let data = unsafe { f.data.as_slice() };
                if f.off < HEADER_LEN {
                    bufs[used] = IoSlice::new(&f.header[f.off..]);
                    bufs[used + 1] = IoSlice::new(data);
                    used += 2;
                } else {
                    bufs[used] = IoSlice::new(&data[f.off - HEADER_LEN..]);
                    used += 1;
                }
            }
            match peer.link.write_vectored(&bufs[..used]) {
                Ok(0) => {
                    return Err(self.fail(Error::network(format!(
                        "connection to rank {p} closed while sending"
                    ))))
                }
                Ok(mut n) => {
                    moved = true;
                    for f in peer.txq.iter_mut() {
                        let take = (f.total() - f.off).min(n);
                        f.off += take;
                        n -= take;
                        if n == 0 {
                            break;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.send_failed(p, e)),
            }
        }
    }

    fn send_failed(&mut self, p: usize, e: io::Error) -> Error {
        let rank = self.rank;
        let why = match e.kind() {
            io::ErrorKind::InvalidData => {
                format!("the TLS link from rank {rank} to rank {p} failed: {e}")
            }
            _ => format!("rank {p} is unreachable (sending failed: {e}); it probably died"),
        };
        self.fail(Error::network(why))
    }

    /// Sends a control frame (abort, goodbye) to every peer within 200 ms, best effort: a
    /// peer that does not drain its link in time gets no notice and finds out from the closed
    /// connection instead. An abort goes ahead of queued frames (but behind one half written:
    /// links carry whole frames), a goodbye behind them all; what is left unwritten stays
    /// queued.
    pub(super) fn send_control(&mut self, kind: FrameKind, class: u8, payload: &[u8]) {
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
        };
        let deadline = Instant::now() + Duration::from_millis(200);
        let open: Vec<usize> = (0..self.size)
            .filter(|&p| {
                self.peers[p]
                    .as_ref()
                    .is_some_and(|peer| !peer.closed && peer.link.linked())
            })
            .collect();
        let mut pending: Vec<(usize, u64)> = open
            .into_iter()
            .filter_map(|p| {
                let frame = OutFrame::owned(hdr, payload.to_vec());
                let ticket = match kind {
                    FrameKind::Goodbye => self.queue(p, frame),
                    _ => self.queue_ahead(p, frame),
                };
                ticket.ok().map(|t| (p, t))
            })
            .collect();
        // Round the peers, so that one whose link is full cannot use up the time of the rest.
        while !pending.is_empty() && Instant::now() < deadline {
            let mut moved = false;
            pending.retain(|&(p, ticket)| match self.flush_peer(p) {
                Ok(m) => {
                    moved |= m;
                    !self.flushed(p, ticket)
                }
                Err(_) => false,
            });
            if !moved && !pending.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Queues `frame` for `p` ahead of every frame not yet started; returns its ticket.
    pub(super) fn queue_ahead(&mut self, p: usize, mut frame: OutFrame) -> Result<u64> {
        let peer = self.peer(p)?;
        peer.queued += 1;
        frame.ticket = peer.queued;
        let at = peer.started();
        peer.txq.insert(at, frame);
        Ok(peer.queued)
    }
}
