//! Shrinking: the survivors of a group go on as a smaller group over the links they already
//! have (shared memory and TCP), with no store and no new connection, so it works when the
//! rank that served the store is the one that died. Links on demand go on too, renumbered:
//! the survivors' addresses were learnt at connect.
//!
//! Every link carries whole frames, also after a failure (see `MeshTransport::fail`), so a
//! survivor can tell the old group's bytes from the new group's: each one sends every other
//! survivor a shrink frame (phase 0) after the last byte it will ever send of the old group,
//! and reads each survivor's link, throwing away whatever comes before that survivor's frame.
//! Then nothing of the old group (half-sent frames, stashes, aborts) can reach the new one.
//! The frame names the new group and lists the excluded ranks, so survivors that disagree
//! about them fail instead of forming different groups. Once every survivor is past phase 0
//! nobody uses the old workspace: each clears its own region and says so (phase 1), and the
//! new workspace is used only after every local survivor has.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::secure::OnDemandLinks;
use super::state::{Frame, MeshTransport, OutFrame, Rx, RX_IDLE};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::transport::frame::{FrameKind, Header, HEADER_LEN};
use crate::transport::remaining;

/// Bytes read at once while skipping the old group's frames.
const SKIP_CHUNK: usize = 4 << 20;

/// Phase 0: nothing of the old group follows. Phase 1: the sender's workspace region is clear;
/// after it comes the new group's first frame, which this module leaves in the link.
const PHASES: [u32; 2] = [0, 1];
const LAST_PHASE: u32 = 1;

impl MeshTransport {
    /// Leaves this group for one of its ranks but `excluded` (sorted, without this rank),
    /// numbered in order, with group id `group`, failed through `cancel`; within `deadline`.
    /// This transport is failed and empty afterwards, whatever the outcome.
    pub(super) fn shrink_to(
        &mut self,
        excluded: &[usize],
        group: u32,
        cancel: Arc<Cancel>,
        deadline: Instant,
    ) -> Result<MeshTransport> {
        let keep: Vec<usize> = (0..self.size)
            .filter(|r| excluded.binary_search(r).is_err())
            .collect();
        let me = keep.iter().position(|&r| r == self.rank).ok_or_else(|| {
            Error::invalid(format!(
                "rank {} is among the ranks to exclude and cannot shrink the group",
                self.rank
            ))
        })?;
        let parent = self.group;
        let what = format!("shrinking the process group to {} ranks", keep.len());
        self.fail(Error::Runtime(format!(
            "this process group was shrunk ({what}); use the group shrink_group returned"
        )));
        for &r in excluded {
            // Neither read nor waited on; the link closes at the end (an excluded rank that
            // lives reads EOF then, after finishing what it was doing with this group).
            if let Some(peer) = self.peers[r].as_mut() {
                peer.closed = true;
            }
        }
        for peer in self.peers.iter_mut().flatten() {
            peer.rx = match std::mem::replace(&mut peer.rx, RX_IDLE) {
                Rx::Held(hdr) => Rx::skip(hdr.len as usize),
                Rx::Stash { frame, got } => Rx::skip(frame.hdr.len as usize - got),
                rx => rx,
            };
            peer.collective.clear();
            peer.tagged.clear();
            peer.paused = false; // its shrink frame came already: read on to its last one
        }
        self.own_tagged.clear();
        let payload: Vec<u8> = excluded
            .iter()
            .flat_map(|&r| (r as u32).to_le_bytes())
            .collect();
        // Only linked survivors carry the old group's bytes; the others never had any (a link
        // stands on both sides or on neither, so both sides skip it alike).
        self.take_arrivals();
        let linked = |r: usize| self.peers[r].as_ref().is_some_and(|p| p.link.linked());
        let peers: Vec<usize> = keep
            .iter()
            .copied()
            .filter(|&r| r != self.rank && linked(r))
            .collect();
        for phase in PHASES {
            if phase == 1 {
                if let Some(host) = &self.host {
                    // SAFETY: every survivor is past phase 0, so none uses the old workspace,
                    // and none uses the new one before this rank's phase 1 frame reaches it.
                    unsafe { host.clear_own_region() };
                }
            }
            let marker = Header {
                kind: FrameKind::Shrink,
                coll: 0,
                dtype: 0,
                op: 0,
                group,
                step: phase,
                seq: u64::from(parent),
                count: excluded.len() as u64,
                len: payload.len() as u64,
            };
            self.fence(&peers, marker, &payload, &cancel, deadline)
                .map_err(|e| Error::network(format!("{what} failed: {e}")))?;
        }
        Ok(self.survivors(&keep, me, group, cancel))
    }

