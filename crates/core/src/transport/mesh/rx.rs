//! Reading frames from peers and matching them: a collective frame streams straight into the
//! receive of the current step that expects it (checked against what this rank expects), a
//! tagged frame into a posted receive, and anything early into a stash, read in bounded chunks
//! so that a claimed length is never allocated before its bytes arrive. A collective frame
//! that arrives while a step expects nothing from its peer is held: its payload stays in the
//! link until a step asks for it and then streams straight into that receive, instead of
//! being copied through the stash.

use std::io;

use super::state::{closed_unexpectedly, Frame, MeshTransport, Rx, RX_IDLE};
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::frame::{
    collective_name, error_from_abort, signature_diff, FrameKind, Header, HEADER_LEN,
};
use crate::transport::OpCtx;
use crate::types::{DType, ReduceOp};

/// Bytes read at once into a stash (a claimed length is never allocated before it arrives).
const STASH_CHUNK: usize = 4 << 20;

/// One receive of the current collective step.
pub(super) struct StepRecv<'a> {
    pub(super) peer: usize,
    pub(super) step: u32,
    pub(super) buf: &'a mut [u8],
    pub(super) reduce: bool,
    /// True once the frame's header was matched to this receive.
    pub(super) started: bool,
    pub(super) got: usize,
    pub(super) reduced: usize,
    pub(super) done: bool,
}

