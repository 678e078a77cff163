//! Posted point-to-point operations: a send queues its frame, a receive waits in a list (or
//! takes a stashed frame at once); both complete on whichever call moves their last byte, and
//! fail at their deadline only while no byte has moved (a half-moved frame cannot be abandoned
//! without breaking the stream).

use std::time::Instant;

use super::state::MeshTransport;
use crate::error::{Error, Result};

impl MeshTransport {
    pub(super) fn has_pending_p2p(&self) -> bool {
        !self.posted.is_empty()
            || self
                .peers
                .iter()
                .flatten()
                .any(|p| p.txq.iter().any(|f| f.done.is_some()))
    }

    /// Fails posted point-to-point operations whose deadline passed and that have not started
    /// moving bytes (a half-moved frame cannot be abandoned without breaking the stream).
    pub(super) fn expire_p2p(&mut self) {
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
            // Only frames not yet started can be dropped.
            let mut i = peer.started();
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

    pub(super) fn complete_posted(&mut self, id: u64, outcome: Result<usize>) {
        if let Some(pos) = self.posted.iter().position(|r| r.id == id) {
            if let Some(done) = self.posted.remove(pos).done {
                done(outcome);
            }
        }
    }

    /// Serves a new posted receive from the stash when a matching frame already arrived.
    pub(super) fn match_posted_from_stash(&mut self, id: u64) {
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
            if let Some(peer) = self.peers[p].as_mut() {
                peer.recycle(frame.payload);
            }
            return;
        }
    }
}