    /// Sends `marker` to each of `peers` behind anything still queued for it, and reads each
    /// one's link until its own marker of the same phase has come.
    fn fence(
        &mut self,
        peers: &[usize],
        marker: Header,
        payload: &[u8],
        cancel: &Cancel,
        deadline: Instant,
    ) -> Result<()> {
        let mut tickets = Vec::with_capacity(peers.len());
        for &p in peers {
            let ticket = self.queue(p, OutFrame::owned(marker, payload.to_vec()))?;
            tickets.push((p, ticket));
        }
        loop {
            let mut moved = false;
            let mut done = true;
            for &(p, ticket) in &tickets {
                moved |= self.flush_peer(p)?;
                moved |= self.skip_to_marker(p)?;
                done &= self.flushed(p, ticket) && self.marker_seen(p, &marker, payload)?;
            }
            if done {
                return Ok(());
            }
            cancel.check()?;
            if moved {
                continue;
            }
            let Some(left) = remaining(deadline) else {
                let late: Vec<String> = tickets
                    .iter()
                    .filter(|&&(p, ticket)| {
                        !self.flushed(p, ticket)
                            || !matches!(self.marker_seen(p, &marker, payload), Ok(true))
                    })
                    .map(|(p, _)| p.to_string())
                    .collect();
                return Err(Error::backend(format!(
                    "timed out waiting for rank(s) {} to shrink the group too (phase {})",
                    late.join(", "),
                    marker.step
                )));
            };
            self.block(left.min(crate::interrupt::POLL), &mut Vec::new())?;
        }
    }

    /// Whether `p` has sent its marker like `marker`; an error when it shrinks differently.
    fn marker_seen(&self, p: usize, marker: &Header, payload: &[u8]) -> Result<bool> {
        let Some(peer) = self.peers[p].as_ref() else {
            return Ok(false);
        };
        let Some(frame) = peer.shrinking.iter().find(|f| f.hdr.step == marker.step) else {
            return Ok(false);
        };
        if frame.hdr.group != marker.group
            || frame.hdr.seq != marker.seq
            || frame.payload != payload
        {
            let excluded = |bytes: &[u8]| -> Vec<u32> {
                bytes
                    .chunks_exact(4)
                    .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                    .collect()
            };
            return Err(Error::backend(format!(
                "rank {p} shrinks the group excluding ranks {:?} (group {:#x}), rank {} \
                 excluding {:?} (group {:#x}): every survivor must exclude the same ranks",
                excluded(&frame.payload),
                frame.hdr.group,
                self.rank,
                excluded(payload),
                marker.group
            )));
        }
        Ok(true)
    }