pub(super) fn next_step_recv(recvs: &[StepRecv<'_>], p: usize) -> Option<usize> {
    recvs.iter().position(|r| r.peer == p && !r.done)
}

/// Whether a collective frame from `p` is left in its link rather than stashed: during a
/// collective step that expects nothing from `p`. Nothing that step needs from `p` can be
/// behind it (a peer sends its frames in order), and outside collectives (the point-to-point
/// pump, ctx None) it is stashed, so tagged frames behind it still arrive.
fn holds(ctx: Option<&OpCtx>, recvs: &[StepRecv<'_>], p: usize) -> bool {
    ctx.is_some() && next_step_recv(recvs, p).is_none()
}

impl MeshTransport {
    /// Reads whatever peer `p` has sent, routing frames to receives or stashes.
    pub(super) fn read_peer(
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
            if peer.closed || peer.paused {
                return Ok(moved);
            }
            if peer.holds_frame() {
                if holds(ctx, recvs, p) {
                    return Ok(moved);
                }
                self.release_held(p, ctx, recvs)?;
                moved = true;
                continue;
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
                // Resolved above; a held frame's payload is not read here.
                Rx::Held(_) => return Ok(moved),
                Rx::Discard { left } => {
                    let want = (*left).min(STASH_CHUNK);
                    if peer.scratch.len() < want {
                        peer.scratch.resize(want, 0);
                    }
                    peer.link.read(&mut peer.scratch[..want])
                }
                Rx::Window { memory, at, end } => {
                    // SAFETY: this engine applies one put at a time per window and nothing
                    // else in the process writes the window's bytes (see `landing`).
                    match unsafe { memory.landing(*at, *end - *at, rank) } {
                        Ok(bytes) => peer.link.read(bytes),
                        Err(e) => return Err(self.fail(e)),
                    }
                }
            };
            let n = match res {
                Ok(0) => {
                    peer.closed = true;
                    let why = closed_unexpectedly(p, rank);
                    if matches!(peer.rx, Rx::Header { got: 0, .. }) {
                        // Nothing of a frame is lost: only an operation that still needs
                        // the peer fails (see `check_needed_peers`).
                        if !peer.left {
                            peer.lost = Some(why);
                        }
                        return Ok(true);
                    }
                    return Err(self.fail(Error::network(why)));
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    peer.closed = true;
                    let why = match e.kind() {
                        io::ErrorKind::InvalidData => {
                            format!("the TLS link from rank {p} to rank {rank} failed: {e}")
                        }
                        _ => format!(
                            "connection from rank {p} to rank {rank} failed ({e}); rank {p} probably died"
                        ),
                    };
                    // A peer that exits with bytes unread resets its links: as at EOF, only
                    // a frame cut short is lost at once.
                    if matches!(peer.rx, Rx::Header { got: 0, .. }) {
                        if !peer.left {
                            peer.lost = Some(why);
                        }
                        return Ok(true);
                    }
                    return Err(self.fail(Error::network(why)));
                }
            };
            moved = true;
            self.advance(p, n, ctx, recvs)?;
        }
    }

    /// Routes the frame held in `p`'s link, if any, as if its header had just arrived: into
    /// the receive of `recvs` expecting it, else into the stash (always so without `ctx`).
    pub(super) fn release_held(
        &mut self,
        p: usize,
        ctx: Option<&OpCtx>,
        recvs: &mut [StepRecv<'_>],
    ) -> Result<()> {
        let Some(peer) = self.peers[p].as_mut() else {
            return Ok(());
        };
        if let Rx::Held(hdr) = peer.rx {
            peer.rx = RX_IDLE;
            self.on_header(p, hdr, ctx, recvs)?;
        }
        Ok(())
    }

    /// Accounts for `n` bytes just read from peer `p`.
    pub(super) fn advance(
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
            Rx::Held(_) => Ok(()),
            Rx::Window { at, end, .. } => {
                *at += n;
                if *at == *end {
                    peer.rx = RX_IDLE;
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
                    if let Rx::Stash { mut frame, got } = std::mem::replace(&mut peer.rx, RX_IDLE) {
                        frame.payload.truncate(got);
                        self.on_frame(p, frame, ctx, recvs)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// A header arrived from `p`: stream the payload into the receive expecting it, if any,
    /// else into a stash.
    pub(super) fn on_header(
        &mut self,
        p: usize,
        hdr: Header,
        ctx: Option<&OpCtx>,
        recvs: &mut [StepRecv<'_>],
    ) -> Result<()> {
        let group = self.group;
        // A shrink frame names the new group; its peer has left this one (`on_frame`).
        if hdr.group != group && hdr.kind != FrameKind::Shrink {
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
                if hdr.len > 0 && holds(ctx, recvs, p) {
                    self.peer(p)?.rx = Rx::Held(hdr);
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
            FrameKind::WindowPut | FrameKind::WindowSignal | FrameKind::WindowClose => {
                return self.on_window_frame(p, hdr);
            }
            FrameKind::Abort | FrameKind::Goodbye | FrameKind::Shrink => {}
        }
        if hdr.len == 0 {
            let frame = Frame {
                hdr,
                payload: Vec::new(),
            };
            return self.on_frame(p, frame, ctx, recvs);
        }
        let peer = self.peer(p)?;
        let frame = Frame {
            hdr,
            payload: peer.stash_buffer(),
        };
        peer.rx = Rx::Stash { frame, got: 0 };
        Ok(())
    }

    /// A whole frame arrived that no receive was streaming into.
    pub(super) fn on_frame(
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
            FrameKind::Shrink => {
                // `p` has left for a shrunk group: kept for this rank's own shrink, which goes
                // on reading the link; operations that still need `p` fail meanwhile.
                let peer = self.peer(p)?;
                peer.shrinking.push(frame);
                peer.paused = true;
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
            // Taken as their headers arrive (`on_window_frame`), never stashed.
            FrameKind::WindowPut | FrameKind::WindowSignal | FrameKind::WindowClose => Err(self
                .fail(Error::backend(format!(
                    "rank {p}'s window frame arrived out of turn"
                )))),
            FrameKind::Collective => {
                self.peer(p)?.collective.push_back(frame);
                if let Some(idx) = next_step_recv(recvs, p) {
                    self.match_stashed(ctx, recvs, idx)?;
                }
                Ok(())
            }
        }
    }

    /// A window frame's header arrived from `p`: a put streams into this rank's window, a
    /// signal or a deregistration is counted there at once.
    fn on_window_frame(&mut self, p: usize, hdr: Header) -> Result<()> {
        let rank = self.rank;
        let Some(slot) = self.windows.iter().position(|w| w.id == hdr.step) else {
            return Err(self.fail(Error::backend(format!(
                "rank {p} sent a frame for window {} that rank {rank} has not registered",
                hdr.step
            ))));
        };
        let memory = self.windows[slot].memory.clone();
        match hdr.kind {
            FrameKind::WindowPut => {
                let (at, len) = (hdr.seq as usize, hdr.len as usize);
                // Checked here too: a bad frame fails the group rather than touch memory.
                // SAFETY: only checks the range; the slice is dropped at once.
                if let Err(e) = unsafe { memory.landing(at, len, rank) } {
                    return Err(self.fail(Error::backend(format!("rank {p}'s put: {e}"))));
                }
                if len > 0 {
                    let end = at + len;
                    self.peer(p)?.rx = Rx::Window { memory, at, end };
                }
            }
            FrameKind::WindowSignal if hdr.len == 0 => memory.signal(p),
            FrameKind::WindowClose if hdr.len == 0 => self.windows[slot].closed[p] = true,
            _ => {
                return Err(self.fail(Error::network(format!(
                    "rank {p} sent a malformed window frame"
                ))))
            }
        }
        Ok(())
    }

    /// After a step that failed: a frame half read into one of its receives is skipped from
    /// here on (the receive's buffer belongs to a caller about to get the error), so that the
    /// link still parses as frames.
    pub(super) fn abandon_step(&mut self, recvs: &[StepRecv<'_>]) {
        for peer in self.peers.iter_mut().flatten() {
            if let Rx::Posted { idx } = peer.rx {
                let r = &recvs[idx];
                peer.rx = Rx::skip(r.buf.len() - r.got);
            }
        }
    }

    /// Serves step receive `idx` from its peer's stash when the frame it expects is there.
    pub(super) fn match_stashed(
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
        self.peer(p)?.recycle(frame.payload);
        Ok(())
    }

    /// Checks a collective frame from `p` against what this rank expects next from it.
    pub(super) fn check_frame(
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
}