    /// Reads what `p` has sent, keeping its shrink frames and skipping everything else.
    fn skip_to_marker(&mut self, p: usize) -> Result<bool> {
        let mut moved = false;
        loop {
            let Some(peer) = self.peers[p].as_mut().filter(|peer| !peer.paused) else {
                return Ok(moved);
            };
            let res = match &mut peer.rx {
                Rx::Header { buf, got } => peer.link.read(&mut buf[*got..]),
                Rx::Discard { left } => {
                    let want = (*left).min(SKIP_CHUNK);
                    if peer.scratch.len() < want {
                        peer.scratch.resize(want, 0);
                    }
                    peer.link.read(&mut peer.scratch[..want])
                }
                Rx::Stash { frame, got } => peer.link.read(&mut frame.payload[*got..]),
                Rx::Posted { .. } | Rx::Tagged { .. } | Rx::Held(_) | Rx::Window { .. } => {
                    return Err(Error::Runtime(format!(
                        "the link from rank {p} is mid-frame in an unexpected state"
                    )))
                }
            };
            let n = match res {
                Ok(0) => {
                    return Err(Error::network(format!(
                        "rank {p} closed its connection while shrinking; it probably died \
                         (exclude it too)"
                    )))
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(Error::network(format!(
                        "the connection from rank {p} failed while shrinking ({e})"
                    )))
                }
            };
            moved = true;
            peer.rx = match std::mem::replace(&mut peer.rx, RX_IDLE) {
                Rx::Header { buf, got } if got + n < HEADER_LEN => Rx::Header { buf, got: got + n },
                Rx::Header { buf, .. } => {
                    let hdr = Header::decode(&buf, p)?;
                    let len = hdr.len as usize;
                    if hdr.kind != FrameKind::Shrink {
                        Rx::skip(len)
                    } else if len == 0 {
                        peer.paused = hdr.step == LAST_PHASE;
                        peer.shrinking.push(Frame {
                            hdr,
                            payload: Vec::new(),
                        });
                        RX_IDLE
                    } else {
                        // The excluded ranks: at most a group's size of words.
                        if len > 4 * self.size {
                            return Err(Error::network(format!(
                                "rank {p} sent a shrink frame of {len} bytes"
                            )));
                        }
                        Rx::Stash {
                            frame: Frame {
                                hdr,
                                payload: vec![0; len],
                            },
                            got: 0,
                        }
                    }
                }
                Rx::Discard { left } => Rx::skip(left - n),
                Rx::Stash { frame, got } if got + n == frame.payload.len() => {
                    peer.paused = frame.hdr.step == LAST_PHASE;
                    peer.shrinking.push(frame);
                    RX_IDLE
                }
                Rx::Stash { frame, got } => Rx::Stash {
                    frame,
                    got: got + n,
                },
                rx => rx,
            };
        }
    }

    /// The transport of the survivors `keep` (this group's ranks, in order), this rank being
    /// number `me` of them: the links, shared memory and heartbeats move over, and this one is
    /// left without any.
    fn survivors(
        &mut self,
        keep: &[usize],
        me: usize,
        group: u32,
        cancel: Arc<Cancel>,
    ) -> MeshTransport {
        let mut peers: Vec<_> = keep.iter().map(|&r| self.peers[r].take()).collect();
        self.peers.iter_mut().for_each(|p| *p = None); // the excluded ranks' links close
        for peer in peers.iter_mut().flatten() {
            peer.rx = RX_IDLE;
            peer.txq.clear();
            peer.queued = 0;
            peer.shrinking.clear();
            peer.paused = false;
        }
        // Hosts renumbered by their lowest surviving rank, as a new group numbers them.
        let mut host_of = Vec::with_capacity(keep.len());
        let mut hosts: Vec<usize> = Vec::new();
        for &r in keep {
            let h = self.host_of[r];
            let index = hosts.iter().position(|&x| x == h).unwrap_or_else(|| {
                hosts.push(h);
                hosts.len() - 1
            });
            host_of.push(index);
        }
        // The old workspace points into the segments of the ranks left out: gone first.
        self.ws = None;
        let host = self.host.take().map(|h| h.shrink(keep));
        let ws = host
            .as_ref()
            .map(|h| h.workspace(me))
            .filter(|w| w.local_size() > 1);
        let heartbeat = self.heartbeat.take();
        if let Some(beat) = &heartbeat {
            beat.shrink(keep, group, cancel.clone());
        }
        let on_demand = self.on_demand.take();
        if let Some(links) = &on_demand {
            links.renumber(keep, group, |old| OnDemandLinks {
                tls: old.tls.as_ref().map(|t| t.renumber(keep, me)),
            });
        }
        let size = keep.len();
        MeshTransport {
            rank: me,
            size,
            group,
            peers,
            seq: u64::MAX,
            sent_steps: vec![0; size],
            recv_steps: vec![0; size],
            posted: Vec::new(),
            next_id: 0,
            own_tagged: Default::default(),
            failed: None,
            cancel,
            host_of,
            latency: self.latency,
            bandwidth: self.bandwidth,
            streams: self.streams,
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
        }
    }
}
